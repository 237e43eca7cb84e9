"""The SSM mixers against hand-written references of the papers' / Mamba's semantics, their
initializations, every S4D init and discretization, S4's kernel length, and bad configs.
(The contract suite, tests/test_contract.py, runs on every one of them as well.)"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.analysis import reversed_sigmoid_transition
from seqmix.mixers.base import Cache
from seqmix.ops.ssm import krylov_kernel
from tolerances import F64_ATOL, assert_modes_agree_f64, max_abs


def build(name, **cfg):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **cfg).double().eval()


def inputs(B, T, d, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def scan_reference(x, delta, A, B, C, D):
    """Mamba's recurrence, written out per step: x, delta [b, T, d]; A [d, n]; B, C [b, T, n]."""
    h = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])
    ys = []
    for x_t, d_t, B_t, C_t in zip(x.unbind(1), delta.unbind(1), B.unbind(1), C.unbind(1)):
        h = torch.exp(d_t[..., None] * A) * h + (d_t * x_t)[..., None] * B_t[:, None, :]
        ys.append((h * C_t[:, None, :]).sum(-1) + D * x_t)
    return torch.stack(ys, 1)


def causal_conv(x, conv):
    """Mamba's conv1d: padding d_conv - 1, the first L outputs ([b, T, c] in and out)."""
    W = conv.weight.shape[1]
    y = F.conv1d(x.transpose(1, 2), conv.weight.unsqueeze(1), conv.bias, padding=W - 1, groups=x.shape[-1])
    return y[..., : x.shape[1]].transpose(1, 2)


# ------------------------------------------------------------------------------------------
# S6, Mamba, dsf_ssd
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_s6_equals_mamba_semantics(mode):
    m = build("s6", d_model=8, d_state=4, dt_rank=2, chunk_size=4, mode=mode)
    u = inputs(2, 11, 8)
    dt, B, C = m.x_proj(u).split([2, 4, 4], dim=-1)
    delta = F.softplus(dt @ m.dt_proj.weight.T + m.dt_bias)  # delta_softplus with the dt bias added inside
    A = -torch.exp(m.A_log)
    y = m.out_proj(scan_reference(u, delta, A, B, C, m.D))
    assert max_abs(m(u), y) < F64_ATOL


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_mamba_block_equals_mamba_semantics(mode):
    m = build("mamba", d_model=6, d_state=4, chunk_size=4, mode=mode)
    assert m.d_inner == 12 and m.dt_rank == 1
    u = inputs(2, 9, 6)
    x, z = m.in_proj(u).chunk(2, dim=-1)
    x = F.silu(causal_conv(x, m.conv))
    dt, B, C = m.x_proj(x).split([1, 4, 4], dim=-1)
    delta = F.softplus(dt @ m.dt_proj.weight.T + m.dt_bias)
    y = scan_reference(x, delta, -torch.exp(m.A_log), B, C, m.D) * F.silu(z)
    assert max_abs(m(u), m.out_proj(y)) < F64_ATOL


def test_dsf_ssd_is_s6_with_scalar_a_and_shared_delta():
    m = build("dsf_ssd", d_model=8, d_state=4)
    assert m.A_log.shape == () and not hasattr(m, "dt_proj") and m.dt_rank == 1
    u = inputs(2, 7, 8)
    dt, B, C = m.x_proj(u).split([1, 4, 4], dim=-1)
    delta = F.softplus(dt + m.dt_bias)  # one Δ pre-activation for every channel, per-channel bias
    A = -torch.exp(m.A_log) * torch.ones(8, 4, dtype=torch.float64)
    assert max_abs(m(u), m.out_proj(scan_reference(u, delta, A, B, C, m.D))) < F64_ATOL
    # DSF eq. (23): its transition is the reversed sigmoid to the power a, for every state
    with torch.no_grad():
        m.A_log.fill_(math.log(1.7))
    lam = m.dsf(u).lam.reshape(2, 7, 8, 4)
    want = reversed_sigmoid_transition(dt + m.dt_bias, 1.7).detach()
    assert max_abs(lam, want.unsqueeze(-1).expand_as(lam)) < 1e-12


def test_s6_initialization():
    m = seqmix.build_mixer("s6", d_model=32, d_state=8, dt_min=1e-3, dt_max=1e-1)
    assert m.dt_rank == 2  # ceil(32 / 16)
    assert max_abs(m.A_log, torch.log(torch.arange(1, 9, dtype=torch.float32)).repeat(32, 1)) == 0
    assert max_abs(-torch.exp(m.A_log[0]), -torch.arange(1, 9, dtype=torch.float32)) < 1e-5  # S4D-Real
    assert max_abs(m.D, torch.ones(32)) == 0
    dt = F.softplus(m.dt_bias.detach().double())
    assert float(dt.min()) >= 1e-3 * (1 - 1e-4) and float(dt.max()) <= 1e-1 * (1 + 1e-4)
    assert float(m.dt_proj.weight.detach().abs().max()) <= 2**-0.5
    ssd = seqmix.build_mixer("mamba2", d_model=32, headdim=8)
    A = torch.exp(ssd.A_log.detach())
    assert ssd.heads == 8 and float(A.min()) >= 1 and float(A.max()) <= 16


# ------------------------------------------------------------------------------------------
# SSD and Mamba-2
# ------------------------------------------------------------------------------------------


def ssd_reference(x, delta, A, B, C, D):
    """Per-head SSD recurrence: x [b, T, H, P], delta [b, T, H], A [H], B, C [b, T, H, N]."""
    S = x.new_zeros(x.shape[0], x.shape[2], B.shape[-1], x.shape[-1])  # [b, H, N, P]
    ys = []
    for x_t, d_t, B_t, C_t in zip(x.unbind(1), delta.unbind(1), B.unbind(1), C.unbind(1)):
        S = torch.exp(d_t * A)[..., None, None] * S + (d_t[..., None] * B_t)[..., None] * x_t[..., None, :]
        ys.append((C_t[..., None] * S).sum(-2) + D[:, None] * x_t)
    return torch.stack(ys, 1)


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_mamba2_equals_its_definition(mode):
    m = build("mamba2", d_model=8, d_state=4, headdim=4, groups=2, chunk_size=4, mode=mode)
    H, G, N, P, Di = 4, 2, 4, 4, 16
    u = inputs(2, 10, 8)
    z, xBC, dt = m.in_proj(u).split([Di, Di + 2 * G * N, H], dim=-1)
    xBC = F.silu(causal_conv(xBC, m.conv))
    x, B, C = xBC.split([Di, G * N, G * N], dim=-1)

    def heads(t):  # groups -> heads: head h reads group h // (H/G)
        return t.view(2, 10, G, 1, N).expand(2, 10, G, H // G, N).reshape(2, 10, H, N)

    delta = F.softplus(dt + m.dt_bias)
    y = ssd_reference(x.view(2, 10, H, P), delta, -torch.exp(m.A_log), heads(B), heads(C), m.D).reshape(2, 10, Di)
    g = (y * F.silu(z)).view(2, 10, G, Di // G)  # gated RMSNorm, gate first, one norm per group
    y = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).reshape(2, 10, Di) * m.norm.weight
    assert max_abs(m(u), m.out_proj(y)) < F64_ATOL


def test_bare_ssd_equals_its_definition():
    m = build("ssd", d_model=8, d_state=3, headdim=2, groups=1, chunk_size=4)
    u = inputs(2, 9, 8)
    B, C, dt = m.x_proj(u).split([3, 3, 4], dim=-1)
    delta = F.softplus(dt + m.dt_bias)
    rep = lambda t: t.unsqueeze(2).expand(2, 9, 4, 3)  # noqa: E731
    y = ssd_reference(u.view(2, 9, 4, 2), delta, -torch.exp(m.A_log), rep(B), rep(C), m.D).reshape(2, 9, 8)
    assert max_abs(m(u), m.out_proj(y)) < F64_ATOL


# ------------------------------------------------------------------------------------------
# S4 and S4D
# ------------------------------------------------------------------------------------------


def test_s4_kernel_equals_powers_of_its_discretized_system():
    m = build("s4", d_model=3, d_state=8, l_max=40)
    Ab, Bb, C = m._real_system()
    T = 40
    assert max_abs(m.kernel(T), krylov_kernel(Ab, Bb, C, T)) < F64_ATOL
    assert max_abs(m.kernel(17), krylov_kernel(Ab, Bb, C, 17)) < F64_ATOL  # shorter inputs: the first taps


def test_s4_longer_than_l_max():
    m = build("s4", d_model=4, d_state=6, l_max=16)
    x = inputs(2, 21, 4)
    m.mode = "fft"
    with pytest.raises(ValueError, match="'x'.*l_max"):
        m(x)
    with pytest.raises(ValueError, match="l_max"):
        m.phi(x)
    m.mode = "recurrent"
    y_rec = m(x)  # the recurrence has no length limit
    r = build("s4", d_model=4, d_state=6, l_max=16, on_longer="recompute", mode="fft")
    assert max_abs(r(x), y_rec) < F64_ATOL
    Ab, Bb, C = r._real_system()
    assert max_abs(r.kernel(21), krylov_kernel(Ab, Bb, C, 21)) < F64_ATOL


CASES = [(init, disc) for init in ("lin", "inv", "legs", "real") for disc in ("zoh", "bilinear") if (init, disc) != ("real", "bilinear")]


@pytest.mark.parametrize("init,disc", CASES)
def test_s4d_every_init_and_discretization(init, disc):
    m = build("s4d", d_model=3, d_state=6, init=init, discretization=disc, chunk_size=4, dt_max=0.5)
    T = 11
    log_Ab, Bb, C = m.discrete()
    K = krylov_kernel(log_Ab.exp(), Bb, C, T, structure="diagonal")
    K = 2 * K.real if K.is_complex() else K
    assert max_abs(m.kernel(T), K) < F64_ATOL
    x = inputs(2, T, 3)
    y_ref = assert_modes_agree_f64(m, x, f"s4d {init} {disc}")
    # decoding continues where the sequence stopped
    m.mode = "fft"
    cache = Cache()
    y = torch.cat([m(x[:, :5], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(5, T)], 1)
    assert max_abs(y, y_ref) < F64_ATOL


def test_s4d_legs_init_matches_hippo():
    m = build("s4d", d_model=2, d_state=8, init="legs")
    from seqmix.ops.ssm import nplr_legs

    Lam, _, B, _ = nplr_legs(8)
    lam = torch.complex(-m.log_A_real.exp(), m.A_imag)
    assert max_abs(lam[1], Lam) < 1e-6
    assert max_abs(torch.view_as_complex(m.B)[0], B) < 1e-6


# ------------------------------------------------------------------------------------------
# bad configs name the field
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,cfg,field",
    [
        ("s4", {"d_state": 7}, "d_state"),
        ("s4", {"on_longer": "truncate"}, "on_longer"),
        ("s4d", {"init": "fourier"}, "init"),
        ("s4d", {"d_state": 5}, "d_state"),
        ("s4d", {"init": "real", "discretization": "bilinear"}, "discretization"),
        ("s4d", {"discretization": "euler"}, "discretization"),
        ("s6", {"expand": 2}, "expand"),
        ("s6", {"d_model": 8, "dt_rank": 9}, "dt_rank"),
        ("s6", {"d_state": 0}, "d_state"),
        ("s6", {"dt_min": 0.5, "dt_max": 0.1}, "dt_min"),
        ("dsf_ssd", {"dt_rank": 2}, "dt_rank"),
        ("mamba", {"expand": 0}, "expand"),
        ("ssd", {"d_model": 16, "headdim": 5}, "headdim"),
        ("ssd", {"d_model": 16, "headdim": 4, "groups": 3}, "groups"),
        ("ssd", {"expand": 2}, "expand"),
        ("mamba2", {"d_model": 16, "headdim": 8, "groups": 8}, "groups"),
    ],
)
def test_bad_config_names_the_field(name, cfg, field):
    with pytest.raises(ValueError, match=field):
        seqmix.build_mixer(name, **cfg)


def test_phi_mamba_is_the_discrete_mamba2_block_written_out():
    """Phi-Mamba (MOHAWK's DiscreteMamba2): h_t = exp(−softplus(dt_t^h)) h_{t−1} + B_t x_t^hᵀ (A = −1, no dt bias, no Δ on the
    input), y_t = C_t h_t + D_h x_t, conv without activation, no norm, out_proj(y ⊙ SiLU(z + b_z)): per step by hand."""
    m = build("phi_mamba", d_model=16, d_state=8, headdim=8, groups=2)
    with torch.no_grad():
        m.z_bias.normal_(), m.D.normal_()
    assert not hasattr(m, "A_log") and not hasattr(m, "dt_bias")
    u = inputs(2, 11, 16)
    D, H, N, P = 16, 2, 8, 8
    z, xBC, dt = m.in_proj(u).split([D, D + 2 * H * N, H], -1)
    xBC = F.conv1d(F.pad(xBC.transpose(1, 2), (m.conv.width - 1, 0)), m.conv.weight.unsqueeze(1), m.conv.bias,
                   groups=xBC.shape[-1]).transpose(1, 2)  # causal, no activation
    x, Bm, Cm = xBC.split([D, H * N, H * N], -1)
    x, Bm, Cm = x.view(2, 11, H, P), Bm.view(2, 11, H, N), Cm.view(2, 11, H, N)
    h = torch.zeros(2, H, N, P, dtype=torch.float64)
    ys = []
    for t in range(11):
        h = torch.exp(-F.softplus(dt[:, t])).view(2, H, 1, 1) * h + Bm[:, t].unsqueeze(-1) * x[:, t].unsqueeze(-2)
        ys.append(torch.einsum("bhn,bhnp->bhp", Cm[:, t], h) + m.D.view(H, 1) * x[:, t])
    y = torch.stack(ys, 1).flatten(2) * F.silu(z + m.z_bias)
    want = m.out_proj(y)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(u), want) < F64_ATOL, mode
    # the same block with Mamba-2's choices is another map (the options are read)
    mamba2 = build("mamba2", d_model=16, d_state=8, headdim=8, groups=2, expand=1)
    assert max_abs(mamba2(u), want) > 1e-3
    with pytest.raises(ValueError, match="conv_activation"):
        seqmix.build_mixer("ssd", d_model=16, conv_activation="identity")
