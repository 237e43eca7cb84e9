"""Strip Mamba and Bilinear Mamba (B'MOJO App. E) against their equations written out, and
against S6 (the cross-check the paper's explicit recurrence is for).
(The contract suite, tests/test_contract.py, runs on both as well.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from tolerances import F64_ATOL, max_abs, rel_err


def build(name, **cfg):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{"d_model": 8, "d_state": 4, **cfg}).double().eval()


def inputs(T=12, B=2, d=8, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def eq25(u, P, dt_bias=None, first_order=False, min_decay=0.0):
    """Eq. (25) per step: Δ = softplus(P_Δup P_Δdown u), x_t = a_t ⊙ x_{t-1} + Diag(Δ) u uᵀ P_Bᵀ,
    y_t = x_t P_Cᵀ u_t + D ⊙ u_t, with a_t = exp(Diag(Δ) A) or (App. E.1) 1 + Diag(Δ) A."""
    x = u.new_zeros(u.shape[0], u.shape[2], P["A"].shape[1])
    ys = []
    for u_t in u.unbind(1):
        pre = u_t @ P["P_dt_down"].T @ P["P_dt_up"].T
        delta = F.softplus(pre + (dt_bias if dt_bias is not None else 0))
        dA = delta.unsqueeze(-1) * P["A"]
        a = (1 + dA).clamp(min=min_decay, max=1.0) if first_order else torch.exp(dA)
        x = a * x + (delta * u_t).unsqueeze(-1) * (u_t @ P["P_B"].T).unsqueeze(1)
        ys.append((x * (u_t @ P["P_C"].T).unsqueeze(1)).sum(-1) + P["D"] * u_t)
    return torch.stack(ys, 1)


def test_strip_mamba_is_eq25():
    m = build("strip_mamba")
    u = inputs()
    with torch.no_grad():
        assert max_abs(m(u), eq25(u, m.strip_parameters())) < F64_ATOL


def test_strip_mamba_is_s6_without_dt_bias_and_out_proj():
    strip = build("strip_mamba")
    s6 = build("s6")
    for name in ("x_proj", "dt_proj"):
        getattr(s6, name).load_state_dict(getattr(strip, name).state_dict())
    with torch.no_grad():
        s6.A_log.copy_(strip.A_log)
        s6.D.copy_(strip.D)
        s6.dt_bias.zero_()
    u = inputs()
    assert max_abs(strip(u), s6.core(u)[1][..., 0]) < F64_ATOL
    # with its options it is S6 itself
    full = build("strip_mamba", dt_bias=True, output_projection=True)
    s6b = build("s6")
    s6b.load_state_dict(full.state_dict())
    assert max_abs(full(u), s6b(u)) < F64_ATOL


def test_bilinear_mamba_is_the_first_order_recurrence():
    m = build("bilinear_mamba")
    u = inputs()
    P = {"P_dt_down": m.x_proj.weight[: m.dt_rank], "P_dt_up": m.dt_proj.weight, "A": m.A, "D": m.D,
         "P_B": m.x_proj.weight[m.dt_rank : m.dt_rank + 4], "P_C": m.x_proj.weight[m.dt_rank + 4 :]}
    with torch.no_grad():
        y = eq25(u, P, dt_bias=m.dt_bias, first_order=True, min_decay=m.config.min_decay)
        assert max_abs(m.core(u)[1][..., 0], y) < F64_ATOL


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_bilinear_mamba_approximates_mamba_for_small_steps(mode):
    """1 + ΔA is exp(ΔA) to first order: close to S6 for small Δ, far from it for large Δ."""
    u = inputs(T=32)
    errs = {}
    for dt in (1e-3, 0.5):
        b = build("bilinear_mamba", dt_min=dt, dt_max=dt)
        s = build("s6", dt_min=dt, dt_max=dt)
        s.load_state_dict(b.state_dict())
        b.mode = s.mode = mode
        errs[dt] = rel_err(b(u), s(u))
    assert errs[1e-3] < 1e-3 < errs[0.5]


def test_block_and_decoding():
    with pytest.raises(ValueError, match="block"):
        seqmix.build_mixer("strip_mamba", d_model=8, block=True)
    with pytest.raises(ValueError, match="min_decay"):
        seqmix.build_mixer("bilinear_mamba", d_model=8, min_decay=0)
    m = build("bilinear_mamba", block=True, expand=2)
    u = inputs(T=9)
    cache = Cache()
    y = torch.cat([m(u[:, t : t + 1], cache=cache) for t in range(9)], 1)
    assert max_abs(y, m(u)) < F64_ATOL and cache.floats() == 2 * m.state_size()
