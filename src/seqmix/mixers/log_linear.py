"""Hierarchical states: log-linear attention (Guo et al. 2025, "Log-Linear Attention").

A base linear system whose past is kept in O(log T) Fenwick-tree level states instead of one,
each read with its own data-dependent weight λ (paper §3):

    o_t = Σ_ℓ λ_t^(ℓ) q_t S_t^(ℓ),        Φ = Φ_base ⊙ H,   H[t, s] = λ_t^(level(t, s))

level(t, s) = 0 for s = t, else bitlen(t xor s) (``seqmix.ops.log_linear``; the partition of
flash-linear-attention's naive reference). Two registered mixers, each the base mixer's own
parametrization (subclassed, not copied) plus the level-weight projection:

    log_linear_mamba2   base: Mamba-2 (``mamba2``: SSD block, q = C, k = ΔB, v = x, decay exp(Δ a))
    log_linear_gdn      base: Gated DeltaNet (``gated_deltanet``: the gated delta rule)

Level weights (fla's ``LogLinearMamba2`` layer, the paper's "λ = softplus(W x)" with a learnt
per-(head, level) scale): λ_t^(h, ℓ) = softplus(L_(h,ℓ) · (x_t W_λ)_(h,ℓ)), L initialized to 1;
``num_levels`` = 15 as fla (MAX_SEQUENCE_LENGTH 16384 = 2^14: 15 levels). The projection reads
the layer input u (fla: one more block of in_proj, the same map).

DSF view (a finite-state system for every T): per head and value channel the state is the n =
levels_needed(T) level states stacked, h_t = [h_t^(0); …; h_t^(n−1)] ∈ R^(n·K), with

    Λ_t = (I_n ⊗ M_t)(Carry_t ⊗ I_K),   B_t = e_0 ⊗ β_t k_tᵀ,   C_t = scale·[λ_t^(0) q_t, …, λ_t^(n−1) q_t]

M_t the base transition (α_t I for Mamba-2; (I − β_t k_tᵀk_t) Diag(α_t) for GDN) and Carry_t the
binary counter's merge at position t (levels 0..ctz(t) summed into level ctz(t)+1, then zeroed):
Λ_t is dense (not diagonal), time-varying in its sparsity pattern, hence ``DSF.from_dense``.
The state grows with T (O(log T) level states): ``state_size(seq_len)`` counts levels_needed(seq_len).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from ..dsf import DSF
from ..ops.log_linear import levels_needed, log_linear_attention
from ..ops.precision import upcast
from .base import MixOut, register
from .delta import DeltaNet, DeltaNetConfig, _Params
from .ssm import SSD, SSDConfig

#: fla's MAX_NUM_LEVELS: ceil(log2(16384)) + 1
NUM_LEVELS = 15


def _carry(n: int, p: int, dtype) -> torch.Tensor:
    """[n, n]: the level merge before position p's step (levels 0..c -> c+1, c = ctz(p)); identity at p = 0."""
    C = torch.eye(n, dtype=dtype)
    if p == 0:
        return C
    c = ((p & -p).bit_length()) - 1
    C[: c + 2] = 0
    if c + 1 < n:
        C[c + 1, : c + 2] = 1
    return C


def log_linear_dsf(q, k, lam, value_dim: int, g=None, beta=None, *, scale: float = 1.0, D=None) -> DSF:
    """The DSF of ``log_linear_attention`` (zero initial state): input v [B, T, H·V], output o.
    State index ((h·V + v)·n + ℓ)·K + k, n = levels_needed(T)."""
    q, k, lam = (t.detach().double() for t in (q, k, lam))
    Bt, T, H, K = q.shape
    V, n = int(value_dim), levels_needed(q.shape[1])
    eye_k = torch.eye(K, dtype=torch.float64)
    alpha = torch.ones(Bt, T, H, K, dtype=torch.float64)
    if g is not None:
        gg = g.detach().double()
        alpha = (gg.unsqueeze(-1) if gg.dim() == 3 else gg).exp().expand(Bt, T, H, K)
    M = torch.diag_embed(alpha)  # [B, T, H, K, K]: column convention h_t = M h_{t-1} (the key-side transition)
    bk = k
    if beta is not None:
        b = beta.detach().double()
        bk = b.unsqueeze(-1) * k
        M = (eye_k - bk.unsqueeze(-1) * k.unsqueeze(-2)) @ M
    carry = torch.stack([_carry(n, p, torch.float64) for p in range(T)])  # [T, n, n]
    blk = torch.einsum("bthkl,tij->bthikjl", M, carry).reshape(Bt, T, H, n * K, n * K)
    eye_h, eye_v = torch.eye(H, dtype=torch.float64), torch.eye(V, dtype=torch.float64)
    N = H * V * n * K
    Lam = torch.einsum("bthxy,hg,vw->bthvxgwy", blk, eye_h, eye_v).reshape(Bt, T, N, N)
    e0 = torch.zeros(n, dtype=torch.float64)
    e0[0] = 1
    Bm = torch.einsum("btha,l,hg,vw->bthvlagw", bk, e0, eye_h, eye_v).reshape(Bt, T, N, H * V)
    Cm = torch.einsum("btha,bthl,hg,vw->btgwhvla", scale * q, lam[..., :n], eye_h, eye_v).reshape(Bt, T, H * V, N)
    return DSF.from_dense(Lam, Bm, Cm, D)


class _Levels:
    """Mixin: the level weights λ_t^(h, ℓ) = softplus(L_(h,ℓ) · (x_t W_λ)_(h,ℓ)) (fla's form)."""

    def _init_levels(self, d: int, H: int, L: int) -> None:
        self.W_lambda = nn.Linear(d, H * L, bias=False)
        self.L = nn.Parameter(torch.ones(H, L))

    def level_scales(self, u: torch.Tensor) -> torch.Tensor:
        """[B, T, H, L] (float32 or wider)."""
        Bt, T, _ = u.shape
        H, L = self.L.shape
        return F.softplus(upcast(self.L) * upcast(self.W_lambda(u)).view(Bt, T, H, L))

    def _check_levels(self, T: int, pos: int) -> None:
        need = levels_needed(pos + T)
        if need > self.config.num_levels:
            raise ValueError(
                f"{type(self).__name__}: argument 'x' reaches position {pos + T - 1}, which needs {need} Fenwick levels; "
                f"num_levels = {self.config.num_levels} covers {2 ** (self.config.num_levels - 1)} tokens"
            )


# ------------------------------------------------------------------------------------------
# log-linear Mamba-2
# ------------------------------------------------------------------------------------------


class LogLinearMamba2Config(SSDConfig):
    num_levels: int = Field(NUM_LEVELS, gt=0, le=48, description="Fenwick levels L (covers 2^(L-1) tokens; fla: 15)")


@register(
    "log_linear_mamba2",
    description="Log-linear Mamba-2 (Guo et al. 2025): Mamba-2's SSD on O(log T) Fenwick-tree states, Φ = Φ_SSD ⊙ H(λ)",
    defaults={"block": True, "expand": 2, "d_state": 128},
    example={"d_model": 16, "d_state": 8, "headdim": 8, "groups": 2, "chunk_size": 8},
)
class LogLinearMamba2(_Levels, SSD):
    """Log-linear Mamba-2: the ``mamba2`` block (in_proj, conv, SSD parametrization, gated RMSNorm) with
    the SSD core replaced by :func:`~seqmix.ops.log_linear.log_linear_attention` (base: scalar decay):

        y_core,t = Σ_ℓ λ_t^(ℓ) C_t S_t^(ℓ) + D x_t,    S^(ℓ): the Fenwick level states of Δ_s B_s x_sᵀ

    (paper §3.3, log-linear Mamba-2). Modes: "parallel" (reference: Φ_SSD ⊙ H), "recurrent" (Fenwick
    states, also the decoding step), "chunk". Maps of phi(x): one per head, [B, heads, T, T], D on the
    diagonal. State: heads·headdim·d_state·levels_needed(seq_len) (+ the conv state); the cache also keeps
    the position ("pos", an int) since the level partition depends on it.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "parallel"
    state_formula = "d_inner·d_state·(⌊log2(T−1)⌋+2) + (d_inner + 2·groups·d_state)·(d_conv-1)"
    diagonal_transition = False
    Config = LogLinearMamba2Config

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self._init_levels(self.config.d_model, self.heads, self.config.num_levels)

    def _forward(self, u, *, state, mode, need_state):
        pos = state.get("pos", 0) if state else 0
        self._check_levels(u.shape[1], pos)
        x, z, delta, Bm, Cm, conv = self._inputs(u, state.get("conv") if state else None, need_state)
        q, k, gk = self._recurrence(delta, Bm, Cm)
        o, S = log_linear_attention(
            q, k, x, self.level_scales(u), gk, initial_state=state.get("S") if state else None, offset=pos,
            output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size, check_values=False,
        )
        y_core = o + self.D.unsqueeze(-1) * x
        y = y_core.flatten(2)
        if self.config.block:
            y = self._readout(y, z)
        new_state = None
        if need_state:
            new_state = {"S": S, "pos": pos + u.shape[1]}
            if self.config.block:
                new_state["conv"] = conv
        return MixOut(self.out_proj(y), new_state, values=x, mixed=y_core)

    def _parts(self, u):
        self.check_input(u)
        self._check_levels(u.shape[1], 0)
        x, _, delta, Bm, Cm, _ = self._inputs(u)
        q, k, gk = self._recurrence(delta, Bm, Cm)
        return x, q, k, gk, self.level_scales(u)

    def phi(self, u):
        """[B, heads, T, T]: Φ_SSD ⊙ H + D_h δ_ts."""
        from ..ops.log_linear import hierarchical_mask
        from ..ops.recurrence import recurrence_map
        x, q, k, gk, lam = self._parts(u)
        T = u.shape[1]
        return recurrence_map(q, k, gk, check_values=False) * hierarchical_mask(lam) + torch.diag_embed(self.D.unsqueeze(-1).expand(-1, T))

    def dsf(self, u):
        """:func:`log_linear_dsf` with base decay exp(Δa) per head and D = diag(D_h). Input x, output y_core."""
        x, q, k, gk, lam = self._parts(u)
        Bt, T, H, P = x.shape
        Dm = torch.diag_embed(self.D.detach().double().repeat_interleave(P)).expand(Bt, T, H * P, H * P)
        return log_linear_dsf(q, k, lam, P, g=gk, D=Dm)

    def spectrum(self, u):
        return self.dsf(u).eigenvalues()

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        n = levels_needed(seq_len) if seq_len is not None else c.num_levels
        return self.d_inner * c.d_state * n + ((self.d_inner + 2 * c.groups * c.d_state) * (c.d_conv - 1) if c.block else 0)


# ------------------------------------------------------------------------------------------
# log-linear Gated DeltaNet
# ------------------------------------------------------------------------------------------


class LogLinearGDNConfig(DeltaNetConfig):
    num_levels: int = Field(NUM_LEVELS, gt=0, le=48, description="Fenwick levels L (covers 2^(L-1) tokens; fla: 15)")


@register(
    "log_linear_gdn",
    description="Log-linear Gated DeltaNet (Guo et al. 2025): the gated delta rule on O(log T) Fenwick-tree states",
    defaults={"decay": "head"},
    example={"d_model": 16, "heads": 2, "chunk_size": 8},
)
class LogLinearGDN(_Levels, DeltaNet):
    """Log-linear Gated DeltaNet: the ``gated_deltanet`` parametrization (short convs, L2-normalized q/k,
    β = σ(xW_β), α = exp(−Δ A), norm + gate) with the core
    :func:`~seqmix.ops.log_linear.log_linear_attention` (base: the gated delta rule, each level state
    evolving by M_t = (I − β_t k_tᵀk_t) Diag(α_t), writes into level 0; paper §3.3):

        Φ = Φ_GDN ⊙ H,   Φ_GDN[t, s] = scale · q_t M_t ⋯ M_(s+1) β_s k_sᵀ  (``delta_rule_map``)

    Modes: "parallel" (reference), "recurrent" (Fenwick states: ``delta_rule_step`` per level), "chunk".
    Maps: one per head [B, H, T, T]. State: H·d_k'·d_v'·levels_needed(seq_len) + the conv states, and the position.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "parallel"
    state_formula = "H·d_k'·d_v'·(⌊log2(T−1)⌋+2) + (2·d_k + d_v)·(conv-1)"
    diagonal_transition = False
    Config = LogLinearGDNConfig

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        self._init_levels(self.config.d_model, self.H, self.config.num_levels)

    def _forward(self, x, *, state, mode, need_state):
        pos = state.get("pos", 0) if state else 0
        self._check_levels(x.shape[1], pos)
        P: _Params = self._params(x, state, need_state)
        o, S = log_linear_attention(
            P.q, P.k, P.v, self.level_scales(x), P.g, P.beta, scale=self._scale,
            initial_state=state.get("S") if state else None, offset=pos, output_final_state=need_state,
            mode=mode, chunk_size=self.config.chunk_size, check_values=False,
        )
        y = self._readout(o, x)
        return MixOut(y, {"S": S, "pos": pos + x.shape[1], **P.state} if need_state else None, values=P.v, mixed=o)

    def _parts(self, x):
        self.check_input(x)
        self._check_levels(x.shape[1], 0)
        return self._params(x, None, False), self.level_scales(x)

    def phi(self, x):
        """[B, H, T, T]: Φ_GDN ⊙ H."""
        from ..ops.delta_rule import delta_rule_map
        from ..ops.log_linear import hierarchical_mask
        P, lam = self._parts(x)
        return delta_rule_map(P.q, P.k, P.beta, P.g, scale=self._scale, check_values=False) * hierarchical_mask(lam)

    def dsf(self, x):
        """:func:`log_linear_dsf` with the gated delta rule's transition. Input v, output the core's o."""
        P, lam = self._parts(x)
        return log_linear_dsf(P.q, P.k, lam, self.V, g=P.g, beta=P.beta, scale=self._scale)

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        n = levels_needed(seq_len) if seq_len is not None else c.num_levels
        s = self.H * self.K * self.V * n
        if c.conv_size:
            s += (2 * c.d_k + c.d_v) * (c.conv_size - 1)
        return s
