"""The ATK preconditioner of the delta rule (DeltaNet's ``preconditioner='atk'``; presets precond_gated_deltanet and
precond_kda): the cores against flash-linear-attention's naive references (float32 inside: F32_RTOL) on inputs
made from the mixers' weights as fla's layers make them, the preconditioner's range, decoding with A carried,
and config errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import seqmix
from fla_ref import fla_naive
from seqmix.mixers.base import Cache
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, max_abs, rel_err

B, T = 2, 13


def build(name, seed=0, **overrides):
    torch.manual_seed(seed)
    m = seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), "conv_size": None, **overrides}).double().eval()
    with torch.no_grad():  # a centre per head away from its init, so that the test sees it
        m.precond_center.copy_(torch.linspace(-1.0, 0.5, m.H, dtype=torch.float64))
    return m


def fla_inputs(m, x):
    """q, k (L2-normalized), v, log α (per head or key-wise), β, and the ATK's log γ and β^A, as fla's layers make them."""
    H, K, V = m.H, m.K, m.V
    q = F.normalize(F.silu(m.W_q(x)).view(B, T, H, K), dim=-1)
    k = F.normalize(F.silu(m.W_k(x)).view(B, T, H, K), dim=-1)
    v = F.silu(m.W_v(x)).view(B, T, H, V)
    beta = torch.sigmoid(m.W_beta(x))
    if m.config.decay == "head":
        g = -m.A_log.exp() * F.softplus(m.W_a(x) + m.dt_bias)
    else:
        g = -m.A_log.exp().view(H, 1) * F.softplus(m.W_a(x) + m.dt_bias).view(B, T, H, K)
    a, b = m.W_atk(x).split(H, dim=-1)
    g_atk = -m.A_log_atk.exp() * F.softplus(a + m.dt_bias_atk)
    return q, k, v, g, beta, g_atk, torch.sigmoid(b)


def test_precond_gated_deltanet_matches_fla_naive():
    naive = fla_naive("ops/precond_gated_delta_rule/naive.py", "naive_recurrent_precond_gated_delta_rule")
    m = build("precond_gated_deltanet")
    x = torch.randn(B, T, m.d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    q, k, v, g, beta, g_atk, beta_atk = fla_inputs(m, x)
    o_ref, S_ref, A_ref = naive(q, k, v, g_atk, g, beta_atk, beta, scale=m.K**-0.5, output_final_state=True,
                                log_atk_scale=m.precond_center)
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode
    cache = Cache()
    m(x, cache=cache)
    assert rel_err(cache.get(m)["S"], S_ref) < F32_RTOL and rel_err(cache.get(m)["A"][:, :, 0], A_ref) < F32_RTOL
    assert_decodes_splits_and_maps(m, x, "precond_gated_deltanet")


def test_precond_kda_matches_fla_naive():
    naive = fla_naive("ops/precond_kda/naive.py", "naive_recurrent_precond_kda")
    m = build("precond_kda")
    x = torch.randn(B, T, m.d_model, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    q, k, v, g, beta, g_atk, beta_atk = fla_inputs(m, x)
    o_ref, *_ = naive(q, k, v, g, g_atk, beta_atk, beta, scale=m.K**-0.5, log_atk_scale=m.precond_center)
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode


def test_preconditioner_range_and_decoding():
    """k̃/k ∈ (1/x, x); decoding token by token carries A_t."""
    m = build("precond_gated_deltanet", precond_x=2.0)
    x = torch.randn(B, T, m.d_model, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    P = m._params(x, None, False)
    ratio = P.k / P.p
    assert ratio.min() > 1 / 2 and ratio.max() < 2
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    assert max_abs(steps, y) < F64_ATOL
    assert cache.get(m)["A"].shape == (B, m.H, 1, m.K)
    assert m.state_size() == m.H * m.K * m.V + m.H * m.K
    assert math.isclose(float(m.precond_center.detach()[0]), -1.0)


def test_preconditioner_config_errors():
    with pytest.raises(ValueError, match="preconditioner"):
        seqmix.build_mixer("precond_kda", channel_gates=True)
    with pytest.raises(ValueError, match="preconditioner"):
        seqmix.build_mixer("precond_gated_deltanet", heads=4, k_heads=2)
    with pytest.raises(ValueError, match="precond_x"):
        seqmix.build_mixer("precond_kda", precond_x=1.0)
