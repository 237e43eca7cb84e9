"""seqmix.analysis.ssm_theory: DSF eq. (23) and the exact S6 <-> generalized linear attention
condition (dsf note §4.3), met and broken."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.analysis import (
    equivalence_condition, equivalence_normalizer, linear_attention_dsf, map_difference, reversed_sigmoid_transition,
    s6_dsf, softplus_transition,
)
from tolerances import DSF_ATOL

B, T, d, n = 2, 6, 3, 4


def rnd(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("a", [0.0, 0.3, 1.0, 2.5, 16.0])
def test_reversed_sigmoid_equals_softplus_transition(a):
    """exp(-a·softplus(x)) = σ(-x)^a (eq. 23), including large |x| (no overflow on either side)."""
    x = torch.cat([torch.linspace(-40, 40, 801, dtype=torch.float64), rnd(100) * 5])
    lhs, rhs = softplus_transition(x, a), reversed_sigmoid_transition(x, a)
    assert torch.isfinite(lhs).all() and torch.isfinite(rhs).all()
    assert float((lhs - rhs).abs().max()) < DSF_ATOL
    literal = torch.tensor([math.pow(1 / (1 + math.exp(v)), a) for v in x.tolist()], dtype=torch.float64)  # σ_rev(x)^a
    assert float((rhs - literal).abs().max()) < DSF_ATOL
    # and it is a transition: within [0, 1], decreasing in x for a > 0
    assert float(rhs.max()) <= 1 and float(rhs.min()) >= 0
    if a > 0:
        s = reversed_sigmoid_transition(torch.linspace(-5, 5, 50, dtype=torch.float64), a)
        assert bool((s[1:] < s[:-1]).all())


def equivalent_setup(a=0.8):
    eta = equivalence_normalizer(a, torch.tensor([2.0, 1.5], dtype=torch.float64), T)
    delta = (1 / eta).unsqueeze(-1).expand(B, T, d).clone()
    A = torch.full((d, n), a, dtype=torch.float64)
    b, c = rnd(B, T, n, seed=1), rnd(B, T, n, seed=2)
    return eta, delta, A, b, c


def test_normalizer_recursion():
    eta = equivalence_normalizer(0.8, 2.0, 4)
    # the dsf note's worked numbers: η = 2, 2.692, 3.405, ...
    assert abs(float(eta[1]) - 2.692) < 1e-3 and abs(float(eta[2]) - 3.405) < 1e-3
    assert float((eta[1:] * torch.exp(-0.8 / eta[1:]) - eta[:-1]).abs().max()) < 1e-13
    assert bool((equivalence_normalizer(0.0, 1.3, 5) == 1.3).all())  # a = 0: a constant Δ
    with pytest.raises(ValueError, match="'eta0'"):
        equivalence_normalizer(0.8, -1.0, 3)


def test_condition_met_gives_identical_maps():
    eta, delta, A, b, c = equivalent_setup()
    cond = equivalence_condition(A, delta, eta)
    assert cond["holds"] and cond["residual"] < 1e-13
    s6, att = s6_dsf(b, c, delta, A), linear_attention_dsf(c, b, eta, d)  # q_i = c_i, k_i = b_i
    assert map_difference(s6, att) < DSF_ATOL
    u = rnd(B, T, d, seed=3)
    assert float((s6.evaluate(u) - att.evaluate(u)).abs().max()) < DSF_ATOL


@pytest.mark.parametrize("broken", ["A_per_state", "A_per_channel", "delta_per_channel", "normalizer"])
def test_condition_broken_gives_different_maps(broken):
    eta, delta, A, b, c = equivalent_setup()
    if broken == "A_per_state":
        A[:, 1] = 1.4
    elif broken == "A_per_channel":
        A[0] = 0.5
    elif broken == "delta_per_channel":
        delta[:, :, 1] *= 1.3
    else:  # an increasing η that does not satisfy η_i e^{-a/η_i} = η_{i-1}; Δ = 1/η still shared
        eta = 2.0 + torch.arange(T, dtype=torch.float64).expand(B, T) * 0.5
        delta = (1 / eta).unsqueeze(-1).expand(B, T, d)
    cond = equivalence_condition(A, delta, eta)
    assert not cond["holds"] and cond["residual"] > 1e-3
    assert map_difference(s6_dsf(b, c, delta, A), linear_attention_dsf(c, b, eta, d)) > 1e-3
    expected = {"A_per_state": "scalar_A", "A_per_channel": "scalar_A", "delta_per_channel": "shared_delta", "normalizer": "normalizer_recursion"}
    assert not cond[expected[broken]]


def test_s6_dsf_matches_the_s6_recurrence():
    """s6_dsf (paper sign, A > 0) is the recurrence h = exp(-ΔA) h + Δ b x, y = c·h, per channel."""
    _, delta, _, b, c = equivalent_setup()
    A = rnd(d, n, seed=4).abs() + 0.1
    delta = delta * (1 + rnd(B, T, d, seed=5).abs())
    u = rnd(B, T, d, seed=6)
    h = torch.zeros(B, d, n, dtype=torch.float64)
    ys = []
    for u_t, d_t, b_t, c_t in zip(u.unbind(1), delta.unbind(1), b.unbind(1), c.unbind(1)):
        h = torch.exp(-d_t[..., None] * A) * h + (d_t * u_t)[..., None] * b_t[:, None, :]
        ys.append((h * c_t[:, None, :]).sum(-1))
    assert float((s6_dsf(b, c, delta, A).evaluate(u) - torch.stack(ys, 1)).abs().max()) < DSF_ATOL
