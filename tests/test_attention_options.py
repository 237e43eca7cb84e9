"""Softmax attention's options of real models and its KV cache: RoPE (full,
partial, interleaved), grouped kv heads (GQA / MQA), qk-norm, the output gate, biases, the scale,
the head width, the sliding window; the rotary op; the KV cache in preallocated buffers; and
exactness against transformers' own attention modules built from tiny configs (nothing is
downloaded).

Each option is checked against ``reference`` below: the whole mixer written out with loops
over heads and channel pairs, from the mixer's own weights."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import seqmix
from seqmix import Cache
from seqmix.ops import KVCache, attention_decode, attention_step, rotary, rotary_reference, softmax_attention
from tolerances import F32_RTOL, F64_ATOL, MP_RTOL, max_abs, rel_err

D = 16


def build(dtype=torch.float64, seed=0, **cfg):
    """A softmax mixer (d 16, 4 heads of width 4 unless cfg says otherwise); the qk-norm weights
    are made random too (their init is ones: a test could not see them)."""
    torch.manual_seed(seed)
    base = {"d_model": D, "heads": 4} if "head_dim" in cfg else {"d_model": D, "n": 16, "heads": 4}
    m = seqmix.build_mixer("softmax_attention", **{**base, **cfg})
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return m.to(dtype).eval()


def x_of(T, dtype=torch.float64, seed=1, batch=2):
    return torch.randn(batch, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _linear(x, lin):
    return x @ lin.weight.T + (lin.bias if lin.bias is not None else 0)


def _rms(z, w, eps):
    return z / torch.sqrt((z * z).mean(-1, keepdim=True) + eps) * w


def _qk_norm(z, norm, c):
    """The qk-norm written out: RMSNorm (kind "rms") or LayerNorm with a weight and a bias (kind "layer")."""
    if c.qk_norm_kind == "rms":
        return _rms(z, norm.weight, c.qk_norm_eps)
    zc = z - z.mean(-1, keepdim=True)
    return zc / torch.sqrt((zc * zc).mean(-1, keepdim=True) + c.qk_norm_eps) * norm.weight + norm.bias


def _rope(z, R, theta, interleaved):
    """z [B, T, heads, K]: pair j of the token at position t turned by t·theta^(-2j/R), pair by pair."""
    out = z.clone()
    t = torch.arange(z.shape[1], dtype=torch.float64)[None, :, None]
    for j in range(R // 2):
        a, b = (2 * j, 2 * j + 1) if interleaved else (j, j + R // 2)
        ang = t * theta ** (-2.0 * j / R)
        out[..., a] = z[..., a] * torch.cos(ang) - z[..., b] * torch.sin(ang)
        out[..., b] = z[..., a] * torch.sin(ang) + z[..., b] * torch.cos(ang)
    return out


def reference(m, x, drop=None):
    """The mixer written out in float64: projections, qk-norm, RoPE, scores head by head (query
    head h reads kv head h // (heads / kv_heads)), the causal (windowed) mask, softmax, the gate, W_o.
    ``drop``: (mask of the probabilities [B, H, T, T], mask of the output [B, T, d]), each entry 0 or
    1/(1 - p): dropout with those draws (training)."""
    c, x = m.config, x.double()
    m = copy.deepcopy(m).double()
    B, T, _ = x.shape
    H, Hkv, K, V = m.heads, m.kv_heads, m.head_qk, m.head_v
    qk = _linear(x, m.W_qk)
    q, k, v = qk[..., : H * K], qk[..., H * K :], _linear(x, m.W_v)
    if c.qk_norm == "full":
        q, k = _qk_norm(q, m.q_norm, c), _qk_norm(k, m.k_norm, c)
    q, k, v = q.reshape(B, T, H, K), k.reshape(B, T, Hkv, K), v.reshape(B, T, Hkv, V)
    if c.qk_norm == "head":
        q, k = _qk_norm(q, m.q_norm, c), _qk_norm(k, m.k_norm, c)
    if c.rope:
        R = c.rotary_dim or K
        q, k = _rope(q, R, c.rope_theta, c.rope_interleaved), _rope(k, R, c.rope_theta, c.rope_interleaved)
    s = {"sqrt": 1 / math.sqrt(K), "none": 1.0}.get(c.scale, c.scale)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = (j <= i) & ((i - j < c.window) if c.window else True)
    o = torch.zeros(B, T, H, V, dtype=x.dtype)
    for h in range(H):
        g = h // (H // Hkv)
        scores = torch.einsum("btk,bsk->bts", q[:, :, h], k[:, :, g]) * s
        p = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1)
        if drop is not None:
            p = p * drop[0][:, h]
        o[:, :, h] = torch.einsum("bts,bsv->btv", p, v[:, :, g])
    if c.output_gate:
        o = o * torch.sigmoid(_linear(x, m.W_g)).reshape(B, T, H, V)
    y = _linear(o.reshape(B, T, H * V), m.W_o) if c.output_projection else o.reshape(B, T, H * V)
    return y if drop is None else y * drop[1]


OPTIONS = {
    "rope": dict(rope=True),
    "rope_partial": dict(rope=True, rotary_dim=2),
    "rope_interleaved_theta": dict(rope=True, rope_interleaved=True, rope_theta=50.0),
    "gqa": dict(kv_heads=2),
    "mqa": dict(kv_heads=1),
    "qk_norm_head": dict(qk_norm="head"),
    "qk_norm_full": dict(qk_norm="full", qk_norm_eps=1e-3),
    "qk_layernorm_head": dict(qk_norm="head", qk_norm_kind="layer"),  # Phi's qk_layernorm
    "qk_layernorm_full": dict(qk_norm="full", qk_norm_kind="layer", qk_norm_eps=1e-3),
    "output_gate": dict(output_gate=True),
    "qkv_bias": dict(qkv_bias=True),
    "out_bias": dict(out_bias=True),
    "bias_all": dict(bias=True),
    "scale": dict(scale=0.3),
    "head_dim": dict(head_dim=6, kv_heads=2),
    "window": dict(window=3),
    "all": dict(kv_heads=2, rope=True, rotary_dim=2, qk_norm="head", output_gate=True, window=5, qkv_bias=True, out_bias=True, scale=0.4),
    "all_mqa": dict(kv_heads=1, head_dim=6, rope=True, rope_interleaved=True, qk_norm="full", output_gate=True, window=4, bias=True),
}
IDS = list(OPTIONS)


@pytest.mark.parametrize("name", IDS)
def test_option_equals_the_written_out_reference(name):
    m = build(**OPTIONS[name])
    x = x_of(11)
    y_ref = reference(m, x)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL, mode
    mf = build(torch.float32, **OPTIONS[name])
    for mode in mf.modes:
        mf.mode = mode
        y = mf(x.float())
        assert y.dtype == torch.float32 and rel_err(y, reference(mf, x.float())) < F32_RTOL, mode


@pytest.mark.parametrize("name", IDS)
@pytest.mark.parametrize("grad", [False, True], ids=["buffers", "autograd"])
def test_decoding_and_carry_equal_the_full_forward(name, grad):
    """Step by step (T = 1, positions from the cache) and split-and-carry, in the preallocated
    buffers (no grad) and in the functional path autograd needs."""
    m = build(**OPTIONS[name])
    T = 13
    x = x_of(T)
    m.mode = "parallel"
    with torch.set_grad_enabled(grad):
        y_full = m(x)
        cache = Cache()
        steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
        assert max_abs(steps, y_full) < F64_ATOL
        assert cache.floats() == 2 * m.state_size(T)
        for mode in m.modes:
            m.mode = mode
            for cut in (1, 6, T - 2):
                c = Cache()
                y = torch.cat([m(x[:, :cut], cache=c), m(x[:, cut : cut + 1], cache=c), m(x[:, cut + 1 :], cache=c)], 1)
                assert max_abs(y, y_full) < F64_ATOL, (mode, cut)
    if grad:  # gradients flow through the cached keys and values
        g = torch.autograd.grad(steps.sum(), m.W_qk.weight)[0]
        assert max_abs(g, torch.autograd.grad(y_full.sum(), m.W_qk.weight)[0]) < F64_ATOL


@pytest.mark.parametrize("name", ["all", "all_mqa"])
def test_options_under_bf16_autocast(name):
    """Every option together under bf16 autocast, full forward in each mode and decoding through
    the KV cache: within MP_RTOL of float32 (the qk-norm's RMSNorm runs in float32, RoPE too)."""
    m = build(torch.float32, **OPTIONS[name])
    x = x_of(20, torch.float32)
    y32 = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        for mode in m.modes:
            m.mode = mode
            assert rel_err(m(x).float(), y32) < MP_RTOL[torch.bfloat16], mode
        cache = Cache()
        steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(20)], 1)
        assert rel_err(steps.float(), y32) < MP_RTOL[torch.bfloat16]


@pytest.mark.parametrize("name", ["rope", "rope_partial", "gqa", "all", "all_mqa"])
def test_phi_reproduces_the_output(name):
    m = build(**OPTIONS[name])
    x = x_of(10)
    values, mixed = m.core(x)
    phi = m.phi(x)
    assert phi.shape == (2, m.heads, 10, 10) and values.shape[2] == m.heads
    assert max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed) < F64_ATOL
    assert max_abs(m._gated_readout(torch.einsum("bmts,bsmp->btmp", phi, values), x), reference(m, x)) < F64_ATOL
    assert torch.triu(phi, 1).abs().max() == 0


def test_rope_scores_depend_on_the_offset_only():
    """With RoPE (no qk-norm), shifting every position by 5 leaves the attention unchanged: the
    cache's positions continue from the prefix, and a second sequence at offset 0 agrees."""
    m = build(rope=True)
    q, k, _ = m._qkv(x_of(6))
    q5, k5, _ = m._qkv(x_of(6), start=5)
    assert max_abs(torch.einsum("bthk,bshk->bhts", q, k), torch.einsum("bthk,bshk->bhts", q5, k5)) < F64_ATOL
    assert max_abs(q, q5) > 1e-3


def test_gqa_cache_holds_kv_heads_and_state_size():
    m = build(kv_heads=1, head_dim=6)
    cache = Cache()
    with torch.no_grad():
        m(x_of(7), cache=cache)
    kv = cache.get(m)["kv"]
    assert kv.keys.shape == (2, 7, 1, 6) and kv.values.shape == (2, 7, 1, 6)
    assert m.state_size(7) == 7 * 1 * (6 + 6) and cache.floats() == 2 * m.state_size(7)
    assert cache.nbytes() == 8 * cache.floats()
    assert m.W_qk.out_features == (4 + 1) * 6 and m.W_v.out_features == 6 and m.W_o.in_features == 4 * 6


def test_dsf_with_grouped_heads_and_rope():
    """The Taylor DSF (Lemma 1) of a mixer with RoPE, qk-norm and grouped kv heads: with
    projections it maps x to an approximation of y; without, it is the Taylor kernel of phi's scores."""
    m = build(kv_heads=2, rope=True, qk_norm="head", scale=0.2)
    x = x_of(6)
    y = m.dsf(x, taylor_order=6, projections=True).evaluate(x)
    assert rel_err(y, m(x)) < 1e-3
    with pytest.raises(ValueError, match="output_gate"):
        build(output_gate=True).dsf(x, projections=True)
    with pytest.raises(ValueError, match="bias"):
        build(qkv_bias=True).dsf(x, projections=True)


@pytest.mark.parametrize(
    "cfg,field",
    [
        ({"kv_heads": 3}, "kv_heads"),
        ({"kv_heads": 0}, "kv_heads"),
        ({"rope": True, "rotary_dim": 3}, "rotary_dim"),
        ({"rope": True, "rotary_dim": 6}, "rotary_dim"),
        ({"rotary_dim": 2}, "rotary_dim"),
        ({"rope": True, "n": 12}, "rotary_dim"),  # head dim 3: odd
        ({"rope": True, "rope_theta": 1.0}, "rope_theta"),
        ({"qk_norm": "layer"}, "qk_norm"),
        ({"qk_norm": "head", "qk_norm_kind": "group"}, "qk_norm_kind"),
        ({"qk_norm_eps": 0.0}, "qk_norm_eps"),
        ({"head_dim": 6, "n": 16}, "head_dim"),
        ({"head_dim": 6, "output_projection": False}, "output_projection"),
        ({"qkv_bias": "maybe"}, "qkv_bias"),
    ],
)
def test_bad_config_names_the_field(cfg, field):
    with pytest.raises(ValueError, match=field):
        seqmix.build_mixer("softmax_attention", **{"d_model": D, "heads": 4, **({} if "head_dim" in cfg and "n" not in cfg else {"n": 16}), **cfg})


@pytest.mark.parametrize("mode", ["parallel", "sdpa"])
@pytest.mark.parametrize("name", ["gqa", "all"])
def test_dropout_equals_the_reference_with_the_same_draws(name, mode):
    """attn_dropout and out_dropout in training: the probabilities, then the output, each dropped out by one
    draw of torch's generator (as transformers' attention modules draw them), equal the written-out mixer with
    those draws as masks; in eval the dropout is the identity (the mixer without it)."""
    p, q = 0.3, 0.2
    m = build(**OPTIONS[name], attn_dropout=p, out_dropout=q)
    m.mode = mode
    x = x_of(9)
    torch.testing.assert_close(m(x), reference(m, x), rtol=0, atol=F64_ATOL)  # eval
    m.train()
    torch.manual_seed(3)
    y = m(x)
    torch.manual_seed(3)  # the same draws, in the same order, as masks
    ones = torch.ones(2, m.heads, 9, 9, dtype=torch.float64)
    drop = (torch.nn.functional.dropout(ones, p), torch.nn.functional.dropout(torch.ones(2, 9, D, dtype=torch.float64), q))
    assert 0 < int((drop[0] == 0).sum()) < drop[0].numel()  # some entries dropped, not all
    torch.testing.assert_close(y, reference(m, x, drop), rtol=0, atol=F64_ATOL)
    assert max_abs(y, reference(m, x)) > 1e-3  # the draws matter: the check can fail
    torch.manual_seed(4)
    assert max_abs(m(x), y) > 1e-3  # another seed, other draws


def test_dropout_options_are_checked():
    for field, bad in (("attn_dropout", 1.0), ("attn_dropout", -0.1), ("out_dropout", 1.5)):
        with pytest.raises(ValueError, match=field):
            seqmix.build_mixer("softmax_attention", d_model=D, heads=4, **{field: bad})
    q = torch.randn(1, 4, 2, 4, dtype=torch.float64)
    for bad in (1.0, -0.5, "0.1", True):
        with pytest.raises(ValueError, match="dropout_p"):
            softmax_attention(q, q, q, dropout_p=bad)


# -- the ops: rotary, grouped heads, the KV cache ---------------------------------------------


@pytest.mark.parametrize("R,interleaved", [(None, False), (None, True), (4, False), (2, True)])
def test_rotary_equals_its_reference(R, interleaved):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, 6, generator=g, dtype=torch.float64)
    for pos in (torch.arange(7), torch.arange(7) + 100, torch.randint(0, 1000, (2, 7), generator=g)):
        a = rotary(x, pos, rotary_dim=R, theta=500.0, interleaved=interleaved)
        assert max_abs(a, rotary_reference(x, pos, rotary_dim=R, theta=500.0, interleaved=interleaved)) < 1e-12
        if R is not None:
            assert torch.equal(a[..., R:], x[..., R:])  # partial: the rest passes
        assert max_abs(a.norm(dim=-1), x.norm(dim=-1)) < 1e-12  # a rotation
    xf = x.float()
    assert rel_err(rotary(xf, pos, rotary_dim=R, interleaved=interleaved), rotary_reference(x, pos, rotary_dim=R, interleaved=interleaved)) < F32_RTOL


def test_rotary_conventions_differ_by_a_permutation():
    """GPT-J's interleaved pairs are GPT-NeoX's halves after permuting the channels."""
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    perm = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])  # interleaved channel order -> halves
    pos = torch.arange(5)
    assert max_abs(rotary(x, pos, interleaved=True)[..., perm], rotary(x[..., perm], pos)) < 1e-12


def test_rotary_bad_input():
    x = torch.randn(1, 4, 2, 6)
    for R in (3, 8, 0, True):
        with pytest.raises(ValueError, match="'rotary_dim'"):
            rotary(x, torch.arange(4), rotary_dim=R)
    with pytest.raises(ValueError, match="'positions'"):
        rotary(x, torch.arange(4.0))
    with pytest.raises(ValueError, match="'positions'"):
        rotary(x, torch.arange(5))
    with pytest.raises(ValueError, match="'theta'"):
        rotary(x, torch.arange(4), theta=1.0)


@pytest.mark.parametrize("Hkv", [1, 2, 6])
def test_grouped_kv_heads_equal_repeated_heads(Hkv):
    g = torch.Generator().manual_seed(Hkv)
    q = torch.randn(2, 9, 6, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 9, Hkv, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 9, Hkv, 5, generator=g, dtype=torch.float64)
    G = 6 // Hkv
    k_rep = torch.stack([k[:, :, h // G] for h in range(6)], 2)
    v_rep = torch.stack([v[:, :, h // G] for h in range(6)], 2)
    for window in (None, 3):
        ref = softmax_attention(q, k_rep, v_rep, mode="parallel", window=window)
        for mode in ("parallel", "sdpa"):
            assert max_abs(softmax_attention(q, k, v, mode=mode, window=window), ref) < F64_ATOL, (mode, window)
        kc = vc = None
        outs = []
        for t in range(9):
            o, kc, vc = attention_step(q[:, t], k[:, t], v[:, t], kc, vc, window=window)
            outs.append(o)
        assert max_abs(torch.stack(outs, 1), ref) < F64_ATOL
        assert kc.shape[2] == Hkv
    with pytest.raises(ValueError, match="'k'.*heads"):
        softmax_attention(q, k[:, :, :1].expand(2, 9, 4, 4), v[:, :, :1].expand(2, 9, 4, 5))


@pytest.mark.parametrize("window", [None, 1, 2, 5, 80])
def test_kv_cache_appends_in_place_with_bounded_copies(window):
    """KVCache step by step equals the functional step (torch.cat); its buffers grow by
    doubling (or stay bounded with a window), so 200 appends reallocate O(log) times."""
    g = torch.Generator().manual_seed(0)
    T = 200
    q = torch.randn(2, T, 4, 3, generator=g, dtype=torch.float64)
    k = torch.randn(2, T, 2, 3, generator=g, dtype=torch.float64)
    v = torch.randn(2, T, 2, 5, generator=g, dtype=torch.float64)
    kv, kc, vc = KVCache(window), None, None
    allocs, buf = 0, None
    for t in range(T):
        keys, vals = kv.append(k[:, t : t + 1], v[:, t : t + 1])
        if kv.k is not buf:
            allocs, buf = allocs + 1, kv.k
        o, kc, vc = attention_step(q[:, t], k[:, t], v[:, t], kc, vc, window=window)
        assert max_abs(attention_decode(q[:, t], keys, vals), o) < F64_ATOL
        assert torch.equal(kv.keys, kc) and torch.equal(kv.values, vc)
    assert kv.seen == T and len(kv) == (T if window is None else window - 1)
    if window is None:
        assert allocs == 3 and kv.capacity <= 2 * T  # 64, 128, 256
    else:
        assert kv.capacity <= max(2 * (window - 1), window - 1 + KVCache.BLOCK)
        assert allocs <= T // (kv.capacity - (window - 1)) + 1
    # the used part is what is counted
    cache = Cache()
    cache.set("layer", {"kv": kv})
    assert cache.floats() == 2 * len(kv) * 2 * (3 + 5) and cache.nbytes() == 8 * cache.floats()


def test_kv_cache_beam_reorder_and_detach_through_cache_map():
    m = build(kv_heads=2, rope=True, window=6)
    x = x_of(9, batch=3)
    with torch.no_grad():
        cache = Cache()
        m(x[:, :7], cache=cache)
        idx = torch.tensor([2, 2, 0])
        cache.map_(lambda t: t.index_select(0, idx))  # beam search
        y = torch.cat([m(x[idx, 7:8], cache=cache), m(x[idx, 8:9], cache=cache)], 1)
        assert cache.get(m)["kv"].keys.shape[0] == 3
        assert max_abs(y, m(x[idx])[:, 7:]) < F64_ATOL
        assert cache.floats() == 3 * m.state_size(9)


# -- exactness against transformers' own modules ------------------------------------------------

transformers = pytest.importorskip("transformers")


def _hf_mask(T, window=None):
    """transformers' own visibility rule (masking_utils), as eager attention's additive mask [1, 1, T, T]."""
    from transformers import masking_utils as mu

    fn = mu.sliding_window_causal_mask_function(window) if window else mu.causal_mask_function
    ok = fn(torch.tensor(0), torch.tensor(0), torch.arange(T)[:, None], torch.arange(T)[None, :]).expand(T, T)
    return torch.zeros(T, T).masked_fill(~ok, float("-inf"))[None, None]


def assert_converted_equals(m, x, y_hf) -> Cache:
    """Every mode of the converted mixer ``m``, and decoding ``x`` token by token through a Cache,
    equal transformers' output ``y_hf``; returns that cache."""
    with torch.no_grad():
        for mode in m.modes:
            m.mode = mode
            assert max_abs(m(x), y_hf) <= 1e-5, mode
        cache = Cache()
        steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], 1)
        assert max_abs(steps, y_hf) <= 1e-5
    return cache


@pytest.mark.parametrize("bias", [False, True])
def test_llama_attention_converts_exactly(bias):
    """transformers' LlamaAttention (GQA: 4 heads, 2 kv heads; full RoPE, rotate_half) on a tiny
    random config, its weights copied into softmax_attention: equal outputs (float32 <= 1e-5),
    in every mode and decoding token by token through the seqmix KV cache."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    from seqmix.interop import convert_module

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, attention_bias=bias,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0}, attn_implementation="eager")
    torch.manual_seed(0)
    hf = LlamaAttention(cfg, layer_idx=0).eval()
    if bias:
        with torch.no_grad():
            for lin in (hf.q_proj, hf.k_proj, hf.v_proj, hf.o_proj):
                lin.bias.normal_()
    T = 12
    x = torch.randn(2, T, 32)
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        y_hf = hf(x, position_embeddings=LlamaRotaryEmbedding(cfg)(x, pos), attention_mask=_hf_mask(T))[0]
    m = convert_module(hf, cfg).mixer  # the llama family's adapter config and weight table (seqmix.interop)
    assert (m.heads, m.kv_heads, m.head_qk, m.config.rope_theta, m.config.qkv_bias, m.config.out_bias) == (4, 2, 8, 500.0, bias, bias)
    assert_converted_equals(m, x, y_hf)


def test_recurrent_gemma_local_attention_converts_exactly():
    """RecurrentGemma's local attention: MQA (1 kv head), partial RoPE (half the head), a bias
    on o_proj only, and its sliding window (transformers: kv > q - window, the query's last
    `window` tokens including itself: seqmix's window)."""
    from transformers import RecurrentGemmaConfig
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaAttention

    from seqmix.interop import convert_module

    W = 4
    cfg = RecurrentGemmaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=1, head_dim=8, attention_window_size=W,
                               lru_width=32, vocab_size=16, num_hidden_layers=1, attn_implementation="eager",
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    torch.manual_seed(0)
    hf = RecurrentGemmaAttention(cfg, layer_idx=0).eval()
    T = 11
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        y_hf = hf(x, position_ids=torch.arange(T)[None].expand(2, T), attention_mask=_hf_mask(T, W))[0]
    m = convert_module(hf, cfg).mixer  # the recurrent_gemma family's adapter config and weight table (seqmix.interop)
    assert (m.kv_heads, m.head_qk, m.config.rotary_dim, m.config.window, m.config.qkv_bias, m.config.out_bias) == (1, 8, 4, W, False, True)
    assert len(assert_converted_equals(m, x, y_hf).get(m)["kv"]) == W - 1


def test_qwen3_next_gated_attention_converts_exactly():
    """Qwen3-Next's gated attention: qk-norm per head with zero-centred weights (1 + w), partial
    RoPE (a quarter of the head), GQA and the sigmoid output gate that q_proj interleaves with q
    per head."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding

    cfg = Qwen3NextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_implementation="eager",
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25})
    torch.manual_seed(0)
    hf = Qwen3NextAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        hf.q_norm.weight.normal_(0, 0.5)
        hf.k_norm.weight.normal_(0, 0.5)
    T = 10
    x = torch.randn(2, T, 32)
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        y_hf = hf(x, position_embeddings=Qwen3NextRotaryEmbedding(cfg)(x, pos), attention_mask=_hf_mask(T))[0]
    from seqmix.interop import convert_module

    m = convert_module(hf, cfg).mixer  # the qwen3_next family's adapter config and weight table (seqmix.interop)
    c = m.config
    assert (m.heads, m.kv_heads, m.head_qk, c.rotary_dim, c.rope_theta, c.qk_norm, c.qk_norm_eps, c.output_gate) == (
        4, 2, 16, 4, 1000.0, "head", cfg.rms_norm_eps, True)
    assert_converted_equals(m, x, y_hf)


# -- the LM backbone's positions = "rope" ---------------------------------------------------------


def test_lm_positions_rope_switches_rope_on_and_drops_the_table():
    from seqmix.models import LanguageModel, ModelConfig

    cfg = ModelConfig(mixer="softmax_attention", mixer_kwargs={"heads": 2, "kv_heads": 1}, d_model=16, n_layers=2,
                      vocab_size=11, positions="rope")
    torch.manual_seed(0)
    lm = LanguageModel(cfg).double().eval()
    assert lm.pos is None and all(b.mixer.config.rope for b in lm.blocks)
    ids = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = lm(ids)
        cache = Cache()
        h = torch.cat([lm.hidden(ids[:, :4], cache=cache, start=0)] + [lm.hidden(ids[:, t : t + 1], cache=cache, start=t) for t in range(4, 9)], 1)
        assert max_abs(lm.head(h), full) < F64_ATOL  # decoding: positions from each layer's KV cache
        plain = LanguageModel(cfg.model_copy(update={"positions": "none"})).double().eval()
        plain.load_state_dict(lm.state_dict())  # RoPE adds no parameter: the same weights ...
        assert not plain.blocks[0].mixer.config.rope and max_abs(plain(ids), full) > 1e-6  # ... without positions
    assert torch.equal(lm.generate(ids[:, :5], 6, temperature=0), lm.generate(ids[:, :5], 6, temperature=0, use_cache=False))
    # a hybrid: only the layers whose mixer has the option get it; explicit mixer_kwargs win
    hyb = ModelConfig(mixer="softmax_attention", d_model=16, n_layers=2, vocab_size=11, positions="rope",
                      hybrid=[{"mixer": "s6"}, {"mixer": "softmax_attention", "mixer_kwargs": {"heads": 2, "window": 4}}])
    assert hyb.layer_mixer(0) == ("s6", {}) and hyb.layer_mixer(1)[1]["rope"] is True
    off = ModelConfig(mixer="softmax_attention", mixer_kwargs={"rope": False}, d_model=16, vocab_size=11, positions="rope")
    assert off.layer_mixer(0)[1]["rope"] is False
    with pytest.raises(ValueError, match="rope"):
        ModelConfig(mixer="s6", d_model=16, vocab_size=11, positions="rope")
    with pytest.raises(ValueError, match="rotary_dim"):
        ModelConfig(mixer="softmax_attention", mixer_kwargs={"heads": 16}, d_model=16, vocab_size=11, positions="rope")
