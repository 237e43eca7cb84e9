"""seqmix.interop: transformers' RWKV-4 and xLSTM converted to seqmix mixers, exactly
(docs/interop.md). Nothing is downloaded: tiny random models are built from transformers' config
classes (transformers runs its torch paths: no RWKV CUDA kernel, no `xlstm` package).

RWKV-4: every ``RwkvSelfAttention`` becomes seqmix ``rwkv4`` (RWKV4_FULL), every channel-mix
``RwkvFeedForward`` seqmix ``rwkv_channel_mix`` (its token shift is a width-2 conv). transformers' state is
a list of five [B, d, layers] tensors passed as ``state=``.
xLSTM: every ``xLSTMLayer`` (the mLSTM) becomes seqmix ``mlstm``; its state is the layer's tuple
(C, n, m) inside an ``xLSTMCache``. Both return ``(output, state)``: the state table kinds
``stacked`` and ``tuple`` (seqmix/interop/table.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import RwkvConfig, RwkvForCausalLM, xLSTMConfig, xLSTMForCausalLM  # noqa: E402
from transformers.models.xlstm import modeling_xlstm  # noqa: E402

from seqmix.interop import from_transformers, seqmix_mixers, supported_families  # noqa: E402
from interop_helpers import (  # noqa: E402
    INTEROP_RTOL, VOCAB, assert_generate_equals, assert_logits_equal_in_every_mode, assert_refused, convert,
    converted, fine_tune, ids, scale_err, unchanged,
)
from tolerances import max_abs  # noqa: E402

#: float64, xLSTM in transformers' "train" mode (its chunkwise kernel in the input dtype, T a multiple of
#: its chunk) with the norms' float32 reductions off: both sides run wholly in float64 (measured: 1e-15)
XLSTM_F64_RTOL = 1e-12


def tiny(family: str, dtype=torch.float32, **overrides) -> nn.Module:
    """A tiny random transformers model of ``family`` (eval mode)."""
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, num_hidden_layers=2, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    if family.startswith("rwkv"):
        kw = dict(hidden_size=32, context_length=64, rescale_every=1 if family == "rwkv_rescale" else 0)
        m = RwkvForCausalLM(RwkvConfig(**{**common, **kw, **overrides}))
    elif family.startswith("xlstm"):
        # hidden 128: qk_dim = 64, v_dim = 128 (transformers' xLSTMCache rounds them up to multiples of 64)
        kw = dict(hidden_size=128, num_heads=4, chunk_size=8, use_bias=family == "xlstm_bias")
        m = xLSTMForCausalLM(xLSTMConfig(**{**common, **kw, **overrides}))
        if family == "xlstm_fused":  # transformers 5.24 cannot initialize a fused model (its _init_weights
            cfg = copy.deepcopy(m.config)  # mis-slices the gate bias): swap in fused layers built on their own
            cfg.weight_mode = "fused"
            for blk in m.backbone.blocks:
                blk.mlstm_layer = modeling_xlstm.xLSTMLayer(cfg)
    else:
        raise KeyError(family)
    m = m.to(dtype)
    with torch.no_grad():  # every weight matters: gates with weights, both branches of the normalizer
        for name, p in m.named_parameters():
            if family.startswith("xlstm") and "mlstm_layer" in name:
                if "gate" in name:
                    p.copy_(torch.randn_like(p) * (1.0 if name.endswith("bias") else 0.1))
                    if "fgate" in name and name.endswith("bias"):
                        p.add_(3.0)
                elif name.endswith("bias") or "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
            elif family.startswith("rwkv") and name.endswith(("time_first", "time_decay")):
                p.add_(0.3 * torch.randn_like(p))
    return m.eval()


FAMILIES = ["rwkv", "rwkv_rescale", "xlstm", "xlstm_bias", "xlstm_fused"]
SLOT = {"rwkv": "rwkv.blocks.{}.attention", "xlstm": "backbone.blocks.{}.mlstm_layer"}
FFN = "rwkv.blocks.{}.feed_forward"


def slot(family, i):
    return SLOT[family.split("_")[0]].format(i)


# ------------------------------------------------------------------------------------------
# the converted model
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["rwkv", "xlstm"])
def test_converted_is_the_same_class_and_its_mixers(family):
    """RWKV: the time-mix and the channel-mix (its token shift) of every block; xLSTM: the mLSTM layers, the
    FFN (no token mixing) stays transformers'."""
    m = tiny(family)
    c = converted(m)
    mixers = seqmix_mixers(c)
    if family == "rwkv":
        want = {slot(family, i): "rwkv4" for i in range(2)} | {FFN.format(i): "rwkv_channel_mix" for i in range(2)}
        assert {p: mx.registry_name for p, mx in mixers.items()} == want
    else:
        assert sorted(mixers) == [slot(family, i) for i in range(2)]
        assert {mx.registry_name for mx in mixers.values()} == {"mlstm"}
        assert type(c.backbone.blocks[0].ffn) is modeling_xlstm.xLSTMFeedForward
    assert {"rwkv", "xlstm"} <= set(supported_families())


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_in_every_mode_float32(family):
    m = tiny(family)
    assert_logits_equal_in_every_mode(m, convert(m), ids(), family)


def blocks_out(model, x):
    """The hidden states after the block stack, before xLSTM's out_norm (which reduces in float32 always)."""
    h = model.backbone.embeddings(x)
    for blk in model.backbone.blocks:
        h = blk(h)[0]
    return h


def test_xlstm_hidden_states_equal_float64():
    """transformers' "train" mode with T a multiple of its chunk runs in float64 (its inference mode keeps
    the state in float32, inference_state_dtype), with the blocks' norms' float32 reductions off: all
    seqmix modes agree to float64 precision."""
    m = tiny("xlstm_bias", torch.float64, mode="train", norm_reduction_force_float32=False)
    c = convert(m)
    x = ids(T=24)
    with torch.no_grad():
        ref = blocks_out(m, x)
        for mode in next(iter(seqmix_mixers(c).values())).modes:
            for mx in seqmix_mixers(c).values():
                mx.mode = mode
            out = blocks_out(c, x)
            assert out.dtype == torch.float64
            err = scale_err(out, ref)
            assert 0 < err <= XLSTM_F64_RTOL, mode  # (0: the comparison would be vacuous)


def test_rwkv_float64_is_held_to_the_float32_bound():
    """transformers' CPU WKV casts the keys and its state to float32 whatever the model's dtype."""
    m = tiny("rwkv", torch.float64)
    c = convert(m)
    x = ids()
    with torch.no_grad():
        out, ref = c.rwkv(x).last_hidden_state, m.rwkv(x).last_hidden_state
    assert out.dtype == torch.float64 and scale_err(out, ref) <= INTEROP_RTOL


# ------------------------------------------------------------------------------------------
# decoding through the mixers' own state
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_equals_the_original_at_every_step(family, monkeypatch):
    m = tiny(family)
    # RWKV at batch 1: transformers 5.24's one-token step broadcasts its shift state to [B, B, d] for B > 1
    # (the converted model decodes a batch: test_rwkv_generate_decodes_a_batch_as_each_row_alone)
    prompt = ids(batch=1 if family.startswith("rwkv") else 2, T=7)
    # the prefill starts from the model's empty state (transformers builds it filled with zeros)
    assert_generate_equals(m, convert(m), prompt, 6, monkeypatch, family, fresh_prefill=False)


@pytest.mark.parametrize("family", ["rwkv", "rwkv_rescale"])
def test_rwkv_generate_decodes_a_batch_as_each_row_alone(family):
    """generate() on a batch of two prompts: the converted model's tokens and scores at every step equal
    those of each prompt decoded alone, by the converted model and by the original (at batch 1, where
    transformers 5.24's own one-token step is right)."""
    m = tiny(family)
    c = convert(m)
    prompt, new = ids(batch=2, T=7, seed=5), 8
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        both = c.generate(prompt, attention_mask=torch.ones_like(prompt), **kw)
        assert both.sequences.shape == (2, 7 + new)
        for b in range(2):
            row = prompt[b : b + 1]
            for model in (c, m):  # each row alone: the converted model and the original
                alone = model.generate(row, attention_mask=torch.ones_like(row), **kw)
                assert torch.equal(both.sequences[b : b + 1], alone.sequences), (b, type(model).__name__)
                for t, (a, r) in enumerate(zip(both.scores, alone.scores, strict=True)):
                    err = scale_err(a[b : b + 1], r)
                    assert err <= INTEROP_RTOL, f"row {b}, step {t}: {err:.3g}"
    assert not torch.equal(both.sequences[0], both.sequences[1])  # two different continuations: rows not mixed up


def test_rwkv_state_layout_and_continuation():
    """transformers' state list holds the same state in both models (the WKV state stabilized there:
    real num = num·e^max), after a prefill and a decoding step; a multi-token continuation equals one pass."""
    m, x = tiny("rwkv"), ids(batch=1, T=16)
    c = convert(m)
    with torch.no_grad():
        states = []
        for model in (m, c):
            st = model(x[:, :11], use_cache=True).state
            st = model(x[:, 11:12], state=st, use_cache=True).state
            states.append(st)
        ref, mine = states
        for k in (0, 1):  # the FFN's and the attention's token shifts (the last input of each)
            assert scale_err(mine[k], ref[k]) <= INTEROP_RTOL
        for k in (2, 3):  # num, den
            assert scale_err(mine[k] * mine[4].exp(), ref[k] * ref[4].exp()) <= INTEROP_RTOL
        full = m(x).logits
        out = c(x[:, 12:], state=mine, use_cache=True).logits
        assert scale_err(out, full[:, 12:]) <= INTEROP_RTOL
        assert scale_err(m(x[:, 12:], state=ref, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL


def test_rwkv_converted_attention_decodes_at_batch_2():
    """transformers 5.24's RwkvSelfAttention returns [B, B, d] for a one-token step at B > 1 (its [B, d] shift
    state broadcast against [B, 1, d]); the converted mixer returns [B, 1, d], each row equal to the original
    run on that row alone (batch 1). The same for RwkvFeedForward (the same bug) -> rwkv_channel_mix."""
    m = tiny("rwkv")
    c = convert(m)
    x = ids(batch=2, T=9)
    with torch.no_grad():
        st = c(x[:, :8], use_cache=True).state  # a real state after 8 tokens
        for i in range(2):
            att, ref_att = c.rwkv.blocks[i].attention, m.rwkv.blocks[i].attention
            xt = torch.randn(2, 1, 32, generator=torch.Generator().manual_seed(i))
            rows = []
            for b in range(2):  # the original, one row at a time, from that row's state
                st_b = [s[b : b + 1].clone() for s in st]
                rows.append(ref_att(xt[b : b + 1], state=st_b, use_cache=True)[0])
            st2 = [s.clone() for s in st]
            y, st2 = att(xt, state=st2, use_cache=True)
            assert y.shape == (2, 1, 32)
            assert scale_err(y, torch.cat(rows, 0)) <= INTEROP_RTOL
            assert max_abs(st2[1][:, :, i], xt[:, 0]) == 0  # the shift state is this token
            ffn, ref_ffn = c.rwkv.blocks[i].feed_forward, m.rwkv.blocks[i].feed_forward
            rows = [ref_ffn(xt[b : b + 1], state=[s[b : b + 1].clone() for s in st])[0] for b in range(2)]
            st2 = [s.clone() for s in st]
            y, st2 = ffn(xt, state=st2)
            assert y.shape == (2, 1, 32)
            assert scale_err(y, torch.cat(rows, 0)) <= INTEROP_RTOL
            assert max_abs(st2[0][:, :, i], xt[:, 0]) == 0


def test_xlstm_cache_state_layout_and_continuation():
    """xLSTMCache holds the same (C, n, m) in both models after a prefill and a decoding step; a
    multi-token continuation through the cache equals one pass."""
    m, x = tiny("xlstm"), ids(T=16)
    c = convert(m)
    with torch.no_grad():
        caches = []
        for model in (m, c):
            cache = model(x[:, :11], use_cache=True).cache
            cache = model(x[:, 11:12], cache=cache, use_cache=True).cache
            caches.append(cache)
        ref, mine = caches
        for i in range(2):
            for a, b in zip(mine.rnn_state[i], ref.rnn_state[i], strict=True):
                assert a.shape == b.shape and scale_err(a, b) <= INTEROP_RTOL
        full = m(x).logits
        assert scale_err(c(x[:, 12:], cache=mine, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL
        assert scale_err(m(x[:, 12:], cache=ref, use_cache=True).logits, full[:, 12:]) <= INTEROP_RTOL


def test_xlstm_long_inputs_in_inference_chunks():
    """xLSTMModel splits an input longer than max_inference_chunksize into pieces carried through its cache:
    the converted layers continue from that state. Held to twice INTEROP_RTOL: transformers' inference mode
    carries its state between the pieces in float32 through its step kernel (inference_state_dtype), and
    the rounding grows with the pieces (2.9e-4 of the logit scale measured on one 2-core CPU machine, 1.45x
    INTEROP_RTOL)."""
    m = tiny("xlstm", max_inference_chunksize=6)
    c = convert(m)
    x = ids(T=20)
    with torch.no_grad():
        assert scale_err(c(x).logits, m(x).logits) <= 2 * INTEROP_RTOL


# ------------------------------------------------------------------------------------------
# RWKV's rescale_every: matched (RwkvModel rescales the converted W_o through the adapter's alias)
# ------------------------------------------------------------------------------------------


def test_rwkv_rescale_every_is_matched_in_training_and_inference():
    m = tiny("rwkv_rescale")
    x = ids()
    c = convert(m)
    attn, ffn = c.rwkv.blocks[1].attention, c.rwkv.blocks[1].feed_forward
    assert attn.output is seqmix_mixers(c)["rwkv.blocks.1.attention"].W_o  # the aliases RwkvModel rescales
    assert ffn.value is seqmix_mixers(c)["rwkv.blocks.1.feed_forward"].W_v
    w, wv = attn.output.weight.detach().clone(), ffn.value.weight.detach().clone()
    with torch.no_grad():
        assert scale_err(c(x).logits, m(x).logits) <= INTEROP_RTOL  # inference: weights / 2^(i // N), hidden / 2
    assert c.rwkv.layers_are_rescaled and torch.equal(attn.output.weight, w / 2) and torch.equal(ffn.value.weight, wv / 2)
    c.train()
    m.train()
    with torch.no_grad():
        assert scale_err(c(x).logits, m(x).logits) <= INTEROP_RTOL  # training: the weights scaled back
    assert torch.equal(attn.output.weight, w) and torch.equal(ffn.value.weight, wv)
    # converting a model that has already rescaled its weights (it ran in inference mode)
    m2 = tiny("rwkv_rescale")
    with torch.no_grad():
        m2(x)
    c2 = convert(m2)
    with torch.no_grad():
        assert scale_err(c2(x).logits, m2(x).logits) <= INTEROP_RTOL
    c2.train()
    m2.train()
    with torch.no_grad():
        assert scale_err(c2(x).logits, m2(x).logits) <= INTEROP_RTOL


# ------------------------------------------------------------------------------------------
# training and the DSF view
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["rwkv", "xlstm"])
def test_fine_tuning_lowers_the_loss(family, monkeypatch):
    m = tiny(family)
    losses, modes = fine_tune(convert(m, mode="chunk").train(), monkeypatch)
    assert modes == ({"chunk", "auto"} if family == "rwkv" else {"chunk"})  # RWKV's channel-mix: one mode, "auto"
    assert losses[-1] < 0.7 * losses[0], losses
    assert unchanged(tiny(family), m)


@pytest.mark.parametrize("family", ["rwkv", "xlstm"])
def test_converted_mixer_keeps_its_dsf_view(family):
    """phi(x) of a real layer reproduces its core output; so does dsf(x) for the mLSTM. (RWKV-4's DSF puts
    C_i = 1/α_c = exp(exp(time_decay_c)) and D_i = (e^u - 1/α_c) e^k, which cancel catastrophically for the
    strong decays real RWKV layers have (exp(time_decay) up to ~50 here): its phi is the reliable view.)"""
    c = convert(tiny(family))
    mx = seqmix_mixers(c)[slot(family, 1)]
    h = torch.randn(1, 10, c.config.hidden_size, dtype=torch.float64)
    mx = mx.double()
    with torch.no_grad():
        values, mixed = mx.core(h)
        phi = mx.phi(h)
        system = mx.dsf(h)
    assert phi.shape == (1, mx.H, 10, 10)
    assert max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed) < 1e-9
    B, T, M, P = values.shape
    if family == "xlstm":
        assert max_abs(system.evaluate(values.reshape(B, T, M * P)), mixed.reshape(B, T, M * P)) < 1e-9
    assert system.lam.shape[1] == T


def test_rwkv_channel_mix_keeps_its_dsf_view():
    """The converted channel-mix's token shift: phi(x) and dsf(x) reproduce its core output (the shifted
    streams), and phi is the bidiagonal map (μ on the diagonal, 1 - μ below it) of the original's μ."""
    m = tiny("rwkv")
    c = convert(m)
    mx = seqmix_mixers(c)[FFN.format(1)].double()
    h = torch.randn(1, 10, 32, dtype=torch.float64)
    with torch.no_grad():
        values, mixed = mx.core(h)
        phi = mx.phi(h)
        system = mx.dsf(h)
    assert phi.shape == (1, 64, 10, 10)
    assert max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed) < 1e-12
    assert max_abs(system.evaluate(values.reshape(1, 10, 64)), mixed.reshape(1, 10, 64)) < 1e-12
    mu = torch.cat([m.rwkv.blocks[1].feed_forward.time_mix_key, m.rwkv.blocks[1].feed_forward.time_mix_receptance], -1)
    mu = mu.reshape(-1).double()
    assert max_abs(phi[0].diagonal(0, -2, -1), mu[:, None].expand(64, 10)) == 0
    assert max_abs(phi[0].diagonal(-1, -2, -1), (1 - mu)[:, None].expand(64, 9)) == 0
    assert max_abs(phi[0].tril(-2), torch.zeros(64, 10, 10, dtype=torch.float64)) == 0


# ------------------------------------------------------------------------------------------
# bad input: a clear error naming the module and the option
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family, overrides, option", [
    ("rwkv", {"attention_hidden_size": 48}, "attention_hidden_size"),
    ("xlstm", {"hidden_size": 32}, "qk_dim_factor"),  # int(32·0.5) = 16 channels, xLSTMCache holds 64
    ("xlstm", {"hidden_size": 128, "v_dim_factor": 0.75}, "v_dim_factor"),
])
def test_an_option_seqmix_cannot_express_is_named(family, overrides, option):
    m = tiny(family, **overrides)
    assert_refused(m, rf"{slot(family, 0).replace('.', '[.]')}.*'{option}'")


def test_unsupported_module_and_bad_state_are_named():
    m = tiny("rwkv")
    m.rwkv.blocks[1].attention = nn.Identity()
    with pytest.raises(ValueError, match=r"rwkv\.blocks\.1\.attention.*Identity.*RwkvSelfAttention"):
        from_transformers(m)
    m = tiny("xlstm")
    m.backbone.blocks[0].mlstm_layer = nn.Identity()
    with pytest.raises(ValueError, match=r"backbone\.blocks\.0\.mlstm_layer.*Identity.*xLSTMLayer"):
        from_transformers(m)
    c = convert(tiny("rwkv"))
    h = torch.randn(1, 3, 32)
    with pytest.raises(ValueError, match=r"rwkv\.blocks\.0\.attention.*'state'.*list"):
        c.rwkv.blocks[0].attention(h, state=[torch.zeros(1, 32)], use_cache=True)
    c = convert(tiny("xlstm"))
    with pytest.raises(ValueError, match=r"backbone\.blocks\.0\.mlstm_layer.*'state'.*tuple"):
        c.backbone.blocks[0].mlstm_layer(torch.randn(1, 3, 128), (torch.zeros(1),))
    with pytest.raises(ValueError, match="once"):
        c.backbone.blocks[0].mlstm_layer(torch.randn(1, 3, 128), (torch.zeros(1),), state=(torch.ones(1),))


def test_the_transformers_rwkv_batch_bug_is_still_there():
    """The premise of the batch-1 decoding comparisons above: if transformers fixes its one-token step at
    B > 1, this fails, and the RWKV generate test can run at batch 2."""
    m = tiny("rwkv")
    x = ids(batch=2, T=8)
    with torch.no_grad():
        st = m(x[:, :7], use_cache=True).state
        assert m(x[:, 7:], state=st, use_cache=True).logits.shape == (2, 2, VOCAB)
