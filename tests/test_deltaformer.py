"""DeltaFormer (seqmix.ops.deltaformer and the ``deltaformer`` mixer): the op's modes and map, continuation with
the past u, fla's naive_deltaformer_attn (float32 inside: F32_RTOL), the mixer's core against it, and bad input."""

from __future__ import annotations

import pytest
import torch

import seqmix
from fla_ref import fla_naive
from seqmix.mixers.base import Cache
from seqmix.ops import deltaformer_attention, deltaformer_probs
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err


def qkvb(T=13, H=2, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, T, H, K, generator=g, dtype=torch.float64) for _ in range(3))
    return q, k, v, torch.rand(2, T, H, generator=g, dtype=torch.float64)


def test_modes_map_and_continuation():
    q, k, v, beta = qkvb()
    o1, u1 = deltaformer_attention(q, k, v, beta, mode="recurrent")
    o2, u2 = deltaformer_attention(q, k, v, beta, mode="parallel")
    assert max_abs(o1, o2) < F64_ATOL and max_abs(u1, u2) < F64_ATOL
    P = deltaformer_probs(q, k, beta)
    assert max_abs(torch.einsum("bhts,bshv->bthv", P, v), o1) < F64_ATOL
    # u_t = v_t − β_t Σ_{s<t} softmax_{s<t}(q_t·k_s) u_s, checked token by token
    for t in range(1, 13):
        w = torch.softmax(torch.einsum("bhk,bshk->bhs", q[:, t], k[:, :t]), -1)
        assert max_abs(u1[:, t], v[:, t] - beta[:, t, :, None] * torch.einsum("bhs,bshv->bhv", w, u1[:, :t])) < F64_ATOL
    # continuation: the new tokens against all keys and the earlier u
    o3, u3 = deltaformer_attention(q[:, 8:], k, v[:, 8:], beta[:, 8:], u_prev=u1[:, :8])
    assert max_abs(o3, o1[:, 8:]) < F64_ATOL and max_abs(u3, u1[:, 8:]) < F64_ATOL


def test_op_matches_fla_naive():
    naive = fla_naive("ops/deltaformer/naive.py", "naive_deltaformer_attn")
    q, k, v, beta = qkvb(seed=1)
    o_ref = naive(q, k, v, beta)
    o, _ = deltaformer_attention(q * 0.5, k, v, beta)  # fla scales by 1/sqrt(K) = 1/2 inside
    assert rel_err(o, o_ref) < F32_RTOL


def test_mixer_matches_fla_naive_and_decodes():
    naive = fla_naive("ops/deltaformer/naive.py", "naive_deltaformer_attn")
    torch.manual_seed(0)
    m = seqmix.build_mixer("deltaformer", d_model=16, n=16, heads=2).double().eval()  # K = V = 8 (fla's layer: equal)
    x = torch.randn(2, 15, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    q, k, v, beta = m._params(x, 0)
    o_ref = naive(q / m.qk_scale, k, v, beta)
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, :5], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(5, 15)], 1)
    assert max_abs(steps, y) < F64_ATOL
    assert set(cache.get(m)) == {"k", "u"}


def test_bad_input():
    q, k, v, beta = qkvb()
    with pytest.raises(ValueError, match="u_prev"):
        deltaformer_attention(q[:, 5:], k, v[:, 5:], beta[:, 5:])
    with pytest.raises(ValueError, match="'beta'"):
        deltaformer_attention(q, k, v, beta[:, :3])
    with pytest.raises(ValueError, match="mode"):
        deltaformer_attention(q, k, v, beta, mode="chunk")
