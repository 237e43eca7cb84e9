"""Cyclic Flow Attention (the ``cyclic_flow_attention`` preset of Gated Slot Attention, slots='cyclic'): its core and
final states against flash-linear-attention's naive_recurrent_cyfa (float32 inside: F32_RTOL) on inputs made from the
mixer's weights as fla's layer makes them, and the whole layer's output; the clock's ops (phase reduction, the
orthonormal readout basis); the relative-time property (a clock offset changes nothing); config errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqmix
from fla_ref import fla_naive_package
from seqmix import Cache
from seqmix.ops import clock_atom, clock_phases, cyclic_readout, readout_basis
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, max_abs, rel_err


def _mixer(seed=0):
    torch.manual_seed(seed)
    m = seqmix.build_mixer("cyclic_flow_attention", d_model=16, heads=2, num_slots=8, conv_size=None, chunk_size=8).double().eval()
    with torch.no_grad():  # weights away from their initial values, so that the test sees them
        m.q_norm.weight.copy_(1 + 0.3 * torch.randn(m.K, dtype=torch.float64))
        m.k_norm.weight.copy_(1 + 0.3 * torch.randn(m.K, dtype=torch.float64))
        m.readout.add_(0.3 * torch.randn_like(m.readout))
        m.norm.weight.copy_(1 + 0.3 * torch.randn_like(m.norm.weight))
    return m


def test_cyfa_matches_fla_naive():
    naive = fla_naive_package("ops/cyfa", "naive", "naive_recurrent_cyfa", stub_triton=True)
    m = _mixer()
    B, T, H, K, V, M = 2, 19, m.H, m.K, m.V, m.M
    x = torch.randn(B, T, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    # fla's layer without the short convs, on the mixer's weights
    q, k, v = m.W_q(x).view(B, T, H, K), m.W_k(x).view(B, T, H, K), m.W_v(x).view(B, T, H, V)
    g = -m.A_log.exp() * F.softplus(m.W_a(x) + m.dt_bias)
    delta, beta = torch.sigmoid(m.W_delta(x)), torch.sigmoid(m.W_beta(x))
    o_ref, (hk, hv, lam) = naive(q, k, v, g, delta, beta, m.readout, m.q_norm.weight, m.k_norm.weight, m.config.norm_eps,
                                 m.config.norm_eps, scale=K ** -0.5, output_final_state=True)
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode
    cache = Cache()
    y = m(x, cache=cache)
    st = cache.get(m)
    assert rel_err(st["Sk"], hk) < F32_RTOL and rel_err(st["Sv"], hv) < F32_RTOL and rel_err(st["lam"], lam) < F32_RTOL
    # the layer's output: W_o(RMSNorm_h(o·(m − 1)) ⊙ σ(x W_g¹ W_g² + b))
    o = (o_ref.double() * (M - 1)).reshape(B, T, H, V)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + m.config.norm_eps)
    y_ref = m.W_o(o.reshape(B, T, H * V) * m.norm.weight * torch.sigmoid(m.W_g(x)))
    assert rel_err(y, y_ref) < F32_RTOL
    assert_decodes_splits_and_maps(m, x, "cyclic_flow_attention")


def test_cyfa_with_convs_decodes_and_splits():
    torch.manual_seed(0)
    m = seqmix.build_mixer("cyclic_flow_attention", d_model=16, heads=2, num_slots=6, chunk_size=8).double().eval()
    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert_decodes_splits_and_maps(m, x, "cyclic_flow_attention (convs)")


def test_a_clock_offset_changes_nothing():
    """Φ depends on the clock only through λ_t − λ_s: starting the clock at any λ_0 (empty memories) gives the same output."""
    m = _mixer(1)
    x = torch.randn(2, 13, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    _, o0 = m.core(x)
    zeros = {"Sk": torch.zeros(2, m.H, m.K, m.M, dtype=torch.float64), "Sv": torch.zeros(2, m.H, m.M, m.V, dtype=torch.float64)}
    for lam0 in (0.37, 5.0, 1234.56):
        state = {**zeros, "lam": torch.full((2, m.H), lam0, dtype=torch.float64)}
        out = m._forward(x, state=state, mode="chunk", need_state=False)
        assert max_abs(out.mixed, o0) < 1e-10, lam0
    # and the clock matters: the same tokens at a slower clock read other relative times
    with torch.no_grad():
        m.W_delta.bias.sub_(2.0)
    _, o1 = m.core(x)
    assert max_abs(o1, o0) > 1e-3


def test_clock_ops():
    P = 7
    F_ = readout_basis(P + 1, dtype=torch.float64)
    assert max_abs(F_ @ F_.T, torch.eye(P, dtype=torch.float64)) < F64_ATOL  # orthonormal rows over the P relative times
    # the atom at an integer clock time r is row r of the basis (its sines negated): a write at time r reads back at r
    for r in range(P):
        atom = clock_atom(torch.tensor(float(r), dtype=torch.float64), P + 1)
        assert max_abs(atom * torch.tensor([1.0, -1.0] * ((P + 1) // 2), dtype=torch.float64), F_[r]) < F64_ATOL
    # phases of a clock in the thousands, in float32: reduced in clock units, they keep float32's precision
    lam = torch.tensor([3001.3, 4095.77, 12345.6789], dtype=torch.float64)
    j = torch.arange(P + 1) // 2
    exact = torch.remainder(lam.unsqueeze(-1) * j * (2 * math.pi / P), 2 * math.pi)
    got = clock_phases(lam.float(), P + 1).double()
    assert (torch.cos(got) - torch.cos(exact)).abs().max() < 2e-3  # λ itself rounds to float32 (ulp 2e-4 at 4096)
    naive = (lam.float().unsqueeze(-1) * j.float() * (2 * math.pi / P)).double()
    assert (torch.cos(got) - torch.cos(exact)).abs().max() <= (torch.cos(naive) - torch.cos(exact)).abs().max()
    with pytest.raises(ValueError, match="even"):
        clock_atom(torch.zeros(3), 5)
    with pytest.raises(ValueError, match="'table'"):
        cyclic_readout(torch.zeros(1, 2, 3, 6), torch.zeros(1, 2, 3), torch.zeros(3, 4, 4))
    with pytest.raises(ValueError, match="'lam'"):
        cyclic_readout(torch.zeros(1, 2, 3, 6), torch.zeros(1, 2), torch.zeros(3, 5, 5))


def test_cyfa_config_errors():
    with pytest.raises(ValueError, match="even num_slots"):
        seqmix.build_mixer("cyclic_flow_attention", num_slots=7)
    with pytest.raises(ValueError, match="even num_slots"):
        seqmix.build_mixer("cyclic_flow_attention", num_slots=2)
    with pytest.raises(ValueError, match="slot_router"):
        seqmix.build_mixer("cyclic_flow_attention", num_slots=8, slot_router=2)
    with pytest.raises(ValueError, match="slot_gate"):
        seqmix.build_mixer("cyclic_flow_attention", num_slots=8, slot_gate="lse")
    with pytest.raises(ValueError, match="gate_rank"):
        seqmix.build_mixer("gsa", gate_rank=4)
