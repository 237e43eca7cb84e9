"""Causal convolutions: FFT vs direct vs the Toeplitz map; short conv with carried state."""

import pytest
import torch

from seqmix.ops.conv import causal_conv1d, causal_conv1d_step, direct_conv, fft_conv, fft_size, toeplitz
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err


def by_hand(u, k):
    B, T, C = u.shape
    y = torch.zeros_like(u)
    for t in range(T):
        for s in range(t + 1):
            y[:, t] += k[t - s] * u[:, s]
    return y


@pytest.mark.parametrize("T", [1, 7, 16, 33])
def test_fft_direct_and_loop_agree(T):
    u = torch.randn(2, T, 3, dtype=torch.float64)
    k = torch.randn(T + 5, 3, dtype=torch.float64)
    D = torch.randn(3, dtype=torch.float64)
    ref = by_hand(u, k) + u * D
    assert max_abs(direct_conv(u, k, D), ref) < F64_ATOL
    assert max_abs(fft_conv(u, k, D), ref) < F64_ATOL
    M = toeplitz(k, T)
    assert max_abs(torch.einsum("cts,bsc->btc", M, u) + u * D, ref) < F64_ATOL
    assert torch.triu(M, 1).abs().max() == 0


def test_fft_float32_and_batched_filters():
    u = torch.randn(3, 50, 4)
    k = torch.randn(3, 64, 4)
    ref = torch.stack([by_hand(u[b : b + 1].double(), k[b].double())[0] for b in range(3)])
    assert rel_err(fft_conv(u, k).double(), ref) < F32_RTOL
    assert rel_err(direct_conv(u, k).double(), ref) < F32_RTOL


def test_padding_prevents_wraparound():
    """Without zero-padding to >= 2T the circular convolution leaks the future (convblog §2.4)."""
    T = 16
    assert fft_size(T) >= 2 * T - 1
    u = torch.zeros(1, T, 1, dtype=torch.float64)
    u[0, -1] = 1.0  # only the last input is nonzero
    k = torch.ones(T, 1, dtype=torch.float64)
    assert fft_conv(u, k)[0, :-1].abs().max() < 1e-12
    circular = torch.fft.irfft(torch.fft.rfft(u, n=T, dim=1) * torch.fft.rfft(k, n=T, dim=0), n=T, dim=1)
    assert circular[0, :-1].abs().max() > 0.5  # the unpadded version does leak


def test_fft_conv_gradients_match_direct():
    u = torch.randn(2, 20, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(20, 3, dtype=torch.float64, requires_grad=True)
    g1 = torch.autograd.grad(fft_conv(u, k).pow(2).sum(), (u, k))
    g2 = torch.autograd.grad(direct_conv(u, k).pow(2).sum(), (u, k))
    assert all(max_abs(a, b) < F64_ATOL for a, b in zip(g1, g2))


def test_bad_long_conv_input():
    with pytest.raises(ValueError, match="fewer than the sequence length"):
        fft_conv(torch.randn(1, 10, 2), torch.randn(5, 2))
    with pytest.raises(ValueError, match="'k'"):
        fft_conv(torch.randn(1, 10, 2), torch.randn(10, 3))
    with pytest.raises(ValueError, match="'u'"):
        fft_conv(torch.randn(10, 2), torch.randn(10, 2))
    with pytest.raises(ValueError, match="non-finite"):
        fft_conv(torch.full((1, 4, 2), float("nan")), torch.randn(4, 2))


@pytest.mark.parametrize("W", [1, 2, 4])
def test_short_conv_state_carry_and_step(W):
    B, T, C = 2, 11, 3
    x = torch.randn(B, T, C, dtype=torch.float64)
    w = torch.randn(C, W, dtype=torch.float64)
    b = torch.randn(C, dtype=torch.float64)
    y, _ = causal_conv1d(x, w, b, activation="silu")
    # by hand: y[t] = silu(sum_i w[i] x[t - (W-1) + i] + b)
    xp = torch.cat([torch.zeros(B, W - 1, C, dtype=x.dtype), x], 1)
    ref = torch.nn.functional.silu(sum(w[:, i] * xp[:, i : i + T] for i in range(W)) + b)
    assert max_abs(y, ref) < F64_ATOL
    y1, s = causal_conv1d(x[:, :4], w, b, activation="silu", output_final_state=True)
    y2, _ = causal_conv1d(x[:, 4:], w, b, state=s, activation="silu")
    assert max_abs(torch.cat([y1, y2], 1), ref) < F64_ATOL
    state, outs = None, []
    for t in range(T):
        o, state = causal_conv1d_step(x[:, t], w, b, state, activation="silu")
        outs.append(o)
    assert max_abs(torch.stack(outs, 1), ref) < F64_ATOL


def test_bad_short_conv_input():
    with pytest.raises(ValueError, match="'x'"):
        causal_conv1d(torch.randn(2, 5, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="'state'"):
        causal_conv1d(torch.randn(2, 5, 3), torch.randn(3, 4), state=torch.randn(2, 3, 2))
    with pytest.raises(ValueError, match="activation"):
        causal_conv1d(torch.randn(2, 5, 3), torch.randn(3, 4), activation="relu6")


def _conv1d_reference(x, w, b, state):
    """torch's depthwise conv1d over [the state's W-1 inputs, x]: the short conv's obviously correct form."""
    W = w.shape[1]
    prev = state if state is not None else x.new_zeros(x.shape[0], x.shape[2], W - 1)
    full = torch.cat([prev, x.transpose(1, 2)], dim=-1)
    return torch.nn.functional.conv1d(full, w.unsqueeze(1), b, groups=w.shape[0]).transpose(1, 2)


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_short_conv_and_its_gradients_equal_torch_conv1d(W, bias, with_state, dtype):
    """causal_conv1d's output and its hand-written backward (gradients of x, weight, bias and the carried state)
    against F.conv1d with autograd's; the same numbers with and without autograd recording."""
    g = torch.Generator().manual_seed(W)
    B, T, C = 2, 13, 5
    x = torch.randn(B, T, C, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(C, W, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(C, generator=g, dtype=dtype, requires_grad=True) if bias else None
    s = torch.randn(B, C, W - 1, generator=g, dtype=dtype, requires_grad=True) if with_state else None
    named = [(n, t) for n, t in (("x", x), ("weight", w), ("bias", b), ("state", s)) if t is not None]
    leaves = [t for _, t in named]
    y, _ = causal_conv1d(x, w, b, s)
    ref = _conv1d_reference(x, w, b, s)
    dy = torch.randn(ref.shape, generator=g, dtype=dtype)
    grads = torch.autograd.grad(y, leaves, dy)
    grads_ref = torch.autograd.grad(ref, leaves, dy)
    check = (lambda a, r: max_abs(a, r) < F64_ATOL) if dtype == torch.float64 else (lambda a, r: rel_err(a, r) < F32_RTOL)
    assert check(y, ref)
    for (name, _), a, r in zip(named, grads, grads_ref):
        assert a.shape == r.shape and (a.numel() == 0 or check(a, r)), name  # (W 1: the state is empty)
    with torch.no_grad():
        assert torch.equal(causal_conv1d(x, w, b, s)[0], y.detach())


def test_short_conv_second_derivatives_are_exact():
    """The hand-written backward is made of differentiable ops: gradgradcheck passes (float64)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 3, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    s = torch.randn(1, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    f = lambda x, w, b, s: causal_conv1d(x, w, b, s, activation="silu")[0]
    assert torch.autograd.gradcheck(f, (x, w, b, s))
    assert torch.autograd.gradgradcheck(f, (x, w, b, s))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_short_conv_half_inputs_sum_in_float32_and_round_once(dtype):
    """Half-precision x: the full pass and the step give the float32 result rounded once to x's dtype."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 6, generator=g).to(dtype)
    w, b = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    y, state = causal_conv1d(x, w, b, activation="silu", output_final_state=True)
    ref, ref_state = causal_conv1d(x.float(), w, b, activation="silu", output_final_state=True)
    assert y.dtype == dtype and state.dtype == dtype
    assert torch.equal(y, ref.to(dtype)) and torch.equal(state, ref_state.to(dtype))
    x1 = torch.randn(2, 6, generator=g).to(dtype)
    o, _ = causal_conv1d_step(x1, w, b, state.clone(), activation="silu")
    o_ref, _ = causal_conv1d_step(x1.float(), w, b, state.float(), activation="silu")
    assert o.dtype == dtype and torch.equal(o, o_ref.to(dtype))


@pytest.mark.parametrize("in_place", [False, True])
def test_short_conv_step_over_state_blocks_equals_one_state(in_place):
    # a state kept in blocks along the channels (q, k, v convs of their own) steps as the one state they make: the same
    # output, each block's part of the shifted window; inside states_in_place each block is shifted in place, outside
    # the given blocks are left as they were
    import contextlib

    from seqmix.ops import states_in_place

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 12, generator=g), torch.randn(12, 4, generator=g), torch.randn(12, generator=g)
    blocks = tuple(torch.randn(2, c, 3, generator=g) for c in (4, 4, 4))
    whole = torch.cat(blocks, 1)
    given = [t.clone() for t in blocks]
    y_ref, s_ref = causal_conv1d_step(x, w, b, whole.clone(), activation="silu")
    with states_in_place() if in_place else contextlib.nullcontext():
        y, new = causal_conv1d_step(x, w, b, blocks, activation="silu")
    assert torch.equal(y, y_ref) and isinstance(new, tuple) and len(new) == 3
    assert torch.equal(torch.cat(new, 1), s_ref)
    for t, n, g0 in zip(blocks, new, given):
        assert (n is t) == in_place
        assert torch.equal(t, n if in_place else g0)


def test_short_conv_step_state_blocks_bad_input():
    x, w = torch.randn(2, 6), torch.randn(6, 4)
    with pytest.raises(ValueError, match=r"state\[1\]"):
        causal_conv1d_step(x, w, None, (torch.randn(2, 3, 3), torch.randn(1, 3, 3)))
    with pytest.raises(ValueError, match=r"state\[0\]"):
        causal_conv1d_step(x, w, None, (torch.randn(2, 3, 2), torch.randn(2, 3, 3)))
    with pytest.raises(ValueError, match="state"):  # the blocks' channels must make the weight's
        causal_conv1d_step(x, w, None, (torch.randn(2, 3, 3), torch.randn(2, 2, 3)))
