"""Mixed precision in the ops (docs/scale.md): an op that computes half inputs in
float32 gives the same numbers under autocast as outside it (autocast would otherwise cast
its inner matmuls back to the half dtype), and returns the input's dtype."""

import pytest
import torch

from seqmix.ops import fft_conv, linear_recurrence, selective_scan, softmax_attention
from seqmix.ops.precision import complex_, compute_dtype, full_precision, linear_f32, upcast
from seqmix.ops.ssm import diagonal_ssm_conv
from tolerances import F32_RTOL, rel_err

HALF = [torch.bfloat16, torch.float16]


def rand(*shape, dtype, seed=0):
    """Random values rounded to bfloat16 first, so that every dtype holds the same numbers."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16().to(dtype)


def _recurrence(dt):
    B, T, H, K = 2, 40, 2, 8
    q, k, v = (rand(B, T, H, K, dtype=dt, seed=s) for s in (1, 2, 3))
    gk = -rand(B, T, H, K, dtype=dt, seed=4).abs()
    return linear_recurrence(q, k, v, gk, mode="chunk", chunk_size=16)[0]


def _scan(dt):
    B, T, D, N = 2, 30, 4, 3
    x, Bm, Cm = rand(B, T, D, dtype=dt, seed=1), rand(B, T, N, dtype=dt, seed=2), rand(B, T, N, dtype=dt, seed=3)
    delta, A = rand(B, T, D, dtype=dt, seed=4).abs(), -rand(D, N, dtype=dt, seed=5).abs()
    return selective_scan(x, delta, A, Bm, Cm, mode="reference")[0]


def _fft(dt):
    return fft_conv(rand(2, 50, 4, dtype=dt, seed=1), rand(50, 4, dtype=dt, seed=2))


def _diag_ssm(dt):
    r = [torch.randn(4, 3, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    log_A = torch.complex(-r[0].abs() - 0.1, r[1])
    Bb, C = torch.complex(r[2], r[3]), torch.complex(r[4], r[5])
    return diagonal_ssm_conv(rand(2, 50, 4, dtype=dt), log_A, Bb, C)[0]


def _attention(dt):
    q, k, v = (rand(2, 20, 2, 8, dtype=dt, seed=s) for s in (1, 2, 3))
    return softmax_attention(q, k, v, mode="parallel")


OPS = {"linear_recurrence": _recurrence, "selective_scan": _scan, "fft_conv": _fft, "diagonal_ssm_conv": _diag_ssm,
       "softmax_attention": _attention}


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("op", list(OPS))
def test_op_ignores_autocast_inside(op, dtype):
    plain = OPS[op](dtype)
    with torch.autocast("cpu", dtype=dtype):
        under = OPS[op](dtype)
    assert plain.dtype == under.dtype == dtype
    assert torch.equal(plain, under), f"{op}: autocast changed the float32 computation inside the op"


@pytest.mark.parametrize("op", list(OPS))
def test_op_on_half_inputs_rounds_once(op):
    """On the same values, the op on bf16 inputs is the float32 op rounded once at exit
    (relative error within bf16's unit roundoff 2⁻⁸, not the error of a bf16 computation)."""
    assert rel_err(OPS[op](torch.bfloat16).float(), OPS[op](torch.float32)) <= 2.0**-8


def test_full_precision_turns_autocast_off_inside():
    seen = []

    @full_precision
    def op(a):
        seen.append(torch.is_autocast_enabled("cpu"))
        return (a @ a).dtype

    a = torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        assert op(a) == torch.float32
    assert seen == [False]


def test_helpers():
    h = torch.ones(3, dtype=torch.bfloat16)
    assert compute_dtype(h, None) == torch.float32
    assert compute_dtype(torch.ones(1, dtype=torch.float64), h) == torch.float64
    assert compute_dtype(torch.ones(1, dtype=torch.complex64), h) == torch.complex64
    assert upcast(h).dtype == torch.float32 and upcast(None) is None
    z = complex_(h, 2 * h)
    assert z.dtype == torch.complex64 and torch.equal(z.imag, torch.full((3,), 2.0))
    lin = torch.nn.Linear(3, 2).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear_f32(lin, h)
    assert y.dtype == torch.float32
    assert rel_err(y, lin.float()(h.float())) < F32_RTOL
