"""The transformers: attention-only families whose every attention layer becomes seqmix's one
``softmax_attention`` (one :class:`~seqmix.interop.table.Family` entry each), and the attention
helpers the hybrid families share (RoPE parameters, sizes, the weight and state tables).

transformers' module classes read here (5.x): ``LlamaAttention`` (llama), ``Qwen2Attention``, ``Qwen3Attention``,
``Qwen3MoeAttention``, ``MistralAttention``, ``MixtralAttention``, ``GemmaAttention``, ``Gemma2Attention``,
``Gemma3Attention`` (gemma3_text), ``Phi3Attention``, ``PhiAttention``, ``GPTNeoXAttention``, ``Olmo2Attention``,
``SmolLM3Attention``, ``GraniteAttention``, ``GptOssAttention``, ``GPT2Attention``, ``BloomAttention`` and
``DeepseekV3Attention`` (MLA). What a family's attention does beyond Llama's is an option of the one
``softmax_attention`` (windows per layer, qk-norm placement, soft-capping, sinks, ALiBi, the scale, partial and
scaled RoPE, no-RoPE layers, MLA), read per layer by :func:`attention_config` (Phi, Phi-3, GPT-NeoX, GPT-2, BLOOM
and MLA have their own for their projection layouts).
"""

from __future__ import annotations

import math

import torch

from ..table import Family, ModuleMap, State, Transform, Unsupported, Weight, rows


# ------------------------------------------------------------------------------------------
# the attention helpers (RoPE parameters, sizes, the weight and state tables), shared with the hybrids
# ------------------------------------------------------------------------------------------


def _rope(cfg) -> tuple[dict, float]:
    """(rope_parameters, θ) of a transformers 5.x config (``config.rope_parameters``: one dict
    {"rope_type", "rope_theta", ...}); only the 'default' type is seqmix's RoPE."""
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    if rp and all(isinstance(v, dict) for v in rp.values()):
        raise Unsupported("rope_parameters", rp, "per-layer-type RoPE parameters are not read by this family")
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type != "default":
        raise Unsupported("rope_parameters.rope_type", rope_type,
                          "seqmix's RoPE (ops.rotary) turns pair j by p·θ^(-2j/R) at the absolute position p (the 'default' "
                          "type); the scaled types (linear, dynamic, yarn, longrope, llama3) change the frequencies, the "
                          "positions or the attention scale with the context, which it does not express")
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        raise Unsupported("rope_parameters.rope_theta", None, "the config names no RoPE base")
    return rp, float(theta)


def _attention(cfg, module) -> dict:
    """The sizes, biases, scale and dropout shared by LlamaAttention and RecurrentGemmaAttention,
    read from the module's own projections."""
    K = int(module.head_dim)
    q, k, v, o = module.q_proj, module.k_proj, module.v_proj, module.o_proj
    H, Hkv = q.out_features // K, k.out_features // K
    if q.out_features != H * K or k.out_features != Hkv * K or v.out_features != Hkv * K or o.in_features != H * K or H % Hkv:
        raise Unsupported("num_key_value_heads", Hkv, f"q_proj {q.out_features}, k_proj {k.out_features}, v_proj {v.out_features} "
                          f"and o_proj {o.in_features} channels are not heads (and kv heads dividing them) of width head_dim = {K}")
    has = {name: getattr(module, name).bias is not None for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    if len({has["q_proj"], has["k_proj"], has["v_proj"]}) > 1:
        raise Unsupported("attention_bias", {n: b for n, b in has.items() if n != "o_proj"},
                          "seqmix's W_qk = [q_proj; k_proj] and W_v have one switch, qkv_bias: q_proj, k_proj and v_proj "
                          "must all have a bias or none (o_proj's is out_bias, free)")
    scaling = float(module.scaling)
    scale = "sqrt" if math.isclose(scaling, K ** -0.5, rel_tol=1e-12) else scaling
    return dict(d_model=int(q.in_features), heads=H, kv_heads=Hkv, head_dim=K, qkv_bias=has["q_proj"], out_bias=has["o_proj"],
                scale=scale, rope=True, attn_dropout=attention_dropout(module))


#: transformers' rope_type -> the fields of seqmix's scaling of that type (seqmix.ops.rotary.ROPE_SCALINGS) read from
#: rope_parameters (or, where it is absent there, the config)
_SCALING_FIELDS = {
    "linear": ("factor",),
    "dynamic": ("factor", "max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim",
             "truncate"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("long_factor", "short_factor", "original_max_position_embeddings", "factor", "attention_factor"),
}


def rope_fields(cfg, module, head_dim: int, layer_type: str | None = None) -> dict:
    """softmax_attention's RoPE fields (rope_theta, rotary_dim, rope_scaling) from a transformers 5.x
    config's ``rope_parameters`` — one dict, or one per layer type (Gemma 3's local and global bases:
    the entry of ``layer_type``). rotary_dim = int(head_dim·partial_rotary_factor) (Phi, GPT-NeoX's
    rotary_pct); the scaled types become ``rope_scaling``; any other type is refused."""
    from ...ops import ROPE_SCALINGS, check_rope_scaling

    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    name = "rope_parameters"
    if rp and all(isinstance(v, dict) for v in rp.values()):
        if layer_type not in rp:
            raise Unsupported("rope_parameters", sorted(rp), f"per-layer-type RoPE parameters without an entry for this layer's "
                              f"type {layer_type!r}")
        rp, name = dict(rp[layer_type]), f"rope_parameters[{layer_type!r}]"
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type != "default" and rope_type not in ROPE_SCALINGS:
        raise Unsupported(f"{name}.rope_type", rope_type, f"seqmix's RoPE (ops.rotary) has the default frequencies and the "
                          f"scalings {sorted(ROPE_SCALINGS)}")
    theta = rp.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        raise Unsupported(f"{name}.rope_theta", None, "the config names no RoPE base")
    factor = float(rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None) or 1.0))
    R = int(head_dim * factor)
    if R <= 0 or R % 2:
        raise Unsupported("partial_rotary_factor", factor, f"rotates int(head_dim·factor) = {R} channels: seqmix's RoPE needs an "
                          "even number > 0")
    out = dict(rope=True, rope_theta=float(theta), rotary_dim=None if R == head_dim else R)
    if rope_type != "default":
        sc = {"type": rope_type}
        for k in _SCALING_FIELDS[rope_type]:
            v = rp.get(k, getattr(cfg, k, None))
            if k in ("long_factor", "short_factor") and v is not None:
                v = tuple(float(e) for e in v)
            elif k == "truncate":
                v = (cfg.rope_parameters or {}).get("truncate", True) if v is None else bool(v)
            elif v is not None:
                v = float(v)
            if v is not None:
                sc[k] = v
        if rope_type in ("yarn", "longrope") and sc.get("factor") is None:
            sc["factor"] = float(cfg.max_position_embeddings) / sc["original_max_position_embeddings"]
        try:
            check_rope_scaling(sc, R, where=name)
        except ValueError as e:
            raise Unsupported(name, rope_type, str(e)) from None
        out["rope_scaling"] = sc
    return out


def _heads(module, K: int, q_out: int, k_out: int, v_out: int, o_in: int) -> tuple[int, int]:
    """(heads, kv_heads) of projections of q_out, k_out, v_out outputs and an output projection of o_in inputs."""
    H, Hkv = q_out // K, k_out // K
    if q_out != H * K or k_out != Hkv * K or v_out != Hkv * K or o_in != H * K or H % Hkv:
        raise Unsupported("num_key_value_heads", Hkv, f"the q ({q_out}), k ({k_out}), v ({v_out}) and output ({o_in}) projections "
                          f"are not heads (and kv heads dividing them) of width head_dim = {K}")
    return H, Hkv


def _p(option: str, p) -> float:
    """A dropout probability (a float or an nn.Dropout's p) -> softmax_attention's field, in [0, 1)."""
    p = float(getattr(p, "p", p) or 0.0)
    if not 0 <= p < 1:
        raise Unsupported(option, p, "a dropout probability in [0, 1) (seqmix's attention keeps 1 - p of the entries)")
    return p


def attention_dropout(module) -> float:
    """The dropout transformers' attention module applies to its attention probabilities in training (its
    ``attention_dropout``: a float passed as the attention function's ``dropout``, or an nn.Dropout), read from
    the module (not the config, which may have been changed after the module was built): softmax_attention's
    ``attn_dropout``, applied at the same place (the matrix after the softmax), the identity in eval."""
    return _p("attention_dropout", getattr(module, "attention_dropout", 0.0))


def _scale(module, K: int):
    scaling = float(module.scaling)
    return "sqrt" if math.isclose(scaling, K ** -0.5, rel_tol=1e-12) else scaling


def _layer_type(cfg, module) -> str | None:
    types = getattr(cfg, "layer_types", None)
    idx = getattr(module, "layer_idx", None)
    return getattr(module, "layer_type", None) or (types[idx] if types is not None and idx is not None else None)


def _window(cfg, module) -> int | None:
    """The module's sliding window (its own ``sliding_window``: set on the sliding layers of Qwen2/3, Gemma 2/3,
    SmolLM3, GPT-OSS; Mistral's and Phi-3's every layer read ``config.sliding_window``)."""
    w = getattr(module, "sliding_window", None) if hasattr(module, "sliding_window") else getattr(cfg, "sliding_window", None)
    return None if w is None else int(w)


def attention_config(cfg, module) -> dict:
    """A transformers attention module with q_proj, k_proj, v_proj and o_proj (Llama, Qwen2, Qwen3, Mistral,
    Mixtral, GPT-OSS, Gemma 1-3, OLMo-2, SmolLM3, Granite, Qwen3-MoE) -> softmax_attention. Read from the module and
    the config: GQA sizes, the biases, the scale (Gemma 2/3's query_pre_attn_scalar, Granite's
    attention_multiplier), the sliding window of this layer, qk-norm (per head: Qwen3, Gemma 3; over the
    whole projection: OLMo-2), soft-capping (Gemma 2), sinks (GPT-OSS), RoPE with its scaling and this layer type's
    parameters, or none (SmolLM3's no-RoPE layers)."""
    out = _attention(cfg, module)
    K = out["head_dim"]
    w = _window(cfg, module)
    if w is not None:
        out["window"] = w
    q_norm = getattr(module, "q_norm", None)
    if q_norm is not None:
        width = int(q_norm.weight.shape[0])
        out["qk_norm"] = "head" if width == K else "full"
        eps = getattr(q_norm, "variance_epsilon", getattr(q_norm, "eps", None))
        out["qk_norm_eps"] = float(eps)
    cap = getattr(module, "attn_logit_softcapping", None)
    if cap is not None:
        out["softcap"] = float(cap)
    if getattr(module, "sinks", None) is not None:  # GPT-OSS: a learned logit per head in the softmax's normalizer
        out["sinks"] = True
    if getattr(module, "use_rope", True):
        out.update(rope_fields(cfg, module, K, _layer_type(cfg, module)))
    else:
        out["rope"] = False
    return out


def llama_attention_config(cfg, module) -> dict:
    """LlamaAttention -> softmax_attention: GQA, RoPE over the whole head (rotate_half pairs) with
    its scaling, attention_bias on all four projections."""
    return attention_config(cfg, module)


def phi_attention_config(cfg, module) -> dict:
    """PhiAttention (Phi-1, 1.5, 2) -> softmax_attention: biases on q, k, v and dense, partial rotary; with
    qk_layernorm a LayerNorm (weight and bias) on each head's q and k before RoPE (qk_norm "head", kind "layer")."""
    K = int(module.head_dim)
    H, Hkv = _heads(module, K, module.q_proj.out_features, module.k_proj.out_features, module.v_proj.out_features,
                    module.dense.in_features)
    has = {n: getattr(module, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "dense")}
    if len({has["q_proj"], has["k_proj"], has["v_proj"]}) > 1:
        raise Unsupported("bias", has, "q_proj, k_proj and v_proj must all have a bias or none (seqmix's qkv_bias)")
    out = dict(d_model=int(module.q_proj.in_features), heads=H, kv_heads=Hkv, head_dim=K, qkv_bias=has["q_proj"],
               out_bias=has["dense"], scale=_scale(module, K), attn_dropout=attention_dropout(module), **rope_fields(cfg, module, K))
    if getattr(module, "qk_layernorm", False):
        qn, kn = module.q_layernorm, module.k_layernorm
        for name, n in (("q_layernorm", qn), ("k_layernorm", kn)):
            if tuple(n.normalized_shape) != (K,) or n.weight is None or n.bias is None:
                raise Unsupported(name, n, f"seqmix's qk-norm of kind 'layer' normalizes each head's {K} channels with a "
                                  "weight and a bias")
        if qn.eps != kn.eps:
            raise Unsupported("layer_norm_eps", (qn.eps, kn.eps), "seqmix's q and k norms share one ε")
        out.update(qk_norm="head", qk_norm_kind="layer", qk_norm_eps=float(qn.eps))
    return out


def phi3_attention_config(cfg, module) -> dict:
    """Phi3Attention -> softmax_attention: one fused qkv_proj [q; k; v], no biases, RoPE (LongRoPE in the
    long-context models), config.sliding_window on every layer."""
    K = int(module.head_dim)
    Hkv = int(module.num_key_value_heads)
    H = (module.qkv_proj.out_features - 2 * Hkv * K) // K
    _heads(module, K, H * K, Hkv * K, Hkv * K, module.o_proj.in_features)
    if module.qkv_proj.bias is not None or module.o_proj.bias is not None:
        raise Unsupported("bias", True, "Phi3Attention's projections have no bias in transformers")
    out = dict(d_model=int(module.qkv_proj.in_features), heads=H, kv_heads=Hkv, head_dim=K, scale=_scale(module, K),
               attn_dropout=attention_dropout(module), **rope_fields(cfg, module, K))
    w = getattr(cfg, "sliding_window", None)
    if w is not None:
        out["window"] = int(w)
    return out


def phi3_attention_weights(module) -> tuple[Weight, ...]:
    """qkv_proj holds the rows [q (heads·K); k (kv_heads·K); v (kv_heads·K)]."""
    K, Hkv = int(module.head_dim), int(module.num_key_value_heads)
    nq = module.qkv_proj.out_features - 2 * Hkv * K
    return (
        Weight("qkv_proj.weight", "W_qk.weight", rows(0, nq + Hkv * K)),  # [q; k] = W_qk
        Weight("qkv_proj.weight", "W_v.weight", rows(nq + Hkv * K, nq + 2 * Hkv * K)),
        Weight("o_proj.weight", "W_o.weight"),
    )


def gpt_neox_attention_config(cfg, module) -> dict:
    """GPTNeoXAttention (Pythia) -> softmax_attention: one fused query_key_value holding [q | k | v] per head,
    biases (attention_bias), partial rotary (rotary_pct = partial_rotary_factor)."""
    K = int(module.head_size)
    d = int(module.query_key_value.in_features)
    H = int(cfg.num_attention_heads)
    _heads(module, K, H * K, H * K, H * K, module.dense.in_features)
    if module.query_key_value.out_features != 3 * H * K:
        raise Unsupported("num_attention_heads", H, f"query_key_value has {module.query_key_value.out_features} rows, not 3·heads·K")
    has_in, has_out = module.query_key_value.bias is not None, module.dense.bias is not None
    return dict(d_model=d, heads=H, head_dim=K, qkv_bias=has_in, out_bias=has_out, scale=_scale(module, K),
                attn_dropout=attention_dropout(module), **rope_fields(cfg, module, K))


def interleaved_qkv_weights(H: int, K: int) -> tuple[Weight, ...]:
    """A fused ``query_key_value`` (+ bias) whose rows are, per head h, [q_h (K) | k_h (K) | v_h (K)], and
    ``dense`` (+ bias): GPT-NeoX's and BLOOM's attention."""
    q, k, v = (_group_rows(H, (K, K, K), i, "query_key_value") for i in range(3))

    def bias(t):
        return Transform(f"{t} (bias)", lambda b: t(b[:, None]).flatten())

    return (
        Weight("query_key_value.weight", "W_qk.weight", q, part=0),
        Weight("query_key_value.weight", "W_qk.weight", k, part=1),
        Weight("query_key_value.weight", "W_v.weight", v),
        Weight("query_key_value.bias", "W_qk.bias", bias(q), part=0),
        Weight("query_key_value.bias", "W_qk.bias", bias(k), part=1),
        Weight("query_key_value.bias", "W_v.bias", bias(v)),
        Weight("dense.weight", "W_o.weight"),
        Weight("dense.bias", "W_o.bias"),
    )


def gpt_neox_attention_weights(module) -> tuple[Weight, ...]:
    """query_key_value's rows are, per head h, [q_h (K) | k_h (K) | v_h (K)]."""
    return interleaved_qkv_weights(int(module.config.num_attention_heads), int(module.head_size))



#: LlamaAttention / RecurrentGemmaAttention -> seqmix "softmax_attention"
ATTENTION_WEIGHTS = (
    Weight("q_proj.weight", "W_qk.weight", part=0),  # W_qk = [q_proj; k_proj] (rows: heads·K, then kv_heads·K)
    Weight("k_proj.weight", "W_qk.weight", part=1),
    Weight("q_proj.bias", "W_qk.bias", part=0),
    Weight("k_proj.bias", "W_qk.bias", part=1),
    Weight("v_proj.weight", "W_v.weight"),
    Weight("v_proj.bias", "W_v.bias"),
    Weight("o_proj.weight", "W_o.weight"),
    Weight("o_proj.bias", "W_o.bias"),
)

#: the keys and values live in the DynamicCache's attention layer (a DynamicLayer, or a
#: DynamicSlidingWindowLayer keeping the last window - 1 tokens, as seqmix's KVCache does):
#: seqmix's KVCache is kept there, the layer's keys / values are views of its buffers
ATTENTION_STATE = (State("kv", "kv"),)

SOFTMAX_DSF = ("map only (finite_state = False: Lemma 1's state is infinite): Φ[i, j] = softmax_j(s·q_iᵀk_j) over j <= i "
               "(and i - j < window), one map per query head (kv head h // (heads/kv_heads)), q and k rotated by RoPE at "
               "their absolute positions; dsf(x, taylor_order=P) is the degree-P Taylor approximation")

LLAMA = Family(
    "llama",
    (ModuleMap("transformers.models.llama.modeling_llama.LlamaAttention", "softmax_attention", llama_attention_config,
               ATTENTION_WEIGHTS, ATTENTION_STATE, returns_pair=True, mask="causal", positions=True, dsf=SOFTMAX_DSF),),
    slots=r"(^|\.)layers\.\d+\.self_attn$",
    description="Llama: LlamaAttention -> seqmix 'softmax_attention' (RoPE, GQA; the softmax baseline)",
)


def _group_rows(groups: int, sizes: tuple[int, ...], i: int, what: str) -> Transform:
    """Rows of a projection laid out per group g as [part 0 | part 1 | ...] (sizes rows each) ->
    part i of every group, groups in order (Qwen3-Next's in_proj_qkvz / in_proj_ba per key head,
    MiniMax's qkv_proj per head)."""
    off, n = sum(sizes[:i]), sizes[i]
    return Transform(f"{what}: view({groups}, {sum(sizes)}, d)[:, {off}:{off + n}]",
                     lambda t: t.reshape(groups, sum(sizes), t.shape[-1])[:, off:off + n].reshape(groups * n, t.shape[-1]))


def plus_one() -> Transform:
    """A zero-centred norm weight (x·(1 + w): Qwen3-Next's RMSNorm) -> seqmix's plain weight 1 + w."""
    return Transform("1 + w", lambda t: 1 + t)


def gpt2_attention_config(cfg, module) -> dict:
    """GPT2Attention -> softmax_attention: Conv1D weights (x W, W [in, out]), fused c_attn [q | k | v], biases,
    no RoPE (GPT-2's positions are learned embeddings added before the blocks, transformers' own), the scale
    1/sqrt(K) or 1 (scale_attn_weights), divided by layer + 1 (scale_attn_by_inverse_layer_idx)."""
    if getattr(module, "is_cross_attention", False):
        raise Unsupported("add_cross_attention", True, "a cross-attention layer reads another sequence: no causal mixer")
    K, H = int(module.head_dim), int(module.num_heads)
    d = int(module.embed_dim)
    _heads(module, K, H * K, H * K, H * K, module.c_proj.weight.shape[0])
    return dict(d_model=d, heads=H, head_dim=K, bias=True, scale=_scale(module, K), rope=False,
                attn_dropout=_p("attn_pdrop", module.attn_dropout), out_dropout=_p("resid_pdrop", module.resid_dropout))


def _conv1d_rows(start: int, stop: int) -> Transform:
    """A Conv1D weight [in, out] (y = x W) -> rows start:stop of the nn.Linear weight Wᵀ [out, in]."""
    return Transform(f"ᵀ[{start}:{stop}]", lambda t: t.t()[start:stop].contiguous())


def gpt2_attention_weights(module) -> tuple[Weight, ...]:
    d = int(module.embed_dim)
    return (
        Weight("c_attn.weight", "W_qk.weight", _conv1d_rows(0, 2 * d)),  # [q; k]
        Weight("c_attn.weight", "W_v.weight", _conv1d_rows(2 * d, 3 * d)),
        Weight("c_attn.bias", "W_qk.bias", rows(0, 2 * d)),
        Weight("c_attn.bias", "W_v.bias", rows(2 * d, 3 * d)),
        Weight("c_proj.weight", "W_o.weight", _conv1d_rows(0, d)),
        Weight("c_proj.bias", "W_o.bias"),
    )


def bloom_attention_config(cfg, module) -> dict:
    """BloomAttention -> softmax_attention: ALiBi (the paper's slopes, no RoPE), one fused query_key_value
    holding [q_h | k_h | v_h] per head, biases; the module adds the residual itself (``ModuleMap.residual``)."""
    H, K = int(module.num_heads), int(module.head_dim)
    d = int(module.hidden_size)
    _heads(module, K, H * K, H * K, H * K, module.dense.in_features)
    if not math.isclose(float(module.inv_norm_factor), K ** -0.5, rel_tol=1e-12) or float(module.beta) != 1.0:
        raise Unsupported("inv_norm_factor", float(module.inv_norm_factor), "seqmix's ALiBi adds the bias to 1/sqrt(K)·qᵀk")
    return dict(d_model=d, heads=H, head_dim=K, bias=True, scale="sqrt", rope=False, alibi=True,
                attn_dropout=_p("attention_dropout", module.attention_dropout), out_dropout=_p("hidden_dropout", module.hidden_dropout))


def bloom_attention_weights(module) -> tuple[Weight, ...]:
    """query_key_value's rows are, per head h, [q_h (K) | k_h (K) | v_h (K)] (as GPT-NeoX's)."""
    return interleaved_qkv_weights(int(module.num_heads), int(module.head_dim))


def mla_attention_config(cfg, module, *, rope: bool = True) -> dict:
    """DeepseekV3Attention (MLA) -> softmax_attention with kv_lora_rank: the latent c = RMSNorm(x W_kva[:r]) and the
    shared rotary key, cached as transformers caches them (the compressed pair); the low-rank query (q_lora_rank) or
    one q_proj; the scale qk_head_dim^(-1/2) times YaRN's mscale² (the module's own scaling). ``rope=False``: the
    "rotary" channels are not rotated (Kimi-Linear's MLA, NoPE)."""
    H, K, R = int(module.num_heads), int(module.qk_head_dim), int(module.qk_rope_head_dim)
    V, r = int(module.v_head_dim), int(module.kv_lora_rank)
    rq = module.q_lora_rank
    if int(getattr(module, "num_key_value_groups", 1)) != 1:
        raise Unsupported("num_key_value_heads", cfg.num_key_value_heads, "MLA's keys are per head (from the shared latent)")
    in_bias = module.kv_a_proj_with_mqa.bias is not None
    if rq is not None and (module.q_a_proj.bias is not None) != in_bias:
        raise Unsupported("attention_bias", "q_a_proj / kv_a_proj_with_mqa", "seqmix's qkv_bias is one switch for W_qa and W_kva")
    eps = {float(module.kv_a_layernorm.variance_epsilon)} | ({float(module.q_a_layernorm.variance_epsilon)} if rq else set())
    if len(eps) != 1:
        raise Unsupported("rms_norm_eps", sorted(eps), "seqmix's MLA norms share one ε (mla_norm_eps)")
    return dict(d_model=int(module.hidden_size), heads=H, head_dim=K, v_head_dim=V, kv_lora_rank=r,
                q_lora_rank=None if rq is None else int(rq), qk_rope_head_dim=R, qkv_bias=in_bias,
                out_bias=module.o_proj.bias is not None, scale=_scale(module, K), mla_norm_eps=eps.pop(),
                attn_dropout=attention_dropout(module), **(rope_fields(cfg, module, R) if rope else dict(rope=False)))


def kimi_mla_weights(module) -> tuple[Weight, ...]:
    return mla_attention_weights(module, rope=False)


def kimi_mla_config(cfg, module) -> dict:
    """KimiLinearAttention (MLA without positions: Kimi-Linear's KDA layers carry them) -> softmax_attention with
    kv_lora_rank and rope = False."""
    return mla_attention_config(cfg, module, rope=False)


def _pe_rows(heads: int, width: int, R: int, interleaved: bool, what: str) -> Transform:
    """Rows of a projection whose heads are [nope (width − R) | pe (R)]: with transformers' interleaved RoPE
    (DeepSeek's rope_interleave: pairs (2j, 2j + 1), results laid out as [evens | odds]) the pe rows are put in
    that order [0, 2, .., 1, 3, ..], so that seqmix's rotate-half RoPE gives the same channels."""
    if not interleaved:
        return Transform(what, lambda t: t)
    order = torch.cat([torch.arange(width - R), width - R + torch.cat([torch.arange(0, R, 2), torch.arange(1, R, 2)])])

    def fn(t):
        return t.reshape(heads, width, *t.shape[1:])[:, order].reshape(t.shape)

    return Transform(f"{what}: pe rows [evens | odds] per head", fn)


def mla_attention_weights(module, *, rope: bool = True) -> tuple[Weight, ...]:
    """q_proj or q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj (rope: the pe
    rows in the order of transformers' interleaved RoPE, DeepSeek's rope_interleave)."""
    H, K, R, r = int(module.num_heads), int(module.qk_head_dim), int(module.qk_rope_head_dim), int(module.kv_lora_rank)
    inter = rope and bool(getattr(module.config, "rope_interleave", False))
    return (
        Weight("q_proj.weight", "W_q.weight", _pe_rows(H, K, R, inter, "q_proj")),
        Weight("q_a_proj.weight", "W_qa.weight"),
        Weight("q_a_proj.bias", "W_qa.bias"),
        Weight("q_a_layernorm.weight", "q_a_norm.weight"),
        Weight("q_b_proj.weight", "W_qb.weight", _pe_rows(H, K, R, inter, "q_b_proj")),
        Weight("kv_a_proj_with_mqa.weight", "W_kva.weight", _pe_rows(1, r + R, R, inter, "kv_a_proj_with_mqa")),
        Weight("kv_a_proj_with_mqa.bias", "W_kva.bias", _pe_rows(1, r + R, R, inter, "kv_a_proj_with_mqa")),
        Weight("kv_a_layernorm.weight", "kv_a_norm.weight"),
        Weight("kv_b_proj.weight", "W_kvb.weight"),
        Weight("o_proj.weight", "W_o.weight"),
        Weight("o_proj.bias", "W_o.bias"),
    )


# ------------------------------------------------------------------------------------------
# the transformers people start from: one Family each, every attention layer -> softmax_attention
# ------------------------------------------------------------------------------------------

#: q_proj, k_proj, v_proj, o_proj (+ biases), qk-norm weights (plain: x·w) and sinks where the module has them
TRANSFORMER_WEIGHTS = ATTENTION_WEIGHTS + (
    Weight("q_norm.weight", "q_norm.weight"),
    Weight("k_norm.weight", "k_norm.weight"),
    Weight("sinks", "sinks"),
)

#: Gemma 3's qk-norm weights are zero-centred (x·(1 + w))
GEMMA3_WEIGHTS = ATTENTION_WEIGHTS + (
    Weight("q_norm.weight", "q_norm.weight", plus_one()),
    Weight("k_norm.weight", "k_norm.weight", plus_one()),
)

PHI_WEIGHTS = (
    Weight("q_proj.weight", "W_qk.weight", part=0),
    Weight("k_proj.weight", "W_qk.weight", part=1),
    Weight("q_proj.bias", "W_qk.bias", part=0),
    Weight("k_proj.bias", "W_qk.bias", part=1),
    Weight("v_proj.weight", "W_v.weight"),
    Weight("v_proj.bias", "W_v.bias"),
    Weight("dense.weight", "W_o.weight"),
    Weight("dense.bias", "W_o.bias"),
    Weight("q_layernorm.weight", "q_norm.weight"),  # qk_layernorm: a LayerNorm per head on q and on k
    Weight("q_layernorm.bias", "q_norm.bias"),
    Weight("k_layernorm.weight", "k_norm.weight"),
    Weight("k_layernorm.bias", "k_norm.bias"),
)

_SELF_ATTN = r"(^|\.)layers\.\d+\.self_attn$"


def _transformer(model_type: str, cls: str, description: str, *, config=attention_config, weights=TRANSFORMER_WEIGHTS,
                 dsf: str = "", package: str | None = None, slots: str = _SELF_ATTN, positions: bool = True) -> Family:
    """A family whose every sequence mixer is one attention class -> softmax_attention."""
    module = f"transformers.models.{package or model_type}.modeling_{package or model_type}.{cls}"
    return Family(model_type, (ModuleMap(module, "softmax_attention", config, weights, ATTENTION_STATE, returns_pair=True,
                                         mask="causal", positions=positions, dsf=SOFTMAX_DSF + (f"; {dsf}" if dsf else "")),),
                  slots=slots, description=description)


WINDOW_DSF = "a sliding window where the layer has one (Φ[i, j] = 0 for i - j >= window)"

QWEN2 = _transformer("qwen2", "Qwen2Attention", "Qwen2 / Qwen2.5: Qwen2Attention -> seqmix 'softmax_attention' (q/k/v biases, GQA, "
                     "sliding window on the layers layer_types marks)", dsf="biases on q, k, v; " + WINDOW_DSF)
QWEN3 = _transformer("qwen3", "Qwen3Attention", "Qwen3: Qwen3Attention -> seqmix 'softmax_attention' (qk-norm per head, GQA)",
                     dsf="q, k RMS-normalized per head before RoPE; " + WINDOW_DSF)
QWEN3_MOE = _transformer("qwen3_moe", "Qwen3MoeAttention", "Qwen3-MoE: Qwen3MoeAttention -> seqmix 'softmax_attention' (qk-norm "
                         "per head); the MoE stays transformers'", dsf="q, k RMS-normalized per head before RoPE")
MISTRAL = _transformer("mistral", "MistralAttention", "Mistral: MistralAttention -> seqmix 'softmax_attention' (GQA, "
                       "config.sliding_window on every layer)", dsf=WINDOW_DSF)
MIXTRAL = _transformer("mixtral", "MixtralAttention", "Mixtral: MixtralAttention -> seqmix 'softmax_attention' (GQA, sliding "
                       "window); the MoE stays transformers'", dsf=WINDOW_DSF)
GEMMA = _transformer("gemma", "GemmaAttention", "Gemma: GemmaAttention -> seqmix 'softmax_attention' (MQA / GQA, head_dim of its own)")
GEMMA2 = _transformer("gemma2", "Gemma2Attention", "Gemma 2: Gemma2Attention -> seqmix 'softmax_attention' (sliding and global "
                      "layers alternating, logit soft-capping, scale query_pre_attn_scalar^-1/2)",
                      dsf="scores soft-capped, c·tanh(s/c) (Φ's rows bounded: no key above e^{2c} times another); " + WINDOW_DSF)
GEMMA3 = _transformer("gemma3_text", "Gemma3Attention", "Gemma 3 (text): Gemma3Attention -> seqmix 'softmax_attention' (5:1 "
                      "local/global layers, qk-norm per head, a RoPE base per layer type)", weights=GEMMA3_WEIGHTS,
                      package="gemma3", dsf="q, k RMS-normalized per head (1 + w); " + WINDOW_DSF)
PHI3 = _transformer("phi3", "Phi3Attention", "Phi-3: Phi3Attention -> seqmix 'softmax_attention' (fused qkv_proj, LongRoPE)",
                    config=phi3_attention_config, weights=phi3_attention_weights)
PHI = _transformer("phi", "PhiAttention", "Phi-1 / 1.5 / 2: PhiAttention -> seqmix 'softmax_attention' (partial rotary, biases)",
                   config=phi_attention_config, weights=PHI_WEIGHTS,
                   dsf="RoPE on the first partial_rotary_factor of each head; qk_layernorm: a LayerNorm per head on q and k")
GPT_NEOX = _transformer("gpt_neox", "GPTNeoXAttention", "GPT-NeoX (Pythia): GPTNeoXAttention -> seqmix 'softmax_attention' (fused "
                        "per-head [q | k | v], rotary_pct, biases)", config=gpt_neox_attention_config,
                        weights=gpt_neox_attention_weights, slots=r"(^|\.)layers\.\d+\.attention$",
                        dsf="RoPE on the first rotary_pct of each head")
OLMO2 = _transformer("olmo2", "Olmo2Attention", "OLMo-2: Olmo2Attention -> seqmix 'softmax_attention' (qk-norm over the whole "
                     "projection)", dsf="q, k RMS-normalized over all heads at once before RoPE")
SMOLLM3 = _transformer("smollm3", "SmolLM3Attention", "SmolLM3: SmolLM3Attention -> seqmix 'softmax_attention' (no RoPE on the layers "
                       "no_rope_layers marks)", dsf="RoPE only where the layer uses it (NoPE layers: Φ from content alone)")
GRANITE = _transformer("granite", "GraniteAttention", "Granite: GraniteAttention -> seqmix 'softmax_attention' (scale "
                       "attention_multiplier)", dsf="scale attention_multiplier")
GPT_OSS = _transformer("gpt_oss", "GptOssAttention", "GPT-OSS: GptOssAttention -> seqmix 'softmax_attention' (learned sinks, "
                       "sliding and full layers alternating, biases, YaRN); the MoE stays transformers'",
                       dsf="a sink logit z_h per head in each row's normalizer, Φ[i, j] = e^{s_ij} / (e^{z_h} + Σ_l e^{s_il}) "
                           "(rows sum below 1: normalized attention's η added to the row sum); " + WINDOW_DSF)
GPT2 = _transformer("gpt2", "GPT2Attention", "GPT-2: GPT2Attention -> seqmix 'softmax_attention' (Conv1D weights, fused c_attn, "
                    "biases, no RoPE: learned absolute positions stay transformers')", config=gpt2_attention_config,
                    weights=gpt2_attention_weights, slots=r"(^|\.)h\.\d+\.attn$", positions=False,
                    dsf="no RoPE: Φ from content (and the learned position embeddings added to the input)")
BLOOM = Family(
    "bloom",
    (ModuleMap("transformers.models.bloom.modeling_bloom.BloomAttention", "softmax_attention", bloom_attention_config,
               bloom_attention_weights, ATTENTION_STATE, returns_pair=True, mask="causal", residual=True, derived_args=("alibi",),
               dsf=SOFTMAX_DSF.replace(", q and k rotated by RoPE at their absolute positions", "") + "; ALiBi: Φ[i, j] ∝ "
                   "e^{s·q_iᵀk_j} e^{−m_h (i − j)}, a fixed per-head decay on the map before the normalization (FoX's forget gate "
                   "with the constant log f = −m_h)"),),
    slots=r"(^|\.)h\.\d+\.self_attention$",
    description="BLOOM: BloomAttention -> seqmix 'softmax_attention' (ALiBi, fused per-head qkv, biases; the residual added "
                "in the module as in transformers)",
)
DEEPSEEK_V3 = _transformer("deepseek_v3", "DeepseekV3Attention", "DeepSeek-V3: DeepseekV3Attention (MLA) -> seqmix "
                           "'softmax_attention' with kv_lora_rank (the latent and the shared rotary key cached, as transformers "
                           "caches them); the MoE stays transformers'", config=mla_attention_config, weights=mla_attention_weights,
                           dsf="MLA: q^hᵀk_j^h = (W_kb^hᵀ q_nope^h)ᵀ c_j + q_pe^hᵀ k_pe,j, a softmax over a rank-(r + R) key space "
                               "shared by the heads (the cached latent c and the rotary key)")

TRANSFORMERS = (LLAMA, QWEN2, QWEN3, MISTRAL, GEMMA, GEMMA2, GEMMA3, PHI3, PHI, GPT_NEOX, OLMO2, SMOLLM3, GRANITE, MIXTRAL,
                QWEN3_MOE, GPT_OSS, GPT2, BLOOM, DEEPSEEK_V3)
