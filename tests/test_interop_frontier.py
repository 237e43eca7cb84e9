"""seqmix.interop for the frontier hybrids: Qwen3-Next (Gated DeltaNet layers
-> ``qwen3_next_gdn``, gated attention -> ``softmax_attention``), Kimi-Linear (KDA -> ``kimi_kda``; its MLA
attention -> ``softmax_attention`` with ``kv_lora_rank``, no positions), MiniMax (lightning attention
-> ``lightning_attention``, attention -> ``softmax_attention``) and LFM2 (gated short conv ->
``short_conv``, GQA attention with qk-norm -> ``softmax_attention``), exactly, in the style of
tests/test_interop_attention.py. MoE and MLPs stay transformers'. Nothing is downloaded: tiny random
models from transformers' config classes (every layer kind present), every weight moved off its initial
value; transformers runs its torch paths (no flash-linear-attention, no causal_conv1d).

The mode contract of each new mixer / option is the registry-wide suite (tests/test_contract.py:
``qwen3_next_gdn``, ``kimi_kda``, ``lightning_attention``, ``short_conv`` are registered presets) and the
option tests in tests/test_delta_mixers.py, tests/test_general_form.py and tests/test_convolution.py."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    DynamicCache, KimiLinearConfig, KimiLinearForCausalLM, Lfm2Config, Lfm2ForCausalLM, MiniMaxConfig, MiniMaxForCausalLM,
    Qwen3NextConfig, Qwen3NextForCausalLM,
)

from seqmix.interop import from_transformers, seqmix_mixers, supported_families  # noqa: E402
from interop_helpers import (  # noqa: E402
    INTEROP_RTOL, VOCAB, Recorder, assert_generate_equals, assert_logits_equal_in_every_mode, converted, ids,
    prefill_and_step, randomize, scale_err,
)

FAMILIES = ["qwen3_next", "qwen3_next_mha", "kimi_linear", "minimax", "lfm2"]

#: the mixer each layer becomes (None: the layer stays transformers' own)
LAYERS = {
    "qwen3_next": {"model.layers.0.linear_attn": "qwen3_next_gdn", "model.layers.1.self_attn": "softmax_attention",
                   "model.layers.2.linear_attn": "qwen3_next_gdn", "model.layers.3.self_attn": "softmax_attention"},
    "qwen3_next_mha": {"model.layers.0.self_attn": "softmax_attention", "model.layers.1.linear_attn": "qwen3_next_gdn"},
    "kimi_linear": {"model.layers.0.self_attn": "kimi_kda", "model.layers.1.self_attn": "softmax_attention",
                    "model.layers.2.self_attn": "kimi_kda"},
    "minimax": {"model.layers.0.self_attn": "softmax_attention", "model.layers.1.self_attn": "lightning_attention",
                "model.layers.2.self_attn": "lightning_attention"},
    "lfm2": {"model.layers.0.conv": "short_conv", "model.layers.1.self_attn": "softmax_attention", "model.layers.2.conv": "short_conv"},
}


def config(family: str, **overrides):
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_attention_heads=4, pad_token_id=0, bos_token_id=1,
                  eos_token_id=1)
    if family.startswith("qwen3_next"):
        kw = dict(common, num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                  num_experts=4, num_experts_per_tok=2, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25})
        if family == "qwen3_next":  # GVA: 2 key heads, 4 value heads; linear / attention alternating
            kw.update(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4,
                      layer_types=["linear_attention", "full_attention"] * 2)
        else:  # as many key as value heads, attention first
            kw.update(num_hidden_layers=2, linear_num_key_heads=4, linear_num_value_heads=4,
                      layer_types=["full_attention", "linear_attention"])
        return Qwen3NextConfig(**{**kw, **overrides})
    if family == "kimi_linear":
        kw = dict(common, num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                  v_head_dim=8, qk_nope_head_dim=8, moe_intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                  linear_head_dim=8, linear_num_heads=4, layer_types=["linear_attention", "full_attention", "linear_attention"])
        return KimiLinearConfig(**{**kw, **overrides})
    if family == "minimax":  # block_size 4 < the prompt: lightning's block algorithm spans several blocks
        kw = dict(common, num_hidden_layers=3, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                  block_size=4, layer_types=["full_attention", "linear_attention", "linear_attention"])
        return MiniMaxConfig(**{**kw, **overrides})
    if family == "lfm2":
        kw = dict(common, num_hidden_layers=3, num_key_value_heads=2, conv_L_cache=3, layer_types=["conv", "full_attention", "conv"])
        return Lfm2Config(**{**kw, **overrides})
    raise KeyError(family)


CLASSES = {"qwen3_next": Qwen3NextForCausalLM, "kimi_linear": KimiLinearForCausalLM, "minimax": MiniMaxForCausalLM,
           "lfm2": Lfm2ForCausalLM}


def tiny(family: str, *, attn: str = "sdpa", **overrides) -> nn.Module:
    """A tiny random transformers model of ``family`` (eval mode, float32), every weight random:
    projections ~ N(0, 1/fan_in)·1.5, decay parameters moved off their initialization, norm weights off 1 / 0."""
    torch.manual_seed(0)
    cfg = config(family, attn_implementation=attn, **overrides)
    m = CLASSES[cfg.model_type](cfg)
    return randomize(m, moved=("A_log", "dt_bias"))


#: measured errors (max |logit error| / max |logit|), printed by ``pytest -s``
record = Recorder("interop frontier")


# ------------------------------------------------------------------------------------------
# the converted model
# ------------------------------------------------------------------------------------------


def test_the_families_are_supported():
    fams = supported_families()
    assert {"qwen3_next", "kimi_linear", "minimax", "lfm2"} <= set(fams)


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_is_the_same_class_and_the_original_is_unchanged(family):
    m = tiny(family)
    c = converted(m)
    want = LAYERS[family]
    assert {p: mx.registry_name for p, mx in seqmix_mixers(c).items()} == {p: n for p, n in want.items() if n}
    kept = {p: type(m.get_submodule(p)).__name__ for p, n in want.items() if n is None}
    assert getattr(c, "seqmix_kept", {}) == kept  # what `seqmix show --hf --report` lists as transformers' own
    for p in kept:
        assert type(c.get_submodule(p)) is type(m.get_submodule(p))
    # the sizes the adapter configs read
    mixers = seqmix_mixers(c)
    cfg = m.config
    if family.startswith("qwen3_next"):
        gdn = next(mx for mx in mixers.values() if mx.registry_name == "qwen3_next_gdn")
        assert (gdn.H, gdn.Hk, gdn.K, gdn.V) == (cfg.linear_num_value_heads, cfg.linear_num_key_heads, 8, 8)
        att = next(mx for mx in mixers.values() if mx.registry_name == "softmax_attention")
        assert (att.heads, att.kv_heads, att.config.rotary_dim, att.config.qk_norm, att.config.output_gate) == (4, 2, 4, "head", True)
    elif family == "minimax":
        la = mixers["model.layers.2.self_attn"]
        slopes = m.get_submodule("model.layers.2.self_attn").slope_rate.flatten()
        assert torch.equal(-la._decay(torch.zeros(1, 1, 32))[0][0, 0], slopes.double().float().to(torch.float32))
    elif family == "lfm2":
        assert mixers["model.layers.0.conv"].config.width == 3


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_in_every_mode_float32(family):
    """Every mode of every converted mixer (a hybrid's other mixers run "auto"), with and without
    transformers' cache object in the call."""
    m = tiny(family)
    assert_logits_equal_in_every_mode(m, from_transformers(m), ids(), family, record)


@pytest.mark.parametrize("family", ["qwen3_next", "minimax", "lfm2"])
def test_logits_equal_with_eager_attention(family):
    m = tiny(family, attn="eager")
    c = from_transformers(m)
    x = ids()
    with torch.no_grad():
        err = record(f"{family} eager", scale_err(c(x, use_cache=False).logits, m(x, use_cache=False).logits))
    assert err <= INTEROP_RTOL


# ------------------------------------------------------------------------------------------
# decoding through the seqmix mixers' own state
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_the_original_at_every_step(family, monkeypatch):
    m = tiny(family)
    assert_generate_equals(m, from_transformers(m), ids(T=7), 8, monkeypatch, family, record)


def _cache_of(model):
    if model.config.model_type == "minimax":
        from transformers.models.minimax.modeling_minimax import MiniMaxCache

        return MiniMaxCache()
    return DynamicCache(config=model.config)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_state_lives_in_the_transformers_cache(family):
    """After a prefill and one step, transformers' cache object holds each converted layer's state in
    the original's layout (conv windows, delta-rule / lightning states, keys and values) equal to the
    original's; a 4-token continuation through the cache equals one pass."""
    m = tiny(family)
    c = from_transformers(m)
    x = ids(T=16)
    with torch.no_grad():
        ref, mine = prefill_and_step((m, c), x, _cache_of)
        for path, name in LAYERS[family].items():
            i = int(path.split(".")[2])
            if name in ("qwen3_next_gdn", "kimi_kda", "short_conv"):
                # transformers keeps the last W inputs, seqmix the W - 1 the next step reads (the oldest column,
                # never read again, is written as zeros)
                assert max_abs_rel(mine.get_conv_state(i)[..., 1:], ref.get_conv_state(i)[..., 1:]) <= INTEROP_RTOL, path
                if name != "short_conv":
                    assert max_abs_rel(mine.get_recurrent_state(i), ref.get_recurrent_state(i)) <= INTEROP_RTOL, path
            elif name == "lightning_attention":
                assert max_abs_rel(mine.get_linear_cache(i), ref.get_linear_cache(i)) <= INTEROP_RTOL, path
            elif name == "softmax_attention":
                assert max_abs_rel(mine.layers[i].keys, ref.layers[i].keys) <= INTEROP_RTOL, path
                assert max_abs_rel(mine.layers[i].values, ref.layers[i].values) <= INTEROP_RTOL, path
        full = m(x, use_cache=False).logits
        assert scale_err(c(x[:, 12:], cache=mine, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL


def max_abs_rel(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a.float() - b.float()).abs().max()) / max(float(b.abs().max()), 1e-30)


def test_a_lightning_state_written_by_the_original_continues_in_the_converted_model():
    """MiniMaxCache is transformers' own object: a state the original wrote is read by the converted
    lightning layers (and the attention layer's keys once), and the other way round."""
    m = tiny("minimax")
    c = from_transformers(m)
    x = ids(T=12)
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    with torch.no_grad():
        full = m(x, use_cache=False).logits
        cache = MiniMaxCache()
        m(x[:, :9], cache=cache, use_cache=True)
        steps = [c(x[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(9, 11)]
        steps.append(m(x[:, 11:], cache=cache, use_cache=True).logits)
        assert scale_err(torch.cat(steps, 1), full[:, 9:]) <= INTEROP_RTOL


# ------------------------------------------------------------------------------------------
# the DSF view of the converted layers
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3_next", "kimi_linear", "minimax", "lfm2"])
def test_converted_linear_layers_keep_their_maps(family):
    """phi(x) of each converted finite-state layer reproduces its core output (the map of the real layer)."""
    c = from_transformers(tiny(family)).double()
    h = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for path, mx in seqmix_mixers(c).items():
        if not mx.finite_state:
            continue
        with torch.no_grad():
            values, mixed = mx.core(h)
            phi = mx.phi(h)
        assert float((torch.einsum("bmts,bsmp->btmp", phi, values) - mixed).abs().max()) < 1e-10, path
        assert mx.state_size() > 0


# ------------------------------------------------------------------------------------------
# bad input is named
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family, overrides, option, path", [
    ("qwen3_next", {"hidden_act": "gelu"}, "hidden_act", "model.layers.0.linear_attn"),
    ("kimi_linear", {"hidden_act": "gelu"}, "hidden_act", "model.layers.0.self_attn"),
    ("minimax", {"hidden_act": "gelu"}, "hidden_act", "model.layers.1.self_attn"),
    ("minimax", {"sliding_window": 4}, "sliding_window", "model.layers.0.self_attn"),
])
def test_an_option_seqmix_cannot_express_is_named(family, overrides, option, path):
    m = tiny(family, **overrides)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(ValueError, match=re.escape(path) + ".*" + re.escape(repr(option))):
        from_transformers(m, inplace=True)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    assert not any(type(x).__name__ == "InteropMixer" for x in m.modules())


def test_edited_lightning_decay_buffers_are_named():
    m = tiny("minimax")
    with torch.no_grad():
        m.model.layers[1].self_attn.key_decay.mul_(0.5)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn.*'key_decay'"):
        from_transformers(m)


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_is_refused(family):
    c = from_transformers(tiny(family))
    x = ids(T=9)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="attention_mask"):
        c(x, attention_mask=mask)


def test_a_cache_without_the_lightning_slots_is_refused():
    c = from_transformers(tiny("minimax"))
    with pytest.raises(ValueError, match="get_linear_cache"):
        c.model.layers[1].self_attn(torch.randn(1, 3, 32), cache=DynamicCache(), attention_mask=None)


def test_an_unknown_module_in_a_kimi_slot_is_named():
    """Anything but KimiLinearDeltaAttention and KimiLinearAttention in a mixer slot is refused."""
    m = tiny("kimi_linear")
    m.model.layers[1].self_attn = nn.Identity()
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn.*Identity.*KimiLinearDeltaAttention"):
        from_transformers(m)
