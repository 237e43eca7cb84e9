"""The delta-rule family: DeltaNet, Gated DeltaNet, a KDA-style key-wise gate (non-diagonal Λ_i).

One class, :class:`DeltaNet`, and its presets; the core is ``seqmix.ops.delta_rule``:

    S_t = (I − β_t k_tᵀk_t) Diag(α_t) S_{t-1} + β_t k_tᵀ v_t,      o_t = scale · q_t S_t

(row convention, S ∈ R^{K×V} per head; the papers' column form is its transpose).

    preset           α_t                                            paper
    deltanet         1                                              Yang et al. 2024 (DeltaNet), §2.2 eq. 1-2
    gated_deltanet   exp(−Δ_t A_h), Δ_t = softplus(x W_a + b_Δ)     Yang, Kautz, Hatamizadeh 2025, eq. 10 (Mamba-2's gate)
    kda              exp(−A_h softplus(x W_f¹ W_f² + b)) per key    Kimi Delta Attention (KDA-style: a key-wise α)
    qwen3_next_gdn   as gated_deltanet                               Qwen3-Next's layer (transformers): GVA, one conv, shared norm
    kimi_kda         as kda                                          Kimi-Linear's KDA layer (transformers): σ low-rank gate
    gated_deltanet2  as kda, with channel-wise erase and write gates  fla's GDN-2: (I − kᵀ(b ⊙ k)) Diag(α), written value w ⊙ v
    precond_gated_deltanet, precond_kda   gated_deltanet / kda with the ATK preconditioned write key k ⊙ M_t (fla)

The last two are the options real checkpoints need (``seqmix.interop`` converts
transformers' Qwen3NextGatedDeltaNet and KimiLinearDeltaAttention into them): grouped value
heads ``k_heads`` (each q/k head serves heads/k_heads value heads), one ``fused_conv`` over
[q; k; v] (one conv state), FLA's ``qk_l2_eps`` form of the L2 norm, an output RMSNorm whose
weight is shared by the heads (``norm_shared``), and Kimi's gate σ(x W_g¹ W_g²) (``gate_act``,
``gate_rank``). None changes the recurrence: every mode, phi and dsf are the op's.

The parametrization follows the papers' released configurations (flash-linear-attention's
layers, read for the conventions): q, k, v = SiLU(ShortConv(x W)) (kernel 4), q and k
L2-normalized per head, β_t = σ(x W_β) per head (2σ with ``negative_eigenvalues``, Grazzi
et al. 2025: the transition may then flip the key direction), scale K^{-1/2}, and the
readout y = (RMSNorm_h(o) ⊙ SiLU(x W_g)) W_O (norm per head, then the gate).

The op also runs the generalized transition (I + a_tᵀb_t) Diag(α_t) (keyword options a, b of
``delta_rule``): ``comba`` (b = p = σ(d)k, q ← q − D p) is a preset of this class, ``gated_deltaproduct``
(``num_householder`` n_h steps per token, ``seqmix.ops.delta_product``) too; RWKV-7 is :class:`RWKV7` below.

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
from ..ops.conv import causal_conv1d_step
from ..ops.delta_rule import delta_product, delta_product_map, delta_rule, delta_rule_map, delta_rule_step
from ..ops.momentum_delta import momentum_delta_rule, momentum_delta_rule_map
from ..ops.recurrence import linear_recurrence
from ..ops.precision import linear_f32, upcast
from .base import ExpandedWidths, Mixer, MixerConfig, MixOut, register, register_preset
from .layers import (
    LayerNorm, RMSNorm, ShortConv, check_rope_fields, l2_normalize, project, rope_rotate, short_conv_qkv, token_mix,
)

# Gated DeltaNet's initialization (the released code): A uniform in [A_MIN, A_MAX], Δ at init log-uniform in [DT_MIN, DT_MAX]
A_MIN, A_MAX = 1.0, 16.0
DT_MIN, DT_MAX = 1e-3, 0.1


class DeltaNetConfig(ExpandedWidths, MixerConfig):
    """Sizes and options of the delta-rule mixers."""

    heads: int = Field(4, gt=0, description="H")
    expand_k: float = Field(1.0, gt=0, description="d_k = expand_k·d_model (over all heads)")
    expand_v: float = Field(1.0, gt=0, description="d_v = expand_v·d_model (over all heads)")
    decay: Literal["none", "head", "key"] = Field(
        "none", description="α_t: 'none' (DeltaNet), 'head' exp(−Δ_t A_h) (Gated DeltaNet), 'key' one per key channel (KDA-style)"
    )
    negative_eigenvalues: bool = Field(False, description="β = 2σ(x W_β) ∈ [0, 2] instead of σ ∈ [0, 1]: eigenvalue 1 − β along k may be negative")
    conv_size: int | None = Field(4, ge=1, description="kernel of the short causal convs on q, k, v (SiLU after); None: no conv (SiLU on the projections)")
    qkv_bias: bool = Field(False, description="biases in W_q, W_k, W_v (a student linearized from a teacher with q/k/v biases: Qwen2)")
    gate: bool = Field(True, description="output gate SiLU(x W_g) after the per-head RMSNorm")
    norm_eps: float = Field(1e-5, gt=0, description="epsilon of the output RMSNorm")
    low_rank: int | None = Field(None, gt=0, description="rank of the key-wise gate's projection W_f¹ W_f² (decay = 'key'; None: d_k' = d_k/H)")
    scale: Literal["inv_sqrt_k", "none"] = Field("inv_sqrt_k", description="scale of q_t S_t: d_k'^{-1/2} (the released code) or 1")
    # -- options of real models (transformers' Qwen3-Next and Kimi-Linear) -----------------------
    k_heads: int | None = Field(
        None, gt=0, description="query/key heads, dividing heads (grouped value attention, GVA: Qwen3-Next's linear_num_key_heads): "
        "q/k head j serves the heads/k_heads consecutive value heads j·r .. j·r + r - 1 (repeat_interleave); d_k' = d_k/k_heads. "
        "None = heads",
    )
    fused_conv: bool = Field(
        False, description="one short conv over the concatenated [q; k; v] channels with one state 'conv' [B, 2·d_k + d_v, W-1] "
        "(transformers' conv1d of Qwen3-Next and Kimi-Linear) instead of three convs conv_q, conv_k, conv_v: the same map",
    )
    qk_l2_eps: float | None = Field(
        None, gt=0, description="L2 norm of q and k as x / sqrt(Σx² + ε) (flash-linear-attention's l2norm, which transformers' "
        "Qwen3-Next and Kimi-Linear copy: ε = 1e-6); None: x / max(‖x‖, 1e-12) (F.normalize)",
    )
    norm_shared: bool = Field(
        False, description="the output RMSNorm has one weight [d_v'] shared by the heads (transformers' RMSNormGated of Qwen3-Next "
        "and Kimi-Linear); False: one weight per channel [d_v]",
    )
    gate_act: Literal["silu", "sigmoid"] = Field("silu", description="activation of the output gate: SiLU (Gated DeltaNet) or σ (Kimi-Linear's KDA)")
    gate_rank: int | None = Field(
        None, gt=0, description="the output gate's projection as a low-rank product d -> gate_rank -> d_v (Kimi-Linear's g_a_proj, "
        "g_b_proj); None: one d -> d_v projection",
    )
    # -- Gated DeltaProduct (Siems et al. 2025) and Comba (Hu et al. 2025) ------------------------------
    num_householder: int = Field(
        1, ge=1, description="n_h delta steps per token (DeltaProduct): n_h keys, values and β per token, the gate once; "
        "Λ_t = α_t Π_j (I − β_{t,j} k_{t,j}ᵀ k_{t,j}), diagonal plus rank n_h",
    )
    inner_decay: bool = Field(
        False, description="Comba's closed-loop key p_t = σ(d_h) k_t (one d_h per head): the delta step removes β k_tᵀ(p_t S), "
        "Λ_t = (I − β_t k_tᵀ p_t) α_t (Comba eq. 8; SPLR)",
    )
    output_correction: bool = Field(False, description="Comba's output correction o_t = (q_t − D_h p_t) S_t (p = k without inner_decay)")
    correction_factor: float = Field(1.0, description="initial D_h of the output correction (fla: 1, 'sometimes 0.02 works better')")
    # -- the ATK preconditioner (Preconditioned Gated DeltaNet / KDA) ---------------------------------------
    preconditioner: Literal["none", "atk"] = Field(
        "none", description="'atk': the write key is preconditioned per key channel, k̃_t = k_t ⊙ exp(−log(x)·s(log(A_t + ε) − c_h)), "
        "s(r) = r/(1 + |r|), from the running second moment A_t = γ_t A_{t−1} + β^A_t k_t² (γ_t = exp(−A^A_h softplus(x W + b)), "
        "β^A_t = σ(x W)); Λ_t = (I − β_t k̃_tᵀk_t) Diag(α_t), written value β_t k̃_tᵀ v_t; A_t is carried in the cache",
    )
    precond_x: float = Field(1.5, gt=1, description="'atk': the preconditioner's range: k̃/k ∈ (1/x, x) (fla's squash x: 1.5)")
    precond_eps: float = Field(1e-6, gt=0, description="'atk': ε in log(A_t + ε)")
    precond_center: float = Field(-0.2, description="'atk': initial c_h, the learned per-head centre of log A_t (fla's log_atk_scale_init)")
    # -- Gated DeltaNet-2 -------------------------------------------------------------------------------
    channel_gates: bool = Field(
        False, description="Gated DeltaNet-2's channel-wise gates in place of the scalar β: an erase gate b_t = σ(x W_b) ∈ [0, 1]^{d_k'} "
        "on the key axis and a write gate w_t = σ(x W_w) ∈ [0, 1]^{d_v'} on the value axis, "
        "S_t = (I − k_tᵀ(b_t ⊙ k_t)) Diag(α_t) S_{t-1} + k_tᵀ(w_t ⊙ v_t) (b = w = β is KDA); negative_eigenvalues doubles b",
    )
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _check(self):
        self._check_widths()
        for name, w in (("expand_k", self.d_k), ("expand_v", self.d_v)):
            heads = self.k_heads or self.heads if name == "expand_k" else self.heads
            if w % heads:
                raise ValueError(f"{name}·d_model = {w} must be divisible by {'k_heads' if self.k_heads and name == 'expand_k' else 'heads'} = {heads}")
        if self.k_heads is not None:
            if self.heads % self.k_heads:
                raise ValueError(f"k_heads = {self.k_heads} must divide heads = {self.heads} (each q/k head serves heads / k_heads value heads)")
            if self.decay == "key" and self.k_heads != self.heads:
                raise ValueError(f"k_heads = {self.k_heads} != heads = {self.heads} (GVA) takes decay 'none' or 'head', got decay = 'key'")
        if self.num_householder > 1 and (self.fused_conv or (self.k_heads or self.heads) != self.heads or self.inner_decay or self.output_correction):
            raise ValueError(f"num_householder = {self.num_householder} (DeltaProduct) takes fused_conv = False, k_heads = None, "
                             "inner_decay = False and output_correction = False")
        if self.preconditioner != "none" and (self.num_householder > 1 or self.inner_decay or self.output_correction
                                              or self.channel_gates or (self.k_heads or self.heads) != self.heads):
            raise ValueError(f"preconditioner = {self.preconditioner!r} takes num_householder = 1, inner_decay = False, "
                             "output_correction = False, channel_gates = False and k_heads = None")
        if self.channel_gates and (self.num_householder > 1 or self.inner_decay or self.output_correction):
            raise ValueError("channel_gates = True (Gated DeltaNet-2) takes num_householder = 1, inner_decay = False and "
                             "output_correction = False (its erase gate is the closed-loop key's place)")
        if self.gate_rank is not None and not self.gate:
            raise ValueError(f"gate_rank = {self.gate_rank} is the output gate's rank: needs gate = True")
        return self


@dataclass
class _Params:
    q: torch.Tensor  # [B, T, H, K] (L2-normalized)
    k: torch.Tensor  # [B, T, H, K] (L2-normalized)
    v: torch.Tensor  # [B, T, H, V]
    beta: torch.Tensor  # [B, T, H]
    g: torch.Tensor | None  # log α: [B, T, H] or [B, T, H, K]
    state: dict = field(default_factory=dict)
    p: torch.Tensor | None = None  # Comba's closed-loop key [B, T, H, K] (the op's b), or None (b = k)


@register("deltanet", description="DeltaNet (Yang et al. 2024): the delta rule, L2-normalized q/k, β = σ(xW_β), short convs, norm + gate")
class DeltaNet(Mixer):
    """S_t = (I − β_t k_tᵀk_t) Diag(α_t) S_{t-1} + β_t k_tᵀ v_t (see the module docstring).

    Maps of phi(x): one per (value) head [B, H, T, T] (``seqmix.ops.delta_rule_map``). State per
    sequence: H·d_k'·d_v' + (2 d_k + d_v)(conv_size − 1), H the value heads (with ``k_heads``, GVA,
    d_k' = d_k/k_heads and the q/k of head j // (H/k_heads) are shared by its value heads).
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
        self.Hk = c.k_heads or H
        self.H, self.K, self.V = H, d_k // self.Hk, d_v // H
        self.n = n = c.num_householder
        self.W_q = nn.Linear(d, d_k, bias=c.qkv_bias)
        self.W_k = nn.Linear(d, n * d_k, bias=c.qkv_bias)  # DeltaProduct: n_h keys per token, layout (n h k) as fla
        self.W_v = nn.Linear(d, n * d_v, bias=c.qkv_bias)
        if c.channel_gates:  # GDN-2: the erase gate on each q/k head's key axis, the write gate on the values
            self.W_b = nn.Linear(d, d_k, bias=False)
            self.W_w = nn.Linear(d, d_v, bias=False)
        else:
            self.W_beta = nn.Linear(d, n * H, bias=False)
        if c.conv_size and c.fused_conv:
            self.conv = ShortConv(2 * d_k + d_v, c.conv_size, bias=False, activation="silu")
        elif c.conv_size:
            self.conv_q = ShortConv(d_k, c.conv_size, bias=False, activation="silu")
            self.conv_k = ShortConv(n * d_k, c.conv_size, bias=False, activation="silu")
            self.conv_v = ShortConv(n * d_v, c.conv_size, bias=False, activation="silu")
        if c.preconditioner == "atk":  # the running second moment's gate and write strength, the per-head centre
            self.W_atk = nn.Linear(d, 2 * H, bias=False)  # [γ logits; β^A logits]
            A_atk = torch.empty(H).uniform_(A_MIN, A_MAX)
            self.A_log_atk = nn.Parameter(A_atk.log())
            dt = torch.exp(torch.rand(H) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=1e-4)
            self.dt_bias_atk = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
            self.precond_center = nn.Parameter(torch.full((H,), float(c.precond_center)))
        if c.inner_decay:  # Comba: p = σ(d_h) k (fla's init d_h = 1)
            self.p_decay = nn.Parameter(torch.ones(H))
        if c.output_correction:  # Comba: q ← q − D_h p
            self.D = nn.Parameter(torch.full((H,), float(c.correction_factor)))
        if c.decay != "none":
            width = H if c.decay == "head" else H * self.K
            if c.decay == "head":
                self.W_a = nn.Linear(d, H, bias=False)
            else:
                r = c.low_rank or self.K
                self.W_a = nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, width, bias=False))
            A = torch.empty(H).uniform_(A_MIN, A_MAX)
            self.A_log = nn.Parameter(A.log())
            dt = torch.exp(torch.rand(width) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
        self.norm = RMSNorm(self.V, eps=c.norm_eps) if c.norm_shared else RMSNorm(d_v, eps=c.norm_eps, groups=H)
        if not c.gate:
            self.W_g = None
        elif c.gate_rank:
            self.W_g = nn.Sequential(nn.Linear(d, c.gate_rank, bias=False), nn.Linear(c.gate_rank, d_v, bias=False))
        else:
            self.W_g = nn.Linear(d, d_v, bias=False)
        self.W_o = nn.Linear(d_v, d, bias=False)
        self._scale = self.K**-0.5 if c.scale == "inv_sqrt_k" else 1.0
        self.__dict__["_step_fusable"] = self._fusable()

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "chunk_size": 8}

    # -- the parameter functions -------------------------------------------------------

    def _params(self, x, state, need_state) -> _Params:
        c = self.config
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        if c.conv_size and c.fused_conv:
            q, k, v, new = self.W_q(x), self.W_k(x), self.W_v(x), {}
            qkv, s = self.conv(torch.cat([q, k, v], dim=-1), state.get("conv") if state else None, output_final_state=need_state)
            if need_state:
                new["conv"] = s
            q, k, v = qkv.split([c.d_k, c.d_k, c.d_v], dim=-1)
        else:
            q, k, v, new = short_conv_qkv(self, x, state, need_state)
        n = self.n  # DeltaProduct: micro-step j of token t at t·n + j (fla's '... t (n h d) -> ... (t n) h d')
        q, k = self._l2(q.view(B, T, self.Hk, K)), self._l2(k.view(B, T * n, self.Hk, K))
        if self.Hk != H:  # GVA: q/k head j serves value heads j·r .. j·r + r - 1
            q, k = q.repeat_interleave(H // self.Hk, dim=2), k.repeat_interleave(H // self.Hk, dim=2)
        v = v.view(B, T * n, H, V)
        p = None
        if c.channel_gates:  # GDN-2: β = 1, the erase key p = b ⊙ k (2b with negative eigenvalues), the written value w ⊙ v
            erase = torch.sigmoid(self.W_b(x)).view(B, T, self.Hk, K)
            if self.Hk != H:
                erase = erase.repeat_interleave(H // self.Hk, dim=2)
            p = (2 * erase if c.negative_eigenvalues else erase) * k
            v = torch.sigmoid(self.W_w(x)).view(B, T, H, V) * v
            beta = torch.ones(B, T, H, dtype=v.dtype, device=v.device)
        else:
            beta = torch.sigmoid(self.W_beta(x)).view(B, T * n, H)
        if c.inner_decay:  # Comba eq. 8: the closed-loop key p_t = σ(d) k_t (after the L2 norm: the paper's form)
            p = k * torch.sigmoid(self.p_decay).view(H, 1)
        if c.output_correction:  # Comba: o_t = (q_t − D p_t) S_t
            q = q - self.D.view(H, 1) * (p if p is not None else k)
        if c.negative_eigenvalues and not c.channel_gates:
            beta = 2 * beta
        g = self._log_decay(x)
        if c.preconditioner == "atk":  # write with k̃ = k ⊙ M_t, erase with k: the op's b (the read key) is k
            k_write, A_T = self._precondition(x, k, state)
            if need_state:
                new["A"] = A_T
            k, p = k_write, k
        return _Params(q=q, k=k, v=v, beta=beta, g=g, state=new, p=p)

    def _log_decay(self, x):
        """log α of x [..., d]: [..., H] (decay 'head': Gated DeltaNet's −A_h softplus(x W_a + b_Δ) = −Δ_t A, Mamba-2's),
        [..., H, K] (decay 'key': KDA's one gate per key channel), or None (decay 'none')."""
        c, H = self.config, self.H
        if c.decay == "head":
            return self.layer_constant("a", lambda: -self.A_log.exp(), self.A_log) * F.softplus(project(self.W_a, x) + self.dt_bias)
        if c.decay == "key":
            a = self.layer_constant("a", lambda: -self.A_log.exp().view(H, 1), self.A_log)
            return a * F.softplus(project(self.W_a, x) + self.dt_bias).view(*x.shape[:-1], H, self.K)
        return None

    def _precondition(self, x, k, state):
        """(k ⊙ M_t [B, T, H, K], A_T [B, H, 1, K]): the ATK preconditioner. A_t = γ_t A_{t−1} + β^A_t k_t² per key
        channel is a linear recurrence (one state row per head, the K channels as values, the per-head decay γ_t);
        M_t = exp(−log(x) s(log(A_t + ε) − c_h)) with s(r) = r/(1 + |r|) lies in (1/x, x)."""
        c = self.config
        B, T, H, K = k.shape
        a, b = upcast(self.W_atk(x)).split(H, dim=-1)
        log_gamma = -self.A_log_atk.exp() * F.softplus(a + self.dt_bias_atk)  # [B, T, H]
        one = torch.ones(B, T, H, 1, dtype=log_gamma.dtype, device=x.device)
        A, A_T = linear_recurrence(one, one, torch.sigmoid(b).unsqueeze(-1) * upcast(k) ** 2, log_gamma,
                                   initial_state=state.get("A") if state else None, output_final_state=True, check_values=False)
        r = torch.log(A + c.precond_eps) - self.precond_center.view(H, 1)
        M = torch.exp(-math.log(c.precond_x) * r / (1 + r.abs()))
        return (k * M.to(k.dtype)), A_T

    def _l2(self, t):
        eps = self.config.qk_l2_eps
        return l2_normalize(t) if eps is None else t / torch.sqrt((t * t).sum(-1, keepdim=True) + eps)

    def _readout(self, o, x):
        """o [B, T, H, V] -> y [B, T, d]: the per-head RMSNorm, the gate, W_o."""
        c = self.config
        y = self.norm(o).flatten(2) if c.norm_shared else self.norm(o.flatten(2))
        if self.W_g is not None:
            g = self.W_g(x)
            y = y * (torch.sigmoid(g) if c.gate_act == "sigmoid" else F.silu(g))
        return self.W_o(y)

    # -- forward -------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        if mode == "step" and self.__dict__["_step_fusable"] and state and state.get("S") is not None:
            return self._fused_step(x, state)
        c = self.config
        P = self._params(x, state, need_state)
        o, S = self._core_op(P, P.v, state.get("S") if state else None, mode, need_state)
        y = self._readout(o, x)
        if self.n > 1:  # values and mixed per (head, Householder step): see core()
            return MixOut(y, {"S": S, **P.state} if need_state else None)
        return MixOut(y, {"S": S, **P.state} if need_state else None, values=P.v, mixed=o)

    # -- the fused decoding step --------------------------------------------------------

    def _fusable(self) -> bool:
        """Whether :meth:`_fused_step` computes this config's decoding step: one delta step per token (not DeltaProduct),
        the scalar β (not GDN-2's channel gates), no ATK preconditioner, no Comba key or correction, and the class's own
        parameter functions and readout."""
        c, cls = self.config, type(self)
        return (cls._params is DeltaNet._params and cls._readout is DeltaNet._readout and cls._core_op is DeltaNet._core_op
                and self.n == 1 and not c.channel_gates and c.preconditioner == "none" and not c.inner_decay
                and not c.output_correction)

    def _fused_step(self, x, state) -> MixOut:
        """One decoding step of a :meth:`_fusable` config after a prefill (``state`` holds S and the convs' states), in
        one pass on the token's [B, d] row: the projections, each short conv's step (:func:`~seqmix.ops.causal_conv1d_step`,
        its state shifted in place inside :func:`~seqmix.ops.states_in_place`), the L2 norms, β and the gate on the
        [B, H, ·] layout the step op takes, :func:`~seqmix.ops.delta_rule_step` (S in place), the norm, the output gate
        and W_o — no [B, T, ...] views. The same numbers as :meth:`_params`, :meth:`_core_op` and :meth:`_readout` in
        mode "step" (tests/test_delta_mixers.py ties them for every fusable preset)."""
        c = self.config
        B = x.shape[0]
        H, Hk, K, V = self.H, self.Hk, self.K, self.V
        u = x.reshape(B, x.shape[-1])  # [B, d] (a view of the one token)
        q, k, v = project(self.W_q, u), project(self.W_k, u), project(self.W_v, u)
        new = {}
        if c.conv_size and c.fused_conv:
            conv = self.conv
            qkv, new["conv"] = causal_conv1d_step(torch.cat([q, k, v], dim=-1), conv.weight, conv.bias, state["conv"],
                                                  activation=conv.activation)
        elif c.conv_size:  # the three convs stepped as one over [q; k; v], each keeping its own state
            convs = (self.conv_q, self.conv_k, self.conv_v)
            weight = self.layer_constant("qkv conv weight", lambda: torch.cat([cv.weight for cv in convs]), *(cv.weight for cv in convs))
            biases = [cv.bias for cv in convs if cv.bias is not None]
            bias = None if not biases else self.layer_constant("qkv conv bias", lambda: torch.cat(
                [cv.weight.new_zeros(cv.weight.shape[0]) if cv.bias is None else cv.bias for cv in convs]), *biases)
            qkv, (new["conv_q"], new["conv_k"], new["conv_v"]) = causal_conv1d_step(
                torch.cat([q, k, v], dim=-1), weight, bias, (state["conv_q"], state["conv_k"], state["conv_v"]),
                activation=self.conv_q.activation)
        if c.conv_size:  # q and k L2-normed as one tensor of 2·Hk heads (the first 2·d_k channels)
            qk = self._l2(qkv[:, :2 * c.d_k].reshape(B, 2 * Hk, K))
            q, k, v = qk[:, :Hk], qk[:, Hk:], qkv[:, 2 * c.d_k:]
        else:
            q, k = self._l2(F.silu(q).view(B, Hk, K)), self._l2(F.silu(k).view(B, Hk, K))
            v = F.silu(v)
        if Hk != H:  # GVA: q/k head j serves value heads j·r .. j·r + r - 1
            q, k = q.repeat_interleave(H // Hk, dim=1), k.repeat_interleave(H // Hk, dim=1)
        v = v.view(B, H, V)
        beta = torch.sigmoid(project(self.W_beta, u))  # [B, H]
        if c.negative_eigenvalues:
            beta = 2 * beta
        o, new["S"] = delta_rule_step(q, k, v, beta, self._log_decay(u), state["S"], scale=self._scale, check_values=False, check_shapes=False)
        r = self.norm(o).reshape(B, H * V) if c.norm_shared else self.norm(o.reshape(B, H * V))
        if self.W_g is not None:
            gate = project(self.W_g, u)
            r = r * (torch.sigmoid(gate) if c.gate_act == "sigmoid" else F.silu(gate))
        y = project(self.W_o, r)
        return MixOut(y.view(B, 1, -1), new, values=lambda: v.unsqueeze(1), mixed=lambda: o.unsqueeze(1))

    def _core_op(self, P, v, S0, mode, need_state):
        c = self.config
        if self.n > 1:
            return delta_product(P.q, P.k, v, P.beta, P.g, num_householder=self.n, scale=self._scale, initial_state=S0,
                                 output_final_state=need_state, mode=mode, chunk_size=c.chunk_size, check_values=False)
        return delta_rule(P.q, P.k, v, P.beta, P.g, scale=self._scale, initial_state=S0, output_final_state=need_state,
                          mode=mode, chunk_size=c.chunk_size, check_values=False, b=P.p)

    def core(self, x, *, mode=None):
        """(values, mixed). For n_h = 1 the forward pass's v and o. For DeltaProduct (n_h > 1) the maps are
        (head, Householder step j), m = h·n_h + j: values [B, T, H·n_h, V] the v_{t,j}, mixed the part of o
        that v_{·,j} writes (the op run on v with the other steps' values zeroed: o = Σ_j mixed_j by linearity)."""
        if self.n == 1:
            return super().core(x, mode=mode)
        self.check_input(x)
        P = self._params(x, None, False)
        B, T, n, H, V = x.shape[0], x.shape[1], self.n, self.H, self.V
        vj = P.v.view(B, T, n, H, V)
        parts = []
        for j in range(n):
            mask = torch.zeros(n, 1, 1, dtype=vj.dtype, device=vj.device)
            mask[j] = 1
            parts.append(self._core_op(P, (vj * mask).view(B, T * n, H, V), None, mode or self.reference_mode, False)[0])
        mixed = torch.stack(parts, 3).reshape(B, T, H * n, V)  # [B, T, H, n, V] -> maps h·n + j
        return vj.permute(0, 1, 3, 2, 4).reshape(B, T, H * n, V), mixed

    # -- the DSF view ----------------------------------------------------------------------

    def phi(self, x):
        """[B, H, T, T]: Φ[t, s] = scale · q_t M_t ⋯ M_{s+1} β_s k_sᵀ per head (values → core output)."""
        self.check_input(x)
        P = self._params(x, None, False)
        if self.n > 1:  # [B, H, T, T, n] -> maps (h, j): [B, H·n, T, T]
            Phi = delta_product_map(P.q, P.k, P.beta, P.g, num_householder=self.n, scale=self._scale, check_values=False)
            B, H, T = Phi.shape[:3]
            return Phi.permute(0, 1, 4, 2, 3).reshape(B, H * self.n, T, T)
        return delta_rule_map(P.q, P.k, P.beta, P.g, scale=self._scale, check_values=False, b=P.p)

    def dsf(self, x):
        """The core as a DSF with the block-diagonal, diagonal-plus-low-rank Λ_i of
        :meth:`seqmix.DSF.from_delta_rule` (input v, heads concatenated; output the core's o)."""
        self.check_input(x)
        P = self._params(x, None, False)
        if self.n > 1:
            return self._product_dsf(P)
        return DSF.from_delta_rule(P.q, P.k, P.beta, self.V, P.g, scale=self._scale, b=P.p)

    def _product_dsf(self, P):
        """DeltaProduct's DSF, dense: one copy of the state per Householder step j (the input v_{·,j} and its
        part of o, as core()): per (h, j, value channel) the K×K block Λ_t = M_{t,n} ⋯ M_{t,1} Diag(α_t),
        B_t = M_{t,n} ⋯ M_{t,j+1} β_{t,j} k_{t,j}ᵀ, C_t = scale · q_t. The mixer's state is the sum of the copies."""
        n, H, K, V = self.n, self.H, self.K, self.V
        q, k, beta = (t.detach().double() for t in (P.q, P.k, P.beta))
        B, T = q.shape[:2]
        k, beta = k.view(B, T, n, H, K), beta.view(B, T, n, H)
        I = torch.eye(K, dtype=torch.float64)
        alpha = torch.ones(B, T, H, K, dtype=torch.float64)
        if P.g is not None:
            g = P.g.detach().double()
            alpha = (g.unsqueeze(-1) if g.dim() == 3 else g).exp().expand(B, T, H, K)
        Ms = [I - beta[:, :, j, :, None, None] * k[:, :, j].unsqueeze(-1) * k[:, :, j].unsqueeze(-2) for j in range(n)]
        Lam = torch.diag_embed(alpha)
        ins = []
        for j in range(n):
            Lam = Ms[j] @ Lam
            b_j = (beta[:, :, j].unsqueeze(-1) * k[:, :, j]).unsqueeze(-1)  # [B, T, H, K, 1]
            for i in range(j + 1, n):
                b_j = Ms[i] @ b_j
            ins.append(b_j[..., 0])
        Bin = torch.stack(ins, 3)  # [B, T, H, n, K]
        eh, en, ev = (torch.eye(m, dtype=torch.float64) for m in (H, n, V))
        N, d = H * n * V * K, H * n * V  # state index ((h·n + j)·V + v)·K + a, input/output index (h·n + j)·V + v
        Lam_full = torch.einsum("bthac,hg,jl,vw->bthjvaglwc", Lam, eh, en, ev).reshape(B, T, N, N)
        Bm = torch.einsum("bthja,hg,jl,vw->bthjvaglw", Bin, eh, en, ev).reshape(B, T, N, d)
        Cm = torch.einsum("btha,hg,jl,vw->bthjvglwa", q * self._scale, eh, en, ev).reshape(B, T, d, N)
        return DSF.from_dense(Lam_full, Bm, Cm)

    def spectrum(self, x):
        """Eigenvalues of Λ_i [B, T, N] (complex): per head, those of (I − β kᵀk) Diag(α)."""
        return self.dsf(x).eigenvalues()

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        size = self.H * self.K * self.V
        if c.conv_size:
            size += (c.d_k + self.n * (c.d_k + c.d_v)) * (c.conv_size - 1)
        if c.preconditioner == "atk":
            size += self.H * self.K  # the running second moment A_t
        return size


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
register_preset(
    "qwen3_next_gdn", DeltaNet,
    description="Qwen3-Next's Gated DeltaNet layer: gated_deltanet with grouped value heads (k_heads), one conv over [q; k; v], "
                "FLA's l2norm and the gated RMSNorm with one weight shared by the heads",
    defaults={"decay": "head", "fused_conv": True, "qk_l2_eps": 1e-6, "norm_shared": True, "norm_eps": 1e-6},
    example={"d_model": 16, "heads": 4, "k_heads": 2, "chunk_size": 8},
)
register_preset(
    "kimi_kda", DeltaNet,
    description="Kimi-Linear's KDA layer: kda (key-wise gate A_h softplus(x W_f¹ W_f² + b)) with one conv over [q; k; v], "
                "FLA's l2norm, a low-rank sigmoid output gate and the RMSNorm with one weight shared by the heads",
    defaults={"decay": "key", "fused_conv": True, "qk_l2_eps": 1e-6, "norm_shared": True, "gate_act": "sigmoid", "norm_eps": 1e-6},
    example={"d_model": 16, "heads": 2, "chunk_size": 8, "gate_rank": 8},
)


register_preset(
    "gated_deltaproduct", DeltaNet,
    description="Gated DeltaProduct (Siems et al. 2025): n_h = 2 delta steps per token, Λ_t = α_t Π_j (I − β_j k_jᵀk_j), "
                "β ∈ [0, 2] (negative eigenvalues), Mamba-2's gate once per token",
    defaults={"decay": "head", "num_householder": 2, "negative_eigenvalues": True},
)
register_preset(
    "gated_deltanet2", DeltaNet,
    description="Gated DeltaNet-2 (fla's GDN-2): KDA's key-wise gate with a channel-wise erase gate b on the key axis and write "
                "gate w on the value axis, Λ_t = (I − k_tᵀ(b_t ⊙ k_t)) Diag(α_t), written value w_t ⊙ v_t",
    defaults={"decay": "key", "channel_gates": True, "qk_l2_eps": 1e-6, "norm_shared": True, "gate_act": "sigmoid"},
)
register_preset(
    "precond_gated_deltanet", DeltaNet,
    description="Preconditioned Gated DeltaNet (fla): gated_deltanet whose write key k ⊙ M_t is scaled per channel by a squashed "
                "running second moment of the keys (ATK), Λ_t = (I − β k̃ᵀk) α_t",
    defaults={"decay": "head", "preconditioner": "atk", "norm_shared": True},
)
register_preset(
    "precond_kda", DeltaNet,
    description="Preconditioned KDA (fla): kda with the ATK-preconditioned write key, Λ_t = (I − β k̃ᵀk) Diag(α_t)",
    defaults={"decay": "key", "preconditioner": "atk", "norm_shared": True, "gate_act": "sigmoid"},
)
register_preset(
    "comba", DeltaNet,
    description="Comba (Hu et al. 2025): the gated delta rule with closed-loop key p = σ(d)k, Λ_t = (I − β k_tᵀp_t) α_t, "
                "and output correction o_t = (q_t − D p_t) S_t",
    defaults={"decay": "head", "inner_decay": True, "output_correction": True},
)


# ------------------------------------------------------------------------------------------
# RWKV-7 "Goose" (Peng et al. 2025): the generalized delta rule, diagonal plus rank one
# ------------------------------------------------------------------------------------------


class RWKV7Config(MixerConfig):
    """RWKV-7's time mixing (Peng et al. 2025, §4, eq. 6-19; flash-linear-attention's RWKV7Attention for the defaults)."""

    heads: int = Field(4, gt=0, description="H (the paper: head size 64)")
    decay_rank: int | None = Field(None, gt=0, description="LoRA rank of the decay (None: fla's max(32, round(2.5√d·K/64 / 32)·32))")
    a_rank: int | None = Field(None, gt=0, description="LoRA rank of the in-context learning rate a (None: as decay_rank)")
    gate_rank: int | None = Field(None, gt=0, description="LoRA rank of the output gate (None: max(32, round(5√d / 32)·32))")
    v_rank: int | None = Field(None, gt=0, description="LoRA rank of the value-residual mix (None: max(32, round(1.7√d·K/64 / 32)·32))")
    value_residual: bool = Field(
        True, description="value residual learning (RWKV-7 paper eq. 13, after ResFormer, Zhou et al. 2024): "
        "v ← v + (v_first − v) ⊙ σ(ν_0 + x_v V_1 V_2), v_first the first layer's v of the same token, read from the "
        "backbone's per-forward context (Mixer.forward); the first RWKV-7 layer of a pass, or a mixer called without a "
        "context, has v_first = its own v (no residual). False: no ν parameters, v unchanged",
    )
    norm_eps: float = Field(1e-5, gt=0, description="GroupNorm epsilon per unit of head size (fla: head_dim · 1e-5)")
    token_shift: bool = Field(True, description="the token shift x_□ = x + (x_{t−1} − x) ⊙ μ_□ of the six streams (eq. 6); False: "
                              "every stream reads x (RADLADS' RAD-RWKV7), no μ parameters and no shift state")
    bonus: bool = Field(True, description="the current-token bonus (r ⊙ ρ ⊙ k̃)·1 v in the readout; False: none, no ρ parameter "
                        "(RAD-RWKV7)")
    rope_theta: float | None = Field(None, gt=1, description="RoPE (Llama's rotate-half pairs, this base) on r and k at their "
                                     "absolute positions, before κ̂ and k̃ (RAD-RWKV7 keeps the teacher's); None: no rotation")
    rope_scaling: dict | None = Field(None, description="the frequency scaling of that RoPE (softmax attention's field: 'type' in "
                                      "linear, dynamic, yarn, llama3, longrope; seqmix.ops.rotary); None = rope_theta^(-2j/K)")
    qkv_bias: bool = Field(False, description="biases in W_r, W_k, W_v (a Qwen2 teacher's q/k/v biases, RADLADS)")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _check(self):
        if self.d_model % self.heads:
            raise ValueError(f"d_model = {self.d_model} must be divisible by heads = {self.heads}")
        check_rope_fields(self.rope_theta is not None, self.rope_scaling, self.d_model // self.heads, "rope_theta")
        return self


#: the key of RWKV-7's value residual in the per-forward context (``Mixer.forward``): the first layer's v [B, T, d]
V_FIRST = "v_first"


def _lora_rank(d, K, mult, per_head=True):
    f = K / 64 if per_head else 1.0
    return max(32, int(round(mult * d**0.5 * f / 32) * 32))


@register("rwkv7", description="RWKV-7 Goose (Peng et al. 2025): S_t = (Diag(w_t) − (a⊙κ̂)ᵀκ̂) S_{t-1} + k̃ᵀv, diagonal plus rank one")
class RWKV7(Mixer):
    """RWKV-7's time mixing, in the row convention of ``seqmix.ops.delta_rule`` (the paper's column state transposed):

        S_t = (Diag(w_t) − (a_t ⊙ κ̂_t)ᵀ κ̂_t) S_{t-1} + k̃_tᵀ v_t,      o_t = r_t S_t                (eq. 17)
            = (I + a'ᵀ b') Diag(w_t) S_{t-1} + k̃ᵀ v,   a' = −a ⊙ κ̂,  b' = κ̂ ⊘ w                (the op's general pair)

    κ̂ reads the state before the decay (the paper and fla); the op's b reads it after, hence κ̂ ⊘ w, bounded
    since w = exp(−e^{−1/2} σ(·)) ≥ 0.545. Parametrization (eq. 6-16): token shift lerp x_□ = x + (x_{t−1} − x) ⊙ μ_□;
    r = x_r W_r, k = x_k W_k, v = x_v W_v; w = exp(−e^{−1/2} σ(w_0 + tanh(x_w W_1) W_2)); a = σ(a_0 + x_a A_1 A_2);
    g = σ(x_g G_1) G_2; κ̂ = normalize(k ⊙ ξ) per head; k̃ = k ⊙ (1 + (a − 1) ⊙ α) (fla: k + k(a − 1)k_a).
    Readout: y = ((GroupNorm_h(o) + (r ⊙ ρ ⊙ k̃)·1 v) ⊙ g) W_o, the bonus per head (fla's r_k).

    Value residual (``value_residual``, eq. 13): v_t ← v_t + (v_first,t − v_t) ⊙ σ(ν_0 + x_v,t V_1 V_2), where
    v_first [B, T, d] is the value of the same tokens in the model's first layer. It travels in the
    backbone's per-forward ``context`` dict (``Mixer.forward``; key :data:`V_FIRST`): the first RWKV-7
    layer of a pass writes its v there (and mixes nothing: lerp(v, v, ·) = v, its ν parameters get zero
    gradients, kept so that every layer has the same parameters and DDP sees them used), later layers
    read it. Each pass holds its own tokens, so a decoding step's v_first is the first layer's v of
    that token: nothing more in the cache. Without a context (a mixer on its own, ``core``, ``phi``,
    ``dsf``) the mixer is a first layer. The map Φ does not depend on v, so phi and dsf are unchanged;
    ``core``'s values are this layer's v without the mix.

    RADLADS' RAD-RWKV7 (Goldstein et al. 2025, App. B; recursal's qwerky7 time mix), the ``rad_rwkv7`` preset: no token
    shift (``token_shift=False``), no bonus (``bonus=False``), RoPE on r and k before κ̂ (``rope_theta``), q/k/v biases
    where the teacher has them (``qkv_bias``); r, k, v, o take the teacher's q, k, v, o (seqmix.linearize's init table).

    DSF view: maps = heads, values = v, mixed = o (the state path, before the norm; the bonus is a D_i term
    of the full layer, outside Φ). Λ_t per head and value channel: the K×K block Diag(w_t) − (a_t⊙κ̂_t)ᵀκ̂_t
    (:meth:`seqmix.DSF.from_delta_rule` with a, b). State: H·K·V + d (the token shift).
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "H·K·V (+ d with the token shift)"
    map_unit = "head"
    diagonal_transition = False
    uses_context = True
    Config = RWKV7Config

    def __init__(self, config: RWKV7Config | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, H = c.d_model, c.heads
        self.H, self.K, self.V = H, d // H, d // H
        K = self.K
        ratio = torch.arange(d, dtype=torch.float32) / d  # the official layer-0 initialization (ratio_1_to_almost0 = 1)
        if c.token_shift:
            self.mu = nn.Parameter(torch.stack([1 - ratio**p for p in (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)]))  # r, w, k, v, a, g
        self.W_r = nn.Linear(d, d, bias=c.qkv_bias)
        self.W_k = nn.Linear(d, d, bias=c.qkv_bias)
        self.W_v = nn.Linear(d, d, bias=c.qkv_bias)
        self.W_o = nn.Linear(d, d, bias=False)
        rw, ra = c.decay_rank or _lora_rank(d, K, 2.5), c.a_rank or _lora_rank(d, K, 2.5)
        rg, rv = c.gate_rank or _lora_rank(d, K, 5, per_head=False), c.v_rank or _lora_rank(d, K, 1.7)
        self.w1, self.w2 = nn.Linear(d, rw, bias=False), nn.Linear(rw, d, bias=False)
        self.w0 = nn.Parameter(-6 + 5 * ratio)  # the official decay speed init (w0 = -6 + 5 (i/(d-1))^{0.85·...}, simplified)
        self.a1, self.a2 = nn.Linear(d, ra, bias=False), nn.Linear(ra, d, bias=False)
        self.a0 = nn.Parameter(torch.full((d,), -0.19))
        self.g1, self.g2 = nn.Linear(d, rg, bias=False), nn.Linear(rg, d, bias=False)
        if c.value_residual:
            self.v1, self.v2 = nn.Linear(d, rv, bias=False), nn.Linear(rv, d, bias=False)
            self.v0 = nn.Parameter(torch.full((d,), 0.73))
        for lin in (self.w2, self.a2, self.g2):
            nn.init.zeros_(lin.weight) if lin is not self.g2 else nn.init.normal_(lin.weight, std=0.1)
        self.k_k = nn.Parameter(torch.full((d,), 0.85))  # ξ: the removal key's scale before the norm
        self.k_a = nn.Parameter(torch.ones(d))  # α: how much a reaches the written key
        if c.bonus:
            self.r_k = nn.Parameter(torch.full((H, K), 0.1))  # ρ: the bonus
        self.norm = LayerNorm(d, eps=K * c.norm_eps, groups=H)
        # (a plain attribute: whether the class's own parameter functions and forward are in place, read per step)
        self.__dict__["_step_fusable"] = type(self)._params is RWKV7._params and type(self)._forward is RWKV7._forward

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "chunk_size": 8, "decay_rank": 4, "a_rank": 4, "gate_rank": 4, "v_rank": 4}

    def _v_first(self, v, context):
        """The first layer's values for the value residual: context[V_FIRST], or v itself (written there)
        when this is the first RWKV-7 layer of the pass or there is no context. v: [B, T, d]."""
        if context is None:
            return v
        first = context.get(V_FIRST)
        if first is None:
            context[V_FIRST] = v
            return v
        if not isinstance(first, torch.Tensor) or first.shape != v.shape:
            got = list(first.shape) if isinstance(first, torch.Tensor) else type(first).__name__
            raise ValueError(f"RWKV7: argument 'context'[{V_FIRST!r}] must be the first layer's values of shape {list(v.shape)} "
                             f"[batch, time, d_model] (the same tokens as this layer's input), got {got}")
        return first

    def _params(self, x, state, need_state, context=None):
        c = self.config
        B, T, d = x.shape
        H, K, V = self.H, self.K, self.V
        if c.token_shift:
            first = state.get("shift") if state else None
            prev = torch.cat([first.unsqueeze(1) if first is not None else torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
            xr, xw, xk, xv, xa, xg = (token_mix(x, prev, m) for m in self.mu)  # token shift x + (prev − x) ⊙ μ (eq. 6)
        else:
            xr = xw = xk = xv = xa = xg = x
        r, k, v = self.W_r(xr), self.W_k(xk), self.W_v(xv)
        if c.rope_theta is not None:  # RAD-RWKV7: the teacher's RoPE on r and k, before κ̂ and k̃
            r, k = (t.view(B, T, H, K) for t in (r, k))
            pos = state.get("pos", 0) if state else 0
            r, k = (t.flatten(2) for t in rope_rotate(self, c.rope_theta, pos, r, k, scaling=c.rope_scaling))
        logw, a, g = self._gates(xw, xa, xg)
        v = self._mixed_value(v, xv, context)
        kappa, kt, logw, a = self._keys(k, a, logw)
        return dict(r=r.view(B, T, H, K), k=kt, v=v.view(B, T, H, V), logw=logw, ra=-(a * kappa), rb=kappa * (-logw).exp(),
                    g=g, kappa=kappa, a=a, shift=x[:, -1] if need_state and c.token_shift else None)

    def _gates(self, xw, xa, xg):
        """(log w (eq. 11), the in-context learning rate a (eq. 12), the gate g (eq. 10)), each [..., d] from its stream
        [..., d] (a sequence's or one token's)."""
        logw = -math.exp(-0.5) * torch.sigmoid(self.w0 + project(self.w2, torch.tanh(project(self.w1, xw))))
        a = torch.sigmoid(self.a0 + project(self.a2, project(self.a1, xa)))
        return logw, a, project(self.g2, torch.sigmoid(project(self.g1, xg)))

    def _mixed_value(self, v, xv, context):
        """v [B, T, d] with the value residual (eq. 13: v + (v_first − v) ⊙ σ(ν); lerp(v, v, ·) = v in the first layer),
        the first layer of a pass writing its v into ``context`` whether or not it mixes."""
        v_first = self._v_first(v, context)
        if not self.config.value_residual:
            return v
        nu = torch.sigmoid(self.v0 + project(self.v2, project(self.v1, xv)))  # ν (float32 under autocast: v0 is)
        return torch.lerp(v, v_first.to(v.dtype), nu.to(v.dtype))

    def _keys(self, k, a, logw):
        """(κ̂ = normalize(k ⊙ ξ) (eq. 14), k̃ = k ⊙ (1 + (a − 1) ⊙ α) (eq. 15), log w, a), each [..., H, K] from [..., d]."""
        shape = (*k.shape[:-1], self.H, self.K)
        kappa = l2_normalize((k * self.k_k).view(shape))
        return kappa, (k + k * (a - 1) * self.k_a).view(shape), logw.view(shape), a.view(shape)

    def _fused_step(self, x, state, context) -> MixOut:
        """One decoding step after a prefill (``state`` holds S) in one pass on the token's [B, d] row: the same numbers as
        :meth:`_params`, the op's step and the readout in mode "step" (tests/test_delta_mixers.py ties them for the
        presets with and without token shift, bonus, value residual and RoPE), without the [B, T, ...] views and the
        module calls (:func:`~seqmix.mixers.layers.project`), r and k turned by RoPE as one tensor, and
        :func:`~seqmix.ops.delta_rule_step` called directly (S in place inside :func:`~seqmix.ops.states_in_place`)."""
        c = self.config
        B, d = x.shape[0], x.shape[-1]
        H, K, V = self.H, self.K, self.V
        u = x.reshape(B, d)  # (a view of the one token)
        new = {}
        if c.token_shift:
            first = state.get("shift")
            prev = torch.zeros_like(u) if first is None else first.to(u.dtype)
            xr, xw, xk, xv, xa, xg = (token_mix(u, prev, m) for m in self.mu)
            new["shift"] = u
        else:
            xr = xw = xk = xv = xa = xg = u
        r, k, v = project(self.W_r, xr), project(self.W_k, xk), project(self.W_v, xv)
        if c.rope_theta is not None:  # r and k as one tensor of 2H heads at the token's position
            pos = state.get("pos", 0)
            rk = rope_rotate(self, c.rope_theta, pos, torch.cat([r, k], -1).view(B, 1, 2 * H, K), scaling=c.rope_scaling)[0]
            r, k = rk.view(B, 2 * d).split(d, dim=-1)
            new["pos"] = pos + 1
        logw, a, g = self._gates(xw, xa, xg)
        v = self._mixed_value(v.view(B, 1, d), xv.view(B, 1, d), context)
        kappa, kt, logw, a = self._keys(k, a, logw)
        rh, vh = r.view(B, H, K), v.view(B, H, V)
        o, new["S"] = delta_rule_step(rh, kt, vh, torch.ones_like(logw[..., 0]), logw, state["S"], a=-(a * kappa),
                                      b=kappa * (-logw).exp(), check_values=False, check_shapes=False)
        h = self.norm(o.reshape(B, H * V))
        if c.bonus:
            h = h + ((rh * kt * self.r_k).sum(-1, keepdim=True) * vh).reshape(B, H * V)
        y = project(self.W_o, h * g)
        return MixOut(y.view(B, 1, -1), new, values=lambda: vh.unsqueeze(1), mixed=lambda: o.unsqueeze(1))

    def _forward(self, x, *, state, mode, need_state, context=None):
        if mode == "step" and self.__dict__["_step_fusable"] and state and state.get("S") is not None:
            return self._fused_step(x, state, context)
        c = self.config
        P = self._params(x, state, need_state, context)
        one = torch.ones_like(P["logw"][..., 0])
        o, S = delta_rule(P["r"], P["k"], P["v"], one, P["logw"], a=P["ra"], b=P["rb"], initial_state=state.get("S") if state else None,
                          output_final_state=need_state, mode=mode, chunk_size=c.chunk_size, check_values=False)
        B, T = x.shape[:2]
        h = self.norm(o.flatten(2))
        if c.bonus:
            h = h + ((P["r"] * P["k"] * self.r_k).sum(-1, keepdim=True) * P["v"]).flatten(2)
        y = self.W_o(h * P["g"])
        new = None
        if need_state:
            new = {"S": S}
            if c.token_shift:
                new["shift"] = P["shift"]
            if c.rope_theta is not None:
                new["pos"] = (state.get("pos", 0) if state else 0) + T
        return MixOut(y, new, values=P["v"], mixed=o)

    def phi(self, x):
        """[B, H, T, T]: Φ[t, s] = r_t M_t ⋯ M_{s+1} k̃_sᵀ per head."""
        self.check_input(x)
        P = self._params(x, None, False)
        return delta_rule_map(P["r"], P["k"], torch.ones_like(P["logw"][..., 0]), P["logw"], a=P["ra"], b=P["rb"], check_values=False)

    def dsf(self, x):
        self.check_input(x)
        P = self._params(x, None, False)
        return DSF.from_delta_rule(P["r"], P["k"], torch.ones_like(P["logw"][..., 0]), self.V, P["logw"], a=P["ra"], b=P["rb"])

    def spectrum(self, x):
        return self.dsf(x).eigenvalues()

    def state_size(self, seq_len: int | None = None) -> int:
        return self.H * self.K * self.V + (self.d_model if self.config.token_shift else 0)


#: RADLADS' RAD-RWKV7 (Goldstein et al. 2025, App. B; recursal/RADLADS-paper configs/qwerky7.yaml): RWKV-7 without token shift
#: and bonus, RoPE on r and k (linearize sets the teacher's base), GroupNorm, low-rank gate, value residual
RAD_RWKV7 = dict(token_shift=False, bonus=False)
register_preset(
    "rad_rwkv7", RWKV7,
    description="RAD-RWKV7 (RADLADS): RWKV-7's time mixing without token shift and bonus, the teacher's RoPE on r and k",
    defaults=RAD_RWKV7,
    example={"d_model": 16, "heads": 2, "chunk_size": 8, "decay_rank": 4, "a_rank": 4, "gate_rank": 4, "v_rank": 4, "rope_theta": 10000.0},
)


# ------------------------------------------------------------------------------------------
# MoM: a mixture of memories, each a gated delta rule that sees the tokens routed to it
# ------------------------------------------------------------------------------------------


class MoMConfig(ExpandedWidths, MixerConfig):
    """MoM (Du et al. 2025, "MoM: Linear Sequence Modeling with Mixture-of-Memories"; flash-linear-attention's
    MomAttention layer, gated delta rule memories)."""

    heads: int = Field(4, gt=0, description="H, the heads of every memory")
    expand_k: float = Field(1.0, gt=0, description="d_k = expand_k·d_model (over all heads)")
    expand_v: float = Field(1.0, gt=0, description="d_v = expand_v·d_model (over all heads)")
    num_memories: int = Field(4, ge=1, description="E, the memories (fla: 8)")
    topk: int = Field(2, ge=1, description="memories each token is routed to (fla: 2)")
    shared_memory: bool = Field(False, description="one more memory that every token writes and reads with weight 1 (fla's shared_mem)")
    conv_size: int | None = Field(4, ge=1, description="kernel of the short convs on q and on each memory's k and v (SiLU after); None: SiLU only")
    gate: bool = Field(True, description="output gate: y = W_o(RMSNorm_h(o) ⊙ SiLU(x W_g)) (fla's use_output_gate)")
    norm_eps: float = Field(1e-5, gt=0, description="ε of the output RMSNorm")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _check(self):
        self._check_widths()
        for name, w in (("expand_k", self.d_k), ("expand_v", self.d_v)):
            if w % self.heads:
                raise ValueError(f"{name}·d_model = {w} must be divisible by heads = {self.heads}")
        if self.topk > self.num_memories:
            raise ValueError(f"topk = {self.topk} must be <= num_memories = {self.num_memories}")
        return self


@register("mom", description="MoM (Du et al. 2025): a router sends each token to its top-k of E gated-delta-rule memories, outputs mixed by the router")
class MoM(Mixer):
    """Mixture of memories (Du et al. 2025, §3; fla's MomAttention). A router scores the E memories per token,
    r_t = softmax(x_t W_r), keeps the top k and renormalizes them: w_{t,e} = r_{t,e} / Σ_{e' ∈ top_k} r_{t,e'} for
    e ∈ top_k(t), else 0. Memory e is a Gated DeltaNet with its own k, v, β and gate projections, and writes
    only the tokens routed to it:

        S^e_t = (I − β^e_t k^e_tᵀk^e_t) α^e_t S^e_{t−1} + β^e_t k^e_tᵀ v^e_t     if e ∈ top_k(t),   S^e_t = S^e_{t−1} else
        o_t = Σ_e w_{t,e} q_t S^e_t / sqrt(d_k')

    with a shared query q_t, α^e_t = exp(−A_h softplus(x W_a^e + b_Δ)), β^e_t = σ(x W_β^e), q and k L2-normalized per
    head. Skipping a token is the delta rule with β = 0 and α = 1 there, so the E memories run as E·H heads of
    one ``delta_rule`` call whose β and log α are masked by the routing, and whose query for memory e is
    w_{t,e} q_t (zero where t is not routed to e): every mode, the maps and the DSF are the op's. The readout
    sums the memories (y = W_o(RMSNorm_h(Σ_e o^e) ⊙ SiLU(x W_g))). ``shared_memory`` adds one memory that
    every token writes and reads with weight 1.

    DSF view: maps = (memory, head), values = each memory's v^e, mixed = w_{t,e} q_t S^e_t / sqrt(d_k') (the
    sum over e is the readout's); Λ_t per memory and head is the gated delta rule's (I − β kᵀk) α, or the
    identity where the token is not routed there. State: (E [+1])·H·d_k'·d_v' plus the convs.

    Where fla differs: its short convs run over each memory's routed tokens only (a sequence compacted per
    memory), these over the whole sequence, before the routing (the token's own neighbourhood for every
    memory); with ``conv_size=None`` the two coincide.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "(E [+1])·H·d_k'·d_v' + (d_k + E'·(d_k + d_v))·(conv−1)"
    map_unit = "head"
    diagonal_transition = False
    Config = MoMConfig

    def __init__(self, config: MoMConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, d_k, d_v, H = c.d_model, c.d_k, c.d_v, c.heads
        self.E = c.num_memories + (1 if c.shared_memory else 0)  # the shared memory is the last one
        self.H, self.K, self.V = H, d_k // H, d_v // H
        E = self.E
        self.W_router = nn.Linear(d, c.num_memories, bias=False)
        self.W_q = nn.Linear(d, d_k, bias=False)
        self.W_k = nn.Linear(d, E * d_k, bias=False)  # memory e: rows e·d_k .. (e+1)·d_k
        self.W_v = nn.Linear(d, E * d_v, bias=False)
        self.W_beta = nn.Linear(d, E * H, bias=False)
        self.W_a = nn.Linear(d, E * H, bias=False)
        if c.conv_size:
            self.conv_q = ShortConv(d_k, c.conv_size, bias=False, activation="silu")
            self.conv_k = ShortConv(E * d_k, c.conv_size, bias=False, activation="silu")
            self.conv_v = ShortConv(E * d_v, c.conv_size, bias=False, activation="silu")
        A = torch.empty(H).uniform_(A_MIN, A_MAX)
        self.A_log = nn.Parameter(A.log())
        dt = torch.exp(torch.rand(H) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.norm = RMSNorm(self.V, eps=c.norm_eps)  # per head, one weight shared by the heads (fla's o_norm)
        self.W_g = nn.Linear(d, d_v, bias=False) if c.gate else None
        self.W_o = nn.Linear(d_v, d, bias=False)
        self._scale = self.K ** -0.5

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "num_memories": 3, "topk": 2, "chunk_size": 8}

    def routing(self, x):
        """w [B, T, E]: the renormalized top-k router weights (zero off the top k; the shared memory: 1), and the
        routing mask [B, T, E] (1 where the token writes the memory)."""
        c = self.config
        r = torch.softmax(linear_f32(self.W_router, x), dim=-1)  # float32: a flipped choice is no rounding error
        top, idx = torch.topk(r, c.topk, dim=-1)
        w = torch.zeros_like(r).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        mask = torch.zeros_like(r).scatter(-1, idx, torch.ones_like(top))
        if c.shared_memory:
            one = torch.ones_like(r[..., :1])
            w, mask = torch.cat([w, one], -1), torch.cat([mask, one], -1)
        return w, mask

    def _params(self, x, state, need_state):
        """q (router-weighted), k [B, T, E·H, K], v [B, T, E·H, V], β, log α [B, T, E·H] (masked), the new conv states."""
        c = self.config
        B, T, _ = x.shape
        E, H, K, V = self.E, self.H, self.K, self.V
        q, k, v, new = short_conv_qkv(self, x, state, need_state)
        w, mask = self.routing(x)  # [B, T, E]
        q = l2_normalize(q.view(B, T, 1, H, K)) * w.view(B, T, E, 1, 1).to(q.dtype)  # memory e reads w_{t,e} q_t
        k = l2_normalize(k.view(B, T, E, H, K))
        m = mask.view(B, T, E, 1)
        beta = torch.sigmoid(self.W_beta(x)).view(B, T, E, H) * m.to(x.dtype)
        g = -self.A_log.exp() * F.softplus(upcast(self.W_a(x)).view(B, T, E, H) + self.dt_bias) * m
        return (q.reshape(B, T, E * H, K), k.reshape(B, T, E * H, K), v.view(B, T, E * H, V),
                beta.reshape(B, T, E * H), g.reshape(B, T, E * H), new)

    def _forward(self, x, *, state, mode, need_state):
        q, k, v, beta, g, new = self._params(x, state, need_state)
        o, S = delta_rule(q, k, v, beta, g, scale=self._scale, initial_state=state["S"] if state else None,
                          output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        B, T = x.shape[:2]
        y = self.norm(o.view(B, T, self.E, self.H, self.V).sum(2))  # the memories summed, then RMSNorm per head
        y = y.flatten(2)
        if self.W_g is not None:
            y = y * F.silu(self.W_g(x))
        return MixOut(self.W_o(y), {"S": S, **new} if need_state else None, values=v, mixed=o)

    def phi(self, x):
        """[B, E·H, T, T]: per memory and head, w_{t,e} q_t M_t ⋯ M_{s+1} β_s k_sᵀ / sqrt(d_k') (zero columns where s is
        not routed to e, zero rows where t is not)."""
        self.check_input(x)
        q, k, _, beta, g, _ = self._params(x, None, False)
        return delta_rule_map(q, k, beta, g, scale=self._scale, check_values=False)

    def dsf(self, x):
        """The E·H gated delta rules as one block-diagonal DSF (:meth:`seqmix.DSF.from_delta_rule`): input the memories'
        values, output their router-weighted outputs (before the sum over memories)."""
        self.check_input(x)
        q, k, _, beta, g, _ = self._params(x, None, False)
        return DSF.from_delta_rule(q, k, beta, self.V, g, scale=self._scale)

    def spectrum(self, x):
        return self.dsf(x).eigenvalues()

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        size = self.E * self.H * self.K * self.V
        if c.conv_size:
            size += (c.d_k + self.E * (c.d_k + c.d_v)) * (c.conv_size - 1)
        return size


# ------------------------------------------------------------------------------------------
# Momentum DeltaNet: the delta rule's update through a momentum state
# ------------------------------------------------------------------------------------------


class MomentumDeltaNetConfig(ExpandedWidths, MixerConfig):
    """Momentum DeltaNet (flash-linear-attention's MomentumDeltaNet layer; the momentum delta rule of
    ``seqmix.ops.momentum_delta``)."""

    heads: int = Field(4, gt=0, description="H")
    expand_k: float = Field(1.0, gt=0, description="d_k = expand_k·d_model (over all heads)")
    expand_v: float = Field(2.0, gt=0, description="d_v = expand_v·d_model (over all heads; fla: 2)")
    conv_size: int | None = Field(4, ge=1, description="kernel of the short convs on q, k, v (SiLU after); None: SiLU only")
    gate: bool = Field(True, description="output gate: W_o(RMSNorm_h(o) ⊙ SiLU(x W_g)) (fla's use_gate)")
    output_correction: bool = Field(True, description="q ← q − D_h k before the L2 norm (fla's use_output_correction)")
    p_times_alpha: bool = Field(True, description="the gradient reads the state with p_t = α_t k_t (fla's use_p_times_alpha); False: p_t = k_t")
    min_log_mu: float | None = Field(-2.0, lt=0, description="log μ_t clamped below at this value (fla: −2); None: no clamp")
    negative_eigenvalues: bool = Field(False, description="β doubled (fla's allow_neg_eigval)")
    tau_factor: float = Field(1.0, gt=0, description="η_t = 1 + tanh(x W_e / τ), τ = sqrt(d_model / tau_factor)")
    norm_eps: float = Field(1e-5, gt=0, description="ε of the output RMSNorm")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _check(self):
        self._check_widths()
        for name, w in (("expand_k", self.d_k), ("expand_v", self.d_v)):
            if w % self.heads:
                raise ValueError(f"{name}·d_model = {w} must be divisible by heads = {self.heads}")
        return self


@register("momentum_deltanet", description="Momentum DeltaNet: S_t = α S − β M_t, M_t = μ M + η kᵀ(p S − v): the delta rule's step through momentum")
class MomentumDeltaNet(Mixer):
    """Momentum DeltaNet (fla's MomentumDeltaNet layer). Per head, a memory S and a momentum M, both K×V:

        M_t = μ_t M_{t−1} + η_t k_tᵀ (p_t S_{t−1} − v_t),   S_t = α_t S_{t−1} − β_t M_t,   o_t = q_t S_t / sqrt(d_k')

    (``seqmix.ops.momentum_delta_rule``): the delta rule is gradient descent on ½‖k S − v‖² with step β; here
    the step goes through heavy-ball momentum μ. The parametrization follows fla's layer: q, k, v =
    SiLU(ShortConv(x W)), q ← q − D_h k (output correction), q and k L2-normalized, p_t = α_t k_t,
    log α_t = −A_h softplus(x W_a + b_Δ) + log cos²θ_t and β_t = sin²θ_t σ(x W_β), with θ_t = arctan(η_t c_h)
    splitting one unit between keeping (α) and moving (β), η_t = 1 + tanh(x W_e / τ) ∈ (0, 2),
    log μ_t = max(−A^μ_h softplus(x W_μ + b_μ), −2); then y = W_o(RMSNorm_h(o) ⊙ SiLU(x W_g)).

    DSF: the pair [S; M] is the state, 2K per head and value channel (``seqmix.ops.momentum_delta``'s A_t, b_t),
    a non-diagonal Λ_t = [[α I − β η kᵀp, −β μ I], [η kᵀp, μ I]] with eigenvalues that may be complex (the
    momentum's oscillation); ``decays(x)`` is its diagonal part [α, μ] (per key channel, S then M),
    ``spectrum(x)`` its eigenvalues. maps = heads, values = v, mixed = the core's o (before the norm).
    Modes: recurrent, chunk (the op's WY form with the coupled scalar kernel Γ = Ā Diag(β) M̄) and parallel.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "2·H·d_k'·d_v' (S and M) + (2·d_k + d_v)·(conv−1)"
    map_unit = "head"
    diagonal_transition = False
    Config = MomentumDeltaNetConfig

    def __init__(self, config: MomentumDeltaNetConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, d_k, d_v, H = c.d_model, c.d_k, c.d_v, c.heads
        self.H, self.K, self.V = H, d_k // H, d_v // H
        self.W_q = nn.Linear(d, d_k, bias=False)
        self.W_k = nn.Linear(d, d_k, bias=False)
        self.W_v = nn.Linear(d, d_v, bias=False)
        self.W_beta = nn.Linear(d, H, bias=False)
        self.W_a = nn.Linear(d, H, bias=False)
        self.W_mu = nn.Linear(d, H, bias=False)
        self.W_eta = nn.Linear(d, H, bias=False)
        if c.conv_size:
            self.conv_q = ShortConv(d_k, c.conv_size, bias=False, activation="silu")
            self.conv_k = ShortConv(d_k, c.conv_size, bias=False, activation="silu")
            self.conv_v = ShortConv(d_v, c.conv_size, bias=False, activation="silu")
        # fla's initialization: A, A^μ uniform in (0, 16), Δ log-uniform in [1e-3, 0.1] (b_Δ = b_μ), c_h uniform in (0, 4), D_h in (0, 1)
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1e-3, A_MAX).log())
        self.mu_log = nn.Parameter(torch.empty(H).uniform_(1e-3, A_MAX).log())
        dt = torch.exp(torch.rand(H) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=1e-4)
        inv_dt = dt + torch.log(-torch.expm1(-dt))
        self.dt_bias = nn.Parameter(inv_dt.clone())
        self.mu_bias = nn.Parameter(inv_dt.clone())
        self.log_factor = nn.Parameter(torch.empty(H).uniform_(1e-3, 4.0).log())
        if c.output_correction:
            self.D_log = nn.Parameter(torch.empty(H).uniform_(1e-3, 1.0).log())
        self.norm = RMSNorm(self.V, eps=c.norm_eps)  # per head, one weight shared by the heads (fla's o_norm)
        self.W_g = nn.Linear(d, d_v, bias=False) if c.gate else None
        self.W_o = nn.Linear(d_v, d, bias=False)
        self._scale = self.K ** -0.5
        self._tau = math.sqrt(d / c.tau_factor)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "expand_v": 1.0, "chunk_size": 8}

    def _params(self, x, state, need_state):
        """q, k, p [B, T, H, K]; v [B, T, H, V]; log α, log μ, β, η [B, T, H] (float32 or wider); the new conv states."""
        c = self.config
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        q, k, v, new = short_conv_qkv(self, x, state, need_state)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
        if c.output_correction:
            q = q - self.D_log.exp().view(H, 1).to(q.dtype) * k
        q, k = l2_normalize(upcast(q)), l2_normalize(upcast(k))
        eta = torch.tanh(upcast(self.W_eta(x)) / self._tau) + 1
        theta = torch.atan(eta * self.log_factor.exp())
        beta = torch.sin(theta) ** 2 * torch.sigmoid(upcast(self.W_beta(x)))
        log_alpha = -self.A_log.exp() * F.softplus(upcast(self.W_a(x)) + self.dt_bias) + torch.log(torch.cos(theta) ** 2)
        log_mu = -self.mu_log.exp() * F.softplus(upcast(self.W_mu(x)) + self.mu_bias)
        if c.min_log_mu is not None:
            log_mu = log_mu.clamp_min(c.min_log_mu)
        if c.negative_eigenvalues:
            beta = 2 * beta
        p = log_alpha.exp().unsqueeze(-1) * k if c.p_times_alpha else k
        return q, k, p, v, log_alpha, log_mu, beta, eta, new

    def _forward(self, x, *, state, mode, need_state):
        q, k, p, v, la, lm, beta, eta, new = self._params(x, state, need_state)
        S0 = (state["S"], state["M"]) if state else None
        o, SM = momentum_delta_rule(q, k, v, p, la, lm, beta, eta, scale=self._scale, initial_state=S0,
                                    output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        o = o.to(v.dtype)
        y = self.norm(o).flatten(2)
        if self.W_g is not None:
            y = y * F.silu(self.W_g(x))
        st = {"S": SM[0], "M": SM[1], **new} if need_state else None
        return MixOut(self.W_o(y), st, values=v, mixed=o)

    def phi(self, x):
        """[B, H, T, T]: Φ[t, s] = [q_t, 0] A_t ⋯ A_{s+1} b_s / sqrt(d_k') per head."""
        self.check_input(x)
        q, k, p, _, la, lm, beta, eta, _ = self._params(x, None, False)
        return momentum_delta_rule_map(q, k, p, la, lm, beta, eta, scale=self._scale, check_values=False)

    def dsf(self, x):
        """The pair [S; M] as a DSF, dense: per head and value channel the 2K×2K block A_t, input b_t, readout
        [q_t, 0]/sqrt(d_k'); lam = its diagonal part [α·1_K, μ·1_K] (input v, heads concatenated; output o)."""
        self.check_input(x)
        q, k, p, _, la, lm, beta, eta, _ = (t.detach().double() if isinstance(t, torch.Tensor) else t
                                            for t in self._params(x, None, False))
        B, T, H, K = q.shape
        V = self.V
        a, m = la.exp()[..., None, None], lm.exp()[..., None, None]
        be, e = (beta * eta)[..., None, None], eta[..., None, None]
        I = torch.eye(K, dtype=torch.float64)
        kp = k.unsqueeze(-1) * p.unsqueeze(-2)  # kᵀp [B, T, H, K, K] (row convention: S ← (·) S acts on S's rows)
        top = torch.cat([a * I - be * kp, -(beta[..., None, None] * m) * I.expand(B, T, H, K, K)], -1)
        bottom = torch.cat([e * kp, m * I.expand(B, T, H, K, K)], -1)
        A = torch.cat([top, bottom], -2)  # [B, T, H, 2K, 2K]
        b = torch.cat([(beta * eta).unsqueeze(-1) * k, -eta.unsqueeze(-1) * k], -1)  # [B, T, H, 2K]
        c = torch.cat([self._scale * q, torch.zeros_like(q)], -1)  # [B, T, H, 2K]
        eh, ev = torch.eye(H, dtype=torch.float64), torch.eye(V, dtype=torch.float64)
        N, d = H * V * 2 * K, H * V  # state index (h·V + v)·2K + i, input/output index h·V + v
        lam = torch.cat([la.exp().unsqueeze(-1).expand(B, T, H, K), lm.exp().unsqueeze(-1).expand(B, T, H, K)], -1)
        lam = lam.unsqueeze(3).expand(B, T, H, V, 2 * K).reshape(B, T, N)
        Lam = torch.einsum("bthij,hg,vw->bthvigwj", A, eh, ev).reshape(B, T, N, N)
        Bm = torch.einsum("bthi,hg,vw->bthvigw", b, eh, ev).reshape(B, T, N, d)
        Cm = torch.einsum("bthi,hg,vw->bthvgwi", c, eh, ev).reshape(B, T, d, N)
        eye = torch.eye(N, dtype=torch.float64).expand(B, T, N, N)
        return DSF(lam, Bm, Cm, None, U=Lam - torch.diag_embed(lam), W=eye)

    def spectrum(self, x):
        return self.dsf(x).eigenvalues()

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        size = 2 * self.H * self.K * self.V
        if c.conv_size:
            size += (2 * c.d_k + c.d_v) * (c.conv_size - 1)
        return size
