"""Parallax (seqmix.ops.parallax and the ``parallax`` mixer) against fla's naive_parallax (float32 inside:
F32_RTOL), with and without a window; the rows sum to 1; a continuation, decoding, and bad input."""

from __future__ import annotations

import pytest
import torch

import seqmix
from fla_ref import fla_naive
from seqmix.mixers.base import Cache
from seqmix.ops import parallax_attention, parallax_probs
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err


@pytest.mark.parametrize("window", [None, 4])
def test_op_matches_fla_naive(window):
    naive = fla_naive("ops/parallax/naive.py", "naive_parallax")
    g = torch.Generator().manual_seed(0)
    q, r, k, v = (torch.randn(2, 13, 2, 4, generator=g, dtype=torch.float64) for _ in range(4))
    o_ref = naive(q, r, k, v, scale=0.5, window_size=window)
    o = parallax_attention(q * 0.5, r, k, v, window=window)
    assert rel_err(o, o_ref) < F32_RTOL
    P = parallax_probs(q * 0.5, r, k, window=window)
    assert max_abs(P.sum(-1), torch.ones(2, 2, 13, dtype=torch.float64)) < 1e-12
    P2 = parallax_probs(q[:, 7:] * 0.5, r[:, 7:], k, window=window, start=7)
    assert max_abs(P2, P[:, :, 7:]) < F64_ATOL


def test_mixer_matches_fla_naive_and_decodes():
    naive = fla_naive("ops/parallax/naive.py", "naive_parallax")
    torch.manual_seed(0)
    m = seqmix.build_mixer("parallax", d_model=16, n=16, heads=2, window=5).double().eval()
    x = torch.randn(2, 14, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q, r, k, v = m._params(x, 0)
    _, mixed = m.core(x)
    assert rel_err(mixed, naive(q / m.qk_scale, r, k, v, scale=m.qk_scale, window_size=5)) < F32_RTOL
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, :4], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(4, 14)], 1)
    assert max_abs(steps, y) < F64_ATOL


def test_bad_input():
    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="'r'"):
        parallax_probs(q, q[..., :2], q)
    with pytest.raises(ValueError, match="window"):
        parallax_probs(q, q, q, window=0)
