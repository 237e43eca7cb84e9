"""The delta-rule family: DeltaNet, Gated DeltaNet, a KDA-style key-wise gate (non-diagonal Λ_i).

One class, :class:`DeltaNet`, and its presets; the core is ``seqmix.ops.delta_rule``:

    S_t = (I − β_t k_tᵀk_t) Diag(α_t) S_{t-1} + β_t k_tᵀ v_t,      o_t = scale · q_t S_t

(row convention, S ∈ R^{K×V} per head; the papers' column form is its transpose).

    preset           α_t                                            paper
    deltanet         1                                              Yang et al. 2024 (DeltaNet), §2.2 eq. 1-2
    gated_deltanet   exp(−Δ_t A_h), Δ_t = softplus(x W_a + b_Δ)     Yang, Kautz, Hatamizadeh 2025, eq. 10 (Mamba-2's gate)
    kda              exp(−A_h softplus(x W_f¹ W_f² + b)) per key    Kimi Delta Attention (KDA-style: a key-wise α)

The parametrization follows the papers' released configurations (flash-linear-attention's
layers, read for the conventions): q, k, v = SiLU(ShortConv(x W)) (kernel 4), q and k
L2-normalized per head, β_t = σ(x W_β) per head (2σ with ``negative_eigenvalues``, Grazzi
et al. 2025: the transition may then flip the key direction), scale K^{-1/2}, and the
readout y = (RMSNorm_h(o) ⊙ SiLU(x W_g)) W_O (norm per head, then the gate).

RWKV-7 does not fit this op: its transition Diag(w_t) − κ̂_tᵀ(a_t ⊙ κ̂_t) has a vector
in-context learning rate a_t that is not tied to the decay (here the low-rank part is
β k_tᵀ(α_t ⊙ k_t), i.e. a = β α), and it writes with a key k̃_t different from the key κ̂_t it
removes. It needs the general diagonal-plus-low-rank recurrence; the DSF object
(``DSF(lam, B, C, U=..., W=...)``) represents it exactly, the op does not run it.

DSF view: maps = heads, values = v, mixed = the core's output (before the norm and gate).
Λ_i is block diagonal with one K×K block M_i = (I − β_i k_iᵀk_i) Diag(α_i) per head and value
channel (:meth:`seqmix.DSF.from_delta_rule`); ``decays(x)`` returns its diagonal part α_i
and ``spectrum(x)`` its eigenvalues (α and α(1 − β) along the key for a scalar α).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..dsf import DSF
from ..ops.delta_rule import delta_rule, delta_rule_map
from .base import Mixer, MixerConfig, MixOut, register, register_preset
from .layers import RMSNorm, ShortConv

# Gated DeltaNet's initialization (the released code): A uniform in [A_MIN, A_MAX], Δ at init log-uniform in [DT_MIN, DT_MAX]
A_MIN, A_MAX = 1.0, 16.0
DT_MIN, DT_MAX = 1e-3, 0.1


class DeltaNetConfig(MixerConfig):
    """Sizes and options of the delta-rule mixers."""

    heads: int = Field(4, gt=0, description="H")
    expand_k: float = Field(1.0, gt=0, description="d_k = expand_k·d_model (over all heads)")
    expand_v: float = Field(1.0, gt=0, description="d_v = expand_v·d_model (over all heads)")
    decay: Literal["none", "head", "key"] = Field(
        "none", description="α_t: 'none' (DeltaNet), 'head' exp(−Δ_t A_h) (Gated DeltaNet), 'key' one per key channel (KDA-style)"
    )
    negative_eigenvalues: bool = Field(False, description="β = 2σ(x W_β) ∈ [0, 2] instead of σ ∈ [0, 1]: eigenvalue 1 − β along k may be negative")
    conv_size: int | None = Field(4, ge=1, description="kernel of the short causal convs on q, k, v (SiLU after); None: no conv (SiLU on the projections)")
    gate: bool = Field(True, description="output gate SiLU(x W_g) after the per-head RMSNorm")
    norm_eps: float = Field(1e-5, gt=0, description="epsilon of the output RMSNorm")
    low_rank: int | None = Field(None, gt=0, description="rank of the key-wise gate's projection W_f¹ W_f² (decay = 'key'; None: d_k' = d_k/H)")
    scale: Literal["inv_sqrt_k", "none"] = Field("inv_sqrt_k", description="scale of q_t S_t: d_k'^{-1/2} (the released code) or 1")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @property
    def d_k(self) -> int:
        return round(self.expand_k * self.d_model)

    @property
    def d_v(self) -> int:
        return round(self.expand_v * self.d_model)

    @model_validator(mode="after")
    def _check(self):
        for name, e in (("expand_k", self.expand_k), ("expand_v", self.expand_v)):
            w = e * self.d_model
            if abs(w - round(w)) > 1e-9 or round(w) < 1:
                raise ValueError(f"{name} = {e} times d_model = {self.d_model} must be a positive integer")
            if round(w) % self.heads:
                raise ValueError(f"{name}·d_model = {round(w)} must be divisible by heads = {self.heads}")
        return self


@dataclass
class _Params:
    q: torch.Tensor  # [B, T, H, K] (L2-normalized)
    k: torch.Tensor  # [B, T, H, K] (L2-normalized)
    v: torch.Tensor  # [B, T, H, V]
    beta: torch.Tensor  # [B, T, H]
    g: torch.Tensor | None  # log α: [B, T, H] or [B, T, H, K]
    state: dict = field(default_factory=dict)


@register("deltanet", description="DeltaNet (Yang et al. 2024): the delta rule, L2-normalized q/k, β = σ(xW_β), short convs, norm + gate")
class DeltaNet(Mixer):
    """S_t = (I − β_t k_tᵀk_t) Diag(α_t) S_{t-1} + β_t k_tᵀ v_t (see the module docstring).

    Maps of phi(x): one per head [B, H, T, T] (``seqmix.ops.delta_rule_map``). State per
    sequence: H·d_k'·d_v' + (2 d_k + d_v)(conv_size − 1).
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "H·d_k'·d_v' + (2·d_k + d_v)·(conv-1)"
    map_unit = "head"
    diagonal_transition = False
    Config = DeltaNetConfig

    def __init__(self, config: DeltaNetConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, d_k, d_v, H = c.d_model, c.d_k, c.d_v, c.heads
        self.H, self.K, self.V = H, d_k // H, d_v // H
        self.W_q = nn.Linear(d, d_k, bias=False)
        self.W_k = nn.Linear(d, d_k, bias=False)
        self.W_v = nn.Linear(d, d_v, bias=False)
        self.W_beta = nn.Linear(d, H, bias=False)
        if c.conv_size:
            self.conv_q = ShortConv(d_k, c.conv_size, bias=False, activation="silu")
            self.conv_k = ShortConv(d_k, c.conv_size, bias=False, activation="silu")
            self.conv_v = ShortConv(d_v, c.conv_size, bias=False, activation="silu")
        if c.decay != "none":
            width = H if c.decay == "head" else d_k
            if c.decay == "head":
                self.W_a = nn.Linear(d, H, bias=False)
            else:
                r = c.low_rank or self.K
                self.W_a = nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, d_k, bias=False))
            A = torch.empty(H).uniform_(A_MIN, A_MAX)
            self.A_log = nn.Parameter(A.log())
            dt = torch.exp(torch.rand(width) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        self.norm = RMSNorm(d_v, eps=c.norm_eps, groups=H)
        self.W_g = nn.Linear(d, d_v, bias=False) if c.gate else None
        self.W_o = nn.Linear(d_v, d, bias=False)
        self._scale = self.K**-0.5 if c.scale == "inv_sqrt_k" else 1.0

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "chunk_size": 8}

    # -- the parameter functions -------------------------------------------------------

    def _params(self, x, state, need_state) -> _Params:
        c = self.config
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        new = {}
        if c.conv_size:
            outs = []
            for name, conv, t in (("conv_q", self.conv_q, q), ("conv_k", self.conv_k, k), ("conv_v", self.conv_v, v)):
                y, s = conv(t, state.get(name) if state else None, output_final_state=need_state)
                outs.append(y)
                if need_state:
                    new[name] = s
            q, k, v = outs
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = F.normalize(q.view(B, T, H, K), dim=-1)
        k = F.normalize(k.view(B, T, H, K), dim=-1)
        v = v.view(B, T, H, V)
        beta = torch.sigmoid(self.W_beta(x))
        if c.negative_eigenvalues:
            beta = 2 * beta
        g = None
        if c.decay == "head":  # Gated DeltaNet: log α = −A_h softplus(x W_a + b_Δ)  (= −Δ_t A, Mamba-2)
            g = -self.A_log.exp() * F.softplus(self.W_a(x) + self.dt_bias)
        elif c.decay == "key":  # KDA-style: one gate per key channel
            g = -self.A_log.exp().view(H, 1) * F.softplus(self.W_a(x) + self.dt_bias).view(B, T, H, K)
        return _Params(q=q, k=k, v=v, beta=beta, g=g, state=new)

    # -- forward -------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        P = self._params(x, state, need_state)
        o, S = delta_rule(
            P.q, P.k, P.v, P.beta, P.g, scale=self._scale, initial_state=state.get("S") if state else None,
            output_final_state=need_state, mode=mode, chunk_size=c.chunk_size, check_values=False,
        )
        y = self.norm(o.flatten(2))
        if self.W_g is not None:
            y = y * F.silu(self.W_g(x))
        y = self.W_o(y)
        return MixOut(y, {"S": S, **P.state} if need_state else None, values=P.v, mixed=o)

    # -- the DSF view ----------------------------------------------------------------------

    def phi(self, x):
        """[B, H, T, T]: Φ[t, s] = scale · q_t M_t ⋯ M_{s+1} β_s k_sᵀ per head (values → core output)."""
        self.check_input(x)
        P = self._params(x, None, False)
        return delta_rule_map(P.q, P.k, P.beta, P.g, scale=self._scale, check_values=False)

    def dsf(self, x):
        """The core as a DSF with the block-diagonal, diagonal-plus-low-rank Λ_i of
        :meth:`seqmix.DSF.from_delta_rule` (input v, heads concatenated; output the core's o)."""
        self.check_input(x)
        P = self._params(x, None, False)
        return DSF.from_delta_rule(P.q, P.k, P.beta, self.V, P.g, scale=self._scale)

    def spectrum(self, x):
        """Eigenvalues of Λ_i [B, T, N] (complex): per head, those of (I − β kᵀk) Diag(α)."""
        return self.dsf(x).eigenvalues()

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        n = self.H * self.K * self.V
        if c.conv_size:
            n += (2 * c.d_k + c.d_v) * (c.conv_size - 1)
        return n


register_preset(
    "gated_deltanet", DeltaNet,
    description="Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025): the delta rule with Mamba-2's scalar gate α_t = exp(−Δ_t A)",
    defaults={"decay": "head"},
)
register_preset(
    "kda", DeltaNet,
    description="KDA-style gated delta rule: a key-wise (channel-wise) gate Diag(α_t) before the delta step",
    defaults={"decay": "key"},
)
