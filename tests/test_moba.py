"""MoBA (seqmix.ops.moba and the ``moba`` mixer): the map against a loop over queries written from the paper's
rule (own block causally, top_k − 1 complete past blocks by q·mean(k), softmax over the union), decoding and a
continuation through the cache, the support's shape, and bad input. fla ships no naive MoBA (its op composes
flash-attn kernels)."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.mixers.base import Cache
from seqmix.ops import moba_attention, moba_mask, moba_probs
from tolerances import F64_ATOL, max_abs


def loop_probs(q, k, C, topk):
    """Φ [B, H, T, T] query by query: blocks i < t // C scored by q_t·mean(k_block), the best topk − 1 kept."""
    B, T, H, K = q.shape
    P = torch.zeros(B, H, T, T, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                j = t // C
                keys = list(range(j * C, t + 1))
                if j > 0 and topk > 1:
                    scores = torch.stack([q[b, t, h] @ k[b, i * C:(i + 1) * C, h].mean(0) for i in range(j)])
                    for i in torch.topk(scores, min(topk - 1, j)).indices.tolist():
                        keys += list(range(i * C, (i + 1) * C))
                s = torch.tensor(sorted(keys))
                P[b, h, t, s] = torch.softmax(k[b, s, h] @ q[b, t, h], 0)
    return P


@pytest.mark.parametrize("C, topk", [(4, 2), (3, 3), (5, 1), (4, 9)])
def test_moba_map_equals_the_loop(C, topk):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 17, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    P = moba_probs(q, k, block_size=C, topk=topk)
    assert max_abs(P, loop_probs(q, k, C, topk)) < F64_ATOL
    assert max_abs(moba_attention(q, k, v, block_size=C, topk=topk), torch.einsum("bhts,bshv->bthv", P, v)) < F64_ATOL
    # the support: own block causal, at most topk blocks per row
    M = moba_mask(q, k, block_size=C, topk=topk)
    blocks = torch.stack([M[..., i * C:(i + 1) * C].any(-1) for i in range(-(-17 // C))], -1).sum(-1)
    assert blocks.max() <= topk and torch.triu(M.double(), 1).abs().max() == 0
    # a continuation: queries 11.. against all keys equal the rows of the full map
    P2 = moba_probs(q[:, 11:], k, block_size=C, topk=topk, start=11)
    assert max_abs(P2, P[:, :, 11:]) < F64_ATOL


def test_moba_mixer_decodes_and_continues():
    torch.manual_seed(0)
    m = seqmix.build_mixer("moba", **seqmix.mixer_entry("moba").example_config()).double().eval()
    x = torch.randn(2, 19, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, :7], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(7, 19)], 1)
    assert max_abs(steps, y) < F64_ATOL
    assert cache.floats() == 2 * m.state_size(19)
    phi = m.phi(x)
    # block sparse: row t has at most topk blocks of keys
    assert ((phi > 0).double().sum(-1) <= m.config.topk * m.config.chunk_size).all()
    with pytest.raises(ValueError, match="finite-state"):
        m.dsf(x)
    with pytest.raises(ValueError, match="seq_len"):
        m.state_size()


def test_moba_bad_input():
    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="'k'"):
        moba_probs(q, torch.randn(1, 6, 2, 4), block_size=2, topk=2)
    with pytest.raises(ValueError, match="block_size"):
        moba_probs(q, q, block_size=0, topk=2)
    with pytest.raises(ValueError, match="rope"):
        seqmix.build_mixer("moba", d_model=12, heads=2, n=6)
