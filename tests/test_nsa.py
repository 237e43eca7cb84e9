"""NSA (seqmix.ops.nsa and the ``nsa`` mixer): the map against a loop over queries written from the paper's and
fla's naive rules (compression over mean-pooled complete blocks, selection of the top blocks by the group-averaged
compression weights with the first, own and previous blocks forced, a causal sliding window; gated sum), a
continuation, decoding through the cache, and bad input. fla's naive NSA imports triton (GPU only), so the loop
is the reference here."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.mixers.base import Cache
from seqmix.ops import nsa_attention, nsa_probs
from tolerances import F64_ATOL, max_abs


def loop_probs(q, k, gc, gs, gw, C, n, W):
    B, T, HQ, K = q.shape
    H = k.shape[2]
    G = HQ // H
    nb = -(-T // C)
    Phi = torch.zeros(B, HQ, T, T, dtype=q.dtype)
    for b in range(B):
        for t in range(T):
            j = t // C
            vis = [c for c in range(nb) if (c + 1) * C - 1 <= t]
            Pc = torch.zeros(HQ, nb, dtype=q.dtype)
            for hq in range(HQ):
                h = hq // G
                if vis:
                    kbar = torch.stack([k[b, c * C:min((c + 1) * C, T), h].mean(0) for c in vis])
                    Pc[hq, vis] = torch.softmax(kbar @ q[b, t, hq], 0)
                    for c, p in zip(vis, Pc[hq, vis]):
                        Phi[b, hq, t, c * C:(c + 1) * C] += gc[b, t, hq] * p / C
            for h in range(H):
                score = Pc[h * G:(h + 1) * G].mean(0)
                forced = {0, j, j - 1} - {-1}
                for c in forced:
                    score[c] = 1.0
                order = sorted(range(nb), key=lambda c: -float(score[c]))[: min(n, nb)]
                blocks = [c for c in order if c in forced or c in vis]
                toks = torch.tensor(sorted(s for c in blocks for s in range(c * C, min((c + 1) * C, T)) if s <= t))
                for hq in range(h * G, (h + 1) * G):
                    Phi[b, hq, t, toks] += gs[b, t, hq] * torch.softmax(k[b, toks, h] @ q[b, t, hq], 0)
                    if W:
                        loc = torch.arange(max(0, t - W + 1), t + 1)
                        Phi[b, hq, t, loc] += gw[b, t, hq] * torch.softmax(k[b, loc, h] @ q[b, t, hq], 0)
    return Phi


@pytest.mark.parametrize("C, n, W, HQ, H", [(2, 4, 5, 4, 2), (3, 3, 0, 2, 1), (4, 9, 2, 4, 4)])
def test_nsa_map_equals_the_loop(C, n, W, HQ, H):
    g = torch.Generator().manual_seed(0)
    T = 15
    q = torch.randn(2, T, HQ, 4, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, T, H, 4, generator=g, dtype=torch.float64) for _ in range(2))
    gates = [torch.rand(2, T, HQ, generator=g, dtype=torch.float64) for _ in range(3)]
    P = nsa_probs(q, k, *gates, block_size=C, block_count=n, window=W)
    assert max_abs(P, loop_probs(q, k, *gates, C, n, W)) < F64_ATOL
    o = nsa_attention(q, k, v, *gates, block_size=C, block_count=n, window=W)
    assert max_abs(o, torch.einsum("bhts,bshv->bthv", P, v.repeat_interleave(HQ // H, 2))) < F64_ATOL
    # a continuation: queries 9.. against all keys are the full map's rows
    P2 = nsa_probs(q[:, 9:], k, *(x[:, 9:] for x in gates), block_size=C, block_count=n, window=W, start=9)
    assert max_abs(P2, P[:, :, 9:]) < F64_ATOL


def test_nsa_mixer_decodes():
    torch.manual_seed(0)
    m = seqmix.build_mixer("nsa", **seqmix.mixer_entry("nsa").example_config()).double().eval()
    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, :6], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(6, 17)], 1)
    assert max_abs(steps, y) < F64_ATOL
    assert cache.floats() == 2 * m.state_size(17)


def test_nsa_bad_input():
    q, k = torch.randn(1, 5, 3, 4), torch.randn(1, 5, 2, 4)
    g = [torch.rand(1, 5, 3)] * 3
    with pytest.raises(ValueError, match="multiple"):
        nsa_probs(q, k, *g, block_size=2, block_count=3, window=0)
    with pytest.raises(ValueError, match="window"):
        nsa_probs(q, torch.randn(1, 5, 1, 4), *g, block_size=2, block_count=3, window=-1)
    with pytest.raises(ValueError, match="block_count"):
        nsa_probs(q, torch.randn(1, 5, 1, 4), *g, block_size=2, block_count=2, window=0)
    with pytest.raises(ValueError, match="kv_heads"):
        seqmix.build_mixer("nsa", heads=4, kv_heads=3)
