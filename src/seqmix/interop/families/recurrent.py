"""The recurrent families: Mamba, Falcon-Mamba, Mamba-2, RWKV-4 and xLSTM (one
:class:`~seqmix.interop.table.Family` entry each).

transformers' module classes read here (5.x): ``MambaMixer`` (mamba), ``FalconMambaMixer``
(falcon_mamba), ``Mamba2Mixer`` (mamba2), ``RwkvSelfAttention`` (rwkv), ``xLSTMLayer`` (xlstm).
"""

from __future__ import annotations

import math

from ...mixers.linear_attention import RWKV4_FULL
from ..table import (
    Family, ModuleMap, State, Unsupported, Weight, append_column, drop_first, flatten, pad_first, rows, split_column, squeeze,
    stabilized_pair, transpose, unsqueeze, unstabilize_pair,
)


def _silu(module) -> None:
    act = getattr(module, "activation", "silu")
    if act not in ("silu", "swish"):
        raise Unsupported("hidden_act", act, "seqmix's short convolution is followed by SiLU only")


def _expand(module, d_model: int) -> int:
    D = int(module.intermediate_size)
    if D % d_model:
        raise Unsupported("expand", D / d_model,
                          f"intermediate_size = {D} is not a whole multiple of hidden_size = {d_model} (seqmix: d_inner = expand·d_model)")
    return D // d_model


def _dt_init(cfg) -> dict:
    """Initialization-only fields (no effect on the converted weights; kept for re-initialization)."""
    out = {}
    lo, hi = getattr(cfg, "time_step_min", None), getattr(cfg, "time_step_max", None)
    if lo is not None and hi is not None and 0 < lo <= hi:
        out.update(dt_min=float(lo), dt_max=float(hi))
    floor = getattr(cfg, "time_step_floor", None)
    if floor is not None and floor > 0:
        out["dt_init_floor"] = float(floor)
    return out


# ------------------------------------------------------------------------------------------
# Mamba and Falcon-Mamba -> seqmix "mamba" / "falcon_mamba" (S6 with block=True)
# ------------------------------------------------------------------------------------------


def mamba_config(cfg, module) -> dict:
    """MambaMixer / FalconMambaMixer -> the S6 block's config."""
    _silu(module)
    d = int(cfg.hidden_size)
    expand = _expand(module, d)
    R = int(module.time_step_rank)
    if R > module.intermediate_size:
        raise Unsupported("time_step_rank", R, f"seqmix's Δ projection has rank <= d_inner = {module.intermediate_size}")
    out = dict(
        d_model=d, d_state=int(module.ssm_state_size), expand=expand, dt_rank=R, d_conv=int(module.conv_kernel_size),
        conv_bias=bool(module.use_conv_bias), bias=bool(module.use_bias), **_dt_init(cfg),
    )
    scale = getattr(cfg, "time_step_scale", None)
    if scale is not None and scale > 0:
        out["dt_scale"] = float(scale)
    if hasattr(module, "rms_eps"):  # Falcon-Mamba: weightless RMS norms on δ, B, C
        out["bcdt_rms_eps"] = float(module.rms_eps)
    return out


MAMBA_WEIGHTS = (
    Weight("in_proj.weight", "in_proj.weight"),
    Weight("in_proj.bias", "in_proj.bias"),
    Weight("conv1d.weight", "conv.weight", squeeze(1)),  # depthwise Conv1d [C, 1, W] -> [C, W]
    Weight("conv1d.bias", "conv.bias"),
    Weight("x_proj.weight", "x_proj.weight"),
    Weight("dt_proj.weight", "dt_proj.weight"),
    Weight("dt_proj.bias", "dt_bias"),  # added inside the softplus in both
    Weight("A_log", "A_log"),  # A = -exp(A_log) in both
    Weight("D", "D"),
    Weight("out_proj.weight", "out_proj.weight"),
    Weight("out_proj.bias", "out_proj.bias"),
)

#: transformers keeps the last W conv inputs [B, C, W], seqmix the last W - 1 [B, C, W-1];
#: the recurrent state is [B, d_inner, N] there, [B, d_inner, N, 1] (linear_recurrence's K x V) here
MAMBA_STATE = (
    State("conv", "conv", 0, drop_first(1), pad_first(1)),
    State("S", "recurrent", 0, unsqueeze(-1), squeeze(-1)),
)

S6_DSF = ("per channel c and state n: Λ_i = exp(Δ_i^c A[c, n]) (A = -exp(A_log)), B_i = Δ_i^c b_i, C_i = c_i, "
          "D_i = diag(D); Δ = softplus(dt_proj(δ) + dt_bias), (δ, b, c) = x_proj(x)")

MAMBA = Family(
    "mamba",
    (ModuleMap("transformers.models.mamba.modeling_mamba.MambaMixer", "mamba", mamba_config, MAMBA_WEIGHTS, MAMBA_STATE,
               dsf=S6_DSF),),
    description="Mamba (Gu & Dao 2023): MambaMixer -> seqmix 'mamba' (S6, block=True)",
)

FALCON_MAMBA = Family(
    "falcon_mamba",
    (ModuleMap("transformers.models.falcon_mamba.modeling_falcon_mamba.FalconMambaMixer", "falcon_mamba", mamba_config,
               MAMBA_WEIGHTS, MAMBA_STATE, dsf=S6_DSF + "; δ, b, c each divided by its RMS (bcdt_rms)"),),
    description="Falcon-Mamba: FalconMambaMixer -> seqmix 'falcon_mamba' (S6, block=True, bcdt_rms=True)",
)


# ------------------------------------------------------------------------------------------
# Mamba-2 -> seqmix "mamba2" (SSD with block=True)
# ------------------------------------------------------------------------------------------


def mamba2_config(cfg, module) -> dict:
    """Mamba2Mixer -> the SSD block's config."""
    _silu(module)
    d = int(cfg.hidden_size)
    expand = _expand(module, d)
    H, P, G = int(module.num_heads), int(module.head_dim), int(module.n_groups)
    if H * P != module.intermediate_size:
        raise Unsupported("num_heads", H, f"num_heads·head_dim = {H * P} must equal intermediate_size = {module.intermediate_size}")
    if H % G:
        raise Unsupported("n_groups", G, f"the {H} heads must split evenly among the groups")
    lo, hi = (float(v) for v in module.time_step_limit)
    limit = None if (lo <= 0 and math.isinf(hi)) else (max(lo, 0.0), hi)
    return dict(
        d_model=d, d_state=int(module.ssm_state_size), headdim=P, groups=G, expand=expand, d_conv=int(module.conv_kernel_size),
        conv_bias=bool(module.use_conv_bias), bias=bool(module.use_bias), norm_eps=float(module.layer_norm_epsilon),
        chunk_size=int(module.chunk_size), dt_limit=limit, **_dt_init(cfg),
    )


MAMBA2_WEIGHTS = (
    Weight("in_proj.weight", "in_proj.weight"),  # (z, xBC, dt) in the same order
    Weight("in_proj.bias", "in_proj.bias"),
    Weight("conv1d.weight", "conv.weight", squeeze(1)),
    Weight("conv1d.bias", "conv.bias"),
    Weight("dt_bias", "dt_bias"),
    Weight("A_log", "A_log"),
    Weight("D", "D"),
    Weight("norm.weight", "norm.weight"),  # the gated RMSNorm, one norm per group
    Weight("out_proj.weight", "out_proj.weight"),
    Weight("out_proj.bias", "out_proj.bias"),
)

#: the recurrent state is [B, H, P, N] in transformers, [B, H, N, P] (K x V) in seqmix
MAMBA2_STATE = (
    State("conv", "conv", 0, drop_first(1), pad_first(1)),
    State("S", "recurrent", 0, transpose(-1, -2), transpose(-1, -2)),
)

MAMBA2 = Family(
    "mamba2",
    (ModuleMap("transformers.models.mamba2.modeling_mamba2.Mamba2Mixer", "mamba2", mamba2_config, MAMBA2_WEIGHTS,
               MAMBA2_STATE,
               dsf="per head h: Λ_i = exp(Δ_i^h a_h)·I (a_h = -exp(A_log_h)), B_i = Δ_i^h B_i^g, C_i = C_i^g "
                   "(group g of head h), D_i = D_h; Δ = clamp(softplus(dt + dt_bias), dt_limit)"),),
    description="Mamba-2 (Dao & Gu 2024): Mamba2Mixer -> seqmix 'mamba2' (SSD, block=True)",
)


# ------------------------------------------------------------------------------------------
# RWKV-4 -> seqmix "rwkv4" with RWKV4_FULL (bonus, token shift, WKV denominator)
# ------------------------------------------------------------------------------------------


def rwkv4_config(cfg, module) -> dict:
    """RwkvSelfAttention -> rwkv4 in full (one head per channel, the WKV's bonus, token shift and
    denominator). ``rescale_every`` needs no config: RwkvModel halves the hidden states itself and
    rescales ``attention.output.weight`` in place, which the adapter exposes (aliases: output -> W_o)."""
    d, A = int(cfg.hidden_size), int(module.attention_hidden_size)
    if A != d:
        raise Unsupported("attention_hidden_size", A, f"transformers' RWKV state list holds hidden_size = {d} channels per "
                          "layer for the WKV state, so only attention_hidden_size = hidden_size decodes (the original model "
                          "cannot use its state either)")
    return dict(d_model=d, **RWKV4_FULL)


#: transformers' RwkvSelfAttention -> seqmix "rwkv4" with RWKV4_FULL
RWKV4_WEIGHTS = (
    Weight("time_decay", "w"),  # log α = -exp(time_decay) in both
    Weight("time_first", "u"),  # the current-token bonus e^{u + k_t}
    Weight("time_mix_key", "mu_k", flatten()),  # [1, 1, d] -> [d]
    Weight("time_mix_value", "mu_v", flatten()),
    Weight("time_mix_receptance", "mu_r", flatten()),
    Weight("key.weight", "W_k.weight"),
    Weight("value.weight", "W_v.weight"),
    Weight("receptance.weight", "W_g.weight"),  # σ(r): seqmix's sigmoid gate
    Weight("output.weight", "W_o.weight"),
)

#: transformers' state is a list of five [B, d, num_layers] tensors (FFN shift, attention shift, num,
#: den, max); this layer's column of entries 1-4 is the mixer's state. The WKV state is stabilized
#: there (real num = num·e^max) and not in seqmix: read as (num·e^max, den·e^max), written with max = 0.
#: Entry 0 (the FFN's token shift) is the channel-mix's state (RWKV_FFN_STATE).
RWKV4_STATE = (
    State("x_prev", "stacked", 1),
    State("S", "stacked", (2, 3, 4), unstabilize_pair(), stabilized_pair()),
)


def rwkv_channel_mix_config(cfg, module) -> dict:
    """RwkvFeedForward -> rwkv_channel_mix: the width of its squared-ReLU key (intermediate_size, 4·hidden_size
    by default)."""
    return dict(d_model=int(cfg.hidden_size), d_ff=int(module.key.out_features))


#: transformers' RwkvFeedForward -> seqmix "rwkv_channel_mix"
RWKV_FFN_WEIGHTS = (
    Weight("time_mix_key", "mu_k", flatten()),  # [1, 1, d] -> [d]: the token shift's taps (1 - μ, μ)
    Weight("time_mix_receptance", "mu_r", flatten()),
    Weight("key.weight", "W_k.weight"),
    Weight("receptance.weight", "W_r.weight"),
    Weight("value.weight", "W_v.weight"),
)

#: the channel-mix's token shift: this layer's column of entry 0 of the state list (the last input [B, d])
RWKV_FFN_STATE = (State("x_prev", "stacked", 0),)

RWKV = Family(
    "rwkv",
    (ModuleMap("transformers.models.rwkv.modeling_rwkv.RwkvSelfAttention", "rwkv4", rwkv4_config, RWKV4_WEIGHTS,
               RWKV4_STATE, returns_state=True, aliases=(("output", "W_o"),), layer_attr="layer_id",
               dsf="per channel c (a scalar WKV state): Λ_i = α_c η_{i-1}/η_i, α_c = exp(-exp(time_decay_c)); "
                   "B_i = exp(k_i^c)/η_i; C_i = 1/α_c; D_i = (exp(time_first_c) - 1/α_c) exp(k_i^c)/η_i; η_i the WKV "
                   "denominator; k, v, r read the token-shifted μ ⊙ x_i + (1 - μ) ⊙ x_{i-1}; out = W_o(σ(r_i) ⊙ y_i)"),
     ModuleMap("transformers.models.rwkv.modeling_rwkv.RwkvFeedForward", "rwkv_channel_mix", rwkv_channel_mix_config,
               RWKV_FFN_WEIGHTS, RWKV_FFN_STATE, returns_state=True, aliases=(("value", "W_v"),), layer_attr="layer_id",
               dsf="the token shift per channel c (2 states): Λ = [[0, 1], [0, 0]] (a shift), B_i = e_2, "
                   "C_i = (1 - μ_c, μ_c), D_i = 0, for μ = μ_k and μ_r; out = σ(W_r x_r) ⊙ W_v relu(W_k x_k)²"),),
    slots=r"(^|\.)blocks\.\d+\.(attention|feed_forward)$",
    description="RWKV-4 (Peng et al. 2023): RwkvSelfAttention -> seqmix 'rwkv4' (bonus, token shift, denominator), "
                "RwkvFeedForward -> 'rwkv_channel_mix' (its token shift)",
)


# ------------------------------------------------------------------------------------------
# xLSTM -> seqmix "mlstm" (transformers 5.x builds mLSTM blocks only: no sLSTM)
# ------------------------------------------------------------------------------------------


def xlstm_config(cfg, module) -> dict:
    """xLSTMLayer -> the mlstm preset's config. transformers' xLSTM (xLSTM-7B's architecture) has
    mLSTM blocks only. Precision and kernel options (mode, autocast_kernel_dtype,
    inference_state_dtype, norm_reduction_force_float32, chunkwise_kernel) choose an algorithm,
    not the model: seqmix keeps its state in float32 (or wider) in every mode; chunk_size is
    carried over as the chunk length."""
    d, H = int(cfg.hidden_size), int(cfg.num_heads)
    qk, v = int(module.qk_dim), int(module.v_dim)
    for option, mine, cache in (("qk_dim_factor", qk, cfg.qk_dim), ("v_dim_factor", v, cfg.v_dim)):
        if mine != cache:
            raise Unsupported(option, getattr(cfg, option),
                              f"the layer computes with int(hidden_size·{option}) = {mine} channels, transformers' xLSTMCache "
                              f"holds {cache} (rounded up to a multiple of 64): the original model cannot use its cache "
                              "(forward with use_cache, generate) either; choose sizes whose product is a multiple of 64")
    if qk % H or v % H:
        raise Unsupported("num_heads", H, f"the {qk} query/key and {v} value channels must split evenly among the heads")
    return xlstm_fields(cfg, module)


def xlstm_fields(cfg, module) -> dict:
    """The mlstm config fields of an xLSTMLayer (the mapping alone, without the model-level checks
    of :func:`xlstm_config`; tests/test_real_mixers.py reads it for layers built on their own)."""
    d = int(cfg.hidden_size)
    cap = cfg.gate_soft_cap
    use_bias = bool(cfg.use_bias)
    return dict(d_model=d, heads=int(cfg.num_heads), expand_k=int(module.qk_dim) / d, expand_v=int(module.v_dim) / d,
                bias=use_bias, gate_bias=use_bias, norm_bias=use_bias, gate_soft_cap=float(cap) if cap else None,
                normalizer_eps=float(cfg.eps), norm_eps=float(cfg.norm_eps), chunk_size=int(cfg.chunk_size))


#: transformers' xLSTMLayer (weight_mode="single") -> seqmix "mlstm"
XLSTM_WEIGHTS = (
    Weight("q.weight", "W_q.weight"),
    Weight("q.bias", "W_q.bias"),
    Weight("k.weight", "W_k.weight"),  # k / sqrt(d_k') in both (transformers scales q: the same product)
    Weight("k.bias", "W_k.bias"),
    Weight("v.weight", "W_v.weight"),
    Weight("v.bias", "W_v.bias"),
    Weight("igate_preact.weight", "W_i.weight"),  # i = exp(soft_cap(ĩ)), one per head
    Weight("igate_preact.bias", "W_i.bias"),
    Weight("fgate_preact.weight", "W_a.weight"),  # f = σ(soft_cap(f̃)), one per head
    Weight("fgate_preact.bias", "W_a.bias"),
    Weight("ogate_preact.weight", "W_g.weight"),  # σ output gate
    Weight("ogate_preact.bias", "W_g.bias"),
    Weight("multihead_norm.weight", "norm.weight"),  # per-head LayerNorm
    Weight("multihead_norm.bias", "norm.bias"),
    Weight("out_proj.weight", "W_o.weight"),
    Weight("out_proj.bias", "W_o.bias"),
)


def xlstm_fused_weights(module) -> tuple[Weight, ...]:
    """transformers' xLSTMLayer (weight_mode="fused"): q, k, v, o stacked in ``qkv_opreact`` (rows
    qk, qk, v, v), i and f in ``ifgate_preact`` (H rows each); the split points are the layer's sizes."""
    qk, v, H = int(module.qk_dim), int(module.v_dim), int(module.config.num_heads)
    cuts = {"W_q": (0, qk), "W_k": (qk, 2 * qk), "W_v": (2 * qk, 2 * qk + v), "W_g": (2 * qk + v, 2 * qk + 2 * v)}
    out = [Weight(f"qkv_opreact.{p}", f"{name}.{p}", rows(a, b)) for p in ("weight", "bias") for name, (a, b) in cuts.items()]
    out += [Weight(f"ifgate_preact.{p}", f"{name}.{p}", rows(a, b))
            for p in ("weight", "bias") for name, (a, b) in (("W_i", (0, H)), ("W_a", (H, 2 * H)))]
    return tuple(out) + tuple(w for w in XLSTM_WEIGHTS if w.hf.startswith(("multihead_norm.", "out_proj.")))


def xlstm_weights(module) -> tuple[Weight, ...]:
    """The weight table of an xLSTMLayer in either weight mode."""
    return XLSTM_WEIGHTS if module.config.weight_mode == "single" else xlstm_fused_weights(module)


#: transformers' layer state is the tuple (C [B, H, K, V], n [B, H, K], m [B, H, 1]) passed to and returned by
#: the layer; seqmix keeps S = [C | n] [B, H, K, V + 1] (the normalizer is the ones column) and m [B, H]
XLSTM_STATE = (
    State("S", "tuple", (0, 1), append_column(), split_column()),
    State("m", "tuple", 2, squeeze(-1), unsqueeze(-1)),
)

XLSTM = Family(
    "xlstm",
    (ModuleMap("transformers.models.xlstm.modeling_xlstm.xLSTMLayer", "mlstm", xlstm_config, xlstm_weights, XLSTM_STATE,
               returns_state=True,
               dsf="per head h: Λ_i = f_i^h I, f = σ(soft_cap(f̃)); B_i = i_i^h (I ⊗ k_i/√d_k'), i = exp(soft_cap(ĩ)); "
                   "C_i = (I ⊗ q_iᵀ)/η_i, η_i = max(|n_iᵀ q_i|, 1) + ε e^{m_i} (n_i the normalizer state, m_i the "
                   "max-stabilizer); readout: per-head LayerNorm, σ(o_i) gate, out_proj"),),
    slots=r"(^|\.)blocks\.\d+\.mlstm_layer$",
    description="xLSTM (Beck et al. 2024; xLSTM-7B): xLSTMLayer (mLSTM) -> seqmix 'mlstm'",
)


RECURRENT = (MAMBA, FALCON_MAMBA, MAMBA2, RWKV, XLSTM)
