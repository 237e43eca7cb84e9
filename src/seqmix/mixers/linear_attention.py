"""The general form of linear attention, SSMs and linear RNNs, and MetaLA (seed 002).

MetaLA paper §3 (Eqs. 11-15, Fig. 1, Tables 1, A1-A3): every linear model is a gated,
decayed linear attention, fixed by five parameter functions f_q, f_k, f_v, f_α, f_g and
the sizes d_k, d_v, H:

    q_t = f_q(x_t),  k_t = f_k(x_t),  α_t = f_α(x_t)   ∈ R^{1×d_k}                       (11)
    v_t = f_v(x_t),  g_t = f_g(x_t)                    ∈ R^{1×d_v}                       (12)
    S_t^h = diag(α_t^h) S_{t-1}^h + (k_t^h)ᵀ v_t^h     ∈ R^{d_k'×d_v'}, d_k' = d_k/H     (13)
    o_t = XNorm(concat_h q_t^h S_t^h)                  ∈ R^{1×d_v}                       (14)
    y_t = (o_t ⊙ g_t) W_O                              ∈ R^{1×d}                         (15)

:class:`GeneralForm` is that equation, built once on ``seqmix.ops.linear_recurrence``:
each parameter function is chosen from a small vocabulary of named options (the config
fields ``query``, ``key``, ``value``, ``decay``, ``gate``; the sizes ``heads``,
``expand_k``, ``expand_v``, ``d_state``; ``xnorm``). Every model of MetaLA's general form is a
registered preset of it (:func:`register_preset`), never a copy:

    preset        parameter group   f_q        f_k                 f_α                          f_g
    linformer     {Q, K}            φ(xW_Q)    φ(xW_K)             1 (+ normalizer)             1
    retnet        {Q, K, Λ}         xW_Q       xW_K                γ_h e^{iθ} (fixed, rotary)   SiLU(xW_G)
    lightning_attention {Q, K, Λ}   SiLU(xW_Q) SiLU(xW_K)          exp(-r_h) (fixed, per head)  σ(xW_G)   (MiniMax-01)
    transnormer   {Q, K, Λ}         φ(xW_Q)    φ(xW_K)             λ_h e^{iθ} (fixed, rotary)   xW_U
    gla           {Q, K, Λ_t}       xW_Q       xW_K                σ(xW¹W² + b)^{1/τ}           SiLU(xW_r + b)
    liger_gla     {Q, K, Λ_t}       φ(xW_Q)    φ(xW_K)             σ(Pool(xW_K))^{1/τ}          1  (φ = softmax per head; Liger)
    mamba_gf      {Q, K, Λ_t}       xW_C       Δ_t ⊙ xW_B          exp(-Δ_t A)                  1
    rwkv4         {K, Λ}            1          exp(xW_K)           exp(-exp(w))                 σ(xW_r)
    hgrn          {Λ_t}             1          1 - α_t             lb + (1-lb)σ(xW_f)           SiLU(xW_g)
    rg_lru        {Λ_t}             1          sqrt(1 - α_t²)      σ(Λ)^{c σ(xW_a + b)}         GeLU(xW_g + b)
    lru           {Λ}               1          1                   exp(-e^ν + i e^θ) (complex)  1
    qlstm         {K, Λ_t}          1          σ(xW_i)             σ(xW_f)                      σ(xW_o)
    qlstm_rs      {K, Λ_t}          1          σ(xW_i)             σ(-xW_f)^a                   σ(xW_o)
    metala        {Q, Λ_t}          xW_Q       1 - α_t             σ(xW_α)^{1/τ}                SiLU(xW_G + b)
    mlstm         {Q, K, Λ_t}       xW_Q       e^{ĩ_t} xW_K/√d_k'  σ(f̃_t), one per head          σ(xW_o)  (+ normalizer η_t)
    rwkv6         {Q, K, Λ_t}       x_r W_r    x_k W_K             exp(-exp(λ + tanh(x_w A)B))  SiLU(x_g W_g)  (+ bonus u, ddlerp shift)
    hgrn2         {Q, Λ_t}          SiLU(xW_Q) 1 - α_t             lb + (1-lb)σ(xW_f)           1  (RMSNorm over d)

(qlstm_block / qlstm_rs_block: the gated block of the DSF paper's experiments, with an
in-projection, a short conv and a GELU outer gate; rg_lru_block: Griffin's recurrent block as
RecurrentGemma builds it, with biased in-projections, a tanh-GeLU branch, a biased conv and
the first-token reset; general_form: the base class with plain projections.) The group of any
config is computed by ``seqmix.analysis.conditions``.

The mLSTM (xLSTM, Beck et al. 2024), ``mlstm``: a normalized gated linear attention. Per head,

    C_t = f_t C_{t-1} + i_t v_t k_tᵀ,   n_t = f_t n_{t-1} + i_t k_t,   h̃_t = C_t q_t / η_t,
    η_t = max(|n_tᵀ q_t|, 1)                                      (paper; normalizer_form='max_abs')
    η_t = max(|n_tᵀ q_t|, 1) + ε e^{m_t}                          (transformers; normalizer_form='xlstm')

with f_t = σ(f̃_t) (or exp(f̃_t): decay='exp'), i_t = exp(ĩ_t) (input_gate='exp'), one scalar
per head (decay_per_head), k scaled by 1/√d_k', gates soft-capped (gate_soft_cap), then a
per-head LayerNorm, the output gate σ(x W_o) and W_O. It is the general form with a per-head
decay, the input gate folded into the key and the row-sum normalizer of LinFormer (the ones
column of the state is n_t) passed through max(|·|, 1). The max-stabilizer
m_t = max(log f_t + m_{t-1}, ĩ_t) (``seqmix.ops.stabilizer``) stores e^{-m_t} C_t, whose gates
f_t e^{m_{t-1} - m_t} and i_t e^{-m_t} are <= 1: exactly the log-decay and key that
``linear_recurrence`` takes, so every mode is the op's; m_t is carried in the cache.

Relation to the DSF paper's normalized attention (dsf note §3.2, §3.6): the mLSTM is separable
attention (eq. 13-14) with φ = ψ = id, a decay, and a normalizer η_t that, like eq. (17)'s
η(q_i, k_i) and unlike normalized attention's η(u_i) = exp(W_η u_i) (eq. 22), depends on the
query and the whole (gated) key prefix: η_t = max(|q_tᵀ Σ_{s<=t} (Π f) i_s k_s|, 1). Where
normalized attention divides by an exponential of the current input only, the mLSTM puts the
exponential on the input side (i_t = exp(ĩ_t) scales B_t, as eq. 22's B_i = e^{-W_η u_i} k_i does
with the opposite sign) and bounds the row sum below by 1 instead of dividing by it. η_t is a
nonlinear function of the input, like the DSF paper's η, so the DSF is input-dependent:
``dsf(x)`` gives Λ_t = f_t I (the gate itself, unstabilized), B_t = i_t (I ⊗ k_t),
C_t = (1/η_t)(I ⊗ q_tᵀ) — C_t includes 1/η_t, since η_t depends on q_t — and ``phi(x)`` is
q_tᵀ (Π f) i_s k_s / η_t, which reproduces the core output. Choices where the paper and
transformers differ are options: MLSTM_PAPER (no ε, no soft cap), MLSTM_EXP_FORGET.

Layout inside: q, k [B, T, H, K], v [B, T, H, V], log-decays [B, T, H] (one per head) or
[B, T, H, K] (key-wise), as ``linear_recurrence`` takes them. The core map Φ (``phi``) is
LinAttMap of Eq. 18 per head (maps = heads; a head per channel for the LinRNNs and SSMs);
``values`` = v and ``mixed`` = the core's output before self-augmentation, XNorm and the
gates (those act on each token separately).

Beyond Eqs. 11-15, options that the presets need, each documented at its field:
a normalizer (LinFormer, Eq. 5), rotary positions as a complex decay e^{iθ} (RetNet's and
TransNormer's λe^{jθ} of Table A1, exact RoPE), a current-token bonus and token shift
(RWKV-4 in full), a skip term D (Mamba, LRU), self-augmentation (MetaLA Eq. A35), a
short conv before the parameter functions (MetaLA Eq. A31), an in-projection with an outer
gate branch (the qLSTM block, Mamba's block).

RWKV-6 (Finch) and HGRN2 are presets too (``rwkv6``: a LoRA decay 'lora_exp', the linear bonus u and
the data-dependent token shift ddlerp; ``hgrn2``: q = SiLU(x W_q), the key tied to the decay, head size
128). Gated Slot Attention (``gsa``, :class:`GatedSlotAttention`, at the end of this file) is not: it
runs two recurrences per head with a softmax over slots between them (its docstring gives its DSF).

Computation: heads with a vector state (d_k' = 1: the LinRNNs, LRU) are run as one head
whose V = H·d_v' value channels carry their own (value-wise) decay, so the chunk mode
does one [C, C]·[C, H·V] matmul per chunk instead of H thin ones. A decoding step of a config whose
parameter functions read the token alone (``_fusable``: RWKV-4, the mLSTM after its first token, lightning
attention, GLA, HGRN(2), the qLSTMs, the RG-LRU and its block, LinFormer) runs in one pass (``_fused_step``: the token's [B, d] row in
the step op's [B, H, K] layout, ``recurrence.fused_step``, the bonus, normalizer and readout), held to the
general path by tests/test_general_form.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..dsf import DSF
from ..ops import (
    clock_atom, cyclic_readout, linear_recurrence, lse_gate, max_stabilizer, max_stabilizer_step, recurrence_map, recurrence_step, rotary,
)
from ..ops.precision import complex_, compute_dtype, linear_f32, upcast
from .base import ExpandedWidths, MixerConfig, Mixer, MixOut, register, register_preset
from .layers import BlockDiagonalLinear, LayerNorm, RMSNorm, ShortConv, call_plain, l2_normalize, project, short_conv_qkv, token_mix

# the vocabulary of each parameter function (the config fields below take exactly these names)
Query = Literal["proj", "one"]
Key = Literal["proj", "one", "one_minus_decay", "sqrt_one_minus_decay_sq", "sigmoid_proj", "exp_proj", "delta_proj"]
Value = Literal["proj", "identity", "silu_proj", "gated_identity", "lru"]
Decay = Literal["none", "fixed_head", "fixed", "lru", "sigmoid", "low_rank_sigmoid", "reversed_sigmoid", "delta_A", "rg_lru", "exp", "lora_exp",
                "key_pool"]
Gate = Literal["none", "silu", "sigmoid", "gelu", "linear"]
FeatureMap = Literal["identity", "elu1", "silu", "relu", "softmax"]
QUERIES, KEYS, VALUES, DECAYS, GATES, FEATURE_MAPS = (get_args(t) for t in (Query, Key, Value, Decay, Gate, FeatureMap))
#: decays that depend on the input (the group Λ_t); the others are Λ (fixed) or absent
DYNAMIC_DECAYS = ("sigmoid", "low_rank_sigmoid", "reversed_sigmoid", "delta_A", "rg_lru", "exp", "lora_exp", "key_pool")
#: the mLSTM normalizers (xLSTM): η_t = max(|q_t n_t|, 1) ('max_abs', the paper), + ε e^{m_t} ('xlstm', transformers / NX-AI)
Normalizer = Literal["sum", "max_abs", "xlstm"]
#: keys that are their own parameter group K (the others are 1 or tied to the decay)
INDEPENDENT_KEYS = ("proj", "sigmoid_proj", "exp_proj", "delta_proj")

# LRU's ring initialization (Orvieto et al. 2023, §3.3): |λ| uniform on [R_MIN, R_MAX], phase in [0, MAX_PHASE]
LRU_R_MIN, LRU_R_MAX, LRU_MAX_PHASE = 0.9, 0.999, 2 * math.pi
# RG-LRU (Griffin): a^c initialized uniform on [0.9, 0.999]
RG_LRU_A_MIN, RG_LRU_A_MAX = 0.9, 0.999


class GeneralFormConfig(MixerConfig):
    """The sizes and the five parameter functions of MetaLA's general form (Eqs. 11-15)."""

    # -- sizes ------------------------------------------------------------------------
    heads: int | None = Field(1, gt=0, description="H; None: one head per value channel (H = d_v, the LinRNNs and SSMs)")
    head_size: int | None = Field(
        None, gt=0, description="d_v' per head, overriding heads: H = d_v / head_size (RWKV-6: 64; HGRN2's expand ratio: 128, "
        "with d_k = d_v so that d_k' = d_v' too), one head when d_v <= head_size; None: H = heads"
    )
    expand_k: float = Field(1.0, gt=0, description="d_k = expand_k·d_in (the query/key/decay width over all heads); with heads = None, d_k = expand_k·d_v")
    expand_v: float = Field(1.0, gt=0, description="d_v = expand_v·d_in (the value width over all heads)")
    d_state: int | None = Field(None, gt=0, description="d_k' per head, overriding expand_k (an SSM's state size N)")
    shared_qk: bool = Field(False, description="q and k projections of width d_k' shared by every head (Mamba's C_t, B_t)")
    expand: int | None = Field(
        None, gt=0,
        description="block form: an in-projection d -> 2·expand·d giving the stream the parameter functions read (d_in = expand·d) "
        "and an outer gate branch z (the qLSTM block of the DSF paper, Mamba's block); None: they read x (d_in = d)",
    )
    outer_gate: Literal["gelu", "silu", "gelu_tanh"] = Field(
        "gelu", description="activation of the outer gate branch z (with expand); 'gelu_tanh' is GeLU's tanh approximation (RecurrentGemma)"
    )
    in_proj_bias: bool = Field(False, description="bias in the in-projection of the block form (RecurrentGemma's linear_x and linear_y)")
    conv_size: int | None = Field(None, ge=1, description="kernel of a short causal depthwise conv on the stream before the parameter functions (MetaLA Eq. A31); None: no conv")
    conv_bias: bool = Field(False, description="bias in the short conv")
    conv_activation: Literal["none", "silu"] = Field("none", description="activation after the short conv")
    # -- parameter functions --------------------------------------------------------------
    query: Query = Field("proj", description="f_q: 'proj' φ(x W_Q); 'one' q = 1 (LinRNNs)")
    key: Key = Field(
        "proj",
        description="f_k: 'proj' φ(x W_K); 'one'; 'one_minus_decay' 1 - α (MetaLA, HGRN); 'sqrt_one_minus_decay_sq' sqrt(1 - α²) (RG-LRU); "
        "'sigmoid_proj' σ(x W_K + b) (input gate: GLRU, qLSTM); 'exp_proj' exp(x W_K) (RWKV-4); 'delta_proj' Δ_t ⊙ x W_B (Mamba)",
    )
    value: Value = Field(
        "proj",
        description="f_v: 'proj' x W_V; 'identity' x (Mamba); 'silu_proj' SiLU(x W_V + b) (GLRU/HGRN); 'gated_identity' σ(x W_x + b) ⊙ x (RG-LRU); "
        "'lru' γ ⊙ (x B) with complex B and γ = sqrt(1 - |λ|²) normalization (LRU)",
    )
    decay: Decay = Field(
        "sigmoid",
        description="f_α: 'none' α = 1; 'fixed_head' one fixed γ_h per head (RetNet, TransNormer); 'fixed' learned per channel exp(-exp(w)) (RWKV-4); "
        "'lru' complex exp(-exp(ν) + i exp(θ)); 'sigmoid' lb + (1 - lb)σ(x W_α + b) (MetaLA, HGRN, qLSTM); 'low_rank_sigmoid' σ(x W¹ W² + b) (GLA); "
        "'reversed_sigmoid' σ(-x W_f + b)^a, a learned (DSF eq. 23); 'delta_A' exp(-Δ_t A) (Mamba); 'rg_lru' σ(Λ)^{c σ(x W_a + b)} (Griffin); "
        "'exp' α = exp(x W_α + b), xLSTM's exponential forget gate (may exceed 1: needs input_gate = 'exp', whose stabilizer keeps the "
        "stored decays <= 1); 'lora_exp' α = exp(-exp(λ + tanh(x A) B)), a LoRA of rank low_rank per key channel (RWKV-6's w_t); "
        "'key_pool' α = σ(Pool(x W_K)), Liger's gate built from the key projection with no parameter of its own (Pool: the mean "
        "over each head's key channels with decay_per_head, else the key itself, per key channel; needs key = 'proj'). "
        "Every decay is then raised to 1/tau",
    )
    gate: Gate = Field("none", description="f_g: act(x W_G + b) or 'linear' x W_U (TransNormer) or 'none' (g = 1)")
    feature_map: FeatureMap = Field(
        "identity", description="φ applied to q and k of the 'proj' options (the LinFormer kernel); 'softmax': over each head's "
        "d_k' channels (Liger's feature map, > 0 and summing to 1 per head)")
    # -- decay details --------------------------------------------------------------------
    tau: float = Field(1.0, gt=0, description="temperature: α <- α^{1/τ} (GLA and MetaLA: 16)")
    low_rank: int = Field(16, gt=0, description="rank of W_α¹ W_α² of 'low_rank_sigmoid' (GLA: 16) and of A B of 'lora_exp' (RWKV-6: 64)")
    decay_bias: bool = Field(False, description="bias in the decay's projection (GLA b_α, Griffin b_a; none in MetaLA)")
    gate_blocks: int | None = Field(
        None, gt=0, description="the RG-LRU's gate projections W_a (decay 'rg_lru') and W_x (value 'gated_identity') block-diagonal "
        "with this many blocks (RecurrentGemma: one per head, its BlockDiagonalLinear; 1/gate_blocks of the dense weights); "
        "None: dense (the Griffin paper's equations)")
    decay_lower_bound: float = Field(0.0, ge=0, lt=1, description="lb of 'sigmoid': α = lb + (1 - lb)σ(z) (HGRN's lower bound)")
    decay_per_head: bool = Field(
        False, description="one decay per head, W_α: d_in -> H ('sigmoid', 'exp'; the mLSTM forget gate, like SSD's), instead of one per key channel"
    )
    input_gate: Literal["none", "exp"] = Field(
        "none",
        description="'exp': xLSTM's exponential input gate i_t = exp(x W_i + b_i), one per head, folded into the key (k_t <- i_t k_t) "
        "through the max-stabilizer m_t = max(log f_t + m_{t-1}, log i_t) (seqmix.ops.stabilizer): the state is kept as e^{-m_t} C_t, "
        "m_t is carried in the cache. Needs decay_per_head, decay 'sigmoid' or 'exp', and the normalizer (the stabilizer cancels in its ratio)",
    )
    gate_soft_cap: float | None = Field(
        None, gt=0, description="cap·tanh(z/cap) on the pre-activations of the forget gate (decay 'sigmoid', 'low_rank_sigmoid', 'exp') "
        "and of the exponential input gate (xLSTM-7B in transformers: 15); None: no cap",
    )
    head_decay: Literal["retnet", "transnormer", "lightning"] = Field(
        "retnet", description="'fixed_head' schedule: γ_h = 1 - 2^{-5-h} (RetNet), exp(-8h/H) (TransNormerLLM, layer 0) or "
        "exp(-2^{-8(h+1)/H}) (MiniMax's lightning attention, layer 0: ALiBi's slopes)"
    )
    head_decay_rates: tuple[float, ...] | None = Field(
        None, description="'fixed_head' with given rates r_h > 0, one per head: γ_h = exp(-r_h), overriding head_decay (MiniMax-01 "
        "scales the lightning slopes per layer: r_h = 2^{-8(h+1)/H}(1 - l/(L-1) + 1e-5); seqmix.interop reads its slope_rate)"
    )
    rg_lru_c: float = Field(8.0, gt=0, description="c of 'rg_lru' (Griffin: 8)")
    rs_exponent: Literal["relu", "exp", "fixed"] = Field(
        "relu", description="exponent a of 'reversed_sigmoid': relu(a) of a learned scalar (the released code), exp(a_log) (S6's A > 0), or fixed a = 1"
    )
    dt_rank: int | None = Field(None, gt=0, description="rank p of Mamba's Δ projection (None: ceil(d_in/16))")
    # -- positions, normalizer, RWKV, skip ------------------------------------------------------
    rotary: bool = Field(False, description="rotary positions as a complex decay e^{iθ} on pairs of key channels (RetNet/TransNormer λe^{jθ}); exact RoPE")
    rotary_base: float = Field(10000.0, gt=1, description="θ_j = base^{-2j/d_k'}")
    xpos: bool = Field(
        False, description="with rotary: xPos (RetNet's torchscale), q_t ζ^{t/512}, k_s ζ^{-s/512} with ζ_j = (2j + 0.4 d_k')/(1.4 d_k'): "
        "a real decay ζ_j^{1/512} per rotary pair"
    )
    normalizer: bool = Field(False, description="divide by the row sum q_t Σ_s (Πα) k_s (LinFormer's denominator, Eq. 5; RWKV-4's)")
    normalizer_form: Normalizer = Field(
        "sum",
        description="η_t from the row sum s_t = q_t n_t: 'sum' η = s (LinFormer, RWKV-4); 'max_abs' η = max(|s|, 1) (the mLSTM of the xLSTM "
        "paper); 'xlstm' η = max(|s|, 1) + normalizer_eps·e^{m_t} (transformers' and NX-AI's kernels: max(|q ñ|, e^{-m}) + ε on the "
        "stabilized state; m_t = 0 without the exponential input gate)",
    )
    normalizer_eps: float = Field(1e-6, ge=0, description="ε of normalizer_form 'xlstm' (transformers' xLSTMConfig.eps)")
    reset_at_start: bool = Field(
        False, description="Griffin's document reset (RecurrentGemma): the first token of a sequence started without a carried state "
        "(position 0) enters unnormalized, k_0 = 1 instead of the tied key sqrt(1 - α_0²) or 1 - α_0",
    )
    bonus: bool = Field(False, description="RWKV-4's current-token bonus: o_t = q_t S_{t-1} + (q_t ⊙ e^u ⊙ k_t)·1 v_t")
    token_shift: bool = Field(False, description="RWKV-4's token shift: f_k, f_v, f_g read μ ⊙ x_t + (1 - μ) ⊙ x_{t-1}")
    bonus_form: Literal["exp", "linear"] = Field(
        "exp", description="the bonus weight of the current token: 'exp' e^u (RWKV-4's time_first), 'linear' u itself (RWKV-5/6's "
        "time_faaaa: o_t = r_t (S_{t-1} + diag(u) k_tᵀ v_t), Finch's wkv)"
    )
    ddlerp_rank: int | None = Field(
        None, gt=0, description="with token_shift: Finch's data-dependent token shift (RWKV-6's ddlerp): f_q (r), f_k, f_v, f_g and the "
        "decay each read ddlerp_□(x_t, x_{t-1}) = x_t + (x_{t-1} - x_t) ⊙ (λ_□ + tanh((x_t + (x_{t-1} - x_t) ⊙ μ_x) A_□) B_□), "
        "a LoRA of this rank (RWKV-6: 32); None: RWKV-4's static μ"
    )
    skip: Literal["none", "head", "input"] = Field("none", description="skip term D: 'head' o += D_h v_h inside the core (Mamba); 'input' y += D ⊙ x (LRU)")
    scale: Literal["none", "inv_sqrt_k"] | float = Field("none", description="scale of q_t S_t: 'inv_sqrt_k' d_k'^{-1/2} (FLA's default), 'none' (1) or a number")
    # -- MetaLA --------------------------------------------------------------------------
    self_aug: bool = Field(False, description="MetaLA self-augmentation (Eq. A35): o_t += σ_aug((Σ_i q_i w_aug,i k_i) v_t), w_aug initialized to 0")
    aug_activation: Literal["sigmoid", "none"] = Field("sigmoid", description="σ_aug: sigmoid (Eq. A35 and the code) or none (the linear Eq. A38)")
    # -- readout ---------------------------------------------------------------------------
    xnorm: Literal["none", "layernorm", "rmsnorm"] = Field("none", description="XNorm of Eq. 14")
    norm_per_head: bool = Field(True, description="XNorm per head (GroupNorm-like) or over all d_v")
    norm_affine: bool = Field(True, description="XNorm with a learned weight (and bias for LayerNorm)")
    norm_bias: bool = Field(True, description="with norm_affine: LayerNorm's bias (False: the weight only, xLSTM's multi-head norm)")
    norm_eps: float = Field(1e-5, gt=0, description="XNorm epsilon")
    gate_bias: bool = Field(False, description="biases in the gate-like functions: f_g, and the 'sigmoid_proj', 'silu_proj', 'gated_identity' options")
    bias: bool = Field(False, description="biases in the linear projections W_Q, W_K, W_V, W_O")
    out_proj: bool = Field(True, description="the output projection W_O (False: y = o ⊙ g, needs d_v = d_model)")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    # -- derived sizes -------------------------------------------------------------------

    @property
    def d_in(self) -> int:
        """Width of the stream the parameter functions read."""
        return self.d_model * (self.expand or 1)

    @property
    def d_v(self) -> int:
        return round(self.expand_v * self.d_in)

    @property
    def n_heads(self) -> int:
        if self.head_size is not None:
            return max(self.d_v // self.head_size, 1)
        return self.heads if self.heads is not None else self.d_v

    @property
    def _k_base(self) -> int:
        """What expand_k multiplies: d_in, or d_v with one head per value channel (so that d_k' = expand_k)."""
        return self.d_v if self.heads is None and self.head_size is None else self.d_in

    @property
    def d_k(self) -> int:
        return self.n_heads * self.d_state if self.d_state is not None else round(self.expand_k * self._k_base)

    @property
    def head_k(self) -> int:
        return self.d_k // self.n_heads

    @property
    def head_v(self) -> int:
        return self.d_v // self.n_heads

    @property
    def complex_values(self) -> bool:
        return self.value == "lru"

    @model_validator(mode="after")
    def _check(self):
        d_in = self.d_in
        checks = [("expand_v", self.expand_v, d_in, "d_in")]
        if self.d_state is None:
            checks.append(("expand_k", self.expand_k, *((round(self.expand_v * d_in), "d_v") if self.heads is None and self.head_size is None
                                                        else (d_in, "d_in"))))
        for name, e, base, what in checks:
            if abs(e * base - round(e * base)) > 1e-9 or round(e * base) < 1:
                raise ValueError(f"{name} = {e} times {what} = {base} must be a positive integer")
        H, d_k, d_v = self.n_heads, self.d_k, self.d_v
        if self.head_size is not None and d_v > self.head_size and d_v % self.head_size:
            raise ValueError(f"head_size = {self.head_size} must divide d_v = {d_v} (expand_v·d_in), or exceed it (one head)")
        if self.ddlerp_rank is not None and not self.token_shift:
            raise ValueError("ddlerp_rank (Finch's data-dependent token shift) needs token_shift = True")
        if self.bonus_form != "exp" and not self.bonus:
            raise ValueError(f"bonus_form = {self.bonus_form!r} weights the current-token bonus: needs bonus = True")
        if d_v % H:
            raise ValueError(f"d_v = {d_v} (expand_v·d_in) must be divisible by heads = {H}")
        if d_k % H:
            raise ValueError(f"d_k = {d_k} (expand_k·d_in, or d_state·heads) must be divisible by heads = {H}")
        if self.value in ("identity", "gated_identity") and d_v != d_in:
            raise ValueError(f"value = {self.value!r} needs d_v = d_in = {d_in} (expand_v = 1), got d_v = {d_v}")
        if self.key in ("one_minus_decay", "sqrt_one_minus_decay_sq") and self.decay in ("none", "lru"):
            raise ValueError(f"key = {self.key!r} ties the key to a real decay; decay = {self.decay!r} has none")
        if self.key == "delta_proj" and self.decay != "delta_A":
            raise ValueError(f"key = 'delta_proj' (Δ_t ⊙ x W_B) needs decay = 'delta_A' (it shares Δ_t), got {self.decay!r}")
        if (self.decay == "lru") != (self.value == "lru"):
            raise ValueError(f"decay = 'lru' and value = 'lru' go together (LRU's complex state), got decay = {self.decay!r}, value = {self.value!r}")
        if self.decay == "lru" and self.head_k != 1:
            raise ValueError(f"decay = 'lru' is a complex scalar per channel: needs d_k' = 1 (d_k = heads), got d_k' = {self.head_k}")
        if self.complex_values and (self.xnorm != "none" or self.gate != "none" or self.normalizer or self.self_aug or self.bonus):
            raise ValueError("value = 'lru' (complex) takes xnorm = 'none', gate = 'none', normalizer = False, self_aug = False, bonus = False")
        if self.rotary:
            if self.decay not in ("none", "fixed_head"):
                raise ValueError(f"rotary = True needs one decay per head (decay = 'none' or 'fixed_head'), got decay = {self.decay!r}")
            if self.head_k % 2:
                raise ValueError(f"rotary = True rotates pairs of key channels: d_k' = {self.head_k} must be even")
            if self.normalizer or self.bonus or self.self_aug:
                raise ValueError("rotary = True does not combine with normalizer, bonus or self_aug")
        if self.head_decay_rates is not None:
            if self.decay != "fixed_head":
                raise ValueError(f"head_decay_rates sets the fixed decays of decay = 'fixed_head', got decay = {self.decay!r}")
            if len(self.head_decay_rates) != self.n_heads or not all(math.isfinite(r) and r > 0 for r in self.head_decay_rates):
                raise ValueError(f"head_decay_rates must hold heads = {self.n_heads} finite rates > 0 (γ_h = exp(-r_h)), "
                                 f"got {self.head_decay_rates!r}")
        if self.xpos and not self.rotary:
            raise ValueError("xpos = True scales the rotary pairs: needs rotary = True")
        if self.shared_qk and self.key in ("sigmoid_proj", "exp_proj"):
            raise ValueError(f"shared_qk = True shares the q and k projections over heads; key = {self.key!r} is a per-head gate")
        if self.self_aug and self.query != "proj":
            raise ValueError(f"self_aug = True weights the query (Σ_i q_i w_aug,i k_i): needs query = 'proj', got {self.query!r}")
        if not self.out_proj and (d_v != self.d_model or self.complex_values):
            raise ValueError(f"out_proj = False needs real values of width d_v = d_model = {self.d_model}, got d_v = {d_v}")
        if not isinstance(self.scale, str) and not self.scale > 0:
            raise ValueError(f"scale = {self.scale} must be > 0 (or 'none', 'inv_sqrt_k')")
        if self.decay == "none" and self.tau != 1.0:
            raise ValueError(f"tau = {self.tau} raises the decay to 1/tau; decay = 'none' has none")
        if self.decay_per_head and self.decay not in ("sigmoid", "exp", "key_pool"):
            raise ValueError(f"decay_per_head = True takes decay 'sigmoid', 'exp' or 'key_pool', got decay = {self.decay!r}")
        if self.decay == "key_pool" and (self.key != "proj" or self.shared_qk):
            raise ValueError(f"decay = 'key_pool' pools the key projection x W_K of every head: needs key = 'proj' and shared_qk = False, "
                             f"got key = {self.key!r}, shared_qk = {self.shared_qk}")
        if self.decay == "exp" and self.input_gate != "exp":
            raise ValueError("decay = 'exp' (exponential forget gate, may exceed 1) needs input_gate = 'exp' (its max-stabilizer)")
        if self.input_gate == "exp":
            if not (self.decay_per_head and self.decay in ("sigmoid", "exp")):
                raise ValueError(f"input_gate = 'exp' needs one decay per head: decay_per_head = True with decay 'sigmoid' or 'exp', "
                                 f"got decay = {self.decay!r}, decay_per_head = {self.decay_per_head}")
            if not self.normalizer:
                raise ValueError("input_gate = 'exp' needs normalizer = True (the max-stabilizer cancels only in the normalized ratio)")
            if self.bonus or self.rotary:
                raise ValueError("input_gate = 'exp' does not combine with bonus or rotary")
        if self.gate_soft_cap is not None and self.input_gate != "exp" and self.decay not in ("sigmoid", "low_rank_sigmoid", "exp"):
            raise ValueError(f"gate_soft_cap caps the forget/input gate pre-activations: needs decay 'sigmoid', 'low_rank_sigmoid' or 'exp', "
                             f"or input_gate = 'exp', got decay = {self.decay!r}")
        if self.gate_blocks is not None:
            if self.decay != "rg_lru" and self.value != "gated_identity":
                raise ValueError(f"gate_blocks = {self.gate_blocks} makes the RG-LRU's gates block-diagonal: needs decay = 'rg_lru' or "
                                 f"value = 'gated_identity', got decay = {self.decay!r}, value = {self.value!r}")
            outs = ([("d_k", d_k)] if self.decay == "rg_lru" else []) + ([("d_v", d_v)] if self.value == "gated_identity" else [])
            for name, n in [("d_in", d_in), *outs]:
                if n % self.gate_blocks:
                    raise ValueError(f"gate_blocks = {self.gate_blocks} must divide {name} = {n} (the gate projections' widths)")
        if self.normalizer_form != "sum" and not self.normalizer:
            raise ValueError(f"normalizer_form = {self.normalizer_form!r} needs normalizer = True")
        if self.reset_at_start and self.key not in ("one_minus_decay", "sqrt_one_minus_decay_sq"):
            raise ValueError(f"reset_at_start = True sets the tied key of the first token to 1: needs key 'one_minus_decay' or "
                             f"'sqrt_one_minus_decay_sq', got key = {self.key!r}")
        return self


@dataclass
class _Params:
    """The outputs of the parameter functions on one input (shapes in GeneralForm._params)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gk: torch.Tensor | None  # log α: [B, T, H] (one per head) or [B, T, H, K]; complex for 'lru'
    g: torch.Tensor | None = None  # gate [B, T, d_v]
    z: torch.Tensor | None = None  # outer gate (activated) [B, T, d_in]
    m: torch.Tensor | None = None  # the max-stabilizer m_t [B, T, H] of the exponential input gate
    state: dict = field(default_factory=dict)  # conv / token-shift states after the last token
    q_proj: torch.Tensor | None = None  # x W_Q and x W_K [B, T, H, K] before the feature map (query, key 'proj'; a window reads them)
    k_proj: torch.Tensor | None = None


#: the activations of the gates and feature maps by name (the identities apart: no call)
_IDENTITIES = frozenset({"identity", "none", "linear"})
_ACTS = {"elu1": lambda t: F.elu(t) + 1, "silu": F.silu, "relu": F.relu, "sigmoid": torch.sigmoid, "gelu": F.gelu,
         "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "softmax": lambda t: torch.softmax(t, dim=-1)}


def _act(name: str, x: torch.Tensor) -> torch.Tensor:
    """The activation ``name`` on x; as the feature map φ of f_q, f_k on x [B, T, H, K]: elementwise, or 'softmax' over
    each head's K channels."""
    return x if name in _IDENTITIES else _ACTS[name](x)


def _shift_right(x: torch.Tensor, first: torch.Tensor | None) -> torch.Tensor:
    """[B, T, ...] -> the sequence delayed by one step, ``first`` (or zeros) in front."""
    first = torch.zeros_like(x[:, :1]) if first is None else first.unsqueeze(1).to(x.dtype)
    return first if x.shape[1] == 1 else torch.cat([first, x[:, :-1]], dim=1)


@register("general_form", description="MetaLA's general form (Eqs. 11-15): configurable f_q, f_k, f_v, f_α, f_g; base of the presets below")
class GeneralForm(Mixer):
    """MetaLA's general form S_t = diag(α_t) S_{t-1} + k_tᵀ v_t, o_t = XNorm(concat_h q_t S_t),
    y_t = (o_t ⊙ g_t) W_O (seed 002, Eqs. 11-15), each parameter function chosen by name.

    Maps of phi(x): one per head [B, H, T, T] (LinAttMap, Eq. 18; with a normalizer divided
    by its row sums, with the skip 'head' plus D_h on the diagonal; real part with rotary).
    State per sequence: H·d_k'·(d_v' [+1 with a normalizer]) recurrent floats (×2 when complex;
    rotary pairs the key channels into d_k'/2 complex ones), plus d_in·(conv_size - 1) for
    the conv, d_in for the token shift and H for the max-stabilizer of the exponential input gate.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "H·d_k'·(d_v' [+1]) (+ d_in·(conv-1), + d_in with token shift, + H with the exp input gate)"
    map_unit = "head"
    Config = GeneralFormConfig

    def __init__(self, config: GeneralFormConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, d_in, d_k, d_v, H = c.d_model, c.d_in, c.d_k, c.d_v, c.n_heads
        self.H, self.K, self.V = H, c.head_k, c.head_v
        qk_width = self.K if c.shared_qk else d_k

        # the stream: in-projection (block form), short conv
        self.W_in = nn.Linear(d, 2 * d_in, bias=c.in_proj_bias) if c.expand else None
        self.conv = ShortConv(d_in, c.conv_size, bias=c.conv_bias, activation=None if c.conv_activation == "none" else "silu") if c.conv_size else None
        if c.token_shift and c.ddlerp_rank is None:  # RWKV-4: μ_k, μ_v, μ_r (layer-0 initialization of the RWKV-4 code)
            ramp = torch.arange(d_in, dtype=torch.float32) / d_in
            self.mu_k = nn.Parameter(ramp.clone())
            self.mu_v = nn.Parameter(ramp.clone())
            self.mu_r = nn.Parameter(ramp.sqrt())
        elif c.token_shift:  # RWKV-6's ddlerp (Finch's ddlerp and lora), layer-0 initialization of the official x060 code:
            # μ_x, λ_k, λ_v, λ_w = 1 - i/d; λ_r, λ_g = 1 - (i/d)^0.5; A = 0 (the LoRA starts static), B ~ U(±0.01)
            ramp = torch.arange(d_in, dtype=torch.float32) / d_in
            self.mu_x = nn.Parameter(1 - ramp)
            self.lam_mix = nn.Parameter(torch.stack([1 - ramp.sqrt(), 1 - ramp, 1 - ramp, 1 - ramp.sqrt(), 1 - ramp]))  # r, k, v, g, w
            self.A_mix = nn.Parameter(torch.zeros(d_in, 5 * c.ddlerp_rank))
            self.B_mix = nn.Parameter(torch.empty(5, c.ddlerp_rank, d_in).uniform_(-0.01, 0.01))

        # f_q, f_k, f_v
        self.W_q = nn.Linear(d_in, qk_width, bias=c.bias) if c.query == "proj" else None
        if c.key in ("proj", "exp_proj", "delta_proj"):
            self.W_k = nn.Linear(d_in, qk_width, bias=c.bias and c.key == "proj")
        elif c.key == "sigmoid_proj":
            self.W_k = nn.Linear(d_in, qk_width, bias=c.gate_bias)
        else:
            self.W_k = None
        if c.value == "proj":
            self.W_v = nn.Linear(d_in, d_v, bias=c.bias)
        elif c.value == "gated_identity" and c.gate_blocks:
            self.W_v = BlockDiagonalLinear(d_in, d_v, c.gate_blocks, bias=c.gate_bias)
        elif c.value in ("silu_proj", "gated_identity"):
            self.W_v = nn.Linear(d_in, d_v, bias=c.gate_bias)
        else:
            self.W_v = None
        if c.value == "lru":  # LRU: B = B_re + i B_im ~ N(0, 1/(2 d_in)), C = C_re + i C_im ~ N(0, 1/d_v)
            self.B_re = nn.Parameter(torch.randn(d_v, d_in) / math.sqrt(2 * d_in))
            self.B_im = nn.Parameter(torch.randn(d_v, d_in) / math.sqrt(2 * d_in))

        # f_α
        self._init_decay(c, d_in, d_k, H)

        # xLSTM's exponential input gate, one per head. Gate biases as transformers' xLSTM initializes them: input -10
        # (i_t ≈ e^{-10}: the normalizer starts at its floor), forget linspace(3, 6) over the heads (f ≈ 0.95..0.998);
        # gate weights keep PyTorch's Linear initialization (transformers zeroes them)
        if c.input_gate == "exp":
            self.W_i = nn.Linear(d_in, H, bias=True)
            with torch.no_grad():
                self.W_i.bias.fill_(-10.0)
                if c.decay_bias:
                    self.W_a.bias.copy_(torch.linspace(3.0, 6.0, H))
        # RWKV-4 bonus u (time_first), per key channel; RWKV-6's u (time_faaaa): the layer-0 zigzag ((i+1) mod 3 - 1)/10
        if c.bonus and c.bonus_form == "exp":
            self.u = nn.Parameter(math.log(0.3) + 0.5 * torch.linspace(-1, 1, d_k))
        elif c.bonus:
            self.u = nn.Parameter(((torch.arange(d_k) + 1) % 3 - 1).float() * 0.1)
        # MetaLA self-augmentation weight, initialized to 0 (the official code)
        if c.self_aug:
            self.w_aug = nn.Parameter(torch.zeros(d_k))
        # skip D
        if c.skip == "head":
            self.D = nn.Parameter(torch.ones(H))
        elif c.skip == "input":
            self.D = nn.Parameter(torch.randn(d))
        # XNorm, f_g, W_O
        groups = H if c.norm_per_head else 1
        if c.xnorm == "layernorm":
            self.norm = LayerNorm(d_v, eps=c.norm_eps, groups=groups, affine=c.norm_affine, bias=c.norm_bias)
        elif c.xnorm == "rmsnorm":
            self.norm = RMSNorm(d_v, eps=c.norm_eps, groups=groups, affine=c.norm_affine)
        else:
            self.norm = None
        self.W_g = nn.Linear(d_in, d_v, bias=c.gate_bias) if c.gate != "none" else None
        if c.complex_values:
            self.C_re = nn.Parameter(torch.randn(d, d_v) / math.sqrt(d_v))
            self.C_im = nn.Parameter(torch.randn(d, d_v) / math.sqrt(d_v))
            self.W_o = None
        else:
            self.W_o = nn.Linear(d_v, d, bias=c.bias) if c.out_proj else None

        if c.scale == "inv_sqrt_k":
            self._scale = self.K ** -0.5
        elif c.scale == "none":
            self._scale = 1.0
        else:
            self._scale = float(c.scale)
        # (read by _forward at every call: a plain entry of __dict__, no nn.Module lookup)
        self.__dict__["_step_fusable"] = self._fusable()

    def _init_decay(self, c, d_in, d_k, H):
        kind = c.decay
        if kind == "fixed":  # RWKV-4: log α = -exp(w), w = -5 + 8 (i/(d-1))^0.7 (layer 0 of the RWKV-4 code)
            ramp = torch.arange(d_k, dtype=torch.float32) / max(d_k - 1, 1)
            self.w = nn.Parameter(-5 + 8 * ramp**0.7)
        elif kind == "lru":  # λ = exp(-exp(ν) + i exp(θ)), ring initialization; γ = sqrt(1 - |λ|²)
            u1, u2 = torch.rand(d_k), torch.rand(d_k)
            r2 = u1 * (LRU_R_MAX**2 - LRU_R_MIN**2) + LRU_R_MIN**2
            self.nu_log = nn.Parameter(torch.log(-0.5 * torch.log(r2)))
            self.theta_log = nn.Parameter(torch.log(LRU_MAX_PHASE * u2 + 1e-8))
            self.gamma_log = nn.Parameter(0.5 * torch.log1p(-r2))
        elif kind == "rg_lru" and c.gate_blocks:
            self.W_a = BlockDiagonalLinear(d_in, d_k, c.gate_blocks, bias=c.decay_bias)
        elif kind in ("sigmoid", "reversed_sigmoid", "rg_lru", "exp"):
            self.W_a = nn.Linear(d_in, H if c.decay_per_head else d_k, bias=c.decay_bias)
        elif kind == "low_rank_sigmoid":
            self.W_a = nn.Sequential(nn.Linear(d_in, c.low_rank, bias=False), nn.Linear(c.low_rank, d_k, bias=c.decay_bias))
        elif kind == "lora_exp":  # RWKV-6: d_t = λ_w + tanh(x A_w) B_w; layer-0 init of x060: λ_w = -6 + 5 (i/(d_k-1))^0.7, A_w = 0, B_w ~ U(±0.01)
            ramp = torch.arange(d_k, dtype=torch.float32) / max(d_k - 1, 1)
            self.w0 = nn.Parameter(-6 + 5 * ramp**0.7)
            self.A_w = nn.Parameter(torch.zeros(d_in, c.low_rank))
            self.B_w = nn.Parameter(torch.empty(c.low_rank, d_k).uniform_(-0.01, 0.01))
        elif kind == "delta_A":  # Mamba: Δ_t = softplus(x W_u W_Δ + b_Δ) per head (channel), A = exp(A_log)
            p = c.dt_rank or math.ceil(d_in / 16)
            self.W_u = nn.Linear(d_in, p, bias=False)
            self.W_delta = nn.Linear(p, H, bias=True)
            nn.init.uniform_(self.W_delta.weight, -(p**-0.5), p**-0.5)
            dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            with torch.no_grad():
                self.W_delta.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^{-1}(dt)
            self.A_log = nn.Parameter(torch.log(torch.arange(1, self.K + 1, dtype=torch.float32)).repeat(H, 1))
        if kind == "reversed_sigmoid":
            if c.rs_exponent == "relu":
                self.a = nn.Parameter(torch.tensor(1.0))
            elif c.rs_exponent == "exp":
                self.a_log = nn.Parameter(torch.tensor(0.0))
        if kind == "rg_lru":  # σ(Λ)^c uniform on [0.9, 0.999]
            a = torch.empty(d_k).uniform_(RG_LRU_A_MIN, RG_LRU_A_MAX) ** (1 / c.rg_lru_c)
            self.Lambda = nn.Parameter(torch.log(a / (1 - a)))

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "chunk_size": 8}

    # -- the parameter functions -----------------------------------------------------------

    def _stream(self, x, state, need_state):
        """x [B, T, d] -> (u [B, T, d_in] the stream, z the outer gate branch or None, new states)."""
        c, new = self.config, {}
        z = None
        u = x
        if self.W_in is not None:
            u, z = self.W_in(x).chunk(2, dim=-1)
            z = _act(c.outer_gate, z)
        if self.conv is not None:
            u, conv_state = call_plain(self.conv, u, state.get("conv") if state else None, output_final_state=need_state)
            if need_state:
                new["conv"] = conv_state
        return u, z, new

    def _decay(self, u, k_proj=None):
        """log α_t: [B, T, H] (one per head) or [B, T, H, K] (key-wise); complex for 'lru'. Also Δ_t [B, T, H] for 'delta_A'.
        ``k_proj``: x W_K [B, T, H, K] before the feature map (what 'key_pool' pools)."""
        c = self.config
        B, T, _ = u.shape
        H, K = self.H, self.K
        kind, delta = c.decay, None
        if kind == "none":
            return None, None
        if kind == "fixed_head":  # not learned (RetNet, TransNormer): computed once per device and dtype
            key = f"gamma {c.head_decay} {c.head_decay_rates} {u.device} {compute_dtype(u)}"
            la = self.layer_constant(key, lambda: self._head_log_decay(u)).expand(B, T, H)
        elif kind == "fixed":  # a parameter alone: a layer constant between changes of w
            la = self._fixed_log_decay().expand(B, T, H, K)
        elif kind == "lru":
            la = complex_(-torch.exp(upcast(self.nu_log)), torch.exp(upcast(self.theta_log))).view(H, K).expand(B, T, H, K)
        elif kind in ("sigmoid", "low_rank_sigmoid", "exp"):
            z = upcast(project(self.W_a, u))  # decays in float32 or wider (docs/scale.md)
            z = self._soft_cap(z.view(B, T, H) if c.decay_per_head else z.view(B, T, H, K))
            lb = c.decay_lower_bound
            if kind == "exp":  # xLSTM's exponential forget gate: log f = f̃ (stabilized in _params)
                la = z
            else:
                la = F.logsigmoid(z) if lb == 0 else torch.log(lb + (1 - lb) * torch.sigmoid(z))
        elif kind == "lora_exp":  # RWKV-6 (Finch's data-dependent decay): log w_t = -exp(d_t), d_t = λ_w + tanh(x A_w) B_w, per key channel
            d = upcast(self.w0) + torch.tanh(u @ self.A_w.to(u.dtype)) @ self.B_w.to(u.dtype)
            la = -torch.exp(upcast(d)).view(B, T, H, K)
        elif kind == "reversed_sigmoid":  # DSF eq. (23): σ_rev(z)^a = σ(-z)^a
            z = upcast(project(self.W_a, u)).view(B, T, H, K)
            a = {"relu": lambda: F.relu(self.a), "exp": lambda: torch.exp(self.a_log), "fixed": lambda: 1.0}[c.rs_exponent]()
            la = a * F.logsigmoid(-z)
        elif kind == "key_pool":  # Liger (Lan et al. 2025, §3.2): α_t = σ(Pool(x W_K)), no parameter of its own
            k = upcast(k_proj)
            la = F.logsigmoid(k.mean(-1) if c.decay_per_head else k)
        elif kind == "rg_lru":  # Griffin: log a_t = c r_t log σ(Λ) = -c r_t softplus(-Λ)
            la = torch.sigmoid(upcast(project(self.W_a, u))).view(B, T, H, K) * self._rg_lru_log_a()
        else:  # delta_A, Mamba: log α = -Δ_t A
            delta = F.softplus(upcast(self.W_delta(self.W_u(u))))  # [B, T, H]
            la = -delta.unsqueeze(-1) * torch.exp(upcast(self.A_log))
        if c.tau != 1.0:
            la = la / c.tau
        return la, delta

    def _rg_lru_log_a(self):
        """c log σ(Λ) = -c softplus(-Λ) [H, K] of decay 'rg_lru' (log a_t = r_t times it), in float32 or wider: a layer
        constant between changes of Λ."""
        c = self.config
        return self.layer_constant("rg_lru log a", lambda: -c.rg_lru_c * F.softplus(-upcast(self.Lambda)).view(self.H, self.K),
                                   self.Lambda)

    def _fixed_log_decay(self):
        """log α = -exp(w) [H, K] of decay 'fixed' (RWKV-4), in float32 or wider: a layer constant between changes of w."""
        return self.layer_constant("fixed decay", self._fixed_log_decay_of_w, self.w)

    def _fixed_log_decay_of_w(self):
        """-exp(w) [H, K] computed afresh (what the layer constants keep)."""
        return (-torch.exp(upcast(self.w))).view(self.H, self.K)

    def _head_log_decay(self, u):
        """log γ_h [H] of the fixed per-head decays (RetNet's 1 − 2^(−5−h), lightning attention's, TransNormer's,
        or ``head_decay_rates``), in float32 or wider (docs/scale.md), on u's device."""
        c, H = self.config, self.H
        h = torch.arange(H, dtype=torch.float64, device=u.device)
        if c.head_decay_rates is not None:
            log_gamma = -torch.tensor(c.head_decay_rates, dtype=torch.float64, device=u.device)
        elif c.head_decay == "lightning":
            log_gamma = -(2.0 ** (-8 * (h + 1) / H))
        else:
            log_gamma = torch.log1p(-(2.0 ** (-5 - h))) if c.head_decay == "retnet" else -8 * h / H
        return log_gamma.to(compute_dtype(u))

    def _soft_cap(self, z):
        """xLSTM-7B's gate soft cap: cap·tanh(z/cap) (identity without gate_soft_cap)."""
        cap = self.config.gate_soft_cap
        return z if cap is None else cap * torch.tanh(z / cap)

    def _ddlerp(self, x, prev):
        """Finch's data-dependent token shift (RWKV-6, Peng et al. 2024, §4: ddlerp and lora), for □ = r, k, v, g, w:

            lora_□(y) = λ_□ + tanh(y A_□) B_□,   ddlerp_□(x_t, x_{t-1}) = x_t + (x_{t-1} - x_t) ⊙ lora_□(x_t + (x_{t-1} - x_t) ⊙ μ_x)

        x, prev [B, T, d_in] (prev = x delayed by one step). The five A_□ are stacked in A_mix [d_in, 5·rank]
        (the official code's time_maa_w1), the B_□ in B_mix [5, rank, d_in], the λ_□ in lam_mix [5, d_in].
        Returns the five streams (r, k, v, g, w), each [B, T, d_in]."""
        xx = prev - x
        Bt, T, _ = x.shape
        z = torch.tanh((x + xx * self.mu_x) @ self.A_mix.to(x.dtype)).view(Bt, T, 5, -1)
        lora = torch.einsum("btir,ird->btid", z, self.B_mix.to(x.dtype)) + self.lam_mix
        return (x.unsqueeze(2) + xx.unsqueeze(2) * lora).to(x.dtype).unbind(2)

    def _value(self, u_v):
        """f_v of the real value options on the stream u_v [..., d_in] -> [..., d_v] ('lru', complex, is _params')."""
        kind = self.config.value
        if kind == "proj":
            return project(self.W_v, u_v)
        if kind == "identity":
            return u_v
        if kind == "silu_proj":
            return F.silu(project(self.W_v, u_v))
        return torch.sigmoid(project(self.W_v, u_v)) * u_v  # gated_identity

    def _tied_key(self, la):
        """f_k tied to the decay, from log α key-wise (any leading shape): 1 - α ('one_minus_decay', MetaLA, HGRN) or
        sqrt(1 - α²) ('sqrt_one_minus_decay_sq', the RG-LRU)."""
        return -torch.expm1(la) if self.config.key == "one_minus_decay" else torch.sqrt(-torch.expm1(2 * la))

    def _params(self, x, state, need_state) -> _Params:
        """The parameter functions (Eqs. 11-12) on x [B, T, d]:
        q, k [B, T, H, K]; v [B, T, H, V]; gk (log α) [B, T, H] or [B, T, H, K]; g [B, T, d_v]."""
        c = self.config
        B, T, _ = x.shape
        H, K, V = self.H, self.K, self.V
        u, z, new = self._stream(x, state, need_state)
        u_q = u_k = u_v = u_g = u_w = u
        if c.token_shift:
            prev = _shift_right(u, state.get("x_prev") if state else None)
            if c.ddlerp_rank is None:  # RWKV-4: x_k = μ_k x_t + (1 - μ_k) x_{t-1}, the same for v and the receptance r
                u_k, u_v, u_g = token_mix(prev, u, self.mu_k), token_mix(prev, u, self.mu_v), token_mix(prev, u, self.mu_r)
            else:  # RWKV-6: r, k, v, g and the decay each read their own ddlerp
                u_q, u_k, u_v, u_g, u_w = self._ddlerp(u, prev)
            if need_state:
                new["x_prev"] = u[:, -1]
        qk_heads = 1 if c.shared_qk else H
        q_proj = k_proj = None
        if c.query == "proj":
            q_proj = self.W_q(u_q).view(B, T, qk_heads, K)
            q_proj = q_proj if qk_heads == H else q_proj.expand(B, T, H, K)
        if c.key == "proj":
            k_proj = self.W_k(u_k).view(B, T, qk_heads, K)
            k_proj = k_proj if qk_heads == H else k_proj.expand(B, T, H, K)
        la, delta = self._decay(u_w, k_proj)
        m = li = None
        if c.input_gate == "exp":  # xLSTM: i_t = exp(ĩ_t); the max-stabilizer turns (f_t, i_t) into gates <= 1 (seqmix.ops.stabilizer)
            li_raw = self._soft_cap(upcast(self.W_i(u_k)))  # [B, T, H]
            m_prev = state.get("m") if state else None
            if T == 1 and m_prev is not None:  # a decoding step: the op's one-token form
                la, li, m = max_stabilizer_step(la, li_raw, m_prev.unsqueeze(1).to(la.dtype))
            else:
                la, li, m = max_stabilizer(la, li_raw, m_prev, mode="recurrent" if T == 1 else "parallel",
                                          check_values=False)  # computed here from the checked input
            if need_state:
                new["m"] = m[:, -1]
        # f_q
        if c.query == "proj":
            q = _act(c.feature_map, q_proj)
        else:
            q = u.new_ones(B, T, H, K)
        # f_k
        kind = c.key
        if kind == "proj":
            k = _act(c.feature_map, k_proj)
        elif kind == "one":
            k = u.new_ones(B, T, H, K)
        elif kind in ("one_minus_decay", "sqrt_one_minus_decay_sq"):
            k = self._tied_key(la if la.dim() == 4 else la.unsqueeze(-1).expand(B, T, H, K))
        elif kind == "sigmoid_proj":
            k = torch.sigmoid(self.W_k(u_k)).view(B, T, H, K)
        elif kind == "exp_proj":
            k = torch.exp(self.W_k(u_k)).view(B, T, H, K)
        else:  # delta_proj: Δ_t^h ⊙ x W_B (B_t shared by every head)
            k = delta.unsqueeze(-1) * self.W_k(u_k).view(B, T, qk_heads, K)
        if li is not None:  # the (stabilized) exponential input gate, folded into the key
            k = k * torch.exp(li).unsqueeze(-1)
        if c.reset_at_start and state is None:  # Griffin: position 0 enters unnormalized
            k = torch.cat([torch.ones_like(k[:, :1]), k[:, 1:]], dim=1)
        # f_v
        if c.value != "lru":
            v = self._value(u_v)
        else:  # lru: γ ⊙ (x B), complex
            gamma = torch.exp(self.gamma_log).unsqueeze(-1)
            v = complex_(u_v @ (gamma * self.B_re).t(), u_v @ (gamma * self.B_im).t())
        v = v.reshape(B, T, H, V)
        # f_g
        g = None if self.W_g is None else _act(c.gate, self.W_g(u_g))
        return _Params(q=q, k=k, v=v, gk=la, g=g, z=z, m=m, state=new, q_proj=q_proj, k_proj=k_proj)

    # -- the core (Eqs. 13-14 before XNorm) ----------------------------------------------------

    def _rotary_form(self, P: _Params):
        """q, k, log α as the recurrence takes them: with rotary, channel pairs (2j, 2j+1) become one
        complex channel, q̃ = q_{2j} + i q_{2j+1}, k̃ = k_{2j} - i k_{2j+1}, and the decay gains the
        phase e^{iθ_j}: Re(q̃_t k̃_s e^{i(t-s)θ_j}) is the RoPE score of the pair (TransNormer's and
        RetNet's λe^{jθ}, MetaLA Table A1). xPos multiplies the pair's decay by ζ_j^{1/512}."""
        if not self.config.rotary:
            return P.q, P.k, P.gk
        B, T, H, K = P.q.shape
        q = complex_(P.q[..., 0::2], P.q[..., 1::2])
        k = complex_(P.k[..., 0::2], -P.k[..., 1::2])
        dt = compute_dtype(q.real)  # the phases in float32 or wider
        c = self.config
        theta, zeta = self.layer_constant(f"rotary {K} {c.rotary_base} {c.xpos} {dt} {P.q.device}", lambda: self._rotary_phases(K, dt, P.q.device))
        real = P.gk.unsqueeze(-1) if P.gk is not None else torch.zeros((), dtype=dt, device=P.q.device)
        if zeta is not None:  # xPos's relative factor ζ_j^{(t-s)/512}: a decay per pair
            real = real + zeta
        gk = complex_(real.expand(B, T, H, K // 2), theta.expand(B, T, H, K // 2))
        return q, k, gk

    def _rotary_phases(self, K: int, dt, device):
        """(θ_j = base^(−2j/K), log ζ_j / 512 with xPos else None), j = 0 .. K/2 − 1: the pair phases of the
        rotary form (constants of the layer)."""
        j2 = torch.arange(0, K, 2, dtype=dt, device=device)
        theta = self.config.rotary_base ** (-j2 / K)
        return theta, (torch.log((j2 + 0.4 * K) / (1.4 * K)) / 512 if self.config.xpos else None)

    def _recur(self, q, k, v, gk, S0, mode, need_state, delayed=False):
        """linear_recurrence on [B, T, H, K] inputs. With K == 1 (a vector state per head) the H
        heads run as one head of H·V value channels with value-wise decays (k folded into v, q
        applied to the output): the same numbers, one wide matmul per chunk instead of H thin ones.
        A decoding step (mode "step", T == 1) is the step op on the heads as they are; ``delayed`` (a
        decoding step): the output reads the state before this token's write."""
        c = self.config
        B, T, H, K = q.shape
        V = v.shape[-1]
        if mode == "step" or delayed:  # one token: the step on the heads as they are (nothing to fold)
            o, S = recurrence_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0] if gk is not None else None, None, S0, scale=self._scale,
                                   check_values=False, check_shapes=False, delayed=delayed)
            return o.unsqueeze(1), S
        kw = dict(scale=self._scale, output_final_state=need_state, mode=mode, chunk_size=c.chunk_size, check_values=False)
        if K > 1:
            return linear_recurrence(q, k, v, gk, initial_state=S0, **kw)
        vv = (k * v).reshape(B, T, 1, H * V)
        gv = None
        if gk is not None:
            gv = gk.reshape(B, T, H, 1).expand(B, T, H, V).reshape(B, T, 1, H * V)
        one = torch.ones(B, T, 1, 1, dtype=q.dtype, device=q.device)
        S0f = S0.reshape(B, 1, 1, H * V) if S0 is not None else None
        o, S = linear_recurrence(one, one, vv, None, gv, initial_state=S0f, **kw)
        o = o.reshape(B, T, H, V) * q
        return o, (S.reshape(B, H, 1, V) if S is not None else None)

    def _bonus_term(self, P: _Params):
        """RWKV's current-token term: scale·Σ_i q_i e^{u_i} k_i, one number per head [B, T, H, 1] (q = 1 with query 'one';
        scale·e^u a layer constant between changes of u)."""
        w = self.layer_constant("bonus weight", self._bonus_weight, self.u)
        qk = w * P.k if self.config.query == "one" else P.q * w * P.k
        return qk if self.K == 1 else qk.sum(-1, keepdim=True)

    def _bonus_weight(self):
        """scale·e^u (or scale·u) [H, K]: the bonus weight per key channel with the read's scale."""
        return self._scale * self._bonus_u().view(self.H, self.K)

    def _bonus_u(self):
        """The bonus weight per key channel: e^u (bonus_form 'exp', RWKV-4) or u (bonus_form 'linear', RWKV-5/6)."""
        return torch.exp(self.u) if self.config.bonus_form == "exp" else self.u

    def _core(self, P: _Params, S0, mode, need_state):
        """The core map on P.v: o_t = q_t S_t (Eq. 13-14), or with the bonus q_t S_{t-1} + bonus·v_t,
        normalized by its row sums, plus D_h v_h. Returns (mixed [B, T, H, V], final state)."""
        c = self.config
        q, k, gk = self._rotary_form(P) if c.rotary else (P.q, P.k, P.gk)
        v = P.v
        T = v.shape[1]
        if c.normalizer:
            v = torch.constant_pad_nd(v, (0, 1), 1.0)  # (F.pad without its wrapper) a channel of ones: the last channel accumulates the denominator
        if c.bonus and mode == "step":  # q_t S_{t-1}: the state read before this token's write
            o, S = self._recur(q, k, v, gk, S0, mode, need_state, delayed=True)
            o = o + self._bonus_term(P) * v
        elif c.bonus:
            # q_t S_{t-1}: the recurrence on (k, v, α) delayed by one step, read at T + 1 positions;
            # its first step only decays by 1 and writes 0, so the state read at t is S_{t-1}
            q2, k2, v2 = (torch.cat(p, dim=1) for p in ((q, torch.zeros_like(q[:, :1])), (torch.zeros_like(k[:, :1]), k), (torch.zeros_like(v[:, :1]), v)))
            gk2 = torch.cat([torch.zeros_like(gk[:, :1]), gk], dim=1) if gk is not None else None
            o, S = self._recur(q2, k2, v2, gk2, S0, mode, need_state)
            o = o[:, :T] + self._bonus_term(P) * v
        else:
            o, S = self._recur(q, k, v, gk, S0, mode, need_state)
        if c.rotary:
            o = o.real
        if c.normalizer:
            o = o[..., :-1] / self._eta(o[..., -1:], P.m.unsqueeze(-1) if P.m is not None else None)
        if not o.is_complex():  # back to the projections' dtype (the op may have run in float32/complex64)
            o = o.to(P.v.dtype)
        if c.skip == "head":
            o = o + self.D.view(self.H, 1) * P.v
        return o, S

    def _eta(self, s, m=None):
        """The normalizer η from the row sum s = q_t n_t (of the stabilized state when m is given,
        m broadcasting against s): 'sum' s; 'max_abs' max(|s|, e^{-m}); 'xlstm' max(|s|, e^{-m}) + ε.
        With m = 0 (no exponential input gate) e^{-m} = 1: the paper's max(|n_tᵀ q_t|, 1)."""
        form = self.config.normalizer_form
        if form == "sum":
            return s
        floor = torch.exp(-m).to(s.dtype) if m is not None else torch.ones((), dtype=s.dtype, device=s.device)
        eta = torch.maximum(s.abs(), floor)
        return eta + self.config.normalizer_eps if form == "xlstm" else eta

    def _self_aug(self, P: _Params) -> torch.Tensor:
        """MetaLA Eq. A35: σ_aug((Σ_i q_i w_aug,i k_i) v_t) per head, with the unscaled q (the code)."""
        s = (P.q * self.w_aug.view(self.H, self.K) * P.k).sum(-1, keepdim=True)
        return torch.sigmoid(s * P.v) if self.config.aug_activation == "sigmoid" else s * P.v

    def _readout(self, o, P: _Params, x):
        """Eq. 14-15 after the core: self-augmentation, XNorm, the gates, W_O, the skip on x."""
        c = self.config
        if c.self_aug:
            o = o + self._self_aug(P)
        o = o.flatten(2)
        if self.norm is not None:
            o = self.norm(o)
        if P.g is not None:
            o = o * P.g
        if P.z is not None:
            o = o * P.z
        if c.complex_values:
            y = o.real.to(self.C_re.dtype) @ self.C_re.t() - o.imag.to(self.C_im.dtype) @ self.C_im.t()  # Re(o Cᵀ)
        else:
            o = o.to(P.v.dtype)  # the projections' dtype (decays and keys from them may be wider)
            y = self.W_o(o) if self.W_o is not None else o
        if c.skip == "input":
            y = y + self.D * x
        return y

    def _forward(self, x, *, state, mode, need_state):
        if mode == "step" and self.__dict__["_step_fusable"]:
            out = self._fused_step(x, state)
            if out is not None:  # (None: the mLSTM's first token, which has no stabilizer yet: the general path)
                return out
        P = self._params(x, state, need_state)
        o, S = self._core(P, state.get("S") if state else None, mode, need_state)
        y = self._readout(o, P, x)
        return MixOut(y, {"S": S, **P.state} if need_state else None, values=P.v, mixed=o)

    # -- the fused decoding step ------------------------------------------------------------------

    def _fusable(self) -> bool:
        """Whether :meth:`_fused_step` computes this config's decoding step: a real state (no rotary, LRU or
        complex values), no RWKV-6 ddlerp or self-augmentation, q and k of their own (not shared), a decay that
        reads the stream alone (not Mamba's Δ_t, nor Liger's key pool), and the class's own parameter functions,
        core and readout."""
        c, cls = self.config, type(self)
        return (cls._params is GeneralForm._params and cls._core is GeneralForm._core and cls._readout is GeneralForm._readout
                and not c.rotary and not c.complex_values and c.ddlerp_rank is None
                and not c.self_aug and not c.shared_qk and c.decay not in ("lru", "delta_A", "key_pool")
                and c.key != "delta_proj" and c.value != "lru")

    def _step_constants(self):
        """(log α = -exp(w) / τ [H, K] of decay 'fixed', else None; the bonus weight scale·e^u [H, K] (or scale·u), else
        None): the fused step's layer constants, kept as one (a single stamp check per step)."""
        c = self.config
        params = ((self.w,) if c.decay == "fixed" else ()) + ((self.u,) if c.bonus else ())

        def fixed():
            la = self._fixed_log_decay_of_w()
            return la if c.tau == 1.0 else la / c.tau  # (the temperature, as _decay divides every decay by it)

        return self.layer_constant("step constants", lambda: (fixed() if c.decay == "fixed" else None,
                                                              self._bonus_weight() if c.bonus else None), *params)

    def _fused_step(self, x, state) -> MixOut:
        """One decoding step of a :meth:`_fusable` config in one pass: the parameter functions on the token's
        [B, d] row (laid out [B, H, K] / [B, H, V] as the step op takes them, no [B, T, ...] views), the op's
        :func:`~seqmix.ops.recurrence.fused_step` (the state updated in place inside
        :func:`~seqmix.ops.states_in_place`; with the bonus, the read of S_{t-1} before the write), the bonus, the
        normalizer, the skip and the readout. The same numbers as the general path (:meth:`_params`, :meth:`_core`,
        :meth:`_readout` in mode "step"; tests/test_general_form.py ties them for every fusable preset)."""
        c = self.config
        m_prev = None
        if c.input_gate == "exp":  # the mLSTM: its stabilizer m_{t-1} from the state (none at the first token: the general path)
            m_prev = state.get("m") if state else None
            if m_prev is None:
                return None
        B, H, K, V = x.shape[0], self.H, self.K, self.V
        if self.W_in is None and self.conv is None:
            u, z, new = x.reshape(B, x.shape[-1]), None, {}  # [B, d_in] (a view of the one token)
        else:  # the block form: the in-projection, the outer gate, the conv's step (its state in new["conv"])
            u, z, new = self._stream(x, state, True)
            u = u.reshape(B, u.shape[-1])
        u_k = u_v = u_g = u
        if c.token_shift:  # RWKV-4's static μ (ddlerp is not fusable)
            prev = state.get("x_prev") if state else None
            prev = torch.zeros_like(u) if prev is None else prev.to(u.dtype)
            mu_k, mu_v, mu_r = self.mu_k, self.mu_v, self.mu_r
            if mu_k.dtype == mu_v.dtype == mu_r.dtype == u.dtype:  # (token_mix's lerp, inline: three calls fewer per step)
                u_k, u_v, u_g = torch.lerp(prev, u, mu_k), torch.lerp(prev, u, mu_v), torch.lerp(prev, u, mu_r)
            else:
                u_k, u_v, u_g = token_mix(prev, u, mu_k), token_mix(prev, u, mu_v), token_mix(prev, u, mu_r)
            new["x_prev"] = u
        fixed, bonus_w = self._step_constants() if c.decay == "fixed" or c.bonus else (None, None)
        la = None
        if fixed is not None:  # the step's [B, H, K] of the layer constant (no _decay call)
            la = fixed.expand(B, H, K)
        elif c.decay != "none":  # log α [B, H] (one per head) or [B, H, K], as _decay computes it on the token
            la = self._decay(u.view(B, 1, -1))[0].select(1, 0)
        li = m = None
        if m_prev is not None:  # xLSTM's exponential input gate, stabilized with the forget gate (as _params)
            la, li, m = max_stabilizer_step(la, self._soft_cap(upcast(project(self.W_i, u_k))), m_prev.to(la.dtype))
            new["m"] = m
        fm = c.feature_map if c.feature_map not in _IDENTITIES else None  # (φ = identity: no call)
        kind = c.key
        if kind == "proj":
            k = project(self.W_k, u_k).view(B, H, K)
            if fm is not None:
                k = _act(fm, k)
        elif kind == "exp_proj":
            k = torch.exp(project(self.W_k, u_k)).view(B, H, K)
        elif kind == "sigmoid_proj":
            k = torch.sigmoid(project(self.W_k, u_k)).view(B, H, K)
        elif kind == "one":
            k = u.new_ones(B, H, K)
        else:  # one_minus_decay, sqrt_one_minus_decay_sq: tied to the decay
            k = self._tied_key(la if la.dim() == 3 else la.unsqueeze(-1).expand(B, H, K))
        if c.reset_at_start and state is None:  # Griffin: the first token of a sequence enters unnormalized
            k = torch.ones_like(k)
        if li is not None:  # the stabilized input gate, folded into the key
            k = k * torch.exp(li).unsqueeze(-1)
        if c.query == "proj":
            q = project(self.W_q, u).view(B, H, K)
            if fm is not None:
                q = _act(fm, q)
        else:
            q = u.new_ones(B, H, K)
        v = self._value(u_v).view(B, H, V)
        vn = torch.constant_pad_nd(v, (0, 1), 1.0) if c.normalizer else v  # the ones column: the row sums
        o, S = recurrence_step(q, k, vn, la, None, state.get("S") if state else None, scale=self._scale, check_values=False,
                               check_shapes=False, delayed=c.bonus)
        if c.bonus:  # o_t = q_t S_{t-1} + scale·(Σ_i q_i w_i k_i) v_t
            qk = bonus_w * k if c.query == "one" else q * bonus_w * k
            o = torch.addcmul(o, qk if K == 1 else qk.sum(-1, keepdim=True), vn)
        if c.normalizer:  # the value channels over the last (ones) channel's row sum
            num, s = o.split((V, 1), -1)
            o = num / (s if c.normalizer_form == "sum" else self._eta(s, m.unsqueeze(-1) if m is not None else None))
        o = o.to(v.dtype)
        if c.skip == "head":
            o = o + self.D.view(H, 1) * v
        new["S"] = S
        r = o.view(B, H * V)
        if self.norm is not None:
            r = self.norm(r)
        if self.W_g is not None:
            r = r * _act(c.gate, project(self.W_g, u_g))
        if z is not None:
            r = r * z.reshape(B, -1)
        y = project(self.W_o, r) if self.W_o is not None else r
        if c.skip == "input":
            y = y + self.D * x.reshape(B, -1)
        return MixOut(y.view(B, 1, -1), new, values=lambda: v.unsqueeze(1), mixed=lambda: o.unsqueeze(1))

    # -- the DSF view --------------------------------------------------------------------------

    def _numerator_map(self, P: _Params) -> torch.Tensor:
        """LinAttMap (Eq. 18) [B, H, T, T] before the normalizer (with the bonus: the delayed map plus its diagonal)."""
        q, k, gk = self._rotary_form(P)
        T = q.shape[1]
        if self.config.bonus:
            q2 = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)
            k2 = torch.cat([torch.zeros_like(k[:, :1]), k], dim=1)
            gk2 = torch.cat([torch.zeros_like(gk[:, :1]), gk], dim=1) if gk is not None else None
            A = recurrence_map(q2, k2, gk2, scale=self._scale, check_values=False)[:, :, :T, 1:]
            return A + torch.diag_embed(self._bonus_term(P)[..., 0].transpose(1, 2))
        A = recurrence_map(q, k, gk, scale=self._scale, check_values=False)
        return A.real if self.config.rotary else A

    def phi(self, x):
        """[B, H, T, T]: the map from the values to the core output (LinAttMap, Eq. 18)."""
        self.check_input(x)
        P = self._params(x, None, False)
        A = self._numerator_map(P)
        if self.config.normalizer:
            m = P.m.transpose(1, 2).unsqueeze(-1) if P.m is not None else None  # [B, H, T, 1]
            A = A / self._eta(A.sum(-1, keepdim=True), m)
        if self.config.skip == "head":
            A = A + torch.diag_embed(self.D.view(1, self.H, 1).expand(A.shape[0], self.H, A.shape[-1]).to(A.dtype))
        return A

    def dsf(self, x):
        """The core as a DSF (seed 000 eq. 11): input the values v (heads concatenated,
        [B, T, H·d_v']), output the core output ``mixed``. Λ_t = α_t per key channel; with a
        normalizer η_t: Λ_t = α_t η_{t-1}/η_t, B_t = k_t/η_t (seed 000, 15b); with the bonus:
        C_t = q_t/α_t and D_t = Σ_i q_i (e^{u_i} - 1/α_i) k_i (the current token's weight; exact, but
        it loses about log10(1/α_min) digits of float64 to cancellation for strong decays). With the
        mLSTM normalizers ('max_abs', 'xlstm') or the exponential input gate, η_t depends on q_t and goes
        into C_t = q_t/η_t instead, and the system is the unstabilized one: Λ_t = f_t, B_t = i_t k_t."""
        self.check_input(x)
        c = self.config
        P = self._params(x, None, False)
        q, k, gk = self._rotary_form(P)
        B, T, H, K = q.shape
        V = self.V
        cplx = q.is_complex() or c.complex_values  # (complex values: B and C complex too, so that DSF.evaluate's matmuls match)
        q, k = (t.detach().to(torch.complex128 if cplx else torch.float64) for t in (q, k))
        if gk is None:
            gk = torch.zeros(B, T, H, K, dtype=torch.float64)
        gk = gk.detach()
        gk = (gk.unsqueeze(-1).expand(B, T, H, K) if gk.dim() == 3 else gk).to(torch.complex128 if gk.is_complex() else torch.float64)
        Dh = torch.zeros(B, T, H, dtype=torch.float64)
        if c.bonus:
            u = self.u.detach().double().view(H, K)
            Dh = self._scale * (q * ((torch.exp(u) if c.bonus_form == "exp" else u) - torch.exp(-gk)) * k).sum(-1)
            q = q * torch.exp(-gk)
        if c.normalizer and (c.normalizer_form != "sum" or c.input_gate == "exp"):
            # the mLSTM: η_t = max(|q_t n_t|, 1) (+ ε e^{m_t}) depends on q_t, so 1/η_t goes into C_t; with the
            # exponential input gate the system is the unstabilized one: Λ_t = f_t, B_t = i_t k_t (k = e^{m} k̃)
            A = self._numerator_map(P).detach().double()
            m = P.m.detach().double() if P.m is not None else torch.zeros(B, T, H, dtype=torch.float64)
            eta = self._eta(A.sum(-1).transpose(1, 2), m) * torch.exp(m)  # η in the units of the unstabilized state
            if P.m is not None:
                m_prev = torch.cat([torch.zeros_like(m[:, :1]), m[:, :-1]], dim=1)
                gk = gk + (m - m_prev).unsqueeze(-1)  # log f_t = log f̃'_t + m_t - m_{t-1} (m_{-1} = 0 from an empty state)
                k = k * torch.exp(m).unsqueeze(-1)
            q = q / eta.unsqueeze(-1)
            Dh = Dh / eta
        elif c.normalizer:
            eta = self._numerator_map(P).detach().double().sum(-1).transpose(1, 2)  # [B, T, H]
            log_eta = eta.log()
            log_prev = torch.cat([torch.zeros_like(log_eta[:, :1]), log_eta[:, :-1]], dim=1)
            gk = gk + (log_prev - log_eta).unsqueeze(-1)
            k = k / eta.unsqueeze(-1)
            Dh = Dh / eta
        if c.skip == "head":
            Dh = Dh + self.D.detach().double()
        D = None
        if c.bonus or c.skip == "head":
            D = torch.diag_embed(Dh.unsqueeze(-1).expand(B, T, H, V).reshape(B, T, H * V))
        system = DSF.from_recurrence(q, k, V, gk, scale=self._scale, D=D)
        system.real_output = not c.complex_values
        return system

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        n = self.H * self.K * (self.V + (1 if c.normalizer else 0))
        if c.input_gate == "exp":
            n += self.H  # the stabilizer m
        if c.complex_values:
            n *= 2
        if self.conv is not None:
            n += self.conv.state_size()
        if c.token_shift:
            n += c.d_in
        return n


# ------------------------------------------------------------------------------------------
# the presets: each model of MetaLA Tables 1, A1-A3 (and the DSF paper's qLSTMs) as a config
# ------------------------------------------------------------------------------------------

#: the parameter group each preset documents (MetaLA Table 2); seqmix.analysis.conditions computes it from the config
PRESETS: dict[str, dict] = {}


def _preset(name: str, group: str, description: str, defaults: dict, example: dict | None = None) -> None:
    PRESETS[name] = {"group": group, "defaults": dict(defaults)}
    register_preset(name, GeneralForm, description=f"{description}; group {group}", defaults=defaults, example=example)


_LINRNN = dict(heads=None, query="one")  # d_k = d_v = H = d: a vector state (MetaLA Table A3)

_preset(
    "linformer", "{Q, K}",
    "Linear Transformer (Katharopoulos et al.; MetaLA Table A1): φ = elu+1 on q and k, no decay, the normalizer of Eq. 5",
    dict(heads=1, query="proj", key="proj", value="proj", decay="none", feature_map="elu1", normalizer=True),
)
_preset(
    "retnet", "{Q, K, Λ}",
    "RetNet (Table A1): fixed decay γ_h = 1 - 2^{-5-h} per head with rotary phase e^{iθ}, per-head norm, SiLU gate, d_v = 2d (8d² weights)",
    dict(heads=4, key="proj", value="proj", decay="fixed_head", head_decay="retnet", rotary=True, expand_v=2.0, scale="inv_sqrt_k",
         xnorm="layernorm", gate="silu"),
)
_preset(
    "transnormer", "{Q, K, Λ}",
    "TransNormer(LLM) (Table A1): φ = SiLU on q and k, fixed decay λ_h = exp(-8h/H) with rotary phase, SRMSNorm, linear gate x W_U",
    dict(heads=4, key="proj", value="proj", decay="fixed_head", head_decay="transnormer", rotary=True, feature_map="silu",
         xnorm="rmsnorm", norm_per_head=False, norm_affine=False, gate="linear"),
)
_preset(
    "lightning_attention", "{Q, K, Λ}",
    "MiniMax-01's lightning attention (transformers' MiniMaxLightningAttention): q, k, v = SiLU(x W), a fixed decay exp(-r_h) per "
    "head (ALiBi's slopes r_h = 2^{-8(h+1)/H}, or head_decay_rates), no scale, RMSNorm over all heads, σ output gate",
    dict(heads=4, key="proj", value="silu_proj", decay="fixed_head", head_decay="lightning", feature_map="silu", xnorm="rmsnorm",
         norm_per_head=False, norm_eps=1e-6, gate="sigmoid"),
    example={"heads": 2, "head_decay_rates": (0.3, 0.03)},  # the contract runs the given-rates option (the converter's)
)
_preset(
    "gla", "{Q, K, Λ_t}",
    "GLA (Table A1): α = σ(x W¹ W² + b)^{1/16} (rank 16), d_k = d/2, per-head RMSNorm, SiLU gate with bias",
    dict(heads=4, key="proj", value="proj", decay="low_rank_sigmoid", tau=16.0, low_rank=16, decay_bias=True, expand_k=0.5,
         scale="inv_sqrt_k", xnorm="rmsnorm", gate="silu", gate_bias=True),
)
#: Liger-GLA (Lan et al. 2025, §3.2 and the released LigerGatedLinearAttention): the gate pooled from the key projection
#: (AdaptiveAvgPool1d to the key width: the key itself per key channel) through logsigmoid / 16 (gate_logit_normalizer), φ = softmax
#: over each head's channels on q and k, scale 1, no output gate or norm
LIGER_GLA = dict(heads=4, key="proj", value="proj", decay="key_pool", tau=16.0, feature_map="softmax")
_preset(
    "liger_gla", "{Q, K, Λ_t}",
    "Liger-GLA (Lan et al. 2025, §3.2): GLA with the gate pooled from the key projection, α = σ(Pool(x W_K))^{1/16} (no gate "
    "parameters), φ = softmax over each head's channels on q and k, no output gate or norm",
    LIGER_GLA,
)
_preset(
    "mamba_gf", "{Q, K, Λ_t}",
    "Mamba's S6 in the general form (Table A2): q = x W_C, k = Δ_t ⊙ x W_B, v = x, α = exp(-Δ_t A), D skip; one head per channel, d_k' = N",
    dict(heads=None, d_state=16, shared_qk=True, query="proj", key="delta_proj", value="identity", decay="delta_A", skip="head"),
    example={"heads": None, "d_state": 4},
)
_preset(
    "rwkv4", "{K, Λ}",
    "RWKV-4 as MetaLA Table A3 writes it: k = exp(x W_K), fixed α = exp(-exp(w)), σ receptance gate; the full WKV via RWKV4_FULL",
    dict(_LINRNN, key="exp_proj", value="proj", decay="fixed", gate="sigmoid"),
    example={"heads": None},
)
_preset(
    "hgrn", "{Λ_t}",
    "HGRN (Qin et al. 2023, real form): α = lb + (1-lb)σ(x W_f), input gate tied k = 1 - α, v = SiLU(x W_i), RMSNorm, SiLU gate",
    dict(_LINRNN, key="one_minus_decay", value="silu_proj", decay="sigmoid", xnorm="rmsnorm", norm_per_head=False, gate="silu"),
    example={"heads": None},
)
_preset(
    "rg_lru", "{Λ_t}",
    "Griffin's RG-LRU (Table A3, DSF §3.12): α = σ(Λ)^{c σ(x W_a + b)}, c = 8, k = sqrt(1 - α²), v = σ(x W_x + b) ⊙ x, GeLU gate",
    dict(_LINRNN, key="sqrt_one_minus_decay_sq", value="gated_identity", decay="rg_lru", decay_bias=True, gate="gelu", gate_bias=True),
    example={"heads": None},
)
_preset(
    "lru", "{Λ}",
    "LRU (Orvieto et al., Table A3): complex diagonal λ = exp(-e^ν + i e^θ), v = γ ⊙ x B with γ = sqrt(1 - |λ|²), y = Re(C h) + D ⊙ x",
    dict(_LINRNN, key="one", value="lru", decay="lru", skip="input"),
    example={"heads": None},
)
_preset(
    "qlstm", "{K, Λ_t}",
    "qLSTM in the DSF form (seed 000 eq. 8, 20; no tanh): f = σ(W_f u), i = σ(W_i u), o = σ(W_o u), h_t = f h_{t-1} + i ⊙ W_u u, y = o ⊙ h",
    dict(_LINRNN, key="sigmoid_proj", value="proj", decay="sigmoid", gate="sigmoid", out_proj=False),
    example={"heads": None},
)
_preset(
    "qlstm_rs", "{K, Λ_t}",
    "qLSTM with the reversed-sigmoid transition (seed 000 eq. 23): f = σ(-W_f u)^a, a learned (relu(a) as the released code)",
    dict(_LINRNN, key="sigmoid_proj", value="proj", decay="reversed_sigmoid", rs_exponent="relu", gate="sigmoid", out_proj=False),
    example={"heads": None},
)
_QLSTM_BLOCK = dict(_LINRNN, expand=2, outer_gate="gelu", conv_size=4, conv_bias=True, key="sigmoid_proj", value="identity",
                    decay_bias=True, gate="sigmoid", gate_bias=True)
_preset(
    "qlstm_block", "{K, Λ_t}",
    "the qLSTM block of the DSF paper's experiments (dsf note §5.1): 2x in-projection, short conv k=4, gates from the conv output, GELU outer gate",
    dict(_QLSTM_BLOCK, decay="sigmoid"),
    example={"heads": None},
)
_preset(
    "qlstm_rs_block", "{K, Λ_t}",
    "the qLSTM block with the reversed-sigmoid transition σ(-f)^relu(a) (the released dsf-mqar code)",
    dict(_QLSTM_BLOCK, decay="reversed_sigmoid", rs_exponent="relu"),
    example={"heads": None},
)
_preset(
    "metala", "{Q, Λ_t}",
    "MetaLA (seed 002 §5, official code): k = 1 - α, α = σ(x W_α)^{1/16}, d_k = d/2, self-augmentation, short conv 4 + SiLU, "
    "SiLU gate with bias, per-head LayerNorm without affine; 4d² weights",
    dict(heads=4, expand_k=0.5, query="proj", key="one_minus_decay", value="proj", decay="sigmoid", tau=16.0, decay_bias=False,
         conv_size=4, conv_bias=False, conv_activation="silu", self_aug=True, aug_activation="sigmoid", scale="inv_sqrt_k",
         xnorm="layernorm", norm_per_head=True, norm_affine=False, norm_eps=1e-5, gate="silu", gate_bias=True),
)

_preset(
    "mlstm", "{Q, K, Λ_t}",
    "xLSTM's mLSTM layer (Beck et al. 2024; transformers' xLSTMLayer): C_t = f_t C_{t-1} + i_t k_t v_tᵀ, n_t = f_t n_{t-1} + i_t k_t, "
    "f = σ(f̃), i = exp(ĩ) per head (soft cap 15, max-stabilizer), h̃_t = C_t q_t / (max(|n_tᵀ q_t|, 1) + ε e^{m_t}), per-head LayerNorm, "
    "σ output gate; d_k = d/2",
    dict(heads=4, expand_k=0.5, query="proj", key="proj", value="proj", decay="sigmoid", decay_per_head=True, decay_bias=True,
         input_gate="exp", gate_soft_cap=15.0, normalizer=True, normalizer_form="xlstm", normalizer_eps=1e-6, scale="inv_sqrt_k",
         xnorm="layernorm", norm_per_head=True, norm_affine=True, norm_bias=False, norm_eps=1e-6, gate="sigmoid", gate_bias=False),
)
_preset(
    "rg_lru_block", "{Λ_t}",
    "Griffin's recurrent block (RecurrentGemmaRecurrentBlock): x = W_x u + b, y = GeLU_tanh(W_y u + b), conv 4 with bias, RG-LRU "
    "(c = 8, first token unnormalized), out = W_o(h ⊙ y) + b",
    dict(_LINRNN, expand=1, in_proj_bias=True, outer_gate="gelu_tanh", conv_size=4, conv_bias=True, conv_activation="none",
         key="sqrt_one_minus_decay_sq", value="gated_identity", decay="rg_lru", decay_bias=True, gate="none", gate_bias=True, bias=True,
         reset_at_start=True),
    example={"heads": None, "gate_blocks": 2},  # (the contract runs RecurrentGemma's block-diagonal gates; rg_lru: dense)
)
_preset(
    "rwkv6", "{Q, K, Λ_t}",
    "RWKV-6 Finch (Peng et al. 2024, 'Eagle and Finch'): ddlerp token shift (LoRA rank 32), w_t = exp(-exp(λ + tanh(x A) B)) per key channel "
    "(LoRA rank 64), bonus o_t = r_t (S_{t-1} + diag(u) k_tᵀ v_t), head size 64, GroupNorm per head, SiLU gate",
    dict(head_size=64, query="proj", key="proj", value="proj", decay="lora_exp", low_rank=64, bonus=True, bonus_form="linear",
         token_shift=True, ddlerp_rank=32, scale="none", xnorm="layernorm", norm_per_head=True, norm_affine=True, norm_eps=6.4e-4,
         gate="silu"),
    example={"head_size": 8},
)
_preset(
    "hgrn2", "{Q, Λ_t}",
    "HGRN2 (Qin et al. 2024, §3): S_t = diag(f_t) S_{t-1} + (1 - f_t)ᵀ i_t, f_t = lb + (1-lb)σ(x W_f), y_t = q_t S_t with "
    "q = SiLU(x W_q) (the output gate), i = x W_i; expand ratio (head size) 128, RMSNorm over d, W_O",
    dict(head_size=128, expand_k=1.0, query="proj", feature_map="silu", key="one_minus_decay", value="proj", decay="sigmoid",
         decay_lower_bound=0.0, scale="none", xnorm="rmsnorm", norm_per_head=False, norm_affine=True, gate="none"),
    example={"head_size": 8},
)

#: RWKV-6 where fla's RWKV6Attention differs from the official x060 code and the paper's GroupNorm: eps 1e-5 (x060:
#: 1e-5·head_size_divisor² = 6.4e-4). fla's layer also differs in its LoRA structure and initialization (not options here).
RWKV6_FLA = dict(norm_eps=1e-5)
#: HGRN2 with fla's q scale d_k'^{-1/2} (its gla kernels' default; the paper has none: it cancels in the RMSNorm up to eps)
HGRN2_FLA = dict(scale="inv_sqrt_k")

#: the mLSTM cell as the xLSTM paper writes it where transformers' xLSTM differs: the normalizer
#: max(|n_tᵀ q_t|, 1) without transformers' ε e^{m_t}, and no soft cap on the gate pre-activations
MLSTM_PAPER = dict(normalizer_form="max_abs", gate_soft_cap=None)
#: the paper's other forget gate, f_t = exp(f̃_t) (kept <= 1 in the stored state by the max-stabilizer)
MLSTM_EXP_FORGET = dict(decay="exp")

#: MetaLA as the paper writes it where the official code differs (metala note §4.7): no query scale,
#: no SiLU after the conv, no gate bias (Eq. A33), XNorm = LayerNorm over d_v. The conv kernel of the
#: paper's MQAR runs is 2 (METALA_MQAR); σ_aug stays sigmoid (Eq. A35; Eq. A38 omits it: aug_activation="none").
METALA_PAPER = dict(scale="none", conv_activation="none", gate_bias=False, norm_per_head=False, norm_affine=True)
#: MetaLA's MQAR setting (Table A7): H = 2, d_k = d_v = d, conv kernel 2
METALA_MQAR = dict(heads=2, expand_k=1.0, conv_size=2)
#: the ablations of MetaLA Table 8. "with_key": an explicit key x W_K (d -> d_k, no bias) in place of
#: 1 - α (the paper does not specify the design; this is GLA's key with MetaLA's full-rank decay).
METALA_ABLATIONS = {
    "no_self_aug": dict(self_aug=False),
    "no_conv": dict(conv_size=None),
    "with_key": dict(key="proj"),
}
#: RWKV-4 in full (Peng et al. 2023): the current-token bonus u, token shift and the WKV denominator
RWKV4_FULL = dict(bonus=True, token_shift=True, normalizer=True)


# ------------------------------------------------------------------------------------------
# the mapping between Mamba's S6 parameters and mamba_gf
# ------------------------------------------------------------------------------------------

#: mamba_gf parameter <- S6 (Mamba / zoology naming): x_proj = [W_u; W_B; W_C] stacked as [dt_rank, N, N] rows
S6_NAMES = {"x_proj": "x_proj.weight", "dt_proj.weight": "dt_proj.weight", "dt_proj.bias": "dt_proj.bias",
            "A_log": "A_log", "D": "D", "out_proj.weight": "out_proj.weight", "out_proj.bias": "out_proj.bias"}


def mamba_gf_state_from_s6(s6_state: dict, *, d_state: int, dt_rank: int, names: dict | None = None) -> dict:
    """The state dict of a ``mamba_gf`` mixer that computes what an S6 mixer computes.

    S6 (seed 000 eq. 4, Mamba's selective scan with expand 1, no conv, no gate):
    Δ_t = softplus(dt_proj(x_proj_Δ(x))), B_t = x_proj_B(x), C_t = x_proj_C(x), A = -exp(A_log),
    h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t, y_t = out_proj(C_t h_t + D x_t). In mamba_gf:

        W_u      <- x_proj.weight[:dt_rank]                 (d -> p, the Δ low rank)
        W_delta  <- dt_proj.weight, dt_proj.bias            (p -> d, b_Δ)
        W_k      <- x_proj.weight[dt_rank:dt_rank + N]      (W_B: k_t = Δ_t ⊙ x W_B)
        W_q      <- x_proj.weight[dt_rank + N:]             (W_C: q_t = x W_C)
        A_log    <- A_log [d, N]                           (α_t = exp(-Δ_t exp(A_log)))
        D        <- D [d]                                  (skip 'head': o += D ⊙ v, v = x)
        W_o      <- out_proj.weight (and bias if present)

    ``names`` maps the S6 names above to the keys of ``s6_state`` (default :data:`S6_NAMES`,
    Mamba's and zoology's). Build the mixer with ``build_mixer("mamba_gf", d_model=d,
    d_state=N, dt_rank=p)`` and ``load_state_dict`` the result.
    """
    n = {**S6_NAMES, **(names or {})}
    W = s6_state[n["x_proj"]]
    if W.shape[0] != dt_rank + 2 * d_state:
        raise ValueError(
            f"mamba_gf_state_from_s6: '{n['x_proj']}' must have dt_rank + 2·d_state = {dt_rank + 2 * d_state} rows, got {tuple(W.shape)}"
        )
    out = {
        "W_u.weight": W[:dt_rank],
        "W_k.weight": W[dt_rank : dt_rank + d_state],
        "W_q.weight": W[dt_rank + d_state :],
        "W_delta.weight": s6_state[n["dt_proj.weight"]],
        "W_delta.bias": s6_state[n["dt_proj.bias"]],
        "A_log": s6_state[n["A_log"]],
        "D": s6_state[n["D"]],
        "W_o.weight": s6_state[n["out_proj.weight"]],
    }
    if n["out_proj.bias"] in s6_state and s6_state[n["out_proj.bias"]] is not None:
        out["W_o.bias"] = s6_state[n["out_proj.bias"]]
    return {key: val.detach().clone() for key, val in out.items()}


# ------------------------------------------------------------------------------------------
# Gated Slot Attention: two gated linear attentions joined by a softmax over slots
# ------------------------------------------------------------------------------------------


class GSAConfig(ExpandedWidths, MixerConfig):
    """Gated Slot Attention (Zhang et al. 2024, "Gated Slot Attention for Efficient Linear-Time Sequence
    Modeling", NeurIPS; its code is flash-linear-attention's GatedSlotAttention layer)."""

    heads: int = Field(4, gt=0, description="H (the paper: 4)")
    expand_k: float = Field(1.0, gt=0, description="d_k = expand_k·d, the width of q and k over all heads")
    expand_v: float = Field(1.0, gt=0, description="d_v = expand_v·d, the width of v over all heads")
    num_slots: int = Field(64, gt=0, description="m, memory slots per head (the paper: 64; fla's layer defaults to d_k')")
    tau: float = Field(8.0, gt=0, description="damping τ of the slot forget gate α_t = σ(x W_α)^{1/τ} (the paper: 8; fla's gate_logit_normalizer)")
    feature_map: Literal["silu", "relu", "identity"] = Field("silu", description="φ on q and k: q = φ(x W_q), k = φ(x W_k) (Swish in the paper)")
    value_act: Literal["silu", "identity"] = Field("silu", description="v = act(x W_v) (Swish in the paper)")
    scale: Literal["none", "inv_sqrt_k"] | float = Field(
        "none", description="scale of the slot logits q_t K̃_tᵀ: 'none' (1; fla's layer), 'inv_sqrt_k' d_k'^{-1/2} (fla's op default) or a number"
    )
    output_act: Literal["silu", "none"] = Field("silu", description="activation on the core output before the norm (fla's layer: SiLU, RMSNorm, W_O)")
    xnorm: Literal["rmsnorm", "none"] = Field("rmsnorm", description="norm of the output (RMSNorm over d_v, or per head)")
    norm_per_head: bool = Field(False, description="the norm per head (GroupNorm-like) instead of over all d_v")
    norm_affine: bool = Field(True, description="the norm with a learned weight")
    norm_eps: float = Field(1e-5, gt=0, description="norm epsilon")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode (both passes)")
    # -- ABC (Peng et al. 2022), the predecessor: its slot gate, output gate and positions ------------------
    slot_gate: Literal["sigmoid", "lse", "mamba2"] = Field(
        "sigmoid", description="how the slots are written and forgotten: 'sigmoid' GSA's α_t = σ(x W_α)^{1/τ}, written with 1 − α_t; "
        "'mamba2' one rate per head for every slot, log α_t = −A_h softplus(x W_a + b_Δ) (Raven), written with 1 − α_t; "
        "'lse' ABC's running log-sum-exp z_t of the slot logits x W_α (clamped to ±slot_clamp): written with exp(s_t − z_t), "
        "α_t = exp(z_{t−1} − z_t) (seqmix.ops.lse_gate; z carried in the cache)",
    )
    slot_clamp: float = Field(32.0, gt=0, description="'lse': the slot logits are clamped to [−slot_clamp, slot_clamp] (fla's ABC: 32)")
    output_gate: bool = Field(False, description="y = W_O(norm(o) ⊙ SiLU(x W_g)) (ABC's gated RMSNorm; output_act then 'none')")
    rope: bool = Field(False, description="rotary positions on q and k at their absolute positions (ABC's use_rope), in every mode and in decoding")
    rope_theta: float = Field(10000.0, gt=1, description="RoPE base")
    # -- Raven: routed slots ------------------------------------------------------------------------------
    slot_router: int | None = Field(
        None, gt=0, description="Raven's router: each token writes (and decays) only its top slot_router slots by σ(x W_r), "
        "log α_t ← w_t ⊙ log α_t with w_t the renormalized router weights (0 off the top k: those slots keep their content); "
        "None: every slot",
    )
    qk_norm: bool = Field(False, description="RMSNorm on q and k per head after the feature map (Raven)")
    # -- Cyclic Flow Attention: slots that index relative time ---------------------------------------------
    slots: Literal["gated", "cyclic"] = Field(
        "gated", description="'gated': each slot written by its gate (slot_gate) and read by a softmax over the slots (GSA, ABC, "
        "Raven); 'cyclic': CyFA's relative-time slots (seqmix.ops.cyclic_clock): written by β_t a(λ_t), the Fourier atom at a "
        "learned clock λ_t = λ_{t−1} + σ(x W_δ + b_δ) (λ carried in the cache), read by a softmax over the m − 1 relative "
        "times (rotate by λ_t, a learned table, softmax, back); m even, the decay slot_gate's ('mamba2' in CyFA)",
    )
    conv_size: int | None = Field(None, ge=1, description="a short causal conv (no activation, no bias) on x W_q, x W_k, x W_v before the "
                                  "feature maps (CyFA: 4); None: none")
    gate_act: Literal["silu", "sigmoid"] = Field("silu", description="output_gate's activation: SiLU (ABC) or σ (CyFA)")
    gate_rank: int | Literal["head"] | None = Field(
        None, description="output_gate's projection through rank r: x W_g¹ W_g² + b (CyFA: r = d_v', 'head'); None: x W_g"
    )

    @model_validator(mode="after")
    def _check(self):
        self._check_widths()
        if self.slots == "cyclic":
            if self.num_slots < 4 or self.num_slots % 2:
                raise ValueError(f"slots = 'cyclic' needs an even num_slots >= 4 (pairs of Fourier coordinates), got {self.num_slots}")
            if self.slot_gate == "lse" or self.slot_router is not None:
                raise ValueError("slots = 'cyclic' takes slot_gate 'sigmoid' or 'mamba2' and no slot_router (the clock writes every slot)")
        if self.gate_rank is not None and not self.output_gate:
            raise ValueError(f"gate_rank = {self.gate_rank!r} is the output gate's rank: needs output_gate = True")
        if self.slot_router is not None and self.slot_router > self.num_slots:
            raise ValueError(f"slot_router = {self.slot_router} must be <= num_slots = {self.num_slots}")
        if self.slot_router is not None and self.slot_gate == "lse":
            raise ValueError("slot_router takes slot_gate 'sigmoid' or 'mamba2' (the log-sum-exp gate writes every slot)")
        for name, width in (("d_k", self.d_k), ("d_v", self.d_v)):
            if width % self.heads:
                raise ValueError(f"{name} = {width} must be divisible by heads = {self.heads}")
        if not isinstance(self.scale, str) and not self.scale > 0:
            raise ValueError(f"scale = {self.scale} must be > 0 (or 'none', 'inv_sqrt_k')")
        if self.rope and (self.d_k // self.heads) % 2:
            raise ValueError(f"rope = True needs an even d_k' = d_k / heads, got {self.d_k // self.heads}")
        return self


@dataclass
class _GSAParams:
    q: torch.Tensor  # [B, T, H, K] (float32 or wider)
    k: torch.Tensor  # [B, T, H, K] (float32 or wider)
    v: torch.Tensor  # [B, T, H, V] (the projections' dtype)
    la: torch.Tensor  # log α_t [B, T, H, M] (float32 or wider)
    s: torch.Tensor  # the slot write weights [B, T, H, M]: 1 - α_t (GSA), exp(κ_t − z_t) (ABC) or β_t a(λ_t) (CyFA)
    state: dict = field(default_factory=dict)  # ABC: "z" [B, H, M], "pos"; CyFA: the clock "lam" [B, H]; the conv states
    lam: torch.Tensor | None = None  # CyFA's clock λ_t [B, T, H] (float32 or wider)
    la_head: torch.Tensor | None = None  # log α_t [B, T, H] where one decay per head is shared by every slot (the passes' fast path)


@register("gsa", description="Gated Slot Attention (Zhang et al. 2024): two gated linear attentions over m slots joined by a softmax")
class GatedSlotAttention(Mixer):
    """Gated Slot Attention (GSA; Zhang et al. 2024, §3). Per head, m slots hold a key memory and a
    value memory, both written with the slot gate α_t = σ(x_t W_α)^{1/τ} ∈ (0, 1)^m:

        K̃_t = diag(α_t) K̃_{t-1} + (1 - α_t)ᵀ k_t        ∈ R^{m×d_k'}     (the key memory)
        Ṽ_t = diag(α_t) Ṽ_{t-1} + (1 - α_t)ᵀ v_t        ∈ R^{m×d_v'}     (the value memory)
        o_t = softmax(scale · q_t K̃_tᵀ) Ṽ_t             ∈ R^{1×d_v'}

    with q, k = Swish(x W_q), Swish(x W_k), v = Swish(x W_v), then y = W_O RMSNorm(SiLU(o)) (fla's layer).
    Each memory is a gated linear attention (GLA) over the slots, so the forward is two passes of
    ``linear_recurrence``: pass 1 with query q, key k, "values" s_t = 1 - α_t and a value-wise
    (per-slot) log-decay log α_t gives the slot logits z_t = q_t K̃_tᵀ; pass 2 with query
    p_t = softmax(scale·z_t), key s_t, value v_t and a key-wise log-decay log α_t gives o_t. The first
    pass never reads v, so the passes run one after the other over the whole sequence in every
    mode: ``recurrent``, ``chunk`` and ``parallel`` are the op's modes for both passes, and step
    decoding carries both slot memories (the cache holds "Sk" = K̃ᵀ [B, H, d_k', m] and
    "Sv" = Ṽ [B, H, m, d_v']: H·m·(d_k' + d_v') floats per sequence, no conv, no position).

    The DSF view. GSA is a composition of two linear systems with a softmax between them, so the map
    x → o is not one LTV system in any input: the softmax makes the second system's readout a
    nonlinear function of the first system's output. But the first system never sees v, and given
    its readout p_t the second is exactly linear in v. So, as for the mLSTM's η_t and normalized
    attention's η, the DSF of GSA (values → core output) is the second system, with an
    input-dependent C_t:

        dsf(x):       Λ_t = diag(α_t) per slot (diagonal, data-dependent, shared by the d_v' value channels),
                      B_t = (1 - α_t) ⊗ I (the input gate tied to the forget gate, as HGRN2 and MetaLA),
                      C_t = p_t ⊗ I with p_t = softmax(scale · q_t K̃_tᵀ): the first system's readout
        phi(x):       [B, H, T, T], Φ[t, s] = Σ_m p_{t,m} (Π_{r=s+1}^{t} α_{r,m}) (1 - α_{s,m})  (rows are convex
                      combinations of the softmax weights: Σ_s Φ[t, s] ≤ 1)
        slot_dsf(x):  the first system: input s_t = 1 - α_t (the slot write weights), output the logits z_t;
                      Λ_t = diag(α_t) per slot (value-wise), B_t = k_t ⊗ I_m, C_t = scale · q_t ⊗ I_m.

    Neither system alone is the mixer, and their composition is not a DSF; the model is "a DSF whose
    readout C_t is computed by another DSF". ``finite_state`` is True: the values' map is finite-state.

    ``slots='cyclic'`` (Cyclic Flow Attention, the ``cyclic_flow_attention`` preset): the same two passes
    with one decay per head, the write weights s_t = β_t a(λ_t) (signed: the Fourier atom of a learned clock,
    ``seqmix.ops.clock_atom``) and, between the passes, p_t = rot(−λ_t) Tᵀ softmax(T rot(λ_t) z_t) in place
    of softmax(z_t) (``seqmix.ops.cyclic_readout``). The DSF view is unchanged in form: Λ_t = α_t (one per
    head), B_t = s_t ⊗ I, C_t = p_t ⊗ I; Φ's rows are no longer convex combinations (s and p are signed),
    and Φ[t, s] depends on the clock only through λ_t − λ_s.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "H·m·(d_k' + d_v') (both slot memories; + H for the clock, + the convs)"
    map_unit = "head"
    Config = GSAConfig

    def __init__(self, config: GSAConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, H = c.d_model, c.heads
        self.H, self.K, self.V, self.M = H, c.d_k // H, c.d_v // H, c.num_slots
        self.W_q = nn.Linear(d, c.d_k, bias=False)
        self.W_k = nn.Linear(d, c.d_k, bias=False)
        self.W_v = nn.Linear(d, c.d_v, bias=False)
        # the slot forget gate W_α (ABC: the slot logits); 'mamba2' decays by W_a instead
        self.W_f = nn.Linear(d, H * self.M, bias=False) if c.slot_gate != "mamba2" else None
        if c.output_gate and c.gate_rank is not None:  # CyFA: a low-rank gate, x W_g¹ W_g² + b
            r = self.V if c.gate_rank == "head" else c.gate_rank
            self.W_g = nn.Sequential(nn.Linear(d, r, bias=False), nn.Linear(r, c.d_v, bias=True))
        else:
            self.W_g = nn.Linear(d, c.d_v, bias=False) if c.output_gate else None
        if c.conv_size:
            self.conv_q = ShortConv(c.d_k, c.conv_size, bias=False)
            self.conv_k = ShortConv(c.d_k, c.conv_size, bias=False)
            self.conv_v = ShortConv(c.d_v, c.conv_size, bias=False)
        if c.slots == "cyclic":  # CyFA: the clock's rate δ, the write strength β and the readout table (identity at init)
            self.W_delta = nn.Linear(d, H, bias=True)
            self.W_beta = nn.Linear(d, H, bias=True)
            self.readout = nn.Parameter(torch.eye(self.M - 1).expand(H, -1, -1).clone())
        if c.slot_gate == "mamba2":  # Raven: one decay rate per head (Mamba-2's), shared by the slots
            self.W_a = nn.Linear(d, H, bias=False)
            self.A_log = nn.Parameter(torch.empty(H).uniform_(1.0, 16.0).log())
            dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.W_router = nn.Linear(d, H * self.M, bias=False) if c.slot_router else None
        if c.qk_norm:
            self.q_norm, self.k_norm = RMSNorm(self.K, eps=c.norm_eps), RMSNorm(self.K, eps=c.norm_eps)
        self.norm = RMSNorm(c.d_v, eps=c.norm_eps, groups=H if c.norm_per_head else 1, affine=c.norm_affine) if c.xnorm == "rmsnorm" else None
        self.W_o = nn.Linear(c.d_v, d, bias=False)
        if c.scale == "inv_sqrt_k":
            self._scale = self.K ** -0.5
        elif c.scale == "none":
            self._scale = 1.0
        else:
            self._scale = float(c.scale)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "num_slots": 4, "chunk_size": 8}

    def _params(self, x, state=None, need_state=False) -> _GSAParams:
        c = self.config
        B, T, _ = x.shape
        H, K, V, M = self.H, self.K, self.V, self.M
        if c.conv_size:
            q, k, v, new = short_conv_qkv(self, x, state, need_state)
        else:
            q, k, v, new = self.W_q(x), self.W_k(x), self.W_v(x), {}
        q = upcast(_act(c.feature_map, q)).view(B, T, H, K)  # the logits pass runs in float32 or wider
        k = upcast(_act(c.feature_map, k)).view(B, T, H, K)
        v = _act(c.value_act, v).view(B, T, H, V)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if c.rope:
            pos0 = state["pos"] if state else 0
            pos = torch.arange(pos0, pos0 + T, device=x.device)
            q, k = rotary(q, pos, theta=c.rope_theta), rotary(k, pos, theta=c.rope_theta)
            new["pos"] = pos0 + T
        if c.slot_gate == "lse":  # ABC: write exp(κ − z_t), forget exp(z_{t−1} − z_t)
            logits = upcast(self.W_f(x)).view(B, T, H, M).clamp(-c.slot_clamp, c.slot_clamp)
            s, la, new["z"] = lse_gate(logits, state["z"] if state else None)
            return _GSAParams(q=q, k=k, v=v, la=la, s=s, state=new)
        if c.slot_gate == "mamba2":
            la = (-self.A_log.exp() * F.softplus(upcast(self.W_a(x)) + self.dt_bias)).unsqueeze(-1).expand(B, T, H, M)
        else:
            la = F.logsigmoid(upcast(self.W_f(x))).view(B, T, H, M) / c.tau  # log α_t <= 0, float32 or wider
        if c.slot_router:  # Raven: only the routed slots decay and are written, each by its router weight
            r = torch.sigmoid(linear_f32(self.W_router, x)).view(B, T, H, M)  # float32: a flipped choice is no rounding error
            top, idx = torch.topk(r, c.slot_router, dim=-1)
            la = la * torch.zeros_like(r).scatter(-1, idx, top / (top.sum(-1, keepdim=True) + 1e-9))
        if c.slots == "cyclic":  # CyFA: written by β_t a(λ_t); the clock's projection reads x detached (as CyFA's layer)
            delta = torch.sigmoid(linear_f32(self.W_delta, x.detach()))  # [B, T, H], float32: the clock accumulates
            lam = delta.cumsum(1)
            if state and "lam" in state:
                lam = lam + state["lam"].unsqueeze(1).to(lam.dtype)
            new["lam"] = lam[:, -1]
            s = torch.sigmoid(upcast(self.W_beta(x))).unsqueeze(-1) * clock_atom(lam, M).to(la.dtype)
            la_head = la[..., 0] if c.slot_gate == "mamba2" else None
            return _GSAParams(q=q, k=k, v=v, la=la, s=s, state=new, lam=lam, la_head=la_head)
        return _GSAParams(q=q, k=k, v=v, la=la, s=-torch.expm1(la), state=new)

    def _slot_weights(self, P: _GSAParams, Sk0, mode, need_state):
        """Pass 1: z_t = scale · q_t K̃_tᵀ over the slots, then p_t = softmax(z_t) (CyFA: the cyclic readout).
        Returns (p [B, T, H, M], K̃ᵀ)."""
        # a decay shared by the slots is one per head, on the key side of both passes: the op's scalar fast path
        gk, gv = (P.la_head, None) if P.la_head is not None else (None, P.la)
        z, Sk = linear_recurrence(P.q, P.k, P.s, gk, gv, scale=self._scale, initial_state=Sk0, output_final_state=need_state,
                                  mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        if P.lam is not None:
            return cyclic_readout(z, P.lam, self.readout), Sk
        return torch.softmax(z, dim=-1), Sk

    def _forward(self, x, *, state, mode, need_state):
        P = self._params(x, state, need_state)
        p, Sk = self._slot_weights(P, state.get("Sk") if state else None, mode, need_state)
        o, Sv = linear_recurrence(p, P.s, P.v, P.la_head if P.la_head is not None else P.la, scale=1.0, initial_state=state.get("Sv") if state else None,
                                  output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        o = o.to(P.v.dtype)
        y = o.flatten(2)
        if P.lam is not None:  # CyFA: o·(m − 1) before the norm (keeps small readouts above the norm's ε)
            y = y * (self.M - 1)
        if self.config.output_act == "silu":
            y = F.silu(y)
        if self.norm is not None:
            y = self.norm(y)
        if self.W_g is not None:
            y = y * _act(self.config.gate_act, self.W_g(x))
        y = self.W_o(y.to(P.v.dtype))
        return MixOut(y, {"Sk": Sk, "Sv": Sv, **P.state} if need_state else None, values=P.v, mixed=o)

    # -- the DSF view --------------------------------------------------------------------------

    def _slot_readout(self, x):
        self.check_input(x)
        P = self._params(x)
        p, _ = self._slot_weights(P, None, self.reference_mode, False)
        return P, p

    def phi(self, x):
        """[B, H, T, T]: the second system's map from v to o, given the slot readout weights p_t."""
        P, p = self._slot_readout(x)
        return recurrence_map(p, P.s, P.la, check_values=False)

    def dsf(self, x):
        """The second system (input v, heads concatenated [B, T, H·d_v']; output o): Λ_t = α_t per slot,
        B_t = (1 - α_t) ⊗ I, C_t = p_t ⊗ I with p_t the softmax of the first system's readout."""
        P, p = self._slot_readout(x)
        return DSF.from_recurrence(p.detach(), P.s.detach(), self.V, P.la.detach())

    def slot_dsf(self, x):
        """The first system (input s_t = 1 - α_t, [B, T, H·m]; output the slot logits z_t = scale·q_t K̃_tᵀ,
        [B, T, H·m]): Λ_t = α_t per slot (value-wise), B_t = k_t ⊗ I_m, C_t = scale · q_t ⊗ I_m."""
        self.check_input(x)
        P = self._params(x)
        return DSF.from_recurrence(P.q.detach(), P.k.detach(), self.M, gv=P.la.detach(), scale=self._scale)

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        size = self.H * self.M * (self.K + self.V + (1 if c.slot_gate == "lse" else 0))
        if c.slots == "cyclic":
            size += self.H  # the clock λ
        if c.conv_size:
            size += (2 * c.d_k + c.d_v) * (c.conv_size - 1)
        return size


#: ABC (Peng et al. 2022, "ABC: Attention with Bounded-memory Control"; fla's ABCAttention): GSA's two passes with
#: the slots written by exp(s_t − z_t) and forgotten by exp(z_{t−1} − z_t), z_t the running log-sum-exp of the slot
#: logits; plain q, k, v projections with RoPE, scale d_k'^{-1/2}, a per-head RMSNorm gated by SiLU(x W_g)
ABC_FLA = dict(slot_gate="lse", expand_k=0.5, feature_map="identity", value_act="identity", scale="inv_sqrt_k", output_act="none",
               output_gate=True, norm_per_head=True, rope=True)
register_preset(
    "abc", GatedSlotAttention,
    description="ABC (Peng et al. 2022): bounded-memory slots written by a running softmax exp(s_t − z_t), decayed by exp(z_{t−1} − z_t)",
    defaults=ABC_FLA,
)


#: Raven (fla's Raven layer): GSA's two passes with routed slots — each token decays and writes only its top-k slots
#: (σ router, renormalized weights), one Mamba-2 rate per head, Swish q, k (RMS-normed per head) and v, scale 1
RAVEN_FLA = dict(slot_gate="mamba2", slot_router=32, qk_norm=True, feature_map="silu", value_act="silu", scale="none")
register_preset(
    "raven", GatedSlotAttention,
    description="Raven (fla): gated slot attention whose tokens write only their top-k routed slots (σ router), Mamba-2 decay per head",
    defaults=RAVEN_FLA, example={"num_slots": 4, "slot_router": 2},
)


#: Cyclic Flow Attention (CyFA; fla's CyclicFlowAttention layer and its naive_recurrent_cyfa): GSA's two passes over
#: m = 128 relative-time slots written by β_t a(λ_t) at a learned clock and read by the cyclic readout; one Mamba-2 decay
#: per head; q, k, v through short convs (no activation), q and k RMS-normed per head, scale d_k'^{-1/2}; the output
#: o·(m − 1), a per-head RMSNorm gated by σ(x W_g¹ W_g² + b) (rank d_v'). Where seqmix's parameters differ from fla's layer
#: (a value the forward does not see at init): the norm's weight is per head (fla: one shared by the heads) and A is
#: initialized in (1, 16) as Raven's (fla: (0, 16)).
CYFA_FLA = dict(slots="cyclic", slot_gate="mamba2", num_slots=128, feature_map="identity", value_act="identity", scale="inv_sqrt_k",
                qk_norm=True, conv_size=4, output_act="none", output_gate=True, gate_act="sigmoid", gate_rank="head", norm_per_head=True)
register_preset(
    "cyclic_flow_attention", GatedSlotAttention,
    description="Cyclic Flow Attention (CyFA): slots of relative time written at a learned clock, read by a softmax over relative times",
    defaults=CYFA_FLA, example={"num_slots": 6},
)


# ------------------------------------------------------------------------------------------
# LightNet: a gated linear attention whose decay and key come from one running log-sum-exp
# ------------------------------------------------------------------------------------------


class LightNetConfig(MixerConfig):
    """LightNet (Qin et al. 2024, "You Only Scan Once: Efficient Multi-dimension Sequential Modeling with
    LightNet"; its code is flash-linear-attention's LightNetAttention layer)."""

    head_size: int = Field(128, gt=0, description="d_k' = d_v' per head (fla's expand_ratio: 128); H = d_model / head_size, one head when d_model <= head_size")
    gate_rank: int = Field(128, gt=0, description="rank of the output gate's projection x W_g¹ W_g² (fla's gate_low_rank_dim: 128)")
    norm_eps: float = Field(1e-5, gt=0, description="ε of the RMSNorm on the core output")
    chunk_size: int | None = Field(None, gt=0, description="chunk length of the chunk mode (None: the op picks it)")

    @model_validator(mode="after")
    def _check(self):
        if self.d_model > self.head_size and self.d_model % self.head_size:
            raise ValueError(f"head_size = {self.head_size} must divide d_model = {self.d_model} (or be >= it: one head)")
        return self


@register("lightnet", description="LightNet (Qin et al. 2024): k_t = exp(x_t − z_t), α_t = exp(z_{t−1} − z_t), z_t = logcumsumexp of the key logits")
class LightNet(Mixer):
    """LightNet (Qin et al. 2024, §3; fla's LightNetAttention). Per head and key channel i, the key logits
    κ_t = x_t W_k feed one running log-sum-exp z_t = log Σ_{s<=t} exp(κ_s) (the "additive" decay of the
    paper, carried in the cache), which sets both the key and the decay:

        k_t = exp(κ_t − z_t),   α_t = exp(z_{t−1} − z_t)  (α_0 = 1; z_{-1} = −∞ from an empty state)
        S_t = diag(α_t) S_{t−1} + k_tᵀ v_t,   o_t = q_t S_t / sqrt(d_k'),   q_t = SiLU(x_t W_q)
        y_t = W_o (RMSNorm(o_t) ⊙ SiLU(x_t W_g¹ W_g²))

    so S_t = Σ_{s<=t} exp(κ_s − z_t) v_s: per key channel, a softmax over the whole prefix of the values
    (the weights of each channel sum to 1). It is a gated linear attention (GLA) with a key-wise decay
    tied to the key: ``linear_recurrence`` with q, k and the log-decay z_{t−1} − z_t <= 0, in every
    mode. The cache holds S [B, H, d_k', d_v'] and z_T [B, H, d_k'].

    DSF (eq. 11): Λ_t = diag(α_t) per key channel (shared by the d_v' value channels), B_t = I ⊗ k_t,
    C_t = I ⊗ q_tᵀ/sqrt(d_k'): ``dsf(x)`` is ``DSF.from_recurrence``. Φ[t, s] = Σ_i q_{t,i} exp(κ_{s,i} −
    z_{t,i}) / sqrt(d_k') per head (``phi``). ``values`` = v, ``mixed`` = o before the norm and the gate.
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "H·d_k'·(d_v' + 1) (S and the running log-sum-exp z)"
    map_unit = "head"
    Config = LightNetConfig

    def __init__(self, config: LightNetConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d = c.d_model
        self.H = max(1, d // c.head_size)
        self.K = self.V = d // self.H
        self.W_q = nn.Linear(d, d, bias=False)
        self.W_k = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(d, d, bias=False)
        self.W_g = nn.Sequential(nn.Linear(d, c.gate_rank, bias=False), nn.Linear(c.gate_rank, d, bias=False))
        self.norm = RMSNorm(d, eps=c.norm_eps)
        self.W_o = nn.Linear(d, d, bias=False)
        self._scale = self.K ** -0.5

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "head_size": 8, "gate_rank": 4, "chunk_size": 8}

    def _params(self, x, z0=None):
        """q, k [B, T, H, K] (float32 or wider), v [B, T, H, V], the log-decay g = z_{t−1} − z_t [B, T, H, K]
        and z_T [B, H, K]. ``z0``: the running log-sum-exp before x (None: an empty state)."""
        B, T, _ = x.shape
        H, K = self.H, self.K
        q = upcast(F.silu(self.W_q(x))).view(B, T, H, K)
        k, g, zT = lse_gate(self.W_k(x).view(B, T, H, K), z0)  # k_t = exp(κ_t − z_t), g_t = z_{t−1} − z_t
        v = self.W_v(x).view(B, T, H, self.V)
        return q, k, v, g, zT

    def _forward(self, x, *, state, mode, need_state):
        q, k, v, g, zT = self._params(x, state["z"] if state else None)
        o, S = linear_recurrence(q, k, v, g, scale=self._scale, initial_state=state["S"] if state else None,
                                 output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        o = o.to(v.dtype)
        y = self.norm(o.flatten(2)) * F.silu(self.W_g(x))
        return MixOut(self.W_o(y), {"S": S, "z": zT} if need_state else None, values=v, mixed=o)

    def phi(self, x):
        """[B, H, T, T]: Φ[t, s] = Σ_i q_{t,i} exp(κ_{s,i} − z_{t,i}) / sqrt(d_k')."""
        self.check_input(x)
        q, k, _, g, _ = self._params(x)
        return recurrence_map(q, k, g, scale=self._scale, check_values=False)

    def dsf(self, x):
        """Λ_t = diag(exp(z_{t−1} − z_t)) per key channel, B_t = I ⊗ k_t, C_t = I ⊗ q_tᵀ/sqrt(d_k') (input v,
        heads concatenated [B, T, H·d_v']; output o)."""
        self.check_input(x)
        q, k, _, g, _ = self._params(x)
        return DSF.from_recurrence(q.detach(), k.detach(), self.V, g.detach(), scale=self._scale)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.H * self.K * (self.V + 1)


# ------------------------------------------------------------------------------------------
# Rodimus: one gated linear attention head over a wide stream, with a temperature on its gate
# ------------------------------------------------------------------------------------------


class RodimusConfig(MixerConfig):
    """Rodimus (He et al. 2025, "Rodimus*: Breaking the Accuracy-Efficiency Trade-Off with Efficient Attentions",
    ICLR; flash-linear-attention's RodimusAttention layer)."""

    expand: float = Field(2.0, gt=0, description="d_inner = expand·d_model rounded up to a multiple of 8 (fla: 2)")
    mem_size: int = Field(64, gt=0, description="n, the state's key width (fla's expand_ratio: 64); the state is n × d_inner")
    input_gate_rank: int | None = Field(None, gt=0, description="rank of the value gate σ(u W_i¹ W_i² + b) (None: fla's max(d_model/64, 16))")
    conv_size: int | None = Field(4, ge=1, description="kernel of the short conv (with bias, SiLU) on the stream u; None: no conv")
    norm_eps: float = Field(1e-5, gt=0, description="ε of the gated RMSNorm on the output")
    k_norm_eps: float = Field(1e-12, gt=0, description="ε of the L2 norm of the key")
    chunk_size: int | None = Field(None, gt=0, description="chunk length of the chunk mode (None: the op picks it)")

    @property
    def d_inner(self) -> int:
        n = int(self.d_model * self.expand)
        return max(8, -(-n // 8) * 8)


@register("rodimus", description="Rodimus (He et al. 2025): one GLA head of n keys over a 2d stream, gate g^τ in and exp(−gτ) decay, gated norm")
class Rodimus(Mixer):
    """Rodimus (He et al. 2025, §3; fla's RodimusAttention). From x [B, T, d]: the stream u = x W_up and the
    output gate z = x W_gate (both of width d_inner = 2d), s = SiLU(ShortConv(u)), and per token

        q = s W_q,   k̂ = s W_k   (n = mem_size wide),   v = σ(u W_i¹ W_i² + b_i) ⊙ u           (the value gate)
        g = softplus(s W_g + b_g),   τ = σ(s W_τ + b_τ)           (per key channel; τ is the gate's temperature)
        k = g^τ ⊙ k̂/‖k̂‖,   log α = −g·τ                        (the decay and the input gate from one g)
        S_t = diag(α_t) S_{t−1} + k_tᵀ v_t,   o_t = q_t S_t / sqrt(n)        (one head: S ∈ R^{n × d_inner})
        y_t = W_down RMSNorm((o_t + w ⊙ s_t) ⊙ SiLU(z_t))          (w: a learned skip on s; the gate before the norm)

    It is a gated linear attention with a single head whose state is n × d_inner (n = 64 keys over a
    stream twice the model's width), one call into ``linear_recurrence`` with the key-wise log-decay. Its
    DSF (values v → core output o, before the skip): Λ_t = diag(α_t) per key channel, B_t = I ⊗ k_t,
    C_t = I ⊗ q_tᵀ / sqrt(n); ``phi`` is [B, 1, T, T] (one head). The cache holds S [B, 1, n, d_inner] and
    the conv state [B, d_inner, conv − 1].
    """

    family = "linear_attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "n·d_inner + d_inner·(conv−1)"
    map_unit = "head"
    Config = RodimusConfig

    def __init__(self, config: RodimusConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, D, n = c.d_model, c.d_inner, c.mem_size
        self.K, self.V = n, D
        r = c.input_gate_rank or max(d // 64, 16)
        self.W_up = nn.Linear(d, D, bias=False)
        self.W_gate = nn.Linear(d, D, bias=False)
        self.conv = ShortConv(D, c.conv_size, bias=True, activation="silu") if c.conv_size else None
        self.W_q = nn.Linear(D, n, bias=False)
        self.W_k = nn.Linear(D, n, bias=False)
        self.W_g = nn.Linear(D, n, bias=True)
        self.W_tau = nn.Linear(D, n, bias=True)
        self.W_i = nn.Sequential(nn.Linear(D, r, bias=False), nn.Linear(r, D, bias=True))
        self.skip = nn.Parameter(torch.ones(D))
        self.norm = RMSNorm(D, eps=c.norm_eps)
        self.W_down = nn.Linear(D, d, bias=False)
        self._scale = n ** -0.5

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "mem_size": 8, "input_gate_rank": 4, "chunk_size": 8}

    def _params(self, x, state, need_state):
        """q, k [B, T, 1, n] (float32 or wider), v [B, T, 1, d_inner], the log-decay [B, T, 1, n], the stream s,
        the output gate z and the new conv state."""
        c = self.config
        u, z = self.W_up(x), self.W_gate(x)
        new = {}
        if self.conv is not None:
            s, conv_state = self.conv(u, state.get("conv") if state else None, output_final_state=need_state)
            if need_state:
                new["conv"] = conv_state
        else:
            s = u
        q = upcast(self.W_q(s))
        g = F.softplus(upcast(self.W_g(s)))
        tau = torch.sigmoid(upcast(self.W_tau(s)))
        k = l2_normalize(upcast(self.W_k(s)), c.k_norm_eps) * g.pow(tau)
        v = torch.sigmoid(self.W_i(u)) * u
        return q.unsqueeze(2), k.unsqueeze(2), v.unsqueeze(2), (-g * tau).unsqueeze(2), s, z, new

    def _forward(self, x, *, state, mode, need_state):
        q, k, v, g, s, z, new = self._params(x, state, need_state)
        o, S = linear_recurrence(q, k, v, g, scale=self._scale, initial_state=state["S"] if state else None,
                                 output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size, check_values=False)
        o = o.to(v.dtype)
        y = self.norm(o[:, :, 0] + s * self.skip.to(s.dtype), gate=z)
        return MixOut(self.W_down(y), {"S": S, **new} if need_state else None, values=v, mixed=o)

    def phi(self, x):
        """[B, 1, T, T]: Φ[t, s] = Σ_i q_{t,i} (Π_{r=s+1}^{t} α_{r,i}) k_{s,i} / sqrt(n)."""
        self.check_input(x)
        q, k, _, g, *_ = self._params(x, None, False)
        return recurrence_map(q, k, g, scale=self._scale, check_values=False)

    def dsf(self, x):
        """Λ_t = diag(α_t) per key channel, B_t = I ⊗ k_t, C_t = I ⊗ q_tᵀ/sqrt(n) (input v [B, T, d_inner]; output o)."""
        self.check_input(x)
        q, k, _, g, *_ = self._params(x, None, False)
        return DSF.from_recurrence(q.detach(), k.detach(), self.V, g.detach(), scale=self._scale)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.K * self.V + (self.conv.state_size() if self.conv is not None else 0)
