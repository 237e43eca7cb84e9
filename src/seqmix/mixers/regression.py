"""Regression layers: mixers whose readout solves a least-squares problem over the past (test-time
regression). MesaNet (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally Optimal
Test-Time Training").

Why a family file of its own: the state recursion is an ordinary gated linear recurrence (the family
of ``linear_attention``), but the readout C_t = q_tᵀ(H_t + λI)⁻¹ is computed from a second state H_t
by a solve — a new kind of part (an input-dependent readout), not a new Λ_t or hierarchical state
(``log_linear``). Other test-time regression layers (e.g. a preconditioned or multi-step solve)
belong here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from typing import Literal
from torch import nn

from ..dsf import DSF
from ..ops.mesa import mesa_net, mesa_readout
from ..ops.conv import causal_conv1d, causal_conv1d_step
from ..ops.precision import autocast_off, linear_f32, upcast
from ..ops.recurrence import recurrence_map
from .base import Mixer, MixerConfig, MixOut, register
from .layers import RMSNorm, ShortConv, l2_normalize


def _conv_f32(conv: ShortConv, x, state, need_state):
    """``conv(x, state)`` with its weights in x's dtype (float32 or wider here)."""
    w = conv.weight.to(x.dtype)
    b = conv.bias.to(x.dtype) if conv.bias is not None else None
    if x.shape[1] == 1 and state is not None:
        y, new = causal_conv1d_step(x[:, 0], w, b, state.to(x.dtype), activation=conv.activation)
        return y.unsqueeze(1), new
    state = state.to(x.dtype) if state is not None else None
    return causal_conv1d(x, w, b, state, activation=conv.activation, output_final_state=need_state)


class MesaNetConfig(MixerConfig):
    """fla's MesaNet layer defaults (head_dim = d_model/heads for both keys and values)."""

    heads: int = Field(4, gt=0, description="H (fla: 16 heads of 128)")
    conv_size: int | None = Field(4, ge=1, description="short causal convs (SiLU) on q and k; None: SiLU on the projections")
    conv_bias: bool = Field(False, description="bias of the short convs (fla: False)")
    solver: Literal["exact", "cg"] = Field("cg", description="the solve (H_t + λ)⁻¹ q_t: exact (linalg.solve) or conjugate gradient")
    cg_steps: int = Field(30, ge=0, description="CG steps (the paper's / fla's 30, training and decoding)")
    cg_init: Literal["zero", "jacobi"] = Field(
        "zero", description="CG start: 0 (fla's chunked training kernel) or the Jacobi guess q/(diag H + λ) (fla's decoding step)")
    cg_eps: float = Field(1e-5, ge=0, description="added to CG's denominators (fla: 1e-5)")
    lambda_lower_bound: float = Field(0.25, gt=0, description="λ = softplus(λ_param) + this (per key channel and head)")
    lambda_init: float = Field(1.0, gt=0, description="λ at initialization (fla: 1)")
    gate: bool = Field(False, description="output gate SiLU(x W_g) after the RMSNorm (fla's use_output_gate, default False)")
    norm_eps: float = Field(1e-5, gt=0, description="epsilon of the per-head RMSNorm on o")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")


@register("mesanet", description="MesaNet (von Oswald et al. 2025): online ridge regression, o_t = q_t(H_t + λ)⁻¹G_t, exact or CG solve")
class MesaNet(Mixer):
    """MesaNet: the Mesa layer (``seqmix.ops.mesa``) with fla's parametrization.

        q, k = L2(SiLU(ShortConv(x W_q|k))),  v = x W_v,  β_t = σ(x W_β + b),  γ_t = σ(x W_a + b)
        λ = softplus(λ_param) + lambda_lower_bound  ∈ R^(H×K)
        H_t = γ_t H_(t-1) + β_t k_tᵀk_t,   G_t = γ_t G_(t-1) + β_t k_tᵀv_t      (paper eq. 5-6)
        o_t = q_t (H_t + Diag λ)⁻¹ G_t                                          (paper eq. 7)
        y = W_o RMSNorm_h(o) (⊙ SiLU(x W_g) with gate)

    DSF view: the state G is linear in v with Λ_t = γ_t I and B_t = β_t k_t; the readout
    C_t = q_tᵀ(H_t + Diag λ)⁻¹ is input-dependent — it depends on the keys up to t through H_t (a
    second, key-only state that never sees v) — so for a given x the core IS a finite-state LTV system
    (``DSF.from_recurrence`` with q̃_t = (H_t + λ)⁻¹ q_t as the query), while the map x ↦ y is not linear
    in v's companion k. Modes: "recurrent" (reference), "parallel", "chunk" (all H_t in the chunk form
    of ``seqmix.ops.mesa.gram_states``, solves batched over t, hand-written gradients); the solve
    (exact / CG) is the config's ``solver``. Maps of phi(x): one per head [B, H, T, T]. State:
    H·K·(V + K) (G and H) + 2·d·(conv−1).
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    #: a forward over more tokens runs in segments of 512 (not the default 1024): a segment holds
    #: every H_t (16 KB per token at d_model 128) and the CG's vectors. Measured by ``python
    #: bench/scaling.py --mixers mesanet --segment-len L`` (d_model 128, 2-core CPU): forward+backward
    #: user CPU per token over T = 512..16384, 249-261 µs at L = 512, 258-297 µs at 256, 285-300 µs
    #: at 1024 (to T = 8192)
    auto_segment_len = 512
    reference_mode = "recurrent"
    state_formula = "H·K·(K + V) + 2·d·(conv-1)"
    map_unit = "head"
    Config = MesaNetConfig

    def __init__(self, config: MesaNetConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, H = c.d_model, c.heads
        if d % H:
            raise ValueError(f"MesaNet: heads = {H} must divide d_model = {d}")
        self.H, self.K = H, d // H
        self.V = self.K
        self.W_q = nn.Linear(d, d, bias=False)
        self.W_k = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(d, d, bias=False)
        self.W_a = nn.Linear(d, H, bias=True)
        self.W_beta = nn.Linear(d, H, bias=True)
        if c.conv_size:
            self.conv_q = ShortConv(d, c.conv_size, bias=c.conv_bias, activation="silu")
            self.conv_k = ShortConv(d, c.conv_size, bias=c.conv_bias, activation="silu")
        lam0 = torch.tensor(c.lambda_init - c.lambda_lower_bound)
        self.lambda_param = nn.Parameter(torch.full((d,), float(torch.log(torch.expm1(lam0)))))
        self.norm = RMSNorm(d, eps=c.norm_eps, groups=H)
        self.W_g = nn.Linear(d, d, bias=False) if c.gate else None
        self.W_o = nn.Linear(d, d, bias=False)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "chunk_size": 8}

    # -- parametrization ---------------------------------------------------------------------

    def _params(self, x, state, need_state):
        c = self.config
        Bt, T, _ = x.shape
        # q and k feed the Gram matrix H_t and the solve: computed in float32 or wider whatever autocast
        # or the parameters' dtype (docs/scale.md's rule; bf16 q, k cost 0.035 of relative error, 0.005 in float32)
        with autocast_off(x.device.type):
            q, k = linear_f32(self.W_q, x), linear_f32(self.W_k, x)
            new = {}
            if c.conv_size:
                q, sq = _conv_f32(self.conv_q, q, state.get("conv_q") if state else None, need_state)
                k, sk = _conv_f32(self.conv_k, k, state.get("conv_k") if state else None, need_state)
                if need_state:
                    new = {"conv_q": sq, "conv_k": sk}
            else:
                q, k = F.silu(q), F.silu(k)
        q = l2_normalize(q.view(Bt, T, self.H, self.K))
        k = l2_normalize(k.view(Bt, T, self.H, self.K))
        v = self.W_v(x).view(Bt, T, self.H, self.V)
        beta = torch.sigmoid(upcast(self.W_beta(x)))
        g = F.logsigmoid(upcast(self.W_a(x)))
        lamb = (F.softplus(upcast(self.lambda_param)) + c.lambda_lower_bound).view(self.H, self.K)
        return q, k, v, beta, g, lamb, new

    def _solve_kw(self):
        c = self.config
        return dict(solver=c.solver, cg_steps=c.cg_steps, cg_init=c.cg_init, cg_eps=c.cg_eps)

    def _forward(self, x, *, state, mode, need_state):
        q, k, v, beta, g, lamb, new = self._params(x, state, need_state)
        S0 = (state["G"], state["H"]) if state else None
        o, S = mesa_net(q, k, v, beta, g, lamb, **self._solve_kw(), initial_state=S0, output_final_state=need_state,
                        mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        o = o.to(v.dtype)  # q is float32 (above): the core's output returns to the values' dtype
        y = self.norm(o.flatten(2))
        if self.W_g is not None:
            y = y * F.silu(self.W_g(x))
        out_state = {"G": S[0], "H": S[1], **new} if need_state else None
        return MixOut(self.W_o(y), out_state, values=v, mixed=o)

    # -- the DSF view ----------------------------------------------------------------------

    def readout(self, x):
        """(q̃ [B, T, H, K], βk [B, T, H, K], log γ [B, T, H]): the DSF's C_t, B_t and Λ_t."""
        self.check_input(x)
        q, k, v, beta, g, lamb, _ = self._params(x, None, False)
        qt, _ = mesa_readout(q, k, beta, g, lamb, **self._solve_kw(), mode="parallel")
        return qt, beta.unsqueeze(-1) * k, g

    def phi(self, x):
        """[B, H, T, T]: Φ[t, s] = (q̃_t · β_s k_s) Π_(r=s+1..t) γ_r."""
        qt, bk, g = self.readout(x)
        return recurrence_map(qt, bk, g, check_values=False)

    def dsf(self, x):
        """Λ_t = γ_t I, B_t = β_t k_t, C_t = q̃_t = (H_t + Diag λ)⁻¹ q_t (input-dependent readout). Input v, output o."""
        qt, bk, g = self.readout(x)
        return DSF.from_recurrence(qt, bk, self.V, gk=g)

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        n = self.H * self.K * (self.V + self.K)
        if c.conv_size:
            n += 2 * c.d_model * (c.conv_size - 1)
        return n
