"""seqmix.interop: transformers' Mamba, Falcon-Mamba and Mamba-2 converted to seqmix mixers,
exactly (docs/interop.md). Nothing is downloaded: tiny random models are built from
transformers' config classes, and transformers runs its torch paths (no mamba_ssm /
causal_conv1d kernels are needed)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    DynamicCache, FalconMambaConfig, FalconMambaForCausalLM, Mamba2Config,
    Mamba2ForCausalLM, MambaConfig, MambaForCausalLM,
)

import seqmix  # noqa: E402
from seqmix.interop import InteropMixer, from_transformers, seqmix_mixers, supported_families  # noqa: E402
from seqmix.mixers.base import Cache  # noqa: E402
from interop_helpers import (  # noqa: E402
    INTEROP_RTOL, VOCAB, assert_beam_search_equal, assert_generate_equals, assert_logits_equal_in_every_mode,
    assert_refused, convert, converted, fine_tune, ids, prefill_and_step, scale_err, unchanged,
)
from tolerances import assert_modes_agree_f64, max_abs  # noqa: E402

#: converted vs original logits in float64 for Mamba: transformers' torch scan rounds A (-exp(A_log.float())), the Δ
#: bias, B and x to float32 (eps 6e-8) even in a float64 model (measured: 3e-10 to 2e-8 of the
#: scale); Falcon-Mamba's B/C/Δ norms and Mamba-2's chunk scan run wholly in float32 inside
#: transformers, so INTEROP_RTOL is their bound in float64 too
INTEROP_F64_RTOL = {"mamba": 1e-7, "mamba_bias": 1e-7}


def tiny(family: str, **overrides) -> nn.Module:
    """A tiny random transformers model of ``family`` (eval mode, float32)."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, pad_token_id=0, eos_token_id=1,
                  bos_token_id=1)
    if family in ("mamba", "mamba_bias"):
        extra = dict(use_bias=True, use_conv_bias=False, time_step_rank=3) if family == "mamba_bias" else {}
        m = MambaForCausalLM(MambaConfig(**{**common, **extra, **overrides}))
    elif family == "falcon_mamba":
        m = FalconMambaForCausalLM(FalconMambaConfig(**{**common, "mixer_rms_eps": 1e-5, **overrides}))
    elif family == "mamba2":
        m = Mamba2ForCausalLM(Mamba2Config(**{**common, "num_heads": 8, "head_dim": 8, "n_groups": 2, "chunk_size": 8,
                                               **overrides}))
    else:
        raise KeyError(family)
    with torch.no_grad():  # move D and the biases off their initial 1 / 0 so that every weight matters
        for name, p in m.named_parameters():
            if name.endswith((".D", "conv1d.bias", "in_proj.bias", "out_proj.bias", "norm.weight")):
                p.add_(0.1 * torch.randn_like(p))
    return m.eval()


FAMILIES = ["mamba", "mamba_bias", "falcon_mamba", "mamba2"]


# ------------------------------------------------------------------------------------------
# the converted model
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_is_the_same_class_and_the_original_is_unchanged(family):
    m = tiny(family)
    c = converted(m)
    mixers = seqmix_mixers(c)
    n = m.config.num_hidden_layers
    assert sorted(mixers) == [f"backbone.layers.{i}.mixer" for i in range(n)]
    assert all(isinstance(mx, seqmix.mixers.base.Mixer) for mx in mixers.values())
    assert all(isinstance(c.get_submodule(p), InteropMixer) for p in mixers)
    # embeddings, norms and the head stay transformers' own (copied, not shared)
    assert type(c.backbone.layers[0].norm) is type(m.backbone.layers[0].norm)
    assert c.backbone.embeddings.weight.data_ptr() != m.backbone.embeddings.weight.data_ptr()
    inplace = from_transformers(m, inplace=True)
    assert inplace is m and isinstance(m.backbone.layers[0].mixer, InteropMixer)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_in_every_mode_float32(family):
    m = tiny(family)
    assert_logits_equal_in_every_mode(m, convert(m), ids(), family)


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_equal_float64(family):
    m = tiny(family).double()
    c = convert(m)
    x = ids()
    with torch.no_grad():
        ref = m.backbone(x).last_hidden_state
        for mode in next(iter(seqmix_mixers(c).values())).modes:
            for mx in seqmix_mixers(c).values():
                mx.mode = mode
            out = c.backbone(x).last_hidden_state
            assert out.dtype == torch.float64
            assert scale_err(out, ref) <= INTEROP_F64_RTOL.get(family, INTEROP_RTOL), f"{family}, mode {mode}"


def test_from_transformers_sets_the_mode():
    c = from_transformers(tiny("mamba2"), mode="parallel")
    assert {mx.mode for mx in seqmix_mixers(c).values()} == {"parallel"}
    with pytest.raises(ValueError, match=r"'mode'.*backbone\.layers\.0\.mixer|backbone\.layers\.0\.mixer.*'mode'"):
        from_transformers(tiny("mamba"), mode="fft")


# ------------------------------------------------------------------------------------------
# decoding through the mixers' own state
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_the_original_at_every_step(family, monkeypatch):
    m = tiny(family)
    assert_generate_equals(m, convert(m), ids(T=7), 6, monkeypatch, family)


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_beam_search_reorders_the_state(family):
    m = tiny(family)
    assert_beam_search_equal(m, convert(m))


@pytest.mark.parametrize("family", FAMILIES)
def test_cache_state_layout_and_continuation(family):
    """transformers' cache object holds the same state in both models (after a prefill and after
    a decoding step), and a multi-token continuation through the cache equals one pass."""
    m = tiny(family)
    c = convert(m)
    x = ids(T=16)
    with torch.no_grad():
        ref, mine = prefill_and_step((m, c), x, lambda model: DynamicCache(config=model.config))
        for i in range(m.config.num_hidden_layers):
            assert scale_err(mine.get_recurrent_state(i), ref.get_recurrent_state(i)) <= INTEROP_RTOL
            # column 0 of transformers' conv window is never read (seqmix keeps the W - 1 inputs it needs)
            assert max_abs(mine.get_conv_state(i)[..., 1:], ref.get_conv_state(i)[..., 1:]) <= 1e-6
        # continue with 4 tokens at once: the converted model equals the original's one pass
        # (transformers' own Mamba / Falcon-Mamba torch scan restarts a multi-token continuation from a
        # zero SSM state, so only Mamba-2's original is compared with itself here)
        full = m(x).logits
        out = c(x[:, 12:], cache=mine, use_cache=True).logits
        assert scale_err(out, full[:, 12:]) <= INTEROP_RTOL
        if family == "mamba2":
            assert scale_err(m(x[:, 12:], cache=ref, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL


def test_old_cache_keywords_are_read():
    m = tiny("mamba")
    c = convert(m)
    adapter = c.backbone.layers[0].mixer
    h = torch.randn(2, 5, 32)
    outs = []
    for key in ("cache", "cache_params", "past_key_values"):
        cache = DynamicCache(config=c.config)
        with torch.no_grad():
            outs.append(adapter(h, **{key: cache}))
        assert cache.get_recurrent_state(0) is not None
    assert all(torch.equal(o, outs[0]) for o in outs)
    with pytest.raises(ValueError, match="once"):
        adapter(h, cache=DynamicCache(config=c.config), cache_params=DynamicCache(config=c.config))


# ------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------


def test_fine_tuning_a_converted_mamba_lowers_the_loss(monkeypatch):
    m = tiny("mamba")
    losses, modes = fine_tune(convert(m, mode="chunk").train(), monkeypatch)
    assert modes == {"chunk"}
    assert losses[-1] < 0.7 * losses[0], losses
    assert unchanged(tiny("mamba"), m)  # the original did not move


# ------------------------------------------------------------------------------------------
# options the real models need, under the mode contract
# ------------------------------------------------------------------------------------------


def test_falcon_mamba_is_a_registered_preset_with_bcdt_rms():
    """bcdt_rms gets the whole contract suite through the registered preset 'falcon_mamba'."""
    entry = seqmix.mixer_entry("falcon_mamba")
    assert entry.defaults["bcdt_rms"] is True
    m = seqmix.build_mixer("falcon_mamba", **entry.example_config())
    plain = seqmix.build_mixer("mamba", **entry.example_config())
    plain.load_state_dict(m.state_dict())  # the norms are weightless: same parameters
    x = torch.randn(2, 9, 16)
    assert max_abs(m(x), plain(x)) > 1e-3


def test_mamba2_dt_limit_clamps_in_every_mode():
    entry = seqmix.mixer_entry("mamba2")
    torch.manual_seed(0)
    m = seqmix.build_mixer("mamba2", **entry.example_config(), dt_limit=(0.02, 0.05)).double()
    x = torch.randn(2, 19, 16, dtype=torch.float64)
    delta = m._inputs(x)[2].detach()
    assert float(delta.min()) >= 0.02 and float(delta.max()) <= 0.05
    assert bool((delta == 0.05).any()) and bool((delta == 0.02).any())  # the clamp is active here
    y = assert_modes_agree_f64(m, x, "mamba2 with dt_limit")
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], 1)
    assert max_abs(steps, m(x)) < 1e-9
    with pytest.raises(ValueError, match="dt_limit"):
        seqmix.build_mixer("mamba2", **entry.example_config(), dt_limit=(0.1, 0.05))
    assert y is not None


def test_mamba2_time_step_limit_converts():
    m = tiny("mamba2", time_step_limit=(0.0, 0.05))
    c = convert(m)
    assert next(iter(seqmix_mixers(c).values())).config.dt_limit == (0.0, 0.05)
    x = ids()
    with torch.no_grad():
        assert scale_err(c(x).logits, m(x).logits) <= INTEROP_RTOL


def test_converted_mixer_keeps_its_dsf_view():
    c = convert(tiny("mamba"))
    mx = seqmix_mixers(c)["backbone.layers.1.mixer"]
    h = torch.randn(1, 10, 32)
    with torch.no_grad():
        values, mixed = mx.core(h)
        phi = mx.phi(h)
    assert phi.shape == (1, mx.d_inner, 10, 10)
    assert max_abs(torch.einsum("bmts,bsm->btm", phi, values[..., 0]), mixed[..., 0]) < 1e-4


# ------------------------------------------------------------------------------------------
# bad input: a clear error, never a silently different model
# ------------------------------------------------------------------------------------------


def test_unsupported_family():
    from transformers import OPTConfig, OPTForCausalLM  # (the transformers seqmix converts: tests/test_interop_transformers.py)

    opt = OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=2,
                                   max_position_embeddings=64, word_embed_proj_dim=32, bos_token_id=1, eos_token_id=1))
    with pytest.raises(ValueError, match=r"unsupported family 'opt'.*mamba"):
        from_transformers(opt)
    with pytest.raises(ValueError, match="unsupported family"):
        from_transformers(nn.Linear(2, 2))
    assert {"mamba", "falcon_mamba", "mamba2", "rwkv", "xlstm"} <= set(supported_families())


@pytest.mark.parametrize("family, overrides, option", [
    ("mamba", {"hidden_act": "gelu"}, "hidden_act"),
    ("mamba", {"time_step_rank": 100}, "time_step_rank"),
    ("mamba2", {"hidden_act": "relu"}, "hidden_act"),
    ("mamba2", {"n_groups": 3}, "n_groups"),
])
def test_an_option_seqmix_cannot_express_is_named(family, overrides, option):
    m = tiny(family, **overrides)
    assert_refused(m, rf"backbone\.layers\.0\.mixer.*'{option}'")


def test_unsupported_module_in_a_mixer_slot():
    m = tiny("mamba")
    m.backbone.layers[1].mixer = nn.Identity()
    with pytest.raises(ValueError, match=r"backbone\.layers\.1\.mixer.*Identity.*MambaMixer"):
        from_transformers(m)
    with pytest.raises(ValueError, match="already converted"):
        from_transformers(from_transformers(tiny("mamba")))


def test_quantized_and_meta_models_are_refused(monkeypatch):
    m = tiny("mamba")
    monkeypatch.setattr(m.config, "quantization_config", {"quant_method": "bitsandbytes"}, raising=False)
    with pytest.raises(ValueError, match=r"quantization_config.*bitsandbytes"):
        from_transformers(m)
    m = tiny("mamba")
    m.backbone.layers[0].mixer.D = nn.Parameter(torch.ones(64, dtype=torch.int8), requires_grad=False)
    with pytest.raises(ValueError, match=r"backbone\.layers\.0\.mixer.*'D'.*int8"):
        from_transformers(m)
    with torch.device("meta"):
        meta = MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=1))
    with pytest.raises(ValueError, match=r"backbone\.layers\.0\.mixer.*meta"):
        from_transformers(meta)


def test_padding_and_unknown_arguments_are_refused():
    c = convert(tiny("mamba"))
    x = ids(T=6)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    with pytest.raises(ValueError, match=r"backbone\.layers\.0\.mixer.*attention_mask.*padding"):
        c(x, attention_mask=mask)
    with torch.no_grad():  # an all-ones mask is no mask
        assert torch.equal(c(x, attention_mask=torch.ones_like(x)).logits, c(x).logits)
    with pytest.raises(ValueError, match="seq_idx"):
        c.backbone.layers[0].mixer(torch.randn(1, 3, 32), seq_idx=torch.zeros(1, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="seqmix_mixers.*from_transformers"):
        seqmix_mixers(tiny("mamba"))
