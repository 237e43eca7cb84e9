"""seqmix.ops.memory_attention: the chunked interleaved attention of B'MOJO against its
explicit-mask reference, the masks (the index property of the interleaved layout), a brute
force per query, and bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from seqmix.ops.attention import attention_mask
from seqmix.ops.memory_attention import chunked_memory_attention, interleave_positions, memory_attention_mask, n_chunks, tile_mask
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err


def case(B=2, T=9, R=0, start=0, window=4, chunk=None, m=2, H=2, K=3, V=4, dtype=torch.float64, seed=0, p_valid=0.7):
    g = torch.Generator().manual_seed(seed)
    chunk = chunk or window
    G = n_chunks(start, T, chunk)
    t = dict(
        q=torch.randn(B, T, H, K, generator=g, dtype=dtype),
        k=torch.randn(B, T + R, H, K, generator=g, dtype=dtype),
        v=torch.randn(B, T + R, H, V, generator=g, dtype=dtype),
        k_mem=torch.randn(B, G, m, H, K, generator=g, dtype=dtype),
        v_mem=torch.randn(B, G, m, H, V, generator=g, dtype=dtype),
    )
    mem_valid = torch.rand(B, G, m, generator=g) < p_valid
    return t, dict(window=window, chunk=chunk, start=start, mem_valid=mem_valid)


# -- masks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("T,R,start,window,chunk,m", [(7, 0, 0, 3, 3, 2), (5, 2, 6, 4, 2, 1), (9, 3, 3, 4, 3, 0), (4, 1, 1, 1, 1, 3)])
def test_mask_follows_the_rules(T, R, start, window, chunk, m):
    mask = memory_attention_mask(T, T + R, window=window, chunk=chunk, n_mem=m, start=start)
    G = n_chunks(start, T, chunk)
    for i in range(T):
        p = start + i
        for j in range(G * m):
            assert bool(mask[i, j]) == (j // m == p // chunk - start // chunk), (i, j)
        for s in range(T + R):
            pos = start + T - (T + R) + s
            assert bool(mask[i, G * m + s]) == (0 <= p - pos < window), (i, s)


@pytest.mark.parametrize("L,window,m", list(itertools.product([1, 5, 8, 13], [1, 2, 4, 5], [0, 1, 3])))
def test_interleaved_window_is_the_index_property(L, window, m):
    """The paper's layout: [memory_0, chunk_0, memory_1, chunk_1, ...] with causal sliding-window
    attention of K = w + m. Restricted to raw queries it shows each raw token exactly its last w
    raw tokens and its own chunk's m memory tokens (the reference mask)."""
    raw, mem = interleave_positions(L, window, m)
    n = int(raw.max()) + 1
    band = attention_mask(n, window=window + m)  # SWA over the interleaved sequence
    keys = torch.cat([mem.flatten(), raw])
    assert torch.equal(band[raw][:, keys], memory_attention_mask(L, window=window, chunk=window, n_mem=m))


@pytest.mark.parametrize("window,chunk,m", [(4, 4, 2), (5, 2, 3), (5, 3, 0), (3, 1, 2), (1, 1, 1)])
def test_tile_window_is_the_reference_rule(window, chunk, m):
    """Inside a tile [r previous chunks of raw tokens, memory, chunk] the window K = w + m shows a
    query its last w raw tokens and all m memory slots, for any chunk <= window (padded spans)."""
    mask = tile_mask(window, chunk, m)
    r = math.ceil((window - 1) / chunk)
    for j in range(chunk):
        for i in range(r * chunk):  # raw span before the chunk: raw lag r·c + j - i
            assert bool(mask[j, i]) == (r * chunk + j - i < window)
        assert bool(mask[j, r * chunk : r * chunk + m].all())
        for i in range(chunk):
            assert bool(mask[j, r * chunk + m + i]) == (i <= j)


# -- the op --------------------------------------------------------------------------------


def brute_force(q, k, v, k_mem, v_mem, window, chunk, start, mem_valid):
    B, T, H, _ = q.shape
    Tk = k.shape[1]
    o = torch.zeros(B, T, H, v.shape[-1], dtype=q.dtype)
    for b, i, h in itertools.product(range(B), range(T), range(H)):
        p = start + i
        g = p // chunk - start // chunk
        keys = [(k_mem[b, g, j, h], v_mem[b, g, j, h]) for j in range(k_mem.shape[2]) if mem_valid[b, g, j]]
        keys += [(k[b, s, h], v[b, s, h]) for s in range(Tk) if 0 <= p - (start + T - Tk + s) < window]
        s = torch.stack([q[b, i, h] @ kk for kk, _ in keys]) / math.sqrt(q.shape[-1])
        o[b, i, h] = sum(pj * vv for pj, (_, vv) in zip(torch.softmax(s, 0), keys))
    return o


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_brute_force(mode):
    t, geo = case(T=7, R=2, start=5, window=3, chunk=2, m=2)
    o = chunked_memory_attention(**t, **geo, mode=mode)
    assert max_abs(o, brute_force(**t, **geo)) < F64_ATOL


GRID = [
    (T, R, start, w, c, m)
    for T, R, start, w, c, m in itertools.product([1, 6, 11], [0, 2], [0, 3, 8], [1, 4, 5], [1, 2, 4, 5], [0, 3])
    if c <= w and R <= start
]


@pytest.mark.parametrize("T,R,start,window,chunk,m", GRID)
def test_chunk_mode_equals_reference(T, R, start, window, chunk, m):
    t, geo = case(T=T, R=R, start=start, window=window, chunk=chunk, m=m)
    t = {n: x.requires_grad_(True) for n, x in t.items()}
    a = chunked_memory_attention(**t, **geo, mode="parallel")
    b = chunked_memory_attention(**t, **geo, mode="chunk")
    assert max_abs(a, b) < F64_ATOL
    w = torch.randn_like(a)
    ga = torch.autograd.grad((a * w).sum(), list(t.values()))
    gb = torch.autograd.grad((b * w).sum(), list(t.values()))
    for x, y in zip(ga, gb):
        if x.numel():  # (m = 0: empty memory tensors)
            assert max_abs(x, y) < F64_ATOL


def test_chunk_mode_float32_and_empty_memory():
    t, geo = case(T=13, R=3, start=7, window=5, chunk=3, m=4, dtype=torch.float32, p_valid=0.5)
    a = chunked_memory_attention(**t, **geo, mode="parallel")
    b = chunked_memory_attention(**t, **geo, mode="chunk")
    assert b.dtype == torch.float32 and rel_err(b, a) < F32_RTOL
    # no valid memory slot at all: plain sliding-window attention
    t, geo = case(T=9, window=3, m=2, p_valid=0.0)
    o = chunked_memory_attention(**t, **geo)
    from seqmix.ops import softmax_attention

    assert max_abs(o, softmax_attention(t["q"], t["k"], t["v"], window=3)) < F64_ATOL


def test_probs_are_the_reference_matrix():
    t, geo = case(T=6, window=3, chunk=3, m=2)
    o, p = chunked_memory_attention(**t, **geo, mode="parallel", return_probs=True)
    assert p.shape == (2, 2, 6, 2 * 2 + 6)
    assert max_abs(p.sum(-1), torch.ones_like(p.sum(-1))) < F64_ATOL
    assert bool((p[~memory_attention_mask(6, window=3, chunk=3, n_mem=2, mem_valid=geo["mem_valid"]).expand_as(p)] == 0).all())


def test_bad_input():
    t, geo = case(T=6, window=4, chunk=4, m=2)
    with pytest.raises(ValueError, match="chunk"):
        chunked_memory_attention(**t, **{**geo, "chunk": 5})
    with pytest.raises(ValueError, match="window"):
        chunked_memory_attention(**t, **{**geo, "window": 0, "chunk": 1})
    with pytest.raises(ValueError, match="mode"):
        chunked_memory_attention(**t, **geo, mode="flash")
    with pytest.raises(ValueError, match="k_mem"):
        chunked_memory_attention(**{**t, "k_mem": t["k_mem"][:, :1]}, **geo)
    with pytest.raises(ValueError, match="return_probs"):
        chunked_memory_attention(**t, **geo, mode="chunk", return_probs=True)
    with pytest.raises(ValueError, match="'q'"):
        chunked_memory_attention(**{**t, "q": torch.full_like(t["q"], float("nan"))}, **geo)
