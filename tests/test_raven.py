"""Raven (the ``raven`` preset of Gated Slot Attention: routed slots): its core against flash-linear-attention's
naive_recurrent_gsa (float32 inside: F32_RTOL) on the slot gates and write weights made from the mixer's weights as
fla's Raven layer makes them; unrouted slots neither decay nor are written; config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from fla_ref import fla_naive
from tolerances import F32_RTOL, assert_decodes_splits_and_maps, rel_err


def test_raven_core_matches_fla_naive_gsa():
    naive = fla_naive("ops/gsa/naive.py", "naive_recurrent_gsa")
    torch.manual_seed(0)
    m = seqmix.build_mixer("raven", d_model=16, heads=2, num_slots=6, slot_router=3).double().eval()
    with torch.no_grad():  # norm weights away from 1, so that the test sees them
        m.q_norm.weight.copy_(1 + 0.3 * torch.randn(m.K, dtype=torch.float64))
        m.k_norm.weight.copy_(1 + 0.3 * torch.randn(m.K, dtype=torch.float64))
    x = torch.randn(2, 17, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    B, T, H, K, V, M = 2, 17, m.H, m.K, m.V, m.M
    rms = lambda t, w: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + m.config.norm_eps) * w  # noqa: E731
    q = rms(F.silu(m.W_q(x)).view(B, T, H, K), m.q_norm.weight)
    k = rms(F.silu(m.W_k(x)).view(B, T, H, K), m.k_norm.weight)
    v = F.silu(m.W_v(x)).view(B, T, H, V)
    f = (-m.A_log.exp() * F.softplus(m.W_a(x) + m.dt_bias)).unsqueeze(-1)  # [B, T, H, 1]
    r = torch.sigmoid(m.W_router(x)).view(B, T, H, M)
    idx = r.topk(3, dim=-1).indices
    w = torch.gather(r, -1, idx)
    multihot = torch.zeros_like(r).scatter(-1, idx, w / (w.sum(-1, keepdim=True) + 1e-9))
    g = f * multihot
    o_ref, _ = naive(q, k, v, 1 - g.exp(), g, scale=1.0)
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode
    P = m._params(x)
    routed = multihot > 0
    assert (P.la[~routed] == 0).all() and (P.s[~routed] == 0).all() and (P.la[routed] < 0).all()
    assert_decodes_splits_and_maps(m, x, "raven")


def test_raven_config_errors():
    with pytest.raises(ValueError, match="slot_router"):
        seqmix.build_mixer("raven", num_slots=4, slot_router=5)
    with pytest.raises(ValueError, match="slot_router"):
        seqmix.build_mixer("raven", num_slots=8, slot_router=2, slot_gate="lse")
