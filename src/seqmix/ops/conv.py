"""Causal convolutions along time: the long (FFT) convolution of the LTI systems and the
short depthwise convolution of Mamba, H3, Hyena, MetaLA, with a carried state.

Layout: sequences are [B, T, C] (time second, channels last), as everywhere in seqmix.

Long convolution (S4, S4D, H3, Hyena; convblog note §1-2):

    y[t, c] = Σ_{s=0}^{t} k[t - s, c] · u[s, c]   (+ D[c] · u[t, c])

* :func:`fft_conv`: rfft of u and k zero-padded to n >= 2T (a power of two), product,
  irfft, first T outputs. Without the padding the circular convolution wraps the end
  of the sequence onto its start and the output leaks the future (convblog note §2.4).
* :func:`direct_conv`: the same sum by ``torch.nn.functional.conv1d`` (O(T²C), the
  reference the FFT is tested and benchmarked against).
* :func:`toeplitz`: the causal map [C, T, T] of a filter (phi of a convolution mixer).

Short causal depthwise convolution (kernel W, PyTorch cross-correlation order: the last
tap w[:, W-1] multiplies the current input, as in Mamba's ``causal_conv1d``):

    y[t, c] = Σ_{i=0}^{W-1} w[c, i] · x[t - (W-1) + i, c]  (+ bias[c])

* :func:`causal_conv1d`: a whole sequence, optionally continuing from a state (the last
  W-1 inputs, [B, C, W-1]) and returning the new one;
* :func:`causal_conv1d_step`: one token (decoding), the same update.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import backends as _backends
from .._checks import check_finite, check_positive_int, check_shape, check_tensor, fmt_shape
from .inplace import owned, writable
from .precision import compute_dtype, full_precision

__all__ = ["fft_conv", "direct_conv", "toeplitz", "causal_conv1d", "causal_conv1d_step", "fft_size"]


def fft_size(T: int, L: int | None = None) -> int:
    """The FFT length used for a sequence of T and a filter of L taps: the next power of
    two >= T + L - 1 (>= 2T when L = T), so that the circular convolution is linear."""
    L = T if L is None else L
    n = 1
    while n < T + L - 1:
        n *= 2
    return max(n, 2)


def _check_long(u, k, D, where):
    check_tensor("u", u, rank=3, layout="[B, T, C]", where=where)
    check_tensor("k", k, rank=(2, 3), layout="[L, C] or [B, L, C]", complex_ok=False, where=where)
    B, T, C = u.shape
    if k.shape[-1] != C:
        raise ValueError(f"{where}: argument 'k' must have C = {C} channels in its last dimension, got {fmt_shape(k.shape)}")
    if k.dim() == 3 and k.shape[0] not in (1, B):
        raise ValueError(f"{where}: a batched filter 'k' must be [B={B}, L, C], got {fmt_shape(k.shape)}")
    if k.shape[-2] < T:
        raise ValueError(
            f"{where}: argument 'k' has {k.shape[-2]} taps, fewer than the sequence length T = {T}; "
            f"build the filter for at least T taps"
        )
    if D is not None:
        check_shape("D", D, (C,), "[C]", where)
    return B, T, C


@full_precision
def fft_conv(u: torch.Tensor, k: torch.Tensor, D: torch.Tensor | None = None, *, check_values: bool = True) -> torch.Tensor:
    """Causal long convolution by FFT. u [B, T, C]; k [L, C] or [B, L, C] with L >= T (only the
    first T taps matter); D [C] optional skip. Returns y [B, T, C] in u's dtype (half
    inputs are transformed in float32)."""
    where = "fft_conv"
    B, T, C = _check_long(u, k, D, where)
    if check_values:
        check_finite("u", u, where)
        check_finite("k", k, where)
    k = k[..., :T, :]
    dt = torch.promote_types(u.dtype, k.dtype)
    if dt in (torch.float16, torch.bfloat16):
        dt = torch.float32
    n = fft_size(T)
    # transforms along the last, contiguous dimension (channels first): about twice as fast on
    # CPU as transforming the strided time dimension of [B, T, C] in place
    U = torch.fft.rfft(u.to(dt).transpose(-1, -2).contiguous(), n=n)
    Kf = torch.fft.rfft(k.to(dt).transpose(-1, -2).contiguous(), n=n)
    y = torch.fft.irfft(U * Kf, n=n)[..., :T].transpose(-1, -2).contiguous()
    if D is not None:
        y = y + u.to(dt) * D.to(dt)
    return y.to(u.dtype)


def direct_conv(u: torch.Tensor, k: torch.Tensor, D: torch.Tensor | None = None) -> torch.Tensor:
    """The reference: the causal sum computed directly (depthwise conv1d over the left-padded
    sequence with the reversed filter). Same arguments as :func:`fft_conv`."""
    where = "direct_conv"
    B, T, C = _check_long(u, k, D, where)
    k = k[..., :T, :]
    if k.dim() == 3 and k.shape[0] == B and B > 1:
        return torch.cat([direct_conv(u[b : b + 1], k[b], D) for b in range(B)], 0)
    k = k.reshape(T, C)
    x = F.pad(u.transpose(1, 2), (T - 1, 0))  # [B, C, 2T-1]
    w = k.flip(0).t().unsqueeze(1)  # [C, 1, T]: w[c, 0, i] = k[T-1-i, c]
    y = F.conv1d(x, w.to(u.dtype), groups=C).transpose(1, 2)
    if D is not None:
        y = y + u * D
    return y


def toeplitz(k: torch.Tensor, T: int) -> torch.Tensor:
    """The causal map of a filter: k [L, C] (L >= T) -> [C, T, T] with M[c, t, s] = k[t - s, c] for s <= t."""
    check_tensor("k", k, rank=2, layout="[L, C]", complex_ok=True, where="toeplitz")
    if k.shape[0] < T:
        raise ValueError(f"toeplitz: argument 'k' has {k.shape[0]} taps, fewer than T = {T}")
    idx = torch.arange(T, device=k.device)
    lag = idx.unsqueeze(1) - idx.unsqueeze(0)  # [T, T], t - s
    M = k[lag.clamp(min=0)]  # [T, T, C]
    M = torch.where((lag >= 0).unsqueeze(-1), M, torch.zeros((), dtype=k.dtype, device=k.device))
    return M.permute(2, 0, 1)


# ------------------------------------------------------------------------------------------
# short causal depthwise convolution with a carried state
# ------------------------------------------------------------------------------------------


def _check_short(x, weight, bias, state, where, step=False):
    check_tensor("x", x, rank=2 if step else 3, layout="[B, C]" if step else "[B, T, C]", where=where)
    check_tensor("weight", weight, rank=2, layout="[C, W]", where=where)
    C, W = weight.shape
    check_positive_int("kernel width W", W, where)
    if x.shape[-1] != C:
        raise ValueError(f"{where}: argument 'x' must have C = {C} channels (weight is {fmt_shape(weight.shape)}), got {fmt_shape(x.shape)}")
    if bias is not None:
        check_shape("bias", bias, (C,), "[C]", where)
    if state is not None:
        check_shape("state", state, (x.shape[0], C, W - 1), "[B, C, W-1]", where)
    return C, W


def _shifted_sum(full: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y[:, t] = bias + Σ_i w[i] ⊙ full[:, t + i]: full [B, T + W − 1, C] (the W − 1 inputs before x, then x), w [W, C]
    (the taps as rows), bias [C] or None -> [B, T, C]. A sum of W shifted copies accumulated in place by addcmul:
    faster than conv1d on the CPU (bench/convolution.py), and without the seconds that oneDNN spends generating a
    kernel for every new shape. The taps are rows of a [W, C] copy of the weight: a column of [C, W] is strided, and a
    product broadcast along a strided vector takes torch's slow loop (measured 7x the time at [1, 1024, 1536], W 4)."""
    W = w.shape[0]
    T = full.shape[1] - W + 1
    first = full[:, :T]
    y = torch.addcmul(bias, first, w[0]) if bias is not None else first * w[0]
    for i in range(1, W):
        y.addcmul_(full[:, i : i + T], w[i])
    return y


class _ShortConv(torch.autograd.Function):
    """:func:`_shifted_sum` with its backward written as the same shifted sums: d full[:, t + i] += w[i] ⊙ dy[:, t]
    (W in-place adds into one buffer), dw[i] = Σ_{b, t} dy[:, t] ⊙ full[:, t + i], dbias = Σ_{b, t} dy. Autograd's
    own backward of the forward's W slices allocates a zero buffer of full's size for each tap (measured 1.9x the
    time of this one, forward and backward, at [1, 1024, 1536], W 4). The backward is made of differentiable ops:
    second derivatives (create_graph=True) are exact."""

    @staticmethod
    def forward(ctx, full, w, bias):
        ctx.save_for_backward(full, w)
        ctx.has_bias = bias is not None
        return _shifted_sum(full, w, bias)

    @staticmethod
    def backward(ctx, dy):
        full, w = ctx.saved_tensors
        W, T = w.shape[0], dy.shape[1]
        d_full = d_w = d_bias = None
        if ctx.needs_input_grad[0]:
            d_full = torch.zeros_like(full)
            for i in range(W):
                d_full[:, i : i + T].addcmul_(dy, w[i])
        if ctx.needs_input_grad[1]:
            d_w = torch.stack([(dy * full[:, i : i + T]).sum((0, 1)) for i in range(W)])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            d_bias = dy.sum((0, 1))
        return d_full, d_w, d_bias


def causal_conv1d(x, weight, bias=None, state=None, *, activation: str | None = None, output_final_state: bool = False,
                  backend: str = "auto"):
    """Short causal depthwise convolution over a sequence.

    x [B, T, C]; weight [C, W]; bias [C] or None; state [B, C, W-1] (the W-1 inputs
    before x; zeros if None); activation None or "silu". Returns (y [B, T, C],
    new state [B, C, W-1] or None). backend: "auto", "torch" or "mamba" (the causal_conv1d
    package's ``causal_conv1d_fn``; CUDA, W in 2..4, no carried state): see :mod:`seqmix.ops.backends`.
    Half-precision x: the products are summed (and the activation applied) in float32, y rounded once to x's
    dtype (as :func:`causal_conv1d_step` does).
    """
    C, W = _check_short(x, weight, bias, state, "causal_conv1d")
    if activation not in (None, "silu"):
        raise ValueError(f"causal_conv1d: unknown activation {activation!r}; expected None or 'silu'")
    if backend != "torch":
        be = _backends.resolve("short_conv", backend, _backends.Call(
            "short_conv", x.device.type, x.dtype, None,
            dict(W=W, state=state is not None, output_final_state=output_final_state)))
        if be.name != "torch":
            return be.run["short_conv"](x, weight, bias, activation=activation), None
    B, T, _ = x.shape
    prev = state.transpose(1, 2).to(x.dtype) if state is not None else x.new_zeros(B, W - 1, C)
    full = torch.cat([prev, x], dim=1)  # [B, W-1+T, C]
    # half inputs: the W products summed in float32 and the result (after the activation) rounded once
    dt = compute_dtype(x)
    full_c = full.to(dt)
    w = weight.to(dt).t().contiguous()  # [W, C]: each tap a contiguous row (_ShortConv)
    b = bias.to(dt) if bias is not None else None
    if torch.is_grad_enabled() and (full_c.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        y = _ShortConv.apply(full_c, w, b)
    else:
        y = _shifted_sum(full_c, w, b)
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"causal_conv1d: unknown activation {activation!r}; expected None or 'silu'")
    y = y.to(x.dtype)
    # (a copy: a view would keep the whole of ``full``, the call's input, alive in the cache)
    new_state = full[:, full.shape[1] - (W - 1) :].transpose(1, 2).clone() if output_final_state else None
    return y, new_state


def causal_conv1d_step(x, weight, bias=None, state=None, *, activation: str | None = None):
    """One token: x [B, C], state [B, C, W-1] -> (y [B, C], new state [B, C, W-1]). Inside
    :func:`~seqmix.ops.inplace.states_in_place` the state is shifted in place (the returned state is the given
    tensor) and the arguments are not checked. ``state`` may also be a tuple of blocks [B, C_i, W-1] whose channels, in
    order, are the C channels (convs of their own, such as a delta rule's over q, k and v, stepped as one): the new
    state is then the tuple of the blocks, each shifted as a single state is (in place inside ``states_in_place``)."""
    blocks = state if isinstance(state, tuple) else None
    if blocks is not None:
        if not owned():  # (each block named; their sum of channels is checked as the one state below)
            W1 = weight.shape[-1] - 1 if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None
            for i, b in enumerate(blocks):
                check_tensor(f"state[{i}]", b, rank=3, layout="[B, C_i, W-1]", where="causal_conv1d_step")
                check_shape(f"state[{i}]", b, (x.shape[0] if isinstance(x, torch.Tensor) else None, None, W1),
                            "[B, C_i, W-1] (x's batch, the kernel's width − 1)", "causal_conv1d_step")
        state = torch.cat(blocks, dim=1)
    if owned():
        C, W = weight.shape
    else:
        C, W = _check_short(x, weight, bias, state, "causal_conv1d_step", step=True)
    prev = state if state is not None and state.dtype == x.dtype else state.to(x.dtype) if state is not None \
        else x.new_zeros(x.shape[0], C, W - 1)
    window = torch.cat([prev, x.unsqueeze(-1)], dim=-1)  # [B, C, W]
    if x.dtype in (torch.float16, torch.bfloat16):  # as causal_conv1d: summed in float32, rounded once
        y = (window.float() * weight.float()).sum(-1)
        if bias is not None:
            y = y + bias.float()
    else:
        y = (window * (weight if weight.dtype == x.dtype else weight.to(x.dtype))).sum(-1)
        if bias is not None:
            y = y + (bias if bias.dtype == x.dtype else bias.to(x.dtype))
    if activation == "silu":
        y = F.silu(y)
    elif activation is not None:
        raise ValueError(f"causal_conv1d_step: unknown activation {activation!r}; expected None or 'silu'")
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    if blocks is not None:  # each block's channels of the shifted window, written into it where it may be
        new, c0 = [], 0
        for b in blocks:
            shifted = window[:, c0:c0 + b.shape[1], 1:]
            c0 += b.shape[1]
            new.append(b.copy_(shifted) if W > 1 and writable(b, x.dtype) else shifted)
        return y, tuple(new)
    if W > 1 and prev is state and writable(state, x.dtype):
        return y, state.copy_(window[..., 1:])
    return y, window[..., 1:]
