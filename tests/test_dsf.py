"""The DSF object: recurrence vs map, Lemma 2, converters, composition."""

from __future__ import annotations

import pytest
import torch

from seqmix import DSF, linear_recurrence, recurrence_map
from tolerances import DSF_ATOL, F64_ATOL, max_abs


def random_system(batch=2, T=6, N=5, d_in=3, d_out=4, D=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    lam = torch.rand(batch, T, N, generator=g, dtype=torch.float64) * 1.5  # Λ may exceed 1
    return DSF(lam, r(batch, T, N, d_in), r(batch, T, d_out, N), r(batch, T, d_out, d_in) if D else None)


def test_phi_equals_evaluate():
    s = random_system()
    u = torch.randn(2, s.T, s.d_in, dtype=torch.float64)
    y = s.evaluate(u)
    y_phi = torch.einsum("bij,bj->bi", s.phi(), u.reshape(2, -1)).reshape(2, s.T, s.d_out)
    assert max_abs(y, y_phi) < DSF_ATOL
    # block lower-triangular: no block above the diagonal
    blocks = s.blocks()
    assert blocks[:, 0, 1:].abs().max() == 0


def test_phi_block_formula_by_hand():
    """Φ[i, j] = C_i Λ_i ⋯ Λ_{j+1} B_j and Φ[i, i] = C_i B_i + D_i (eq. 12), written out."""
    s = random_system(batch=1, T=4)
    P = s.blocks()[0]
    lam, B, C, D = s.lam[0], s.B[0], s.C[0], s.D[0]
    assert max_abs(P[2, 0], C[2] @ torch.diag(lam[2] * lam[1]) @ B[0]) < DSF_ATOL
    assert max_abs(P[3, 3], C[3] @ B[3] + D[3]) < DSF_ATOL
    assert max_abs(P[3, 1], C[3] @ torch.diag(lam[3] * lam[2]) @ B[1]) < DSF_ATOL


def test_zero_transition_is_handled():
    s = random_system()
    s.lam[:, 2] = 0.0  # Λ = 0 resets the state; no division anywhere
    u = torch.randn(2, s.T, s.d_in, dtype=torch.float64)
    y_phi = torch.einsum("bij,bj->bi", s.phi(), u.reshape(2, -1)).reshape(2, s.T, s.d_out)
    assert max_abs(s.evaluate(u), y_phi) < DSF_ATOL


@pytest.mark.parametrize("N_bar", [5, 6, 12])
def test_lemma2_embedding_reproduces_outputs(N_bar):
    s = random_system()
    big = s.embed(N_bar, seed=3)
    assert big.N == N_bar
    u = torch.randn(2, s.T, s.d_in, dtype=torch.float64)
    y_big, h_big = big.evaluate(u, return_states=True)
    assert max_abs(y_big, s.evaluate(u)) < DSF_ATOL
    if N_bar > s.N:  # the added states are not trivially zero
        assert h_big[..., s.N:].abs().max() > 1e-3
    with pytest.raises(ValueError, match="N_bar"):
        s.embed(s.N - 1)


def test_compose_absorbs_projections():
    s = random_system(D=True)
    W_in = torch.randn(s.d_in, 7, dtype=torch.float64)
    W_out = torch.randn(2, s.d_out, dtype=torch.float64)
    x = torch.randn(2, s.T, 7, dtype=torch.float64)
    y = s.evaluate(x @ W_in.T) @ W_out.T
    assert max_abs(s.compose(W_in, W_out).evaluate(x), y) < DSF_ATOL


@pytest.mark.parametrize("gk_kind", ["none", "head", "key"])
@pytest.mark.parametrize("with_gv", [False, True])
def test_from_recurrence_matches_op_and_map(gk_kind, with_gv):
    B, T, H, K, V = 2, 7, 3, 4, 2
    q, k, v = (torch.randn(B, T, H, X, dtype=torch.float64) for X in (K, K, V))
    gk = {"none": None, "head": -torch.rand(B, T, H, dtype=torch.float64), "key": -torch.rand(B, T, H, K, dtype=torch.float64)}[gk_kind]
    gv = -torch.rand(B, T, H, V, dtype=torch.float64) if with_gv else None
    o, _ = linear_recurrence(q, k, v, gk, gv, mode="recurrent", scale=0.3)
    s = DSF.from_recurrence(q, k, V, gk, gv, scale=0.3)
    assert s.N == H * V * K
    assert max_abs(s.evaluate(v.reshape(B, T, H * V)), o.reshape(B, T, H * V)) < DSF_ATOL
    # the diagonal of each Φ block is the op's map
    A = recurrence_map(q, k, gk, gv, scale=0.3)
    diag = torch.diagonal(s.blocks(), dim1=-2, dim2=-1).permute(0, 3, 1, 2)  # [B, H·V, T, T]
    expected = A.repeat_interleave(V, dim=1) if gv is None else A
    assert max_abs(diag, expected) < DSF_ATOL


def test_state_layout_is_channel_major_vec_of_S():
    """h = vec(S) column-stacked per head: entry (h, v, k) at (h·V + v)·K + k."""
    B, T, H, K, V = 1, 3, 2, 3, 2
    q, k, v = (torch.randn(B, T, H, X, dtype=torch.float64) for X in (K, K, V))
    _, S = linear_recurrence(q, k, v, mode="recurrent", output_final_state=True)  # [B,H,K,V]
    _, h = DSF.from_recurrence(q, k, V).evaluate(v.reshape(B, T, H * V), return_states=True)
    assert max_abs(h[:, -1], S.transpose(-1, -2).reshape(B, -1)) < DSF_ATOL


def test_to_recurrence_roundtrip_and_rejects_other_structures():
    B, T, H, K, V = 2, 5, 2, 3, 2
    q, k = torch.randn(B, T, H, K, dtype=torch.float64), torch.randn(B, T, H, K, dtype=torch.float64)
    gk, gv = -torch.rand(B, T, H, K, dtype=torch.float64), -torch.rand(B, T, H, V, dtype=torch.float64)
    s = DSF.from_recurrence(q, k, V, gk, gv)
    r = s.to_recurrence(H, K)
    s2 = DSF.from_recurrence(r["q"], r["k"], V, r["gk"], r["gv"])
    v = torch.randn(B, T, H * V, dtype=torch.float64)
    assert max_abs(s2.evaluate(v), s.evaluate(v)) < DSF_ATOL
    with pytest.raises(ValueError, match="Kronecker"):
        DSF(s.lam, torch.randn_like(s.B), s.C).to_recurrence(H, K)


def test_from_separable_telescopes():
    """Π Λ_k B_j = ψ(k_j)/η_i: the normalizer telescopes (dsf note §3.2, §8.3)."""
    B, T, H, n, V = 1, 6, 1, 3, 1
    qf, kf = torch.rand(B, T, H, n, dtype=torch.float64) + 0.1, torch.rand(B, T, H, n, dtype=torch.float64) + 0.1
    eta = (qf * kf.cumsum(1)).sum(-1)
    s = DSF.from_separable(qf, kf, eta, V)
    blocks = s.blocks()[0, :, :, 0, 0]  # [T, T]
    expected = torch.tril(torch.einsum("ik,jk->ij", qf[0, :, 0], kf[0, :, 0]) / eta[0, :, 0, None])
    assert max_abs(blocks, expected) < DSF_ATOL
    with pytest.raises(ValueError, match="eta"):
        DSF.from_separable(qf, kf, -eta, V)


def test_complex_system_real_output():
    T, N = 5, 3
    lam = torch.polar(torch.rand(1, T, N, dtype=torch.float64), torch.rand(1, T, N, dtype=torch.float64))
    s = DSF(lam, torch.randn(1, T, N, 1, dtype=torch.complex128), torch.randn(1, T, 1, N, dtype=torch.complex128))
    u = torch.randn(1, T, 1, dtype=torch.float64)
    y = s.evaluate(u)
    assert not y.is_complex()
    assert max_abs(y.reshape(-1), s.phi()[0] @ u.reshape(-1)) < DSF_ATOL


def test_bad_shapes():
    with pytest.raises(ValueError, match="'B'"):
        DSF(torch.rand(1, 4, 3), torch.rand(1, 4, 2, 2), torch.rand(1, 4, 2, 3))
    with pytest.raises(ValueError, match="'u'"):
        random_system().evaluate(torch.randn(2, 3, 3))


def test_complex_system_with_real_skip():
    T, N = 4, 2
    lam = torch.polar(torch.rand(1, T, N, dtype=torch.float64), torch.rand(1, T, N, dtype=torch.float64))
    D = torch.randn(1, T, 1, 1, dtype=torch.float64)
    s = DSF(lam, torch.randn(1, T, N, 1, dtype=torch.complex128), torch.randn(1, T, 1, N, dtype=torch.complex128), D)
    u = torch.randn(1, T, 1, dtype=torch.float64)
    assert max_abs(s.evaluate(u).reshape(-1), s.phi()[0] @ u.reshape(-1)) < DSF_ATOL


def test_real_B_with_complex_input():
    T, N = 4, 3
    lam = torch.polar(torch.rand(1, T, N, dtype=torch.float64), torch.rand(1, T, N, dtype=torch.float64))
    s = DSF(lam, torch.randn(1, T, N, 2, dtype=torch.float64), torch.randn(1, T, 2, N, dtype=torch.complex128), real_output=False)
    u = torch.randn(1, T, 2, dtype=torch.complex128)
    assert max_abs(s.evaluate(u).reshape(-1), s.phi()[0] @ u.reshape(-1)) < DSF_ATOL
