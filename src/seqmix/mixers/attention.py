"""The attention family in the DSF (DSF paper §2.1, §3.2, §4.1-4.2; Appendix B, C, G, H).

Two mechanisms share one parametrization, the DSF paper's experimental one (dsf note
§5.1): a single projection W_qk: d -> 2n (n = the state expansion = the width of q and k
over all heads, default d), W_v: d -> d and an output projection W_o: d -> d, split into
``heads`` heads (q_i^h, k_i^h ∈ R^{n/heads}, v_i^h ∈ R^{d/heads}).

softmax attention (eq. 2), ``softmax_attention``::

    y_i = Σ_{j<=i, i-j<w} softmax_j(s · q_iᵀ k_j) v_j

    one call into ``seqmix.ops.softmax_attention`` (SDPA, or the explicit masked matrix),
    optional sliding window w, KV-cache decoding bounded by w. Its DSF has an infinite
    state (Lemma 1); ``dsf(x, taylor_order=P)`` returns the degree-P Taylor-feature
    separable attention instead, which converges to it as P grows.

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
from ..ops import attention_probs, attention_step, kv_cache_trim, linear_recurrence, recurrence_map, softmax_attention
from ..ops.precision import linear_f32
from ..ops.features import FEATURE_MAPS, POSITIVE_FEATURE_MAPS, apply_feature_map, feature_dim, taylor_feature_dim
from .base import MixerConfig, Mixer, MixOut, register, register_preset

FeatureMap = Literal["identity", "elu1", "relu", "exp", "taylor"]
Normalizer = Literal["none", "row_sum", "abs_row_sum", "exp", "softplus", "sigmoid"]
assert set(FeatureMap.__args__) == set(FEATURE_MAPS)

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

    def __init__(self, config=None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.n = c.n or c.d_model
        self.heads = c.heads
        self.head_qk = self.n // c.heads  # K: width of q^h, k^h
        self.head_v = c.d_model // c.heads  # V: width of v^h
        self.W_qk = nn.Linear(c.d_model, 2 * self.n, bias=c.bias)
        self.W_v = nn.Linear(c.d_model, c.d_model, bias=c.bias)
        self.W_o = nn.Linear(c.d_model, c.d_model, bias=c.bias) if c.output_projection else nn.Identity()

    @property
    def qk_scale(self) -> float:
        s = self.config.scale
        return 1.0 / math.sqrt(self.head_qk) if s == "sqrt" else 1.0 if s == "none" else float(s)

    def _qkv(self, x, *, qk_f32: bool = False):
        """q (scaled), k: [B, T, H, K]; v: [B, T, H, V]. ``qk_f32``: q and k in float32 or wider
        under autocast and with half parameters (docs/scale.md)."""
        B, T, _ = x.shape
        q, k = (linear_f32(self.W_qk, x) if qk_f32 else self.W_qk(x)).chunk(2, dim=-1)
        q = q.view(B, T, self.heads, self.head_qk)
        if self.qk_scale != 1.0:
            q = q * self.qk_scale
        return q, k.view(B, T, self.heads, self.head_qk), self.W_v(x).view(B, T, self.heads, self.head_v)

    def _readout(self, o):
        return self.W_o(o.flatten(2))

    def _compose(self, system: DSF, projections: bool) -> DSF:
        """With projections, the DSF's input is x and its output y (W_v and W_o absorbed)."""
        if not projections:
            return system
        if self.config.bias:
            raise ValueError(f"{type(self).__name__}.dsf: projections=True needs bias=False (a bias is not linear)")
        out = self.W_o.weight if self.config.output_projection else None
        return system.compose(in_proj=self.W_v.weight, out_proj=out)


# ------------------------------------------------------------------------------------------
# separable attention: linear, generalized linear, normalized, multi-head
# ------------------------------------------------------------------------------------------


class SeparableAttentionConfig(AttentionConfig):
    feature_map: FeatureMap = Field("elu1", description="φ applied to the queries: " + ", ".join(FEATURE_MAPS))
    key_feature_map: FeatureMap | None = Field(None, description="ψ applied to the keys (default: the same as φ)")
    taylor_order: int = Field(2, ge=0, description="degree P of the 'taylor' feature map (Lemma 1)")
    normalizer: Normalizer = Field("row_sum", description="η: " + ", ".join(NORMALIZERS))
    eta_bias: bool = Field(True, description="bias b_η of W_η (input normalizers; the released code has one)")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _features(self):
        phi, psi = self.feature_map, self.key_feature_map or self.feature_map
        if self.normalizer == "row_sum":
            positive = (phi in POSITIVE_FEATURE_MAPS and psi in POSITIVE_FEATURE_MAPS) or (
                phi == psi == "taylor" and self.taylor_order % 2 == 0
            )
            if not positive:
                raise ValueError(
                    f"normalizer 'row_sum' needs φ(q)ᵀψ(k) > 0: feature_map and key_feature_map in {POSITIVE_FEATURE_MAPS}, "
                    f"or both 'taylor' with an even taylor_order; got feature_map={phi!r}, key_feature_map={psi!r}, "
                    f"taylor_order={self.taylor_order} (use 'abs_row_sum' for signed features)"
                )
        if (phi == "taylor") != (psi == "taylor"):
            raise ValueError(f"feature_map and key_feature_map must both be 'taylor' or neither (φ(q)ᵀψ(k) needs equal widths), got {phi!r} and {psi!r}")
        if phi == "taylor":
            n, H = self.n or self.d_model, self.heads
            K, V = n // H, self.d_model // H
            floats = H * taylor_feature_dim(K, self.taylor_order) * (V + 1)
            if floats > MAX_STATE_FLOATS:
                raise ValueError(
                    f"taylor_order = {self.taylor_order} is too large for memory: the state would hold {floats:.3g} floats "
                    f"per sequence ({_bytes(4 * floats)} in float32; limit {MAX_STATE_FLOATS:.3g} floats), "
                    f"Σ_p K^p = {taylor_feature_dim(K, self.taylor_order)} features per head for K = {K}"
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
        self.n_features = feature_dim(self.phi_name, self.head_qk, c.taylor_order)
        self.row_sum = c.normalizer in ROW_SUM_NORMALIZERS
        self.W_eta = nn.Linear(c.d_model, c.heads, bias=c.eta_bias) if c.normalizer in INPUT_NORMALIZERS else None

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    def _features(self, x):
        """φ(q), ψ(k): [B, T, H, n_φ]; v: [B, T, H, V]; z = W_η x: [B, T, H] or None."""
        # a signed η = 1 + |φ(q)ᵀΣψ(k)| cancels: with q, k rounded to bf16 its error grows with T
        # (relative error 0.29 at T = 512), so q and k stay in float32 there (docs/scale.md)
        q, k, v = self._qkv(x, qk_f32=self.config.normalizer == "abs_row_sum")
        P = self.config.taylor_order
        fq = apply_feature_map(self.phi_name, q, P)
        fk = apply_feature_map(self.psi_name, k, P)
        z = self.W_eta(x) if self.W_eta is not None else None
        return fq, fk, v, z

    def separable_parts(self, x):
        """(φ(q) [B, T, H, n_φ], ψ(k) [B, T, H, n_φ], η [B, T, H]): the three parts of eq. (13)."""
        self.check_input(x)
        fq, fk, _, z = self._features(x)
        s = (fq * fk.cumsum(1)).sum(-1) if self.row_sum else None  # s_i = φ(q_i)ᵀ Σ_{j<=i} ψ(k_j)
        eta = eta_from(self.config.normalizer, s=s, z=z)
        return fq, fk, (eta if eta is not None else torch.ones_like(fq[..., 0]))

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        fq, fk, v, z = self._features(x)
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
        return MixOut(self._readout(o), {"S": S} if need_state else None, values=v, mixed=o)

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


# ------------------------------------------------------------------------------------------
# softmax attention
# ------------------------------------------------------------------------------------------


class SoftmaxAttentionConfig(AttentionConfig):
    scale: float | Literal["sqrt", "none"] = Field(
        "sqrt", description="multiplies qᵀk: 'sqrt' = 1/sqrt(n/heads) (released code, default), 'none' = 1 (the DSF paper), or a number > 0"
    )
    window: int | None = Field(None, ge=1, description="sliding window: each token sees its last `window` tokens (itself included); None = all")


@register("softmax_attention", description="Causal softmax attention (SDPA + masked-matrix reference), sliding window, KV cache")
class SoftmaxAttention(_Attention):
    """Multi-head causal softmax attention, DSF paper eq. (2), with an optional sliding window.

    Modes: "parallel" (the explicit masked matrix: the reference, and phi) and "sdpa"
    (torch scaled_dot_product_attention). Decoding appends to a KV cache ("k", "v" in
    the Cache, [B, L, heads, ·]) that keeps every token, or the last window - 1 with a
    window. Maps of phi(x): the attention matrices, [B, heads, T, T].
    State per sequence: (n + d_model)·L floats for L cached tokens, L = seq_len or
    min(seq_len, window - 1): it grows with the context unless windowed.

    finite_state = False: the DSF of softmax attention has an infinite state (Lemma 1);
    dsf(x, taylor_order=P) is the degree-P Taylor approximation.
    """

    modes = ("parallel", "sdpa")
    reference_mode = "parallel"
    state_formula = "(n + d_model)·L, L = min(seq_len, window - 1) cached tokens (grows with seq_len without a window)"
    finite_state = False
    Config = SoftmaxAttentionConfig

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2}

    def _forward(self, x, *, state, mode, need_state):
        q, k, v = self._qkv(x)
        w = self.config.window
        if mode == "step":
            o, k_c, v_c = attention_step(
                q[:, 0], k[:, 0], v[:, 0], state["k"] if state else None, state["v"] if state else None, scale=1.0, window=w
            )
            o = o.unsqueeze(1)
        else:
            keys, vals = (torch.cat([state["k"], k], 1), torch.cat([state["v"], v], 1)) if state else (k, v)
            o = softmax_attention(q, keys, vals, scale=1.0, window=w, mode=mode, check_values=False)
            k_c, v_c = kv_cache_trim(keys, vals, w) if need_state else (None, None)
        return MixOut(self._readout(o), {"k": k_c, "v": v_c} if need_state else None, values=v, mixed=o)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, heads, T, T]: the (windowed) causal softmax attention matrices."""
        self.check_input(x)
        q, k, _ = self._qkv(x)
        return attention_probs(q, k, scale=1.0, window=self.config.window, check_values=False)

    def _check_taylor_order(self, taylor_order):
        if isinstance(taylor_order, bool) or not isinstance(taylor_order, int) or taylor_order < 0:
            raise ValueError(f"{type(self).__name__}.dsf: argument 'taylor_order' must be an integer >= 0, got {taylor_order!r}")

    def separable_parts(self, x, *, taylor_order: int = 2):
        """Lemma 1 truncated at degree P: (φ_P(q), φ_P(k), η) with φ_P = concat_p x^{⊗p}/sqrt(p!)
        (Kronecker features) and η_i = φ_P(q_i)ᵀ Σ_{j<=i} φ_P(k_j); shapes [B, T, H, Σ_p K^p] and [B, T, H]."""
        self.check_input(x)
        self._check_taylor_order(taylor_order)
        q, k, _ = self._qkv(x)
        fq = apply_feature_map("taylor", q, taylor_order)
        fk = apply_feature_map("taylor", k, taylor_order)
        return fq, fk, (fq * fk.cumsum(1)).sum(-1)

    def taylor_dsf_bytes(self, batch: int, T: int, taylor_order: int) -> int:
        """Bytes of Λ, B, C (float64) of the degree-P Taylor DSF: N = d_model·Σ_p K^p states,
        B and C of [batch, T, N, d_model] each; the state grows combinatorially in P."""
        N = self.d_model * taylor_feature_dim(self.head_qk, taylor_order)
        return 8 * batch * T * N * (2 * self.d_model + 1)

    def dsf(self, x, *, taylor_order: int = 2, projections: bool = False, max_bytes: int = DSF_MAX_BYTES):
        """The DSF of the degree-P Taylor-feature separable attention of Lemma 1 (eq. 18, 25),
        whose map converges to the softmax map as P grows; state N = d_model·Σ_{p<=P} K^p.

        Input: the values v ([B, T, d_model]); output: the Taylor attention's head outputs
        before W_o (``projections=True``: x -> y). Raises ValueError naming 'taylor_order'
        when the system would exceed ``max_bytes``, and naming 'window' for a windowed
        mixer (a sliding window is not a separable attention)."""
        self.check_input(x)
        self._check_taylor_order(taylor_order)
        if self.config.window is not None:
            raise ValueError(f"{type(self).__name__}.dsf: the Taylor DSF is defined without a window; got window = {self.config.window}")
        need = self.taylor_dsf_bytes(x.shape[0], x.shape[1], taylor_order)
        if need > max_bytes:
            raise ValueError(
                f"{type(self).__name__}.dsf: taylor_order = {taylor_order} is too large for memory: the DSF would need "
                f"{_bytes(need)} (N = {self.d_model}·{taylor_feature_dim(self.head_qk, taylor_order)} states, "
                f"batch {x.shape[0]}, T {x.shape[1]}), more than max_bytes = {_bytes(max_bytes)}"
            )
        fq, fk, eta = self.separable_parts(x, taylor_order=taylor_order)
        return self._compose(DSF.from_separable(fq, fk, eta, value_dim=self.head_v), projections)

    def state_size(self, seq_len: int | None = None) -> int:
        w = self.config.window
        if seq_len is None:
            if w is None:
                raise ValueError(f"{type(self).__name__}.state_size: without a window the KV cache grows with the context; pass 'seq_len'")
            cached = w - 1
        else:
            cached = seq_len if w is None else min(seq_len, w - 1)
        return (self.n + self.d_model) * cached
