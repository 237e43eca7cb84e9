"""Mixer-level exactness against transformers' own modules: a seqmix mixer
given the weights of a real model's sequence-mixing module computes the same outputs.

Nothing is downloaded: each transformers module is built from a tiny config of its family's
config class and given random weights (gates included, large enough that every branch of
each nonlinearity is taken). The weight tables that say which transformers parameter becomes
which seqmix parameter are the interop families' own (one copy): xLSTM's and RWKV-4's live in
``seqmix.interop.families`` (XLSTM_WEIGHTS, xlstm_fused_weights, RWKV4_WEIGHTS,
RECURRENT_GEMMA_WEIGHTS; loaded here by the converter's own mapping, with the same checks: every
parameter on both sides covered, shapes checked).

Which module is "the mixer" (everything between a block's pre-norm and its residual add):

* xLSTM: ``xLSTMBlock.mlstm_layer`` (``xLSTMLayer``): q, k, v, the input/forget/output gate
  pre-activations, the mLSTM cell, the multi-head LayerNorm, the output gate and out_proj.
  (``norm_mlstm`` before it and the FFN after the residual are not part of it.)
* RWKV-4: ``RwkvBlock.attention`` (``RwkvSelfAttention``): token shift, k, v, receptance, WKV,
  output (``ln1`` before, the residual after).
* RecurrentGemma: ``RecurrentGemmaDecoderLayer.temporal_block`` when it is a
  ``RecurrentGemmaRecurrentBlock``: linear_y (GeLU branch), linear_x, conv1d, RG-LRU, product,
  linear_out (``temporal_pre_norm`` before, the residual after).
"""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.mixers.base import Cache
from seqmix.interop.convert import _mapped_weights
from seqmix.interop.families import RECURRENT_GEMMA, RWKV, XLSTM, recurrent_gemma_block_config, rwkv4_config, xlstm_fields
from seqmix.mixers.linear_attention import MLSTM_EXP_FORGET, MLSTM_PAPER
from tolerances import F64_ATOL, REAL_F32_RTOL, REAL_F64_RTOL, max_abs, rel_err

transformers = pytest.importorskip("transformers")


def load_family_weights(mixer: torch.nn.Module, module: torch.nn.Module, family) -> None:
    """Copies ``module``'s weights into ``mixer`` by the interop family's weight table (the converter's
    own mapping: every parameter of both sides covered, shapes checked)."""
    weights, _ = _mapped_weights(type(module).__name__, module, family.module_map(module), mixer)
    mixer.load_state_dict(weights, strict=True)


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.3, bias_scale: float = 1.0) -> None:
    """Random values for every parameter (transformers' initializations zero the gates)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in module.named_parameters():
            s = bias_scale if p.dim() == 1 else scale
            p.copy_(s * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def inputs(B, T, d, dtype, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


#: measured errors, printed by ``pytest -s`` (the closing note quotes them)
MEASURED: dict[str, float] = {}


def record(key, err):
    MEASURED[key] = max(MEASURED.get(key, 0.0), err)
    print(f"\n[real mixers] {key}: {err:.3g}")


def assert_every_mode(m, x, y_ref, key: str, bound: float, detail: str = "") -> None:
    """Every mode of ``m`` gives ``y_ref`` on ``x`` to ``bound`` (relative error), recorded as "key (detail mode)"."""
    for mode in m.modes:
        m.mode = mode
        err = rel_err(m(x), y_ref)
        record(f"{key} ({detail}{mode})", err)
        assert err < bound, mode


# ------------------------------------------------------------------------------------------
# xLSTM: the mLSTM layer
# ------------------------------------------------------------------------------------------


def xlstm_layer(dtype, *, use_bias=False, weight_mode="single", mode="inference", chunk_size=16, seed=0, **kw):
    from transformers import xLSTMConfig
    from transformers.models.xlstm import modeling_xlstm

    cfg = xLSTMConfig(
        vocab_size=32, hidden_size=32, num_hidden_layers=1, num_heads=4, qk_dim_factor=0.5, v_dim_factor=1.0, use_bias=use_bias,
        weight_mode=weight_mode, mode=mode, chunk_size=chunk_size, norm_reduction_force_float32=dtype != torch.float64, **kw,
    )
    torch.manual_seed(seed)
    layer = modeling_xlstm.xLSTMLayer(cfg).to(dtype).eval()
    randomize(layer, seed)
    return cfg, layer


def mlstm_from(cfg, layer, dtype, **overrides):
    """The seqmix mlstm of an xLSTMLayer: the interop family's config mapping and weight table (either weight mode)."""
    kw = {**xlstm_fields(cfg, layer), "chunk_size": 8}
    m = seqmix.build_mixer("mlstm", **{**kw, **overrides}).to(dtype).eval()
    load_family_weights(m, layer, XLSTM)
    return m


def test_xlstm_block_mixer_is_the_mlstm_layer():
    """The sequence-mixing part of xLSTMBlock is exactly mlstm_layer: block(x) = x + mlstm_layer(norm_mlstm(x)) + ffn(...)."""
    from transformers import xLSTMConfig
    from transformers.models.xlstm import modeling_xlstm

    cfg = xLSTMConfig(vocab_size=32, hidden_size=32, num_hidden_layers=1, num_heads=4, chunk_size=16)
    block = modeling_xlstm.xLSTMBlock(cfg).eval()
    randomize(block, 3)
    x = inputs(2, 16, 32, torch.float32)
    with torch.no_grad():
        y, _ = block(x)
        h = x + block.mlstm_layer(block.norm_mlstm(x))[0]
        y_ref = h + block.ffn(block.norm_ffn(h))
    assert rel_err(y, y_ref) < REAL_F32_RTOL


@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize("weight_mode", ["single", "fused"])
def test_xlstm_mlstm_layer_float32(use_bias, weight_mode):
    """fp32: every seqmix mode equals transformers' inference path (chunkwise kernel + recurrent tail)."""
    cfg, layer = xlstm_layer(torch.float32, use_bias=use_bias, weight_mode=weight_mode)
    m = mlstm_from(cfg, layer, torch.float32)
    x = inputs(2, 37, 32, torch.float32)  # two chunks of 16 plus a tail of 5
    with torch.no_grad():
        y_ref, _ = layer(x)
        assert_every_mode(m, x, y_ref, "xlstm fp32 forward", REAL_F32_RTOL, f"{weight_mode}, bias={use_bias}, ")


def test_xlstm_mlstm_layer_float64():
    """fp64 (transformers' chunkwise kernel runs in the input dtype when T is a multiple of its chunk,
    with the norm's float32 reduction switched off): all seqmix modes agree to float64 precision."""
    cfg, layer = xlstm_layer(torch.float64, use_bias=True, mode="train", chunk_size=16)
    m = mlstm_from(cfg, layer, torch.float64)
    x = inputs(2, 48, 32, torch.float64)
    with torch.no_grad():
        y_ref, _ = layer(x)
        assert_every_mode(m, x, y_ref, "xlstm fp64 forward", REAL_F64_RTOL)


def test_xlstm_decoding_and_split_match_transformers_state():
    """Prefill then decode token by token: seqmix's cache (S with the normalizer column, m) against
    transformers' (C, n, m) state; and a split sequence carried through both states."""
    cfg, layer = xlstm_layer(torch.float32)
    m = mlstm_from(cfg, layer, torch.float32)
    x = inputs(2, 27, 32, torch.float32, seed=4)
    with torch.no_grad():
        y_full, _ = layer(x)
        cache, ys, state = Cache(), [], None
        y0, state = layer(x[:, :19], state)
        ys.append(m(x[:, :19], cache=cache))
        assert rel_err(ys[0], y0) < REAL_F32_RTOL
        for t in range(19, 27):
            yt, state = layer(x[:, t : t + 1], state)
            ys.append(m(x[:, t : t + 1], cache=cache))
            err = rel_err(ys[-1], yt)
            record("xlstm fp32 decode step", err)
            assert err < REAL_F32_RTOL
        assert rel_err(torch.cat(ys, 1), y_full) < REAL_F32_RTOL
        # the states themselves: C = S[..., :V], n = S[..., V], m
        C, n, mm = state
        S = cache.get(m)["S"]
        assert rel_err(S[..., :-1], C) < REAL_F32_RTOL and rel_err(S[..., -1], n) < REAL_F32_RTOL
        assert max_abs(cache.get(m)["m"], mm.squeeze(-1)) < 1e-4


def test_xlstm_paper_options_differ_only_where_documented():
    """normalizer_form 'max_abs' (the paper) drops transformers' ε·e^{m_t}: with ε = 0 transformers computes the
    paper's normalizer max(|nᵀq|, 1) exactly; gate_soft_cap=None equals transformers with its cap out of reach
    (its config takes no None: a cap of 1e8 changes a pre-activation z by z³/(3·1e16))."""
    cfg, layer = xlstm_layer(torch.float64, mode="train", eps=0.0, gate_soft_cap=1e8)
    m = mlstm_from(cfg, layer, torch.float64, **MLSTM_PAPER)
    x = inputs(2, 32, 32, torch.float64)
    with torch.no_grad():
        err = rel_err(m(x), layer(x)[0])
    record("xlstm fp64, paper normalizer vs transformers with eps=0, no soft cap", err)
    assert err < REAL_F64_RTOL


# ------------------------------------------------------------------------------------------
# the mLSTM cell written out (the xLSTM paper's equations, unstabilized, float64)
# ------------------------------------------------------------------------------------------


def mlstm_reference(m, x):
    """C_t = f_t C_{t-1} + i_t v_t k_tᵀ, n_t = f_t n_{t-1} + i_t k_t, h̃_t = C_t q_t / η_t with
    η_t = max(|n_tᵀ q_t|, 1) (+ ε e^{m_t}, m_t = max(log f_t + m_{t-1}, ĩ_t)), k scaled by 1/sqrt(d_k');
    then per-head LayerNorm, σ output gate, out_proj. No stabilizer in the state (float64)."""
    c = m.config
    B, T, _ = x.shape
    H, K, V = m.H, m.K, m.V
    cap = (lambda z: c.gate_soft_cap * torch.tanh(z / c.gate_soft_cap)) if c.gate_soft_cap else (lambda z: z)
    q = m.W_q(x).view(B, T, H, K)
    k = m.W_k(x).view(B, T, H, K) / K**0.5
    v = m.W_v(x).view(B, T, H, V)
    zf, zi = cap(m.W_a(x)), cap(m.W_i(x))
    log_f = zf if c.decay == "exp" else torch.nn.functional.logsigmoid(zf)
    C = torch.zeros(B, H, V, K, dtype=x.dtype)
    n = torch.zeros(B, H, K, dtype=x.dtype)
    mt = torch.zeros(B, H, dtype=x.dtype)
    hs = []
    for t in range(T):
        f, i = log_f[:, t].exp(), zi[:, t].exp()
        mt = torch.maximum(log_f[:, t] + mt, zi[:, t])
        C = f[..., None, None] * C + i[..., None, None] * v[:, t, :, :, None] * k[:, t, :, None, :]
        n = f[..., None] * n + i[..., None] * k[:, t]
        eta = torch.maximum((n * q[:, t]).sum(-1).abs(), torch.ones(()))
        if c.normalizer_form == "xlstm":
            eta = eta + c.normalizer_eps * mt.exp()
        hs.append((C @ q[:, t, :, :, None]).squeeze(-1) / eta[..., None])
    h = torch.stack(hs, 1)
    h = torch.nn.functional.layer_norm(h, (V,), eps=c.norm_eps).reshape(B, T, H * V) * m.norm.weight
    if m.norm.bias is not None:
        h = h + m.norm.bias
    return m.W_o(torch.sigmoid(m.W_g(x)) * h)


@pytest.mark.parametrize("variant", ["xlstm", "paper", "exp_forget"])
def test_mlstm_matches_the_paper_equations(variant):
    overrides = {"xlstm": {}, "paper": MLSTM_PAPER, "exp_forget": MLSTM_EXP_FORGET}[variant]
    torch.manual_seed(0)
    m = seqmix.build_mixer("mlstm", d_model=16, heads=2, chunk_size=8, **overrides).double()
    randomize(m, 2, scale=0.5, bias_scale=1.5)
    if variant == "exp_forget":  # keep f = exp(f̃) mostly below 1, as training would
        with torch.no_grad():
            m.W_a.bias.sub_(2.0)
    x = inputs(2, 21, 16, torch.float64)
    y_ref = mlstm_reference(m, x)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL, mode


def test_mlstm_both_normalizer_branches_pass_the_contract_checks():
    """The contract checks (modes with gradients, decoding, split, phi, dsf) with gates that take both
    branches of max(|nᵀq|, 1) and of the stabilizer (the preset's input-gate bias of -10 keeps the floor)."""
    from tolerances import assert_modes_agree_f64

    for overrides in ({}, MLSTM_PAPER, MLSTM_EXP_FORGET):
        torch.manual_seed(0)
        m = seqmix.build_mixer("mlstm", d_model=16, heads=2, chunk_size=8, **overrides).double()
        randomize(m, 5, scale=0.5, bias_scale=1.0)
        x = inputs(2, 19, 16, torch.float64)
        P = m._params(x, None, False)
        s = m._numerator_map(P).sum(-1).abs()  # |q ñ| against the floor e^{-m}
        floor = torch.exp(-P.m.transpose(1, 2))
        assert (s > floor).any() and (s < floor).any(), "both branches of the normalizer"
        assert_modes_agree_f64(m, x, str(overrides))
        m.mode = "recurrent"
        y = m(x)
        cache = Cache()
        steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(19)], 1)
        assert max_abs(steps, y) < F64_ATOL
        assert cache.floats() == 2 * m.state_size()
        for mode in m.modes:
            m.mode = mode
            cache = Cache()
            assert max_abs(torch.cat([m(x[:, :7], cache=cache), m(x[:, 7:], cache=cache)], 1), y) < F64_ATOL
        values, mixed = m.core(x)
        assert max_abs(torch.einsum("bmts,bsmp->btmp", m.phi(x), values), mixed) < F64_ATOL
        system = m.dsf(x)
        B, T, M, Pv = values.shape
        assert max_abs(system.evaluate(values.reshape(B, T, M * Pv)), mixed.reshape(B, T, M * Pv)) < F64_ATOL
        # the DSF keeps the gates: Λ_t = f_t (unstabilized), 1/η_t sits in C_t
        zf = m._soft_cap(m.W_a(x))
        f = zf.exp() if m.config.decay == "exp" else torch.sigmoid(zf)
        assert max_abs(m.decays(x).view(B, T, 2, -1), f.unsqueeze(-1).expand(B, T, 2, system.lam.shape[-1] // 2)) < 1e-12


# ------------------------------------------------------------------------------------------
# RWKV-4
# ------------------------------------------------------------------------------------------


def rwkv_attention(dtype, seed=0, hidden=32):
    from transformers import RwkvConfig
    from transformers.models.rwkv.modeling_rwkv import RwkvSelfAttention

    cfg = RwkvConfig(vocab_size=32, hidden_size=hidden, num_hidden_layers=2, context_length=64)
    att = RwkvSelfAttention(cfg, layer_id=0).to(dtype).eval()
    randomize(att, seed, scale=0.3, bias_scale=0.5)
    with torch.no_grad():
        att.time_mix_key.uniform_(0, 1)
        att.time_mix_value.uniform_(0, 1)
        att.time_mix_receptance.uniform_(0, 1)
    return cfg, att


def rwkv_state(B, d, dtype):
    """transformers' RwkvModel state layout for one layer: [ffn shift, att shift, num, den, max], [B, d, 1]."""
    st = [torch.zeros(B, d, 1, dtype=dtype) for _ in range(5)]
    st[4] -= 1e30
    return st


def test_rwkv4_self_attention():
    """fp32 only: transformers' CPU WKV kernel casts the keys to float32 whatever the input dtype (measured
    against float64: 3e-8), so float64 cannot be compared tighter. Whole sequence in every mode, a split
    sequence (token shift and WKV state carried), token-by-token decoding. Segments of one token run with
    batch 1: transformers 5.24 broadcasts its one-token shift state [B, d] against [B, 1, d] and returns
    [B, B, d] for B > 1 (RwkvModel too)."""
    dtype = torch.float32
    cfg, att = rwkv_attention(dtype)
    d = cfg.hidden_size
    m = seqmix.build_mixer("rwkv4", **{**rwkv4_config(cfg, att), "chunk_size": 8}).to(dtype).eval()
    load_family_weights(m, att, RWKV)
    x = inputs(2, 29, d, dtype)
    with torch.no_grad():
        y_ref, _ = att(x, state=rwkv_state(2, d, dtype))
        assert rel_err(att(x)[0], y_ref) == 0  # the state given (zeros, max -1e30) is transformers' empty state
        assert_every_mode(m, x, y_ref, "rwkv4 fp32 forward", REAL_F32_RTOL)
        # a split sequence: the token shift (last input) and the WKV state (num, den, max) carried across
        for B, cut in ((2, 11), (2, 20), (1, 1)):
            xb = x[:B]
            st = rwkv_state(B, d, dtype)
            a, st = att(xb[:, :cut], state=st, use_cache=True)
            b, st = att(xb[:, cut:], state=st, use_cache=True)
            for mode in m.modes:
                m.mode = mode
                cache = Cache()
                y = torch.cat([m(xb[:, :cut], cache=cache), m(xb[:, cut:], cache=cache)], 1)
                err = rel_err(y, torch.cat([a, b], 1))
                record(f"rwkv4 fp32 split ({mode})", err)
                assert err < REAL_F32_RTOL, (mode, cut)
                assert max_abs(cache.get(m)["x_prev"], st[1][..., 0]) == 0  # the token-shift state is the last input
        # token-by-token decoding (batch 1, see the docstring)
        x1 = x[:1]
        st, cache, ys, ys_ref = rwkv_state(1, d, dtype), Cache(), [], []
        for t in range(x1.shape[1]):
            yt, st = att(x1[:, t : t + 1], state=st, use_cache=True)
            ys_ref.append(yt)
            ys.append(m(x1[:, t : t + 1], cache=cache))
        err = rel_err(torch.cat(ys, 1), torch.cat(ys_ref, 1))
        record("rwkv4 fp32 decode", err)
        assert err < REAL_F32_RTOL


# ------------------------------------------------------------------------------------------
# RecurrentGemma (Griffin's recurrent block)
# ------------------------------------------------------------------------------------------


def recurrent_gemma_block(dtype, seed=0):
    from transformers import RecurrentGemmaConfig
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRecurrentBlock

    cfg = RecurrentGemmaConfig(vocab_size=32, hidden_size=32, lru_width=32, num_attention_heads=4, num_hidden_layers=3,
                               intermediate_size=64, attention_window_size=16, conv1d_width=4)
    blk = RecurrentGemmaRecurrentBlock(cfg, layer_idx=0).to(dtype).eval()
    randomize(blk, seed, scale=0.3, bias_scale=0.5)
    return cfg, blk


def test_recurrent_gemma_recurrent_block():
    """fp32 (transformers' RG-LRU scan accumulates in float32 whatever the input dtype, so float64
    cannot be compared tighter than float32): whole sequence, then prefill + token-by-token decoding."""
    dtype = torch.float32
    cfg, blk = recurrent_gemma_block(dtype)
    m = seqmix.build_mixer("rg_lru_block", **recurrent_gemma_block_config(cfg, blk), chunk_size=8).to(dtype).eval()
    load_family_weights(m, blk, RECURRENT_GEMMA)
    B, T = 2, 23
    x = inputs(B, T, cfg.hidden_size, dtype)
    pos = torch.arange(T).expand(B, T)
    with torch.no_grad():
        y_ref, _ = blk(x, position_ids=pos, attention_mask=None, use_cache=False)
        assert_every_mode(m, x, y_ref, "recurrent_gemma fp32 forward", REAL_F32_RTOL)
        # prefill 9 tokens, then decode one at a time (transformers' cache: conv state + RG-LRU state)
        blk._setup_cache(B, x.device, dtype)
        ys_ref = [blk(x[:, :9], position_ids=pos[:, :9], attention_mask=None, use_cache=True)[0]]
        for t in range(9, T):
            ys_ref.append(blk(x[:, t : t + 1], position_ids=pos[:, t : t + 1], attention_mask=None, use_cache=True)[0])
        cache = Cache()
        ys = [m(x[:, :9], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(9, T)]
        err = rel_err(torch.cat(ys, 1), torch.cat(ys_ref, 1))
        record("recurrent_gemma fp32 prefill + decode", err)
        assert err < REAL_F32_RTOL
        assert rel_err(torch.cat(ys, 1), y_ref) < REAL_F32_RTOL


def test_rg_lru_reset_is_the_first_token_only():
    """reset_at_start: only a sequence's first token (no carried state) skips sqrt(1 - a²); a continued
    sequence normalizes its first token (RecurrentGemma's position_ids > 0)."""
    torch.manual_seed(0)
    on = seqmix.build_mixer("rg_lru_block", d_model=16).double()
    off = seqmix.build_mixer("rg_lru_block", d_model=16, reset_at_start=False).double()
    off.load_state_dict(on.state_dict())
    x = inputs(2, 10, 16, torch.float64)
    y_on, y_off = on(x), off(x)
    assert max_abs(y_on[:, 0], y_off[:, 0]) > 1e-3  # the first token differs
    cache_on, cache_off = Cache(), Cache()
    on(x[:, :4], cache=cache_on)
    off(x[:, :4], cache=cache_off)
    with torch.no_grad():  # same carried state: the continuation is the same function
        cache_off.get(off)["S"].copy_(cache_on.get(on)["S"])
    assert max_abs(on(x[:, 4:], cache=cache_on), off(x[:, 4:], cache=cache_off)) < F64_ATOL


# ------------------------------------------------------------------------------------------
# the max-stabilizer op (seqmix.ops.stabilizer): parallel (cummax) mode against the reference loop
# ------------------------------------------------------------------------------------------


def test_max_stabilizer_modes_agree_and_keep_gates_at_most_one():
    from seqmix.ops.stabilizer import max_stabilizer

    g = torch.Generator().manual_seed(0)
    B, T, H = 2, 300, 3
    log_f = torch.nn.functional.logsigmoid(3 * torch.randn(B, T, H, generator=g, dtype=torch.float64))
    log_i = 5 * torch.randn(B, T, H, generator=g, dtype=torch.float64)
    for m0 in (None, torch.randn(B, H, generator=g, dtype=torch.float64)):
        ref = max_stabilizer(log_f, log_i, m0, mode="recurrent")
        par = max_stabilizer(log_f, log_i, m0, mode="parallel")
        for a, b in zip(par, ref):
            assert max_abs(a, b) < 1e-10
        lf_s, li_s, m = par
        assert float(lf_s.max()) <= 0 and float(li_s.max()) <= 0
        # the stabilized recurrence is the unstabilized one scaled by e^{-m_t}: C̃_t = e^{-m_t} C_t (a scalar state
        # here, starting from C_{-1} = 0.7, stored as C̃_{-1} = 0.7 e^{-m_{-1}})
        m_init = m0 if m0 is not None else torch.zeros(B, H, dtype=torch.float64)
        C = torch.full((B, H), 0.7, dtype=torch.float64)
        Ct = C * torch.exp(-m_init)
        for t in range(T):
            C = log_f[:, t].exp() * C + log_i[:, t].exp()
            Ct = lf_s[:, t].exp() * Ct + li_s[:, t].exp()
            assert max_abs(Ct / (C * torch.exp(-m[:, t])), torch.ones(())) < 1e-10
    # float32 inputs: float32 out, still <= 0
    out = max_stabilizer(log_f.float(), log_i.float())
    assert all(t.dtype == torch.float32 for t in out) and float(out[0].max()) <= 0
    with pytest.raises(ValueError, match="log_i"):
        max_stabilizer(log_f, log_i[:, :-1])
    with pytest.raises(ValueError, match="m0"):
        max_stabilizer(log_f, log_i, torch.zeros(B, H + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="mode"):
        max_stabilizer(log_f, log_i, mode="chunk")
    with pytest.raises(ValueError, match="log_f"):
        max_stabilizer(torch.full_like(log_f, float("nan")), log_i)
    # check_values=False (a mixer's own gates): no value check, the NaN propagates instead of raising
    assert torch.isnan(max_stabilizer(torch.full_like(log_f, float("nan")), log_i, check_values=False)[2]).all()
