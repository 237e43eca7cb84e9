"""The Mesa layer (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally Optimal Test-Time
Training"): online regularized least squares, solved for every query.

    H_t = γ_t H_{t-1} + β_t k_tᵀ k_t          ∈ R^{K×K}   (the keys' Gram matrix)
    G_t = γ_t G_{t-1} + β_t k_tᵀ v_t          ∈ R^{K×V}   (keys against values)
    q̃_t = (H_t + Diag(λ))⁻¹ q_t,   o_t = q̃_t G_t                      (paper eq. 5-7, row convention)

o_t is the prediction at q_t of the ridge regression of v on k over the (decayed, β-weighted) past.
As a DSF it is linear in v: G is :func:`~seqmix.ops.linear_recurrence`'s state (Λ_t = γ_t I,
B_t = β_t k_t) and the readout C_t = q̃_t = q_tᵀ(H_t + Diag λ)⁻¹ depends on the keys through H_t —
an input-dependent readout, not a new transition. λ [H, K] > 0 is a diagonal regularizer (the
paper's λI generalized per channel as flash-linear-attention does).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; g [B, T, H] (log γ <= 0) or None;
lamb [H, K]; state (G [B, H, K, V], H [B, H, K, K]).

The solve is a choice (``solver``):

* ``exact``: ``torch.linalg.solve`` per step (the reference solve);
* ``cg``: ``cg_steps`` steps of conjugate gradient (the paper's approximate solve; 30 in fla's
  layer), started from 0 (``cg_init="zero"``, fla's chunked training kernel) or from the Jacobi
  guess q / (diag H + λ) (``"jacobi"``, fla's one-step decoding kernel); the denominators carry
  ``cg_eps`` (fla: 1e-5; it also damps the last steps, so a converged CG sits ~eps away from
  the exact solve); a zero denominator gives a zero step, not 0/0.

Modes (the same numbers for a given solver; tests tie each to ``recurrent``):

* ``recurrent``: the reference loop: update H and G, solve, read out.
* ``parallel`` / ``chunk``: every H_t by ``linear_recurrence`` in that mode (K probe heads e_i per
  head read the rows of H_t), all solves at once (batched over t), then the output by
  ``linear_recurrence`` with q̃ as the query, in that mode. Memory O(T·K²) per head for the H_t.
* ``step``: one token (T == 1).
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor
from .precision import full_precision
from .recurrence import _check_qkv, _compute_dtype, linear_recurrence

MODES = ("recurrent", "chunk", "parallel", "step")
SOLVERS = ("exact", "cg")
CG_INITS = ("zero", "jacobi")
_WHERE = "mesa_net"


def _div(a, b):
    """a / b, and 0 where b == 0 (a converged CG with cg_eps = 0: 0/0)."""
    nz = b != 0
    return torch.where(nz, a / torch.where(nz, b, torch.ones_like(b)), torch.zeros_like(a))


def mesa_solve(Hm, q, lamb, *, solver: str = "cg", cg_steps: int = 30, cg_init: str = "zero", cg_eps: float = 1e-5):
    """q̃ = (Hm + Diag(lamb))⁻¹ q. Hm [..., H, K, K] (symmetric), q [..., H, K], lamb [H, K] (broadcast)."""
    if solver == "exact":
        A = Hm + torch.diag_embed(lamb.expand_as(q))
        return torch.linalg.solve(A, q.unsqueeze(-1)).squeeze(-1)

    def matvec(p):
        return (Hm @ p.unsqueeze(-1)).squeeze(-1) + lamb * p

    if cg_init == "jacobi":
        x = q / (torch.diagonal(Hm, dim1=-2, dim2=-1) + lamb)
        r = q - matvec(x)
    else:
        x = torch.zeros_like(q)
        r = q
    p = r
    delta = (r * r).sum(-1, keepdim=True)
    for _ in range(cg_steps):
        Ap = matvec(p)
        alpha = _div(delta, (p * Ap).sum(-1, keepdim=True) + cg_eps)
        x = x + alpha * p
        r = r - alpha * Ap
        delta_new = (r * r).sum(-1, keepdim=True)
        p = r + _div(delta_new, delta + cg_eps) * p
        delta = delta_new
    return x


def _check(q, k, v, beta, g, lamb, state, check_values):
    Bt, T, H, K, V = _check_qkv(q, k, v, _WHERE)
    check_shape("beta", beta, (Bt, T, H), "[B, T, H]", _WHERE)
    if g is not None:
        check_shape("g", g, (Bt, T, H), "[B, T, H]", _WHERE)
    check_tensor("lamb", lamb, rank=2, layout="[H, K]", where=_WHERE)
    check_shape("lamb", lamb, (H, K), "[H, K]", _WHERE)
    if state is not None:
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            raise ValueError(f"{_WHERE}: argument 'initial_state' must be a pair (G [B, H, K, V], H [B, H, K, K]) or None")
        check_shape("initial_state[0] (G)", state[0], (Bt, H, K, V), "[B, H, K, V]", _WHERE)
        check_shape("initial_state[1] (H)", state[1], (Bt, H, K, K), "[B, H, K, K]", _WHERE)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta), ("g", g), ("lamb", lamb)):
            if t is not None:
                check_finite(name, t, _WHERE)
        if float(lamb.detach().min()) <= 0:
            raise ValueError(f"{_WHERE}: argument 'lamb' (the regularizer λ) must be > 0, got a minimum of {float(lamb.detach().min()):.4g}")
        if g is not None and float(g.detach().max()) > 0:
            raise ValueError(f"{_WHERE}: argument 'g' holds log-decays and must be <= 0; got a maximum of {float(g.detach().max()):.4g}")
    return Bt, T, H, K, V


def _recurrent(q, k, v, beta, g, lamb, G, Hm, solve):
    outs = []
    gs = g.unbind(1) if g is not None else (None,) * q.shape[1]
    for q_t, k_t, v_t, b_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1), gs):
        bk = (b_t.unsqueeze(-1) * k_t).unsqueeze(-1)  # [B, H, K, 1]
        if g_t is not None:
            gam = g_t.exp()[..., None, None]
            Hm, G = gam * Hm, gam * G
        Hm = Hm + bk * k_t.unsqueeze(-2)
        G = G + bk * v_t.unsqueeze(-2)
        qt = solve(Hm, q_t)
        outs.append((qt.unsqueeze(-2) @ G).squeeze(-2))
    return torch.stack(outs, 1), G, Hm


def gram_states(k, beta, g=None, *, initial_state=None, mode="auto", chunk_size=None):
    """Every H_t [B, T, H, K, K] = γ_t H_{t-1} + β_t k_tᵀk_t by ``linear_recurrence`` in ``mode``: K probe
    heads e_i per head read row i of H_t. Returns (H_all, H_T)."""
    Bt, T, H, K = k.shape
    eye = torch.eye(K, dtype=k.dtype, device=k.device)
    q_p = eye.expand(Bt, T, H, K, K).reshape(Bt, T, H * K, K)
    k_p = k.unsqueeze(3).expand(Bt, T, H, K, K).reshape(Bt, T, H * K, K)
    v_p = (beta.unsqueeze(-1) * k).unsqueeze(3).expand(Bt, T, H, K, K).reshape(Bt, T, H * K, K)
    g_p = g.unsqueeze(-1).expand(Bt, T, H, K).reshape(Bt, T, H * K) if g is not None else None
    S0 = initial_state.unsqueeze(2).expand(Bt, H, K, K, K).reshape(Bt, H * K, K, K) if initial_state is not None else None
    o, S = linear_recurrence(q_p, k_p, v_p, g_p, initial_state=S0, output_final_state=True, mode=mode,
                             chunk_size=chunk_size, check_values=False, backend="torch")
    return o.view(Bt, T, H, K, K), S.view(Bt, H, K, K, K)[:, :, 0]


def mesa_readout(q, k, beta, g, lamb, *, initial_state=None, solver="cg", cg_steps=30, cg_init="zero", cg_eps=1e-5,
                 mode="parallel", chunk_size=None):
    """q̃_t = (H_t + Diag λ)⁻¹ q_t for every t [B, T, H, K] (the DSF readout C_t), and H_T."""
    H_all, H_T = gram_states(k, beta, g, initial_state=initial_state, mode=mode, chunk_size=chunk_size)
    qt = mesa_solve(H_all, q, lamb, solver=solver, cg_steps=cg_steps, cg_init=cg_init, cg_eps=cg_eps)
    return qt, H_T


@full_precision
def mesa_net(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    lamb: torch.Tensor,
    *,
    solver: str = "cg",
    cg_steps: int = 30,
    cg_init: str = "zero",
    cg_eps: float = 1e-5,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int | None = None,
    check_values: bool = True,
):
    """o_t = q_t (H_t + Diag λ)⁻¹ G_t (module docstring).

    Returns (o [B, T, H, V], (G_T, H_T) or None)."""
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    check_choice("solver", solver, SOLVERS, _WHERE)
    check_choice("cg_init", cg_init, CG_INITS, _WHERE)
    check_positive_int("cg_steps", cg_steps, _WHERE, minimum=0)
    Bt, T, H, K, V = _check(q, k, v, beta, g, lamb, initial_state, check_values)
    if mode == "step" and T != 1:
        raise ValueError(f"{_WHERE}: mode 'step' takes one token (T == 1), got T = {T}; use 'recurrent' or 'chunk'")
    out_dtype = q.dtype
    dt = _compute_dtype(q, k, v, beta, g, lamb)
    q, k, v, beta, lamb = q.to(dt), k.to(dt), v.to(dt), beta.to(dt), lamb.to(dt)
    g = g.to(dt) if g is not None else None
    G0 = initial_state[0].to(dt) if initial_state is not None else None
    H0 = initial_state[1].to(dt) if initial_state is not None else None
    if mode == "auto":
        mode = "recurrent" if T == 1 else ("parallel" if T <= (chunk_size or 64) else "chunk")
    if mode in ("recurrent", "step"):
        G0 = G0 if G0 is not None else q.new_zeros(Bt, H, K, V)
        H0 = H0 if H0 is not None else q.new_zeros(Bt, H, K, K)
        o, G, Hm = _recurrent(q, k, v, beta, g, lamb, G0, H0,
                              lambda A, x: mesa_solve(A, x, lamb, solver=solver, cg_steps=cg_steps, cg_init=cg_init, cg_eps=cg_eps))
    else:
        qt, Hm = mesa_readout(q, k, beta, g, lamb, initial_state=H0, solver=solver, cg_steps=cg_steps, cg_init=cg_init,
                              cg_eps=cg_eps, mode=mode, chunk_size=chunk_size)
        o, G = linear_recurrence(qt, beta.unsqueeze(-1) * k, v, g, initial_state=G0, output_final_state=True, mode=mode,
                                 chunk_size=chunk_size, check_values=False, backend="torch")
    return o.to(out_dtype), ((G, Hm) if output_final_state else None)
