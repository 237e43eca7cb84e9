"""seqmix.interop for the Mamba hybrids: Bamba, GraniteMoeHybrid, Nemotron-H, Falcon-H1,
Jamba and Zamba2. Every Mamba-2 layer becomes seqmix's ``mamba2`` (Jamba's Mamba layers
``jamba_mamba``), every attention layer ``softmax_attention``; MLPs, MoE blocks, norms and the decoder
layers' multipliers stay transformers' own. In the style of tests/test_interop.py and
tests/test_interop_attention.py: tiny random models from transformers' config classes (nothing
downloaded; transformers on its torch paths), every weight moved off its initial value, 2-4 layers
covering every layer kind of the family, logits equal, greedy generate() equal at every step's
scores, decoding through the seqmix mixers' own state (spy: the prompt once, then T == 1 steps),
and bad input named."""

from __future__ import annotations


import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    BambaConfig, BambaForCausalLM, DynamicCache, FalconH1Config, FalconH1ForCausalLM, GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM, JambaConfig, JambaForCausalLM, NemotronHConfig, NemotronHForCausalLM, Zamba2Config,
    Zamba2ForCausalLM,
)

import seqmix  # noqa: E402
from seqmix.interop import InteropMixer, from_transformers, seqmix_mixers, supported_families  # noqa: E402
from seqmix.mixers.base import Cache  # noqa: E402
from seqmix.ops import KVCache  # noqa: E402
from interop_helpers import (  # noqa: E402
    INTEROP_RTOL, VOCAB, Recorder, assert_beam_search_equal, assert_generate_equals,
    assert_logits_equal_in_every_mode, assert_refused, convert, converted, ids, prefill_and_step, randomize,
    scale_err,
)
from tolerances import F64_ATOL, assert_modes_agree_f64, max_abs  # noqa: E402


#: the cases: a family and a variant of its options; each builds every layer kind of its family
CASES = [
    "bamba", "bamba_bias", "granitemoehybrid", "granitemoehybrid_rope", "nemotron_h", "falcon_h1", "falcon_h1_norm",
    "falcon_h1_norm_after_gate", "jamba", "zamba2", "zamba2_rope",
]


def _config(case: str, **overrides):
    common = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                  pad_token_id=0, bos_token_id=1, eos_token_id=1)
    mamba2 = dict(mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=8, mamba_chunk_size=8)  # head_dim 64/8 = 8
    family = case.split("_")[0] if not case.startswith(("falcon_h1", "nemotron_h")) else case[:9] if case.startswith(
        "falcon_h1") else "nemotron_h"
    if family == "bamba":  # layers: mamba, attention (partial RoPE 0.5, GQA)
        kw = dict(common, **mamba2, num_hidden_layers=2, attn_layer_indices=[1])
        if case == "bamba_bias":
            kw.update(attention_bias=True, mamba_proj_bias=True, mamba_conv_bias=False)
        return BambaConfig, BambaForCausalLM, {**kw, **overrides}
    if family == "granitemoehybrid":  # layers: mamba, attention, mamba; MoE with a shared MLP; μP multipliers
        kw = dict(common, **mamba2, num_hidden_layers=3, layer_types=["mamba", "attention", "mamba"], num_local_experts=4,
                  num_experts_per_tok=2, shared_intermediate_size=48, attention_multiplier=0.3, residual_multiplier=0.8,
                  embedding_multiplier=2.0, logits_scaling=1.5)
        if case == "granitemoehybrid_rope":
            kw.update(position_embedding_type="rope", layer_types=["attention", "mamba", "attention"])
        return GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM, {**kw, **overrides}
    if family == "nemotron_h":  # layers: Mamba-2, attention, MLP, MoE
        kw = dict(common, layers_block_type=["mamba", "attention", "mlp", "moe"], mamba_num_heads=8, mamba_head_dim=8,
                  n_groups=2, ssm_state_size=8, chunk_size=8, n_routed_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, moe_shared_expert_intermediate_size=32)
        return NemotronHConfig, NemotronHForCausalLM, {**kw, **overrides}
    if family == "falcon_h1":  # 2 layers, each attention and Mamba-2 in parallel; inner width 48 = 1.5·hidden (d_inner)
        kw = dict(common, num_hidden_layers=2, mamba_d_ssm=48, mamba_n_heads=6, mamba_n_groups=2, mamba_d_state=8,
                  mamba_chunk_size=8, key_multiplier=0.5, attention_in_multiplier=0.7, attention_out_multiplier=1.3,
                  ssm_in_multiplier=0.8, ssm_out_multiplier=1.2, ssm_multipliers=[1.5, 0.5, 2.0, 0.7, 1.1],
                  embedding_multiplier=1.7, lm_head_multiplier=0.6, mlp_multipliers=[0.9, 1.1])
        if case == "falcon_h1_norm":  # the gated RMSNorm, norm before the gate (mamba_norm_before_gate = True)
            kw.update(mamba_rms_norm=True, mamba_norm_before_gate=True)
        if case == "falcon_h1_norm_after_gate":
            kw.update(mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_proj_bias=True, projectors_bias=True,
                      attention_bias=True)
        return FalconH1Config, FalconH1ForCausalLM, {**kw, **overrides}
    if family == "jamba":  # layers: mamba, attention + MoE, mamba, attention + MoE
        kw = dict(common, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_dt_rank=4)
        return JambaConfig, JambaForCausalLM, {**kw, **overrides}
    if family == "zamba2":  # layers: mamba, hybrid, mamba, hybrid (one shared attention block, used twice)
        kw = dict(common, num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_d_state=8,
                  n_mamba_heads=8, mamba_ngroups=2, chunk_size=8, num_key_value_heads=4)
        if case == "zamba2_rope":  # RoPE in the shared block, two shared blocks used alternately, GQA
            kw.update(use_mem_rope=True, num_mem_blocks=2, num_key_value_heads=2,
                      layers_block_type=["hybrid", "mamba", "hybrid", "hybrid"])
        return Zamba2Config, Zamba2ForCausalLM, {**kw, **overrides}
    raise KeyError(case)


#: the projections' gain: Zamba2's attention scale (head_dim / 2)^(-1/2) and its 2·hidden_size input make
#: its attention sharper at the same gain (near-argmax rows amplify float32 rounding): 1.0 there
GAIN = {"zamba2": 1.0}


def tiny(case: str, *, attn: str = "sdpa", **overrides) -> nn.Module:
    """A tiny random transformers model of ``case`` (eval mode, float32), every weight random:
    projections ~ N(0, 1/fan_in)·1.5, biases and D ~ 0.3 N(0, 1), norm weights 1 + 0.2 N(0, 1),
    A_log and the Δ bias moved off their initial values."""
    gain = GAIN.get(case.split("_")[0], 1.5)
    cfg_cls, model_cls, kw = _config(case, **overrides)
    torch.manual_seed(0)
    m = model_cls(cfg_cls(**kw, attn_implementation=attn))
    return randomize(m, gain=gain, moved=("A_log",), add_vectors=True, rule=_dt_bias)


def _dt_bias(name, p, r) -> bool:
    """Δ bias ~ 0.5 N(0, 1): Δ well above time_step_min (see test_time_step_min_...)."""
    if name.endswith("dt_bias"):
        p.copy_(0.5 * r)
        return True
    return False


def layer_kinds(m) -> dict[str, str]:
    """{module path: seqmix mixer it must become}, from the model's own layer pattern."""
    cfg, out = m.config, {}
    mt = cfg.model_type
    if mt == "zamba2":
        for i, t in enumerate(cfg.layers_block_type):
            if t == "hybrid":
                out[f"model.layers.{i}.shared_transformer.self_attn"] = "softmax_attention"
                out[f"model.layers.{i}.mamba_decoder.mamba"] = "mamba2"
            else:
                out[f"model.layers.{i}.mamba"] = "mamba2"
        return out
    if mt == "falcon_h1":
        for i in range(cfg.num_hidden_layers):
            out[f"model.layers.{i}.mamba"], out[f"model.layers.{i}.self_attn"] = "mamba2", "softmax_attention"
        return out
    types = list(cfg.layers_block_type)
    ssm = "jamba_mamba" if mt == "jamba" else "mamba2"
    for i, t in enumerate(types):
        if mt == "nemotron_h":
            if t in ("mamba", "linear_attention"):
                out[f"model.layers.{i}.mixer"] = ssm
            elif t in ("attention", "full_attention"):
                out[f"model.layers.{i}.mixer"] = "softmax_attention"
        elif t in ("mamba", "linear_attention"):
            out[f"model.layers.{i}.mamba"] = ssm
        else:
            out[f"model.layers.{i}.self_attn"] = "softmax_attention"
    return out


def pos(a: int, b: int) -> torch.Tensor:
    """position_ids a..b-1: BambaModel (and GraniteMoeHybrid's, Falcon-H1's) start every call without
    position_ids at position 0, also after a cached prefix (generate() passes them; a direct call must)."""
    return torch.arange(a, b)[None]


#: measured errors (max |logit error| / max |logit|), printed by ``pytest -s``
record = Recorder("interop hybrids")


# ------------------------------------------------------------------------------------------
# the converted model
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_every_mixer_is_converted_and_the_original_is_unchanged(case):
    m = tiny(case)
    c = converted(m, convert)
    assert not any(isinstance(x, InteropMixer) for x in m.modules())
    kinds = {p: mx.registry_name for p, mx in seqmix_mixers(c).items()}
    assert kinds == layer_kinds(m)
    assert {"mamba2", "softmax_attention"} <= set(kinds.values()) or {"jamba_mamba", "softmax_attention"} <= set(kinds.values())
    # MLPs, MoE blocks and norms stay transformers' own (copied, not shared)
    emb = "model.embeddings" if case == "nemotron_h" else "model.embed_tokens"
    assert c.get_submodule(emb).weight.data_ptr() != m.get_submodule(emb).weight.data_ptr()
    inplace = from_transformers(m, inplace=True)
    assert inplace is m and sum(isinstance(x, InteropMixer) for x in m.modules()) == len(kinds)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", CASES)
def test_logits_equal_in_every_mode_float32(case, attn):
    m = tiny(case, attn=attn)
    assert_logits_equal_in_every_mode(m, convert(m), ids(), f"{case} {attn}", record)


def _rope64(T: int, R: int, theta: float):
    """transformers' default RoPE (cos, sin) over R channels (rotate_half layout), in float64."""
    inv = 1.0 / theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    freqs = torch.arange(T, dtype=torch.float64)[None, :, None] * inv
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos(), emb.sin()


#: each converted attention module against its original in float64 (SDPA, float64 RoPE tables)
MODULE_F64_RTOL = 1e-12


@pytest.mark.parametrize("case", ["bamba", "granitemoehybrid", "nemotron_h", "falcon_h1_norm", "jamba", "zamba2_rope"])
def test_each_converted_module_equals_the_original_in_float64(case):
    """Module by module in float64: each attention layer tightly (SDPA, transformers' RoPE cos/sin made
    float64), each Mamba / Mamba-2 layer to the float32 bound (transformers' Mamba-2 chunk scan casts to
    float32 even in a float64 model, Jamba's selective scan and RMSNorms compute in float32)."""
    m = tiny(case, attn="sdpa").double()
    c = convert(m)
    T = 13
    for path, kind in layer_kinds(m).items():
        orig, adapter = m.get_submodule(path), c.get_submodule(path)
        d_in = orig.q_proj.in_features if kind == "softmax_attention" else m.config.hidden_size
        h = torch.randn(2, T, d_in, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        kw, bound = {}, INTEROP_RTOL
        with torch.no_grad():
            if kind == "softmax_attention":
                mx, bound = adapter.mixer, MODULE_F64_RTOL
                rope = _rope64(T, mx.config.rotary_dim or mx.head_qk, mx.config.rope_theta) if mx.config.rope else None
                kw = {"layer_idx": adapter.layer_idx} if m.config.model_type == "zamba2" else {}
                y_ref = orig(h, position_embeddings=rope, attention_mask=None, **kw)[0]
            else:
                y_ref = orig(h)
            for mode in adapter.mixer.modes:
                adapter.mixer.mode = mode
                y = adapter(h, **kw)
                y = y[0] if isinstance(y, tuple) else y
                assert y.dtype == torch.float64 and y.shape == y_ref.shape
                err = record(f"{case} module float64 {type(orig).__name__} {mode}", scale_err(y, y_ref))
                assert err <= bound, f"{path}, mode {mode}: {err:.3g}"


# ------------------------------------------------------------------------------------------
# decoding through the mixers' own state
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_generate_equals_the_original_at_every_step(case, monkeypatch):
    m = tiny(case)
    assert_generate_equals(m, convert(m), ids(T=7), 8, monkeypatch, case, record)


@pytest.mark.parametrize("case", ["bamba", "falcon_h1", "jamba", "zamba2"])
def test_beam_search_reorders_the_state(case):
    m = tiny(case)
    assert_beam_search_equal(m, convert(m))


@pytest.mark.parametrize("case", CASES)
def test_the_state_lives_in_the_transformers_cache(case):
    """After a prefill and a step, transformers' cache object holds the same state in both models: the
    Mamba layers' conv window (column 0 is never read) and SSM state in its linear-attention slots, the
    attention layers' keys and values (seqmix's KVCache kept in the layer, its views) — in a hybrid
    cache layer both at once (Zamba2's hybrid layers, every Falcon-H1 layer). A 4-token continuation
    through the cache equals one pass, in the converted model and in the original."""
    m = tiny(case)
    c = convert(m)
    x = ids(T=16)
    with torch.no_grad():
        ref, mine = prefill_and_step((m, c), x, lambda model: DynamicCache(config=model.config), positions=True)
        for path, kind in layer_kinds(m).items():
            i = c.get_submodule(path).layer_idx
            if kind == "softmax_attention":
                layer, theirs = mine.layers[i], ref.layers[i]
                assert type(layer) is type(theirs)
                assert isinstance(layer._seqmix_kv, KVCache) and layer._seqmix_kv.seen == 12
                assert layer.keys.shape == theirs.keys.shape
                # after earlier Mamba layers (the C++ scan's float32 sums on CPU): relative, as every float32 comparison here
                assert scale_err(layer.keys, theirs.keys) <= 2e-5 and scale_err(layer.values, theirs.values) <= 2e-5
            else:
                assert scale_err(mine.get_recurrent_state(i), ref.get_recurrent_state(i)) <= INTEROP_RTOL, path
                assert max_abs(mine.get_conv_state(i)[..., 1:], ref.get_conv_state(i)[..., 1:]) <= 1e-5, path
        full = m(x, use_cache=False).logits
        assert scale_err(c(x[:, 12:], cache=mine, use_cache=True, position_ids=pos(12, 16)).logits, full[:, 12:]) <= INTEROP_RTOL
        if m.config.model_type != "jamba":  # (transformers' Mamba-1 torch scan restarts a multi-token call from 0)
            assert scale_err(m(x[:, 12:], cache=ref, use_cache=True, position_ids=pos(12, 16)).logits, full[:, 12:]) <= INTEROP_RTOL


def test_a_cache_filled_by_the_original_continues_in_the_converted_model():
    """The state is transformers' own cache object: the original fills it, the converted model decodes on."""
    for case in ("falcon_h1", "bamba"):
        m = tiny(case)
        c = convert(m)
        x = ids(T=12)
        with torch.no_grad():
            full = m(x, use_cache=False).logits
            cache = DynamicCache(config=m.config)
            m(x[:, :9], cache=cache, use_cache=True)
            steps = [c(x[:, t : t + 1], cache=cache, use_cache=True, position_ids=pos(t, t + 1)).logits for t in range(9, 12)]
            assert scale_err(torch.cat(steps, 1), full[:, 9:]) <= INTEROP_RTOL, case


# ------------------------------------------------------------------------------------------
# the options these families needed, under the mode contract
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    dict(d_inner=24, headdim=4),  # no multiple of d_model = 16
    dict(gate_norm="before_gate"),
    dict(gate_norm="none"),
    dict(in_multiplier=0.7, zxbcdt_multipliers=(1.5, 0.5, 2.0, 0.7, 1.1)),
    dict(d_inner=24, headdim=4, gate_norm="none", in_multiplier=1.3, zxbcdt_multipliers=(0.6, 1.4, 0.9, 1.7, 0.8), bias=True),
], ids=["d_inner", "before_gate", "no_norm", "mup", "all"])
def test_mamba2_hybrid_options_keep_the_mode_contract(options):
    """Every mode agrees (forward and gradients, float64), step decoding and split-and-carry equal the
    full pass, and phi(x) reproduces the core output, with each option of the hybrids' Mamba-2 layers."""
    entry = seqmix.mixer_entry("mamba2")
    torch.manual_seed(0)
    m = seqmix.build_mixer("mamba2", **{**entry.example_config(), **options}).double()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(2, 19, 16, dtype=torch.float64)
    y = assert_modes_agree_f64(m, x, f"mamba2 {options}")
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], 1)
    assert max_abs(steps, y) < 1e-9
    cache = Cache()
    split = torch.cat([m(x[:, :11], cache=cache), m(x[:, 11:], cache=cache)], 1)
    assert max_abs(split, y) < 1e-9
    with torch.no_grad():
        values, mixed = m.core(x)
        phi = m.phi(x)
    assert max_abs(torch.einsum("bhts,bshp->bthp", phi, values), mixed) < F64_ATOL
    assert ("norm.weight" in m.state_dict()) is (options.get("gate_norm", "gated") != "none")
    assert m.d_inner == options.get("d_inner", 2 * 16) and m.state_size() == m.d_inner * 8 + (m.d_inner + 2 * 2 * 8) * 3
    plain = seqmix.build_mixer("mamba2", **entry.example_config()).double()
    if "d_inner" not in options:
        plain.load_state_dict(m.state_dict(), strict=False)
        assert max_abs(plain(x), y) > 1e-3  # the option changes the output


def test_time_step_min_clamps_in_prefill_and_decoding():
    """Zamba2 and Nemotron-H clamp Δ from below at time_step_min (time_step_limit = (0.001, inf)).
    transformers clamps in its chunked prefill but not in its one-token step (as mamba_ssm); seqmix clamps in
    every mode. With Δ below the floor (Δ bias at -9), the full-sequence logits agree, and the converted
    model's decoding equals its own full pass, where the original's step differs from its own full pass
    (this test fails when transformers clamps in its step: then the original's decoding agrees too)."""
    for case in ("nemotron_h", "zamba2"):
        m = tiny(case)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith("dt_bias"):
                    p.fill_(-9.0)  # softplus(-9 + dt) < 0.001 for most tokens: the clamp is active
        c = convert(m)
        x = ids(T=10)
        with torch.no_grad():
            full = m(x, use_cache=False).logits
            assert scale_err(c(x, use_cache=False).logits, full) <= INTEROP_RTOL, case
            steps = {}
            for name, model in (("original", m), ("converted", c)):
                cache = DynamicCache(config=model.config)
                out = [model(x[:, :6], cache=cache, use_cache=True, position_ids=pos(0, 6)).logits]
                out += [model(x[:, t : t + 1], cache=cache, use_cache=True, position_ids=pos(t, t + 1)).logits for t in range(6, 10)]
                steps[name] = torch.cat(out, 1)
        assert scale_err(steps["converted"], full) <= INTEROP_RTOL, case
        assert scale_err(steps["original"][:, 6:], full[:, 6:]) > 1e-3, case


def test_attention_d_out_keeps_the_mode_contract():
    """softmax_attention's d_out (Zamba2's shared attention: input 2·d, output d): every mode agrees in
    float64, step decoding equals the full pass, and phi(x) still reproduces the mixed values."""
    torch.manual_seed(0)
    m = seqmix.build_mixer("softmax_attention", d_model=16, heads=2, kv_heads=1, head_dim=8, d_out=12, rope=True).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    y = assert_modes_agree_f64(m, x, "softmax_attention d_out")
    assert y.shape == (2, 11, 12) and m.W_o.weight.shape == (12, 16)
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(11)], 1)
    assert max_abs(steps, y) < 1e-9
    with torch.no_grad():
        values, mixed = m.core(x)
        assert max_abs(torch.einsum("bhts,bshp->bthp", m.phi(x), values), mixed) < 1e-9
    with pytest.raises(ValueError, match="d_out"):
        seqmix.build_mixer("softmax_attention", d_model=16, heads=2, d_out=12, output_projection=False)


def test_mamba2_hybrid_options_are_checked():
    for bad, word in [(dict(block=False, gate_norm="none"), "block"), (dict(d_inner=20), "headdim"),
                      (dict(zxbcdt_multipliers=(1.0, 1.0, 0.0, 1.0, 1.0)), "zxbcdt_multipliers"),
                      (dict(gate_norm="after"), "gate_norm")]:
        cfg = {**seqmix.mixer_entry("mamba2").example_config(), **bad}
        with pytest.raises(ValueError, match=word):
            seqmix.build_mixer("ssd" if bad.get("block") is False else "mamba2", **cfg)


def test_jamba_mamba_is_a_registered_preset_with_weighted_norms():
    """bcdt_rms_affine gets the whole contract suite (tests/test_contract.py) through the preset 'jamba_mamba'."""
    entry = seqmix.mixer_entry("jamba_mamba")
    assert entry.defaults["bcdt_rms_affine"] is True
    m = seqmix.build_mixer("jamba_mamba", **entry.example_config())
    assert {"dt_norm.weight", "b_norm.weight", "c_norm.weight"} <= set(m.state_dict())
    falcon = seqmix.build_mixer("falcon_mamba", **entry.example_config())
    falcon.load_state_dict(m.state_dict(), strict=False)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        assert max_abs(m(x), falcon(x)) < 1e-6  # weights 1: Falcon-Mamba's weightless norms
        m.b_norm.weight.mul_(2.0)
        assert max_abs(m(x), falcon(x)) > 1e-4
    with pytest.raises(ValueError, match="bcdt_rms_affine"):
        seqmix.build_mixer("mamba", d_model=16, bcdt_rms_affine=True)


def test_falcon_h1_options_map_to_the_mixer_config():
    c = convert(tiny("falcon_h1_norm"))
    mx = seqmix_mixers(c)["model.layers.0.mamba"]
    assert (mx.d_inner, mx.config.gate_norm, mx.config.in_multiplier) == (48, "before_gate", 0.8)
    assert mx.config.zxbcdt_multipliers == (1.5, 0.5, 2.0, 0.7, 1.1)
    att = seqmix_mixers(c)["model.layers.0.self_attn"]
    assert att.config.rope and att.config.rotary_dim is None
    # key_multiplier is folded into W_k's rows: the cached keys are transformers' own (tested above)
    orig = tiny("falcon_h1_norm").model.layers[0].self_attn
    K = orig.k_proj.out_features
    assert torch.allclose(att.W_qk.weight[-K:], 0.5 * orig.k_proj.weight)
    assert seqmix_mixers(convert(tiny("falcon_h1")))["model.layers.1.mamba"].config.gate_norm == "none"


def test_bamba_and_granite_attention_options():
    att = seqmix_mixers(convert(tiny("bamba")))["model.layers.1.self_attn"]
    assert (att.config.rope, att.config.rotary_dim, att.kv_heads) == (True, 4, 2)  # head_dim 8, partial_rotary_factor 0.5
    g = seqmix_mixers(convert(tiny("granitemoehybrid")))["model.layers.1.self_attn"]
    assert g.config.rope is False and g.config.scale == 0.3
    assert seqmix_mixers(convert(tiny("granitemoehybrid_rope")))["model.layers.0.self_attn"].config.rope is True
    n = seqmix_mixers(convert(tiny("nemotron_h")))["model.layers.1.mixer"]
    assert n.config.rope is False and n.config.scale == "sqrt"


# ------------------------------------------------------------------------------------------
# Zamba2's shared attention: converted once per use, the weights shared
# ------------------------------------------------------------------------------------------


def test_zamba2_shared_attention_keeps_its_weight_sharing():
    """Zamba2 ties one attention block (num_mem_blocks of them) across its hybrid layers: transformers
    builds one module per use with the same nn.Parameter objects. The converted model has one
    softmax_attention mixer per use (each with its own KV cache layer), and the mixers of one shared block
    hold the same parameters: one copy, trained once."""
    for case, groups in (("zamba2", [[1, 3]]), ("zamba2_rope", [[0, 3], [2]])):
        m = tiny(case)
        c = convert(m)
        mixers = seqmix_mixers(c)
        for group in groups:
            first = mixers[f"model.layers.{group[0]}.shared_transformer.self_attn"]
            for i in group[1:]:
                other = mixers[f"model.layers.{i}.shared_transformer.self_attn"]
                assert other is not first
                for (n1, p1), (n2, p2) in zip(first.named_parameters(), other.named_parameters()):
                    assert n1 == n2 and p1 is p2, n1
        if len(groups) > 1:  # different blocks do not share
            a, b = (mixers[f"model.layers.{g[0]}.shared_transformer.self_attn"] for g in groups)
            assert a.W_qk.weight is not b.W_qk.weight
        n_params = sum(p.numel() for p in c.parameters())
        assert n_params == sum(p.numel() for p in m.parameters())  # no copy of a shared weight
    # training updates the shared weight once, seen by every use
    c = convert(tiny("zamba2")).train()
    loss = c(ids(batch=2, T=12), labels=ids(batch=2, T=12), use_cache=False).loss
    loss.backward()
    w = seqmix_mixers(c)["model.layers.3.shared_transformer.self_attn"].W_qk.weight
    assert w.grad is not None and w is seqmix_mixers(c)["model.layers.1.shared_transformer.self_attn"].W_qk.weight


def test_zamba2_layer_argument_is_checked():
    c = convert(tiny("zamba2"))
    adapter = c.model.layers[1].shared_transformer.self_attn
    h = torch.randn(1, 3, 64)
    with torch.no_grad():
        y, _ = adapter(h, layer_idx=1)
        assert y.shape == (1, 3, 32)
    with pytest.raises(ValueError, match=r"layers\.1\.shared_transformer\.self_attn.*'layer_idx' = 3"):
        adapter(h, layer_idx=3)


# ------------------------------------------------------------------------------------------
# bad input: a clear error naming the module and the option, never a silently different model
# ------------------------------------------------------------------------------------------


def test_the_families_are_supported():
    assert {"bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "jamba", "zamba2"} <= set(supported_families())


@pytest.mark.parametrize("case, overrides, option, path", [
    ("bamba", {"hidden_act": "gelu"}, "hidden_act", r"model\.layers\.0\.mamba"),
    ("falcon_h1", {"mamba_proj_bias": True}, "mamba_proj_bias", r"model\.layers\.0\.mamba"),
    ("jamba", {"hidden_act": "gelu"}, "hidden_act", r"model\.layers\.0\.mamba"),
    ("nemotron_h", {"mamba_hidden_act": "relu"}, "hidden_act", r"model\.layers\.0\.mixer"),
    ("zamba2", {"use_shared_attention_adapter": True}, "use_shared_attention_adapter",
     r"model\.layers\.1\.shared_transformer\.self_attn"),
])
def test_an_option_seqmix_cannot_express_is_named(case, overrides, option, path):
    m = tiny(case, **overrides)
    assert_refused(m, rf"{path}.*'{option}'")


def test_a_module_in_a_mixer_slot_that_is_not_converted_is_named():
    m = tiny("nemotron_h")
    m.model.layers[0].mixer = nn.Identity()  # (its MLP and MoE layers at layers.N.mixer are not mixers: left alone)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mixer.*Identity.*NemotronHMamba2Mixer"):
        from_transformers(m)


@pytest.mark.parametrize("case", ["bamba", "falcon_h1", "jamba", "zamba2"])
def test_padding_is_refused(case):
    c = convert(tiny(case))
    x = ids(T=8)
    mask = torch.ones_like(x)
    mask[0, :2] = 0
    with pytest.raises(ValueError, match=r"'attention_mask'.*padding|'position_ids'.*padding"):
        c(x, attention_mask=mask)
    with torch.no_grad():
        assert torch.equal(c(x, attention_mask=torch.ones_like(x)).logits, c(x).logits)


def test_a_static_cache_is_refused():
    c = convert(tiny("bamba"))
    x = ids(T=5)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn.*'cache'"):
        c.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=2, cache_implementation="static")


# ------------------------------------------------------------------------------------------
# scaled RoPE in the hybrids' attention layers (ops.rotary's scalings, as for the transformers)
# ------------------------------------------------------------------------------------------

import test_interop_frontier as FRONT  # noqa: E402

#: a hybrid family whose attention applies RoPE, with a scaling type of transformers' rope_parameters (each type
#: once; lengths chosen so that it acts within the prompt + generated tokens: dynamic's base grows past 8
#: positions, longrope switches to its long factors past 8; longrope's factors: one per rotated pair, head_dim 8)
SCALED_ROPE = {
    "bamba": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0, "original_max_position_embeddings": 8, "beta_fast": 8.0,
              "beta_slow": 1.0},
    "granitemoehybrid_rope": {"rope_type": "linear", "rope_theta": 500.0, "factor": 3.0},
    "falcon_h1": {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0},
    "zamba2_rope": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 4},
    "qwen3_next": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 8,
                   "partial_rotary_factor": 0.25},
    "lfm2": {"rope_type": "longrope", "rope_theta": 500.0, "original_max_position_embeddings": 8,
             "short_factor": [1.0, 1.3, 1.9, 2.5], "long_factor": [1.1, 2.0, 4.0, 7.5]},
    "minimax": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.5},
}


def tiny_scaled(case: str) -> nn.Module:
    rp = dict(SCALED_ROPE[case])
    mpe = {"falcon_h1": 8, "lfm2": 32, "bamba": 32, "qwen3_next": 32}.get(case, 64)
    if case in FRONT.FAMILIES:
        return FRONT.tiny(case, rope_parameters=rp, max_position_embeddings=mpe)
    return tiny(case, rope_parameters=rp, max_position_embeddings=mpe)


@pytest.mark.parametrize("case", list(SCALED_ROPE))
def test_scaled_rope_in_a_hybrid_converts_exactly(case, monkeypatch):
    """The attention layers of a hybrid with a scaled RoPE carry the scaling (softmax_attention's rope_scaling):
    logits equal to the original's, and generate() equal at every step through seqmix's cache."""
    m = tiny_scaled(case)
    c = convert(m)
    att = [mx for mx in seqmix_mixers(c).values() if mx.registry_name == "softmax_attention"]
    assert att and all((mx.config.rope_scaling or {}).get("type") == SCALED_ROPE[case]["rope_type"] for mx in att)
    x = ids()
    kw = {"position_ids": torch.arange(x.shape[1])[None]} if case in CASES else {}
    with torch.no_grad():
        err = record(f"{case} scaled RoPE logits", scale_err(c(x, **kw).logits, m(x, **kw).logits))
    assert err <= INTEROP_RTOL, err
    assert_generate_equals(m, c, ids(T=7), 8, monkeypatch, f"{case} scaled RoPE", record)


@pytest.mark.parametrize("case, path", [("granitemoehybrid_rope", r"model\.layers\.0\.self_attn"),
                                        ("lfm2", r"model\.layers\.1\.self_attn")])
def test_an_unknown_rope_type_in_a_hybrid_is_named(case, path):
    """A rope_type ops.rotary does not have (set after the model was built: transformers would not build it)."""
    m = FRONT.tiny(case) if case in FRONT.FAMILIES else tiny(case)
    m.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 1e4, "factor": 2.0}
    assert_refused(m, rf"{path}.*'rope_parameters\.rope_type'.*'proportional'")


def test_recurrent_gemma_refuses_a_scaled_rope_as_transformers_does():
    """RecurrentGemma's rotary embedding takes the default RoPE only (transformers refuses the others when it
    builds the model); a config changed afterwards is refused by the converter, naming the option."""
    import test_interop_attention as ATT

    m = ATT.tiny("recurrent_gemma")
    m.config.rope_parameters = dict(m.config.rope_parameters, rope_type="linear", factor=2.0)
    assert_refused(m, r"model\.layers\.\d+\.temporal_block.*'rope_parameters\.rope_type'.*'linear'")
