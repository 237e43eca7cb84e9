"""seqmix.interop for the attention families: Llama (every LlamaAttention -> seqmix
``softmax_attention``, the softmax baseline) and RecurrentGemma (its recurrent blocks -> seqmix
``rg_lru_block``, its local-attention blocks -> ``softmax_attention`` with the sliding window,
partial RoPE and MQA, in the config's block_types pattern), exactly, in the style of
tests/test_interop.py. Nothing is downloaded: tiny random models from transformers' config
classes, every weight moved off its initial value so that every weight matters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    DynamicCache, LlamaConfig, LlamaForCausalLM, RecurrentGemmaConfig, RecurrentGemmaForCausalLM,
)
from transformers.cache_utils import DynamicSlidingWindowLayer  # noqa: E402

from seqmix.interop import InteropMixer, from_transformers, seqmix_mixers, supported_families  # noqa: E402
from seqmix.ops import KVCache  # noqa: E402
from interop_helpers import (  # noqa: E402
    INTEROP_RTOL, VOCAB, Recorder, all_modes, assert_generate_equals, assert_logits_equal_in_every_mode,
    assert_refused, converted, fine_tune, ids, prefill_and_step, randomize, scale_err, set_mode, unchanged,
)
from tolerances import max_abs  # noqa: E402

#: RecurrentGemma's attention window: smaller than the prompts (7) and the tests' lengths (21), so
#: the window matters in the full forward, in the prefill and in decoding
WINDOW = 5
#: a float64 model: transformers does not run these families in float64 (its RMSNorms, Llama's and
#: Gemma's, compute in float32, eager attention's softmax too, the RoPE angles are float32 and the
#: RG-LRU scan accumulates in float32), so the whole model agrees to float32 rounding (measured: up
#: to 1.1e-6 of the logit scale) and is held to INTEROP_RTOL; each converted module against its
#: original in float64, with transformers' RoPE and scan made float64, is held to MODULE_F64_RTOL
INTEROP_F64_RTOL = INTEROP_RTOL
MODULE_F64_RTOL = 1e-12

FAMILIES = ["llama", "llama_bias", "llama_head_dim", "recurrent_gemma", "recurrent_gemma_gqa"]


def tiny(family: str, *, attn: str = "sdpa", **overrides) -> nn.Module:
    """A tiny random transformers model of ``family`` (eval mode, float32), every weight random:
    projections ~ N(0, 1/fan_in)·1.5 (sharp attention), biases and norm weights moved off 0 / 1."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=64, pad_token_id=0, bos_token_id=1,
                  eos_token_id=1, attn_implementation=attn)
    if family.startswith("llama"):
        kw = dict(common, num_key_value_heads=2, num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
        if family == "llama_bias":
            kw["attention_bias"] = True
        if family == "llama_head_dim":  # head_dim != hidden_size / heads, multi-head (no grouping)
            kw.update(num_key_value_heads=4, head_dim=12)
        m = LlamaForCausalLM(LlamaConfig(**{**kw, **overrides}))
    elif family.startswith("recurrent_gemma"):
        kw = dict(common, num_key_value_heads=1, num_hidden_layers=3, attention_window_size=WINDOW, conv1d_width=4,
                  block_types=["recurrent", "attention"])  # layers: recurrent, attention, recurrent
        if family == "recurrent_gemma_gqa":  # GQA, biases on q, k, v, lru_width = 2·hidden (expand 2), attention first
            kw.update(num_key_value_heads=2, attention_bias=True, lru_width=64, block_types=["attention", "recurrent"],
                      num_hidden_layers=4)
        m = RecurrentGemmaForCausalLM(RecurrentGemmaConfig(**{**kw, **overrides}))
    else:
        raise KeyError(family)
    # norm weights: Llama's RMSNorm weight w (init 1), Gemma's zero-centred 1 + w (init 0)
    return randomize(m, moved=("recurrent_param",))


def mixer_paths(m) -> list[str]:
    cfg = m.config
    if cfg.model_type == "llama":
        return [f"model.layers.{i}.self_attn" for i in range(cfg.num_hidden_layers)]
    return [f"model.layers.{i}.temporal_block" for i in range(cfg.num_hidden_layers)]


#: measured errors (max |logit error| / max |logit|), printed by ``pytest -s``
record = Recorder("interop attention")


# ------------------------------------------------------------------------------------------
# the converted model
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_is_the_same_class_and_the_original_is_unchanged(family):
    m = tiny(family)
    c = converted(m)
    mixers = seqmix_mixers(c)
    assert sorted(mixers) == sorted(mixer_paths(m))
    kinds = {p: mx.registry_name for p, mx in mixers.items()}
    if family.startswith("llama"):
        assert set(kinds.values()) == {"softmax_attention"}
        mx = mixers["model.layers.0.self_attn"]
        cfg = m.config
        assert (mx.heads, mx.kv_heads, mx.head_qk) == (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        assert mx.config.rope and mx.config.rotary_dim is None and mx.config.rope_theta == 500.0 and mx.config.window is None
        assert mx.config.qkv_bias is mx.config.out_bias is (family == "llama_bias")
    else:  # the block_types pattern: each layer's mixer is the one of its block type
        want = {"linear_attention": "rg_lru_block", "sliding_attention": "softmax_attention"}
        assert kinds == {p: want[t] for p, t in zip(mixer_paths(m), m.config.layers_block_type)}
        att = next(mx for mx in mixers.values() if mx.registry_name == "softmax_attention")
        K = m.config.head_dim
        assert (att.kv_heads, att.config.window, att.config.rotary_dim, att.config.out_bias) == (
            m.config.num_key_value_heads, WINDOW, K // 2, True)
    # embeddings, norms, MLPs and the head stay transformers' own (copied, not shared)
    assert type(c.model.norm if family.startswith("llama") else c.model.final_norm) is type(
        m.model.norm if family.startswith("llama") else m.model.final_norm)
    assert c.model.embed_tokens.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr()
    inplace = from_transformers(m, inplace=True)
    assert inplace is m and isinstance(m.get_submodule(mixer_paths(m)[0]), InteropMixer)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_in_every_mode_float32(family, attn):
    """Both of transformers' attention paths (eager: an additive 4D mask; sdpa: a boolean mask or
    is_causal), with and without transformers' cache object in the call."""
    m = tiny(family, attn=attn)
    assert_logits_equal_in_every_mode(m, from_transformers(m), ids(), f"{family} {attn}", record)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_float64(family):
    m = tiny(family, attn="eager").double()
    c = from_transformers(m)
    x = ids()
    with torch.no_grad():
        ref = m(x, use_cache=False).logits
        assert ref.dtype == torch.float64
        for mode in all_modes(c):
            set_mode(c, mode)
            out = c(x, use_cache=False).logits
            assert out.dtype == torch.float64
            err = record(f"{family} float64 {mode}", scale_err(out, ref))
            assert err <= INTEROP_F64_RTOL, f"{family}, mode {mode}: {err:.3g}"


def _rope64(position_ids, R: int, theta: float, dtype):
    """transformers' default RoPE (cos, sin) over R channels (rotate_half layout), in float64."""
    inv = 1.0 / theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    freqs = position_ids[..., None].double() * inv
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_converted_module_equals_the_original_in_float64(family, monkeypatch):
    """Module by module in float64 (SDPA, so no float32 softmax; the RoPE cos/sin and the RG-LRU scan
    made float64, where transformers rounds them to float32): tight agreement, in every mode."""
    m = tiny(family, attn="sdpa").double()
    c = from_transformers(m)
    T = 13
    h = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pos = torch.arange(T)[None].expand(2, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    theta = m.config.rope_parameters["rope_theta"]
    for path in mixer_paths(m):
        orig, adapter = m.get_submodule(path), c.get_submodule(path)
        name = type(orig).__name__
        with torch.no_grad():
            if name == "LlamaAttention":
                y_ref = orig(h, position_embeddings=_rope64(pos, orig.head_dim, theta, h.dtype), attention_mask=None)[0]
            elif name == "RecurrentGemmaAttention":
                R = adapter.mixer.config.rotary_dim
                monkeypatch.setattr(orig.rotary_emb, "forward", lambda x, position_ids, R=R: _rope64(position_ids, R, theta, x.dtype))
                mask = ((j <= i) & (i - j < WINDOW))[None, None]  # transformers' sliding-window rule, as SDPA's bool mask
                y_ref = orig(h, position_ids=pos, attention_mask=mask)[0]
            else:
                scan = type(orig.rg_lru)._rnn_scan
                monkeypatch.setattr(orig.rg_lru, "_rnn_scan",
                                    lambda *a, _s=scan, _m=orig.rg_lru, **k: _s(_m, *a, **{**k, "acc_dtype": torch.float64}))
                y_ref = orig(h, position_ids=pos, attention_mask=None, use_cache=False)[0]
            for mode in adapter.mixer.modes:
                adapter.mixer.mode = mode
                y, second = adapter(h, position_ids=pos, attention_mask=None)
                assert second is None and y.dtype == torch.float64
                err = record(f"{family} module float64 {name} {mode}", scale_err(y, y_ref))
                assert err <= MODULE_F64_RTOL, f"{path} ({name}), mode {mode}: {err:.3g}"


def test_from_transformers_sets_the_mode():
    c = from_transformers(tiny("recurrent_gemma"), mode="parallel")
    assert {mx.mode for mx in seqmix_mixers(c).values()} == {"parallel"}
    with pytest.raises(ValueError, match=r"'mode'.*model\.layers\.0\.self_attn|model\.layers\.0\.self_attn.*'mode'"):
        from_transformers(tiny("llama"), mode="chunk")  # softmax attention has no chunk mode


# ------------------------------------------------------------------------------------------
# decoding through the seqmix KV cache / state
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_the_original_at_every_step(family, attn, monkeypatch):
    m = tiny(family, attn=attn)
    # the prompt (7) and the generated tokens (10) both exceed RecurrentGemma's window
    assert_generate_equals(m, from_transformers(m), ids(T=7), 10, monkeypatch, f"{family} {attn}", record)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_kv_cache_lives_in_the_transformers_cache(family):
    """After a prefill and a step, each attention layer of transformers' DynamicCache holds seqmix's
    KVCache, its keys / values are views of that cache's buffers (no copy) and equal the original's
    (rotated) keys and values; the sliding layers keep the last window - 1 tokens and count every
    token; the recurrent layers hold the state the original block keeps in its attributes. A
    4-token continuation through the cache equals one pass."""
    m = tiny(family)
    c = from_transformers(m)
    x = ids(T=16)
    with torch.no_grad():
        ref, mine = prefill_and_step((m, c), x, lambda model: DynamicCache(config=model.config))
        assert mine.get_seq_length() == ref.get_seq_length() == 12
        for i, path in enumerate(mixer_paths(m)):
            mx = seqmix_mixers(c)[path]
            if mx.registry_name == "softmax_attention":
                layer, theirs = mine.layers[i], ref.layers[i]
                assert type(layer) is type(theirs)
                kv = layer._seqmix_kv
                assert isinstance(kv, KVCache) and kv.seen == 12
                assert layer.keys.untyped_storage().data_ptr() == kv.k.untyped_storage().data_ptr()
                assert layer.keys.shape == theirs.keys.shape == (2, mx.kv_heads, 12 if mx.config.window is None else WINDOW - 1,
                                                                 mx.head_qk)
                assert max_abs(layer.keys, theirs.keys) <= 1e-5 and max_abs(layer.values, theirs.values) <= 1e-5
                if isinstance(layer, DynamicSlidingWindowLayer):
                    assert layer.cumulative_length == theirs.cumulative_length == 12
            else:  # RecurrentGemma's block keeps (conv1d_state, rg_lru.recurrent_states) in itself
                blk = m.get_submodule(path)
                assert max_abs(mine.get_conv_state(i), blk.conv1d_state) <= 1e-5
                assert scale_err(mine.get_recurrent_state(i), blk.rg_lru.recurrent_states) <= INTEROP_RTOL
        full = m(x, use_cache=False).logits
        assert scale_err(c(x[:, 12:], cache=mine, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL
        assert mine.get_seq_length() == 16
        if family.startswith("llama"):  # (RecurrentGemma's own block restarts its conv on a multi-token continuation)
            assert scale_err(m(x[:, 12:], cache=ref, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL


def test_a_cache_filled_by_the_original_continues_in_the_converted_model():
    """The KV cache is transformers' own object: a cache the original model filled is read into a
    seqmix KVCache (one copy) and decoding continues from it; and the other way round."""
    m = tiny("llama")
    c = from_transformers(m)
    x = ids(T=12)
    with torch.no_grad():
        full = m(x, use_cache=False).logits
        cache = DynamicCache(config=m.config)
        m(x[:, :9], cache=cache, use_cache=True)  # the original fills it
        steps = [c(x[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(9, 11)]
        steps.append(m(x[:, 11:], cache=cache, use_cache=True).logits)  # and the original reads what seqmix wrote
        assert scale_err(torch.cat(steps, 1), full[:, 9:]) <= INTEROP_RTOL
    m = tiny("recurrent_gemma")
    c = from_transformers(m)
    with torch.no_grad():
        full = c(x, use_cache=False).logits
        cache = DynamicCache(config=c.config)
        c(x[:, :9], cache=cache, use_cache=True)
        att = next(i for i, t in enumerate(c.config.layers_block_type) if t == "sliding_attention")
        cache.layers[att].keys = cache.layers[att].keys.clone()  # transformers replaced the tensors: read them once
        steps = [c(x[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(9, 12)]
        assert scale_err(torch.cat(steps, 1), full[:, 9:]) <= INTEROP_RTOL


def test_beam_search_reorders_the_kv_cache():
    """transformers' reorder_cache replaces the layer's tensors: the adapter reads the reordered
    keys and values into a new KVCache."""
    m = tiny("llama")
    c = from_transformers(m)
    prompt = ids(T=5)
    kw = dict(max_new_tokens=6, min_new_tokens=6, num_beams=3, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(c.generate(prompt, **kw), m.generate(prompt, **kw))


def test_a_cache_without_config_and_the_old_keywords():
    """DynamicCache() without a config creates its layers as the model reaches them; the adapter's
    cache keywords (cache, past_key_values) are the same."""
    m = tiny("llama")
    c = from_transformers(m)
    x = ids(T=9)
    with torch.no_grad():
        full = m(x, use_cache=False).logits
        cache = DynamicCache()
        out = torch.cat([c(x[:, :6], cache=cache, use_cache=True).logits]
                        + [c(x[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(6, 9)], 1)
        assert scale_err(out, full) <= INTEROP_RTOL
        adapter = c.model.layers[0].self_attn
        h = torch.randn(2, 4, 32)
        a, none = adapter(h, cache=DynamicCache(config=c.config))
        b, _ = adapter(h, past_key_values=DynamicCache(config=c.config))
        assert none is None and torch.equal(a, b)


# ------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "recurrent_gemma"])
def test_fine_tuning_lowers_the_loss(family, monkeypatch):
    m = tiny(family)
    c = from_transformers(m).train()
    for mx in seqmix_mixers(c).values():  # the fast modes: SDPA for attention, the chunked scan for the RG-LRU
        mx.mode = "sdpa" if mx.registry_name == "softmax_attention" else "chunk"
    losses, modes = fine_tune(c, monkeypatch, use_cache=False)
    assert modes == ({"sdpa"} if family == "llama" else {"sdpa", "chunk"})
    assert losses[-1] < 0.7 * losses[0], losses
    assert unchanged(tiny(family), m)


# ------------------------------------------------------------------------------------------
# the DSF view of a converted attention layer
# ------------------------------------------------------------------------------------------


def test_converted_attention_keeps_its_maps():
    """phi(x) of a converted layer: causal softmax rows (summing to 1), zero outside
    RecurrentGemma's window, reproducing the layer's mixed values; no finite-state DSF."""
    for family in ("llama", "recurrent_gemma"):
        c = from_transformers(tiny(family))
        for mx in seqmix_mixers(c).values():
            if mx.registry_name != "softmax_attention":
                continue
            h = torch.randn(1, 12, 32)
            with torch.no_grad():
                values, mixed = mx.core(h)
                phi = mx.phi(h)
            assert phi.shape == (1, mx.heads, 12, 12) and not mx.finite_state
            assert max_abs(phi.sum(-1), torch.ones(1, mx.heads, 12)) < 1e-5
            assert max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed) < 1e-5
            if mx.config.window:
                i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
                assert phi[..., (i - j >= WINDOW) | (j > i)].abs().max() == 0


# ------------------------------------------------------------------------------------------
# bad input: a clear error naming the module and the option, never a silently different model
# ------------------------------------------------------------------------------------------


def test_both_families_are_supported():
    fams = supported_families()
    assert "llama" in fams and "recurrent_gemma" in fams


@pytest.mark.parametrize("rope_type", ["proportional", "su"])
def test_a_rope_type_seqmix_cannot_express_is_named(rope_type):
    """The scaled types (linear, dynamic, yarn, llama3, longrope) convert: tests/test_interop_transformers.py."""
    m = tiny("llama")
    m.config.rope_parameters = {"rope_type": rope_type, "rope_theta": 500.0, "factor": 2.0}
    assert_refused(m, rf"model\.layers\.0\.self_attn.*'rope_parameters\.rope_type'.*'{rope_type}'")


def test_attention_bias_variations():
    """attention_bias on all four (Llama) and on o_proj only (RecurrentGemma) or q, k, v only
    (Qwen2) convert exactly; a bias on some of q, k, v only has no seqmix form (W_qk and W_v share
    one switch) and is refused naming attention_bias."""
    x = ids()
    for where in ("o_proj", "qkv"):
        m = tiny("llama")
        for layer in m.model.layers:
            names = ("o_proj",) if where == "o_proj" else ("q_proj", "k_proj", "v_proj")
            for n in names:
                lin = getattr(layer.self_attn, n)
                lin.bias = nn.Parameter(0.3 * torch.randn(lin.out_features))
        c = from_transformers(m)
        mx = seqmix_mixers(c)["model.layers.0.self_attn"]
        assert (mx.config.qkv_bias, mx.config.out_bias) == ((False, True) if where == "o_proj" else (True, False))
        with torch.no_grad():
            assert scale_err(c(x).logits, m(x).logits) <= INTEROP_RTOL
    m = tiny("llama")
    m.model.layers[1].self_attn.q_proj.bias = nn.Parameter(torch.zeros(m.model.layers[1].self_attn.q_proj.out_features))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn.*'attention_bias'.*q_proj"):
        from_transformers(m)


@pytest.mark.parametrize("family, overrides, option, path", [
    ("recurrent_gemma", {"hidden_activation": "relu"}, "hidden_activation", "model.layers.0.temporal_block"),
    ("recurrent_gemma", {"lru_width": 48}, "lru_width", "model.layers.0.temporal_block"),
    ("recurrent_gemma", {"partial_rotary_factor": 0.375}, "partial_rotary_factor", "model.layers.1.temporal_block"),
])
def test_an_option_seqmix_cannot_express_is_named(family, overrides, option, path):
    m = tiny(family, **overrides)
    assert_refused(m, rf"{path.replace('.', chr(92) + '.')}.*'{option}'")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", ["llama", "recurrent_gemma"])
def test_padding_is_refused(family, attn):
    """A padding mask reaches the attention layers as a 4D mask that hides keys: refused (the seqmix
    attention applies the causal / window mask itself); an all-ones mask is no mask."""
    c = from_transformers(tiny(family, attn=attn))
    x = ids(T=8)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    att = "model.layers.0.self_attn" if family == "llama" else "model.layers.1.temporal_block"
    with pytest.raises(ValueError, match=rf"{att.replace('.', chr(92) + '.')}.*'attention_mask' has padding"):
        c(x, attention_mask=mask)
    # (generate() also shifts the positions by the padding: RecurrentGemma's first, recurrent layer refuses them)
    with pytest.raises(ValueError, match=r"'attention_mask' has padding|'position_ids'.*padding 'attention_mask'"):
        c.generate(x, attention_mask=mask, max_new_tokens=2)
    with torch.no_grad():
        assert torch.equal(c(x, attention_mask=torch.ones_like(x)).logits, c(x).logits)


def test_positions_other_than_the_cache_offset_are_refused():
    c = from_transformers(tiny("llama"))
    x = ids(T=6)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn.*'position_ids'"):
        c(x, position_ids=torch.arange(6)[None] + 3)
    c = from_transformers(tiny("recurrent_gemma"))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.temporal_block.*'position_ids'"):
        c(x, position_ids=torch.arange(6)[None] + 3)
    with torch.no_grad():  # the positions the model computes itself are accepted
        assert torch.equal(c(x, position_ids=torch.arange(6)[None]).logits, c(x).logits)


def test_a_cache_seqmix_cannot_hold_its_kv_in_is_refused():
    c = from_transformers(tiny("llama"))
    x = ids(T=5)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn.*'cache'.*StaticLayer"):
        c.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=2, cache_implementation="static")
