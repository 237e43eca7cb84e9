"""Mamba's selective scan (S6), with a hand-written reverse-time backward.

Per channel d and state n (the semantics of Mamba's ``selective_scan_ref``):

    h_t[d, n] = exp(Δ_t[d] A[d, n]) h_(t-1)[d, n] + Δ_t[d] x_t[d] B_t[n]
    y_t[d]    = Σ_n C_t[n] h_t[d, n] + D[d] x_t[d]

Δ is ``delta`` itself, or, with Mamba's ``delta_bias`` and ``delta_softplus`` (the arguments of
mamba_ssm's ``selective_scan_fn`` and ``selective_scan_ref``: the dt bias added, then softplus,
inside the scan; Mamba eq. 2 / Algorithm 2's Δ = τ_Δ(Parameter + s_Δ(x)), τ_Δ = softplus):

    Δ_t[d] = softplus(delta_t[d] + delta_bias[d])     (delta_softplus; else delta_t[d] + delta_bias[d])

softplus as ``F.softplus`` (beta 1, threshold 20: Δ = z for z > 20). The gradient then flows to
``delta`` (the pre-activation) and ``delta_bias``. The torch modes apply it first, in plain torch;
the "cpp" backend inside its kernel (no [B, T, D] softplus pass of torch's, forward or backward).

This is ``linear_recurrence`` with one head per channel, K = N, V = 1 (q = C, k = ΔB,
v = x, gk = ΔA); this op exists because, for S6's shapes on CPU, autograd through a
loop of small steps is slow (bench/ssm.py times the three side by side). Modes:

* ``reference``: the loop over time (``unbind``, never ``x[:, t]``), differentiated by autograd.
* ``chunked`` (default): time in chunks of L = ``chunk_size`` steps. Per chunk, the
  decays a = exp(ΔA) and inputs b = Δx ⊗ B are formed for those L steps only, in buffers
  allocated once per call and reused by every chunk (about 8 MiB each: cache-resident, no
  allocation per step), the states h_t = a_t h_(t-1) + b_t overwrite b in place (one ``addcmul_`` per
  step on views made once), and y_t = C_t·h_t is one batched matmul per chunk. Only the
  n + 1 chunk-boundary states are kept for the backward (memory O(T·D + (T/L)·D·N) instead
  of O(T·D·N)); the backward walks the chunks in reverse, recomputes each chunk's a and
  states from its boundary state, runs the adjoint g_t = dy_t C_t + a_(t+1) g_(t+1) over the
  chunk (one ``addcmul_`` per step) and forms every gradient of the chunk with whole-chunk
  ops (the formulas of ``fused`` below). Without a gradient it is the forward alone (no
  states kept); one step without a gradient (decoding) is the plain step of ``reference``.
  ``chunk_size=None`` picks L from the shape (:func:`scan_chunk_size`).
* ``fused``: the previous default, kept to be timed beside ``chunked``: a
  ``torch.autograd.Function``, time-major (when a gradient is needed; otherwise the
  reference loop). Forward: a = exp(ΔA) and b = Δx ⊗ B as whole-sequence [T, B, D, N] ops,
  h_t = a_t h_(t-1) + b_t as one ``addcmul`` per step, y_t = C_t·h_t as one batched matmul;
  a and all the states are kept (O(T·D·N) memory).
  Backward: a hand-written reverse-time loop over the adjoint
  g_t = dy_t C_t + a_(t+1) g_(t+1) that forms each step's gradients on the spot (no
  autograd graph of T steps, no extra sequence-sized intermediates): with q_t = g_t h_(t-1) a_t,
  dΔ_t = Σ_n q_t A (plus the Δx path, by autograd), dA = Σ_(t,b) q_t Δ_t, d(Δx)_t = Σ_n g_t B_t,
  dB_t = Σ_d g_t Δ_t x_t, dC_t = Σ_d dy_t h_t, dh_0 = a_0 g_0. Differentiable once: a backward with
  create_graph=True raises a clear error (``seqmix.ops.autograd.first_order``); ``reference`` gives
  second derivatives.

Why chunks (docs/performance.md, "Selective scan"): the whole-sequence a, b and states of
``fused`` are T·B·D·N floats each (512 MB at T = 16k, d_inner 512, N 16), so every pass over
them runs from main memory and allocating them page-faults; the cost per token grew with T.
A chunk's buffers stay in cache and their size does not depend on T.

Shapes: x, delta [B, T, D]; A [D, N] (<= 0); B, C [B, T, N] (shared by the channels, as in
Mamba) or [B, T, D, N]; D [D] or None; initial_state [B, D, N] or None. Half-precision
inputs are computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import backends as _backends
from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, fmt_shape, reads_values
from .autograd import first_order
from .inplace import writable
from .precision import backward_autocast_off, full_precision

MODES = ("reference", "chunked", "fused")
_WHERE = "selective_scan"

__all__ = ["selective_scan", "selective_scan_step", "scan_chunk_size", "MODES"]


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


def fused_step(h, x, delta, A, B, C, D=None, in_place=False):
    """One step of :func:`_scan_reference` in as few kernels as it takes: h ← exp(Δ A) ⊙ h + (Δ x) ⊗ B
    (an in-place decay and one ``addcmul_``), y = h C (+ D x).

    h [B, D, N]; x, delta (Δ, after its activation) [B, D]; A [D, N]; B, C [B, N] (shared by the channels) or
    [B, D, N]; D [D] or None. Every tensor in the compute dtype. ``in_place``: h is the caller's to overwrite
    (the returned state is h itself); otherwise h is left as it is. Returns (y [B, D], the new state)."""
    a = torch.exp(delta.unsqueeze(-1) * A)  # [B, D, N]
    h = h.mul_(a) if in_place else h * a
    u = (delta * x).unsqueeze(-1)
    h.addcmul_(u, B.unsqueeze(1) if B.dim() == 2 else B)
    y = torch.matmul(h, C.unsqueeze(-1)).squeeze(-1) if C.dim() == 2 else torch.linalg.vecdot(h, C)
    return (y.addcmul_(D, x) if D is not None else y), h


@full_precision
def selective_scan_step(x, delta, A, B, C, D=None, *, state=None, delta_bias=None, delta_softplus=False):
    """One decoding step of :func:`selective_scan` for inputs a caller built itself (a mixer's decoding step:
    no argument checks): x, delta [B, D]; A [D, N]; B, C [B, N] or [B, D, N]; D [D] or None; state [B, D, N]
    or None (zeros); Δ = softplus(delta + delta_bias) with ``delta_softplus``, else delta (+ delta_bias), as
    there. Returns (y [B, D], new state [B, D, N]): :func:`fused_step` in the compute dtype (float32 for half
    inputs), the state written in place inside :func:`~seqmix.ops.inplace.states_in_place`."""
    if delta_bias is not None:
        delta = delta + delta_bias
    if delta_softplus:
        delta = F.softplus(delta)
    out_dtype = dt = x.dtype
    if dt not in (torch.float32, torch.float64) or delta.dtype != dt or A.dtype != dt or B.dtype != dt or C.dtype != dt \
            or (D is not None and D.dtype != dt) or (state is not None and state.dtype != dt):
        dt = torch.promote_types(torch.promote_types(x.dtype, delta.dtype), torch.promote_types(A.dtype, B.dtype))
        dt = torch.promote_types(dt, C.dtype)
        dt = torch.float32 if dt in (torch.float16, torch.bfloat16) else dt
        x, delta, A, B, C, D = (t if t is None or t.dtype == dt else t.to(dt) for t in (x, delta, A, B, C, D))
    if state is None:
        h, in_place = torch.zeros(x.shape[0], x.shape[1], A.shape[1], dtype=dt, device=x.device), True
    else:
        h, in_place = (state, True) if writable(state, dt) else (state if state.dtype == dt else state.to(dt), False)
    y, h = fused_step(h, x, delta, A, B, C, D, in_place)
    return (y if y.dtype == out_dtype else y.to(out_dtype)), h


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
    @first_order("selective_scan (mode 'fused')", "selective_scan(..., mode='reference')")
    @backward_autocast_off  # the backward's matmuls stay in the forward's dtype
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


# ------------------------------------------------------------------------------------------
# chunked mode
# ------------------------------------------------------------------------------------------

#: floats of one chunk buffer [L, B, D, N] that ``chunk_size=None`` aims at (8 MiB in float32):
#: measured with ``python bench/ssm.py --chunk-sweep`` (docs/performance.md)
_CHUNK_FLOATS = 1 << 21
_CHUNK_MIN, _CHUNK_MAX = 16, 256


def scan_chunk_size(batch: int, d: int, n: int) -> int:
    """The chunk length L of ``chunk_size=None``: the power of two for which one chunk buffer
    [L, batch, d, n] holds about 2M floats (8 MiB), clamped to [16, 256]. Small per-step
    states get long chunks (fewer whole-chunk ops, whose fixed cost is paid per chunk), large
    ones short chunks (buffers that stay in cache). E.g. 256 at (1, 512, 16), 32 at (8, 512, 16)."""
    per_step = max(1, batch * d * n)
    L = 1 << max(0, (_CHUNK_FLOATS // per_step).bit_length() - 1)
    return max(_CHUNK_MIN, min(_CHUNK_MAX, L))


def _contract_n_into(X: torch.Tensor, V: torch.Tensor, out: torch.Tensor) -> None:
    """out [l, B, D] = Σ_n X[l, b, d, n] V[l, b, ., n] (V shared by the channels: one batched matmul)."""
    l, Bt, D, N = X.shape
    if V.shape[2] == 1:
        torch.bmm(X.view(l * Bt, D, N), V.reshape(l * Bt, N, 1), out=out.view(l * Bt, D, 1))
    else:
        torch.linalg.vecdot(X, V, out=out)


class _Chunks:
    """The per-call chunk buffers (allocated once, reused by every chunk) and their per-step views.

    a [L, B, D, N] holds exp(ΔA) of the chunk; h [L + 1, B, D, N] holds the state entering the
    chunk in h[0] and the chunk's states in h[1:] (first b = Δx ⊗ B, then overwritten in place
    by the scan)."""

    def __init__(self, like: torch.Tensor, L: int, Bt: int, D: int, N: int, adjoint: bool = False):
        self.a = like.new_empty(L, Bt, D, N)
        self.h = like.new_empty(L + 1, Bt, D, N)
        self.av, self.hv = self.a.unbind(0), self.h.unbind(0)
        if adjoint:
            self.g = like.new_empty(L, Bt, D, N)
            self.gv = self.g.unbind(0)

    def states(self, delta, A, u, Bm, t0: int, t1: int) -> None:
        """Fills a[:l] and h[1:l+1] for steps t0..t1-1 from the state in h[0] (l = t1 - t0 steps)."""
        l = t1 - t0
        a = self.a[:l]
        torch.mul(delta[t0:t1].unsqueeze(-1), A, out=a)
        a.exp_()
        torch.mul(u[t0:t1].unsqueeze(-1), Bm[t0:t1], out=self.h[1:l + 1])
        av, hv = self.av, self.hv
        for i in range(l):  # h_t = a_t h_(t-1) + b_t, in place on the chunk's views
            hv[i + 1].addcmul_(av[i], hv[i])


def _chunked_forward(delta, A, u, Bm, Cm, h0, L, states=None):
    """The chunked forward, time-major: delta, u [T, B, D]; A [D, N]; Bm, Cm [T, B, D|1, N];
    h0 [B, D, N]. Returns (y [T, B, D], h_T); fills states [n + 1, B, D, N] (the states
    entering each chunk, and the last one) when given."""
    T, Bt, D = delta.shape
    N = A.shape[1]
    y = delta.new_empty(T, Bt, D)
    ch = _Chunks(delta, min(L, T), Bt, D, N)
    ch.h[0].copy_(h0)
    for c, t0 in enumerate(range(0, T, L)):
        t1 = min(T, t0 + L)
        l = t1 - t0
        ch.states(delta, A, u, Bm, t0, t1)
        _contract_n_into(ch.h[1:l + 1], Cm[t0:t1], y[t0:t1])
        if states is not None:
            states[c + 1].copy_(ch.hv[l])
        ch.h[0].copy_(ch.hv[l])
    return y, ch.h[0].clone()


class _ChunkedScan(torch.autograd.Function):
    """The selective scan in chunks of L steps, time-major, with a hand-written backward that
    recomputes each chunk's decays and states from the kept chunk-boundary states.

    Inputs as :class:`_FusedScan`, plus L. Kept: the inputs (O(T·D)) and the n + 1 boundary
    states (n = ceil(T/L)). Backward, chunk by chunk from the last: recompute a and the states
    (from the boundary state), g = dy C, then g_t += a_(t+1) g_(t+1) backwards (the carry from
    the next chunk enters at the last step), the carry into the previous chunk a_0 g_0, and the
    chunk's gradients: dC_t = Σ_d dy_t h_t, du_t = Σ_n g_t B_t, dB_t = Σ_d g_t u_t,
    q_t = g_t h_(t-1) a_t, dΔ_t = Σ_n q_t A, dA += Σ_(t,b) q_t Δ_t.
    """

    @staticmethod
    def forward(ctx, delta, A, u, Bm, Cm, h0, L):
        T, Bt, D = delta.shape
        states = delta.new_empty(-(-T // L) + 1, Bt, D, A.shape[1])
        states[0].copy_(h0)
        y, h = _chunked_forward(delta, A, u, Bm, Cm, h0, L, states)
        ctx.save_for_backward(delta, A, u, Bm, Cm, states)
        ctx.L = L
        return y, h

    @staticmethod
    @first_order("selective_scan (mode 'chunked')", "selective_scan(..., mode='reference')")
    @backward_autocast_off  # the backward's matmuls stay in the forward's dtype
    def backward(ctx, dy, dh_last):
        delta, A, u, Bm, Cm, states = ctx.saved_tensors
        L = ctx.L
        T, Bt, D = delta.shape
        N = A.shape[1]
        need_A, need_B, need_C = ctx.needs_input_grad[1], ctx.needs_input_grad[3], ctx.needs_input_grad[4]
        shared_B, shared_C = Bm.shape[2] == 1, Cm.shape[2] == 1
        if dy is None:
            dy = delta.new_zeros(T, Bt, D)
        carry = dh_last.clone() if dh_last is not None else delta.new_zeros(Bt, D, N)  # dL/dh entering from the right
        d_delta, d_u = torch.empty_like(delta), torch.empty_like(u)
        d_B = torch.empty_like(Bm) if need_B else None
        d_C = torch.empty_like(Cm) if need_C else None
        d_A = torch.zeros_like(A) if need_A else None
        ch = _Chunks(delta, min(L, T), Bt, D, N, adjoint=True)
        av, gv = ch.av, ch.gv
        starts = range(0, T, L)
        for c in reversed(range(len(starts))):
            t0 = starts[c]
            t1 = min(T, t0 + L)
            l, k = t1 - t0, (t1 - t0) * Bt
            ch.h[0].copy_(states[c])
            ch.states(delta, A, u, Bm, t0, t1)
            a, H, Hprev, G = ch.a[:l], ch.h[1:l + 1], ch.h[:l], ch.g[:l]
            dy_c = dy[t0:t1]
            torch.mul(dy_c.unsqueeze(-1), Cm[t0:t1], out=G)  # dy_t C_t
            gv[l - 1].add_(carry)
            for i in range(l - 2, -1, -1):  # g_t = dy_t C_t + a_(t+1) g_(t+1)
                gv[i].addcmul_(av[i + 1], gv[i + 1])
            torch.mul(av[0], gv[0], out=carry)  # a_(t0) g_(t0): dL/dh entering this chunk
            if need_C:  # dC_t = Σ_d dy_t h_t
                if shared_C:
                    torch.bmm(dy_c.reshape(k, 1, D), H.view(k, D, N), out=d_C[t0:t1].view(k, 1, N))
                else:
                    torch.mul(dy_c.unsqueeze(-1), H, out=d_C[t0:t1])
            u_c = u[t0:t1]
            if shared_B:  # du_t = Σ_n g_t B_t, dB_t = Σ_d g_t u_t
                torch.bmm(G.view(k, D, N), Bm[t0:t1].reshape(k, N, 1), out=d_u[t0:t1].view(k, D, 1))
                if need_B:
                    torch.bmm(u_c.reshape(k, 1, D), G.view(k, D, N), out=d_B[t0:t1].view(k, 1, N))
            else:
                torch.linalg.vecdot(G, Bm[t0:t1], out=d_u[t0:t1])
                if need_B:
                    torch.mul(u_c.unsqueeze(-1), G, out=d_B[t0:t1])
            q = a.mul_(Hprev).mul_(G)  # q_t = g_t h_(t-1) a_t = dL/d(Δ_t A), in a's buffer
            torch.linalg.vecdot(q, A, out=d_delta[t0:t1])
            if need_A:  # Σ_(t,b) q_t Δ_t: one batched matmul over the channels
                d_A += torch.einsum("kdn,kd->dn", q.view(k, D, N), delta[t0:t1].reshape(k, D))
        return d_delta, d_A, d_u, d_B, d_C, carry, None


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
    mode: str = "chunked",
    chunk_size: int | None = None,
    check_values: bool = True,
    backend: str = "auto",
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
):
    """Runs the selective scan (module docstring). Returns (y [B, T, D], final state [B, D, N] or None).

    delta_bias [D] (or None) and delta_softplus: Δ = softplus(delta + delta_bias) when
    delta_softplus, else delta + delta_bias (Mamba's ``selective_scan_fn`` convention; module
    docstring). delta is then the pre-activation (any sign) and gets its gradient; so does delta_bias.

    mode: "chunked" (default), "fused" or "reference". chunk_size: L of the chunked mode, an
    integer >= 1 (any T works: the last chunk is shorter) or None for :func:`scan_chunk_size`
    (about 8 MiB per chunk buffer; 16 to 256 steps); the other modes ignore it.
    backend: "auto", "torch", "cpp" (seqmix's fused C++ kernel, :mod:`seqmix.ops.cpp_scan`:
    CPU, every shape and option of this op, modes other than "reference"; chunk_size is then
    its L, 64 when None) or "mamba" (mamba_ssm's ``selective_scan_fn``; CUDA, B and C shared
    by the channels, no initial state): see :mod:`seqmix.ops.backends`. "auto" picks cpp on
    CPU when it compiles, else the torch mode."""
    check_choice("mode", mode, MODES, _WHERE)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size, _WHERE)
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
    if delta_bias is not None:
        check_tensor("delta_bias", delta_bias, rank=1, layout="[D]", where=_WHERE)
        check_shape("delta_bias", delta_bias, (Dc,), "[D]", _WHERE)
    if not isinstance(delta_softplus, bool):
        raise ValueError(f"{_WHERE}: argument 'delta_softplus' must be a bool, got {type(delta_softplus).__name__}")
    if check_values and reads_values(x):
        for name, t in (("x", x), ("delta", delta), ("A", A), ("B", B), ("C", C), ("delta_bias", delta_bias)):
            if t is not None:
                check_finite(name, t, _WHERE)
        if float(A.detach().max()) > 0:
            raise ValueError(f"{_WHERE}: argument 'A' must be <= 0 (a decay exp(ΔA) <= 1), got a maximum of {float(A.detach().max()):.4g}")
        if not delta_softplus:  # softplus(z) > 0 for any z; without it Δ = delta (+ delta_bias) must be >= 0 itself
            lo = float((delta if delta_bias is None else delta + delta_bias).detach().min())
            if lo < 0:
                what = "delta" if delta_bias is None else "delta + delta_bias"
                raise ValueError(f"{_WHERE}: argument 'delta' must give Δ = {what} >= 0 (Δ after softplus; or pass "
                                 f"delta_softplus=True), got a minimum of {lo:.4g}")
    activated = delta_bias is not None or delta_softplus

    if backend != "torch":
        be = _backends.resolve(_WHERE, backend, _backends.Call(
            _WHERE, x.device.type, x.dtype, mode,
            dict(initial_state=initial_state is not None, per_channel_BC=B.dim() == 4 or C.dim() == 4)))
        if be.name != "torch":
            # the activation's arguments only when used: a backend's run function without them (one registered
            # elsewhere) then raises a TypeError instead of ignoring them (backends.py's "cpp" and "mamba" take them)
            act = dict(delta_bias=delta_bias, delta_softplus=delta_softplus) if activated else {}
            y, h = be.run[_WHERE](x, delta, A, B, C, D, output_final_state=output_final_state,
                                  initial_state=initial_state, chunk_size=chunk_size, **act)
            return y, (h if output_final_state else None)
    if activated:  # the torch modes: Δ first, in plain torch (the obviously-correct form the kernel is tested against)
        z = delta if delta_bias is None else delta + delta_bias
        delta = F.softplus(z) if delta_softplus else z
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

    def tmajor(t):
        return t.transpose(0, 1).contiguous()

    if mode == "chunked" and (T > 1 or needs_grad):  # one step without a gradient (decoding): the plain step below
        L = chunk_size if chunk_size is not None else scan_chunk_size(Bt, Dc, N)
        args = (tmajor(delta), A, tmajor(u), tmajor(Bx), tmajor(Cx), h0)
        y, h = _ChunkedScan.apply(*args, L) if needs_grad else _chunked_forward(*args, L)
        y = y.transpose(0, 1)
    elif mode in ("reference", "chunked") or not needs_grad:  # fused without gradients: the plain loop is its faster forward
        a = torch.exp(delta.unsqueeze(-1) * A)  # [B, T, D, N]
        y, h = _scan_reference(a, u.unsqueeze(-1) * Bx, Cx, h0)
    else:
        y, h = _FusedScan.apply(tmajor(delta), A, tmajor(u), tmajor(Bx), tmajor(Cx), h0)
        y = y.transpose(0, 1).contiguous()
    if D is not None:
        y = (D.to(dt) * x).add_(y)  # in [B, T, D] layout whatever y's
    elif not y.is_contiguous():
        y = y.contiguous()
    return y.to(out_dtype), (h if output_final_state else None)
