"""Mamba's selective scan (S6), with a hand-written reverse-time backward.

Per channel d and state n (the semantics of Mamba's ``selective_scan_ref``, with Δ given
after its activation: the mixer adds the dt bias and applies softplus):

    h_t[d, n] = exp(Δ_t[d] A[d, n]) h_(t-1)[d, n] + Δ_t[d] x_t[d] B_t[n]
    y_t[d]    = Σ_n C_t[n] h_t[d, n] + D[d] x_t[d]

This is ``linear_recurrence`` with one head per channel, K = N, V = 1 (q = C, k = ΔB,
v = x, gk = ΔA); this op exists because, for S6's shapes on CPU, autograd through a
loop of small steps is slow (bench/ssm.py times the three side by side). Modes:

* ``reference``: the loop over time (``unbind``, never ``x[:, t]``), differentiated by autograd.
* ``fused`` (default): a ``torch.autograd.Function``, time-major (when a gradient is needed;
  otherwise the reference loop, the faster forward). Forward: the decays
  a = exp(ΔA) and inputs b = Δx ⊗ B as whole-sequence ops, h_t = a_t h_(t-1) + b_t as one
  ``addcmul`` per step, y_t = C_t·h_t as one batched matmul; a and the states are kept.
  Backward: a hand-written reverse-time loop over the adjoint
  g_t = dy_t C_t + a_(t+1) g_(t+1) that forms each step's gradients on the spot (no
  autograd graph of T steps, no extra sequence-sized intermediates): with q_t = g_t h_(t-1) a_t,
  dΔ_t = Σ_n q_t A (plus the Δx path, by autograd), dA = Σ_(t,b) q_t Δ_t, d(Δx)_t = Σ_n g_t B_t,
  dB_t = Σ_d g_t Δ_t x_t, dC_t = Σ_d dy_t h_t, dh_0 = a_0 g_0. Differentiable once.

Shapes: x, delta [B, T, D]; A [D, N] (<= 0); B, C [B, T, N] (shared by the channels, as in
Mamba) or [B, T, D, N]; D [D] or None; initial_state [B, D, N] or None. Half-precision
inputs are computed in float32.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import backends as _backends
from .._checks import check_choice, check_finite, check_shape, check_tensor, fmt_shape
from .precision import full_precision

MODES = ("reference", "fused")
_WHERE = "selective_scan"

__all__ = ["selective_scan", "MODES"]


def _scan_reference(a, b, c, h):
    """a, b [B, T, D, N]; c [B, T, D|1, N]; h [B, D, N]. Returns (y [B, T, D], h_T)."""
    ys = []
    for a_t, b_t, c_t in zip(a.unbind(1), b.unbind(1), c.unbind(1)):
        h = a_t * h + b_t
        ys.append((h * c_t).sum(-1))
    return torch.stack(ys, 1), h


def _contract_n(X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Σ_n X[t, b, d, n] V[t, b, ., n] -> [T, B, D] (V shared by the channels: one batched matmul)."""
    if V.shape[2] == 1:
        T, Bt, D, N = X.shape
        return (X.reshape(T * Bt, D, N) @ V.reshape(T * Bt, N, 1)).reshape(T, Bt, D)
    return torch.linalg.vecdot(X, V)


def _contract_d(w: torch.Tensor, X: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """w [T, B, D] against X [T, B, D, N]: Σ_d w X -> [T, B, 1, N] when ``like`` is shared, else w X."""
    if like.shape[2] == 1:
        T, Bt, D, N = X.shape
        return (w.reshape(T * Bt, 1, D) @ X.reshape(T * Bt, D, N)).reshape(T, Bt, 1, N)
    return w.unsqueeze(-1) * X


class _FusedScan(torch.autograd.Function):
    """The selective scan, time-major, with a hand-written backward (the adjoint recurrence).

    Inputs: delta, u = Δx [T, B, D]; A [D, N]; Bm, Cm [T, B, D|1, N]; h0 [B, D, N].
    Forward: a = exp(ΔA) and b = u ⊗ B as two whole-sequence ops, h_t = a_t h_(t-1) + b_t as
    one ``addcmul`` per step, y_t = C_t·h_t as one batched matmul; a and the states are kept.
    Backward: the adjoint g_t = dy_t C_t + a_(t+1) g_(t+1) backwards in time (one ``addcmul``
    per step), then every gradient as a whole-sequence product: with q_t = g_t h_(t-1) a_t,
    dΔ_t = Σ_n q_t A, dA = Σ_(t,b) q_t Δ_t, du_t = Σ_n g_t B_t, dB_t = Σ_d g_t u_t,
    dC_t = Σ_d dy_t h_t, dh0 = a_0 g_0 (contractions over d or n are batched matmuls).
    """

    @staticmethod
    def forward(ctx, delta, A, u, Bm, Cm, h0):
        a = torch.exp(delta.unsqueeze(-1) * A)  # [T, B, D, N]
        b = u.unsqueeze(-1) * Bm
        h, hs = h0, []
        for a_t, b_t in zip(a.unbind(0), b.unbind(0)):
            h = torch.addcmul(b_t, a_t, h)
            hs.append(h)
        H = torch.stack(hs)
        ctx.save_for_backward(delta, A, u, Bm, Cm, h0, a, H)
        return _contract_n(H, Cm), h

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last):
        delta, A, u, Bm, Cm, h0, a, H = ctx.saved_tensors
        shared_B, shared_C = Bm.shape[2] == 1, Cm.shape[2] == 1
        g = dh_last if dh_last is not None else torch.zeros_like(h0)
        acc_A = torch.zeros_like(h0)  # Σ_t q_t Δ_t, summed over the batch at the end
        h_prev = [h0] + list(H.unbind(0)[:-1])
        steps = zip(*(reversed(x) for x in (dy.unbind(0), delta.unbind(0), u.unbind(0), Bm.unbind(0), Cm.unbind(0), a.unbind(0), H.unbind(0), h_prev)))
        a_next = None  # a_(t+1)
        d_delta, d_u, d_B, d_C = [], [], [], []
        for dy_t, delta_t, u_t, B_t, C_t, a_t, h_t, hp_t in steps:  # every operand is one step: [B, D(, N)]
            dy_n = dy_t.unsqueeze(-1)
            g = dy_n * C_t + g if a_next is None else torch.addcmul(a_next * g, dy_n, C_t)  # g_t = dy_t C_t + a_(t+1) g_(t+1)
            q = g * hp_t * a_t  # dL/d(Δ_t A)
            d_delta.append(torch.linalg.vecdot(q, A))
            acc_A.addcmul_(q, delta_t.unsqueeze(-1))
            d_u.append(torch.linalg.vecdot(g, B_t))
            gu = g * u_t.unsqueeze(-1)
            d_B.append(gu.sum(1, keepdim=True) if shared_B else gu)
            hy = h_t * dy_n
            d_C.append(hy.sum(1, keepdim=True) if shared_C else hy)
            a_next = a_t
        dh0 = a_next * g

        def stack(xs):
            return torch.stack(xs[::-1])

        return stack(d_delta), acc_A.sum(0), stack(d_u), stack(d_B), stack(d_C), dh0


@full_precision
def selective_scan(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    mode: str = "fused",
    check_values: bool = True,
    backend: str = "auto",
):
    """Runs the selective scan (module docstring). Returns (y [B, T, D], final state [B, D, N] or None).

    backend: "auto", "torch" or "mamba" (mamba_ssm's ``selective_scan_fn``; CUDA, B and C
    shared by the channels, no initial state): see :mod:`seqmix.ops.backends`."""
    check_choice("mode", mode, MODES, _WHERE)
    check_tensor("x", x, rank=3, layout="[B, T, D]", where=_WHERE)
    Bt, T, Dc = x.shape
    if T == 0:
        raise ValueError(f"{_WHERE}: sequence length T must be >= 1, got x of shape {fmt_shape(x.shape)}")
    check_tensor("delta", delta, where=_WHERE)
    check_shape("delta", delta, (Bt, T, Dc), "[B, T, D]", _WHERE)
    check_tensor("A", A, rank=2, layout="[D, N]", where=_WHERE)
    N = A.shape[1]
    check_shape("A", A, (Dc, N), "[D, N]", _WHERE)
    for name, t in (("B", B), ("C", C)):
        check_tensor(name, t, rank=(3, 4), layout="[B, T, N] or [B, T, D, N]", where=_WHERE)
        if t.shape not in ((Bt, T, N), (Bt, T, Dc, N)):
            raise ValueError(f"{_WHERE}: argument '{name}' must be [B, T, N] = {fmt_shape((Bt, T, N))} or [B, T, D, N], got {fmt_shape(t.shape)}")
    if D is not None:
        check_shape("D", D, (Dc,), "[D]", _WHERE)
    if initial_state is not None:
        check_shape("initial_state", initial_state, (Bt, Dc, N), "[B, D, N]", _WHERE)
    if check_values:
        for name, t in (("x", x), ("delta", delta), ("A", A), ("B", B), ("C", C)):
            check_finite(name, t, _WHERE)
        if float(A.detach().max()) > 0:
            raise ValueError(f"{_WHERE}: argument 'A' must be <= 0 (a decay exp(ΔA) <= 1), got a maximum of {float(A.detach().max()):.4g}")
        if float(delta.detach().min()) < 0:
            raise ValueError(f"{_WHERE}: argument 'delta' must be >= 0 (Δ after softplus), got a minimum of {float(delta.detach().min()):.4g}")

    if backend != "torch":
        be = _backends.resolve(_WHERE, backend, _backends.Call(
            _WHERE, x.device.type, x.dtype, mode,
            dict(initial_state=initial_state is not None, per_channel_BC=B.dim() == 4 or C.dim() == 4)))
        if be.name != "torch":
            y, h = be.run[_WHERE](x, delta, A, B, C, D, output_final_state=output_final_state)
            return y, (h if output_final_state else None)
    out_dtype = x.dtype
    dt = torch.promote_types(torch.promote_types(x.dtype, delta.dtype), torch.promote_types(A.dtype, B.dtype))
    dt = torch.promote_types(dt, C.dtype)
    if dt in (torch.float16, torch.bfloat16):
        dt = torch.float32
    x, delta, A, B, C = (t.to(dt) for t in (x, delta, A, B, C))
    Bx = B if B.dim() == 4 else B.unsqueeze(2)  # [B, T, D|1, N]
    Cx = C if C.dim() == 4 else C.unsqueeze(2)
    h0 = initial_state.to(dt) if initial_state is not None else torch.zeros(Bt, Dc, N, dtype=dt, device=x.device)
    u = delta * x  # Δ_t x_t, the input of the Euler-discretized B̄ = ΔB
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, delta, A, B, C, h0))
    if mode == "reference" or not needs_grad:  # without gradients the plain loop is the faster forward
        a = torch.exp(delta.unsqueeze(-1) * A)  # [B, T, D, N]
        y, h = _scan_reference(a, u.unsqueeze(-1) * Bx, Cx, h0)
    else:
        def tmajor(t):
            return t.transpose(0, 1).contiguous()

        y, h = _FusedScan.apply(tmajor(delta), A, tmajor(u), tmajor(Bx), tmajor(Cx), h0)
        y = y.transpose(0, 1).contiguous()
    if D is not None:
        y = y + D.to(dt) * x
    return y.to(out_dtype), (h if output_final_state else None)
