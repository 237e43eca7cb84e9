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
