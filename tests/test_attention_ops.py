"""seqmix.ops.attention (softmax attention: SDPA vs the masked-matrix reference, the mask,
the KV-cache step) and seqmix.ops.features (feature maps, Taylor features)."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.ops import (
    KVCache, apply_feature_map, attention_mask, attention_probs, attention_step, kv_cache_trim, softmax_attention,
    taylor_feature_dim, taylor_features,
)
from seqmix import Cache, build_mixer
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err


def qkv(B=2, Tq=9, Tk=None, H=3, K=4, V=5, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    Tk = Tq if Tk is None else Tk
    q = torch.randn(B, Tq, H, K, generator=g, dtype=dtype)
    k = torch.randn(B, Tk, H, K, generator=g, dtype=dtype)
    v = torch.randn(B, Tk, H, V, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def brute_force(q, k, v, scale, visible):
    """Per query, per head: softmax over the explicit list of visible keys (Python loops)."""
    B, Tq, H, _ = q.shape
    o = torch.zeros(B, Tq, H, v.shape[-1], dtype=q.dtype)
    for b in range(B):
        for i in range(Tq):
            keys = [j for j in range(k.shape[1]) if visible(b, i, j)]
            if not keys:
                continue
            for h in range(H):
                s = torch.stack([q[b, i, h] @ k[b, j, h] for j in keys]) * scale
                p = torch.softmax(s, 0)
                o[b, i, h] = sum(p_j * v[b, j, h] for p_j, j in zip(p, keys))
    return o


# -- the mask ------------------------------------------------------------------------------


@pytest.mark.parametrize("Tq,Tk,window,prefix", [(6, 6, None, 0), (6, 6, 3, 0), (2, 7, 3, 0), (5, 8, 2, 3), (4, 4, 1, 0)])
def test_mask_follows_the_rules(Tq, Tk, window, prefix):
    m = attention_mask(Tq, Tk, window=window, prefix=prefix)
    n_seq = Tk - prefix
    for i in range(Tq):
        p = n_seq - Tq + i  # queries are the last Tq sequence tokens
        for j in range(Tk):
            if j < prefix:
                expected = True
            else:
                s = j - prefix
                expected = s <= p and (window is None or p - s < window)
            assert bool(m[i, j]) == expected, (i, j)


def test_mask_key_valid_and_offset():
    kv = torch.tensor([[True, False, True, True], [False, True, True, True]])
    m = attention_mask(3, 4, offset=0, key_valid=kv)
    assert m.shape == (2, 1, 3, 4)
    base = attention_mask(3, 4, offset=0)
    assert torch.equal(m, base & kv[:, None, None, :])
    assert torch.equal(base, torch.ones(3, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("offset", [-3, -1, 0, 2, 4, 6, 9])
@pytest.mark.parametrize("window", [None, 1, 3])
def test_mask_follows_the_rules_at_any_offset(offset, window):
    Tq, Tk = 4, 7
    m = attention_mask(Tq, Tk, window=window, offset=offset)
    for i in range(Tq):
        p = offset + i
        for j in range(Tk):
            assert bool(m[i, j]) == (j <= p and (window is None or p - j < window)), (i, j)


@pytest.mark.parametrize("Tq,Tk,prefix", [(4, 7, 0), (7, 7, 0), (3, 6, 2), (5, 3, 0), (6, 5, 2)])
def test_rows_said_never_empty_see_a_key(Tq, Tk, prefix):
    """_visible leaves out the empty-row mask only where no row can be empty: checked on the mask itself for every
    offset (None included) and window."""
    from seqmix.ops.attention import _may_have_empty_rows, _visible

    for offset in [None, *range(-3, Tk + 2)]:
        for window in (None, 1, 2, 5):
            plain = attention_mask(Tq, Tk, window=window, prefix=prefix, offset=offset)
            mask, empty = _visible(Tq, Tk, window, prefix, offset, None, None)
            has_empty = bool((~plain.any(-1)).any())
            if not _may_have_empty_rows(Tq, Tk, prefix, offset, None):
                assert not has_empty and empty is None and torch.equal(mask, plain), (offset, window)
            else:
                assert torch.equal(empty[:, 0], ~plain.any(-1)) and torch.equal(mask, plain | empty), (offset, window)


@pytest.mark.parametrize("mode", ["parallel", "sdpa"])
def test_more_queries_than_keys_leave_the_first_rows_zero(mode):
    """With the default offset and Tq > Tk the first Tq − Tk queries see no key: their rows are 0, not NaN."""
    q, _, _ = qkv(Tq=4)
    _, k, v = qkv(Tq=2, seed=1)
    o = softmax_attention(q, k, v, mode=mode)
    assert torch.isfinite(o).all() and (o[:, :2] == 0).all() and (o[:, 2:] != 0).any()
    p = attention_probs(q, k)
    assert torch.isfinite(p).all() and (p[:, :, :2] == 0).all()
    assert torch.isfinite(softmax_attention(q, k, v, mode="parallel", softcap=5.0)).all()


def test_the_mask_is_kept_for_the_next_call_and_apart_in_inference_mode():
    from seqmix.ops import attention as A

    A._KEPT_MASKS.clear()
    first = A._visible(6, 9, 3, 0, None, None, torch.device("cpu"))
    assert A._visible(6, 9, 3, 0, None, None, torch.device("cpu"))[0] is first[0]
    assert A._visible(6, 9, 2, 0, None, None, torch.device("cpu"))[0] is not first[0]  # another window: another mask
    with torch.inference_mode():
        inf = A._visible(6, 9, 3, 0, None, None, torch.device("cpu"))[0]
    assert inf is not first[0] and inf.is_inference() and not first[0].is_inference()
    for n in range(A.MASK_KEEP_COUNT + 2):  # at most MASK_KEEP_COUNT kept
        A._visible(2, 3 + n, None, 0, 0, None, torch.device("cpu"))
    assert len(A._KEPT_MASKS) == A.MASK_KEEP_COUNT
    # a windowed attention run in inference mode, then with autograd: the gradient flows (no inference tensor saved)
    q, k, v = qkv(Tq=6, grad=True)
    with torch.inference_mode():
        softmax_attention(q.detach(), k.detach(), v.detach(), window=3)
    for mode in ("parallel", "sdpa"):  # (the explicit matrix saves the mask's use for backward)
        q.grad = None
        with torch.inference_mode():
            softmax_attention(q.detach(), k.detach(), v.detach(), window=3, mode=mode)
        softmax_attention(q, k, v, window=3, mode=mode).sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()


# -- modes agree ---------------------------------------------------------------------------


CASES = [
    dict(),
    dict(window=3),
    dict(window=1),
    dict(Tk=13),  # queries are the last 9 of 13 tokens (a cache prefill)
    dict(Tk=13, window=4),
    dict(Tk=12, prefix=3, window=4),  # memory tokens prefixed to a windowed sequence
]


def _call(q, k, v, mode, case, **kw):
    extra = {key: val for key, val in case.items() if key in ("window", "prefix")}
    return softmax_attention(q, k, v, mode=mode, scale=0.7, **extra, **kw)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "causal")
def test_sdpa_equals_reference_with_grads_float64(case):
    q, k, v = qkv(Tk=case.get("Tk"), grad=True)
    outs = {}
    for mode in ("parallel", "sdpa"):
        o = _call(q, k, v, mode, case)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(3), dtype=o.dtype)
        outs[mode] = (o.detach(), torch.autograd.grad((o * w).sum(), (q, k, v)))
    assert max_abs(outs["sdpa"][0], outs["parallel"][0]) < F64_ATOL
    for a, b in zip(outs["sdpa"][1], outs["parallel"][1]):
        assert max_abs(a, b) < F64_ATOL


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "causal")
def test_reference_equals_brute_force(case):
    q, k, v = qkv(Tk=case.get("Tk"))
    window, prefix = case.get("window"), case.get("prefix", 0)
    Tq, Tk = q.shape[1], k.shape[1]

    def visible(b, i, j):
        if j < prefix:
            return True
        p, s = (Tk - prefix) - Tq + i, j - prefix
        return s <= p and (window is None or p - s < window)

    assert max_abs(_call(q, k, v, "parallel", case), brute_force(q, k, v, 0.7, visible)) < F64_ATOL


def test_float32_sdpa_vs_reference():
    q, k, v = qkv(Tq=40, dtype=torch.float32)
    for case in ({}, {"window": 7}):
        a = softmax_attention(q, k, v, mode="sdpa", **case)
        b = softmax_attention(q, k, v, mode="parallel", **case)
        assert a.dtype == torch.float32
        assert rel_err(a, b) < F32_RTOL


def test_default_scale_is_inverse_sqrt_K():
    q, k, v = qkv()
    a = softmax_attention(q, k, v, mode="parallel")
    b = softmax_attention(q, k, v, mode="parallel", scale=1 / math.sqrt(q.shape[-1]))
    c = softmax_attention(q, k, v, mode="parallel", scale=1.0)
    assert max_abs(a, b) == 0 and max_abs(a, c) > 1e-3


def test_probs_rows_and_output():
    q, k, v = qkv()
    P = attention_probs(q, k, scale=0.7, window=4)
    assert P.shape == (2, 3, 9, 9)
    assert max_abs(P.sum(-1), torch.ones(2, 3, 9, dtype=P.dtype)) < F64_ATOL
    assert torch.triu(P, 1).abs().max() == 0 and torch.tril(P, -4).abs().max() == 0
    o = torch.einsum("bhts,bshv->bthv", P, v)
    assert max_abs(o, softmax_attention(q, k, v, scale=0.7, window=4, mode="sdpa")) < F64_ATOL


def test_queries_without_keys_get_zero_and_finite_grads():
    """B'MOJO's invalid memory slots: a key_valid mask may leave a query with no key at all."""
    q, k, v = qkv(Tq=5, Tk=5, grad=True)
    kv = torch.ones(2, 5, dtype=torch.bool)
    kv[0, :2] = False  # batch 0: queries 0 and 1 see nothing (window 2)
    for mode in ("parallel", "sdpa"):
        o = softmax_attention(q, k, v, window=2, key_valid=kv, mode=mode)
        assert o[0, :2].abs().max() == 0 and o[0, 2:].abs().min() > 0
        grads = torch.autograd.grad(o.sum(), (q, k, v))
        assert all(bool(torch.isfinite(g).all()) for g in grads)
    P = attention_probs(q, k, window=2, key_valid=kv)
    assert P[0, :, :2].abs().max() == 0
    assert max_abs(P[0, :, 2:].sum(-1), torch.ones(3, 3, dtype=P.dtype)) < F64_ATOL


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, 1, 3, 6])
def test_step_loop_equals_parallel_and_cache_is_bounded(window):
    q, k, v = qkv(Tq=11)
    ref = softmax_attention(q, k, v, mode="parallel", window=window, scale=0.5)
    kc = vc = None
    outs = []
    for q_t, k_t, v_t in zip(q.unbind(1), k.unbind(1), v.unbind(1)):
        o, kc, vc = attention_step(q_t, k_t, v_t, kc, vc, window=window, scale=0.5)
        outs.append(o)
        if window is not None:
            assert kc.shape[1] <= window - 1 and vc.shape[1] == kc.shape[1]
    assert max_abs(torch.stack(outs, 1), ref) < F64_ATOL
    assert kc.shape[1] == (11 if window is None else min(11, window - 1))


@pytest.mark.parametrize("window,Hkv,Tk", [(None, 3, 9), (4, 3, 9), (None, 1, 12)])
def test_unchecked_call_equals_the_checked_one(window, Hkv, Tk):
    # check_shapes=False (the attention mixers' own q, k, v) skips the argument checks, nothing else: the same
    # output for the plain causal mask (SDPA), a window and more keys than queries (the masked path)
    q, k, v = qkv(Tq=9, Tk=Tk, H=3)
    k, v = k[:, :, :Hkv], v[:, :, :Hkv]
    for mode in ("auto", "parallel"):
        kw = dict(scale=0.5, window=window, mode=mode)
        assert torch.equal(softmax_attention(q, k, v, check_shapes=False, **kw), softmax_attention(q, k, v, **kw))
    with pytest.raises(ValueError, match="argument 'k'"):  # the checked call still names a wrong argument
        softmax_attention(q, k[..., :2], v)


def test_kv_cache_unchecked_appends_equal_the_checked_ones():
    # KVCache.append(check_shapes=False): the same buffers, views and counts as the checked append, from an empty
    # cache (the new tokens become the buffers' first) through a refill past the capacity
    g = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(2, T, 3, 4, generator=g), torch.randn(2, T, 3, 5, generator=g)) for T in (5, 1, 70, 2)]
    for window in (None, 6):
        a, b = KVCache(window=window), KVCache(window=window)
        for k, v in chunks:
            ka, va = a.append(k, v)
            kb, vb = b.append(k, v, check_shapes=False)
            assert torch.equal(ka, kb) and torch.equal(va, vb)
            assert (a.seen, len(a), a.capacity) == (b.seen, len(b), b.capacity)
        keys = torch.cat([k for k, _ in chunks], 1)
        assert torch.equal(b.keys, keys if window is None else keys[:, -(window - 1):])
    with pytest.raises(ValueError, match="argument 'v'"):
        KVCache().append(chunks[0][0], chunks[0][1][:, :2])


def test_kv_cache_trim():
    k, v = torch.randn(2, 7, 3, 4), torch.randn(2, 7, 3, 5)
    assert kv_cache_trim(k, v, None)[0] is k
    kt, vt = kv_cache_trim(k, v, 4)
    assert torch.equal(kt, k[:, -3:]) and torch.equal(vt, v[:, -3:])
    assert kv_cache_trim(k, v, 1)[0].shape[1] == 0


# -- bad input -----------------------------------------------------------------------------


def test_bad_input_names_the_argument():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="'k'.*width"):
        softmax_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="'k'.*width"):
        attention_step(q[:, 0], k[:, 0, :, :3], v[:, 0])
    for w in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="'window'"):
            softmax_attention(q, k, v, window=w)
        with pytest.raises(ValueError, match="'window'"):
            attention_mask(4, window=w)
    with pytest.raises(ValueError, match="'window'"):
        attention_step(q[:, 0], k[:, 0], v[:, 0], window=0)
    with pytest.raises(ValueError, match="mode"):
        softmax_attention(q, k, v, mode="chunk")
    with pytest.raises(ValueError, match="'scale'"):
        softmax_attention(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="'prefix'"):
        attention_mask(3, 4, prefix=5)
    with pytest.raises(ValueError, match="'key_valid'"):
        softmax_attention(q, k, v, key_valid=torch.ones(2, 9))
    with pytest.raises(ValueError, match="'v'"):
        softmax_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match="'q'"):
        softmax_attention(q.nan_to_num().fill_(float("nan")), k, v)
    with pytest.raises(ValueError, match="'k_cache'"):
        attention_step(q[:, 0], k[:, 0], v[:, 0], torch.zeros(2, 3, 3, 7), torch.zeros(2, 3, 3, 5))


# -- feature maps --------------------------------------------------------------------------


@pytest.mark.parametrize("P", [0, 1, 2, 3, 5])
def test_taylor_features_give_the_truncated_exponential(P):
    g = torch.Generator().manual_seed(P)
    x, y = torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    fx, fy = taylor_features(x, P), taylor_features(y, P)
    assert fx.shape == (6, taylor_feature_dim(3, P)) == (6, sum(3**p for p in range(P + 1)))
    s = (x * y).sum(-1)
    expected = sum(s**p / math.factorial(p) for p in range(P + 1))
    assert max_abs((fx * fy).sum(-1), expected) < 1e-12


def test_feature_maps_by_name():
    x = torch.randn(4, 5, dtype=torch.float64)
    assert torch.equal(apply_feature_map("identity", x), x)
    assert bool((apply_feature_map("elu1", x) > 0).all()) and max_abs(apply_feature_map("elu1", x), torch.nn.functional.elu(x) + 1) == 0
    assert max_abs(apply_feature_map("exp", x), x.exp()) == 0
    assert max_abs(apply_feature_map("relu", x), x.clamp(min=0)) == 0
    with pytest.raises(ValueError, match="feature map"):
        apply_feature_map("cosine", x)
    with pytest.raises(ValueError, match="'order'"):
        taylor_features(x, -1)


def test_unchecked_append_still_compares_the_cache_batch():
    # check_shapes=False skips the first append's checks only: a later append of another batch than the buffers'
    # is refused by name instead of broadcast into them (a caller continuing a cache with a different batch)
    kv = KVCache()
    kv.append(torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 5), check_shapes=False)
    with pytest.raises(ValueError, match="argument 'k'.*the cache's B, Hkv, K"):
        kv.append(torch.randn(1, 3, 3, 4), torch.randn(1, 3, 3, 5), check_shapes=False)
    from seqmix.mixers.base import Cache
    from seqmix.models.lm import LanguageModel, ModelConfig

    torch.manual_seed(0)
    m = LanguageModel(ModelConfig(mixer="softmax_attention", mixer_kwargs=dict(heads=4), d_model=16, n_layers=2,
                                  vocab_size=50, max_seq_len=64)).eval()
    c = Cache()
    with torch.no_grad():
        m.hidden(torch.randint(0, 50, (2, 5)), c)
        with pytest.raises(ValueError, match="KVCache.append: argument 'k'"):
            m.hidden(torch.randint(0, 50, (1, 3)), c, start=5)


def test_kv_cache_head_first_after_a_step_is_the_fresh_slice():
    # head_first() reuses the views append_step made for the same buffers, start and end: each equals the fresh slice
    # of the buffers (the same storage), with and without a window, after a refill, map_ (beam search) and a copy
    import copy
    import pickle

    g = torch.Generator().manual_seed(0)
    for window in (None, 4):
        kv = KVCache(window=window)
        kv.append(torch.randn(2, 3, 3, 4, generator=g), torch.randn(2, 3, 3, 5, generator=g))
        for step in range(kv.BLOCK + 8):  # past the capacity: append_step returns None, append refills
            k, v = torch.randn(2, 1, 3, 4, generator=g), torch.randn(2, 1, 3, 5, generator=g)
            if kv.append_step(k, v) is None:
                kv.append(k, v)
            hk, hv = kv.head_first()
            fresh_k, fresh_v = kv.k[:, :, kv.start:kv.end], kv.v[:, :, kv.start:kv.end]
            assert hk.shape == fresh_k.shape and torch.equal(hk, fresh_k) and torch.equal(hv, fresh_v)
            assert hk.data_ptr() == fresh_k.data_ptr() and hv.data_ptr() == fresh_v.data_ptr()
            if kv._views is not None:  # the kept views are of the present buffers (none of replaced ones)
                assert kv._views[0] is kv.k
            if step == 5:
                kv.map_(lambda t: t.index_select(0, torch.tensor([1, 0])))
                assert torch.equal(kv.head_first()[0], kv.k[:, :, kv.start:kv.end])
        state = {k: v for k, v in kv.__getstate__().items() if k not in ("_views", "_inference")}
        older = KVCache.__new__(KVCache)  # a cache pickled before the views and the flag were kept
        older.__setstate__(state)
        for other in (copy.deepcopy(kv), pickle.loads(pickle.dumps(kv)), older):
            ok, ov = other.head_first()
            assert torch.equal(ok, kv.head_first()[0]) and ok.untyped_storage().data_ptr() == other.k.untyped_storage().data_ptr()
            assert torch.equal(ov, kv.head_first()[1])


def test_kv_cache_inference_buffers_outside_inference_mode():
    # buffers made in inference mode cannot be written in place outside it: append_step declines (None) and append
    # makes new buffers, as before the flag was kept; inside inference mode the step writes in place
    with torch.inference_mode():
        kv = KVCache()
        kv.append(torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4))
        kv.append(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4))  # (the prefill's own tensors, full: moved into buffers)
        assert kv.append_step(torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4)) is not None
    k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 2, 4)
    assert kv.append_step(k, v) is None
    keys, _ = kv.append(k, v)
    assert keys.shape[1] == 6 and torch.equal(keys[:, -1], k[:, 0]) and not kv.k.is_inference()
    kv.append(k, v)  # (the cat's buffers are full: this append makes buffers with free slots)
    assert kv.append_step(k, v) is not None and len(kv) == 8


def test_kv_cache_keeps_a_prefills_own_keys_without_a_copy():
    # a prefill's keys and values that are whole tensors become the buffers as they are (no copy); full, so the first
    # step moves them into buffers with BLOCK slots of room (not a doubling of a long prompt's); the numbers are those
    # of a cache that copied them
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 40, 3, 4, generator=g), torch.randn(2, 40, 3, 5, generator=g)
    kv, ref = KVCache(), KVCache()
    kv.append(k, v, take=True)
    ref.append(k.clone(), v.clone())
    kept = KVCache()
    kept.append(k, v)  # (not given away: copied, so that the caller may write into its tensors afterwards)
    assert kept.k.data_ptr() != k.data_ptr() and kept.capacity == 40 + KVCache.BLOCK
    ref_copy = KVCache()
    ref_copy.append(torch.cat([k, k], 2)[:, :, :3], torch.cat([v, v], 2)[:, :, :3], take=True)  # views of larger ones: copied
    assert kv.k.data_ptr() == k.data_ptr() and kv.v.data_ptr() == v.data_ptr() and kv.capacity == 40
    assert ref_copy.capacity == 40 + KVCache.BLOCK and ref_copy.k.untyped_storage().nbytes() == ref_copy.k.numel() * 4
    for step in range(3):
        k1, v1 = torch.randn(2, 1, 3, 4, generator=g), torch.randn(2, 1, 3, 5, generator=g)
        got = kv.append_step(k1, v1)
        if got is None:
            assert step == 0  # only the first step finds the buffers full
            keys, values = kv.append(k1, v1)
            got = keys.transpose(1, 2), values.transpose(1, 2)
            assert kv.capacity == 41 + KVCache.BLOCK and kv.k.data_ptr() != k.data_ptr()
        ck, cv = ref_copy.append(k1, v1)
        assert torch.equal(got[0], ck.transpose(1, 2)) and torch.equal(got[1], cv.transpose(1, 2))
    assert torch.equal(k, ref.keys) and torch.equal(v, ref.values)  # the prefill's tensors were never written into
    windowed = KVCache(window=8)
    windowed.append(k, v, take=True)
    assert windowed.k.data_ptr() != k.data_ptr() and len(windowed) == 7
    # beam search reorders (map_) a prefill's exact buffers before the first step: they still grow by BLOCK, not doubled
    long_k, long_v = torch.randn(2, 300, 3, 4, generator=g), torch.randn(2, 300, 3, 5, generator=g)  # (2·300 > 301 + BLOCK)
    for fn in (lambda t: t.index_select(0, torch.tensor([1, 0])), torch.Tensor.detach):
        cache = KVCache()
        cache.append(long_k.clone(), long_v.clone(), take=True)
        cache.map_(fn)
        cache.append(k1, v1)
        assert cache.capacity == 301 + KVCache.BLOCK


def test_softmax_attention_prefill_hands_its_cache_keys_of_their_own():
    # q and k rotated as one tensor elsewhere; a prefill into an empty cache rotates k on its own, so that the cache keeps
    # it without a copy and without the queries' storage
    torch.manual_seed(0)
    m = build_mixer("softmax_attention", d_model=32, heads=4, kv_heads=2, rope=True).eval()
    x = torch.randn(2, 12, 32)
    cache = Cache()
    with torch.no_grad():
        y = m(x, cache=cache)
        kv = cache.get(m)["kv"]
        assert kv.k.untyped_storage().nbytes() == kv.k.numel() * kv.k.element_size()
        assert torch.equal(y, m(x))
        x1 = torch.randn(2, 1, 32)
        step = m(x1, cache=cache)
        m.mode = "parallel"
        whole = m(torch.cat([x, x1], 1))
    assert max_abs(step[:, 0], whole[:, -1]) < 1e-5
