"""The DSF with a non-diagonal transition: diagonal-plus-low-rank and dense Λ_i, and the
delta rule's system."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqmix import DSF
from seqmix.ops.delta_rule import delta_rule, delta_rule_map
from tolerances import DSF_ATOL, F64_ATOL, max_abs


def random_dplr(batch=2, T=5, N=4, r=2, d_in=3, d_out=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    lam = torch.rand(batch, T, N, generator=g, dtype=torch.float64)
    return DSF(lam, rn(batch, T, N, d_in), rn(batch, T, d_out, N), rn(batch, T, d_out, d_in), U=0.5 * rn(batch, T, N, r), W=0.5 * rn(batch, T, N, r))


def test_dplr_phi_equals_evaluate_and_the_block_formula():
    s = random_dplr()
    assert not s.is_diagonal
    u = torch.randn(2, s.T, s.d_in, dtype=torch.float64)
    y_phi = torch.einsum("bij,bj->bi", s.phi(), u.reshape(2, -1)).reshape(2, s.T, s.d_out)
    assert max_abs(s.evaluate(u), y_phi) < DSF_ATOL
    L = s.transition()  # dense Λ_i = diag(lam_i) + U_i W_iᵀ
    assert max_abs(L[0, 1], torch.diag(s.lam[0, 1]) + s.U[0, 1] @ s.W[0, 1].T) < DSF_ATOL
    P = s.blocks()[0]
    assert max_abs(P[3, 0], s.C[0, 3] @ L[0, 3] @ L[0, 2] @ L[0, 1] @ s.B[0, 0]) < DSF_ATOL
    assert max_abs(P[2, 2], s.C[0, 2] @ s.B[0, 2] + s.D[0, 2]) < DSF_ATOL
    assert P[0, 1].abs().max() == 0


def test_dense_transition_matches_dplr_and_diagonal_fast_path():
    s = random_dplr()
    dense = DSF.from_dense(s.transition(), s.B, s.C, s.D)
    assert max_abs(dense.blocks(), s.blocks()) < DSF_ATOL
    # a zero low-rank part takes the general path and must agree with the diagonal fast path
    diag = DSF(s.lam, s.B, s.C, s.D)
    zero = DSF(s.lam, s.B, s.C, s.D, U=torch.zeros_like(s.U), W=torch.zeros_like(s.W))
    assert max_abs(zero.blocks(), diag.blocks()) < DSF_ATOL
    assert max_abs(zero.eigenvalues().real.sort(-1).values, diag.eigenvalues().sort(-1).values) < DSF_ATOL


def test_dplr_embed_and_compose():
    s = random_dplr()
    u = torch.randn(2, s.T, s.d_in, dtype=torch.float64)
    big = s.embed(s.N + 3, seed=1)
    assert max_abs(big.evaluate(u), s.evaluate(u)) < DSF_ATOL
    Win, Wout = torch.randn(s.d_in, 2, dtype=torch.float64), torch.randn(4, s.d_out, dtype=torch.float64)
    c = s.compose(Win, Wout)
    x = torch.randn(2, s.T, 2, dtype=torch.float64)
    assert max_abs(c.evaluate(x), s.evaluate(x @ Win.T) @ Wout.T) < DSF_ATOL
    with pytest.raises(ValueError, match="not diagonal"):
        s.to_recurrence(1, 1)


def test_unbatched_dplr_system():
    s = random_dplr(batch=1)
    one = DSF(s.lam[0], s.B[0], s.C[0], s.D[0], U=s.U[0], W=s.W[0])
    assert one.batch == 1 and max_abs(one.blocks(), s.blocks()) < DSF_ATOL


def test_bad_low_rank_arguments():
    s = random_dplr()
    with pytest.raises(ValueError, match="'U' and 'W'"):
        DSF(s.lam, s.B, s.C, U=s.U)
    with pytest.raises(ValueError, match="'U' and 'W'"):
        DSF(s.lam, s.B, s.C, U=s.U, W=s.W[..., :1])
    with pytest.raises(ValueError, match="'Lam'"):
        DSF.from_dense(s.transition()[..., :-1], s.B, s.C)


def delta_inputs(decay, B=2, T=6, H=2, K=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=g, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T, H, K, generator=g, dtype=torch.float64), dim=-1)
    beta = 2 * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    gg = {"none": None, "head": -torch.rand(B, T, H, generator=g, dtype=torch.float64),
          "key": -torch.rand(B, T, H, K, generator=g, dtype=torch.float64)}[decay]
    return q, k, beta, gg


@pytest.mark.parametrize("decay", ["none", "head", "key"])
def test_from_delta_rule_is_the_op(decay):
    q, k, beta, g = delta_inputs(decay)
    V = 2
    v = torch.randn(*q.shape[:3], V, dtype=torch.float64)
    s = DSF.from_delta_rule(q, k, beta, V, g, scale=0.5)
    o, _ = delta_rule(q, k, v, beta, g, scale=0.5, mode="recurrent")
    Bt, T, H, _ = q.shape
    assert max_abs(s.evaluate(v.reshape(Bt, T, H * V)), o.reshape(Bt, T, H * V)) < F64_ATOL
    Phi = delta_rule_map(q, k, beta, g, scale=0.5)  # [B, H, T, T]
    expected = torch.einsum("bhts,vw,hg->btshvgw", Phi, torch.eye(V, dtype=torch.float64), torch.eye(H, dtype=torch.float64))
    assert max_abs(s.blocks(), expected.reshape(Bt, T, T, H * V, H * V)) < F64_ATOL
    # the structured eigenvalues are those of the dense transition
    ev = s.eigenvalues()
    dense = torch.linalg.eigvals(s.transition())
    key = lambda e: torch.sort(e.real * 1e3 + e.imag, dim=-1).values  # noqa: E731
    assert max_abs(key(ev), key(dense)) < 1e-9


def test_delta_rule_spectrum_scalar_decay():
    """Λ_i = α(I − βkᵀk): one eigenvalue α(1 − β) along the unit key, the rest α."""
    q, k, beta, g = delta_inputs("head", K=4)
    V = 1
    ev = DSF.from_delta_rule(q, k, beta, V, g).eigenvalues().reshape(*q.shape)  # [B, T, H, K]
    alpha = g.exp()
    expected = torch.cat([alpha.unsqueeze(-1).expand(*alpha.shape, 3), (alpha * (1 - beta)).unsqueeze(-1)], -1)
    got = ev.real.sort(-1).values
    assert ev.imag.abs().max() < 1e-12
    assert max_abs(got, expected.sort(-1).values) < 1e-12
