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
    VOCAB, Recorder, assert_generate_equals, assert_logits_equal_in_every_mode, assert_refused, converted, ids, randomize,
    scale_err,
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
            "gpt_neox", "olmo2", "smollm3", "granite"] + [f"llama_{k}" for k in SCALINGS]


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
    elif family == "phi":
        cfg = T.PhiConfig(**dict(common, rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}))
    elif family == "gpt_neox":
        kw = {k: v for k, v in common.items() if k != "num_key_value_heads"}
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5}
        cfg = T.GPTNeoXConfig(**kw, attention_bias=True)
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
    return "eager" if family == "gemma2" else "sdpa"  # transformers' SDPA path has no soft-capping


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
    seqmix step per token."""
    m = tiny(family, attn=_attn(family))
    assert_generate_equals(m, from_transformers(m), ids(T=7), 10, monkeypatch, family, record)
