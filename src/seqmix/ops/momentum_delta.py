"""The momentum delta rule: a delta rule whose update passes through a momentum (second) state.

Per head, in the row convention of :func:`~seqmix.ops.delta_rule` (states S, M ∈ R^{K×V}, k_t, p_t row
vectors; Momentum DeltaNet, flash-linear-attention's ``momentum_delta_rule``):

    w_t = p_t S_{t-1} − v_t                           (the gradient of ½‖p S − v‖² w.r.t. the readout)
    M_t = μ_t M_{t-1} + η_t k_tᵀ w_t                   (momentum: a decayed sum of past gradients)
    S_t = α_t S_{t-1} − β_t M_t                        (the memory moves against the momentum)
    o_t = scale · q_t S_t

with α_t = exp(log_alpha), μ_t = exp(log_mu) (one per head), β_t, η_t >= 0 per head. With μ = 0 and
p = k it is the gated delta rule with writing strength β η. The pair X_t = [S_t; M_t] ∈ R^{2K×V} is
one linear system in v:

    X_t = A_t X_{t-1} + b_t v_t,   A_t = [[α_t I − β_t η_t k_tᵀp_t, −β_t μ_t I], [η_t k_tᵀp_t, μ_t I]],
    b_t = [β_t η_t k_tᵀ; −η_t k_tᵀ],   o_t = scale [q_t, 0] X_t

(the DSF of the momentum rule: a 2K-dimensional, non-diagonal Λ_t = A_t per value channel).

Modes (the same numbers; tests tie them to ``recurrent``):

* ``recurrent``: the loop over time, the reference.
* ``parallel``: the materialized map Φ [B, H, T, T], Φ[t, s] = scale [q_t, 0] A_t ⋯ A_{s+1} b_s, built by one
  sweep over s from the last token back, every row t at once: a row r = [r¹, r²] ∈ R^{1×2K} times A_s is
  [α r¹ + η ((r² − β r¹)·k) p, μ (r² − β r¹)] (O(K) per row, not O(K²)), and Φ[t, s] = η_s (β_s r¹ − r²)·k_s.
  The final state rides along as 2K extra rows (the unit vectors: the readout after the last token).
  Memory O(T²) per head.
* ``chunk``: the chunkwise-parallel form. Both decays are scalars per head, so inside a chunk (S_0, M_0 the
  states entering it, local times t, s) every write η_s k_sᵀ w_s reaches M_t with m(t, s) = Π_{s<j<=t} μ_j and
  S_t with the scalar kernel

      Γ[t, s] = Σ_{s<=r<=t} a(t, r) β_r m(r, s),   a(t, r) = Π_{r<j<=t} α_j,   Γ = Ā Diag(β) M̄

  (Ā, M̄ the chunk's pairwise decays of α and μ, exponents <= 0: no overflow, no cancellation), so
  S_t = a(t) S_0 − g_t M_0 − Σ_{s<=t} Γ[t, s] η_s k_sᵀ w_s with a(t) = Π_{j<=t} α_j and g = Ā (β ⊙ m(·)).
  The gradients w_t = p_t S_{t−1} − v_t then solve one unit lower-triangular system per chunk,

      (I + L) W = a(t−1) P S_0 − g_{t−1} P M_0 − V,   L[t, s] = Γ[t−1, s] η_s (p_t·k_s)  (s < t),

  the delta rule's WY form with Γ in place of the decay (W = U_0 + Y S_0 − Z M_0, all three by one solve),
  and o, S_C, M_C follow by matmuls. Only those four small matmuls per chunk are sequential.
* ``step``: one token (T == 1), given and returning the states.

Shapes: q, k, p [B, T, H, K]; v [B, T, H, V]; log_alpha, log_mu, beta, eta [B, T, H]; states [B, H, K, V].
Half inputs are computed in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange

from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, fmt_shape
from .precision import full_precision
from .recurrence import _compute_dtype, _exp_where, _segsum

MODES = ("recurrent", "chunk", "parallel", "step")
_WHERE = "momentum_delta_rule"


def _check_inputs(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state, *, check_values, where):
    check_tensor("q", q, rank=4, layout="[B, T, H, K]", where=where)
    B, T, H, K = q.shape
    if T == 0:
        raise ValueError(f"{where}: sequence length T must be >= 1, got q of shape {fmt_shape(q.shape)}")
    for name, t in (("k", k), ("p", p)):
        check_tensor(name, t, rank=4, layout="[B, T, H, K]", where=where)
        check_shape(name, t, (B, T, H, K), "[B, T, H, K]", where)
    check_tensor("v", v, rank=4, layout="[B, T, H, V]", where=where)
    check_shape("v", v, (B, T, H, None), "[B, T, H, V]", where)
    V = v.shape[-1]
    for name, t in (("log_alpha", log_alpha), ("log_mu", log_mu), ("beta", beta), ("eta", eta)):
        check_tensor(name, t, rank=3, layout="[B, T, H]", where=where)
        check_shape(name, t, (B, T, H), "[B, T, H]", where)
    if initial_state is not None:
        if not (isinstance(initial_state, (tuple, list)) and len(initial_state) == 2):
            raise ValueError(f"{where}: argument 'initial_state' must be a pair (S, M) of [B, H, K, V] tensors or None")
        for name, t in zip(("initial_state[0] (S)", "initial_state[1] (M)"), initial_state):
            check_tensor(name, t, rank=4, layout="[B, H, K, V]", where=where)
            check_shape(name, t, (B, H, K, V), "[B, H, K, V]", where)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v), ("p", p), ("beta", beta), ("eta", eta)):
            check_finite(name, t, where)
        if bool((log_alpha > 0).any()) or bool((log_mu > 0).any()):
            raise ValueError(f"{where}: arguments 'log_alpha' and 'log_mu' must be <= 0 (decays in (0, 1])")
    return B, T, H, K, V


def _step(S, M, q_t, k_t, v_t, p_t, a_t, m_t, b_t, e_t, scale):
    """One token: S, M [B, H, K, V]; q_t, k_t, p_t [B, H, K]; v_t [B, H, V]; a_t, m_t, b_t, e_t [B, H]
    (a, m the decays, not logs)."""
    w = (p_t.unsqueeze(-2) @ S).squeeze(-2) - v_t  # p_t S_{t-1} − v_t  [B, H, V]
    M = m_t[..., None, None] * M + (e_t.unsqueeze(-1) * k_t).unsqueeze(-1) * w.unsqueeze(-2)
    S = a_t[..., None, None] * S - b_t[..., None, None] * M
    return scale * (q_t.unsqueeze(-2) @ S).squeeze(-2), S, M


def _recurrent(q, k, v, p, la, lm, beta, eta, scale, S, M):
    outs = []
    a, m = la.exp(), lm.exp()
    for t in range(q.shape[1]):
        o_t, S, M = _step(S, M, q[:, t], k[:, t], v[:, t], p[:, t], a[:, t], m[:, t], beta[:, t], eta[:, t], scale)
        outs.append(o_t)
    return torch.stack(outs, 1), S, M


def _sweep(q, k, p, la, lm, beta, eta, scale, extra_rows: int):
    """The backward sweep of the parallel mode. Returns (Φ [B, H, T + R, T], R¹, R² [B, H, T + R, K]): Φ's first T
    rows are the map, the last R = extra_rows rows the unit readouts of the state after the last token; R¹, R² the
    rows after the sweep (scale [q_t, 0] A_t ⋯ A_1, for the initial state's term)."""
    B, T, H, K = q.shape
    q, k, p = (t.transpose(1, 2) for t in (q, k, p))  # [B, H, T, K]
    a, m, beta, eta = (t.transpose(1, 2) for t in (la.exp(), lm.exp(), beta, eta))  # [B, H, T]
    n = T + extra_rows
    r1 = torch.zeros(B, H, n, K, dtype=q.dtype, device=q.device)
    r2 = torch.zeros_like(r1)
    if extra_rows:  # the unit vectors e_i of R^{2K}: rows T .. T + 2K − 1 (first the S part, then the M part)
        eye = torch.eye(K, dtype=q.dtype, device=q.device).expand(B, H, K, K)
        r1 = torch.cat([r1[:, :, :T], eye, torch.zeros_like(eye)], 2)
        r2 = torch.cat([r2[:, :, :T], torch.zeros_like(eye), eye], 2)
    rows = torch.arange(n, device=q.device)
    cols = []
    for s in range(T - 1, -1, -1):  # rows t < s are still zero, and the update keeps them so: Φ[t, s] = 0 there
        r1 = r1 + (rows == s).to(q.dtype).view(1, 1, n, 1) * (scale * q[:, :, s]).unsqueeze(2)  # row s starts: scale [q_s, 0]
        d = r2 - beta[:, :, s, None, None] * r1  # r² − β r¹
        dk = (d * k[:, :, s].unsqueeze(2)).sum(-1)  # (r² − β r¹)·k_s  [B, H, n]
        cols.append(-eta[:, :, s, None] * dk)  # Φ[:, s] = η_s (β_s r¹ − r²)·k_s
        # r ← r A_s = [α r¹ + η ((r² − β r¹)·k) p, μ (r² − β r¹)]
        r1 = a[:, :, s, None, None] * r1 + (eta[:, :, s, None] * dk).unsqueeze(-1) * p[:, :, s].unsqueeze(2)
        r2 = m[:, :, s, None, None] * d
    Phi = torch.stack(cols[::-1], -1)  # [B, H, n, T]
    return Phi, r1, r2


def _chunk(q, k, v, p, la, lm, beta, eta, scale, S0, M0, C, want_state):
    """The chunk mode (module docstring): per chunk the quantities that do not depend on the entering states,
    then the states passed from chunk to chunk."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    n = math.ceil(T / C)
    pad = n * C - T
    if pad:  # padded tokens: k = p = 0, η = β = 0, decays 1: they neither write nor decay a state
        q, k, v, p = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, p))
        la, lm, beta, eta = (F.pad(x, (0, 0, 0, pad)) for x in (la, lm, beta, eta))
    q, k, v, p = (rearrange(x, "b (n c) h x -> b h n c x", c=C) for x in (q, k, v, p))
    la, lm, beta, eta = (rearrange(x, "b (n c) h -> b h n c", c=C) for x in (la, lm, beta, eta))
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    A_bar = _exp_where(_segsum(la), causal)  # a(t, r) [.., C, C]
    M_bar = _exp_where(_segsum(lm), causal)  # m(t, s)
    Gam = A_bar @ (beta.unsqueeze(-1) * M_bar)  # Γ[t, s]
    A_cum = la.cumsum(-1)
    a0, m0 = A_cum.exp(), lm.cumsum(-1).exp()  # a(t), m(t) from the chunk's start
    g0 = (A_bar @ (beta * m0).unsqueeze(-1)).squeeze(-1)  # g_t = Σ_{r<=t} a(t, r) β_r m(r)
    prev = lambda x: F.pad(x, (1, 0))[..., :-1]  # noqa: E731  entry t <- entry t−1 (entry 0: 0) along the last dim
    ek = eta.unsqueeze(-1) * k  # η_s k_s
    L = prev(Gam.transpose(-1, -2)).transpose(-1, -2) * (p @ ek.transpose(-1, -2))  # strictly lower: Γ[t−1, s] η_s (p_t·k_s)
    a_prev = prev(A_cum).exp().unsqueeze(-1)  # a(t−1), a(−1) = 1
    g_prev = prev(g0).unsqueeze(-1)  # g_{t−1}, g_{−1} = 0
    I = torch.eye(C, dtype=L.dtype, device=L.device)
    X = torch.linalg.solve_triangular(I + L, torch.cat([-v, a_prev * p, g_prev * p], -1), upper=False, unitriangular=True)
    U0, Y, Z = X.split([V, K, K], -1)  # w = U0 + Y S_0 − Z M_0
    qs = scale * q
    P = (qs @ ek.transpose(-1, -2)) * Gam  # Γ[t, s] η_s (q_t·k_s) scale, s <= t
    Qa, Qg = a0.unsqueeze(-1) * qs, g0.unsqueeze(-1) * qs
    Ks = Gam[..., -1, :].unsqueeze(-1) * ek  # Γ[C−1, s] η_s k_s
    Km = M_bar[..., -1, :].unsqueeze(-1) * ek  # m(C−1, s) η_s k_s
    dS, dG, dM = (x[..., -1, None, None] for x in (a0, g0, m0))
    S = S0 if S0 is not None else q.new_zeros(B, H, K, V)
    M = M0 if M0 is not None else q.new_zeros(B, H, K, V)
    Ss, Ms, Ws = [], [], []
    for i in range(n):
        Ss.append(S)
        Ms.append(M)
        W = U0[:, :, i] + Y[:, :, i] @ S - Z[:, :, i] @ M
        Ws.append(W)
        S, M = (dS[:, :, i] * S - dG[:, :, i] * M - Ks[:, :, i].transpose(-1, -2) @ W,
                dM[:, :, i] * M + Km[:, :, i].transpose(-1, -2) @ W)
    S_start, M_start, W = (torch.stack(x, 2) for x in (Ss, Ms, Ws))
    o = Qa @ S_start - Qg @ M_start - P @ W
    o = rearrange(o, "b h n c v -> b (n c) h v")[:, :T]
    return o, S, M


def _parallel(q, k, v, p, la, lm, beta, eta, scale, S0, M0, want_state):
    B, T, H, K = q.shape
    extra = 2 * K if want_state else 0
    Phi, r1, r2 = _sweep(q, k, p, la, lm, beta, eta, scale, extra)
    vh = v.transpose(1, 2)  # [B, H, T, V]
    out = Phi @ vh  # [B, H, T + 2K, V]
    if S0 is not None:
        out = out + r1 @ S0 + r2 @ M0
    o = out[:, :, :T].transpose(1, 2)
    if not want_state:
        return o, None, None
    return o, out[:, :, T : T + K], out[:, :, T + K :]


@full_precision
def momentum_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    p: torch.Tensor,
    log_alpha: torch.Tensor,
    log_mu: torch.Tensor,
    beta: torch.Tensor,
    eta: torch.Tensor,
    *,
    scale: float = 1.0,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    mode: str = "recurrent",
    chunk_size: int = 64,
    check_values: bool = True,
):
    """Runs the momentum delta rule (module docstring).

    Args:
        q, k, p: [B, T, H, K] (p: the key the gradient reads the state with; Momentum DeltaNet: α_t k_t).
        v: [B, T, H, V].
        log_alpha, log_mu: [B, T, H], <= 0: the memory's and the momentum's decays.
        beta, eta: [B, T, H]: the step size on the memory and the write strength of the momentum.
        scale: multiplies the output.
        initial_state: (S, M), both [B, H, K, V], or None (zeros).
        output_final_state: also return (S_T, M_T).
        mode: "recurrent", "chunk", "parallel", "step" (T == 1) or "auto" (chunk; recurrent for one token).
        chunk_size: C of the chunk mode (any T works; the tail chunk is padded).
        check_values: also check for NaN/Inf and positive log-decays (reads the tensors on the host).

    Returns:
        (o [B, T, H, V], (S_T, M_T) or None), in float32 for half inputs (else their dtype)
    """
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    check_positive_int("chunk_size", chunk_size, _WHERE)
    if mode == "auto":  # the parallel sweep is a loop over T too, over T rows at a time: chunk beyond one token
        mode = "recurrent" if q.shape[1] == 1 else "chunk"
    B, T, H, K, V = _check_inputs(q, k, v, p, log_alpha, log_mu, beta, eta, initial_state, check_values=check_values, where=_WHERE)
    if mode == "step" and T != 1:
        raise ValueError(f"{_WHERE}: mode 'step' takes one token (T == 1), got T = {T}; use 'recurrent' or 'parallel'")
    S0, M0 = initial_state if initial_state is not None else (None, None)
    dt = _compute_dtype(q, k, v, p, log_alpha, log_mu, beta, eta, S0, M0)
    q, k, v, p, la, lm, beta, eta = (t.to(dt) for t in (q, k, v, p, log_alpha, log_mu, beta, eta))
    S0, M0 = (t.to(dt) if t is not None else None for t in (S0, M0))
    if mode == "parallel":
        o, S, M = _parallel(q, k, v, p, la, lm, beta, eta, scale, S0, M0, output_final_state)
    elif mode == "chunk":
        o, S, M = _chunk(q, k, v, p, la, lm, beta, eta, scale, S0, M0, chunk_size, output_final_state)
    else:
        zeros = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
        o, S, M = _recurrent(q, k, v, p, la, lm, beta, eta, scale, S0 if S0 is not None else zeros, M0 if M0 is not None else zeros)
    return o, ((S, M) if output_final_state else None)


@full_precision
def momentum_delta_rule_map(q, k, p, log_alpha, log_mu, beta, eta, *, scale: float = 1.0, check_values: bool = True) -> torch.Tensor:
    """The map Φ [B, H, T, T] of the momentum delta rule (zero initial states): o[:, t, h] = Σ_s Φ[:, h, t, s] v[:, s, h]."""
    dummy_v = q.new_zeros(q.shape[:-1] + (1,))
    _check_inputs(q, k, dummy_v, p, log_alpha, log_mu, beta, eta, None, check_values=check_values, where="momentum_delta_rule_map")
    dt = _compute_dtype(q, k, p, log_alpha, log_mu, beta, eta)
    q, k, p, la, lm, beta, eta = (t.to(dt) for t in (q, k, p, log_alpha, log_mu, beta, eta))
    return _sweep(q, k, p, la, lm, beta, eta, scale, 0)[0]


__all__ = ["MODES", "momentum_delta_rule", "momentum_delta_rule_map"]
