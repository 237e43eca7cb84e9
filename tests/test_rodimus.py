"""Rodimus (src/seqmix/mixers/linear_attention.py): the whole mixer against a float64 loop written from the
paper's and fla's layer equations; its core against flash-linear-attention's naive GLA reference (fla runs
Rodimus on chunk_gla / fused_recurrent_gla and ships no Rodimus-specific naive file; float32: F32_RTOL);
the input gate's temperature; config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from fla_ref import fla_naive
from seqmix.mixers.base import Cache
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, max_abs, rel_err

B = 2


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    m = seqmix.build_mixer("rodimus", **{**seqmix.mixer_entry("rodimus").example_config(), **overrides}).double().eval()
    with torch.no_grad():  # the skip and the norm start at 1: random values so that the test sees them
        m.skip.copy_(torch.randn(m.skip.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64))
    return m


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def loop(m, x):
    """Rodimus token by token (He et al. 2025 §3; fla's RodimusAttention): S_t = diag(exp(−g τ)) S_{t−1} + kᵀ v,
    k = g^τ k̂/‖k̂‖, o = q S / sqrt(n), y = W_down RMSNorm((o + w ⊙ s) ⊙ SiLU(z))."""
    Bt, T, _ = x.shape
    u, z = x @ m.W_up.weight.T, x @ m.W_gate.weight.T
    W, b = m.conv.weight, m.conv.bias  # [D, width]: s_t = SiLU(Σ_j W[:, j] u_{t − (width−1) + j} + b)
    width = W.shape[1]
    up = torch.cat([torch.zeros(Bt, width - 1, u.shape[-1], dtype=u.dtype), u], 1)
    s = F.silu(torch.stack([(up[:, t : t + width] * W.T).sum(1) for t in range(T)], 1) + b)
    S = torch.zeros(Bt, m.K, m.V, dtype=x.dtype)
    out = []
    for t in range(T):
        st = s[:, t]
        g = F.softplus(st @ m.W_g.weight.T + m.W_g.bias)
        tau = torch.sigmoid(st @ m.W_tau.weight.T + m.W_tau.bias)
        kh = st @ m.W_k.weight.T
        k = kh / kh.norm(dim=-1, keepdim=True) * g**tau
        v = torch.sigmoid(u[:, t] @ m.W_i[0].weight.T @ m.W_i[1].weight.T + m.W_i[1].bias) * u[:, t]
        S = torch.exp(-g * tau).unsqueeze(-1) * S + k.unsqueeze(-1) * v.unsqueeze(-2)
        o = (st @ m.W_q.weight.T).unsqueeze(1) @ S / m.K**0.5
        h = (o[:, 0] + m.skip * st) * F.silu(z[:, t])
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + m.config.norm_eps) * m.norm.weight
        out.append(h @ m.W_down.weight.T)
    return torch.stack(out, 1)


def test_rodimus_equals_the_loop():
    m = build()
    x = randn(B, 13, m.d_model)
    ref = loop(m, x)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), ref) < F64_ATOL, mode
    cache = Cache()
    y = torch.cat([m(x[:, :6], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(6, 13)], 1)
    assert max_abs(y, ref) < F64_ATOL
    assert_decodes_splits_and_maps(m, x, "rodimus")


def test_rodimus_core_matches_fla_naive_gla():
    naive = fla_naive("ops/gla/naive.py", "naive_recurrent_gla")
    m = build()
    x = randn(B, 13, m.d_model)
    q, k, v, g, *_ = m._params(x, None, False)
    o_ref, _ = naive(q, k, v, g)  # fla's GLA: scale n^{-1/2}, key-wise log-decay
    _, mixed = m.core(x)
    assert rel_err(mixed, o_ref) < F32_RTOL


def test_rodimus_sizes_and_gate():
    m = seqmix.build_mixer("rodimus", d_model=100)  # d_inner = 200 rounded up to a multiple of 8
    assert m.V == 200 and m.K == 64 and m.W_i[0].out_features == 16
    assert m.state_size() == 64 * 200 + 200 * 3
    assert seqmix.build_mixer("rodimus", d_model=20).V == 40 and seqmix.build_mixer("rodimus", d_model=13).V == 32
    # the decay exp(−gτ) is in (0, 1): the DSF's decays
    mm = build()
    lam = mm.decays(randn(B, 7, mm.d_model))
    assert lam.min() > 0 and lam.max() < 1


def test_rodimus_config_errors():
    with pytest.raises(ValueError, match="mem_size"):
        seqmix.build_mixer("rodimus", mem_size=0)
    with pytest.raises(ValueError, match="expand"):
        seqmix.build_mixer("rodimus", expand=-1)
