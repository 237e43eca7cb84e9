"""Long convolutions: H3, Hyena, GSS beyond the contract suite.

FFT == direct convolution for every mixer's filters and the causal maps; H3's recurrent
modes == its convolution mode (and its SISO, shift-SSM and linear-attention special
cases); Hyena's decoding recurrence == its causal matrix form, both order conventions,
order 2 (code) == the H3 structure; GSS == its equations; diagonal_ssm_conv == the
recurrence; bad input.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix import Cache
from seqmix.mixers.convolution import positional_encoding
from seqmix.ops import linear_recurrence
from seqmix.ops.conv import causal_conv1d, direct_conv, fft_conv, toeplitz
from seqmix.ops.ssm import diagonal_ssm_conv, krylov_kernel, vandermonde
from tolerances import F64_ATOL, assert_modes_agree_f64, max_abs


def build(name, **cfg):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **cfg).double().eval()


def inputs(B, T, d, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def example(name, **over):
    return build(name, **{**seqmix.mixer_entry(name).example_config(), **over})


def filters_of(m, T):
    """Every long (and short) filter a mixer convolves with, each [T, channels]."""
    if m.registry_name == "h3":
        return [m.shift_kernel(T), m.kernel(T).t()]
    if m.registry_name == "hyena":
        return list(m.filters(T)[0].unbind(0))
    return [m.kernel(T).t()]  # gss


# ------------------------------------------------------------------------------------------
# FFT == direct convolution; causal maps
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["h3", "hyena", "gss"])
@pytest.mark.parametrize("T", [32, 37])  # a power of two and not
def test_fft_equals_direct_for_every_filter(name, T):
    m = example(name)
    with torch.no_grad():
        for k in filters_of(m, T):
            assert k.shape[0] == T
            u = inputs(2, T, k.shape[1], seed=3)
            y_fft, y_dir = fft_conv(u, k), direct_conv(u, k)
            y_mat = torch.einsum("cts,bsc->btc", toeplitz(k, T), u)
            assert max_abs(y_fft, y_dir) < F64_ATOL
            assert max_abs(y_mat, y_dir) < F64_ATOL
            assert float(k.abs().max()) > 0  # a real filter, not zeros
            assert torch.triu(toeplitz(k, T), diagonal=1).abs().max() == 0


@pytest.mark.parametrize("name", ["h3", "hyena", "gss"])
def test_causal_map_has_nothing_above_the_diagonal(name):
    m = example(name)
    x = inputs(2, 37, m.d_model)
    phi = m.phi(x)
    assert torch.triu(phi, diagonal=1).abs().max() == 0
    assert torch.tril(phi).abs().max() > 0
    values, mixed = m.core(x, mode="fft")  # the map reproduces the FFT mode too
    assert max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed) < F64_ATOL


@pytest.mark.parametrize("name", ["h3", "hyena", "gss"])
@pytest.mark.parametrize("T", [1, 5, 37, 100])
def test_any_length_works_in_every_mode(name, T):
    m = example(name, **({"l_max": 128} if name == "hyena" else {}))
    x = inputs(2, T, m.d_model)
    m.mode = m.reference_mode
    y_ref = m(x)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_ref) < F64_ATOL, mode


# ------------------------------------------------------------------------------------------
# H3
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        {"head_dim": 1, "init": "lin"},
        {"head_dim": 4, "init": "lin", "discretization": "bilinear"},
        {"head_dim": 2, "init": "real"},
        {"head_dim": 8, "init": "legs"},
    ],
)
def test_h3_recurrent_equals_convolution(cfg):
    m = build("h3", d_model=8, d_state=6, shift_size=3, chunk_size=4, dt_max=0.5, **cfg)
    x = inputs(2, 13, 8)
    y_ref = assert_modes_agree_f64(m, x, "h3")
    # a prompt in one mode, then decoding: the state has one layout in every mode
    for mode in ("fft", "chunk"):
        m.mode = mode
        cache = Cache()
        y = torch.cat([m(x[:, :6], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(6, 13)], 1)
        assert max_abs(y, y_ref) < F64_ATOL, mode


def test_h3_siso_is_the_elementwise_formula():
    """head_dim = 1: o = q ⊙ (K * (k̃ ⊙ v) + D k̃ ⊙ v) per channel (convblog note §12.2)."""
    m = build("h3", d_model=6, head_dim=1, d_state=4, shift_size=3)
    x = inputs(2, 11, 6)
    q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)
    k_shift = direct_conv(k, m.shift_kernel(11))
    s = direct_conv(k_shift * v, m.kernel(11).t(), m.D)
    assert max_abs(m(x), m.out_proj(q * s)) < F64_ATOL


def test_h3_shift_ssm_is_the_shift_matrix_system():
    """The shift SSM (A = shift matrix, B = e_1, C^s, D^s) has the FIR kernel C^s (+ D^s at lag 0),
    and causal_conv1d runs exactly that convolution."""
    m = build("h3", d_model=5, d_state=4, shift_size=6)
    N, T = 6, 10
    A = torch.diag(torch.ones(N - 1, dtype=torch.float64), -1).expand(5, N, N)  # x_t = [k_t, k_(t-1), ...]
    e1 = torch.zeros(5, N, dtype=torch.float64)
    e1[:, 0] = 1
    K = krylov_kernel(A, e1, m.shift_C, T)  # [5, T]
    K[:, 0] += m.shift_D
    assert max_abs(K.t(), m.shift_kernel(T)) < F64_ATOL
    assert float(K[:, N:].detach().abs().max()) == 0  # an FIR filter of length N
    k = inputs(2, T, 5)
    y, _ = causal_conv1d(k, m._shift_weight())
    assert max_abs(y, direct_conv(k, m.shift_kernel(T))) < F64_ATOL


def test_h3_with_unit_kernel_is_linear_attention():
    """Shift = identity, D = 0 and the all-ones kernel (Ā = B̄ = C = 1, N = 1): unnormalized linear
    attention with φ = id, o_t = Σ_(s<=t) (q_t·k_s) v_s (convblog note §12.4)."""
    m = build("h3", d_model=8, head_dim=4, d_state=1, init="real")
    with torch.no_grad():
        m.shift_C.zero_()
        m.shift_C[:, 0] = 1
        m.shift_D.zero_()
        m.log_A_real.fill_(-math.inf)  # λ = 0: Ā = 1, B̄ = Δ·B
        m.log_dt.zero_()
        m.B.fill_(1)
        m.C.fill_(1)
        m.D.zero_()
    x = inputs(2, 9, 8)
    q, k, v = (p(x).view(2, 9, 2, 4) for p in (m.q_proj, m.k_proj, m.v_proj))
    scores = torch.einsum("bthk,bshk->bhts", q, k).tril()
    o = torch.einsum("bhts,bshv->bthv", scores, v)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), m.out_proj(o.flatten(2))) < F64_ATOL, mode


# ------------------------------------------------------------------------------------------
# Hyena
# ------------------------------------------------------------------------------------------

HYENA_CASES = [("code", 2), ("code", 3), ("paper", 1), ("paper", 2), ("paper", 3)]


@pytest.mark.parametrize("convention,order", HYENA_CASES)
def test_hyena_recurrence_equals_causal_matrix_form(convention, order):
    """Token-by-token decoding (the exact step: each filter's past inputs kept) == W_out (Φ v)
    with Φ = D_(x^N)(T_(h^N) + b^N I) ⋯ from phi(x)."""
    m = build("hyena", d_model=6, order=order, order_convention=convention, l_max=32, filter_order=8, emb_dim=5)
    T = 14
    x = inputs(2, T, 6)
    values, _ = m.core(x)
    y_matrix = m.out_proj(torch.einsum("bcts,bsc->btc", m.phi(x), values[..., 0]))
    cache = Cache()
    y_steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    assert max_abs(y_steps, y_matrix) < F64_ATOL
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), y_matrix) < F64_ATOL, mode
    assert cache.get(m)["z"].shape == (2, T, order - (convention == "code"), 6)


def _identity_short_conv(hy):
    with torch.no_grad():
        hy.short_conv.weight.zero_()
        hy.short_conv.weight[:, -1] = 1
        hy.short_conv.bias.zero_()


def test_hyena_order_2_code_convention_is_the_h3_structure():
    """Hyena (code convention, order 2) = x^2 ⊙ (h * (x^1 ⊙ v) + b x^1 ⊙ v) = D_q T_h D_k v: H3 with
    head_dim 1, q = x^2, k = x^1, the shift SSM the identity and the diagonal SSM's kernel as h."""
    d, T = 6, 15
    h3 = build("h3", d_model=d, head_dim=1, d_state=4, shift_size=3)
    hy = build("hyena", d_model=d, order=2, order_convention="code", l_max=32, filter_order=8, emb_dim=5)
    with torch.no_grad():
        h3.shift_C.zero_()
        h3.shift_C[:, 0] = 1  # k̃ = k
        h3.shift_D.zero_()
        # Hyena's streams [v, x^1, x^2] = [v, k, q]
        hy.in_proj.weight.copy_(torch.cat([h3.v_proj.weight, h3.k_proj.weight, h3.q_proj.weight]))
        hy.in_proj.bias.copy_(torch.cat([h3.v_proj.bias, h3.k_proj.bias, h3.q_proj.bias]))
        hy.out_proj.load_state_dict(h3.out_proj.state_dict())
    _identity_short_conv(hy)
    hy.filters = lambda L: (h3.kernel(L).t().unsqueeze(0), h3.D.unsqueeze(0))  # h = the S4D kernel, b = D
    x = inputs(2, T, d)
    for mode in ("fft", "recurrent"):
        h3.mode = mode
        for hmode in hy.modes:
            hy.mode = hmode
            assert max_abs(hy(x), h3(x)) < F64_ATOL, (mode, hmode)
    assert max_abs(hy.phi(x), h3.phi(x)) < F64_ATOL  # the same [B, d, T, T] maps (heads = channels)


def test_hyena_paper_convention_with_delta_first_filter_equals_code_convention():
    d, T = 5, 12
    code = build("hyena", d_model=d, order=3, order_convention="code", l_max=16, filter_order=8, emb_dim=5)
    paper = build("hyena", d_model=d, order=3, order_convention="paper", l_max=16, filter_order=8, emb_dim=5)
    paper.in_proj.load_state_dict(code.in_proj.state_dict())
    paper.short_conv.load_state_dict(code.short_conv.state_dict())
    paper.out_proj.load_state_dict(code.out_proj.state_dict())

    def with_delta(L):
        h, b = code.filters(L)
        delta = torch.zeros(1, L, d, dtype=h.dtype)
        delta[0, 0] = 1
        return torch.cat([delta, h]), torch.cat([torch.zeros(1, d, dtype=b.dtype), b])

    paper.filters = with_delta
    x = inputs(2, T, d)
    assert max_abs(paper(x), code(x)) < F64_ATOL
    assert max_abs(paper.phi(x), code.phi(x)) < F64_ATOL
    def not_delta(L):  # an h^1 that is not δ changes the operator: the comparison can fail
        h, b = with_delta(L)
        return torch.cat([h[1:2], h[1:]]), b

    paper.filters = not_delta
    assert max_abs(paper(x), code(x)) > 1e-3


def test_hyena_filter_taps_do_not_depend_on_the_length():
    m = build("hyena", d_model=4, order=3, l_max=40, filter_order=8, emb_dim=7)
    h40, b = m.filters(40)
    h17, _ = m.filters(17)
    assert h40.shape == (2, 40, 4) and b.shape == (2, 4)
    assert max_abs(h40[:, :17], h17) == 0
    # the parameter count does not depend on l_max
    n = sum(p.numel() for p in m.parameters())
    assert n == sum(p.numel() for p in build("hyena", d_model=4, order=3, l_max=400, filter_order=8, emb_dim=7).parameters())


def test_hyena_window_is_the_exponential_decay():
    kw = dict(d_model=4, order=2, l_max=50, filter_order=8, emb_dim=5)
    on, off = build("hyena", **kw), build("hyena", modulate=False, **kw)
    h_on, h_off = on.filter(50), off.filter(50)  # same seed, same FFN
    t = torch.linspace(0, 1, 50, dtype=torch.float64).unsqueeze(-1)
    # channel c decays to 1e-2 at between 30% (fastest, last channel) and 150% (slowest, first) of l_max
    delta = torch.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, 4, dtype=torch.float64).abs()
    assert max_abs(h_on, h_off * torch.exp(-t * delta)) < 1e-6  # t, δ are float32 buffers cast to float64
    assert abs(math.exp(-0.3 * float(delta[-1])) - 1e-2) < 1e-6


def test_positional_encoding():
    z, t = positional_encoding("fourier", 10, 5)
    assert z.shape == (10, 5) and t.shape == (10, 1)
    assert max_abs(z[:, 0:1], t) == 0 and float(t[-1]) == 1.0
    w = 2 * math.pi * torch.arange(10) / 10
    assert max_abs(z[:, 2], torch.cos(1.0 * w)) < 1e-6  # band f = 1
    assert max_abs(z[:, 4], -torch.sin(1.0 * w)) < 1e-6
    z, t = positional_encoding("time", 10, 1)
    assert z.shape == (10, 1)


def test_hyena_state_grows_with_the_context():
    m = example("hyena")
    for T in (3, 11):
        cache = Cache()
        m(inputs(2, T, m.d_model), cache=cache)
        assert cache.floats() == 2 * m.state_size(seq_len=T)
    assert m.state_size(20) - m.state_size(10) == 10 * m.n_filters * m.d_model
    with pytest.raises(ValueError, match="seq_len"):
        m.state_size()
    with pytest.raises(ValueError, match="finite-state"):
        m.dsf(inputs(1, 4, m.d_model))


# ------------------------------------------------------------------------------------------
# GSS
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("simplified", [False, True])
def test_gss_is_its_equations(simplified):
    cfg = dict(d_model=6, d_gate=10, d_state=4, simplified=simplified)
    if not simplified:
        cfg["d_ssm"] = 3
    m = build("gss", **cfg)
    x = inputs(2, 12, 6)
    U, V = F.gelu(m.W_u(x)), F.gelu(m.W_v(x))
    V_hat = direct_conv(V, m.kernel(12).t(), m.D)
    uc = V_hat if simplified else m.W_3(V_hat)
    assert (m.W_3 is None) == simplified and m.d_ssm == (10 if simplified else 3)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), m.W_o(U * uc)) < F64_ATOL, mode


def test_gss_kernel_is_dss_exp():
    """K_l = Re Σ_n w_n (e^(λ_nΔ) - 1)/λ_n e^(λ_n lΔ) with w = 2·C·B (DSS-EXP, B folded into w)."""
    m = build("gss", d_model=4, d_ssm=3, d_state=8)
    lam = torch.complex(-m.log_A_real.exp(), m.A_imag)  # [H, M]
    dt = m.log_dt.exp().unsqueeze(-1)
    w = 2 * torch.view_as_complex(m.C) * torch.view_as_complex(m.B)
    ls = torch.arange(20, dtype=torch.float64)
    K = (w.unsqueeze(-1) * ((lam * dt).exp() - 1).unsqueeze(-1) / lam.unsqueeze(-1) * torch.exp(lam.unsqueeze(-1) * ls * dt.unsqueeze(-1))).sum(1).real
    assert max_abs(m.kernel(20), K) < F64_ATOL


# ------------------------------------------------------------------------------------------
# the op: diagonal_ssm_conv == the recurrence, with a carried state
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("complex_", [True, False])
def test_diagonal_ssm_conv_equals_the_recurrence(complex_):
    g = torch.Generator().manual_seed(0)
    B, T, H, M = 2, 23, 3, 4
    re = -torch.rand(H, M, generator=g, dtype=torch.float64) * 0.5 - 0.01
    if complex_:
        log_Ab = torch.complex(re, torch.randn(H, M, generator=g, dtype=torch.float64))
        Bb, C = (torch.randn(H, M, generator=g, dtype=torch.complex128) for _ in range(2))
        h0 = torch.randn(B, H, M, generator=g, dtype=torch.complex128)
    else:
        log_Ab = re
        Bb, C = (torch.randn(H, M, generator=g, dtype=torch.float64) for _ in range(2))
        h0 = torch.randn(B, H, M, generator=g, dtype=torch.float64)
    D = torch.randn(H, generator=g, dtype=torch.float64)
    u = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    y, S = diagonal_ssm_conv(u, log_Ab, Bb, C, D, initial_state=h0, output_final_state=True, conj_pairs=complex_)

    def seq(t):
        return t.expand(B, T, H, M)

    o, S_ref = linear_recurrence(seq(C), seq(Bb), u.unsqueeze(-1), seq(log_Ab), initial_state=h0.unsqueeze(-1),
                                 output_final_state=True, mode="recurrent")
    o = 2 * o[..., 0].real if complex_ else o[..., 0]
    assert max_abs(y, o + D * u) < F64_ATOL
    assert max_abs(S, S_ref[..., 0]) < F64_ATOL
    with pytest.raises(ValueError, match="initial_state"):
        diagonal_ssm_conv(u, log_Ab, Bb, C, D, initial_state=h0[:, :2])


@pytest.mark.parametrize("L", [1, 2, 7, 1000, 1024])
def test_vandermonde_blocks_equal_the_direct_powers(L):
    """The two-level Vandermonde product (z^(jb+r) = z^(jb)·z^r, one matmul) == Σ_n c_n exp(l·log z_n),
    values and gradients, for batched coefficients against shared nodes."""
    g = torch.Generator().manual_seed(1)
    log_z = torch.complex(-torch.rand(3, 5, generator=g, dtype=torch.float64) * 0.01, torch.randn(3, 5, generator=g, dtype=torch.float64))
    c = torch.randn(2, 3, 5, generator=g, dtype=torch.complex128)
    log_z.requires_grad_(True)
    c.requires_grad_(True)
    V = vandermonde(c, log_z, L)
    ref = (c.unsqueeze(-1) * torch.exp(log_z.unsqueeze(-1) * torch.arange(L, dtype=torch.float64))).sum(-2)
    assert V.shape == (2, 3, L)
    assert max_abs(V, ref) < F64_ATOL
    w = torch.randn(V.shape, generator=g, dtype=torch.complex128)
    for a, b in zip(torch.autograd.grad((V * w).real.sum(), [c, log_z]), torch.autograd.grad((ref * w).real.sum(), [c, log_z])):
        assert max_abs(a, b) < 1e-8 * max(1.0, float(b.abs().max()))


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,cfg,field",
    [
        ("hyena", {"order": 0}, "order"),
        ("hyena", {"order": 0, "order_convention": "paper"}, "order"),
        ("hyena", {"order": 1, "order_convention": "code"}, "order"),
        ("hyena", {"order_convention": "safari"}, "order_convention"),
        ("hyena", {"positional_encoding": "rotary"}, "positional_encoding"),
        ("hyena", {"emb_dim": 4}, "emb_dim"),
        ("hyena", {"positional_encoding": "time", "emb_dim": 3}, "emb_dim"),
        ("hyena", {"l_max": 0}, "l_max"),
        ("hyena", {"decay_target": 1.5}, "decay_target"),
        ("h3", {"d_model": 16, "head_dim": 3}, "head_dim"),
        ("h3", {"d_state": 5}, "d_state"),
        ("h3", {"shift_size": 0}, "shift_size"),
        ("gss", {"simplified": True, "d_gate": 8, "d_ssm": 4}, "d_ssm"),
        ("gss", {"init": "fourier"}, "init"),
    ],
)
def test_bad_config_names_the_field(name, cfg, field):
    with pytest.raises(ValueError, match=field):
        seqmix.build_mixer(name, **cfg)


def test_filter_shorter_than_the_sequence_names_the_argument():
    m = build("hyena", d_model=4, l_max=10, filter_order=8, emb_dim=5)
    for mode in m.modes:
        m.mode = mode
        with pytest.raises(ValueError, match="'x'.*l_max"):
            m(inputs(1, 11, 4))
    with pytest.raises(ValueError, match="l_max"):
        m.phi(inputs(1, 11, 4))
    cache = Cache()  # a context that runs past the filter: 8 cached + 3 new
    m(inputs(1, 8, 4), cache=cache)
    with pytest.raises(ValueError, match="'x'.*8 cached.*l_max"):
        m(inputs(1, 3, 4), cache=cache)
    with pytest.raises(ValueError, match="'k'"):  # the op itself: a filter shorter than the sequence
        fft_conv(inputs(1, 11, 4), torch.randn(10, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="positional_encoding"):
        positional_encoding("learned", 10, 3)


def test_short_conv_is_lfm2s_gated_conv():
    """short_conv: y = out_proj(c ⊙ conv(b ⊙ x)), written out with torch's Conv1d; Φ reaches back W - 1
    tokens exactly; decoding carries the last W - 1 products."""
    import seqmix
    from seqmix import Cache

    torch.manual_seed(0)
    m = seqmix.build_mixer("short_conv", d_model=8, width=3, bias=True).double().requires_grad_(False)  # values only
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    b, c, v = m.in_proj(x).chunk(3, -1)
    conv = torch.nn.functional.conv1d((b * v).transpose(1, 2), m.conv.weight.unsqueeze(1), m.conv.bias, padding=2, groups=8)
    want = m.out_proj(c * conv[..., :11].transpose(1, 2))
    for mode in m.modes:
        m.mode = mode
        assert (y := m(x).detach()).shape == want.shape and float((y - want).abs().max()) < 1e-12, mode
    phi = m.phi(x)
    i, j = torch.arange(11)[:, None], torch.arange(11)[None, :]
    assert float(phi[..., (i - j >= 3) | (j > i)].abs().max()) == 0 and float(phi[..., i - j == 2].abs().min()) > 0
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(11)], 1)
    assert float((steps - want).abs().max()) < 1e-12 and cache.get(m)["conv"].shape == (2, 8, 2)
    assert m.state_size() == 16 and float(m.spectrum(x).abs().max()) == 0


def test_rwkv_channel_mix_is_rwkvs_feed_forward():
    """rwkv_channel_mix: y = σ(W_r x_r) ⊙ W_v relu(W_k x_k)², x_□ = μ_□ x_t + (1 - μ_□) x_(t-1), written out
    with an explicit shift; decoding carries x_(t-1) only; Φ is bidiagonal, its DSF the 2-state shift register."""
    torch.manual_seed(0)
    m = seqmix.build_mixer("rwkv_channel_mix", d_model=8, d_ff=12).double().requires_grad_(False)
    with torch.no_grad():
        m.mu_k.copy_(torch.rand(8, dtype=torch.float64))
        m.mu_r.copy_(torch.rand(8, dtype=torch.float64))
    x = torch.randn(2, 11, 8, dtype=torch.float64)
    prev = F.pad(x, (0, 0, 1, 0))[:, :-1]
    xk, xr = m.mu_k * x + (1 - m.mu_k) * prev, m.mu_r * x + (1 - m.mu_r) * prev
    want = torch.sigmoid(xr @ m.W_r.weight.T) * (torch.relu(xk @ m.W_k.weight.T) ** 2 @ m.W_v.weight.T)
    assert max_abs(m(x), want) < F64_ATOL
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(11)], 1)
    assert max_abs(steps, want) < F64_ATOL and max_abs(cache.get(m)["x_prev"], x[:, -1]) == 0
    phi = m.phi(x)[0]
    mu = torch.cat([m.mu_k, m.mu_r])
    bidiagonal = torch.diag_embed(mu[:, None].expand(16, 11)) + torch.diag_embed((1 - mu)[:, None].expand(16, 10), -1)
    assert max_abs(phi, bidiagonal) == 0
    values, mixed = m.core(x)
    assert max_abs(m.dsf(x).evaluate(values.reshape(2, 11, 16)), mixed.reshape(2, 11, 16)) < F64_ATOL
    assert m.state_size() == 8 and float(m.spectrum(x).abs().max()) == 0
