"""The state recursion of a linear time-varying system with a dense (non-diagonal) transition:

    x_t = A_t x_{t-1} + b_t,        x_{-1} = initial_state (zeros by default)

Shapes: A [B, T, N, N] (time-varying) or [N, N] (time-invariant); b [B, T, N] (the input term
B_t u_t, already formed); initial_state [B, N]. Returns the states x [B, T, N].

This is the engine of the realization helpers (``seqmix.analysis.realization``: the shift
register of attention, the companion form of B'MOJO-F, the local-global factorization), whose
transitions are not diagonal, unlike the DSF's Λ and ``linear_recurrence``'s decays.

Modes:

* ``recurrent`` (the reference): the loop over time (``unbind``).
* ``parallel``: the associative scan of the pairs (A_t, b_t) under
  (A₂, b₂) ∘ (A₁, b₁) = (A₂A₁, A₂b₁ + b₂), by doubling (Hillis-Steele): log2(T) rounds of
  batched matmuls, O(T·N³·log T) work. A theory tool, not a fast path.
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_tensor, fmt_shape

MODES = ("recurrent", "parallel")

__all__ = ["ltv_scan", "MODES"]


def ltv_scan(A: torch.Tensor, b: torch.Tensor, *, initial_state: torch.Tensor | None = None, mode: str = "recurrent") -> torch.Tensor:
    """States x [B, T, N] of x_t = A_t x_{t-1} + b_t (module docstring)."""
    where = "ltv_scan"
    check_choice("mode", mode, MODES, where)
    check_tensor("b", b, rank=3, layout="[B, T, N]", complex_ok=True, where=where)
    check_tensor("A", A, rank=(2, 4), layout="[N, N] or [B, T, N, N]", complex_ok=True, where=where)
    Bt, T, N = b.shape
    if A.shape not in ((N, N), (Bt, T, N, N), (1, T, N, N)):
        raise ValueError(f"{where}: argument 'A' must be [N, N] or [B, T, N, N] with N = {N}, B = {Bt}, T = {T}, got {fmt_shape(A.shape)}")
    if initial_state is not None and initial_state.shape != (Bt, N):
        raise ValueError(f"{where}: argument 'initial_state' must be [B, N] = [{Bt}, {N}], got {fmt_shape(initial_state.shape)}")
    dtype = torch.promote_types(A.dtype, b.dtype)
    A, b = A.to(dtype), b.to(dtype)
    if A.dim() == 2:
        A = A.expand(Bt, T, N, N)
    elif A.shape[0] == 1:
        A = A.expand(Bt, T, N, N)
    x0 = initial_state.to(dtype) if initial_state is not None else None
    if mode == "recurrent":
        x = x0 if x0 is not None else b.new_zeros(Bt, N)
        xs = []
        for A_t, b_t in zip(A.unbind(1), b.unbind(1)):
            x = (A_t @ x.unsqueeze(-1)).squeeze(-1) + b_t
            xs.append(x)
        return torch.stack(xs, 1)
    if x0 is not None:  # fold the initial state into the first input
        b = torch.cat([b[:, :1] + (A[:, 0] @ x0.unsqueeze(-1)).squeeze(-1).unsqueeze(1), b[:, 1:]], 1)
    M, v = A, b
    d = 1
    while d < T:
        # element t absorbs element t - d (earlier): (M_t, v_t) ∘ (M_{t-d}, v_{t-d})
        M_new = M[:, d:] @ M[:, :-d]
        v_new = (M[:, d:] @ v[:, :-d].unsqueeze(-1)).squeeze(-1) + v[:, d:]
        M = torch.cat([M[:, :d], M_new], 1)
        v = torch.cat([v[:, :d], v_new], 1)
        d *= 2
    return v
