"""The general form (seqmix.mixers.linear_attention): option variants through the contract
checks, each preset against a direct transcription of its paper's equations, the
equivalences between presets, parameter counts, bad input."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.linear_attention import (
    METALA_ABLATIONS, METALA_MQAR, METALA_PAPER, MLSTM_EXP_FORGET, MLSTM_PAPER, PRESETS, RWKV4_FULL, S6_NAMES, GeneralForm,
    mamba_gf_state_from_s6,
)
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, assert_fused_step_agrees, max_abs, rel_err

B = 2


def build(name, dtype=torch.float64, seed=0, **overrides):
    entry = seqmix.mixer_entry(name)
    torch.manual_seed(seed)
    return seqmix.build_mixer(name, **{**entry.example_config(), **overrides}).to(dtype).eval()


def randn(*shape, dtype=torch.float64, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def perturb(m, scale=0.3, seed=5):
    """Random nonzero values for parameters initialized to constants (w_aug = 0, D = 1, a = 1),
    so that a test sees them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("w_aug", "D", "a", "a_log", "u", "mu_k", "mu_v", "mu_r"):
            p = getattr(m, name, None)
            if isinstance(p, torch.nn.Parameter):
                p.add_(scale * torch.rand(p.shape, generator=g, dtype=p.dtype))
    return m


# ------------------------------------------------------------------------------------------
# option variants through the checks of the contract suite
# ------------------------------------------------------------------------------------------

VARIANTS = {
    "rwkv4_full": ("rwkv4", RWKV4_FULL),
    "rwkv4_bonus": ("rwkv4", dict(bonus=True)),
    "rwkv4_bonus_multihead": ("general_form", dict(heads=2, bonus=True, decay="fixed", feature_map="elu1", normalizer=True, token_shift=True)),
    "relu_features": ("general_form", dict(feature_map="relu")),
    "metala_paper": ("metala", METALA_PAPER),
    "metala_mqar": ("metala", METALA_MQAR),
    "metala_no_self_aug": ("metala", METALA_ABLATIONS["no_self_aug"]),
    "metala_no_conv": ("metala", METALA_ABLATIONS["no_conv"]),
    "metala_with_key": ("metala", METALA_ABLATIONS["with_key"]),
    "metala_linear_aug": ("metala", dict(aug_activation="none")),
    "glru": ("hgrn", dict(key="sigmoid_proj", gate_bias=True, decay_bias=True)),
    "hgrn_lower_bound": ("hgrn", dict(decay_lower_bound=0.5)),
    "qlstm_rs_exp": ("qlstm_rs", dict(rs_exponent="exp")),
    "qlstm_rs_fixed": ("qlstm_rs_block", dict(rs_exponent="fixed")),
    "retnet_no_rotary": ("retnet", dict(rotary=False)),
    "retnet_xpos": ("retnet", dict(xpos=True)),
    "lru_wider_state": ("lru", dict(expand_v=2.0)),
    "rotary_no_decay": ("general_form", dict(decay="none", rotary=True, key="proj")),
    "mamba_block": ("mamba_gf", dict(expand=2, outer_gate="silu", conv_size=4, conv_bias=True, conv_activation="silu")),
    "linformer_decayed": ("linformer", dict(decay="sigmoid", tau=4.0)),
    "transnormer_per_head": ("transnormer", dict(norm_per_head=True)),
    "gla_scale_number": ("gla", dict(scale=0.3, xnorm="layernorm")),
    "mlstm_paper": ("mlstm", MLSTM_PAPER),
    "mlstm_exp_forget": ("mlstm", MLSTM_EXP_FORGET),
    "mlstm_sum_normalizer": ("mlstm", dict(normalizer_form="sum", feature_map="elu1")),
    "linformer_max_abs": ("linformer", dict(normalizer_form="max_abs")),
    "head_decay_xlstm_normalizer": ("general_form", dict(decay_per_head=True, decay_bias=True, gate_soft_cap=5.0, normalizer=True,
                                                        normalizer_form="xlstm")),
    "rg_lru_block_no_reset": ("rg_lru_block", dict(reset_at_start=False)),
    "hgrn_reset": ("hgrn", dict(reset_at_start=True, expand=2, in_proj_bias=True, outer_gate="gelu_tanh")),
}


def _grads(m, x, mode):
    m.mode = mode
    x = x.clone().requires_grad_(True)
    y = m(x)
    w = randn(*y.shape, dtype=y.dtype, seed=7)
    params = [p for p in m.parameters() if p.requires_grad]
    return y.detach(), torch.autograd.grad((y * w).sum(), [x, *params], allow_unused=True)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_passes_contract_checks(variant):
    name, overrides = VARIANTS[variant]
    m = perturb(build(name, **overrides))
    if m.config.bonus:  # the bonus DSF has C = q/α: keep 1/α moderate so that float64 holds 1e-9 (see GeneralForm.dsf)
        with torch.no_grad():
            m.w.clamp_(max=1.0)
    c = m.config.chunk_size
    for T in (2 * c, 2 * c + 3):
        x = randn(B, T, m.d_model)
        y_ref, g_ref = _grads(m, x, "recurrent")
        for mode in ("chunk", "parallel"):
            y, g = _grads(m, x, mode)
            assert max_abs(y, y_ref) < F64_ATOL, (variant, mode, T)
            for a, b in zip(g, g_ref):
                assert (a is None) == (b is None)
                if a is not None:
                    assert max_abs(a, b) < F64_ATOL, (variant, mode, T)
    # float32: modes agree relatively
    m32 = perturb(build(name, torch.float32, **overrides))
    x32 = randn(B, 2 * c + 3, m.d_model, dtype=torch.float32)
    y_ref, _ = _grads(m32, x32, "recurrent")
    for mode in ("chunk", "parallel"):
        assert rel_err(_grads(m32, x32, mode)[0], y_ref) < F32_RTOL
    # decoding step by step, split and carry, state size; phi and dsf reproduce the core
    assert_decodes_splits_and_maps(m, randn(B, 2 * c + 3, m.d_model), variant)


def test_every_option_value_is_exercised():
    """The variants and presets together use every named option of the vocabulary."""
    cfgs = [seqmix.mixer_entry(n).config(**seqmix.mixer_entry(n).example_config()) for n in PRESETS] + [
        seqmix.mixer_entry(n).config(**{**seqmix.mixer_entry(n).example_config(), **o}) for n, o in VARIANTS.values()
    ]
    fields = GeneralForm.Config.model_fields
    for fname in ("query", "key", "value", "decay", "gate", "feature_map", "xnorm", "skip", "rs_exponent", "head_decay", "aug_activation",
                  "normalizer_form", "input_gate", "outer_gate"):
        allowed = set(get_args(fields[fname].annotation))
        used = {getattr(c, fname) for c in cfgs}
        assert allowed <= used, f"{fname}: {sorted(allowed - used)} never tested"


# ------------------------------------------------------------------------------------------
# each preset against its paper's equations, written out directly (loops over time, float64)
# ------------------------------------------------------------------------------------------


def conv_ref(x, weight, bias=None):
    """Causal depthwise conv: y[t, c] = Σ_i w[c, i] x[t - (W-1) + i, c] (+ bias)."""
    W = weight.shape[1]
    xp = F.pad(x, (0, 0, W - 1, 0))
    y = sum(weight[:, i] * xp[:, i : i + x.shape[1]] for i in range(W))
    return y + bias if bias is not None else y


def lin(layer, x):
    return x @ layer.weight.t() + (layer.bias if layer.bias is not None else 0)


def test_metala_matches_official_pseudocode():
    """metala note §4.6 / §9: conv+SiLU, q, log α = logsigmoid(z)/16, k = 1 - α, S update, scale
    d_k'^-1/2, self-aug sigmoid((Σ q w_aug k) v) with unscaled q, LayerNorm per head, SiLU(g) ⊙ o, W_O."""
    m = perturb(build("metala", d_model=16, heads=2))
    x = randn(B, 11, 16)
    H, K, V = 2, 4, 8
    xc = F.silu(conv_ref(x, m.conv.weight))
    q, z, v, g = lin(m.W_q, xc), lin(m.W_a, xc), lin(m.W_v, xc), lin(m.W_g, xc)
    la = F.logsigmoid(z) / 16
    a, b = la.exp(), 1 - la.exp()
    S = torch.zeros(B, H, K, V, dtype=x.dtype)
    outs = []
    for t in range(x.shape[1]):
        qt, at, bt, vt = q[:, t].view(B, H, K), a[:, t].view(B, H, K), b[:, t].view(B, H, K), v[:, t].view(B, H, V)
        S = at[..., None] * S + bt[..., None] * vt[:, :, None, :]
        o = torch.einsum("bhk,bhkv->bhv", qt * K**-0.5, S)
        s = (qt * m.w_aug.view(H, K) * bt).sum(-1, keepdim=True)
        o = o + torch.sigmoid(s * vt)
        outs.append(F.layer_norm(o, (V,), eps=1e-5).reshape(B, H * V))
    o = torch.stack(outs, 1)
    y_ref = lin(m.W_o, F.silu(g) * o)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL


def test_gla_matches_its_equations():
    m = build("gla", d_model=16, heads=2)
    x = randn(B, 13, 16)
    H, K, V = 2, 4, 8
    q, k, v = lin(m.W_q, x), lin(m.W_k, x), lin(m.W_v, x)
    a = torch.sigmoid(lin(m.W_a[1], lin(m.W_a[0], x))) ** (1 / 16)
    S = torch.zeros(B, H, K, V, dtype=x.dtype)
    outs = []
    for t in range(13):
        S = a[:, t].view(B, H, K, 1) * S + k[:, t].view(B, H, K, 1) * v[:, t].view(B, H, 1, V)
        o = torch.einsum("bhk,bhkv->bhv", q[:, t].view(B, H, K) * K**-0.5, S)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5)
        outs.append(o.reshape(B, H * V) * m.norm.weight)
    y_ref = lin(m.W_o, torch.stack(outs, 1) * F.silu(lin(m.W_g, x)))
    assert max_abs(m(x), y_ref) < F64_ATOL


def test_retnet_rotary_is_rope():
    """The complex decay γ_h e^{iθ} on channel pairs gives RetNet's retention with RoPE on q and k
    (interleaved pairs, θ_j = 10000^{-2j/d_k'}): o_t = Σ_s γ^{t-s} (R_t q_t)·(R_s k_s) v_s / sqrt(d_k')."""
    m = build("retnet", d_model=16, heads=2)
    T, H, K, V = 12, 2, 8, 16
    x = randn(B, T, 16)
    q, k = lin(m.W_q, x).view(B, T, H, K), lin(m.W_k, x).view(B, T, H, K)
    v = lin(m.W_v, x).view(B, T, H, V)
    theta = 10000 ** (-torch.arange(0, K, 2, dtype=x.dtype) / K)
    ang = torch.arange(T, dtype=x.dtype)[:, None] * theta  # [T, K/2]
    cos, sin = ang.cos()[None, :, None], ang.sin()[None, :, None]

    def rope(t):
        t1, t2 = t[..., 0::2], t[..., 1::2]
        return torch.stack([t1 * cos - t2 * sin, t1 * sin + t2 * cos], -1).flatten(-2)

    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=x.dtype))
    n = torch.arange(T, dtype=x.dtype)
    decay = gamma[:, None, None] ** (n[:, None] - n[None, :]).clamp(min=0) * torch.ones(T, T, dtype=x.dtype).tril()
    scores = torch.einsum("bthk,bshk->bhts", rope(q), rope(k)) * K**-0.5 * decay
    assert max_abs(m.phi(x), scores) < F64_ATOL
    o = torch.einsum("bhts,bshv->bthv", scores, v)
    o = F.layer_norm(o, (V,), eps=1e-5) * m.norm.weight.view(H, V) + m.norm.bias.view(H, V)
    y_ref = lin(m.W_o, o.reshape(B, T, H * V) * F.silu(lin(m.W_g, x)))
    assert max_abs(m(x), y_ref) < F64_ATOL
    # xPos: q_t ζ^{t/512}, k_s ζ^{-s/512} per pair (torchscale's XPOS), the same scores times ζ^{(t-s)/512}
    m.config.xpos = True
    zeta = (torch.arange(0, K, 2, dtype=x.dtype) + 0.4 * K) / (1.4 * K)
    up = zeta.repeat_interleave(2) ** (n[:, None, None] / 512)  # [T, 1, K]
    scores_x = torch.einsum("bthk,bshk->bhts", rope(q) * up, rope(k) / up) * K**-0.5 * decay
    assert max_abs(m.phi(x), scores_x) < F64_ATOL


def test_rwkv4_full_matches_wkv():
    """RWKV-4 (Peng et al. 2023, eq. 14-16): token shift, then
    wkv_t = (Σ_{i<t} e^{-(t-1-i)w + k_i} v_i + e^{u + k_t} v_t) / (Σ_{i<t} e^{-(t-1-i)w + k_i} + e^{u + k_t}),
    y = W_o(σ(r) ⊙ wkv). Written as the direct O(T²) sum."""
    m = perturb(build("rwkv4", **RWKV4_FULL))
    T, d = 10, 16
    x = randn(B, T, d)
    prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
    xk, xv, xr = (m.mu_k * x + (1 - m.mu_k) * prev), (m.mu_v * x + (1 - m.mu_v) * prev), (m.mu_r * x + (1 - m.mu_r) * prev)
    k, v, r = lin(m.W_k, xk), lin(m.W_v, xv), lin(m.W_g, xr)
    w = torch.exp(m.w)  # per-step decay e^{-w}
    wkv = torch.zeros_like(v)
    for t in range(T):
        num = torch.exp(m.u + k[:, t]) * v[:, t]
        den = torch.exp(m.u + k[:, t])
        for i in range(t):
            e = torch.exp(-(t - 1 - i) * w + k[:, i])
            num, den = num + e * v[:, i], den + e
        wkv[:, t] = num / den
    y_ref = lin(m.W_o, torch.sigmoid(r) * wkv)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL


def test_rwkv4_paper_form_is_the_general_form():
    """MetaLA Table A3: q = 1, k = exp(x W_K), α = exp(-exp(w)), g = σ(x W_r), no bonus, no denominator."""
    m = build("rwkv4")
    T = 9
    x = randn(B, T, 16)
    k, v = torch.exp(lin(m.W_k, x)), lin(m.W_v, x)
    alpha = torch.exp(-torch.exp(m.w))
    h, outs = torch.zeros(B, 16, dtype=x.dtype), []
    for t in range(T):
        h = alpha * h + k[:, t] * v[:, t]
        outs.append(h)
    y_ref = lin(m.W_o, torch.stack(outs, 1) * torch.sigmoid(lin(m.W_g, x)))
    assert max_abs(m(x), y_ref) < F64_ATOL


def test_mamba_gf_matches_selective_scan():
    """S6 (seed 000 eq. 4, Mamba per channel c and state r): h[c,r] = exp(-Δ_c A_cr) h[c,r] + Δ_c B_r x_c,
    y_c = Σ_r C_r h[c,r] + D_c x_c, then out_proj."""
    m = perturb(build("mamba_gf", d_model=16, d_state=4))
    T = 10
    x = randn(B, T, 16)
    delta = F.softplus(lin(m.W_delta, lin(m.W_u, x)))  # [B, T, d]
    Bt, Ct, A = lin(m.W_k, x), lin(m.W_q, x), torch.exp(m.A_log)  # [B, T, N], [B, T, N], [d, N]
    h, ys = torch.zeros(B, 16, 4, dtype=x.dtype), []
    for t in range(T):
        h = torch.exp(-delta[:, t, :, None] * A) * h + delta[:, t, :, None] * Bt[:, t, None, :] * x[:, t, :, None]
        ys.append((h * Ct[:, t, None, :]).sum(-1) + m.D * x[:, t])
    y_ref = lin(m.W_o, torch.stack(ys, 1))
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL


def test_mamba_block_option_is_mambas_block():
    """expand=2, conv 4 + SiLU, SiLU outer gate: Mamba's block (in_proj -> x, z; conv; S6; ⊙ SiLU(z); out_proj)."""
    m = perturb(build("mamba_gf", d_model=8, d_state=4, expand=2, outer_gate="silu", conv_size=4, conv_bias=True, conv_activation="silu"))
    T, di = 9, 16
    x = randn(B, T, 8)
    u, z = lin(m.W_in, x).chunk(2, -1)
    u = F.silu(conv_ref(u, m.conv.weight, m.conv.bias))
    delta = F.softplus(lin(m.W_delta, lin(m.W_u, u)))
    Bt, Ct, A = lin(m.W_k, u), lin(m.W_q, u), torch.exp(m.A_log)
    h, ys = torch.zeros(B, di, 4, dtype=x.dtype), []
    for t in range(T):
        h = torch.exp(-delta[:, t, :, None] * A) * h + delta[:, t, :, None] * Bt[:, t, None, :] * u[:, t, :, None]
        ys.append((h * Ct[:, t, None, :]).sum(-1) + m.D * u[:, t])
    y_ref = lin(m.W_o, torch.stack(ys, 1) * F.silu(z))
    assert max_abs(m(x), y_ref) < F64_ATOL


def test_hgrn_matches_its_equations():
    m = build("hgrn", decay_lower_bound=0.3)
    T = 9
    x = randn(B, T, 16)
    f = 0.3 + 0.7 * torch.sigmoid(lin(m.W_a, x))
    i = F.silu(lin(m.W_v, x))
    h, outs = torch.zeros(B, 16, dtype=x.dtype), []
    for t in range(T):
        h = f[:, t] * h + (1 - f[:, t]) * i[:, t]
        outs.append(h)
    o = torch.stack(outs, 1)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * m.norm.weight
    y_ref = lin(m.W_o, o * F.silu(lin(m.W_g, x)))
    assert max_abs(m(x), y_ref) < F64_ATOL


def test_rg_lru_matches_griffin():
    """Griffin eq. (1)-(4) (dsf note §3.12): r = σ(x W_a + b_a), i = σ(x W_x + b_x), a_t = σ(Λ)^{c r_t},
    h_t = a_t h_{t-1} + sqrt(1 - a_t²)(i_t ⊙ x_t); here with the GeLU gate and W_O of MetaLA Table A3."""
    m = build("rg_lru")
    T = 9
    x = randn(B, T, 16)
    r, i = torch.sigmoid(lin(m.W_a, x)), torch.sigmoid(lin(m.W_v, x))
    a = torch.sigmoid(m.Lambda) ** (8 * r)
    h, outs = torch.zeros(B, 16, dtype=x.dtype), []
    for t in range(T):
        h = a[:, t] * h + torch.sqrt(1 - a[:, t] ** 2) * (i[:, t] * x[:, t])
        outs.append(h)
    y_ref = lin(m.W_o, torch.stack(outs, 1) * F.gelu(lin(m.W_g, x)))
    assert max_abs(m(x), y_ref) < F64_ATOL


def test_lru_matches_its_equations():
    """LRU (Orvieto et al. 2023): λ = exp(-exp(ν) + i exp(θ)), h_t = λ ⊙ h_{t-1} + γ ⊙ (B x_t),
    γ = exp(γ_log) (init sqrt(1 - |λ|²)), y_t = Re(C h_t) + D ⊙ x_t."""
    m = build("lru")
    T = 9
    x = randn(B, T, 16)
    lam = torch.exp(torch.complex(-torch.exp(m.nu_log), torch.exp(m.theta_log)))
    assert max_abs(torch.exp(m.gamma_log), torch.sqrt(1 - lam.abs() ** 2)) < 1e-6  # the γ normalization at init
    Bm, Cm = torch.complex(m.B_re, m.B_im), torch.complex(m.C_re, m.C_im)
    h, ys = torch.zeros(B, 16, dtype=torch.complex128), []
    for t in range(T):
        h = lam * h + torch.exp(m.gamma_log) * (x[:, t].to(torch.complex128) @ Bm.t())
        ys.append((h @ Cm.t()).real + m.D * x[:, t])
    y_ref = torch.stack(ys, 1)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL


@pytest.mark.parametrize("name", ["qlstm", "qlstm_rs"])
def test_qlstm_matches_dsf_eq20(name):
    """DSF eq. (20): Λ_i = diag(σ(W_f u_i)) (eq. 23: σ(-W_f u_i)^a), B_i = diag(σ(W_i u_i)) W_u,
    C_i = diag(σ(W_o u_i)), D = 0: h_i = f_i ⊙ h_{i-1} + i_i ⊙ (W_u u_i), y_i = o_i ⊙ h_i."""
    m = perturb(build(name))
    T = 9
    x = randn(B, T, 16)
    zf = lin(m.W_a, x)
    f = torch.sigmoid(zf) if name == "qlstm" else torch.sigmoid(-zf) ** F.relu(m.a)
    i, o, vu = torch.sigmoid(lin(m.W_k, x)), torch.sigmoid(lin(m.W_g, x)), lin(m.W_v, x)
    h, ys = torch.zeros(B, 16, dtype=x.dtype), []
    for t in range(T):
        h = f[:, t] * h + i[:, t] * vu[:, t]
        ys.append(o[:, t] * h)
    assert max_abs(m(x), torch.stack(ys, 1)) < F64_ATOL


@pytest.mark.parametrize("name", ["qlstm_block", "qlstm_rs_block"])
def test_qlstm_block_matches_released_block(name):
    """dsf note §5.1 (the released dsf-mqar block): x, gate = in_proj(u) (hidden = 2d); x = conv4(x) (bias);
    f, i, o from x; forget = σ(f) or σ(-f)^relu(α); h_t = forget ⊙ h_{t-1} + σ(i) ⊙ x_t; out = W(gelu(gate) ⊙ σ(o) ⊙ h)."""
    m = perturb(build(name, d_model=8))
    T, di = 9, 16
    u = randn(B, T, 8)
    xs, gate = lin(m.W_in, u).chunk(2, -1)
    xs = conv_ref(xs, m.conv.weight, m.conv.bias)
    f = lin(m.W_a, xs)
    forget = torch.sigmoid(f) if name == "qlstm_block" else torch.sigmoid(-f) ** F.relu(m.a)
    xin = torch.sigmoid(lin(m.W_k, xs)) * xs
    h, hs = torch.zeros(B, di, dtype=u.dtype), []
    for t in range(T):
        h = forget[:, t] * h + xin[:, t]
        hs.append(h)
    h = torch.sigmoid(lin(m.W_g, xs)) * torch.stack(hs, 1)
    y_ref = lin(m.W_o, F.gelu(gate) * h)
    assert max_abs(m(u), y_ref) < F64_ATOL


def test_transnormer_matches_its_equations():
    """φ = SiLU on q, k; λ_h = exp(-8h/H) with the rotary phase; SRMSNorm (no gain) over d_v; linear gate x W_U."""
    m = build("transnormer", d_model=16, heads=2)
    T, H, K = 10, 2, 8
    x = randn(B, T, 16)
    q_c = m._rotary_form(m._params(x, None, False))[0]
    # the decay magnitudes of the complex decay are the TransNormer schedule
    _, _, gk = m._rotary_form(m._params(x, None, False))
    assert max_abs(gk.real[0, 0, :, 0], -8 * torch.arange(H, dtype=x.dtype) / H) < 1e-12
    assert max_abs(q_c.real, F.silu(lin(m.W_q, x)).view(B, T, H, K)[..., 0::2]) < 1e-12
    values, mixed = m.core(x)
    o = mixed.reshape(B, T, -1)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert max_abs(m(x), lin(m.W_o, o * lin(m.W_g, x))) < F64_ATOL


# ------------------------------------------------------------------------------------------
# equivalences with the other families
# ------------------------------------------------------------------------------------------


def test_linformer_equals_linear_attention():
    """The Linear Transformer preset and the attention family's linear_attention are one model:
    with the weights copied, the same output, map and decoding."""
    torch.manual_seed(0)
    la = seqmix.build_mixer("linear_attention", d_model=16, n=8, heads=2, chunk_size=8).double()
    gf = seqmix.build_mixer("linformer", d_model=16, expand_k=0.5, heads=2, chunk_size=8).double()
    with torch.no_grad():
        gf.W_q.weight.copy_(la.W_qk.weight[:8])
        gf.W_k.weight.copy_(la.W_qk.weight[8:])
        gf.W_v.weight.copy_(la.W_v.weight)
        gf.W_o.weight.copy_(la.W_o.weight)
    x = randn(B, 19, 16)
    for mode in ("recurrent", "chunk", "parallel"):
        la.mode = gf.mode = mode
        assert max_abs(gf(x), la(x)) < F64_ATOL
    assert max_abs(gf.phi(x), la.phi(x)) < F64_ATOL
    assert gf.state_size() == la.state_size()


def test_mamba_gf_equals_s6():
    """mamba_gf and the SSM family's s6 compute the same function once the parameters are mapped
    by :func:`mamba_gf_state_from_s6`."""
    torch.manual_seed(0)
    d, N = 16, 4
    s6 = seqmix.build_mixer("s6", d_model=d, d_state=N).double()
    state = s6.state_dict()
    p = next(v.shape[0] for k, v in state.items() if k.endswith("x_proj.weight")) - 2 * N
    prefix = next(k for k in state if k.endswith("x_proj.weight"))[: -len("x_proj.weight")]
    names_map = {key: prefix + val for key, val in S6_NAMES.items()}
    names_map["dt_proj.bias"] = prefix + "dt_bias"  # seqmix's s6 keeps Mamba's dt bias as its own parameter
    gf = seqmix.build_mixer("mamba_gf", d_model=d, d_state=N, dt_rank=p).double()
    gf.load_state_dict(mamba_gf_state_from_s6(state, d_state=N, dt_rank=p, names=names_map))
    x = randn(B, 13, d)
    assert max_abs(gf(x), s6(x)) < F64_ATOL


def test_mamba_gf_state_from_s6_mapping():
    """The mapping helper on a synthetic S6 state dict: a mamba_gf built from it reproduces the
    selective scan written with the S6 names (x_proj = [Δ; B; C], dt_proj, A_log, D, out_proj)."""
    d, N, p, T = 8, 3, 2, 7
    g = torch.Generator().manual_seed(3)
    s6 = {
        "x_proj.weight": torch.randn(p + 2 * N, d, generator=g, dtype=torch.float64),
        "dt_proj.weight": torch.randn(d, p, generator=g, dtype=torch.float64),
        "dt_proj.bias": torch.randn(d, generator=g, dtype=torch.float64),
        "A_log": torch.randn(d, N, generator=g, dtype=torch.float64),
        "D": torch.randn(d, generator=g, dtype=torch.float64),
        "out_proj.weight": torch.randn(d, d, generator=g, dtype=torch.float64),
    }
    gf = seqmix.build_mixer("mamba_gf", d_model=d, d_state=N, dt_rank=p).double()
    gf.load_state_dict(mamba_gf_state_from_s6(s6, d_state=N, dt_rank=p))
    x = randn(B, T, d)
    xdbl = x @ s6["x_proj.weight"].t()
    dt, Bt, Ct = xdbl.split([p, N, N], -1)
    delta = F.softplus(dt @ s6["dt_proj.weight"].t() + s6["dt_proj.bias"])
    A = -torch.exp(s6["A_log"])
    h, ys = torch.zeros(B, d, N, dtype=x.dtype), []
    for t in range(T):
        h = torch.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * Bt[:, t, None, :] * x[:, t, :, None]
        ys.append((h * Ct[:, t, None, :]).sum(-1) + s6["D"] * x[:, t])
    assert max_abs(gf(x), torch.stack(ys, 1) @ s6["out_proj.weight"].t()) < F64_ATOL
    with pytest.raises(ValueError, match="x_proj"):
        mamba_gf_state_from_s6(s6, d_state=N + 1, dt_rank=p)


# ------------------------------------------------------------------------------------------
# parameter counts (MetaLA §5: 4d² for MetaLA; RetNet 8d²; GLA 4d² + 24d)
# ------------------------------------------------------------------------------------------


def _counts(m):
    mats = sum(p.numel() for n, p in m.named_parameters() if p.dim() == 2 and "conv" not in n)
    return mats, sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("d", [64, 128])
def test_metala_token_mixer_has_4d2_weights(d):
    m = seqmix.build_mixer("metala", d_model=d)
    mats, total = _counts(m)
    assert mats == 4 * d * d
    assert total == 4 * d * d + d + d // 2 + 4 * d  # + gate bias + w_aug + conv kernel (metala note §6.9)
    assert _counts(seqmix.build_mixer("metala", d_model=d, **METALA_ABLATIONS["with_key"]))[0] == 4 * d * d + d * d // 2


def test_retnet_and_gla_counts():
    d = 64
    assert _counts(seqmix.build_mixer("retnet", d_model=d))[0] == 8 * d * d
    assert _counts(seqmix.build_mixer("gla", d_model=d))[0] == 4 * d * d + 24 * d


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,overrides,field",
    [
        ("metala", dict(d_model=16, heads=3), "heads"),  # d_k = 8 not divisible by 3
        ("gla", dict(d_model=16, expand_k=0.3), "expand_k"),
        ("metala", dict(tau=0.0), "tau"),
        ("gla", dict(tau=-1.0), "tau"),
        ("metala", dict(conv_size=0), "conv_size"),
        ("metala", dict(heads=0), "heads"),
        ("general_form", dict(decay="no_such_decay"), "decay"),
        ("general_form", dict(key="nope"), "key"),
        ("general_form", dict(key="one_minus_decay", decay="none"), "decay"),
        ("general_form", dict(rotary=True, decay="sigmoid"), "rotary"),
        ("general_form", dict(key="delta_proj"), "delta_A"),
        ("lru", dict(value="proj"), "lru"),
        ("qlstm", dict(expand_v=2.0), "out_proj"),
        ("general_form", dict(xpos=True), "xpos"),
        ("general_form", dict(scale=-1.0), "scale"),
    ],
)
def test_bad_config_raises_value_error_naming_the_field(name, overrides, field):
    with pytest.raises(ValueError, match=field):
        seqmix.build_mixer(name, **overrides)


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(ValueError, match="low_rank_sigmoid"):
        seqmix.build_mixer("general_form", decay="gla")
    with pytest.raises(ValueError, match="metala"):
        seqmix.build_mixer("meta_la")


def test_fixed_head_decay_rates_and_the_lightning_schedule():
    """head_decay_rates: γ_h = exp(-r_h) (MiniMax's per-layer slopes); head_decay='lightning':
    r_h = 2^{-8(h+1)/H} (ALiBi's slopes, MiniMax layer 0)."""
    import seqmix

    m = seqmix.build_mixer("lightning_attention", d_model=16, heads=4).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    la, _ = m._decay(x)
    h = torch.arange(4, dtype=torch.float64)
    assert torch.allclose(la[0, 0], -(2.0 ** (-8 * (h + 1) / 4)), rtol=0, atol=1e-15)
    r = seqmix.build_mixer("lightning_attention", d_model=16, heads=4, head_decay_rates=(0.5, 0.1, 0.01, 2.0)).double()
    assert torch.equal(r._decay(x)[0][0, 0], -torch.tensor([0.5, 0.1, 0.01, 2.0], dtype=torch.float64))
    for bad in ((0.5,), (0.5, 0.1, 0.0, 1.0), (float("nan"),) * 4):
        with pytest.raises(ValueError, match="head_decay_rates"):
            seqmix.build_mixer("lightning_attention", d_model=16, heads=4, head_decay_rates=bad)
    with pytest.raises(ValueError, match="head_decay_rates"):
        seqmix.build_mixer("gla", d_model=16, heads=4, head_decay_rates=(0.1,) * 4)


def _general_form_names():
    """Every registered mixer built on GeneralForm (the presets and the general form itself)."""
    return [e.name for e in seqmix.list_mixers() if isinstance(build(e.name), GeneralForm)]


#: the presets whose decoding step must take the fused path (tests below fail if one of them stops being fusable)
FUSED_PRESETS = {"general_form", "gla", "hgrn", "hgrn2", "lightning_attention", "linformer", "mlstm", "qlstm", "qlstm_block",
                 "qlstm_rs", "qlstm_rs_block", "rg_lru", "rg_lru_block", "rwkv4"}


def test_the_fused_step_covers_the_presets_it_names():
    fusable = {n for n in _general_form_names() if build(n).__dict__["_step_fusable"]}
    assert FUSED_PRESETS <= fusable
    assert not build("rwkv6").__dict__["_step_fusable"] and not build("metala").__dict__["_step_fusable"]  # ddlerp, self-aug


#: the options the fused step is tested with on every preset of FUSED_PRESETS (where the preset's config takes them)
FUSED_OPTIONS = {"preset": {}, "rwkv4-full": RWKV4_FULL, "normalizer-skip-norm": dict(normalizer=True, skip="head", xnorm="rmsnorm"),
                 "skip-input": dict(skip="input"), "gate-blocks": dict(gate_blocks=2),  # (the RG-LRU's block-diagonal gates)
                 "tau": dict(tau=2.0)}


def _fused_cases():
    cases = []
    for name in sorted(FUSED_PRESETS):
        for label, extra in FUSED_OPTIONS.items():
            try:
                build(name, **extra)
            except ValueError:  # (the config refuses the combination, e.g. the mLSTM's input gate with RWKV's bonus)
                continue
            cases.append(pytest.param(name, extra, id=f"{name}-{label}"))
    return cases


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["f64", "f32", "bf16"])
@pytest.mark.parametrize("in_place", [False, True], ids=["new-state", "in-place"])
@pytest.mark.parametrize("name,extra", _fused_cases())
def test_fused_step_equals_the_general_step(name, extra, in_place, dtype):
    """GeneralForm._fused_step (a decoding step in one pass) against the general path (_params, _core, _readout in
    mode "step", the reference): from no state (the first token: Griffin's reset) and after a prefill, four steps,
    outputs and every state entry; float64 within F64_ATOL, float32 within F32_RTOL, bfloat16 parameters and input
    within BF16_MODE_RTOL (a product and a sum fused as one addcmul may round one bf16 step apart); the state written in
    place or not (seqmix.ops.states_in_place)."""
    import copy

    from seqmix.mixers.base import Cache

    fused = perturb(build(name, torch.float32 if dtype == torch.bfloat16 else dtype, **extra)).to(dtype)
    assert fused.__dict__["_step_fusable"]
    general = copy.deepcopy(fused)
    general.__dict__["_step_fusable"] = False
    x = randn(B, 9, fused.d_model, dtype=torch.float32 if dtype == torch.bfloat16 else dtype).to(dtype)
    with torch.no_grad():  # (the fused path itself runs after a prefill: it hands back no None)
        c = Cache()
        fused(x[:, :4], cache=c)
        assert fused._fused_step(x[:, 4:5], c.get(fused)) is not None
    for prefill in (0, 4):
        assert_fused_step_agrees(fused, general, x, prefill, 4, in_place, dtype)
