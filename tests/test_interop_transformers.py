"""seqmix.interop for the transformers people start from: Qwen2, Qwen3, Qwen3-MoE, Mistral, Mixtral, Gemma 1-3,
Phi-3, Phi, GPT-NeoX, OLMo-2, SmolLM3, Granite, and Llama with each RoPE scaling type. Every attention layer
becomes seqmix's one ``softmax_attention`` (its options: sliding windows per layer, soft-capping, qk-norm per
head or over the whole projection, partial rotary, no-RoPE layers, the scale, RoPE scalings), exactly, in the
style of tests/test_interop_attention.py: tiny random models from transformers' config classes (nothing
downloaded), logits in every mode, generate() step by step through seqmix's cache, each converted module in
float64, and transformers' own RoPE frequencies against seqmix's."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from seqmix.interop import from_transformers, seqmix_mixers, supported_families  # noqa: E402
from seqmix.ops import rope_frequencies  # noqa: E402
from interop_helpers import (  # noqa: E402
    VOCAB, Recorder, assert_generate_equals, assert_logits_equal_in_every_mode, assert_refused, converted, ids,
    randomize, scale_err,
)

#: the sliding windows of the tiny models: shorter than the prompts (7) and the tests' lengths (21)
WINDOW = 5
MODULE_F64_RTOL = 1e-12

ROPE = {"rope_type": "default", "rope_theta": 500.0}
#: each RoPE scaling type on a Llama, its lengths chosen so that the scaling acts within T = 21 (dynamic's and
#: longrope's switch at 8 positions falls inside the prompt + generated tokens)
SCALINGS = {
    "linear": {"rope_type": "linear", "rope_theta": 500.0, "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 8.0,
             "beta_slow": 1.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "longrope": {"rope_type": "longrope", "rope_theta": 500.0, "original_max_position_embeddings": 8,
                 "short_factor": [1.0, 1.3, 1.9, 2.5], "long_factor": [1.1, 2.0, 4.0, 7.5]},
}

FAMILIES = ["qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "gemma", "gemma2", "gemma3_text", "phi3", "phi3_longrope", "phi",
            "phi_qkln", "gpt_neox", "olmo2", "smollm3", "granite", "gpt_oss", "gpt2", "bloom", "deepseek_v3", "deepseek_v3_q"]
FAMILIES += [f"llama_{k}" for k in SCALINGS]


def tiny(family: str, *, attn: str = "sdpa", **overrides):
    """A tiny random transformers model of ``family`` (eval mode, float32), every weight random."""
    torch.manual_seed(0)
    T = transformers
    common = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                  num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=1, attn_implementation=attn,
                  rope_parameters=dict(ROPE), max_position_embeddings=64)
    if family == "qwen2":  # layer 0 full, layer 1 sliding (max_window_layers)
        cfg = T.Qwen2Config(**common, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    elif family == "qwen3":
        cfg = T.Qwen3Config(**common, head_dim=12, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    elif family == "qwen3_moe":
        cfg = T.Qwen3MoeConfig(**common, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    elif family == "mistral":
        cfg = T.MistralConfig(**common, sliding_window=WINDOW)
    elif family == "mixtral":
        cfg = T.MixtralConfig(**common, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2)
    elif family == "gemma":
        cfg = T.GemmaConfig(**dict(common, num_key_value_heads=1), head_dim=16)
    elif family == "gemma2":  # sliding, full; soft-capping small enough to act
        cfg = T.Gemma2Config(**common, head_dim=16, sliding_window=WINDOW, attn_logit_softcapping=1.5, final_logit_softcapping=None,
                             query_pre_attn_scalar=12, layer_types=["sliding_attention", "full_attention"])
    elif family == "gemma3_text":  # a RoPE base per layer type
        kw = dict(common, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
                                           "full_attention": {"rope_type": "default", "rope_theta": 500.0}})
        cfg = T.Gemma3TextConfig(**kw, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=10,
                                 layer_types=["sliding_attention", "full_attention"])
    elif family in ("phi3", "phi3_longrope"):
        kw = dict(common)
        if family == "phi3_longrope":
            kw.update(rope_parameters=dict(SCALINGS["longrope"]), max_position_embeddings=32, original_max_position_embeddings=8)
        cfg = T.Phi3Config(**kw)
    elif family in ("phi", "phi_qkln"):  # _qkln: Phi's LayerNorm qk-norm (qk_layernorm), weights and biases random
        rp = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
        cfg = T.PhiConfig(**dict(common, rope_parameters=rp), qk_layernorm=family == "phi_qkln")
    elif family == "gpt_neox":
        kw = {k: v for k, v in common.items() if k != "num_key_value_heads"}
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
        cfg = T.GPTNeoXConfig(**kw, attention_bias=True)
    elif family == "gpt_oss":  # sliding, full; sinks; YaRN as the real models
        kw = dict(common, rope_parameters=dict(SCALINGS["yarn"]), max_position_embeddings=32)
        cfg = T.GptOssConfig(**kw, head_dim=8, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                             layer_types=["sliding_attention", "full_attention"], attention_bias=True)
    elif family == "gpt2":
        cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_head=4, n_layer=2, n_positions=64, attn_pdrop=0.0, resid_pdrop=0.0,
                           embd_pdrop=0.0, bos_token_id=1, eos_token_id=1, pad_token_id=0, attn_implementation=attn,
                           scale_attn_by_inverse_layer_idx=True)
    elif family == "bloom":
        cfg = T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_head=4, n_layer=2, bos_token_id=1, eos_token_id=1, pad_token_id=0,
                            attn_implementation=attn)
    elif family in ("deepseek_v3", "deepseek_v3_q"):  # MLA; layer 0 dense, layer 1 MoE; _q: a full-rank q_proj
        kw = {k: v for k, v in common.items() if k != "num_key_value_heads"}
        cfg = T.DeepseekV3Config(**kw, num_key_value_heads=4, q_lora_rank=None if family == "deepseek_v3_q" else 12,
                                 kv_lora_rank=10, qk_rope_head_dim=4, qk_nope_head_dim=6, v_head_dim=5, n_routed_experts=4,
                                 num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1)
    elif family == "olmo2":
        cfg = T.Olmo2Config(**common)
    elif family == "smollm3":  # layer 0 without RoPE
        cfg = T.SmolLM3Config(**common, no_rope_layers=[0, 1])
    elif family == "granite":
        cfg = T.GraniteConfig(**common, attention_multiplier=0.3)
    elif family.startswith("llama_"):
        kind = family[6:]  # dynamic's base grows past 8 positions; yarn's and longrope's max_position_embeddings / L = 4
        mpe = {"dynamic": 8, "yarn": 32, "longrope": 32}.get(kind, 64)
        cfg = T.LlamaConfig(**dict(common, rope_parameters=dict(SCALINGS[kind]), max_position_embeddings=mpe))
    else:
        raise KeyError(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    m = T.AutoModelForCausalLM.from_config(cfg)
    return randomize(m, gain=1.5)


record = Recorder("interop transformers")


def _attn(family: str) -> str:
    return "eager" if family in ("gemma2", "gpt_oss", "bloom") else "sdpa"  # transformers' SDPA path: no soft-capping, sinks, ALiBi


# ------------------------------------------------------------------------------------------
# logits and decoding
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_the_original_in_every_mode(family):
    m = tiny(family, attn=_attn(family))
    c = converted(m)
    assert {mx.registry_name for mx in seqmix_mixers(c).values()} == {"softmax_attention"}
    assert_logits_equal_in_every_mode(m, c, ids(), family, record)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_the_original_at_every_step(family, monkeypatch):
    """The prompt (7) and the generated tokens (10) both exceed the windows (5); prefill, then one
    seqmix step per token. (Phi-3's generate() itself drops the cache and prefills again when the sequence
    crosses original_max_position_embeddings under LongRoPE: its prompt starts past that length, 9 > 8;
    Llama's LongRoPE crosses it while decoding.)"""
    m = tiny(family, attn=_attn(family))
    T = 9 if family == "phi3_longrope" else 7
    assert_generate_equals(m, from_transformers(m), ids(T=T), 10, monkeypatch, family, record)


# ------------------------------------------------------------------------------------------
# each converted module alone, in float64
# ------------------------------------------------------------------------------------------

#: float64 module by module where transformers computes in float64 with default RoPE: SDPA (no float32 softmax), the
#: RoPE cos/sin made float64 and the qk-norms' RMSNorm (float32 inside in transformers) made float64. Gemma 2 is left
#: out, and GPT-OSS and BLOOM (soft-capping, sinks, ALiBi run only in the eager path, whose softmax is float32); the
#: MLA norms (float32 inside too) are made float64 like the qk-norms; the scaled RoPE types are tied
#: to transformers' frequencies by test_rope_frequencies_equal_transformers (computed in float32 there)
F64_FAMILIES = ["qwen2", "qwen3", "mistral", "gemma", "gemma3_text", "phi3", "phi", "phi_qkln", "gpt_neox", "olmo2", "smollm3",
                "granite", "deepseek_v3", "deepseek_v3_q", "gpt2"]


def _rope64(position_ids, R: int, theta: float, dtype):
    """transformers' default RoPE (cos, sin) over R channels (rotate_half layout), in float64."""
    inv = 1.0 / theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    freqs = position_ids[..., None].double() * inv
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rms64(norm, zero_centred: bool):
    w = norm.weight.detach().double()
    w = 1 + w if zero_centred else w
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    return lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("family", F64_FAMILIES)
def test_each_converted_module_equals_the_original_in_float64(family, monkeypatch):
    m = tiny(family, attn="sdpa").double()
    c = from_transformers(m)
    T = 13
    h = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pos = torch.arange(T)[None].expand(2, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    for path, mx in seqmix_mixers(c).items():
        orig, adapter = m.get_submodule(path), c.get_submodule(path)
        for name in ("q_norm", "k_norm", "q_a_layernorm", "kv_a_layernorm"):
            if getattr(orig, name, None) is not None:
                monkeypatch.setattr(getattr(orig, name), "forward", _rms64(getattr(orig, name), family == "gemma3_text"))
        R = mx.config.qk_rope_head_dim or mx.config.rotary_dim or mx.head_qk
        pe = _rope64(pos, R, mx.config.rope_theta, h.dtype)
        w = mx.config.window
        mask = ((j <= i) & (i - j < (w or T)))[None, None]  # causal (and windowed), as SDPA's bool mask
        with torch.no_grad():
            y_ref = orig(h, position_embeddings=pe, attention_mask=mask)[0]
            for mode in mx.modes:
                mx.mode = mode
                y, second = adapter(h, position_ids=pos, attention_mask=None)
                assert second is None and y.dtype == torch.float64
                err = record(f"{family} module float64 {path} {mode}", scale_err(y, y_ref))
                assert err <= MODULE_F64_RTOL, f"{family} {path}, mode {mode}: {err:.3g}"


# ------------------------------------------------------------------------------------------
# RoPE scaling: seqmix's frequencies against transformers' own
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_rope_frequencies_equal_transformers(kind):
    """seqmix.ops.rope_frequencies (float64) against transformers' ROPE_INIT_FUNCTIONS (float32) for the
    converted mixer's own scaling, at sequence lengths below and above the switch of dynamic / longrope;
    the attention factors equal. The frequencies differ from the default (the scaling acts)."""
    m = tiny(f"llama_{kind}")
    mx = seqmix_mixers(from_transformers(m))["model.layers.0.self_attn"]
    sc, R = mx.config.rope_scaling, mx.config.rotary_dim or mx.head_qk
    assert sc["type"] == kind
    default, _ = rope_frequencies(R, mx.config.rope_theta, dtype=torch.float64)
    for seq_len in (4, 21):
        theirs, a_theirs = ROPE_INIT_FUNCTIONS[kind](m.config, torch.device("cpu"), seq_len=seq_len)
        mine, a_mine = rope_frequencies(R, mx.config.rope_theta, sc, seq_len=seq_len, dtype=torch.float64)
        assert mine.shape == theirs.shape == (R // 2,)
        assert float(((mine - theirs.double()) / theirs.double()).abs().max()) < 1e-6, (kind, seq_len)
        assert math.isclose(a_mine, float(a_theirs), rel_tol=1e-12)
        if kind not in ("dynamic", "longrope") or seq_len == 21:
            assert float((mine - default).abs().max()) > 1e-3, f"{kind} at {seq_len} positions does not change the frequencies"


def test_converted_rope_scaling_keeps_its_fields():
    """The adapter config carries transformers' fields into seqmix's scaling (YaRN's betas, LongRoPE's factors)."""
    sc = seqmix_mixers(from_transformers(tiny("llama_yarn")))["model.layers.0.self_attn"].config.rope_scaling
    assert (sc["factor"], sc["beta_fast"], sc["beta_slow"], sc["original_max_position_embeddings"]) == (4.0, 8.0, 1.0, 8.0)
    sc = seqmix_mixers(from_transformers(tiny("phi3_longrope")))["model.layers.0.self_attn"].config.rope_scaling
    assert sc["long_factor"] == tuple(SCALINGS["longrope"]["long_factor"]) and sc["factor"] == 4.0


# ------------------------------------------------------------------------------------------
# what each family's layers became
# ------------------------------------------------------------------------------------------


def test_the_layer_patterns_are_kept():
    """Windows, RoPE bases, no-RoPE layers, qk-norm placement, soft-capping and the scale, layer by layer."""
    def cfgs(family):
        return [mx.config for mx in seqmix_mixers(from_transformers(tiny(family, attn=_attn(family)))).values()]

    assert [c.window for c in cfgs("qwen2")] == [None, WINDOW]
    assert [c.window for c in cfgs("mistral")] == [WINDOW, WINDOW]
    g2 = cfgs("gemma2")
    assert [c.window for c in g2] == [WINDOW, None] and {c.softcap for c in g2} == {1.5}
    assert {c.scale for c in g2} == {12 ** -0.5}
    g3 = cfgs("gemma3_text")
    assert [(c.window, c.rope_theta, c.qk_norm) for c in g3] == [(WINDOW, 50.0, "head"), (None, 500.0, "head")]
    assert [c.rope for c in cfgs("smollm3")] == [False, True]
    assert {c.qk_norm for c in cfgs("olmo2")} == {"full"} and {c.qk_norm for c in cfgs("qwen3")} == {"head"}
    assert {c.scale for c in cfgs("granite")} == {0.3}
    assert {(c.rotary_dim, c.qkv_bias, c.out_bias) for c in cfgs("phi")} == {(4, True, True)}
    assert {(c.rotary_dim, c.qkv_bias) for c in cfgs("gpt_neox")} == {(4, True)}


def test_the_families_are_supported():
    variants = {f"llama_{k}" for k in SCALINGS} | {"phi3_longrope", "deepseek_v3_q", "phi_qkln"}
    assert set(FAMILIES) - variants <= set(supported_families())


# ------------------------------------------------------------------------------------------
# bad input: the module path and the option, the model untouched
# ------------------------------------------------------------------------------------------


def test_an_unknown_rope_type_is_named():
    m = tiny("qwen2")
    m.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 500.0, "factor": 2.0}
    assert_refused(m, r"model\.layers\.0\.self_attn.*'rope_parameters\.rope_type'.*'proportional'")


def test_phi_layernorm_qk_norm_becomes_a_layernorm_qk_norm():
    """Phi's qk_layernorm: a LayerNorm (weight and bias) on each head's q and k, converted as softmax_attention's
    qk-norm of kind 'layer', holding the original's weights (exactness: the phi_qkln case above)."""
    from seqmix.mixers.layers import LayerNorm

    m = tiny("phi_qkln")
    orig = m.model.layers[1].self_attn
    mx = seqmix_mixers(from_transformers(m))["model.layers.1.self_attn"]
    assert (mx.config.qk_norm, mx.config.qk_norm_kind, mx.config.qk_norm_eps) == ("head", "layer", orig.q_layernorm.eps)
    for mine, theirs in ((mx.q_norm, orig.q_layernorm), (mx.k_norm, orig.k_layernorm)):
        assert type(mine) is LayerNorm and torch.equal(mine.weight, theirs.weight) and torch.equal(mine.bias, theirs.bias)
        assert float(theirs.bias.detach().abs().max()) > 0  # the bias is random: the test sees it


def test_a_qk_layernorm_seqmix_cannot_express_is_named():
    m = tiny("phi_qkln")
    m.model.layers[0].self_attn.k_layernorm.eps = 1e-3  # q's is 1e-5: seqmix's q and k norms share one ε
    assert_refused(m, r"model\.layers\.0\.self_attn.*'layer_norm_eps'")


# ------------------------------------------------------------------------------------------
# the DSF view: the report's columns and `seqmix show --hf`
# ------------------------------------------------------------------------------------------


def test_the_report_names_alibi_sinks_and_soft_capping():
    from seqmix.analysis.model_maps import lambda_structure, norm_and_gate

    def first(family):
        return next(iter(seqmix_mixers(from_transformers(tiny(family, attn=_attn(family)))).values()))

    assert "ALiBi" in lambda_structure(first("bloom")) and "ALiBi" not in lambda_structure(first("gpt2"))
    assert "sink" in norm_and_gate(first("gpt_oss"))[0]
    assert "soft-capped: 1.5" in norm_and_gate(first("gemma2"))[0]


def test_show_hf_draws_an_attention_only_model(tmp_path):
    """No layer of an attention-only model has a decay: the layers figure says so instead of a log scale."""
    from seqmix.cli import main

    tiny("gpt2").save_pretrained(tmp_path / "gpt2")
    rc = main(["show", "--hf", str(tmp_path / "gpt2"), "--ids", "5,6,7,8,9,10,11,12", "--out", str(tmp_path / "o"), "--dpi", "30"])
    assert rc == 0 and (tmp_path / "o" / "layers.png").exists()


def test_mla_caches_the_latent_as_transformers_does():
    """DeepSeek-V3's DynamicCache layers hold the latent c [B, 1, L, r] and the rotary key [B, 1, L, R] (keys / values
    of the layer): the converted model writes seqmix's KVCache of that pair there, equal to what the original writes,
    and a continuation through the cache equals one pass."""
    from transformers import DynamicCache

    from interop_helpers import prefill_and_step
    from seqmix.ops import KVCache
    from tolerances import max_abs

    m = tiny("deepseek_v3")
    c = from_transformers(m)
    x = ids(T=16)
    with torch.no_grad():
        ref, mine = prefill_and_step((m, c), x, lambda model: DynamicCache(config=model.config))
        for i in range(2):
            layer, theirs = mine.layers[i], ref.layers[i]
            assert isinstance(layer._seqmix_kv, KVCache) and layer.keys.shape == theirs.keys.shape == (2, 1, 12, 10)
            assert layer.values.shape == theirs.values.shape == (2, 1, 12, 4)
            assert max_abs(layer.keys, theirs.keys) <= 1e-5 and max_abs(layer.values, theirs.values) <= 1e-5
        full = m(x, use_cache=False).logits
        assert scale_err(c(x[:, 12:], cache=mine, use_cache=True).logits, full[:, 12:]) <= 2e-4
    mx = seqmix_mixers(c)["model.layers.0.self_attn"]
    assert mx.state_size(12) == 12 * (10 + 4)  # r + R floats per token, not heads·(K + V)
