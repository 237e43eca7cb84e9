"""Gated linear mixers in the general form: rwkv6 (Finch), hgrn2 and gsa (Gated
Slot Attention). Each against a loop written from its paper's equations (float64, the whole mixer),
their options through the contract checks, their DSF views, and the cores against
flash-linear-attention's naive references where fla is installed (an optional test extra)."""

from __future__ import annotations


import pytest
from fla_ref import fla_naive
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from seqmix.mixers.linear_attention import HGRN2_FLA, RWKV6_FLA, GatedSlotAttention, GeneralForm
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, assert_modes_agree_f64, max_abs, rel_err

B = 2
NAMES = ("rwkv6", "hgrn2", "gsa")


def build(name, dtype=torch.float64, seed=0, **overrides):
    entry = seqmix.mixer_entry(name)
    torch.manual_seed(seed)
    return seqmix.build_mixer(name, **{**entry.example_config(), **overrides}).to(dtype).eval()


def randn(*shape, dtype=torch.float64, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def perturb(m, seed=5):
    """Random values for the parameters that start at zero or at a constant (RWKV-6's LoRA A's start at 0,
    so the ddlerp and the decay would not depend on the input; norms start at 1/0), so that a test sees them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name in ("A_mix", "A_w"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) / p.shape[0] ** 0.5)
            elif name in ("B_mix", "B_w"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name in ("u", "mu_x", "lam_mix") or name.startswith("norm."):
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


# ------------------------------------------------------------------------------------------
# references: the papers' equations as loops over time (float64), reading the mixers' weights
# ------------------------------------------------------------------------------------------


def lin(layer, x):
    return x @ layer.weight.t() + (layer.bias if layer.bias is not None else 0)


def rwkv6_ref(m, x):
    """Finch (Peng et al. 2024, §4): ddlerp token shift, LoRA decay, wkv with the bonus u, GroupNorm, SiLU gate."""
    Bt, T, d = x.shape
    H, K, V, r = m.H, m.K, m.V, m.config.ddlerp_rank
    prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], 1)
    xx = prev - x
    z = torch.tanh((x + xx * m.mu_x) @ m.A_mix)
    xs = {}
    for i, name in enumerate("rkvgw"):  # lora_□(y) = λ_□ + tanh(y A_□) B_□,  x_□ = x + (x_{t-1} - x) ⊙ lora_□
        xs[name] = x + xx * (m.lam_mix[i] + z[..., i * r : (i + 1) * r] @ m.B_mix[i])
    rr, kk, vv = lin(m.W_q, xs["r"]), lin(m.W_k, xs["k"]), lin(m.W_v, xs["v"])
    g = F.silu(lin(m.W_g, xs["g"]))
    w = torch.exp(-torch.exp(m.w0 + torch.tanh(xs["w"] @ m.A_w) @ m.B_w))  # w_t = exp(-exp(d_t))
    u = m.u.view(H, K)
    out = torch.zeros(Bt, T, H, V, dtype=x.dtype)
    for b in range(Bt):
        for h in range(H):
            S = torch.zeros(K, V, dtype=x.dtype)
            sl = slice(h * K, (h + 1) * K)
            for t in range(T):
                kv = torch.outer(kk[b, t, sl], vv[b, t, h * V : (h + 1) * V])
                out[b, t, h] = rr[b, t, sl] @ (S + u[h].unsqueeze(-1) * kv)  # r_t (S_{t-1} + diag(u) k_tᵀ v_t)
                S = w[b, t, sl].unsqueeze(-1) * S + kv  # S_t = diag(w_t) S_{t-1} + k_tᵀ v_t
    o = F.group_norm(out.reshape(Bt * T, H * V), H, m.norm.weight, m.norm.bias, m.config.norm_eps).reshape(Bt, T, H * V)
    return lin(m.W_o, o * g)


def hgrn2_ref(m, x):
    """HGRN2 (Qin et al. 2024, §3): h_t = Diag(f_t) h_{t-1} + (1 - f_t)ᵀ i_t, y_t = o_t h_t per head, RMSNorm, W_O."""
    Bt, T, d = x.shape
    H, K, V, lb = m.H, m.K, m.V, m.config.decay_lower_bound
    q = F.silu(lin(m.W_q, x))
    f = lb + (1 - lb) * torch.sigmoid(lin(m.W_a, x))
    i = lin(m.W_v, x)
    out = torch.zeros(Bt, T, H * V, dtype=x.dtype)
    for b in range(Bt):
        for h in range(H):
            S = torch.zeros(K, V, dtype=x.dtype)
            sk, sv = slice(h * K, (h + 1) * K), slice(h * V, (h + 1) * V)
            for t in range(T):
                S = f[b, t, sk].unsqueeze(-1) * S + torch.outer(1 - f[b, t, sk], i[b, t, sv])
                out[b, t, sv] = m._scale * q[b, t, sk] @ S
    o = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + m.config.norm_eps) * m.norm.weight
    return lin(m.W_o, o)


def gsa_ref(m, x, *, return_logits=False):
    """GSA (Zhang et al. 2024, §3): K̃_t = Diag(α_t) K̃_{t-1} + (1-α_t)ᵀ k_t, Ṽ_t likewise with v_t,
    o_t = softmax(q_t K̃_tᵀ) Ṽ_t per head; then W_O RMSNorm(SiLU(o)) (fla's layer)."""
    Bt, T, d = x.shape
    H, K, V, M = m.H, m.K, m.V, m.M
    q, k, v = F.silu(lin(m.W_q, x)), F.silu(lin(m.W_k, x)), F.silu(lin(m.W_v, x))
    alpha = torch.sigmoid(lin(m.W_f, x)) ** (1 / m.config.tau)
    out = torch.zeros(Bt, T, H * V, dtype=x.dtype)
    logits = torch.zeros(Bt, T, H * M, dtype=x.dtype)
    for b in range(Bt):
        for h in range(H):
            Kt, Vt = torch.zeros(M, K, dtype=x.dtype), torch.zeros(M, V, dtype=x.dtype)
            sk, sv, sm = slice(h * K, (h + 1) * K), slice(h * V, (h + 1) * V), slice(h * M, (h + 1) * M)
            for t in range(T):
                a = alpha[b, t, sm]
                Kt = a.unsqueeze(-1) * Kt + torch.outer(1 - a, k[b, t, sk])
                Vt = a.unsqueeze(-1) * Vt + torch.outer(1 - a, v[b, t, sv])
                logits[b, t, sm] = m._scale * Kt @ q[b, t, sk]
                out[b, t, sv] = torch.softmax(logits[b, t, sm], -1) @ Vt
    if return_logits:
        return logits
    o = F.silu(out)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + m.config.norm_eps) * m.norm.weight
    return lin(m.W_o, o)


REFS = {"rwkv6": rwkv6_ref, "hgrn2": hgrn2_ref, "gsa": gsa_ref}


@pytest.mark.parametrize("name", NAMES)
def test_matches_the_papers_equations(name):
    m = perturb(build(name))
    x = randn(B, 19, m.d_model)
    with torch.no_grad():
        y_ref = REFS[name](m, x)
        for mode in m.modes:
            m.mode = mode
            assert max_abs(m(x), y_ref) < F64_ATOL, (name, mode)
        # decoding, one token at a time
        cache = Cache()
        steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], 1)
    assert max_abs(steps, y_ref) < F64_ATOL


def test_presets_are_the_general_form_or_say_why_not():
    """rwkv6 and hgrn2 are presets of the general form (one class); gsa has its own class (two recurrences)."""
    assert seqmix.mixer_entry("rwkv6").cls is GeneralForm and seqmix.mixer_entry("hgrn2").cls is GeneralForm
    assert seqmix.mixer_entry("gsa").cls is GatedSlotAttention
    assert "composition of two linear systems" in GatedSlotAttention.__doc__


def test_paper_defaults():
    r = seqmix.build_mixer("rwkv6", d_model=2048)
    assert (r.H, r.K, r.V) == (32, 64, 64) and r.A_mix.shape == (2048, 5 * 32) and r.A_w.shape == (2048, 64)
    assert r.config.norm_eps == pytest.approx(6.4e-4) and r._scale == 1.0
    # the official x060 weights: 5 d² (r, k, v, g, o) + the LoRAs + μ_x, λ (5), w0, u, GroupNorm (2)
    d = 2048
    assert sum(p.numel() for p in r.parameters()) == 5 * d * d + d * 160 + 5 * 32 * d + d * 64 + 64 * d + d + 5 * d + d + d + 2 * d
    h = seqmix.build_mixer("hgrn2", d_model=1024)
    assert (h.H, h.K, h.V) == (8, 128, 128) and sum(p.numel() for p in h.parameters()) == 4 * 1024 * 1024 + 1024
    g = seqmix.build_mixer("gsa", d_model=1024)
    assert (g.H, g.K, g.V, g.M, g.config.tau) == (4, 256, 256, 64, 8.0)
    assert g.state_size() == 4 * 64 * (256 + 256)


# ------------------------------------------------------------------------------------------
# options through the contract checks
# ------------------------------------------------------------------------------------------

VARIANTS = {
    "rwkv6_fla_eps": ("rwkv6", RWKV6_FLA),
    "rwkv6_three_heads": ("rwkv6", dict(d_model=24, head_size=8, low_rank=4, ddlerp_rank=3)),
    "rwkv6_static_shift_linear_bonus": ("general_form", dict(heads=2, bonus=True, bonus_form="linear", token_shift=True, decay="lora_exp")),
    "hgrn2_lower_bound": ("hgrn2", dict(decay_lower_bound=0.5)),
    "hgrn2_fla_scale": ("hgrn2", HGRN2_FLA),
    "gsa_per_head_norm": ("gsa", dict(norm_per_head=True, scale="inv_sqrt_k", num_slots=3)),
    "gsa_plain": ("gsa", dict(feature_map="identity", value_act="identity", output_act="none", xnorm="none", expand_k=0.5)),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variant_passes_contract_checks(variant):
    name, overrides = VARIANTS[variant]
    m = perturb(build(name, **overrides))
    c = m.config.chunk_size
    for T in (2 * c, 2 * c + 3):
        assert_modes_agree_f64(m, randn(B, T, m.d_model), variant)
    m32 = perturb(build(name, torch.float32, **overrides))
    x32 = randn(B, 2 * c + 3, m.d_model, dtype=torch.float32)
    m32.mode = m32.reference_mode
    y_ref = m32(x32).detach()
    for mode in m32.modes:
        m32.mode = mode
        assert rel_err(m32(x32).detach(), y_ref) < F32_RTOL, (variant, mode)
    assert_decodes_splits_and_maps(m, randn(B, 2 * c + 3, m.d_model), variant)


# ------------------------------------------------------------------------------------------
# the DSF views
# ------------------------------------------------------------------------------------------


def test_rwkv6_dsf_is_diagonal_data_dependent_with_the_bonus_in_D():
    m = perturb(build("rwkv6"))
    x = randn(B, 11, m.d_model)
    system = m.dsf(x)
    P = m._params(x, None, False)
    # Λ_t = w_t per key channel, repeated over the value channels of the head (entry (h, v, k))
    w = P.gk.exp()  # [B, T, H, K]
    assert system.is_diagonal
    assert max_abs(system.lam, w.unsqueeze(3).expand(B, 11, m.H, m.V, m.K).reshape(B, 11, -1)) < 1e-15
    assert float(w.detach().std(1).min()) > 0, "the decay must vary over time (data-dependent)"
    assert system.D is not None  # the current token's bonus is the skip D_t


def test_hgrn2_dsf_ties_the_input_to_the_forget_gate():
    m = perturb(build("hgrn2", decay_lower_bound=0.3))
    x = randn(B, 9, m.d_model)
    system = m.dsf(x)
    f = system.lam.reshape(B, 9, m.H, m.V, m.K)
    Bmat = system.B.reshape(B, 9, m.H, m.V, m.K, m.H, m.V)
    for h in range(m.H):  # B_t[(h, v, k), (h, v)] = 1 - f_t[h, k]
        for v in range(m.V):
            assert max_abs(Bmat[:, :, h, v, :, h, v], 1 - f[:, :, h, v]) < 1e-15
    assert float(f.min()) >= 0.3 - 1e-12 and float(f.max()) < 1  # the lower bound


def test_gsa_slot_dsf_and_composition():
    """The first system (slot_dsf) gives the slot logits, its softmax is the second system's C_t,
    and the second (dsf) gives the core output: the composition reproduces the loop reference."""
    m = perturb(build("gsa"))
    x = randn(B, 13, m.d_model)
    P = m._params(x)
    first = m.slot_dsf(x)
    logits = first.evaluate(P.s.reshape(B, 13, -1)).reshape(B, 13, m.H, m.M)
    assert max_abs(logits.reshape(B, 13, -1), gsa_ref(m, x, return_logits=True)) < F64_ATOL
    p = torch.softmax(logits, -1)
    C = m.dsf(x).C.reshape(B, 13, m.H, m.V, m.H, m.V, m.M)
    for h in range(m.H):
        assert max_abs(C[:, :, h, 0, h, 0], p[:, :, h]) < F64_ATOL
    values, mixed = m.core(x)
    assert max_abs(m.dsf(x).evaluate(values.reshape(B, 13, -1)), mixed.reshape(B, 13, -1)) < F64_ATOL
    # Φ rows: Σ_s Φ[t, s] = Σ_m p_{t,m} (1 - Π_{r<=t} α_{r,m}) <= 1
    rows = m.phi(x).sum(-1)
    alpha_prod = P.la.cumsum(1).exp()  # [B, T, H, M]
    assert max_abs(rows, (p * (1 - alpha_prod)).sum(-1).transpose(1, 2)) < F64_ATOL
    assert float(rows.detach().max()) <= 1


def test_gsa_is_not_linear_in_its_keys():
    """The softmax between the passes: doubling the keys is not doubling the logits' effect (no single DSF in k)."""
    m = perturb(build("gsa"))
    x = randn(B, 7, m.d_model)
    P = m._params(x)
    p1, _ = m._slot_weights(P, None, "recurrent", False)
    P.k = 2 * P.k
    p2, _ = m._slot_weights(P, None, "recurrent", False)
    assert max_abs(p1, p2) > 1e-3


# ------------------------------------------------------------------------------------------
# bad configs
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, overrides, field",
    [
        ("rwkv6", dict(d_model=24, head_size=16), "head_size"),
        ("rwkv6", dict(token_shift=False), "ddlerp_rank"),
        ("hgrn2", dict(bonus_form="linear"), "bonus_form"),
        ("hgrn2", dict(decay_lower_bound=1.0), "decay_lower_bound"),
        ("gsa", dict(heads=3), "heads"),
        ("gsa", dict(num_slots=0), "num_slots"),
        ("gsa", dict(scale=-1.0), "scale"),
        ("gsa", dict(expand_k=0.3), "expand_k"),
    ],
)
def test_bad_config_raises_value_error_naming_the_field(name, overrides, field):
    with pytest.raises(ValueError, match=field):
        seqmix.build_mixer(name, **{"d_model": 16, **overrides})


# ------------------------------------------------------------------------------------------
# flash-linear-attention's naive references (optional: skipped without fla)
# ------------------------------------------------------------------------------------------


def test_rwkv6_core_matches_fla_naive():
    naive = fla_naive("ops/rwkv6/recurrent_naive.py", "naive_recurrent_rwkv6")
    m = perturb(build("rwkv6", torch.float32))
    x = randn(B, 37, m.d_model, dtype=torch.float32)
    with torch.no_grad():
        P = m._params(x, None, False)
        _, mixed = m.core(x)
        o, _ = naive(*(t.transpose(1, 2) for t in (P.q, P.k, P.v, P.gk)), m.u.view(m.H, m.K), scale=1.0)
    assert rel_err(o.transpose(1, 2), mixed) < F32_RTOL


def test_hgrn2_core_matches_fla_naive_gla():
    """fla's HGRN2 layer runs its gla kernels with k = 1 - f, g = log f (naive_recurrent_gla: scale d_k'^{-1/2},
    hence HGRN2_FLA)."""
    naive = fla_naive("ops/gla/naive.py", "naive_recurrent_gla")
    m = perturb(build("hgrn2", torch.float32, decay_lower_bound=0.2, **HGRN2_FLA))
    x = randn(B, 37, m.d_model, dtype=torch.float32)
    with torch.no_grad():
        P = m._params(x, None, False)
        _, mixed = m.core(x)
        o, _ = naive(P.q, P.k, P.v, P.gk)
    assert rel_err(o, mixed) < F32_RTOL


def test_gsa_core_matches_fla_naive():
    naive = fla_naive("ops/gsa/naive.py", "naive_recurrent_gsa")
    m = perturb(build("gsa", torch.float32))
    x = randn(B, 37, m.d_model, dtype=torch.float32)
    with torch.no_grad():
        P = m._params(x)
        _, mixed = m.core(x)
        o, _ = naive(P.q, P.k, P.v, P.s, P.la, scale=m._scale)
    assert rel_err(o, mixed) < F32_RTOL
