"""The transformers: attention-only families whose every attention layer becomes seqmix's one
``softmax_attention`` (one :class:`~seqmix.interop.table.Family` entry each), and the attention
helpers the hybrid families share (RoPE parameters, sizes, the weight and state tables).

transformers' module classes read here (5.x): ``LlamaAttention`` (llama).
"""

from __future__ import annotations

import math

import torch

from ..table import Family, ModuleMap, State, Transform, Unsupported, Weight


# ------------------------------------------------------------------------------------------
# softmax attention -> seqmix "softmax_attention": Llama (the softmax baseline) and
# RecurrentGemma's local attention; RecurrentGemma's recurrent block -> "rg_lru_block"
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
    p = float(getattr(module, "attention_dropout", 0.0) or 0.0)
    if p > 0:
        raise Unsupported("attention_dropout", p, "seqmix's softmax attention has no dropout on the attention weights (it acts "
                          "in training only: set it to 0.0 to convert)")
    scaling = float(module.scaling)
    scale = "sqrt" if math.isclose(scaling, K ** -0.5, rel_tol=1e-12) else scaling
    return dict(d_model=int(q.in_features), heads=H, kv_heads=Hkv, head_dim=K, qkv_bias=has["q_proj"], out_bias=has["o_proj"],
                scale=scale, rope=True)


def llama_attention_config(cfg, module) -> dict:
    """LlamaAttention -> softmax_attention: GQA, RoPE over the whole head (rotate_half pairs),
    attention_bias on all four projections."""
    _, theta = _rope(cfg)
    return dict(_attention(cfg, module), rope_theta=theta)



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



TRANSFORMERS = (LLAMA,)
