"""Mamba-3 (``mamba3``): the trapezoidal op against its two-tap loop, the complex-state system
against an explicit complex128 loop written from the paper's equations, and the λ = 1 reduction
to Mamba-2's (Euler) recurrence; the MIMO form (mimo_rank = r) against a rank-r matrix-form complex128
loop, its r = 1 reduction to SISO, and the contract suite re-run on the MIMO example config. The contract
suite (test_contract.py) covers modes, step, split, phi, dsf, causality, state size, bad input and mixed
precision."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.ops import linear_recurrence
from seqmix.ops.ssm import rotate_pairs, trapezoidal_map, trapezoidal_recurrence, trapezoidal_recurrence_reference
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

MODES = ("recurrent", "chunk", "parallel")


def _op_inputs(dtype=torch.float64, B=2, T=19, H=3, K=6, V=4, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=dtype)

    def u(*s):
        return torch.rand(*s, generator=g, dtype=dtype)

    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V), g=-u(B, T, H), gamma=u(B, T, H), eta=u(B, T, H),
                S0=r(B, H, K, V), prev=(r(B, H, K), r(B, H, V)))


def _trap(a, **kw):
    return trapezoidal_recurrence(a["q"], a["k"], a["v"], a["g"], a["gamma"], a["eta"], **kw)


@pytest.mark.parametrize("mode", MODES)
def test_trapezoidal_op_equals_two_tap_loop(mode):
    a = _op_inputs()
    o_ref, S_ref = trapezoidal_recurrence_reference(a["q"], a["k"], a["v"], a["g"], a["gamma"], a["eta"],
                                                    initial_state=a["S0"], prev=a["prev"])
    o, S = _trap(a, initial_state=a["S0"], prev=a["prev"], output_final_state=True, mode=mode, chunk_size=8)
    assert max_abs(o, o_ref) < F64_ATOL and max_abs(S, S_ref) < F64_ATOL
    # the β term matters: without the previous token's input the loop differs
    o0, _ = trapezoidal_recurrence_reference(a["q"], a["k"], a["v"], a["g"], a["gamma"], 0 * a["eta"], initial_state=a["S0"])
    assert max_abs(o0, o_ref) > 1e-2


def test_trapezoidal_op_float32_and_split():
    a = _op_inputs()
    o_ref, _ = trapezoidal_recurrence_reference(a["q"], a["k"], a["v"], a["g"], a["gamma"], a["eta"])
    a32 = {k: v.float() for k, v in a.items() if isinstance(v, torch.Tensor)}
    o, _ = _trap(a32, mode="chunk", chunk_size=8)
    assert o.dtype == torch.float32 and rel_err(o.double(), o_ref) < F32_RTOL
    # two calls carrying (S, last k, last v) equal one pass
    cut = 7
    first = {k: v[:, :cut] for k, v in a.items() if k not in ("S0", "prev")}
    second = {k: v[:, cut:] for k, v in a.items() if k not in ("S0", "prev")}
    o1, S1 = _trap(first, output_final_state=True, mode="chunk", chunk_size=4)
    o2, _ = _trap(second, initial_state=S1, prev=(a["k"][:, cut - 1], a["v"][:, cut - 1]), mode="chunk", chunk_size=4)
    assert max_abs(torch.cat([o1, o2], 1), o_ref) < F64_ATOL


def test_trapezoidal_map_and_euler_limit():
    a = _op_inputs()
    o_ref, _ = trapezoidal_recurrence_reference(a["q"], a["k"], a["v"], a["g"], a["gamma"], a["eta"])
    M = trapezoidal_map(a["q"], a["k"], a["g"], a["gamma"], a["eta"])
    assert max_abs(torch.einsum("bhts,bshv->bthv", M, a["v"]), o_ref) < F64_ATOL
    # η = 0 (λ = 1): the one-tap recurrence of k γ (Mamba-2's Euler rule with γ = Δ)
    o, _ = _trap({**a, "eta": 0 * a["eta"]}, mode="chunk", chunk_size=8)
    o_lr, _ = linear_recurrence(a["q"], a["k"] * a["gamma"].unsqueeze(-1), a["v"], a["g"], mode="recurrent")
    assert max_abs(o, o_lr) < F64_ATOL


def test_rotate_pairs_is_complex_multiplication():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 3, 7, generator=g, dtype=torch.float64)
    phi = torch.randn(2, 5, 3, 3, generator=g, dtype=torch.float64)
    y = rotate_pairs(x, phi)
    z = torch.complex(x[..., 0:6:2], x[..., 1:6:2]) * torch.polar(torch.ones_like(phi), -phi)
    assert max_abs(y[..., 0:6:2], z.real) < 1e-14 and max_abs(y[..., 1:6:2], z.imag) < 1e-14
    assert torch.equal(y[..., 6:], x[..., 6:])
    with pytest.raises(ValueError, match="phi"):
        rotate_pairs(x, torch.zeros(2, 5, 3, 4, dtype=torch.float64))


# -- the mixer ----------------------------------------------------------------------------------


def make(**over):
    torch.manual_seed(0)
    cfg = {**seqmix.mixer_entry("mamba3").example_config(), **over}
    return seqmix.build_mixer("mamba3", **cfg).double().eval()


def x_in(m, T=21, seed=1):
    return torch.randn(2, T, m.d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _paper_parts(m, u):
    """Δ, A, λ, θ, B, C (unrotated, per head), x, written from the class docstring's equations."""
    c = m.config
    G, N, H, R, P = c.groups, c.d_state, m.heads, m.angles, c.headdim
    Bt, T, _ = u.shape
    z, x, Bm, Cm, dt, a, lam, theta = m.in_proj(u).split([m.d_inner, m.d_inner, G * N, G * N, H, H, H, R], -1)
    delta = F.softplus(dt + m.dt_bias)
    A = torch.minimum(-F.softplus(a), torch.tensor(-c.A_floor, dtype=u.dtype))
    lam = torch.sigmoid(lam) if c.trapezoid is None else torch.full_like(delta, c.trapezoid)

    def rms(t, w):
        return t / t.pow(2).mean(-1, keepdim=True).add(c.norm_eps).sqrt() * w

    Bh = rms(Bm.view(Bt, T, G, N), m.B_norm.weight).repeat_interleave(H // G, 2) + m.B_bias
    Ch = rms(Cm.view(Bt, T, G, N), m.C_norm.weight).repeat_interleave(H // G, 2) + m.C_bias
    return delta, A, lam, theta, Bh, Ch, x.view(Bt, T, H, P)


def complex_reference(m, u):
    """y_core from an explicit loop over time with a complex128 state on the R rotated pairs:
    h_t = e^(Δ_t A_t) e^(iΔ_t θ_t) (h_(t−1) + (1−λ_t)Δ_t B_(t−1) x_(t−1)) + λ_t Δ_t B_t x_t,
    y_t = Re(C̄_t · h_t) + D x_t (pairs (2j, 2j+1) as complex numbers; the rest real)."""
    with torch.no_grad():
        delta, A, lam, theta, Bh, Ch, x = _paper_parts(m, u)
        R = m.angles
        Bt, T, H, P = x.shape

        def cplx(t):  # [.., N] -> complex pairs [.., R] and the real rest [.., N - 2R]
            return torch.complex(t[..., 0:2 * R:2], t[..., 1:2 * R:2]), t[..., 2 * R:]

        hc = torch.zeros(Bt, H, R, P, dtype=torch.complex128)
        hr = torch.zeros(Bt, H, Bh.shape[-1] - 2 * R, P, dtype=torch.float64)
        prev_c, prev_r = torch.zeros_like(hc), torch.zeros_like(hr)
        ys = []
        for t in range(T):
            bc, br = cplx(Bh[:, t])
            cc, cr = cplx(Ch[:, t])
            xt = x[:, t]  # [B, H, P]
            d, lt = delta[:, t], lam[:, t]  # [B, H]
            alpha = torch.exp(d * A[:, t])
            ang = d.unsqueeze(-1) * theta[:, t].unsqueeze(1)  # Δ_t θ_t per head and pair, [B, H, R]
            lam_c = alpha.unsqueeze(-1) * torch.polar(torch.ones_like(ang), ang)  # α_t e^(iΔθ), [B, H, R]
            in_c = bc.unsqueeze(-1) * xt.unsqueeze(-2)
            in_r = br.unsqueeze(-1) * xt.unsqueeze(-2)
            eta, gam = ((1 - lt) * d)[..., None, None], (lt * d)[..., None, None]
            hc = lam_c.unsqueeze(-1) * (hc + eta * prev_c) + gam * in_c
            hr = alpha[..., None, None] * (hr + eta * prev_r) + gam * in_r
            prev_c, prev_r = in_c, in_r
            y = (cc.conj().unsqueeze(-1) * hc).sum(-2).real + (cr.unsqueeze(-1) * hr).sum(-2)
            ys.append(y + m.D.unsqueeze(-1) * xt)
        return torch.stack(ys, 1)


@pytest.mark.parametrize("mode", MODES)
def test_mixer_equals_complex_state_loop(mode):
    m = make()
    assert m.angles == 2  # d_state 8, rope_fraction 0.5: two complex pairs, four real states
    u = x_in(m)
    y_ref = complex_reference(m, u)
    _, mixed = m.core(u, mode=mode)
    assert max_abs(mixed, y_ref) < F64_ATOL
    # all states complex, data-dependent λ
    m = make(rope_fraction=1.0)
    assert max_abs(m.core(u, mode=mode)[1], complex_reference(m, u)) < F64_ATOL


def test_rotation_and_trapezoid_change_the_output():
    """Each ingredient is live: without the angles (rope_fraction 0) or with λ = 1 the map differs."""
    u = x_in(make())
    base = make().core(u)[1]
    assert max_abs(make(rope_fraction=0.0).core(u)[1], base) > 1e-3
    assert max_abs(make(trapezoid=1.0).core(u)[1], base) > 1e-3


@pytest.mark.parametrize("mode", MODES)
def test_lambda_one_is_mamba2_euler_recurrence(mode):
    """trapezoid = 1, rope_fraction = 0: h_t = exp(Δ_t A_t) h_(t−1) + Δ_t B_t x_tᵀ, y_t = C_tᵀ h_t + D x_t —
    Mamba-2's SSD recurrence, as the loop below and as the SSD mixer's own op call."""
    m = make(trapezoid=1.0, rope_fraction=0.0)
    u = x_in(m)
    with torch.no_grad():
        delta, A, _, _, Bh, Ch, x = _paper_parts(m, u)
        Bt, T, H, P = x.shape
        h = torch.zeros(Bt, H, Bh.shape[-1], P, dtype=torch.float64)
        ys = []
        for t in range(T):
            h = torch.exp(delta[:, t] * A[:, t])[..., None, None] * h + (delta[:, t, :, None] * Bh[:, t]).unsqueeze(-1) * x[:, t].unsqueeze(-2)
            ys.append((Ch[:, t].unsqueeze(-2) @ h).squeeze(-2) + m.D.unsqueeze(-1) * x[:, t])
        y_loop = torch.stack(ys, 1)
        # SSD._recurrence's call: q = C, k = ΔB, v = x, per-head log-decay Δ·A
        o, _ = linear_recurrence(Ch, delta.unsqueeze(-1) * Bh, x, delta * A, mode=mode, chunk_size=8)
    mixed = m.core(u, mode=mode)[1]
    assert max_abs(mixed, y_loop) < F64_ATOL
    assert max_abs(mixed, o + m.D.unsqueeze(-1) * x) < F64_ATOL


def test_dsf_view_is_real_diagonal_with_alpha():
    m = make()
    u = x_in(m, T=9)
    system = m.dsf(u)
    delta, A, *_ = _paper_parts(m, u)
    alpha = torch.exp(delta * A).detach()  # [B, T, H]
    N, P = m.config.d_state, m.config.headdim
    assert not system.lam.is_complex()
    assert max_abs(system.lam, alpha.repeat_interleave(N * P, -1)) < 1e-14
    values, mixed = m.core(u)
    assert max_abs(system.evaluate(values.flatten(2)), mixed.flatten(2)) < F64_ATOL


def test_cache_holds_state_last_key_value_and_angle():
    m = make()
    u = x_in(m, T=10)
    cache = seqmix.Cache()
    with torch.no_grad():
        m(u, cache=cache)
    st = cache.get(m)
    H, N, P, R = m.heads, m.config.d_state, m.config.headdim, m.angles
    assert st["S"].shape == (2, H, N, P) and st["k"].shape == (2, H, N) and st["v"].shape == (2, H, P)
    assert st["phi"].shape == (2, H, R) and float(st["phi"].min()) >= 0 and float(st["phi"].max()) < 2 * math.pi
    assert m.state_size() == H * (N * P + N + P + R)


def test_config_defaults_and_bad_values():
    m = seqmix.build_mixer("mamba3", d_model=64)
    c = m.config
    assert (c.d_state, c.headdim, c.expand, c.rope_fraction, c.trapezoid) == (128, 64, 2, 0.5, None)
    assert m.heads == 2 and m.angles == 32
    for field, value in (("trapezoid", 1.5), ("rope_fraction", -0.1), ("headdim", 7), ("groups", 3)):
        with pytest.raises(ValueError, match=field):
            seqmix.build_mixer("mamba3", **{"d_model": 16, "headdim": 8, field: value})


# -- the MIMO form (mimo_rank = r > 1) ------------------------------------------------------------


def _mimo_parts(m, u):
    """Δ, A, λ, θ, B, C [B, T, H, r, N] (unrotated, per head and rank), x [B, T, H, P], from the
    class docstring's equations (rank-major in_proj blocks of B and C)."""
    c = m.config
    G, N, H, R, P, r = c.groups, c.d_state, m.heads, m.angles, c.headdim, m.rank
    Bt, T, _ = u.shape
    z, x, Bm, Cm, dt, a, lam, theta = m.in_proj(u).split([m.d_inner, m.d_inner, r * G * N, r * G * N, H, H, H, R], -1)
    delta = F.softplus(dt + m.dt_bias)
    A = torch.minimum(-F.softplus(a), torch.tensor(-c.A_floor, dtype=u.dtype))
    lam = torch.sigmoid(lam) if c.trapezoid is None else torch.full_like(delta, c.trapezoid)

    def rms(t, w):
        return t / t.pow(2).mean(-1, keepdim=True).add(c.norm_eps).sqrt() * w

    def per_head(t, w, bias):  # [B, T, r·G·N] -> [B, T, H, r, N]
        t = rms(t.view(Bt, T, r, G, N), w)
        return torch.stack([t[:, :, :, h // (H // G)] for h in range(H)], 2) + bias

    return delta, A, lam, theta, per_head(Bm, m.B_norm.weight, m.B_bias), per_head(Cm, m.C_norm.weight, m.C_bias), x.view(Bt, T, H, P)


def mimo_complex_reference(m, u):
    """y_core [B, T, H, P] from an explicit loop in the MIMO matrix form, complex128 on the R rotated pairs:
    X_t = x_t ⊙ W_x [P, r], h_t = Λ_t (h_(t−1) + η_t B_(t−1) X_(t−1)ᵀ) + γ_t B_t X_tᵀ  (B_t [N, r], a sum of r
    outer products), Y_t = C_tᴴ h_t [r, P] (real part), y_t = Σ_j W_o[j] ⊙ Y_t[j] + D x_t."""
    with torch.no_grad():
        delta, A, lam, theta, Bh, Ch, x = _mimo_parts(m, u)
        R = m.angles
        Bt, T, H, P = x.shape
        Wx, Wo = m.mimo_x, m.mimo_o  # [H, r, P]

        def cplx(t):  # [.., r, N] -> complex pairs [.., r, R] and the real rest
            return torch.complex(t[..., 0:2 * R:2], t[..., 1:2 * R:2]), t[..., 2 * R:]

        hc = torch.zeros(Bt, H, R, P, dtype=torch.complex128)
        hr = torch.zeros(Bt, H, Bh.shape[-1] - 2 * R, P, dtype=torch.float64)
        prev_c, prev_r = torch.zeros_like(hc), torch.zeros_like(hr)
        ys = []
        for t in range(T):
            bc, br = cplx(Bh[:, t])  # [B, H, r, R], [B, H, r, N - 2R]
            cc, cr = cplx(Ch[:, t])
            X = Wx.unsqueeze(0) * x[:, t].unsqueeze(-2)  # [B, H, r, P]: X_tᵀ
            d, lt = delta[:, t], lam[:, t]
            alpha = torch.exp(d * A[:, t])
            ang = d.unsqueeze(-1) * theta[:, t].unsqueeze(1)
            lam_c = alpha.unsqueeze(-1) * torch.polar(torch.ones_like(ang), ang)
            in_c = bc.transpose(-1, -2).to(torch.complex128) @ X.to(torch.complex128)  # B_t X_tᵀ, [B, H, R, P]
            in_r = br.transpose(-1, -2) @ X
            eta, gam = ((1 - lt) * d)[..., None, None], (lt * d)[..., None, None]
            hc = lam_c.unsqueeze(-1) * (hc + eta * prev_c) + gam * in_c
            hr = alpha[..., None, None] * (hr + eta * prev_r) + gam * in_r
            prev_c, prev_r = in_c, in_r
            Y = (cc.conj() @ hc).real + cr @ hr  # C_tᴴ h_t: r outputs per channel, [B, H, r, P]
            ys.append((Wo.unsqueeze(0) * Y).sum(-2) + m.D.unsqueeze(-1) * x[:, t])
        return torch.stack(ys, 1)


def make_mimo(r=2, **over):
    m = make(mimo_rank=r, **over)
    with torch.no_grad():  # away from the init (W_x = 1, W_o = 1/r), so the projections are tested
        m.mimo_x.copy_(torch.randn(m.mimo_x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
        m.mimo_o.copy_(torch.randn(m.mimo_o.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64))
    return m


@pytest.mark.parametrize("mode", MODES)
def test_mimo_equals_rank_r_complex_state_loop(mode):
    m = make_mimo(2)
    u = x_in(m)
    y_ref = mimo_complex_reference(m, u)
    values, mixed = m.core(u, mode=mode)
    B, T, H, P = y_ref.shape
    assert values.shape == (B, T, H * P, 1)
    assert max_abs(mixed.view(B, T, H, P), y_ref) < F64_ATOL
    m = make_mimo(3, rope_fraction=1.0, trapezoid=0.5)
    assert max_abs(m.core(u, mode=mode)[1].view(B, T, H, P), mimo_complex_reference(m, u)) < F64_ATOL


def test_mimo_rank_one_is_siso():
    """mimo_rank = 1 is the SISO layer (same parameters, same output, bit for bit); and the MIMO path
    with r = 2 whose second rank is switched off (W_x[1] = W_o[1] = 0, W_x[0] = W_o[0] = 1, rank 0's
    B, C rows and biases = the SISO layer's) equals the SISO layer to 1e-12."""
    siso = make()
    u = x_in(siso)
    one = make(mimo_rank=1)
    assert not one.mimo and [n for n, _ in one.named_parameters()] == [n for n, _ in siso.named_parameters()]
    assert torch.equal(one(u), siso(u))
    m = make(mimo_rank=2)
    D, GN = siso.d_inner, siso.config.groups * siso.config.d_state
    with torch.no_grad():
        for name in ("weight",) + (("bias",) if siso.config.bias else ()):
            src, dst = getattr(siso.in_proj, name), getattr(m.in_proj, name)
            z_x, Bs, Cs, rest = src.split([2 * D, GN, GN, src.shape[0] - 2 * D - 2 * GN])
            dst.copy_(torch.cat([z_x, Bs, torch.randn_like(Bs), Cs, torch.randn_like(Cs), rest]))
        for a in ("dt_bias", "D", "out_proj.weight", "B_norm.weight", "C_norm.weight"):
            m.get_parameter(a).copy_(siso.get_parameter(a))
        m.B_bias[:, 0].copy_(siso.B_bias)
        m.C_bias[:, 0].copy_(siso.C_bias)
        m.mimo_x.zero_()[:, 0] = 1
        m.mimo_o.zero_()[:, 0] = 1
    for mode in MODES:
        assert max_abs(m.core(u, mode=mode)[1].flatten(2), siso.core(u, mode=mode)[1].flatten(2)) < 1e-12
    assert max_abs(m(u), siso(u)) < 1e-12
    with torch.no_grad():
        m.mimo_x[:, 1] = 0.5  # the second rank switched on changes the output
    assert max_abs(m(u), siso(u)) > 1e-3


def test_mimo_cache_state_size_and_dsf():
    m = make_mimo(2)
    u = x_in(m, T=10)
    cache = seqmix.Cache()
    with torch.no_grad():
        m(u, cache=cache)
    st = cache.get(m)
    H, N, P, R, r = m.heads, m.config.d_state, m.config.headdim, m.angles, m.rank
    assert st["S"].shape == (2, H, N, P) and st["k"].shape == (2, H, r, N) and st["v"].shape == (2, H, P)
    assert m.state_size() == H * (N * P + r * N + P + R) == sum(t[0].numel() for t in st.values())
    system = m.dsf(u)
    values, mixed = m.core(u)
    assert not system.lam.is_complex() and system.lam.shape[-1] == H * P * N
    assert max_abs(system.evaluate(values.flatten(2)), mixed.flatten(2)) < F64_ATOL
    assert m.phi(u).shape == (2, H * P, 10, 10)


_CONTRACT = ("test_modes_agree_float64", "test_modes_agree_float32", "test_step_decoding_equals_forward",
             "test_split_and_carry_equals_one_pass", "test_phi_reproduces_core", "test_dsf_reproduces_core",
             "test_causality", "test_state_size_counts_the_cache", "test_bad_input_raises_value_error",
             "test_mixed_precision_autocast", "test_mixed_precision_bf16_parameters")


@pytest.mark.parametrize("test", _CONTRACT)
def test_mimo_passes_the_contract_suite(test, monkeypatch):
    """The contract suite (test_contract.py) run on the example config with mimo_rank = 2."""
    import test_contract

    from seqmix.mixers.ssm import Mamba3
    base = Mamba3.example_config()
    monkeypatch.setattr(Mamba3, "example_config", classmethod(lambda cls: {**base, "mimo_rank": 2}))
    assert seqmix.mixer_entry("mamba3").example_config()["mimo_rank"] == 2
    fn = getattr(test_contract, test)
    if test == "test_mixed_precision_autocast":
        for dtype in (torch.bfloat16, torch.float16):
            fn("mamba3", dtype)
    else:
        fn("mamba3")
