"""The hybrids: families that mix recurrent (or convolutional) layers with attention layers —
RecurrentGemma, Qwen3-Next, Kimi-Linear, MiniMax, LFM2 and the Mamba hybrids (Bamba,
GraniteMoeHybrid, Nemotron-H, Falcon-H1, Jamba, Zamba2); one :class:`~seqmix.interop.table.Family`
entry each. Their attention layers -> ``softmax_attention`` with the helpers of
:mod:`.transformers`; their Mamba layers with those of :mod:`.recurrent`.

transformers' module classes read here (5.x): ``RecurrentGemmaRecurrentBlock`` and
``RecurrentGemmaAttention`` (recurrent_gemma), ``Qwen3NextGatedDeltaNet`` / ``Qwen3NextAttention``
(qwen3_next), ``KimiLinearDeltaAttention`` (kimi_linear; its ``KimiLinearAttention`` is kept),
``MiniMaxLightningAttention`` / ``MiniMaxAttention`` (minimax), ``Lfm2ShortConv`` / ``Lfm2Attention``
(lfm2), and the Mamba hybrids' mixer and attention classes.
"""

from __future__ import annotations

import math

import torch

from ..table import Family, ModuleMap, State, Transform, Unsupported, Weight, drop_first, flatten, neg, pad_first, squeeze
from .recurrent import MAMBA2_STATE, MAMBA2_WEIGHTS, MAMBA_STATE, MAMBA_WEIGHTS, S6_DSF, _dt_init, _silu, mamba_config
from .transformers import (
    ATTENTION_STATE, ATTENTION_WEIGHTS, SOFTMAX_DSF, _attention, _group_rows, _rope, attention_dropout, kimi_mla_config, kimi_mla_weights,
    llama_attention_config, plus_one, rope_fields,
)


def recurrent_gemma_attention_config(cfg, module) -> dict:
    """RecurrentGemmaAttention -> softmax_attention: MQA / GQA, partial RoPE (the first
    partial_rotary_factor of each head), a bias on o_proj, the sliding window attention_window_size
    (transformers: key > query - window, the query's last `window` tokens, itself included: seqmix's).
    The default RoPE only: transformers' RecurrentGemmaRotaryEmbedding refuses every scaled type itself."""
    rp, theta = _rope(cfg)
    out = _attention(cfg, module)
    K = out["head_dim"]
    factor = float(rp.get("partial_rotary_factor", 1.0))
    R = int(K * factor)
    if R <= 0 or R % 2:
        raise Unsupported("partial_rotary_factor", factor, f"rotates int(head_dim·factor) = {R} channels: seqmix's RoPE needs an "
                          "even number > 0")
    inv_freq = getattr(getattr(module, "rotary_emb", None), "inv_freq", None)
    if inv_freq is not None:  # the module's own frequencies must be θ^(-2j/R)
        want = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.float) / R))
        if inv_freq.shape != want.shape or not torch.allclose(inv_freq.float().cpu(), want, rtol=1e-6, atol=0):
            raise Unsupported("rope_parameters", rp, f"the module's rotary frequencies (rotary_emb.inv_freq) are not θ^(-2j/R) "
                              f"for θ = {theta}, R = {R}")
    window = getattr(module, "sliding_window", None) or getattr(cfg, "attention_window_size", None)
    return dict(out, rope_theta=theta, rotary_dim=None if R == K else R, window=int(window))



def recurrent_gemma_block_config(cfg, module) -> dict:
    """RecurrentGemmaRecurrentBlock -> rg_lru_block (Griffin's recurrent block, c = 8, the reset at
    position 0). The RG-LRU's per-head block-diagonal gates stay block-diagonal (``gate_blocks`` = the
    heads: seqmix's BlockDiagonalLinear holds transformers' [heads, w, w] weights as they are)."""
    d, W = int(module.hidden_size), int(module.lru_width)
    if W % d:
        raise Unsupported("lru_width", W, f"seqmix's block has d_in = expand·hidden_size: lru_width must be a whole multiple of "
                          f"hidden_size = {d}")
    act = getattr(cfg, "hidden_activation", "gelu_pytorch_tanh")
    gate = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "silu": "silu"}.get(act)
    if gate is None:
        raise Unsupported("hidden_activation", act, "the outer gate branch of seqmix's block is GeLU (tanh or exact) or SiLU")
    return dict(d_model=d, expand=W // d, outer_gate=gate, conv_size=int(module.conv1d_width),
                gate_blocks=int(module.rg_lru.num_attention_heads))


#: transformers' RecurrentGemmaRecurrentBlock -> seqmix "rg_lru_block"
RECURRENT_GEMMA_WEIGHTS = (
    Weight("linear_x.weight", "W_in.weight", part=0),  # W_in = [linear_x (the stream x); linear_y (the gate branch)]
    Weight("linear_y.weight", "W_in.weight", part=1),
    Weight("linear_x.bias", "W_in.bias", part=0),
    Weight("linear_y.bias", "W_in.bias", part=1),
    Weight("conv_1d.weight", "conv.weight", squeeze(1)),  # depthwise [C, 1, W] -> [C, W], same tap order
    Weight("conv_1d.bias", "conv.bias"),
    Weight("rg_lru.input_gate_weight", "W_v.weight"),  # per head x_h W_h: BlockDiagonalLinear's layout [heads, w, w]
    Weight("rg_lru.input_gate_bias", "W_v.bias", flatten()),
    Weight("rg_lru.recurrent_gate_weight", "W_a.weight"),
    Weight("rg_lru.recurrent_gate_bias", "W_a.bias", flatten()),
    Weight("rg_lru.recurrent_param", "Lambda", neg()),  # log a = -c r softplus(param) = c r log σ(-param)
    Weight("linear_out.weight", "W_o.weight"),
    Weight("linear_out.bias", "W_o.bias"),
)

#: transformers' own block keeps its state in module attributes (conv1d_state [B, C, W-1],
#: rg_lru.recurrent_states [B, C]); the converted block keeps the same tensors in the DynamicCache's
#: linear-attention layer N (conv slot 0, recurrent slot 0); seqmix's S is [B, C, 1, 1] (a head per channel)
def _per_channel_state(t):
    return t[..., None, None]


def _flat_state(t):
    return t.flatten(1)


RG_LRU_STATE = (  # (module-level maps, not lambdas: a converted model pickles)
    State("conv", "conv", 0),
    State("S", "recurrent", 0, Transform("[B, C] -> [B, C, 1, 1]", _per_channel_state),
          Transform("[B, C, 1, 1] -> [B, C]", _flat_state)),
)

RECURRENT_GEMMA = Family(
    "recurrent_gemma",
    (ModuleMap("transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRecurrentBlock", "rg_lru_block",
               recurrent_gemma_block_config, RECURRENT_GEMMA_WEIGHTS, RG_LRU_STATE, returns_pair=True, mask="ignored",
               positions=True,
               dsf="per channel c: Λ_i = a_i^c, a_i = σ(-recurrent_param)^{8 r_i}, r_i = σ(W_a x_i + b_a); B_i = sqrt(1 - a_i²) "
                   "σ(W_x x_i + b_x) (1·σ(...) at position 0); C_i = 1; D_i = 0; x = conv(linear_x(u)); "
                   "out = linear_out(h_i ⊙ GeLU(linear_y(u)))"),
     ModuleMap("transformers.models.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaAttention", "softmax_attention",
               recurrent_gemma_attention_config, ATTENTION_WEIGHTS, ATTENTION_STATE, returns_pair=True, mask="causal",
               positions=True, dsf=SOFTMAX_DSF + "; sliding window, partial RoPE, MQA")),
    slots=r"(^|\.)layers\.\d+\.temporal_block$",
    description="RecurrentGemma (Griffin, De et al. 2024): RecurrentGemmaRecurrentBlock -> seqmix 'rg_lru_block', "
                "RecurrentGemmaAttention -> 'softmax_attention' (window, partial RoPE, MQA)",
)


# ------------------------------------------------------------------------------------------
# the frontier hybrids: Qwen3-Next (Gated DeltaNet + gated attention), Kimi-Linear (KDA;
# its MLA stays transformers'), MiniMax (lightning attention + attention), LFM2 (gated short conv +
# GQA attention). MoE / MLPs stay transformers' own.
# ------------------------------------------------------------------------------------------


def _conv_silu(module) -> None:
    act = getattr(module, "activation", "silu")
    if act not in ("silu", "swish"):
        raise Unsupported("hidden_act", act, "the delta-rule mixers' short conv on q, k, v is followed by SiLU only")


def qwen3_next_gdn_config(cfg, module) -> dict:
    """Qwen3NextGatedDeltaNet -> qwen3_next_gdn (gated_deltanet with GVA, one conv over [q; k; v], FLA's
    l2norm, the gated RMSNorm with one weight per head channel): α = exp(-exp(A_log) softplus(a + dt_bias))."""
    _conv_silu(module)
    d = int(module.hidden_size)
    Hk, Hv, Dk, Dv = int(module.num_k_heads), int(module.num_v_heads), int(module.head_k_dim), int(module.head_v_dim)
    if Hv % Hk:
        raise Unsupported("linear_num_value_heads", Hv, f"must be a multiple of linear_num_key_heads = {Hk} (each key head serves "
                          "the same number of value heads)")
    if module.conv1d.bias is not None:
        raise Unsupported("conv1d.bias", True, "seqmix's fused q/k/v conv has no bias")
    return dict(d_model=d, heads=Hv, k_heads=None if Hk == Hv else Hk, expand_k=Hk * Dk / d, expand_v=Hv * Dv / d,
                conv_size=int(module.conv_kernel_size), norm_eps=float(module.layer_norm_epsilon))


def qwen3_next_gdn_weights(module) -> tuple[Weight, ...]:
    """in_proj_qkvz holds, per key head, [q (Dk) | k (Dk) | v (r·Dv) | z (r·Dv)] (r = value heads per key
    head); in_proj_ba, per key head, [b (r) | a (r)]."""
    Hk, Dk, Dv = int(module.num_k_heads), int(module.head_k_dim), int(module.head_v_dim)
    r = int(module.num_v_heads) // Hk
    qkvz, ba = (Dk, Dk, r * Dv, r * Dv), (r, r)
    return (
        *(Weight("in_proj_qkvz.weight", f"{name}.weight", _group_rows(Hk, qkvz, i, "in_proj_qkvz"))
          for i, name in enumerate(("W_q", "W_k", "W_v", "W_g"))),  # z is the gate of the gated RMSNorm
        Weight("in_proj_ba.weight", "W_beta.weight", _group_rows(Hk, ba, 0, "in_proj_ba")),  # β = σ(b)
        Weight("in_proj_ba.weight", "W_a.weight", _group_rows(Hk, ba, 1, "in_proj_ba")),  # log α = -exp(A_log) softplus(a + dt_bias)
        Weight("conv1d.weight", "conv.weight", squeeze(1)),  # one depthwise conv over [q; k; v]
        Weight("dt_bias", "dt_bias"),
        Weight("A_log", "A_log"),
        Weight("norm.weight", "norm.weight"),  # RMSNormGated: one weight [Dv] shared by the heads
        Weight("out_proj.weight", "W_o.weight"),
    )


#: the DynamicCache's linear-attention layer: conv slot 0 keeps the last W inputs [B, 2·Dk·Hk + Dv·Hv, W] (seqmix
#: W - 1), recurrent slot 0 the delta-rule state [B, Hv, Dk, Dv] (seqmix's layout)
DELTA_STATE = (
    State("conv", "conv", 0, drop_first(1), pad_first(1)),
    State("S", "recurrent", 0),
)


def qwen3_next_attention_config(cfg, module) -> dict:
    """Qwen3NextAttention -> softmax_attention: GQA, partial RoPE (partial_rotary_factor) with its scaling, qk-norm
    per head with zero-centred weights (1 + w), the sigmoid output gate that q_proj interleaves with q per head."""
    K = int(module.head_dim)
    q, k, v, o = module.q_proj, module.k_proj, module.v_proj, module.o_proj
    H, Hkv = q.out_features // (2 * K), k.out_features // K
    if q.out_features != 2 * H * K or H % Hkv or v.out_features != Hkv * K or o.in_features != H * K:
        raise Unsupported("num_key_value_heads", Hkv, "q_proj (query and gate per head), k_proj, v_proj and o_proj are not heads of "
                          f"width head_dim = {K}")
    has = {n: getattr(module, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if len(set(has.values())) > 1:
        raise Unsupported("attention_bias", has, "q_proj (and with it the output gate), k_proj, v_proj and o_proj must all have a "
                          "bias or none")
    scale = "sqrt" if math.isclose(float(module.scaling), K ** -0.5, rel_tol=1e-12) else float(module.scaling)
    return dict(d_model=int(q.in_features), heads=H, kv_heads=Hkv, head_dim=K, qkv_bias=has["q_proj"], out_bias=has["o_proj"],
                scale=scale, **rope_fields(cfg, module, K), qk_norm="head", qk_norm_eps=float(module.q_norm.eps),
                output_gate=True, attn_dropout=attention_dropout(module))


def qwen3_next_attention_weights(module) -> tuple[Weight, ...]:
    """q_proj holds, per head, [q (K) | gate (K)]; W_qk = [q; k_proj], W_g = the gate rows."""
    H, K = module.q_proj.out_features // (2 * module.head_dim), int(module.head_dim)
    q, g = _group_rows(H, (K, K), 0, "q_proj"), _group_rows(H, (K, K), 1, "q_proj")
    return (
        Weight("q_proj.weight", "W_qk.weight", q, part=0),
        Weight("k_proj.weight", "W_qk.weight", part=1),
        Weight("q_proj.bias", "W_qk.bias", Transform("q rows", lambda t: q(t[:, None]).flatten()), part=0),
        Weight("k_proj.bias", "W_qk.bias", part=1),
        Weight("q_proj.weight", "W_g.weight", g),
        Weight("q_proj.bias", "W_g.bias", Transform("gate rows", lambda t: g(t[:, None]).flatten())),
        Weight("v_proj.weight", "W_v.weight"),
        Weight("v_proj.bias", "W_v.bias"),
        Weight("o_proj.weight", "W_o.weight"),
        Weight("o_proj.bias", "W_o.bias"),
        Weight("q_norm.weight", "q_norm.weight", plus_one()),  # x·(1 + w) -> seqmix's weight 1 + w
        Weight("k_norm.weight", "k_norm.weight", plus_one()),
    )


QWEN3_NEXT = Family(
    "qwen3_next",
    (ModuleMap("transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextGatedDeltaNet", "qwen3_next_gdn", qwen3_next_gdn_config,
               qwen3_next_gdn_weights, DELTA_STATE,
               dsf="per value head h: Λ_i = α_i^h (I - β_i^h k_i k_iᵀ) (scalar decay + rank one), α = exp(-exp(A_log_h) "
                   "softplus(a_i^h + dt_bias_h)), β = σ(b); B_i = β_i k_iᵀ, C_i = q_i/√Dk; q, k = l2norm(SiLU(conv(x W))) shared by "
                   "the value heads of a key head (GVA); readout RMSNorm_h(o) ⊙ SiLU(z), out_proj"),
     ModuleMap("transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextAttention", "softmax_attention",
               qwen3_next_attention_config, qwen3_next_attention_weights, ATTENTION_STATE, returns_pair=True, mask="causal",
               positions=True, dsf=SOFTMAX_DSF + "; qk-norm, partial RoPE, σ output gate")),
    slots=r"(^|\.)layers\.\d+\.(linear_attn|self_attn)$",
    description="Qwen3-Next: Qwen3NextGatedDeltaNet -> seqmix 'qwen3_next_gdn' (Gated DeltaNet, GVA), Qwen3NextAttention -> "
                "'softmax_attention' (qk-norm, partial RoPE, output gate); MoE stays transformers'",
)


def kimi_kda_config(cfg, module) -> dict:
    """KimiLinearDeltaAttention -> kimi_kda: the key-wise decay -exp(A_log_h) softplus(f_b(f_a(x)) + dt_bias),
    FLA's l2norm, one conv over [q; k; v], the sigmoid low-rank output gate and the shared-weight RMSNorm."""
    _conv_silu(module)
    d, H, Dh = int(module.hidden_size), int(module.num_heads), int(module.head_dim)
    return dict(d_model=d, heads=H, expand_k=H * Dh / d, expand_v=H * Dh / d, conv_size=int(module.conv_kernel_size),
                low_rank=int(module.forget_gate.f_a_proj.out_features), gate_rank=int(module.g_a_proj.out_features),
                norm_eps=float(module.layer_norm_epsilon))


KIMI_KDA_WEIGHTS = (
    Weight("q_proj.weight", "W_q.weight"),
    Weight("k_proj.weight", "W_k.weight"),
    Weight("v_proj.weight", "W_v.weight"),
    Weight("conv1d.weight", "conv.weight", squeeze(1)),  # one depthwise conv over [q; k; v]
    Weight("forget_gate.f_a_proj.weight", "W_a.0.weight"),  # the key-wise gate's low-rank projection
    Weight("forget_gate.f_b_proj.weight", "W_a.1.weight"),
    Weight("forget_gate.dt_bias", "dt_bias"),
    Weight("forget_gate.A_log", "A_log", flatten()),  # [1, 1, H, 1] -> [H]
    Weight("b_proj.weight", "W_beta.weight"),  # β = σ(x W_β)
    Weight("g_a_proj.weight", "W_g.0.weight"),  # σ(x W_g¹ W_g²) output gate
    Weight("g_b_proj.weight", "W_g.1.weight"),
    Weight("o_norm.weight", "norm.weight"),  # one weight [head_dim] shared by the heads
    Weight("o_proj.weight", "W_o.weight"),
)

KIMI_LINEAR = Family(
    "kimi_linear",
    (ModuleMap("transformers.models.kimi_linear.modeling_kimi_linear.KimiLinearDeltaAttention", "kimi_kda", kimi_kda_config,
               KIMI_KDA_WEIGHTS, DELTA_STATE,
               dsf="per head h: Λ_i = (I - β_i k_i k_iᵀ) Diag(α_i) (key-wise decay + rank one), log α = -exp(A_log_h) "
                   "softplus(x W_f¹ W_f² + dt_bias), β = σ(x W_β); B_i = β_i k_iᵀ, C_i = q_i/√K; q, k = l2norm(SiLU(conv(x W))); "
                   "readout RMSNorm_h(o) ⊙ σ(x W_g¹ W_g²), o_proj"),
     ModuleMap("transformers.models.kimi_linear.modeling_kimi_linear.KimiLinearAttention", "softmax_attention", kimi_mla_config,
               kimi_mla_weights, ATTENTION_STATE, returns_pair=True, mask="causal",
               dsf=SOFTMAX_DSF.replace(", q and k rotated by RoPE at their absolute positions", "") + "; MLA without positions: "
                   "q^hᵀk_j^h = (W_kb^hᵀ q_nope^h)ᵀ c_j + q_pe^hᵀ k_pe,j, a softmax over a rank-(r + R) key space shared by the "
                   "heads (the cached latent)")),
    slots=r"(^|\.)layers\.\d+\.self_attn$",
    description="Kimi-Linear: KimiLinearDeltaAttention -> seqmix 'kimi_kda' (KDA), KimiLinearAttention (MLA, no positions) -> "
                "'softmax_attention' with kv_lora_rank (the latent cached as transformers caches it); MoE stays transformers'",
)


def minimax_lightning_config(cfg, module) -> dict:
    """MiniMaxLightningAttention -> lightning_attention: q, k, v = SiLU(qkv_proj(x)) per head, the fixed decay
    exp(-slope_h) of this layer (its slope_rate buffer, read into head_decay_rates; the block decay buffers are
    functions of it and are checked), no scale, RMSNorm over all heads, σ gate, out_proj."""
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise Unsupported("hidden_act", act, "seqmix's lightning_attention applies SiLU to q, k, v")
    H, K, d = int(module.num_attention_heads), int(module.head_dim), int(cfg.hidden_size)
    slopes = module.slope_rate.detach().double().flatten()
    if slopes.numel() != H or not bool((slopes > 0).all()):
        raise Unsupported("slope_rate", slopes.tolist(), f"needs {H} rates > 0 (one decay exp(-rate) per head)")
    want = module.decay_factors(module.slope_rate)
    for name, t in zip(("query_decay", "key_decay", "diagonal_decay"), want):
        if not torch.allclose(getattr(module, name).float(), t.float(), rtol=1e-5, atol=0):
            raise Unsupported(name, "edited", "the block decays must be the functions of slope_rate that seqmix recomputes")
    return dict(d_model=d, heads=H, expand_k=H * K / d, expand_v=H * K / d, head_decay_rates=tuple(float(r) for r in slopes),
                norm_eps=float(module.norm.variance_epsilon), chunk_size=int(module.block_size))


def minimax_lightning_weights(module) -> tuple[Weight, ...]:
    """qkv_proj holds, per head, [q (K) | k (K) | v (K)]."""
    H, K = int(module.num_attention_heads), int(module.head_dim)
    return (
        *(Weight("qkv_proj.weight", f"{n}.weight", _group_rows(H, (K, K, K), i, "qkv_proj")) for i, n in enumerate(("W_q", "W_k", "W_v"))),
        Weight("output_gate.weight", "W_g.weight"),  # σ(x W_g) ⊙ RMSNorm(o)
        Weight("norm.weight", "norm.weight"),
        Weight("out_proj.weight", "W_o.weight"),
        *(Weight(b, None) for b in ("slope_rate", "query_decay", "key_decay", "diagonal_decay")),  # derived (config)
    )


def minimax_attention_config(cfg, module) -> dict:
    """MiniMaxAttention -> softmax_attention (GQA, RoPE over the head); a sliding window is refused (transformers keeps
    every token in MiniMaxCache's layers and masks, seqmix's windowed KV cache drops them)."""
    w = getattr(cfg, "sliding_window", None)
    if w is not None:
        raise Unsupported("sliding_window", w, "MiniMaxCache keeps full attention layers; seqmix's windowed attention keeps its "
                          "last window - 1 tokens in a sliding layer")
    return llama_attention_config(cfg, module)


MINIMAX = Family(
    "minimax",
    (ModuleMap("transformers.models.minimax.modeling_minimax.MiniMaxLightningAttention", "lightning_attention",
               minimax_lightning_config, minimax_lightning_weights, (State("S", "linear_cache"),), returns_pair=True,
               dsf="per head h: Λ_i = γ_h I, γ_h = exp(-slope_h) fixed (slope_h = 2^{-8(h+1)/H}(1 - l/(L-1) + 1e-5)); "
                   "B_i = k_iᵀ, C_i = q_i (no scale); q, k, v = SiLU(x W); readout RMSNorm(o) over all heads ⊙ σ(x W_g), out_proj"),
     ModuleMap("transformers.models.minimax.modeling_minimax.MiniMaxAttention", "softmax_attention", minimax_attention_config,
               ATTENTION_WEIGHTS, ATTENTION_STATE, returns_pair=True, mask="causal", positions=True, dsf=SOFTMAX_DSF)),
    slots=r"(^|\.)layers\.\d+\.self_attn$",
    description="MiniMax: MiniMaxLightningAttention -> seqmix 'lightning_attention' (fixed per-head decay), MiniMaxAttention -> "
                "'softmax_attention'; MoE stays transformers'",
)


def lfm2_conv_config(cfg, module) -> dict:
    """Lfm2ShortConv -> short_conv: (b, c, x) = in_proj(u), y = out_proj(c ⊙ conv(b ⊙ x)), conv_L_cache taps."""
    return dict(d_model=int(cfg.hidden_size), width=int(module.conv_kernel_size), bias=bool(module.bias))


LFM2_CONV_WEIGHTS = (
    Weight("in_proj.weight", "in_proj.weight"),  # rows (b, c, x), chunked in the same order
    Weight("in_proj.bias", "in_proj.bias"),
    Weight("conv.weight", "conv.weight", squeeze(1)),
    Weight("conv.bias", "conv.bias"),
    Weight("out_proj.weight", "out_proj.weight"),
    Weight("out_proj.bias", "out_proj.bias"),
)


def lfm2_attention_config(cfg, module) -> dict:
    """Lfm2Attention -> softmax_attention: GQA, RoPE over the head with its scaling, qk-norm per head (plain weight),
    no biases."""
    K = int(module.head_dim)
    q, k, v, o = module.q_proj, module.k_proj, module.v_proj, module.out_proj
    H, Hkv = q.out_features // K, k.out_features // K
    if q.out_features != H * K or k.out_features != Hkv * K or v.out_features != Hkv * K or o.in_features != H * K or H % Hkv:
        raise Unsupported("num_key_value_heads", Hkv, f"q_proj, k_proj, v_proj and out_proj are not heads of width head_dim = {K}")
    if any(getattr(module, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "out_proj")):
        raise Unsupported("bias", True, "Lfm2Attention's projections have no bias in transformers")
    scale = "sqrt" if math.isclose(float(module.scaling), K ** -0.5, rel_tol=1e-12) else float(module.scaling)
    return dict(d_model=int(q.in_features), heads=H, kv_heads=Hkv, head_dim=K, scale=scale, **rope_fields(cfg, module, K),
                qk_norm="head", qk_norm_eps=float(module.q_layernorm.variance_epsilon))


LFM2_ATTENTION_WEIGHTS = (
    Weight("q_proj.weight", "W_qk.weight", part=0),
    Weight("k_proj.weight", "W_qk.weight", part=1),
    Weight("v_proj.weight", "W_v.weight"),
    Weight("out_proj.weight", "W_o.weight"),
    Weight("q_layernorm.weight", "q_norm.weight"),
    Weight("k_layernorm.weight", "k_norm.weight"),
)

LFM2 = Family(
    "lfm2",
    (ModuleMap("transformers.models.lfm2.modeling_lfm2.Lfm2ShortConv", "short_conv", lfm2_conv_config, LFM2_CONV_WEIGHTS,
               (State("conv", "conv", 0, drop_first(1), pad_first(1)),),
               dsf="per channel c: h_i ∈ R^W the last W products z = b ⊙ x; Λ = the shift (nilpotent, eigenvalues 0), "
                   "B_i = b_i e_W, C_i = c_i w (the conv taps), D_i = 0: Φ_c[t, s] = c_t w_{W-1-(t-s)} b_s for t - s < W"),
     ModuleMap("transformers.models.lfm2.modeling_lfm2.Lfm2Attention", "softmax_attention", lfm2_attention_config,
               LFM2_ATTENTION_WEIGHTS, ATTENTION_STATE, returns_pair=True, mask="causal", positions=True,
               dsf=SOFTMAX_DSF + "; qk-norm")),
    slots=r"(^|\.)layers\.\d+\.(conv|self_attn)$",
    description="LFM2: Lfm2ShortConv -> seqmix 'short_conv' (gated short convolution), Lfm2Attention -> 'softmax_attention' "
                "(GQA, qk-norm)",
)


# ------------------------------------------------------------------------------------------
# The Mamba hybrids: Bamba, GraniteMoeHybrid, Nemotron-H, Zamba2 and Falcon-H1 (their
# Mamba-2 layers -> "mamba2"), Jamba (its Mamba layers -> "jamba_mamba"); their attention layers
# -> "softmax_attention". MLPs, MoE blocks, norms and the decoder layers' multipliers stay
# transformers' own. Every cache layer is transformers' DynamicCache layer: LinearAttentionLayer
# (conv / recurrent slot 0), DynamicLayer (kv) or, where a layer holds both (Zamba2's hybrid layers,
# every Falcon-H1 layer), LinearAttentionAndFullAttentionLayer: the same state rows read it.
# ------------------------------------------------------------------------------------------


def hybrid_mamba2_config(cfg, module) -> dict:
    """BambaMixer, GraniteMoeHybridMambaLayer, NemotronHMamba2Mixer, Zamba2MambaMixer, FalconH1Mixer ->
    mamba2. They compute Mamba2Mixer's block under their own config names; the sizes, biases and norm
    are read from the module itself: the inner width (``d_inner`` when it is no multiple of
    hidden_size: Falcon-H1's mamba_d_ssm), the readout (``gate_norm``: Falcon-H1's mamba_rms_norm and
    mamba_norm_before_gate) and Falcon-H1's μP multipliers (``in_multiplier`` = ssm_in_multiplier,
    ``zxbcdt_multipliers`` = the five blocks of its mup_vector, ssm_multipliers)."""
    _silu(module)
    d, D = int(module.hidden_size), int(module.intermediate_size)
    H, P, G, N = int(module.num_heads), int(module.head_dim), int(module.n_groups), int(module.ssm_state_size)
    if H * P != D:
        raise Unsupported("mamba_n_heads", H, f"heads·head_dim = {H}·{P} must equal the inner width {D}")
    if H % G:
        raise Unsupported("mamba_n_groups", G, f"the {H} heads must split evenly among the groups")
    in_bias, out_bias = module.in_proj.bias is not None, module.out_proj.bias is not None
    if in_bias != out_bias:
        raise Unsupported("mamba_proj_bias", {"in_proj": in_bias, "out_proj": out_bias},
                          "seqmix's mamba2 has one switch, bias, for in_proj and out_proj (Falcon-H1: mamba_proj_bias and "
                          "projectors_bias must agree)")
    lo, hi = (float(v) for v in module.time_step_limit)
    out = dict(d_model=d, d_state=N, headdim=P, groups=G, d_conv=int(module.conv_kernel_size),
               conv_bias=module.conv1d.bias is not None, bias=in_bias, chunk_size=int(module.chunk_size),
               dt_limit=None if (lo <= 0 and math.isinf(hi)) else (max(lo, 0.0), hi), **_dt_init(cfg))
    out.update(expand=D // d) if D % d == 0 else out.update(expand=1, d_inner=D)
    norm = module.norm
    if isinstance(norm, torch.nn.Identity):  # Falcon-H1, mamba_rms_norm = False: y ⊙ SiLU(z)
        out["gate_norm"] = "none"
    else:
        size = getattr(norm, "group_size", None) or D // int(getattr(norm, "n_groups", 1))
        if size * G != D:
            raise Unsupported("mamba_n_groups", G, f"the gated RMSNorm normalizes groups of {size} channels, seqmix one per "
                              f"B/C group ({D // G})")
        out.update(norm_eps=float(norm.variance_epsilon),
                   gate_norm="before_gate" if getattr(norm, "norm_before_gate", False) else "gated")
    m_in = float(getattr(module, "ssm_in_multiplier", 1.0))
    if m_in != 1.0:
        out["in_multiplier"] = m_in
    mup = getattr(module, "mup_vector", None)
    if mup is not None:  # Falcon-H1: in_proj's output times a constant per block (z, x, B, C, dt)
        blocks = mup.detach().float().reshape(-1).cpu().split([D, D, G * N, G * N, H])
        if not all(bool((b == b[0]).all()) for b in blocks):
            raise Unsupported("ssm_multipliers", "mup_vector", "seqmix's zxbcdt_multipliers are one constant per block of "
                              "in_proj's output (z, x, B, C, dt); this mup_vector is not")
        muls = tuple(float(b[0]) for b in blocks)
        named = tuple(float(v) for v in getattr(cfg, "ssm_multipliers", None) or ())
        if len(named) == 5 and torch.equal(torch.tensor(named, dtype=mup.dtype), torch.tensor(muls, dtype=mup.dtype)):
            muls = named  # the config's numbers (the buffer holds them rounded to its dtype)
        if any(m != 1.0 for m in muls):
            out["zxbcdt_multipliers"] = muls
    return out


def _hybrid_rope(cfg, module, uses_rope: bool) -> dict:
    """The RoPE fields of softmax_attention for an attention layer that applies transformers' RoPE
    (rotate_half pairs over the first R = head_dim·partial_rotary_factor channels: Bamba's 0.5; any scaling of
    ``rope_parameters`` through ops.rotary's, as :func:`rope_fields`) or none (Jamba, Nemotron-H;
    GraniteMoeHybrid without position_embedding_type 'rope'; Zamba2 without use_mem_rope)."""
    if not uses_rope:
        return dict(rope=False)
    return rope_fields(cfg, module, int(module.head_dim))


def hybrid_attention_config(cfg, module) -> dict:
    """BambaAttention (partial RoPE 0.5), GraniteMoeHybridAttention (scale attention_multiplier, RoPE when
    position_embedding_type = 'rope'), NemotronHAttention and JambaAttention (no RoPE), FalconH1Attention
    (RoPE; key_multiplier folded into W_k's rows: see FALCON_H1_ATTENTION_WEIGHTS) -> softmax_attention."""
    uses = {"jamba": False, "nemotron_h": False,
            "granitemoehybrid": getattr(cfg, "position_embedding_type", None) == "rope"}.get(cfg.model_type, True)
    return dict(_attention(cfg, module), **_hybrid_rope(cfg, module, uses))


#: Falcon-H1's attention scales its keys by key_multiplier (before RoPE and the cache): folded into W_k's
#: rows (weight and bias), so that the keys seqmix caches are the ones transformers caches (its cache
#: object stays interchangeable with the original model's); a config scale would cache other keys
def falcon_h1_attention_weights(module) -> tuple[Weight, ...]:
    m = float(module.key_multiplier)
    if m == 1.0:
        return ATTENTION_WEIGHTS
    times = Transform(f"·{m:g} (key_multiplier)", lambda t: t * m)
    return tuple(Weight(w.hf, w.seqmix, times, part=w.part) if w.hf.startswith("k_proj.") else w for w in ATTENTION_WEIGHTS)


#: Jamba's Mamba: the Mamba block with weighted RMS norms on δ (dt_layernorm), b and c
def jamba_mamba_config(cfg, module) -> dict:
    out = mamba_config(cfg, module)
    eps = {float(n.variance_epsilon) for n in (module.dt_layernorm, module.b_layernorm, module.c_layernorm)}
    if len(eps) != 1:
        raise Unsupported("rms_norm_eps", sorted(eps), "seqmix's bcdt_rms norms share one epsilon")
    return dict(out, bcdt_rms=True, bcdt_rms_affine=True, bcdt_rms_eps=eps.pop())


JAMBA_MAMBA_WEIGHTS = MAMBA_WEIGHTS + (
    Weight("dt_layernorm.weight", "dt_norm.weight"),
    Weight("b_layernorm.weight", "b_norm.weight"),
    Weight("c_layernorm.weight", "c_norm.weight"),
)

HYBRID_MAMBA2_WEIGHTS = MAMBA2_WEIGHTS  # (z, xBC, dt) = in_proj(u) in the same order; norm absent on both sides when off

MAMBA2_DSF = ("per head h: Λ_i = exp(Δ_i^h a_h)·I (a_h = -exp(A_log_h)), B_i = Δ_i^h B_i^g, C_i = C_i^g (group g of head h), "
              "D_i = D_h; Δ = clamp(softplus(dt + dt_bias), time_step_limit)")


def _hybrid(model_type: str, package: str, mamba_cls: str, attn_cls: str, slots: str, description: str, *,
            mamba_map: ModuleMap | None = None, attention_weights=ATTENTION_WEIGHTS, attn_extra: dict | None = None,
            not_mixers: tuple[str, ...] = ()) -> Family:
    base = f"transformers.models.{package}.modeling_{package}."
    mamba = mamba_map or ModuleMap(base + mamba_cls, "mamba2", hybrid_mamba2_config, HYBRID_MAMBA2_WEIGHTS, MAMBA2_STATE,
                                   dsf=MAMBA2_DSF)
    attn = ModuleMap(base + attn_cls, "softmax_attention", hybrid_attention_config, attention_weights, ATTENTION_STATE,
                     returns_pair=True, mask="causal", positions=True, dsf=SOFTMAX_DSF, **(attn_extra or {}))
    return Family(model_type, (mamba, attn), slots=slots, description=description, not_mixers=tuple(base + c for c in not_mixers))


BAMBA = _hybrid("bamba", "bamba", "BambaMixer", "BambaAttention", r"(^|\.)layers\.\d+\.(mamba|self_attn)$",
                "Bamba: BambaMixer -> seqmix 'mamba2', BambaAttention -> 'softmax_attention' (partial RoPE 0.5, GQA)")
GRANITE_MOE_HYBRID = _hybrid(
    "granitemoehybrid", "granitemoehybrid", "GraniteMoeHybridMambaLayer", "GraniteMoeHybridAttention",
    r"(^|\.)layers\.\d+\.(mamba|self_attn)$",
    "GraniteMoeHybrid (Granite 4.0): GraniteMoeHybridMambaLayer -> seqmix 'mamba2', GraniteMoeHybridAttention -> "
    "'softmax_attention' (scale attention_multiplier, RoPE if position_embedding_type = 'rope'); MoE stays transformers'")
NEMOTRON_H = _hybrid(
    "nemotron_h", "nemotron_h", "NemotronHMamba2Mixer", "NemotronHAttention", r"(^|\.)layers\.\d+\.mixer$",
    "Nemotron-H: NemotronHMamba2Mixer -> seqmix 'mamba2', NemotronHAttention -> 'softmax_attention' (no RoPE, GQA); "
    "the MLP and MoE layers stay transformers'", not_mixers=("NemotronHMLP", "NemotronHMoE"))
FALCON_H1 = _hybrid(
    "falcon_h1", "falcon_h1", "FalconH1Mixer", "FalconH1Attention", r"(^|\.)layers\.\d+\.(mamba|self_attn)$",
    "Falcon-H1: FalconH1Mixer -> seqmix 'mamba2' (d_inner = mamba_d_ssm, gate_norm, μP multipliers), FalconH1Attention -> "
    "'softmax_attention' (RoPE, key_multiplier folded into W_k), in parallel in every layer",
    attention_weights=falcon_h1_attention_weights)
JAMBA = _hybrid(
    "jamba", "jamba", "JambaMambaMixer", "JambaAttention", r"(^|\.)layers\.\d+\.(mamba|self_attn)$",
    "Jamba: JambaMambaMixer -> seqmix 'jamba_mamba' (Mamba with weighted RMS norms on Δ's input, B, C), JambaAttention -> "
    "'softmax_attention' (no RoPE, GQA); MoE stays transformers'",
    mamba_map=ModuleMap("transformers.models.jamba.modeling_jamba.JambaMambaMixer", "jamba_mamba", jamba_mamba_config,
                        JAMBA_MAMBA_WEIGHTS, MAMBA_STATE,
                        dsf=S6_DSF + "; δ, b, c each RMS-normalized with a learnt weight (dt/b/c_layernorm)"))



def zamba2_attention_config(cfg, module) -> dict:
    """Zamba2Attention (the shared block's attention) -> softmax_attention: it reads the concatenation
    [h; embeddings] of width attention_hidden_size = 2·hidden_size and writes hidden_size (``d_out``),
    head_dim = 2·hidden_size / heads, scale (head_dim / 2)^(-1/2), RoPE only with use_mem_rope. The
    per-use LoRA adapters on q, k, v (use_shared_attention_adapter) have no seqmix form: refused."""
    if getattr(cfg, "use_shared_attention_adapter", False):
        raise Unsupported("use_shared_attention_adapter", True,
                          "each use of the shared block adds its own low-rank adapter to q, k and v: seqmix's attention has "
                          "one W_qk and W_v, and merging the adapters would give every use its own weights (no longer shared)")
    out = dict(_attention(cfg, module), **_hybrid_rope(cfg, module, bool(getattr(cfg, "use_mem_rope", False))))
    d_out = int(module.o_proj.out_features)
    if d_out != out["d_model"]:
        out["d_out"] = d_out
    return out


ZAMBA2 = Family(
    "zamba2",
    (ModuleMap("transformers.models.zamba2.modeling_zamba2.Zamba2MambaMixer", "mamba2", hybrid_mamba2_config,
               HYBRID_MAMBA2_WEIGHTS, MAMBA2_STATE, dsf=MAMBA2_DSF),
     ModuleMap("transformers.models.zamba2.modeling_zamba2.Zamba2Attention", "softmax_attention", zamba2_attention_config,
               ATTENTION_WEIGHTS, ATTENTION_STATE, returns_pair=True, mask="causal", positions=True, layer_attr="",
               layer_arg="layer_idx",
               dsf=SOFTMAX_DSF + "; input [h; embeddings] (2·hidden_size), output hidden_size; one block shared by its uses")),
    slots=r"(^|\.)layers\.\d+\.(mamba|mamba_decoder\.mamba|shared_transformer\.self_attn)$",
    description="Zamba2: Zamba2MambaMixer -> seqmix 'mamba2', the shared Zamba2Attention -> 'softmax_attention' (d_out), one "
                "converted module per use holding the same parameters (weight sharing kept)",
)


HYBRIDS = (RECURRENT_GEMMA, QWEN3_NEXT, KIMI_LINEAR, MINIMAX, LFM2, BAMBA, GRANITE_MOE_HYBRID, NEMOTRON_H, FALCON_H1, JAMBA, ZAMBA2)
