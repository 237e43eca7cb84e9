"""The attention family in the DSF (DSF paper §2.1, §3.2, §4.1-4.2; Appendix B, C, G, H).

Two mechanisms share one parametrization, the DSF paper's experimental one (dsf note
§5.1): a single projection W_qk: d -> 2n (n = the state expansion = the width of q and k
over all heads, default d), W_v: d -> d and an output projection W_o: d -> d, split into
``heads`` heads (q_i^h, k_i^h ∈ R^{n/heads}, v_i^h ∈ R^{d/heads}).

softmax attention (eq. 2), ``softmax_attention``::

    y_i = Σ_{j<=i, i-j<w} softmax_j(s · q_iᵀ k_j) v_j

    one call into ``seqmix.ops.softmax_attention`` (SDPA, or the explicit masked matrix),
    optional sliding window w, KV-cache decoding bounded by w (the preset
    ``sliding_window_attention``: w = 64). Its DSF has an infinite state (Lemma 1);
    ``dsf(x, taylor_order=P)`` returns the degree-P Taylor-feature separable attention
    instead, which converges to it as P grows.

separable attention (eq. 13-15, the corrected 15b of Appendix B), ``separable_attention``::

    y_i = Σ_{j<=i} φ(q_i)ᵀ ψ(k_j) / η_i · v_j                                        (14)
    Λ_i = (η_{i-1}/η_i) I,  B_i = (1/η_i) I_V ⊗ ψ(k_i),  C_i = I_V ⊗ φ(q_i)ᵀ,  D_i = 0   (15)

    one call into ``seqmix.ops.linear_recurrence`` with q = φ(q), k = ψ(k). The
    normalizer η is chosen by name:

    none         η_i = 1
    row_sum      η_i = φ(q_i)ᵀ Σ_{j<=i} ψ(k_j)          (eq. 16, A4 fixed; Lemma 1's η)
    abs_row_sum  η_i = 1 + |φ(q_i)ᵀ Σ_{j<=i} ψ(k_j)|    (a nonlinear η(q_i, k_{0..i}) of eq. 17, > 0 for any φ, ψ)
    exp          η_i = exp(w_η·u_i + b_η)               (eq. 22, normalized attention)
    softplus     η_i = softplus(w_η·u_i + b_η)          (eq. 29, Appendix H)
    sigmoid      η_i = σ(w_η·u_i + b_η)                 (eq. 30, Appendix H)

    The row-sum normalizers run through the same recurrence as the numerator (the
    values get a column of ones, so the state's last column is Σ_{j<=i} ψ(k_j)); the
    input normalizers use one η per head, W_η: d -> heads with a bias as in the
    released code (dsf note §3.6 [R]).

    Presets of the same class (``register_preset``, no copies):
    ``linear_attention``             φ = ψ = elu + 1, η = row_sum                       (eq. 16)
    ``generalized_linear_attention`` φ = ψ = identity, η = abs_row_sum                 (eq. 17)
    ``normalized_attention``         φ = ψ = identity, η = exp(W_η u + b), per head    (eq. 22)
    ``based``                        φ = ψ = Taylor degree 2 of exp(qᵀk/√K), symmetric basis, η = row_sum  (Based)
    ``rebased``                      φ = ψ = (γ ⊙ LN(·) + β)^{⊗2}/√K, symmetric basis, η = row_sum        (ReBased)

    Multi-head separable attention (Appendix G, eq. 28) is the ``heads`` option: each
    head has its own η, so Λ_i holds ``heads`` distinct scalars and the DSF is
    block-diagonal over heads (one block of N/heads states per head, ambiguity A6: n is
    the total q/k width, n/heads per head). The paper assumes no output projection
    there; ``output_projection=False`` drops W_o.

Choices where the papers differ (documented config options):

* scale (dsf note §1): the DSF paper drops 1/sqrt(d_k), the released code keeps it for
  softmax. ``scale`` = "sqrt" (1/sqrt(n/heads)), "none" (1) or a number; it multiplies q
  before the feature map. Default: "sqrt" for softmax attention (the released code and
  SDPA), "none" for separable attention (the paper and the released linear/normalized
  attention).
* Taylor features are Kronecker powers with coefficients 1/sqrt(p!) (dsf note §3.5,
  ambiguity A5), see ``seqmix.ops.features``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..dsf import DSF
from ..ops import (
    KVCache, alibi_slopes, attention_decode, attention_probs, check_rope_scaling, linear_recurrence,
    recurrence_map, repeat_kv, rotary,
    softmax_attention,
)
from ..ops.precision import compute_dtype, linear_f32, upcast
from ..ops.forgetting import forgetting_attention, forgetting_decode, forgetting_keys, forgetting_probs
from ..ops.path import path_attention, path_probs, path_scores
from ..ops.stickbreaking import stickbreaking_attention, stickbreaking_probs
from ..ops.moba import moba_attention, moba_probs
from ..ops.nsa import nsa_attention, nsa_probs
from ..ops.deltaformer import deltaformer_attention, deltaformer_probs
from ..ops.parallax import parallax_attention, parallax_probs
from ..ops.wall import wall_attention, wall_probs
from ..ops.features import (
    FEATURE_MAPS, LEARNED_FEATURE_MAPS, POSITIVE_FEATURE_MAPS, apply_feature_map, feature_dim, hedgehog_features, taylor_feature_dim,
)
from .base import MixerConfig, Mixer, MixOut, register, register_preset
from .layers import LayerNorm, RMSNorm, ShortConv, check_rope_fields, project, rms_norm, rope_rotate

FeatureMap = Literal["identity", "elu1", "relu", "exp", "taylor", "square", "hedgehog"]
Normalizer = Literal["none", "row_sum", "abs_row_sum", "exp", "softplus", "sigmoid"]
assert set(FeatureMap.__args__) == set(FEATURE_MAPS) | set(LEARNED_FEATURE_MAPS)

#: normalizers computed from the row sum s_i = φ(q_i)ᵀ Σ_{j<=i} ψ(k_j) (a ones column in the recurrence)
ROW_SUM_NORMALIZERS = ("row_sum", "abs_row_sum")
#: normalizers computed from the current input, η_i = f(W_η u_i + b_η), one per head (eq. 22, 29, 30)
INPUT_NORMALIZERS = ("exp", "softplus", "sigmoid")
NORMALIZERS = ("none",) + ROW_SUM_NORMALIZERS + INPUT_NORMALIZERS

#: the largest Taylor DSF / state seqmix builds before refusing (bytes); see SoftmaxAttention.dsf
DSF_MAX_BYTES = 2 * 2**30
#: the largest recurrent state per sequence of a separable mixer (floats)
MAX_STATE_FLOATS = 2**27


def eta_from(normalizer: str, *, s: torch.Tensor | None = None, z: torch.Tensor | None = None) -> torch.Tensor | None:
    """The normalizer η_i from the row sum s_i (row-sum normalizers) or from z_i = W_η u_i + b_η
    (input normalizers); None for "none". Shapes are kept."""
    if normalizer == "row_sum":
        return s
    if normalizer == "abs_row_sum":
        return 1 + s.abs()
    if normalizer == "exp":
        return z.exp()
    if normalizer == "softplus":
        return F.softplus(z)
    if normalizer == "sigmoid":
        return torch.sigmoid(z)
    return None


def _bytes(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


# ------------------------------------------------------------------------------------------
# the shared parametrization
# ------------------------------------------------------------------------------------------


class AttentionConfig(MixerConfig):
    n: int | None = Field(None, gt=0, description="state expansion: width of q and k over all heads (default d_model)")
    heads: int = Field(1, gt=0, description="number of heads; each has its own normalizer (Appendix G)")
    bias: bool = Field(False, description="biases in W_qk, W_v, W_o")
    qkv_bias: bool | None = Field(None, description="biases in W_qk and W_v (Qwen2 has them, without one in W_o); None = bias")
    out_bias: bool | None = Field(None, description="a bias in W_o (RecurrentGemma's o_proj has one); None = bias")
    scale: float | Literal["sqrt", "none"] = Field(
        "none", description="multiplies q before the feature map: 'sqrt' = 1/sqrt(n/heads), 'none' = 1, or a number > 0"
    )
    output_projection: bool = Field(True, description="apply W_o after mixing (Appendix G assumes none)")

    @model_validator(mode="after")
    def _sizes(self):
        n = self.n or self.d_model
        if n % self.heads:
            raise ValueError(f"n = {n} must be divisible by heads = {self.heads}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model = {self.d_model} must be divisible by heads = {self.heads}")
        if not isinstance(self.scale, str) and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be 'sqrt', 'none' or a finite number > 0, got {self.scale!r}")
        return self


class _Attention(Mixer):
    """q, k, v from x (W_qk: d -> 2n, W_v: d -> d) and the readout W_o, shared by the family."""

    family = "attention"
    map_unit = "head"

    def _rotate(self, start: int, *ts, rotary_dim: int | None = None, interleaved: bool = False):
        """Each of ts [B, T, H, K] rotated by RoPE (config.rope_theta and config.rope_scaling; the first ``rotary_dim``
        channels, default K) at the absolute positions start .. start + T − 1, one cos / sin for all
        (:func:`~seqmix.mixers.layers.rope_rotate`): the rotary positions of the attentions with a ``rope`` option."""
        c = self.config
        # c.__dict__: a config without the field (pydantic's __getattr__ breaks torch.compile's graph)
        return rope_rotate(self, c.rope_theta, start, *ts, scaling=c.__dict__.get("rope_scaling"), rotary_dim=rotary_dim,
                           interleaved=interleaved)

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        # heads of q; heads of k and v (grouped: softmax attention's kv_heads); K: width of q^h, k^h; V: width of v^h
        self.heads, self.kv_heads, self.head_qk, self.head_v = self._sizes(c)
        self.n = self.heads * self.head_qk
        qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
        out_bias = c.bias if c.out_bias is None else c.out_bias
        self.W_qk = nn.Linear(c.d_model, (self.heads + self.kv_heads) * self.head_qk, bias=qkv_bias)
        self.W_v = nn.Linear(c.d_model, self.kv_heads * self.head_v, bias=qkv_bias)
        d_out = getattr(c, "d_out", None) or c.d_model  # (softmax attention's d_out: Zamba2's shared block)
        self.W_o = nn.Linear(self.heads * self.head_v, d_out, bias=out_bias) if c.output_projection else nn.Identity()
        self.has_bias = qkv_bias or (out_bias and c.output_projection)

    @staticmethod
    def _sizes(c) -> tuple[int, int, int, int]:
        """(heads, kv_heads, K, V) of a config."""
        n = c.n or c.d_model
        return c.heads, c.heads, n // c.heads, c.d_model // c.heads

    @property
    def qk_scale(self) -> float:
        s = self.config.scale
        return 1.0 / math.sqrt(self.head_qk) if s == "sqrt" else 1.0 if s == "none" else float(s)

    def _qkv(self, x, *, qk_f32: bool = False, scaled: bool = True):
        """q (scaled unless ``scaled=False``), k: [B, T, H, K]; v: [B, T, H, V]. ``qk_f32``: q and k in
        float32 or wider under autocast and with half parameters (docs/scale.md)."""
        B, T, _ = x.shape
        q, k = (linear_f32(self.W_qk, x) if qk_f32 else project(self.W_qk, x)).split([self.n, self.kv_heads * self.head_qk], dim=-1)
        q = q.view(B, T, self.heads, self.head_qk)
        if scaled and self.qk_scale != 1.0:
            q = q * self.qk_scale
        return q, k.view(B, T, self.heads, self.head_qk), project(self.W_v, x).view(B, T, self.heads, self.head_v)

    def _readout(self, o):
        return project(self.W_o, o.flatten(2))

    def _output_gate(self):
        """W_g of the output gate σ(W_g x) ⊙ o (heads·V outputs, the q/k/v projections' bias), or None
        without ``output_gate``."""
        c = self.config
        qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
        return nn.Linear(c.d_model, self.heads * self.head_v, bias=qkv_bias) if c.output_gate else None

    def _gate(self, o, x):
        """σ(W_g x) ⊙ o with the output gate, o [B, T, heads, V]; o without."""
        return o if self.W_g is None else o * torch.sigmoid(project(self.W_g, x)).view(o.shape).to(o.dtype)

    def _cached_tokens(self, seq_len: int | None) -> int:
        """Tokens a KV cache holds after ``seq_len`` (min(seq_len, window − 1); window − 1 for None)."""
        w = self.config.window
        if seq_len is None:
            if w is None:
                raise ValueError(f"{type(self).__name__}.state_size: without a window the KV cache grows with the context; pass 'seq_len'")
            return w - 1
        return seq_len if w is None else min(seq_len, w - 1)

    def state_size(self, seq_len: int | None = None) -> int:
        """A cache of every key and value (or u) so far: heads·(K + V)·seq_len floats (the attentions
        that cache something else override this)."""
        if seq_len is None:
            raise ValueError(f"{type(self).__name__}.state_size: the cache grows with the context (every key and value); pass 'seq_len'")
        return self.heads * (self.head_qk + self.head_v) * seq_len

    def _compose(self, system: DSF, projections: bool) -> DSF:
        """With projections, the DSF's input is x and its output y (W_v and W_o absorbed; with
        grouped kv heads, W_v's rows repeated for every query head that reads them)."""
        if not projections:
            return system
        if self.has_bias:
            raise ValueError(f"{type(self).__name__}.dsf: projections=True needs bias=False, qkv_bias and out_bias False (a bias is not linear)")
        out = self.W_o.weight if self.config.output_projection else None
        W_v = self.W_v.weight.view(self.kv_heads, self.head_v, -1)
        W_v = repeat_kv(W_v, self.heads // self.kv_heads, dim=0).reshape(self.heads * self.head_v, -1)
        return system.compose(in_proj=W_v, out_proj=out)


# ------------------------------------------------------------------------------------------
# separable attention: linear, generalized linear, normalized, multi-head
# ------------------------------------------------------------------------------------------


def _per_head(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x W_h + b_h per head h: x [B, T, H, K], W [H, K, F], b [H, F] -> [B, T, H, F] (Hedgehog's learnt map), one
    batched matmul over the heads (the einsum "bthk,hkf->bthf" without its parsing)."""
    if W.dtype != x.dtype or b.dtype != x.dtype:
        W, b = W.to(x.dtype), b.to(x.dtype)
    return torch.baddbmm(b.unsqueeze(1), x.flatten(0, 1).transpose(0, 1), W).transpose(0, 1).unflatten(0, x.shape[:2])


class SeparableAttentionConfig(AttentionConfig):
    feature_map: FeatureMap = Field("elu1", description="φ applied to the queries: " + ", ".join(FEATURE_MAPS) + "; 'hedgehog': "
                                    "Hedgehog's learnt map [softmax(qW+b), softmax(-qW-b)] per head, W at the identity (LoLCATs' φ; "
                                    "ψ then is a second learnt map of the same form)")
    key_feature_map: FeatureMap | None = Field(None, description="ψ applied to the keys (default: the same as φ)")
    taylor_order: int = Field(2, ge=0, description="degree P of the 'taylor' feature map (Lemma 1)")
    taylor_basis: Literal["kronecker", "symmetric"] = Field(
        "kronecker", description="how the 'taylor' features store x^{⊗p}: 'kronecker' (every ordered product) or 'symmetric' (each "
        "monomial once, x^α/sqrt(α!): the same kernel in Σ_p C(K+p-1, p) features, Based's 1 + K + K(K+1)/2; seqmix.ops.features)")
    feature_norm: Literal["none", "layernorm"] = Field(
        "none", description="'layernorm': q and k normalized over each head's K channels with a learned γ, β [K] shared by q, k and "
        "the heads, before the scale and the feature map (ReBased's learnable kernel: φ(γ ⊙ LN(q) + β))")
    normalizer: Normalizer = Field("row_sum", description="η: " + ", ".join(NORMALIZERS))
    eta_bias: bool = Field(True, description="bias b_η of W_η (input normalizers; the released code has one)")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")
    rope: bool = Field(False, description="RoPE (RoFormer) on q and k at their absolute positions before the feature maps, "
                       "as LoLCATs' linearized Llama layers do (Llama's rotate_half pairs; the state counts the positions)")
    rope_theta: float = Field(10000.0, gt=1, description="RoPE base (rope): pair j turns by p·rope_theta^(-2j/K)")
    rope_scaling: dict | None = Field(
        None, description="RoPE's frequency scaling (rope), softmax attention's field: a dict with 'type' in linear, dynamic, yarn, "
        "llama3, longrope and its fields (seqmix.ops.rotary), so a student takes a Llama-3.x teacher's RoPE; None = theta^(-2j/K)"
    )
    qk_norm: Literal["none", "head"] = Field(
        "none", description="'head': RMSNorm with a learned weight [K] (shared by the heads) over each head's q and k, before the "
        "scale and RoPE, as Qwen3's attention (softmax attention's qk_norm = 'head'); 'none': no norm"
    )
    qk_norm_eps: float = Field(1e-6, gt=0, description="ε of the qk-norm")

    @model_validator(mode="after")
    def _rope(self):
        check_rope_fields(self.rope, self.rope_scaling, (self.n or self.d_model) // self.heads, "rope")
        return self

    @model_validator(mode="after")
    def _features(self):
        phi, psi = self.feature_map, self.key_feature_map or self.feature_map
        if (phi == "hedgehog") != (psi == "hedgehog"):
            raise ValueError(f"feature_map and key_feature_map must both be 'hedgehog' or neither (φ(q)ᵀψ(k) needs equal widths), "
                             f"got {phi!r} and {psi!r}")
        if self.normalizer == "row_sum":
            positive = (phi in POSITIVE_FEATURE_MAPS + LEARNED_FEATURE_MAPS and psi in POSITIVE_FEATURE_MAPS + LEARNED_FEATURE_MAPS) or (
                phi == psi == "taylor" and self.taylor_order % 2 == 0
            ) or phi == psi == "square"  # (qᵀk)² >= 0
            if not positive:
                raise ValueError(
                    f"normalizer 'row_sum' needs φ(q)ᵀψ(k) > 0: feature_map and key_feature_map in {POSITIVE_FEATURE_MAPS}, "
                    f"or both 'taylor' with an even taylor_order, or both 'square'; got feature_map={phi!r}, key_feature_map={psi!r}, "
                    f"taylor_order={self.taylor_order} (use 'abs_row_sum' for signed features)"
                )
        for wide in ("taylor", "square"):
            if (phi == wide) != (psi == wide):
                raise ValueError(f"feature_map and key_feature_map must both be {wide!r} or neither (φ(q)ᵀψ(k) needs equal widths), "
                                 f"got {phi!r} and {psi!r}")
        if phi == "taylor":
            n, H = self.n or self.d_model, self.heads
            K, V = n // H, self.d_model // H
            floats = H * taylor_feature_dim(K, self.taylor_order, self.taylor_basis) * (V + 1)
            if floats > MAX_STATE_FLOATS:
                raise ValueError(
                    f"taylor_order = {self.taylor_order} is too large for memory: the state would hold {floats:.3g} floats "
                    f"per sequence ({_bytes(4 * floats)} in float32; limit {MAX_STATE_FLOATS:.3g} floats), "
                    f"{taylor_feature_dim(K, self.taylor_order, self.taylor_basis)} features per head for K = {K}"
                )
        return self


@register(
    "separable_attention",
    description="Separable attention φ(q)ᵀψ(k)/η (DSF eq. 13-15): feature maps, normalizer and heads by name",
    example={"feature_map": "taylor", "taylor_order": 2},
)
class SeparableAttention(_Attention):
    """Separable attention (DSF paper eq. 13-15, Appendix B; Appendix G for heads > 1).

    Maps of phi(x): one per head, [B, heads, T, T], Φ[i, j] = φ(q_i)ᵀψ(k_j)/η_i.
    State per sequence: S ∈ R^{n_φ × (V+1)} per head with a row-sum normalizer
    (numerator and Σψ(k)), n_φ × V otherwise; n_φ = the feature width per head
    (n/heads, or Σ_p (n/heads)^p for Taylor features).
    """

    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "n_φ·(d_model + heads) with a row-sum η, n_φ·d_model otherwise (n_φ = features per head)"
    Config = SeparableAttentionConfig

    def __init__(self, config: SeparableAttentionConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.phi_name = c.feature_map
        self.psi_name = c.key_feature_map or c.feature_map
        if self.phi_name == "hedgehog":  # Hedgehog / LoLCATs: a learnt map per head for q and for k, at the identity
            H, K = self.heads, self.head_qk
            eye = torch.eye(K).expand(H, K, K).clone()
            self.fm_q_weight, self.fm_k_weight = nn.Parameter(eye.clone()), nn.Parameter(eye.clone())
            self.fm_q_bias, self.fm_k_bias = nn.Parameter(torch.zeros(H, K)), nn.Parameter(torch.zeros(H, K))
            self.n_features = 2 * K
        else:
            self.n_features = feature_dim(self.phi_name, self.head_qk, c.taylor_order, c.taylor_basis)
        if c.feature_norm == "layernorm":  # ReBased: γ ⊙ LN(·) + β on q and k, one (γ, β) [K] for both and every head
            self.feature_gamma = nn.Parameter(torch.ones(self.head_qk))
            self.feature_beta = nn.Parameter(torch.zeros(self.head_qk))
        self.row_sum = c.normalizer in ROW_SUM_NORMALIZERS
        self.W_eta = nn.Linear(c.d_model, c.heads, bias=c.eta_bias) if c.normalizer in INPUT_NORMALIZERS else None
        self.q_norm = self.k_norm = None
        if c.qk_norm == "head":  # Qwen3's per-head RMSNorm of q and k (softmax attention's parameter names)
            self.q_norm = RMSNorm(self.head_qk, eps=c.qk_norm_eps)
            self.k_norm = RMSNorm(self.head_qk, eps=c.qk_norm_eps)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    def _rotated(self, x, start: int = 0):
        """q (scaled), k after the qk-norm, the feature norm and RoPE: [B, T, H, K]; v: [B, T, H, V]. ``start``: the
        absolute position of x's first token (RoPE)."""
        # a signed η = 1 + |φ(q)ᵀΣψ(k)| cancels: with q, k rounded to bf16 its error grows with T
        # (relative error 0.29 at T = 512), so q and k stay in float32 there (docs/scale.md)
        c = self.config
        norm = c.feature_norm == "layernorm"
        pre = norm or self.q_norm is not None  # the norms act before the scale (LN(s·q) = LN(q) would drop it)
        qk_f32 = c.normalizer == "abs_row_sum"
        if c.rope and not pre:  # q and k rotated as one tensor of 2·heads heads (one RoPE call), then q scaled
            B, T, _ = x.shape
            H, K = self.heads, self.head_qk
            qk = linear_f32(self.W_qk, x) if qk_f32 else project(self.W_qk, x)
            q, k = self._rotate(start, qk.view(B, T, H + self.kv_heads, K))[0].split([H, self.kv_heads], dim=2)
            if self.qk_scale != 1.0:
                q = q * self.qk_scale
            return q, k, project(self.W_v, x).view(B, T, H, self.head_v)
        q, k, v = self._qkv(x, qk_f32=qk_f32, scaled=not pre)
        if self.q_norm is not None:  # Qwen3: q_h ← RMSNorm(q_h)·γ_q, k alike, before RoPE
            q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
        if norm:
            q, k = (F.layer_norm(t, (self.head_qk,), self.feature_gamma.to(t.dtype), self.feature_beta.to(t.dtype)) for t in (q, k))
        if pre:
            q = q * self.qk_scale
        if c.rope:
            q, k = self._rotate(start, q, k)
        return q, k, v

    def _query_features(self, q):
        """φ(q) [B, T, H, n_φ] of the rotated q."""
        if self.phi_name == "hedgehog":  # φ(q) = [softmax(q W_h + b_h), softmax(-q W_h - b_h)] per head h
            return hedgehog_features(_per_head(q, self.fm_q_weight, self.fm_q_bias))
        return apply_feature_map(self.phi_name, q, self.config.taylor_order, self.config.taylor_basis)

    def _key_features(self, k):
        """ψ(k) [B, T, H, n_φ] of the rotated k."""
        if self.psi_name == "hedgehog":
            return hedgehog_features(_per_head(k, self.fm_k_weight, self.fm_k_bias))
        return apply_feature_map(self.psi_name, k, self.config.taylor_order, self.config.taylor_basis)

    def _qk_features(self, q, k):
        """(φ(q), ψ(k)) [B, T, H, n_φ] of the rotated q and k; Hedgehog's maps of one token (a decoding step: T = 1)
        as one batched map over 2·H heads (the weights packed once, a layer constant): the same numbers in one
        call of each op instead of two."""
        if self.phi_name != "hedgehog" or q.shape[1] != 1 or k.shape[1] != 1:
            return self._query_features(q), self._key_features(k)
        W, b = self.layer_constant("hedgehog maps", self._packed_maps, self.fm_q_weight, self.fm_k_weight, self.fm_q_bias,
                                   self.fm_k_bias)
        return hedgehog_features(_per_head(torch.cat([q, k], 2), W, b)).split(self.heads, dim=2)

    def _packed_maps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Hedgehog's weights of q and k as one map of 2·H heads: (W [2H, K, K], b [2H, K])."""
        return torch.cat([self.fm_q_weight, self.fm_k_weight]), torch.cat([self.fm_q_bias, self.fm_k_bias])

    def _features(self, x, start: int = 0):
        """φ(q), ψ(k): [B, T, H, n_φ]; v: [B, T, H, V]; z = W_η x: [B, T, H] or None. ``start``: the
        absolute position of x's first token (RoPE)."""
        q, k, v = self._rotated(x, start)
        z = self.W_eta(x) if self.W_eta is not None else None
        return *self._qk_features(q, k), v, z

    def separable_parts(self, x):
        """(φ(q) [B, T, H, n_φ], ψ(k) [B, T, H, n_φ], η [B, T, H]): the three parts of eq. (13)."""
        self.check_input(x)
        fq, fk, _, z = self._features(x)
        s = (fq * fk.cumsum(1)).sum(-1) if self.row_sum else None  # s_i = φ(q_i)ᵀ Σ_{j<=i} ψ(k_j)
        eta = eta_from(self.config.normalizer, s=s, z=z)
        return fq, fk, (eta if eta is not None else torch.ones_like(fq[..., 0]))

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        start = state.get("pos", 0) if state else 0  # tokens before x (RoPE's positions)
        fq, fk, v, z = self._features(x, start)
        v_in = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1) if self.row_sum else v  # last column: Σ ψ(k_j)
        o, S = linear_recurrence(
            fq, fk, v_in,
            initial_state=state["S"] if state else None,
            output_final_state=need_state,
            mode=mode,
            chunk_size=self.config.chunk_size,
            check_values=False,
        )
        if self.row_sum:
            o, s = o[..., :-1], o[..., -1:]
            o = o / eta_from(self.config.normalizer, s=s)
        elif z is not None:
            o = o / eta_from(self.config.normalizer, z=z).unsqueeze(-1)
        o = o.to(v.dtype)  # the projections' dtype (q, k may be wider: _features)
        new = ({"S": S, "pos": start + x.shape[1]} if self.config.rope else {"S": S}) if need_state else None
        return MixOut(self._readout(o), new, values=v, mixed=o)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, heads, T, T]: Φ[i, j] = φ(q_i)ᵀψ(k_j) / η_i for j <= i."""
        self.check_input(x)
        fq, fk, _, z = self._features(x)
        A = recurrence_map(fq, fk, check_values=False)  # φ(q_i)ᵀψ(k_j), causal
        if self.row_sum:
            return A / eta_from(self.config.normalizer, s=A.sum(-1, keepdim=True))
        if z is not None:
            return A / eta_from(self.config.normalizer, z=z).transpose(1, 2).unsqueeze(-1)
        return A

    def dsf(self, x, *, projections: bool = False):
        """DSF eq. (15) with the corrected (15b), block-diagonal over heads (eq. 28). Input: the
        values v ([B, T, d_model], heads concatenated); output: the normalized head outputs
        before W_o. With ``projections=True`` the input is x and the output y."""
        fq, fk, eta = self.separable_parts(x)
        return self._compose(DSF.from_separable(fq, fk, eta, value_dim=self.head_v), projections)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.heads * self.n_features * (self.head_v + (1 if self.row_sum else 0))


register_preset(
    "linear_attention", SeparableAttention,
    description="Linear attention (Katharopoulos et al.), φ = elu+1, DSF eq. 16",
    defaults={"feature_map": "elu1", "normalizer": "row_sum"},
)
register_preset(
    "generalized_linear_attention", SeparableAttention,
    description="Generalized linear attention: φ = ψ = id, nonlinear η = 1 + |qᵀΣk| (DSF eq. 17)",
    defaults={"feature_map": "identity", "normalizer": "abs_row_sum"},
)
register_preset(
    "normalized_attention", SeparableAttention,
    description="Normalized attention: φ = ψ = id, η = exp(W_η u + b) per head (DSF eq. 22; softplus/sigmoid eq. 29-30)",
    defaults={"feature_map": "identity", "normalizer": "exp", "eta_bias": True},
)
#: Based (Arora et al. 2024, "Simple linear attention language models balance the recall-throughput tradeoff"):
#: φ(q)ᵀφ(k) = 1 + s + s²/2 with s = qᵀk/sqrt(K), the second-order Taylor expansion of exp(s), its monomials stored
#: once (1 + K + K(K+1)/2 features per head), normalized by the row sum; by default one head of the paper's K = 16
#: (n = 16; with H heads set n = 16·H)
BASED = dict(feature_map="taylor", taylor_order=2, taylor_basis="symmetric", scale="sqrt", normalizer="row_sum", n=16, heads=1)
register_preset(
    "based", SeparableAttention,
    description="Based (Arora et al. 2024): 2nd-order Taylor feature map 1 + s + s²/2, s = qᵀk/√K, row-sum η (with SWA layers: pattern 'based')",
    defaults=BASED,
)
#: ReBased (Aksenov et al. 2024, "Linear Transformers with Learnable Kernel Functions are Better In-Context Models"):
#: φ(q)ᵀφ(k) = (q̃ᵀk̃)²/K with q̃ = γ ⊙ LN(q) + β (k̃ alike, the same γ, β), row-sum η; one head of K = 16 by default
REBASED = dict(feature_map="square", feature_norm="layernorm", scale="sqrt", normalizer="row_sum", n=16, heads=1)
register_preset(
    "rebased", SeparableAttention,
    description="ReBased (Aksenov et al. 2024): learnable quadratic kernel (γ ⊙ LN(q) + β)ᵀ(γ ⊙ LN(k) + β))²/K, row-sum η",
    defaults=REBASED,
)


# ------------------------------------------------------------------------------------------
# softmax attention
# ------------------------------------------------------------------------------------------


class SoftmaxAttentionConfig(AttentionConfig):
    """Softmax attention's config. Beyond the DSF paper's parametrization, the options that real
    pretrained models need (docs/attention.md, "Options of real models"), each off by
    default: grouped kv heads, a head width of its own, RoPE, qk-norm, an output gate, biases per
    projection and the scale."""

    scale: float | Literal["sqrt", "none"] = Field(
        "sqrt", description="multiplies qᵀk: 'sqrt' = 1/sqrt(K), K the head dim (released code, default), 'none' = 1 "
        "(the DSF paper), or a number > 0 (Gemma: query_pre_attn_scalar**-0.5)"
    )
    window: int | None = Field(None, ge=1, description="sliding window: each token sees its last `window` tokens (itself included); None = all")
    kv_heads: int | None = Field(
        None, gt=0, description="key/value heads, dividing heads (grouped-query attention, GQA: Ainslie et al. 2023; "
        "kv_heads = 1 is multi-query attention, MQA: Shazeer 2019): query head h reads kv head h // (heads / kv_heads) "
        "(transformers' repeat_kv) and the KV cache holds kv_heads heads per token. None = heads"
    )
    head_dim: int | None = Field(
        None, gt=0, description="width of every head's q, k and v (Llama's, Qwen3's head_dim); sets n = heads·head_dim "
        "and W_o: heads·head_dim -> d_model. None: n/heads for q, k and d_model/heads for v"
    )
    rope: bool = Field(
        False, description="rotary position embedding (RoFormer: Su et al. 2021) on q and k at their absolute positions, "
        "in every mode, in decoding (positions from the cache) and in phi(x); seqmix.ops.rotary"
    )
    rotary_dim: int | None = Field(
        None, gt=0, description="channels of each head that RoPE rotates, the first ones (even, <= the head dim): partial "
        "rotary as GPT-NeoX's rotary_pct, RecurrentGemma's partial_rotary_factor 0.5; None = the whole head"
    )
    rope_theta: float = Field(10000.0, gt=1, description="RoPE base: pair j turns by p·rope_theta^(-2j/rotary_dim) at position p")
    rope_interleaved: bool = Field(
        False, description="RoPE pairs channels (2j, 2j+1) (GPT-J, the RoFormer paper) instead of (j, j + R/2) "
        "(GPT-NeoX, Llama's rotate_half: the default)"
    )
    rope_scaling: dict | None = Field(
        None, description="RoPE's frequency scaling, a dict with 'type' in linear, dynamic, yarn, llama3, longrope and its "
        "fields (seqmix.ops.rotary: position interpolation, NTK, YaRN, Llama 3.1, LongRoPE); None = theta^(-2j/R)"
    )
    softcap: float | None = Field(
        None, gt=0, description="attention-logit soft-capping c (Gemma 2): scores c·tanh(s/c), bounded in (-c, c); None = none"
    )
    alibi: bool = Field(
        False, description="ALiBi (Press et al. 2022; BLOOM): scores s_ij - m_h (i - j), the fixed per-head decay "
        "e^{-m_h (i-j)} on the map, m the paper's geometric slopes (seqmix.ops.alibi_slopes); use with rope = False"
    )
    sinks: bool = Field(
        False, description="learned attention sinks (GPT-OSS): one logit z_h per head in every row's softmax normalizer, "
        "Φ[i, j] = e^{s_ij} / (e^{z_h} + Σ_l e^{s_il}); a parameter 'sinks' [heads]"
    )
    kv_lora_rank: int | None = Field(
        None, gt=0, description="multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi): keys and values from one latent "
        "c = RMSNorm(x W_kva) of this rank per token (W_kvb: c -> per head [k_nope | v]), a shared rotary key k_pe of "
        "qk_rope_head_dim channels; the KV cache holds (c, k_pe) only. head_dim = qk_nope + qk_rope; None = no MLA"
    )
    q_lora_rank: int | None = Field(
        None, gt=0, description="MLA's low-rank query q = W_qb RMSNorm(x W_qa) of this rank; None = one projection W_q"
    )
    qk_rope_head_dim: int | None = Field(
        None, gt=0, description="MLA: the rotated channels of each head, the last ones of q and k (k's shared by the heads)"
    )
    v_head_dim: int | None = Field(None, gt=0, description="MLA: the width of each head's value (None = head_dim)")
    mla_norm_eps: float = Field(1e-6, gt=0, description="ε of MLA's RMSNorms on the latents")
    qk_norm: Literal["none", "head", "full"] = Field(
        "none", description="RMSNorm with a learned weight on q and k, before RoPE (qk-norm: Dehghani et al. 2023, "
        "ViT-22B; OLMo-2; Qwen3): 'head' over each head's K channels, one weight [K] shared by the heads (Qwen3, Gemma 3); "
        "'full' over all heads' channels at once (OLMo-2)"
    )
    qk_norm_eps: float = Field(1e-6, gt=0, description="ε of the qk-norm")
    qk_norm_kind: Literal["rms", "layer"] = Field(
        "rms", description="the qk-norm's kind: 'rms' an RMSNorm with a weight (Qwen3, OLMo-2, Gemma 3), 'layer' a LayerNorm "
        "(mean removed) with a weight and a bias (Phi-1.5 / Phi-2's qk_layernorm)"
    )
    output_gate: bool = Field(
        False, description="y = W_o(σ(W_g x) ⊙ o): a sigmoid gate per head and channel on the attention output before W_o "
        "(gated attention: Qiu et al. 2025; Qwen3-Next). W_g: d_model -> heads·V, with a bias when qkv_bias"
    )
    attn_dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout on the attention probabilities in training (each entry of Φ zeroed with "
        "probability p, the others scaled by 1/(1 - p): GPT-2's attn_pdrop, the attention_dropout of transformers' "
        "attention modules); the identity in eval, in phi(x) and in dsf(x)"
    )
    out_dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout on the output y in training (after W_o: GPT-2's resid_pdrop, BLOOM's "
        "hidden_dropout inside its attention module); the identity in eval"
    )
    d_out: int | None = Field(
        None, gt=0, description="width of the output, W_o: heads·V -> d_out (Zamba2's shared attention reads [h; embeddings] "
        "of width 2·d and writes d: seqmix.interop); None = d_model. y is [batch, time, d_out]: such a mixer stands in for a "
        "module of that shape, not in a residual stream of width d_model"
    )

    @model_validator(mode="after")
    def _sizes(self):  # replaces AttentionConfig._sizes: head_dim frees d_model from heads
        H = self.heads
        if self.head_dim is not None and self.n is not None and self.n != H * self.head_dim:
            raise ValueError(f"head_dim = {self.head_dim} sets n = heads·head_dim = {H * self.head_dim}, but n = {self.n} is given: set one of them")
        n = self.n or (H * self.head_dim if self.head_dim else self.d_model)
        if n % H:
            raise ValueError(f"n = {n} must be divisible by heads = {H}")
        if self.head_dim is None and self.d_model % H:
            raise ValueError(f"d_model = {self.d_model} must be divisible by heads = {H} (or set head_dim)")
        if not isinstance(self.scale, str) and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be 'sqrt', 'none' or a finite number > 0, got {self.scale!r}")
        if self.kv_heads is not None and H % self.kv_heads:
            raise ValueError(f"kv_heads = {self.kv_heads} must divide heads = {H} (each kv head serves heads / kv_heads query heads)")
        K = n // H
        if self.rotary_dim is not None and not self.rope:
            raise ValueError(f"rotary_dim = {self.rotary_dim} is set but rope = False")
        mla = self.kv_lora_rank is not None
        if not mla and (self.q_lora_rank or self.qk_rope_head_dim or self.v_head_dim):
            raise ValueError("q_lora_rank, qk_rope_head_dim and v_head_dim are options of MLA: set kv_lora_rank")
        if mla:
            R = self.qk_rope_head_dim
            if self.head_dim is None or R is None or R % 2 or R >= self.head_dim:
                raise ValueError(f"kv_lora_rank (MLA) needs head_dim = qk_nope + qk_rope and an even qk_rope_head_dim < head_dim, got "
                                 f"head_dim = {self.head_dim}, qk_rope_head_dim = {R}")
            for name in ("kv_heads", "rotary_dim"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} = {getattr(self, name)} is not an option of MLA (every head reads the shared latent; "
                                     "RoPE turns the last qk_rope_head_dim channels)")
            if self.qk_norm != "none" or self.output_gate or self.d_out is not None or not self.output_projection:
                raise ValueError("kv_lora_rank (MLA) is not combined with qk_norm, output_gate, d_out or output_projection = False")
        if self.rope_scaling is not None:
            if not self.rope:
                raise ValueError(f"rope_scaling = {self.rope_scaling!r} is set but rope = False")
            check_rope_scaling(self.rope_scaling, self.qk_rope_head_dim if mla else (self.rotary_dim or K), where="rope_scaling")
        if self.rope:
            R = self.rotary_dim or K
            if R % 2 or R > K:
                raise ValueError(f"rotary_dim = {R} must be even and at most the head dim K = {K} (RoPE turns pairs of a head's channels)"
                                 + ("" if self.rotary_dim else "; rotary_dim defaults to the whole head"))
        V = self.head_dim or self.d_model // H
        if self.d_out is not None and not self.output_projection:
            raise ValueError(f"d_out = {self.d_out} needs output_projection = True (W_o maps the heads to d_out)")
        if not self.output_projection and H * V != self.d_model:
            raise ValueError(f"output_projection = False needs heads·V = {H}·{V} = d_model = {self.d_model} (no W_o to map it back)")
        return self


@register("softmax_attention", description="Causal softmax attention (SDPA + masked-matrix reference), sliding window, KV cache, RoPE, GQA")
class SoftmaxAttention(_Attention):
    """Multi-head causal softmax attention, DSF paper eq. (2), with an optional sliding window.

    Modes: "parallel" (the explicit masked matrix: the reference, and phi) and "sdpa"
    (torch scaled_dot_product_attention). Decoding appends to a KV cache (``Cache`` entry
    "kv": a :class:`~seqmix.ops.KVCache` in preallocated buffers, [B, L, kv_heads, ·]) that
    keeps every token, or the last window - 1 with a window. Maps of phi(x): the attention
    matrices, [B, heads, T, T] (one per query head, with grouped kv heads too).
    State per sequence: kv_heads·(K + V)·L floats for L cached tokens, L = seq_len or
    min(seq_len, window - 1): it grows with the context unless windowed.

    The options of real models (config fields, each with its paper; docs/attention.md)::

        [q | k] = W_qk x,  v = W_v x               q: heads, k and v: kv_heads heads (GQA / MQA)
        q, k    = RMSNorm(q), RMSNorm(k)           qk_norm ("head" or "full"; qk_norm_kind "layer": LayerNorm)
        q, k    = RoPE(q, p), RoPE(k, p)           rope, rotary_dim, rope_theta, rope_interleaved, rope_scaling (p: absolute position)
        s_ij    = cap(s · q_iᵀk_j) − m_h (i − j)   scale s, softcap (cap(z) = c·tanh(z/c)), alibi (slopes m)
        o       = drop(softmax(s + mask; sink z_h)) v   window; sinks (a logit z_h in each row's normalizer);
                                                   attn_dropout (drop: dropout in training, the identity in eval)
        y       = drop(W_o (σ(W_g x) ⊙ o))         output_gate; biases: qkv_bias, out_bias; out_dropout

    Multi-head latent attention (MLA; DeepSeek-V2/V3, Kimi), ``kv_lora_rank`` = r::

        c = RMSNorm(x W_kva[:r]),  k_pe = RoPE(x W_kva[r:])      the cached pair: r + R floats per token
        [k_nope^h | v^h] = W_kvb^h c,  k^h = [k_nope^h | k_pe]   q^h = [q_nope^h | RoPE(q_pe^h)], q = W_q x or W_qb RMSNorm(x W_qa)

    so q^hᵀk_j^h = (W_kb^hᵀ q_nope^h)ᵀ c_j + q_pe^hᵀ k_pe,j: Φ is a softmax over a rank-(r + R) key space
    shared by the heads (the latent), each head reading it through its own W_kb^h.

    In the DSF (docs/attention.md): soft-capping bounds the scores, so a row of Φ never puts more
    than e^{2c} times one key's weight on another; ALiBi multiplies Φ[i, j] by a fixed per-head decay
    e^{−m_h (i − j)} before the normalization (FoX's forget gate with a constant log f = −m_h: the
    scalar decay of a linear-attention DSF on the softmax map); a sink is a constant term e^{z_h} in
    the normalizer η_i = e^{z_h} + Σ_j e^{s_ij} (normalized attention's input-independent η added to
    the row sum), so Φ's rows sum to less than 1.

    finite_state = False: the DSF of softmax attention has an infinite state (Lemma 1);
    dsf(x, taylor_order=P) is the degree-P Taylor approximation.
    """

    modes = ("parallel", "sdpa")
    reference_mode = "parallel"
    state_formula = "kv_heads·(K + V)·L, L = min(seq_len, window - 1) cached tokens (grows with seq_len without a window)"
    finite_state = False
    Config = SoftmaxAttentionConfig

    def __init__(self, config: SoftmaxAttentionConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.q_norm = self.k_norm = None
        Norm = RMSNorm if c.qk_norm_kind == "rms" else LayerNorm
        if c.qk_norm == "head":
            self.q_norm = Norm(self.head_qk, eps=c.qk_norm_eps)
            self.k_norm = Norm(self.head_qk, eps=c.qk_norm_eps)
        elif c.qk_norm == "full":
            self.q_norm = Norm(self.heads * self.head_qk, eps=c.qk_norm_eps)
            self.k_norm = Norm(self.kv_heads * self.head_qk, eps=c.qk_norm_eps)
        self.W_g = self._output_gate()
        self.sinks = nn.Parameter(torch.zeros(self.heads)) if c.sinks else None
        self.mla = c.kv_lora_rank is not None
        if self.mla:  # the latent projections replace W_qk and W_v
            H, K, V, R, r = self.heads, self.head_qk, self.head_v, c.qk_rope_head_dim, c.kv_lora_rank
            qkv_bias = c.bias if c.qkv_bias is None else c.qkv_bias
            self.W_qk = self.W_v = None
            if c.q_lora_rank is None:
                self.W_q = nn.Linear(c.d_model, H * K, bias=False)
            else:
                self.W_qa = nn.Linear(c.d_model, c.q_lora_rank, bias=qkv_bias)
                self.q_a_norm = RMSNorm(c.q_lora_rank, eps=c.mla_norm_eps)
                self.W_qb = nn.Linear(c.q_lora_rank, H * K, bias=False)
            self.W_kva = nn.Linear(c.d_model, r + R, bias=qkv_bias)
            self.kv_a_norm = RMSNorm(r, eps=c.mla_norm_eps)
            self.W_kvb = nn.Linear(r, H * (K - R + V), bias=False)
            self.has_bias = qkv_bias or self.W_o.bias is not None
        if c.alibi:  # fixed, not trained: a buffer that follows the mixer's device
            self.register_buffer("alibi_slopes", alibi_slopes(self.heads), persistent=False)
        else:
            self.alibi_slopes = None

    def _score_options(self) -> dict:
        """softcap, alibi, sinks of ops.softmax_attention / attention_decode / attention_probs (the decoding step tests
        the same three attributes for None to skip this dict: a new score option goes into both)."""
        return dict(softcap=self.config.softcap, alibi=self.alibi_slopes, sinks=self.sinks)

    @staticmethod
    def _sizes(c) -> tuple[int, int, int, int]:
        n = c.n or (c.heads * c.head_dim if c.head_dim else c.d_model)
        return c.heads, c.kv_heads or c.heads, n // c.heads, c.v_head_dim or c.head_dim or c.d_model // c.heads

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2}

    # -- parametrization -------------------------------------------------------------------

    def _rope(self, start: int, *ts):
        """RoPE (with its scaling, rotary_dim and pairing) at positions start .. start + T - 1 on each of ts [B, T, H, ·]."""
        c = self.config  # (rope_rotate itself, not _rotate: one call fewer per decoding step)
        return rope_rotate(self, c.rope_theta, start, *ts, scaling=c.__dict__.get("rope_scaling"),
                           rotary_dim=None if self.mla else c.rotary_dim, interleaved=c.rope_interleaved)

    def _mla_qkv(self, x, start: int, scaled: bool = True):
        """MLA: q [B, T, heads, K] = [q_nope | RoPE(q_pe)] (scaled); the cached pair: the latent c = RMSNorm(x W_kva[:r])
        [B, T, 1, r] and the shared rotary key RoPE(x W_kva[r:]) [B, T, 1, R]."""
        c = self.config
        B, T, _ = x.shape
        H, K, R, r = self.heads, self.head_qk, c.qk_rope_head_dim, c.kv_lora_rank
        if c.q_lora_rank is None:
            q = self.W_q(x)
        else:
            qa = self.W_qa(x)
            q = self.W_qb(self.q_a_norm(qa).to(qa.dtype))
        q = q.view(B, T, H, K)
        lat, k_pe = self.W_kva(x).split([r, R], dim=-1)
        lat = self.kv_a_norm(lat).to(lat.dtype).view(B, T, 1, r)
        k_pe = k_pe.view(B, T, 1, R)
        if c.rope:
            q_pe, k_pe = self._rope(start, q[..., K - R:], k_pe)
            q = torch.cat([q[..., : K - R], q_pe], dim=-1)
        if scaled and self.qk_scale != 1.0:
            q = q * self.qk_scale
        return q, lat, k_pe

    def _mla_expand(self, lat, k_pe):
        """MLA's keys [B, L, heads, K] = [k_nope^h | k_pe] and values [B, L, heads, V] from the cached pair:
        [k_nope^h | v^h] = W_kvb^h c (every head reads the same rank-r latent)."""
        B, L = lat.shape[:2]
        H, K, V, R = self.heads, self.head_qk, self.head_v, self.config.qk_rope_head_dim
        kv = self.W_kvb(lat.view(B, L, -1)).view(B, L, H, K - R + V)
        k_nope, v = kv.split([K - R, V], dim=-1)
        return torch.cat([k_nope, k_pe.expand(B, L, H, R)], dim=-1), v

    def _mla_absorbed(self, q, lat, k_pe):
        """MLA's decoding read in the latent space (the absorbed form of DeepSeek-V2 §2.1.2): with W_kvb^h =
        [W_k^h; W_v^h], the score q_nope^h · (W_k^h c_l) + q_pe^h · k_pe_l = (W_k^hᵀ q_nope^h) · c_l + q_pe^h · k_pe_l
        and the output W_v^h Σ_l p_l c_l, so no cached latent is expanded to keys and values (O(L·r) per head
        instead of O(L·r·(K − R + V))). q [B, 1, heads, K] (unscaled); lat [B, 1, L, r], k_pe [B, 1, L, R] (the
        cache's head-first views). Returns o [B, heads, V]."""
        B, H, K, V, R = q.shape[0], self.heads, self.head_qk, self.head_v, self.config.qk_rope_head_dim
        W = self.W_kvb.weight.view(H, K - R + V, -1)  # per head [W_k^h; W_v^h], [K − R + V, r]: views, no copy
        q = q.view(B, H, K).transpose(0, 1)  # [H, B, K]
        q_lat = torch.bmm(q[..., :K - R], W[:, :K - R].to(q.dtype)).transpose(0, 1)  # [B, H, r]
        c, pe = lat[:, 0], k_pe[:, 0]  # [B, L, r], [B, L, R]
        scores = torch.baddbmm(torch.bmm(q_lat, c.transpose(1, 2)), q[..., K - R:].transpose(0, 1), pe.transpose(1, 2))
        p = torch.softmax(scores.mul_(self.qk_scale), dim=-1)  # [B, H, L]
        o_lat = torch.bmm(p, c).transpose(0, 1)  # [H, B, r]
        return torch.bmm(o_lat, W[:, K - R:].transpose(1, 2).to(q.dtype)).transpose(0, 1)  # [B, H, V]

    def _qk(self, x):
        """q [B, T, heads, K] and the keys every head reads [B, T, kv_heads (MLA: heads), K] (phi, the Taylor DSF)."""
        q, k, v = self._qkv(x)
        return (q, self._mla_expand(k, v)[0]) if self.mla else (q, k)

    def _qkv(self, x, *, start: int = 0, scaled: bool = True, own_keys: bool = False):
        """q [B, T, heads, K] (normed, rotated, scaled unless ``scaled=False``: the forward pass hands the scale
        to the attention op), k [B, T, kv_heads, K] (normed, rotated), v [B, T, kv_heads, V], for tokens at
        absolute positions start .. start + T - 1; MLA: (q, the latent c [B, T, 1, r], the rotary key k_pe
        [B, T, 1, R]), the pair its KV cache holds. ``own_keys``: k rotated as a tensor of its own, not a view of q
        and k rotated as one (a prefill's KV cache then keeps k as it is, without a copy: ``KVCache.append``)."""
        if self.mla:
            return self._mla_qkv(x, start, scaled)
        c = self.config
        B, T, _ = x.shape
        H, Hkv, K = self.heads, self.kv_heads, self.head_qk
        qk, v = project(self.W_qk, x), project(self.W_v, x).view(B, T, Hkv, self.head_v)
        packed_norm = c.qk_norm == "head" and c.qk_norm_kind == "rms" and self.q_norm.eps == self.k_norm.eps
        if c.rope and (c.qk_norm == "none" or packed_norm):  # q and k normed and rotated as one tensor of H + Hkv heads
            qk = qk.view(B, T, H + Hkv, K)
            if packed_norm:  # each head's row normed on its own: q_norm(q), k_norm(k) in one call, a weight row per head
                w = self.layer_constant("packed qk-norm weight", lambda: torch.cat(
                    [self.q_norm.weight.expand(H, K), self.k_norm.weight.expand(Hkv, K)]), self.q_norm.weight, self.k_norm.weight)
                qk = rms_norm(qk, w, self.q_norm.eps).to(qk.dtype)
            # (rope_rotate itself, as _rope calls it: a call fewer per decoding step)
            if own_keys:
                q, k = rope_rotate(self, c.rope_theta, start, qk[:, :, :H], qk[:, :, H:], scaling=c.__dict__.get("rope_scaling"),
                                   rotary_dim=c.rotary_dim, interleaved=c.rope_interleaved)
            else:
                qk = rope_rotate(self, c.rope_theta, start, qk, scaling=c.__dict__.get("rope_scaling"), rotary_dim=c.rotary_dim,
                                 interleaved=c.rope_interleaved)[0]
                q, k = qk[:, :, :H], qk[:, :, H:]
        else:
            q, k = qk.split_with_sizes([H * K, Hkv * K], dim=-1)
            if c.qk_norm == "full":
                q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
            q, k = q.view(B, T, H, K), k.view(B, T, Hkv, K)
            if c.qk_norm == "head":
                q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
            if c.rope:
                q, k = self._rope(start, q, k)
        if scaled and self.qk_scale != 1.0:
            q = q * self.qk_scale
        return q, k, v

    def _gated_readout(self, o, x):
        """W_o(σ(W_g x) ⊙ o), o [B, T, heads, V]."""
        return self._readout(self._gate(o, x))

    def _forward(self, x, *, state, mode, need_state):
        kv = state["kv"] if state else None
        if need_state and kv is None:
            kv = KVCache(window=self.config.window)
        # (a prefill into an empty cache without a window: k of its own, so that the cache keeps it without a copy)
        own = kv is not None and kv.k is None and x.shape[1] > 1 and self.config.window is None
        q, k, v = self._qkv(x, start=kv.seen if kv is not None else 0, scaled=False, own_keys=own)  # the op scales qᵀk
        if mode == "step" and kv is not None and self.mla and self.sinks is None and self.alibi_slopes is None \
                and self.config.softcap is None and q.dtype in (torch.float32, torch.float64):
            heads = kv.append_step(k, v)  # the latent c and the rotary key of the new token, in place
            if heads is not None:
                o = self._mla_absorbed(q, *heads).unsqueeze(1)
                return MixOut(self._gated_readout(o, x), {"kv": kv} if need_state else None,
                              values=lambda: self._mla_expand(k, v)[1], mixed=o)
        if mode == "step" and kv is not None and not self.mla:  # a decoding step: the token written into the cache in place
            heads = kv.append_step(k, v)
            if heads is not None:
                B, H = q.shape[0], self.heads
                # (the plain read without _score_options' dict where no score option is on: a call fewer per step)
                extras = {} if self.config.softcap is None and self.alibi_slopes is None and self.sinks is None else self._score_options()
                o = attention_decode(q.view(B, H, -1), *heads, scale=self.qk_scale, heads_first=True, **extras)  # [B, H, V]
                if self.W_g is None:
                    y = project(self.W_o, o.view(B, 1, -1))
                else:
                    y = self._gated_readout(o.view(B, 1, H, -1), x)
                return MixOut(y, {"kv": kv} if need_state else None,
                              values=lambda: repeat_kv(v, H // self.kv_heads), mixed=lambda: o.view(B, 1, H, -1))
        # (q, k, v made here from checked x: the cache and the op skip their argument checks)
        keys, vals = kv.append(k, v, check_shapes=False, take=True) if kv is not None else (k, v)  # every key the queries see
        if self.mla:  # the cache holds the latent pair: every head's keys and values from it
            keys, vals = self._mla_expand(keys, vals)
        p = self.config.attn_dropout if self.training else 0.0
        if mode == "step" and not p:
            o = attention_decode(q[:, 0], keys, vals, scale=self.qk_scale, **self._score_options()).unsqueeze(1)
        else:
            o = softmax_attention(q, keys, vals, scale=self.qk_scale, window=self.config.window, check_values=False,
                                  mode="auto" if mode == "step" else mode, dropout_p=p, check_shapes=False,
                                  **self._score_options())
        T = x.shape[1]
        values = (lambda: vals[:, -T:]) if self.mla else (lambda: repeat_kv(v, self.heads // self.kv_heads))  # the core's input per map
        y = self._gated_readout(o, x)
        if self.training and self.config.out_dropout:
            y = F.dropout(y, self.config.out_dropout)
        return MixOut(y, {"kv": kv} if need_state else None, values=values, mixed=o)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, heads, T, T]: the (windowed) causal softmax attention matrices (with RoPE, qk-norm,
        grouped kv heads as the forward pass computes them)."""
        self.check_input(x)
        q, k = self._qk(x)
        return attention_probs(q, k, scale=1.0, window=self.config.window, check_values=False, **self._score_options())

    def _check_taylor_order(self, taylor_order):
        if isinstance(taylor_order, bool) or not isinstance(taylor_order, int) or taylor_order < 0:
            raise ValueError(f"{type(self).__name__}.dsf: argument 'taylor_order' must be an integer >= 0, got {taylor_order!r}")

    def separable_parts(self, x, *, taylor_order: int = 2):
        """Lemma 1 truncated at degree P: (φ_P(q), φ_P(k), η) with φ_P = concat_p x^{⊗p}/sqrt(p!)
        (Kronecker features) and η_i = φ_P(q_i)ᵀ Σ_{j<=i} φ_P(k_j); shapes [B, T, H, Σ_p K^p] and [B, T, H]."""
        self.check_input(x)
        self._check_taylor_order(taylor_order)
        q, k = self._qk(x)
        k = repeat_kv(k, self.heads // k.shape[2])
        fq = apply_feature_map("taylor", q, taylor_order)
        fk = apply_feature_map("taylor", k, taylor_order)
        return fq, fk, (fq * fk.cumsum(1)).sum(-1)

    def taylor_dsf_bytes(self, batch: int, T: int, taylor_order: int) -> int:
        """Bytes of Λ, B, C (float64) of the degree-P Taylor DSF: N = heads·V·Σ_p K^p states,
        B and C of [batch, T, N, heads·V] each; the state grows combinatorially in P."""
        width = self.heads * self.head_v
        N = width * taylor_feature_dim(self.head_qk, taylor_order)
        return 8 * batch * T * N * (2 * width + 1)

    def dsf(self, x, *, taylor_order: int = 2, projections: bool = False, max_bytes: int = DSF_MAX_BYTES):
        """The DSF of the degree-P Taylor-feature separable attention of Lemma 1 (eq. 18, 25),
        whose map converges to the softmax map as P grows; state N = heads·V·Σ_{p<=P} K^p.

        Input: the values v per query head ([B, T, heads·V]); output: the Taylor attention's head
        outputs before W_o (``projections=True``: x -> y; not with an output gate, which is not
        linear in x). Raises ValueError naming 'taylor_order' when the system would exceed
        ``max_bytes``, and naming 'window' for a windowed mixer (a sliding window is not a
        separable attention)."""
        self.check_input(x)
        self._check_taylor_order(taylor_order)
        if self.config.window is not None:
            raise ValueError(f"{type(self).__name__}.dsf: the Taylor DSF is defined without a window; got window = {self.config.window}")
        for opt in ("softcap", "alibi", "sinks"):
            if getattr(self.config, opt):
                raise ValueError(f"{type(self).__name__}.dsf: the Taylor DSF is the plain softmax's; got {opt} = {getattr(self.config, opt)!r}")
        if projections and self.mla:
            raise ValueError(f"{type(self).__name__}.dsf: projections=True needs W_v (MLA's values come from the latent: kv_lora_rank "
                             f"= {self.config.kv_lora_rank})")
        if projections and self.W_g is not None:
            raise ValueError(f"{type(self).__name__}.dsf: projections=True needs output_gate = False (σ(W_g x) ⊙ o is not linear in x)")
        need = self.taylor_dsf_bytes(x.shape[0], x.shape[1], taylor_order)
        if need > max_bytes:
            raise ValueError(
                f"{type(self).__name__}.dsf: taylor_order = {taylor_order} is too large for memory: the DSF would need "
                f"{_bytes(need)} (N = {self.heads * self.head_v}·{taylor_feature_dim(self.head_qk, taylor_order)} states, "
                f"batch {x.shape[0]}, T {x.shape[1]}), more than max_bytes = {_bytes(max_bytes)}"
            )
        fq, fk, eta = self.separable_parts(x, taylor_order=taylor_order)
        return self._compose(DSF.from_separable(fq, fk, eta, value_dim=self.head_v), projections)

    def state_size(self, seq_len: int | None = None) -> int:
        if self.mla:  # the latent c and the shared rotary key per token
            return (self.config.kv_lora_rank + self.config.qk_rope_head_dim) * self._cached_tokens(seq_len)
        return self.kv_heads * (self.head_qk + self.head_v) * self._cached_tokens(seq_len)


#: sliding-window attention (Beltagy et al. 2020, Longformer §3.1; Mistral 7B's sliding_window): softmax over each token's
#: last w tokens, itself included. Its own name, so that seqmix.linearize tells it (a student: the teacher's attention cut
#: to a window, the control of the window + linear hybrids) from a kept teacher layer (``softmax_attention``)
SLIDING_WINDOW = dict(window=64)
register_preset(
    "sliding_window_attention", SoftmaxAttention,
    description="Sliding-window softmax attention (Longformer, Mistral): each token's last w = 64 tokens, a KV cache of w − 1",
    defaults=SLIDING_WINDOW,
    example={"window": 5},
)


# ------------------------------------------------------------------------------------------
# gated and position-encoding variants of softmax attention: FoX, stick-breaking, PaTH
# ------------------------------------------------------------------------------------------


def _heads_rms(x, norm):
    """A per-head RMSNorm (``RMSNorm(H·K, groups=H)``: a weight per head and channel) on [B, T, H, K]."""
    return norm(x.flatten(2)).view(x.shape).to(x.dtype)


class FoxConfig(AttentionConfig):
    """The Forgetting Transformer's attention (Lin et al. 2025). Defaults: the paper's FoX
    (LLaMA) layer, a forget gate and nothing else (no RoPE). The "Pro" block is
    qk_norm = k_shift = v_shift = output_gate = output_norm = True."""

    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies qᵀk (not the forget bias): 'sqrt' = 1/sqrt(K) (the paper), 'none' = 1, or a number > 0")
    forget_bias: bool = Field(True, description="a bias b_f in the forget gate f_t = σ(w_fᵀx_t + b_f) (the paper's 'full' gate has one)")
    window: int | None = Field(None, ge=1, description="sliding window (tokens seen, itself included); None = all (the paper)")
    rope: bool = Field(False, description="RoPE on q and k (the paper: off, the forget gate encodes position)")
    rope_theta: float = Field(10000.0, gt=1, description="RoPE base (the FoX code uses 500000 when RoPE is on)")
    qk_norm: bool = Field(False, description="Pro: RMSNorm of q and k per head, a weight per head and channel")
    k_shift: bool = Field(False, description="Pro: data-dependent token shift of the keys, k_t ← α_t k_{t−1} + (1 − α_t) k_t, α_t = σ(w_αᵀx_t) per head")
    v_shift: bool = Field(False, description="Pro: the same token shift of the values")
    output_gate: bool = Field(False, description="Pro: y = W_o(σ(W_g x) ⊙ o)")
    output_norm: bool = Field(False, description="Pro: RMSNorm of each head's output before the gate")
    norm_eps: float = Field(1e-6, gt=0, description="ε of the qk and output RMSNorms")


@register("fox", description="Forgetting Transformer (Lin et al. 2025): softmax attention with a data-dependent forget-gate bias")
class ForgettingAttention(_Attention):
    """The Forgetting Transformer's attention, FoX (Lin et al. 2025, arXiv:2503.02130), with the Pro block's options.

        f_t = σ(w_fᵀ x_t + b_f)   per head                                        (the forget gate)
        o_i = Σ_{j<=i} softmax_j(s·q_iᵀk_j + Σ_{l=j+1..i} log f_l) v_j            (forgetting attention)

    One call into ``seqmix.ops.forgetting_attention`` with c_t = Σ_{l<=t} log f_t (float32).
    Modes: "parallel" (the explicit masked matrix with the bias c_i − c_j: the reference, and
    phi) and "sdpa" (the bias folded into one extra key channel, k̃_j = [k_j, −c_j], q̃_i =
    [s·q_i, 1]: plain causal SDPA of width K + 1, no [T, T] bias). Decoding: a KV cache
    (``Cache`` entry "kv", :class:`~seqmix.ops.KVCache`) of the augmented keys, so it stores the
    cumulative log forget gate per cached token beside k and v; "k_last"/"v_last": the last key
    and value projections with k_shift / v_shift. Maps of phi(x): [B, heads, T, T].

    State per sequence: heads·(K + 1 + V)·L floats for L cached tokens (L = seq_len, or
    min(seq_len, window − 1)), + heads·K (k_shift) + heads·V (v_shift).

    finite_state = False: the forget gate makes the weights decay, but the softmax
    normalization over all past tokens still needs every key (Lemma 1's infinite state, as
    softmax attention); with f ≡ 1 FoX is softmax attention.
    """

    modes = ("parallel", "sdpa")
    reference_mode = "parallel"
    state_formula = "heads·(K + 1 + V)·L, L = min(seq_len, window − 1) cached tokens (+ heads·(K + V) with the k/v shifts)"
    finite_state = False
    Config = FoxConfig

    def __init__(self, config: FoxConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        H, K, V = self.heads, self.head_qk, self.head_v
        self.W_f = nn.Linear(c.d_model, H, bias=c.forget_bias)
        self.q_norm = RMSNorm(H * K, eps=c.norm_eps, groups=H) if c.qk_norm else None
        self.k_norm = RMSNorm(H * K, eps=c.norm_eps, groups=H) if c.qk_norm else None
        self.W_kshift = nn.Linear(c.d_model, H, bias=False) if c.k_shift else None
        self.W_vshift = nn.Linear(c.d_model, H, bias=False) if c.v_shift else None
        self.out_norm = RMSNorm(H * V, eps=c.norm_eps, groups=H) if c.output_norm else None
        self.W_g = self._output_gate()

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2}

    def _shift(self, x, z, W, last):
        """z_t ← α_t z_{t−1} + (1 − α_t) z_t per head (z_{−1}: ``last`` or 0); z [B, T, H, ·]."""
        alpha = torch.sigmoid(W(x)).unsqueeze(-1).to(z.dtype)  # [B, T, H, 1]
        prev = torch.zeros_like(z[:, :1]) if last is None else last.view(z[:, :1].shape).to(z.dtype)
        prev = torch.cat([prev, z[:, :-1]], dim=1)
        return alpha * prev + (1 - alpha) * z

    def _parts(self, x, state):
        """q, k [B, T, H, K]; v [B, T, H, V]; log f [B, T, H] (float32 or wider); the raw last k, v."""
        c = self.config
        B, T, _ = x.shape
        H, K, V = self.heads, self.head_qk, self.head_v
        q, k = self.W_qk(x).split([H * K, H * K], dim=-1)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), self.W_v(x).view(B, T, H, V)
        raw_k, raw_v = k[:, -1].flatten(1), v[:, -1].flatten(1)
        if self.W_kshift is not None:
            k = self._shift(x, k, self.W_kshift, state.get("k_last") if state else None)
        if self.W_vshift is not None:
            v = self._shift(x, v, self.W_vshift, state.get("v_last") if state else None)
        if self.q_norm is not None:
            q, k = _heads_rms(q, self.q_norm), _heads_rms(k, self.k_norm)
        if c.rope:
            q, k = self._rotate(state["kv"].seen if state and "kv" in state else 0, q, k)
        log_f = F.logsigmoid(linear_f32(self.W_f, x))  # [B, T, H]
        return q, k, v, log_f, raw_k, raw_v

    def _forward(self, x, *, state, mode, need_state):
        K = self.head_qk
        q, k, v, log_f, raw_k, raw_v = self._parts(x, state)
        kv = state["kv"] if state else None
        if need_state and kv is None:
            kv = KVCache(window=self.config.window)
        cum = log_f.cumsum(1)  # c_t = Σ_{l<=t} log f_l, continued from the last cached token's c (only differences matter)
        if kv is not None and len(kv):
            cum = cum - kv.keys[:, -1:, :, K].to(cum.dtype)
        if mode == "step":
            keys, vals = kv.append(forgetting_keys(k, cum), v)
            o = forgetting_decode(q[:, 0], keys, vals, scale=self.qk_scale).unsqueeze(1)
        else:
            if kv is not None:
                keys, vals = kv.append(forgetting_keys(k, cum), v)
                k_all, c_all = keys[..., :K], -keys[..., K]
            else:
                k_all, c_all, vals = k, cum, v
            o = forgetting_attention(q, k_all, vals, c_all, scale=self.qk_scale, window=self.config.window, mode=mode, check_values=False)
        new = None
        if need_state:
            new = {"kv": kv}
            if self.W_kshift is not None:
                new["k_last"] = raw_k
            if self.W_vshift is not None:
                new["v_last"] = raw_v
        return MixOut(self._out(o, x), new, values=v, mixed=o)

    def _out(self, o, x):
        if self.out_norm is not None:
            o = _heads_rms(o, self.out_norm)
        return self._readout(self._gate(o, x))

    def phi(self, x):
        """[B, heads, T, T]: softmax_j(s·q_iᵀk_j + c_i − c_j) (``ops.forgetting_probs``)."""
        self.check_input(x)
        q, k, _, log_f, _, _ = self._parts(x, None)
        return forgetting_probs(q, k, log_f.cumsum(1), scale=self.qk_scale, window=self.config.window, check_values=False)

    def state_size(self, seq_len: int | None = None) -> int:
        H, K, V = self.heads, self.head_qk, self.head_v
        shifts = H * K * (self.W_kshift is not None) + H * V * (self.W_vshift is not None)
        return H * (K + 1 + V) * self._cached_tokens(seq_len) + shifts


class StickBreakingConfig(AttentionConfig):
    """Stick-breaking attention (Tan et al. 2024). Defaults: the paper's (keys before the query,
    the remainder to the query's own value, no position embedding)."""

    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies qᵀk in β = σ(s·qᵀk): 'sqrt' = 1/sqrt(K) (the paper), 'none', or a number > 0")
    attend_current: bool = Field(False, description="a query also breaks the stick on its own key (j <= i); the paper: False (j < i)")
    remainder: Literal["current", "drop"] = Field(
        "current", description="the stick left over, r_i = 1 − Σ_j A_ij: 'current' adds r_i v_i (the authors' code), 'drop' leaves it (fla's naive op)"
    )
    chunk_size: int = Field(64, gt=0, description="key/query block length of the chunk mode")


@register("stickbreaking", description="Stick-breaking attention (Tan et al. 2024): σ-gated shares of a stick, nearest key first, no softmax")
class StickBreakingAttention(_Attention):
    """Stick-breaking attention (Tan et al. 2024, arXiv:2410.17980).

        β_{i,j} = σ(s·q_iᵀk_j),   A_{i,j} = β_{i,j} Π_{j<l<i} (1 − β_{i,l}),   o_i = Σ_{j<i} A_{i,j} v_j + r_i v_i

    One call into ``seqmix.ops.stickbreaking_attention`` (log space: logσ and a reverse cumsum).
    Modes: "parallel" (the explicit [T, T] log-weight matrix: the reference, and phi) and
    "chunk" (key blocks from the nearest to the farthest, carrying each query's remaining stick:
    the authors' kernel's structure, O(T·chunk) memory). Decoding needs only the past keys and
    values: a KV cache (``Cache`` entry "kv", :class:`~seqmix.ops.KVCache`). Maps of phi(x):
    [B, heads, T, T], A_{i,j} with r_i on the diagonal ("current").

    State per sequence: heads·(K + V)·L floats for L = seq_len cached tokens.

    finite_state = False: the weight of key j depends on the logits of query i against every
    key between them (Π (1 − σ(q_iᵀk_l))), a function of q_i that no fixed finite state of the
    past can hold; no normalization, but the same growing memory as softmax attention.
    """

    modes = ("parallel", "chunk")
    reference_mode = "parallel"
    state_formula = "heads·(K + V)·L, L = seq_len cached tokens"
    finite_state = False
    Config = StickBreakingConfig

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 8}

    def _parts(self, x):
        B, T, _ = x.shape
        H, K = self.heads, self.head_qk
        q, k = self.W_qk(x).split([H * K, H * K], dim=-1)
        return q.view(B, T, H, K), k.view(B, T, H, K), self.W_v(x).view(B, T, H, self.head_v)

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        q, k, v = self._parts(x)
        kv = state["kv"] if state else None
        if need_state and kv is None:
            kv = KVCache()
        keys, vals = kv.append(k, v) if kv is not None else (k, v)
        o = stickbreaking_attention(
            q, keys, vals, scale=self.qk_scale, attend_current=c.attend_current, remainder=c.remainder,
            mode="parallel" if mode == "step" else mode, chunk_size=c.chunk_size, check_values=False,
        )
        return MixOut(self._readout(o), {"kv": kv} if need_state else None, values=v, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: A_{i,j}, with the remainder r_i on the diagonal ("current")."""
        self.check_input(x)
        q, k, _ = self._parts(x)
        c = self.config
        return stickbreaking_probs(q, k, scale=self.qk_scale, attend_current=c.attend_current, remainder=c.remainder, check_values=False)


class PathConfig(AttentionConfig):
    """PaTH attention (Yang et al. 2025). Defaults: the paper's and flash-linear-attention's
    PaTHAttention layer (low-rank W_w of rank 32, a short conv of width 3 with SiLU on w, L2
    normalized; β = 2σ(·); no forget gate, no qk-norm)."""

    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies the scores q_iᵀP_{i,j}k_j: 'sqrt' = 1/sqrt(K), 'none', or a number > 0")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk (UT-transform) mode")
    w_rank: int | None = Field(32, gt=0, description="rank of the low-rank projection W_w = W_w2 W_w1 (d -> r -> n); None = a full d -> n projection")
    conv_size: int | None = Field(3, ge=1, description="width of the short causal conv (SiLU, no bias) on w; None = no conv")
    beta_scale: float = Field(2.0, gt=0, le=2, description="β_t = beta_scale·σ(w_βᵀx_t + b_β); 2 (the paper) allows reflections, eigenvalues 1 − β_t ∈ (−1, 1)")
    forget_gate: bool = Field(False, description="PaTH-FoX: add FoX's forget-gate bias c_i − c_j, f_t = σ(w_fᵀx_t + b_f) per head")
    gate_scaled: bool = Field(True, description="with forget_gate: scale the bias with the scores, s·(qᵀPk + c_i − c_j) (fla's kernels), or not (FoX's convention)")
    qk_norm: bool = Field(False, description="RMSNorm of q and k over each head's K channels, one weight [K] (fla's use_qk_norm)")
    w_eps: float = Field(1e-6, gt=0, description="ε of the L2 norm of w: w / sqrt(Σw² + ε)")


@register("path_attention", description="PaTH attention (Yang et al. 2025): positions by accumulated data-dependent Householder factors")
class PathAttention(_Attention):
    """PaTH attention (Yang et al. 2025): relative positions as the product of the
    data-dependent Householder factors of the tokens in between.

        w_t = L2norm(SiLU(ShortConv(W_w x)_t)),  β_t = 2σ(w_βᵀx_t + b_β),  H_t = I − β_t w_t w_tᵀ  (per head)
        o_i = Σ_{j<=i} softmax_j(s·q_iᵀ H_i H_{i−1} ⋯ H_{j+1} k_j  [+ c_i − c_j]) v_j

    One call into ``seqmix.ops.path_attention``. Modes: "parallel" (every product formed as a
    K×K matrix: the reference, O(T²K²)), "recurrent" (the decoding algorithm: each new factor
    carries every earlier key, O(T²K)) and "chunk" (the UT transform: O(T²K) in matmuls).
    Decoding: the cache holds the keys already carried to the current position; a step applies
    the new factor to every cached key, k_j ← H_t k_j = k_j − β_t (w_tᵀk_j) w_t (O(L·K) per
    step and head, as the read itself), appends its own key and reads them. ``Cache`` entries:
    "k" [B, L, H, K] (carried keys, float32 or wider), "v" [B, L, H, V], "c" [B, L, H]
    (forget_gate: cumulative log f), "conv" (the short conv's last conv_size − 1 inputs).
    Maps of phi(x): [B, heads, T, T].

    State per sequence: heads·(K + V)·L floats (+ heads·L with the forget gate) + heads·K·(conv_size − 1).

    finite_state = False: the scores are a softmax over every past token (Lemma 1), and the keys
    themselves change with every new token, so the cache cannot even be appended to: it is
    rewritten each step.
    """

    modes = ("parallel", "recurrent", "chunk")
    reference_mode = "parallel"
    state_formula = "heads·(K + V)·L (+ heads·L with forget_gate) + heads·K·(conv_size − 1), L = seq_len cached tokens"
    finite_state = False
    Config = PathConfig

    def __init__(self, config: PathConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        H, K = self.heads, self.head_qk
        if c.w_rank is None:
            self.W_w = nn.Linear(c.d_model, H * K, bias=False)
        else:
            self.W_w = nn.Sequential(nn.Linear(c.d_model, c.w_rank, bias=False), nn.Linear(c.w_rank, H * K, bias=False))
        self.w_conv = ShortConv(H * K, c.conv_size, bias=False, activation="silu") if c.conv_size else None
        self.W_beta = nn.Linear(c.d_model, H, bias=True)
        self.W_f = nn.Linear(c.d_model, H, bias=True) if c.forget_gate else None
        self.q_norm = RMSNorm(K) if c.qk_norm else None
        self.k_norm = RMSNorm(K) if c.qk_norm else None

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 8, "w_rank": 4, "forget_gate": True}

    def _parts(self, x, state, need_state=False):
        """q, k [B, T, H, K]; v; w (unit, float32 or wider) [B, T, H, K]; β [B, T, H]; log f or None; conv state."""
        B, T, _ = x.shape
        H, K = self.heads, self.head_qk
        q, k = self.W_qk(x).split([H * K, H * K], dim=-1)
        q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), self.W_v(x).view(B, T, H, self.head_v)
        if self.q_norm is not None:
            q, k = self.q_norm(q).to(q.dtype), self.k_norm(k).to(k.dtype)
        w, conv = self.W_w(x), None
        if self.w_conv is not None:
            w, conv = self.w_conv(w, state.get("conv") if state else None, output_final_state=need_state)
        w = upcast(w).view(B, T, H, K)
        w = w * torch.rsqrt(w.pow(2).sum(-1, keepdim=True) + self.config.w_eps)
        beta = self.config.beta_scale * torch.sigmoid(linear_f32(self.W_beta, x))
        log_f = F.logsigmoid(linear_f32(self.W_f, x)) if self.W_f is not None else None
        return q, k, v, w, beta, log_f, conv

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        q, k, v, w, beta, log_f, conv = self._parts(x, state, need_state)
        if state:
            k_all, v_all = torch.cat([state["k"].to(compute_dtype(k, state["k"])), k], 1), torch.cat([state["v"].to(v.dtype), v], 1)
        else:
            k_all, v_all = k, v
        c_all = None
        if log_f is not None:
            cum = log_f.cumsum(1)
            if state:
                cum = cum + state["c"][:, -1:].to(cum.dtype)
                c_all = torch.cat([state["c"].to(cum.dtype), cum], 1)
            else:
                c_all = cum
        o, keys = path_attention(
            q, k_all, v_all, w, beta, c=c_all, scale=self.qk_scale, gate_scaled=c.gate_scaled,
            mode="recurrent" if mode == "step" else mode, chunk_size=c.chunk_size, output_final_keys=True, check_values=False,
        )
        new = None
        if need_state:
            new = {"k": keys, "v": v_all}
            if c_all is not None:
                new["c"] = c_all
            if conv is not None:
                new["conv"] = conv
        return MixOut(self._readout(o), new, values=v, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: softmax_j(s·q_iᵀP_{i,j}k_j [+ bias]), scores by the chunk form."""
        self.check_input(x)
        q, k, _, w, beta, log_f, _ = self._parts(x, None)
        S, _ = path_scores(q, k, w, beta, mode="chunk", chunk_size=self.config.chunk_size, check_values=False)
        c = log_f.cumsum(1) if log_f is not None else None
        return path_probs(S, c, scale=self.qk_scale, gate_scaled=self.config.gate_scaled)

    def state_size(self, seq_len: int | None = None) -> int:
        if seq_len is None:
            raise ValueError(f"{type(self).__name__}.state_size: the cache grows with the context; pass 'seq_len'")
        H, K, V = self.heads, self.head_qk, self.head_v
        conv = H * K * (self.config.conv_size - 1) if self.config.conv_size else 0
        return H * (K + V + (self.W_f is not None)) * seq_len + conv


# ------------------------------------------------------------------------------------------
# MoBA: softmax attention over a data-dependent choice of key blocks (map only)
# ------------------------------------------------------------------------------------------


class _RopeConfig(AttentionConfig):
    """An attention config with fla's rotary positions on q and k (MoBA, DeltaFormer)."""

    rope: bool = Field(True, description="rotary positions on q and k at their absolute positions (fla's layer)")
    rope_theta: float = Field(10000.0, gt=1, description="RoPE base")

    @model_validator(mode="after")
    def _rope(self):
        K = (self.n or self.d_model) // self.heads
        if self.rope and K % 2:
            raise ValueError(f"rope = True needs an even head width K = n / heads, got {K}")
        return self


class MoBAConfig(_RopeConfig):
    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies qᵀk: 'sqrt' = 1/sqrt(K) (fla's default), 'none' or a number")
    chunk_size: int = Field(256, gt=0, description="C, the key block size (fla's moba_chunk_size: 256)")
    topk: int = Field(4, gt=0, description="blocks each query reads, its own included (fla's moba_topk: 4)")


@register("moba", description="MoBA (Lu et al. 2025): each query reads its own block and the top-k − 1 past key blocks by q·mean(k); map only")
class MoBA(_Attention):
    """MoBA (Lu et al. 2025; fla's MoBAttention): softmax attention whose keys are cut into blocks of C; query
    t reads its own block causally and the top_k − 1 complete past blocks i ranked by q_t · mean(k over block i)
    (``seqmix.ops.moba``). Φ is softmax attention's map restricted to a block-sparse support that the data
    choose — drawn by ``phi`` ([B, heads, T, T], zero outside the chosen blocks) — and the model is that map:
    no finite-state DSF (``dsf`` raises), and decoding keeps every past key and value (any complete block may
    be chosen later). One mode, ``parallel`` (the masked map); decoding runs the same op on the new queries
    against the cached keys.
    """

    modes = ("parallel",)
    reference_mode = "parallel"
    state_formula = "T·heads·(K + V) (every past key and value)"
    finite_state = False
    Config = MoBAConfig

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 4, "topk": 2}

    def _qkv_at(self, x, start: int):
        q, k, v = self._qkv(x)  # q scaled
        if self.config.rope:
            q, k = self._rotate(start, q, k)
        return q, k, v

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        start = state["k"].shape[1] if state else 0  # a shape, not a value: no host read
        q, k, v = self._qkv_at(x, start)
        if state:
            k, v_all = torch.cat([state["k"], k.to(state["k"].dtype)], 1), torch.cat([state["v"], v.to(state["v"].dtype)], 1)
        else:
            v_all = v
        o = moba_attention(q, k, v_all, block_size=c.chunk_size, topk=c.topk, start=start)
        return MixOut(self._readout(o), {"k": k, "v": v_all} if need_state else None, values=v, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: softmax attention restricted to each query's own block and its chosen past blocks."""
        self.check_input(x)
        q, k, _ = self._qkv_at(x, 0)
        return moba_probs(q, k, block_size=self.config.chunk_size, topk=self.config.topk).to(q.dtype)


# ------------------------------------------------------------------------------------------
# NSA: gated compressed, selected and sliding-window attention (map only)
# ------------------------------------------------------------------------------------------


class NSAConfig(MixerConfig):
    """Native Sparse Attention (Yuan et al. 2025; flash-linear-attention's NativeSparseAttention layer)."""

    heads: int = Field(64, gt=0, description="query heads HQ (fla: 64)")
    kv_heads: int = Field(4, gt=0, description="key/value heads H, dividing heads (fla: 4; GQA groups share the block selection)")
    head_dim: int = Field(64, gt=0, description="width of every head's q, k and v (fla: 64)")
    chunk_size: int = Field(64, gt=0, description="C, the block size of compression and selection (fla's block_size: 64)")
    block_count: int = Field(16, ge=3, description="blocks each query's selection branch reads, the first, own and previous ones "
                             "included (fla's block_counts: 16)")
    window: int = Field(512, ge=0, description="the sliding-window branch's width (fla's window_size: 512; 0: no branch)")
    rope: bool = Field(True, description="rotary positions on q and k at their absolute positions (fla's layer)")
    rope_theta: float = Field(10000.0, gt=1, description="RoPE base")

    @model_validator(mode="after")
    def _check(self):
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads = {self.kv_heads} must divide heads = {self.heads}")
        if self.rope and self.head_dim % 2:
            raise ValueError(f"rope = True needs an even head_dim, got {self.head_dim}")
        return self


@register("nsa", description="NSA (Yuan et al. 2025): gated compressed + top-n selected block + sliding-window softmax attention; map only")
class NSA(Mixer):
    """Native Sparse Attention (Yuan et al. 2025; fla's NativeSparseAttention). Per query head, three softmax
    attentions over the same keys mixed by gates σ(x W_g) ∈ (0, 1)³ (``seqmix.ops.nsa``): over mean-pooled
    key/value blocks (compression), over the top ``block_count`` blocks ranked by the compression branch's
    weights averaged over the GQA group, the first, own and previous blocks always among them (selection),
    and over the last ``window`` tokens (sliding window). Φ = g_cmp Φ_cmp + g_slc Φ_slc + g_swa Φ_swa is
    linear in v: ``phi`` draws it ([B, heads, T, T]; values repeated over each key head's group). No finite-
    state DSF; decoding keeps every key and value. One mode, ``parallel``.
    """

    family = "attention"
    modes = ("parallel",)
    reference_mode = "parallel"
    state_formula = "T·kv_heads·2·head_dim (every past key and value)"
    map_unit = "head"
    finite_state = False
    Config = NSAConfig

    def __init__(self, config: NSAConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, HQ, H, K = c.d_model, c.heads, c.kv_heads, c.head_dim
        self.heads, self.kv_heads, self.K = HQ, H, K
        self.W_q = nn.Linear(d, HQ * K, bias=False)
        self.W_k = nn.Linear(d, H * K, bias=False)
        self.W_v = nn.Linear(d, H * K, bias=False)
        self.W_g = nn.Linear(d, 3 * HQ, bias=False)
        self.W_o = nn.Linear(HQ * K, d, bias=False)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 4, "kv_heads": 2, "head_dim": 4, "chunk_size": 3, "block_count": 3, "window": 5}

    def _params(self, x, start: int):
        c = self.config
        B, T, _ = x.shape
        q = self.W_q(x).view(B, T, self.heads, self.K) * self.K ** -0.5
        k = self.W_k(x).view(B, T, self.kv_heads, self.K)
        v = self.W_v(x).view(B, T, self.kv_heads, self.K)
        if c.rope:
            pos = torch.arange(start, start + T, device=x.device)
            q, k = rotary(q, pos, theta=c.rope_theta), rotary(k, pos, theta=c.rope_theta)
        g_cmp, g_slc, g_swa = torch.sigmoid(self.W_g(x)).view(B, T, self.heads, 3).unbind(-1)
        return q, k, v, (g_cmp, g_slc, g_swa)

    def _op_kw(self):
        c = self.config
        return dict(block_size=c.chunk_size, block_count=c.block_count, window=c.window)

    def _forward(self, x, *, state, mode, need_state):
        start = state["k"].shape[1] if state else 0  # a shape, not a value: no host read
        q, k, v, gates = self._params(x, start)
        if state:
            k_all, v_all = torch.cat([state["k"], k.to(state["k"].dtype)], 1), torch.cat([state["v"], v.to(state["v"].dtype)], 1)
        else:
            k_all, v_all = k, v
        o = nsa_attention(q, k_all, v_all, *gates, start=start, **self._op_kw())
        B, T = x.shape[:2]
        values = repeat_kv(v, self.heads // self.kv_heads)
        return MixOut(self.W_o(o.reshape(B, T, -1)), {"k": k_all, "v": v_all} if need_state else None, values=values, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: g_cmp Φ_cmp + g_slc Φ_slc + g_swa Φ_swa per query head."""
        self.check_input(x)
        q, k, _, gates = self._params(x, 0)
        return nsa_probs(q, k, *gates, **self._op_kw()).to(q.dtype)

    def state_size(self, seq_len: int | None = None) -> int:
        if seq_len is None:
            raise ValueError("NSA.state_size: the cache grows with the context (every key and value); pass 'seq_len'")
        return seq_len * self.kv_heads * 2 * self.K


# ------------------------------------------------------------------------------------------
# DeltaFormer: softmax attention over delta-rule-corrected values
# ------------------------------------------------------------------------------------------


class DeltaFormerConfig(_RopeConfig):
    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies qᵀk in both passes: 'sqrt' = 1/sqrt(K) (fla), 'none' or a number")


@register("deltaformer", description="DeltaFormer: u_t = v_t − β_t Σ_{s<t} softmax(q·k) u_s, o = causal softmax attention over u; map only")
class DeltaFormer(_Attention):
    """DeltaFormer (fla's DeltaFormerAttention; ``seqmix.ops.deltaformer``): the delta rule's erase step with
    softmax attention as the memory's readout. Per head, u_t = v_t − β_t Σ_{s<t} softmax_{s<t}(q_t·k_s) u_s and
    o_t = Σ_{s<=t} softmax(q_t·k_s) u_s, β_t = σ(x W_β + b) per head. Its map Φ = P_<= (I + Diag(β) P_<)⁻¹ is
    softmax attention composed with an inverted one (``phi``, [B, heads, T, T]); no finite-state DSF; decoding
    keeps every key and every u. Modes: recurrent (u token by token) and parallel (one triangular solve).
    """

    modes = ("recurrent", "parallel")
    reference_mode = "recurrent"
    state_formula = "T·heads·(K + V) (every key and every u)"
    finite_state = False
    Config = DeltaFormerConfig

    def __init__(self, config: DeltaFormerConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        self.W_beta = nn.Linear(self.config.d_model, self.heads, bias=True)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2}

    def _params(self, x, start: int):
        q, k, v = self._qkv(x)  # q scaled
        if self.config.rope:
            q, k = self._rotate(start, q, k)
        return q, k, v, torch.sigmoid(self.W_beta(x))

    def _forward(self, x, *, state, mode, need_state):
        start = state["k"].shape[1] if state else 0  # a shape, not a value: no host read
        q, k, v, beta = self._params(x, start)
        k_all = torch.cat([state["k"], k.to(state["k"].dtype)], 1) if state else k
        o, u = deltaformer_attention(q, k_all, v, beta, u_prev=state["u"] if state else None,
                                     mode="parallel" if mode in ("auto", "step") else mode)
        o = o.to(v.dtype)
        st = {"k": k_all, "u": torch.cat([state["u"], u.to(state["u"].dtype)], 1) if state else u} if need_state else None
        return MixOut(self._readout(o), st, values=v, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: P_<= (I + Diag(β) P_<)⁻¹."""
        self.check_input(x)
        q, k, _, beta = self._params(x, 0)
        return deltaformer_probs(q, k, beta).to(q.dtype)


# ------------------------------------------------------------------------------------------
# Parallax: softmax attention with a second query that corrects its weights
# ------------------------------------------------------------------------------------------


class ParallaxConfig(DeltaFormerConfig):
    window: int | None = Field(None, ge=1, description="sliding window: each query sees its last `window` keys (fla's window_size); None = all")


@register("parallax", description="Parallax: softmax weights a times (1 + Σ a s2 − s2), s2 = r·k from a second query r; map only")
class Parallax(_Attention):
    """Parallax (fla's ParallaxAttention; ``seqmix.ops.parallax``): softmax attention a = softmax(q·k) whose weights
    a second query r corrects to first order, Φ[t, s] = a_ts (1 + Σ_j a_tj r_t·k_j − r_t·k_s) (rows still sum to 1).
    q, r, k with RoPE; an optional sliding window. ``phi`` is Φ ([B, heads, T, T]); no finite-state DSF;
    decoding keeps every key and value. One mode, ``parallel``.
    """

    modes = ("parallel",)
    reference_mode = "parallel"
    state_formula = "T·heads·(K + V) (every key and value)"
    finite_state = False
    Config = ParallaxConfig

    def __init__(self, config: ParallaxConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        self.W_r = nn.Linear(self.config.d_model, self.n, bias=False)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2}

    def _params(self, x, start: int):
        q, k, v = self._qkv(x)  # q scaled; r is not (fla)
        B, T, _ = x.shape
        r = self.W_r(x).view(B, T, self.heads, self.head_qk)
        if self.config.rope:
            q, k, r = self._rotate(start, q, k, r)
        return q, r, k, v

    def _forward(self, x, *, state, mode, need_state):
        start = state["k"].shape[1] if state else 0  # a shape, not a value: no host read
        q, r, k, v = self._params(x, start)
        if state:
            k, v_all = torch.cat([state["k"], k.to(state["k"].dtype)], 1), torch.cat([state["v"], v.to(state["v"].dtype)], 1)
        else:
            v_all = v
        o = parallax_attention(q, r, k, v_all, window=self.config.window, start=start)
        return MixOut(self._readout(o), {"k": k, "v": v_all} if need_state else None, values=v, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: a ⊙ (1 + rowsum(a ⊙ s2) − s2)."""
        self.check_input(x)
        q, r, k, _ = self._params(x, 0)
        return parallax_probs(q, r, k, window=self.config.window).to(q.dtype)


# ------------------------------------------------------------------------------------------
# Wall attention: softmax over gated-linear-attention scores
# ------------------------------------------------------------------------------------------


class WallAttentionConfig(AttentionConfig):
    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies qᵀk: 'sqrt' = 1/sqrt(K) (fla), 'none' or a number")
    window: int | None = Field(None, ge=1, description="sliding window: each query sees its last `window` keys (fla's window_size); None = all")
    scalar_gate: bool = Field(False, description="add a FoX-style per-head scalar log-decay c_t − c_s to the logits (fla's use_scalar_gate)")
    gate_bias: float = Field(8.0, description="initial bias of the decay projections: log σ(8) ≈ −3e-4, nearly no decay at init (fla's gate_init_bias)")


@register("wall_attention", description="Wall attention: softmax of Σ_n q_n k_n exp(G_tn − G_sn), per-channel decayed logits; map only")
class WallAttention(_Attention):
    """Wall attention (fla's WallAttention; ``seqmix.ops.wall``): softmax attention whose logit for (t, s) is the gated-
    linear-attention score Σ_n q_tn k_sn exp(G_tn − G_sn), with per-channel log-decays g = log σ(x W_g + b) and their
    prefix sums G (no RoPE: the decays order the tokens), and optionally a FoX-style per-head scalar gate. ``phi``
    is its softmax map ([B, heads, T, T]); no finite-state DSF; decoding keeps every key, value and cumulative
    log-decay G_s. One mode, ``parallel`` (the reference materializes [B, H, T, T, K]).
    """

    modes = ("parallel",)
    reference_mode = "parallel"
    state_formula = "T·heads·(2K + V) [+ T·heads] (keys, values, their cumulative log-decays [and scalar gates])"
    finite_state = False
    Config = WallAttentionConfig

    def __init__(self, config: WallAttentionConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.W_g = nn.Linear(c.d_model, self.n, bias=True)
        self.W_gs = nn.Linear(c.d_model, self.heads, bias=True) if c.scalar_gate else None
        with torch.no_grad():
            for layer in (self.W_g, self.W_gs):
                if layer is not None:
                    layer.bias.fill_(c.gate_bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "scalar_gate": True, "gate_bias": 0.0}

    def _params(self, x, state):
        """q (scaled), k [B, T, H, K], v, the cumulative log-decays G [B, T, H, K] and c [B, T, H] (or None)."""
        q, k, v = self._qkv(x)
        B, T, _ = x.shape
        g = F.logsigmoid(upcast(self.W_g(x))).view(B, T, self.heads, self.head_qk)
        G = torch.cumsum(g, 1)
        if state:
            G = G + state["G"][:, -1:].to(G.dtype)
        c = None
        if self.W_gs is not None:
            c = torch.cumsum(F.logsigmoid(upcast(self.W_gs(x))), 1)
            if state:
                c = c + state["c"][:, -1:].to(c.dtype)
        return q, k, v, G, c

    def _forward(self, x, *, state, mode, need_state):
        start = state["k"].shape[1] if state else 0  # a shape, not a value: no host read
        q, k, v, G, c = self._params(x, state)
        cat = (lambda name, t: torch.cat([state[name], t.to(state[name].dtype)], 1)) if state else (lambda name, t: t)
        k_all, v_all, G_all = cat("k", k), cat("v", v), cat("G", G)
        c_all = cat("c", c) if c is not None else None
        o = wall_attention(q, k_all, v_all, G, G_all, c, c_all, window=self.config.window, start=start)
        st = None
        if need_state:
            st = {"k": k_all, "v": v_all, "G": G_all, **({"c": c_all} if c is not None else {})}
        return MixOut(self._readout(o), st, values=v, mixed=o)

    def phi(self, x):
        """[B, heads, T, T]: softmax_{s<=t} of Σ_n q_tn k_sn exp(G_tn − G_sn) (+ c_t − c_s)."""
        self.check_input(x)
        q, k, _, G, c = self._params(x, None)
        return wall_probs(q, k, G, G, c, c, window=self.config.window).to(q.dtype)

    def state_size(self, seq_len: int | None = None) -> int:
        if seq_len is None:
            raise ValueError("WallAttention.state_size: the cache grows with the context; pass 'seq_len'")
        return seq_len * self.heads * (2 * self.head_qk + self.head_v + (1 if self.config.scalar_gate else 0))
