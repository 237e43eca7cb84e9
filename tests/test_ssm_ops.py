"""seqmix.ops.ssm: discretization, HiPPO, the Vandermonde and Cauchy/Woodbury kernels, the dense
LTI scan; every kernel against brute-force powers of the discretized matrix (krylov_kernel)."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.ops.conv import direct_conv
from seqmix.ops.ssm import (
    cauchy, discretize, dplr_kernel, hippo_legs, krylov_kernel, nplr_legs, s4d_init, ssm_final_state,
    ssm_free_response, ssm_scan, vandermonde, vandermonde_kernel, vandermonde_transpose,
)
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

C64 = torch.complex128


def rng(seed=0):
    return torch.Generator().manual_seed(seed)


def crandn(*shape, g):
    return torch.complex(torch.randn(*shape, generator=g, dtype=torch.float64), torch.randn(*shape, generator=g, dtype=torch.float64))


def full(x):  # conjugate pairs -> the full set of modes
    return torch.cat([x, x.conj()], -1)


# ------------------------------------------------------------------------------------------
# discretization
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
def test_diagonal_discretization_equals_dense(method):
    g = rng()
    lam = torch.complex(-torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.1, torch.randn(3, 5, generator=g, dtype=torch.float64))
    B = crandn(3, 5, g=g)
    dt = torch.rand(3, generator=g, dtype=torch.float64) * 0.5 + 0.01
    Ab, Bb = discretize(lam, B, dt, method)
    Ad, Bd = discretize(torch.diag_embed(lam), B, dt, method, structure="dense")
    assert max_abs(torch.diag_embed(Ab), Ad) < F64_ATOL
    assert max_abs(Bb, Bd) < F64_ATOL


def test_dense_zoh_closed_form_and_bilinear_definition():
    g = rng(1)
    N = 4
    A = torch.randn(2, N, N, generator=g, dtype=torch.float64) - 2 * torch.eye(N, dtype=torch.float64)
    B = torch.randn(2, N, generator=g, dtype=torch.float64)
    dt = torch.tensor([0.1, 0.3], dtype=torch.float64)
    Ab, Bb = discretize(A, B, dt, "zoh", structure="dense")
    dA = dt.view(2, 1, 1) * A
    E = torch.linalg.matrix_exp(dA)
    assert max_abs(Ab, E) < F64_ATOL
    # B̄ = (ΔA)⁻¹(e^{ΔA} - I)ΔB when A is invertible
    ref = torch.linalg.solve(dA, (E - torch.eye(N, dtype=torch.float64)) @ (dt.view(2, 1) * B).unsqueeze(-1)).squeeze(-1)
    assert max_abs(Bb, ref) < F64_ATOL
    Ab, Bb = discretize(A, B, dt, "bilinear", structure="dense")
    I = torch.eye(N, dtype=torch.float64)
    left = I - dA / 2
    assert max_abs(left @ Ab, I + dA / 2) < F64_ATOL
    assert max_abs((left @ Bb.unsqueeze(-1)).squeeze(-1), dt.view(2, 1) * B) < F64_ATOL


def test_zoh_at_zero_eigenvalue_and_bilinear_keeps_oscillators_undamped():
    lam = torch.tensor([[0.0, -1.0]], dtype=torch.float64)
    B = torch.ones(1, 2, dtype=torch.float64)
    _, Bb = discretize(lam, B, torch.tensor([0.2], dtype=torch.float64), "zoh")
    assert abs(float(Bb[0, 0]) - 0.2) < 1e-15  # limit ΔB at λ = 0
    assert abs(float(Bb[0, 1]) - (1 - math.exp(-0.2))) < 1e-15
    osc = torch.tensor([[3j, -7j]], dtype=C64)
    Ab, _ = discretize(osc, torch.ones(1, 2, dtype=C64), torch.tensor([0.4], dtype=torch.float64), "bilinear")
    assert max_abs(Ab.abs(), torch.ones(1, 2, dtype=torch.float64)) < 1e-14


def test_discretize_bad_input():
    A = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="method"):
        discretize(A, A, torch.ones(2, dtype=torch.float64), "euler")
    with pytest.raises(ValueError, match="'A'"):
        discretize(A, A, torch.ones(2, dtype=torch.float64), structure="dense")


# ------------------------------------------------------------------------------------------
# HiPPO and the S4D initializations
# ------------------------------------------------------------------------------------------


def test_hippo_legs_matrix():
    A, B = hippo_legs(4)
    # the top-left block quoted by the convblog note (§19.3, test 19)
    quoted = torch.tensor(
        [[-1, 0, 0, 0], [-1.732, -2, 0, 0], [-2.236, -3.873, -3, 0], [-2.646, -4.583, -5.916, -4]], dtype=torch.float64
    )
    assert max_abs(A, quoted) < 1e-3
    A, B = hippo_legs(9)
    for n in range(9):
        for k in range(9):
            want = -math.sqrt((2 * n + 1) * (2 * k + 1)) if n > k else (-(n + 1) if n == k else 0.0)
            assert abs(float(A[n, k]) - want) < 1e-12
    ev = torch.linalg.eigvals(A).real.sort().values
    assert max_abs(ev, -torch.arange(9, 0, -1, dtype=torch.float64)) < 1e-8
    assert max_abs(B, torch.sqrt(2 * torch.arange(9, dtype=torch.float64) + 1)) == 0


@pytest.mark.parametrize("N", [4, 8, 16])
def test_nplr_legs_reconstructs_hippo(N):
    A, B = hippo_legs(N)
    Lam, P, Bt, V = nplr_legs(N)
    Vf = torch.cat([V, V.conj()], 1)
    assert max_abs(Vf.conj().T @ Vf, torch.eye(N, dtype=C64)) < 1e-12  # unitary
    Pf = full(P)
    A_rec = Vf @ (torch.diag(full(Lam)) - torch.outer(Pf, Pf.conj())) @ Vf.conj().T
    assert max_abs(A_rec, A.to(C64)) < 1e-11
    assert max_abs(Vf @ full(Bt), B.to(C64)) < 1e-11
    assert max_abs(Lam.real, torch.full((N // 2,), -0.5, dtype=torch.float64)) < 1e-12
    Pr = torch.sqrt(torch.arange(N, dtype=torch.float64) + 0.5)
    S = A + torch.outer(Pr, Pr) + 0.5 * torch.eye(N, dtype=torch.float64)
    assert max_abs(S, -S.T) < 1e-12  # A + PPᵀ + I/2 is skew-symmetric


def test_s4d_inits():
    N = 8
    n = torch.arange(N // 2, dtype=torch.float64)
    lam, B = s4d_init("lin", N)
    assert max_abs(lam, torch.complex(torch.full_like(n, -0.5), math.pi * n)) < 1e-15
    lam, _ = s4d_init("inv", N)
    assert max_abs(lam.imag, N / math.pi * (N / (2 * n + 1) - 1)) < 1e-12
    lam, B = s4d_init("real", N)
    assert not lam.is_complex() and max_abs(lam, -(torch.arange(N, dtype=torch.float64) + 1)) == 0
    lam, B = s4d_init("legs", N)
    Lam, _, Bt, _ = nplr_legs(N)
    assert max_abs(lam, Lam) == 0 and max_abs(B, Bt) == 0
    with pytest.raises(ValueError, match="init"):
        s4d_init("fourier", N)
    with pytest.raises(ValueError, match="'N'"):
        s4d_init("lin", 7)


# ------------------------------------------------------------------------------------------
# kernels against brute-force powers
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["zoh", "bilinear"])
@pytest.mark.parametrize("init", ["lin", "inv", "legs"])
def test_vandermonde_kernel_equals_powers(init, method):
    g = rng(2)
    H, N, L = 3, 8, 37
    lam, B = s4d_init(init, N)
    lam, B = lam.expand(H, -1), B.expand(H, -1)
    C = crandn(H, N // 2, g=g)
    dt = torch.tensor([0.01, 0.05, 0.2], dtype=torch.float64)
    Ab, Bb = discretize(lam, B, dt, method)
    K = vandermonde_kernel(Ab.log(), Bb, C, L)
    # brute force on the full set of modes (each pair written out): real, and 2·Re of the half sum
    K_full = krylov_kernel(full(Ab), full(Bb), full(C), L, structure="diagonal")
    assert K_full.imag.abs().max() < 1e-12
    assert max_abs(K, K_full.real) < F64_ATOL
    # and against powers of the dense diagonal matrix
    K_dense = krylov_kernel(torch.diag_embed(full(Ab)), full(Bb), full(C), L)
    assert max_abs(K, K_dense.real) < F64_ATOL


def test_vandermonde_real_modes_and_float32():
    g = rng(3)
    lam, B = s4d_init("real", 6)
    C = torch.randn(2, 6, generator=g, dtype=torch.float64)
    dt = torch.tensor([0.1, 0.02], dtype=torch.float64)
    Ab, Bb = discretize(lam.expand(2, -1), B.expand(2, -1), dt, "zoh")
    K = vandermonde_kernel(Ab.log(), Bb, C, 50, conj_pairs=False)
    assert not K.is_complex()
    assert max_abs(K, krylov_kernel(Ab, Bb, C, 50, structure="diagonal")) < F64_ATOL
    K32 = vandermonde_kernel(Ab.log().float(), Bb.float(), C.float(), 50, conj_pairs=False)
    assert K32.dtype == torch.float32 and rel_err(K32.double(), K) < F32_RTOL


def test_vandermonde_transpose_and_batched_coefficients():
    g = rng(4)
    log_z = torch.complex(-torch.rand(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64))
    u = torch.randn(2, 3, 11, generator=g, dtype=torch.float64)
    s = vandermonde_transpose(u, log_z)
    z = log_z.exp()
    ref = sum(u[..., l].unsqueeze(-1) * z ** (10 - l) for l in range(11))
    assert max_abs(s, ref) < F64_ATOL
    c = crandn(2, 3, 4, g=g)  # a batch of coefficients against one set of nodes
    V = vandermonde(c, log_z, 9)
    assert V.shape == (2, 3, 9)
    assert max_abs(V[..., 5], (c * z**5).sum(-1)) < F64_ATOL


def test_cauchy_by_hand():
    g = rng(5)
    v, w, z = crandn(2, 5, g=g), crandn(2, 5, g=g), crandn(7, g=g)
    r = cauchy(v, z, w)
    assert r.shape == (2, 7)
    assert abs(complex(r[1, 3]) - sum(complex(v[1, n]) / (complex(z[3]) - complex(w[1, n])) for n in range(5))) < 1e-12


# 60 terms per node (3·2·2 batch × N 5), 9 nodes: one node per chunk, 2 nodes (2,2,2,2,1), 4 (4,4,1), one chunk
@pytest.mark.parametrize("chunk_elements", [1, 120, 240, 10**6])
def test_cauchy_chunked_matches_naive_in_values_and_gradients(chunk_elements):
    """The chunked mode (recomputing backward) against the naive terms, float64, with dplr_kernel's
    broadcasting (v [H, 2, 2, N] against w [H, 1, 1, N]) and gradients for v, z and w."""
    g = rng(11)
    v, w, z = crandn(3, 2, 2, 5, g=g), crandn(3, 1, 1, 5, g=g), crandn(9, g=g) + 3
    up = crandn(3, 2, 2, 9, g=g)
    grads = []
    for mode in ("naive", "chunked"):
        a, b, c = (t.clone().requires_grad_(True) for t in (v, z, w))
        r = cauchy(a, b, c, mode=mode, chunk_elements=chunk_elements)
        (r * up.conj()).real.sum().backward()
        grads.append((r.detach(), a.grad, b.grad, c.grad))
    for ref, got in zip(*grads):
        assert ref.shape == got.shape and max_abs(got, ref) < F64_ATOL


def test_cauchy_chunked_gradcheck_and_real_nodes():
    g = rng(12)
    v, w = crandn(2, 4, g=g).requires_grad_(True), crandn(2, 4, g=g).requires_grad_(True)
    z = (torch.rand(6, generator=g, dtype=torch.float64) + 3).requires_grad_(True)  # real nodes: a real gradient
    # 8 terms per node, 6 nodes: chunks of 4 and 2 nodes
    assert torch.autograd.gradcheck(lambda a, b, c: cauchy(a, b, c, chunk_elements=32), (v, z, w))
    (cauchy(v, z, w, chunk_elements=32).abs() ** 2).sum().backward()
    gz = z.grad.clone()
    z.grad = None
    (cauchy(v, z, w, mode="naive").abs() ** 2).sum().backward()
    assert not gz.is_complex() and max_abs(gz, z.grad) < F64_ATOL


def test_cauchy_chunked_float32_relative():
    g = rng(13)
    v, w, z = crandn(4, 8, g=g), crandn(4, 8, g=g), crandn(33, g=g) + 4
    ref = cauchy(v, z, w, mode="naive")
    got = cauchy(v.to(torch.complex64), z.to(torch.complex64), w.to(torch.complex64), chunk_elements=160)  # 5 nodes a chunk
    assert got.dtype == torch.complex64 and rel_err(got.to(ref.dtype), ref) < F32_RTOL


def test_cauchy_checks_its_arguments():
    v = torch.ones(2, 3, dtype=torch.complex64)
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        cauchy(v, torch.ones(4, dtype=torch.complex64), v, mode="fast")
    with pytest.raises(ValueError, match="argument 'z' must be \\[L\\]"):
        cauchy(v, torch.ones(2, 4, dtype=torch.complex64), v)
    with pytest.raises(ValueError, match="chunk_elements"):
        cauchy(v, torch.ones(4, dtype=torch.complex64), v, chunk_elements=0)
    z = torch.ones(4, dtype=torch.complex64)
    with pytest.raises(ValueError, match="'v' and 'w' must be \\[..., N\\] with the same N"):
        cauchy(v, z, torch.ones(2, 4, dtype=torch.complex64))
    with pytest.raises(ValueError, match="do not broadcast"):
        cauchy(v, z, torch.ones(5, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="argument 'w'"):
        cauchy(v, z, [1.0, 2.0, 3.0])
    assert cauchy(v, z[:0], v).shape == (2, 0)  # no nodes: an empty kernel in both modes
    assert cauchy(v, z[:0], v, mode="naive").shape == (2, 0)


def legs_system(N, H, g):
    """A HiPPO-LegS DPLR system per channel and its full (complex) discretized dense matrices."""
    Lam, P, B, _ = nplr_legs(N)
    Lam, P, B = Lam.expand(H, -1), P.expand(H, -1), B.expand(H, -1)
    C = crandn(H, N // 2, g=g)
    dt = torch.tensor([0.05, 0.01, 0.2][:H], dtype=torch.float64)
    Pf = full(P)
    A_full = torch.diag_embed(full(Lam)) - Pf.unsqueeze(-1) * Pf.conj().unsqueeze(-2)
    Ab, Bb = discretize(A_full, full(B), dt, "bilinear", structure="dense")
    return Lam, P, B, C, dt, Ab, Bb


@pytest.mark.parametrize("N", [8, 16])
@pytest.mark.parametrize("L", [64, 63, 50, 17])
def test_dplr_kernel_equals_powers(N, L):
    """Cauchy + Woodbury + irfft == C Āˡ B̄ for LegS (covers the Nyquist bin z = -1 at even L)."""
    g = rng(6)
    Lam, P, B, C, dt, Ab, Bb = legs_system(N, 3, g)
    K_ref = krylov_kernel(Ab, Bb, full(C), L)  # C is the true C
    assert K_ref.imag.abs().max() < 1e-12
    Ct = (full(C).unsqueeze(-2) @ (torch.eye(N, dtype=C64) - torch.linalg.matrix_power(Ab, L))).squeeze(-2)[..., : N // 2]
    K = dplr_kernel(Lam, P.unsqueeze(0), B, Ct, dt, L)
    assert max_abs(K, K_ref.real) < F64_ATOL


def dplr_reference(Lam, P, Q, B, C, dt, L):
    """Kernel from powers of the dense discretized A = diag(Λ) - Σ_r P_r Q_r* and the C̃ that goes with C."""
    N = Lam.shape[-1]
    A = torch.diag_embed(Lam) - torch.einsum("rhn,rhm->hnm", P, Q.conj())
    Ab, Bb = discretize(A, B, dt, "bilinear", structure="dense")
    eye = torch.eye(N, dtype=Ab.dtype)
    Ct = (C.unsqueeze(-2) @ (eye - torch.linalg.matrix_power(Ab, L))).squeeze(-2)
    return krylov_kernel(Ab, Bb, C, L), Ct


def test_dplr_kernel_rank2_with_q_and_real_systems():
    """Woodbury with a rank-2 correction and Q != P: a conjugate-pair system (complex modes) and
    a real system without pairs (conj_pairs=False); float32 relative to float64."""
    g = rng(7)
    H, M, r, L = 2, 3, 2, 24
    dt = torch.tensor([0.1, 0.03], dtype=torch.float64)
    Lam = torch.complex(-torch.rand(H, M, generator=g, dtype=torch.float64) - 0.2, 3 * torch.randn(H, M, generator=g, dtype=torch.float64))
    P, Q, B, C = 0.3 * crandn(r, H, M, g=g), 0.3 * crandn(r, H, M, g=g), crandn(H, M, g=g), crandn(H, M, g=g)
    K_ref, Ct = dplr_reference(full(Lam), full(P), full(Q), full(B), full(C), dt, L)
    assert K_ref.imag.abs().max() < 1e-10
    K = dplr_kernel(Lam, P, B, Ct[..., :M], dt, L, Q=Q)
    assert max_abs(K, K_ref.real) < F64_ATOL
    K32 = dplr_kernel(*(t.to(torch.complex64) for t in (Lam, P, B, Ct[..., :M])), dt.float(), L, Q=Q.to(torch.complex64))
    assert K32.dtype == torch.float32 and rel_err(K32.double(), K_ref.real) < F32_RTOL
    # a real system: no pairs
    lam_r = -torch.rand(H, 4, generator=g, dtype=torch.float64) - 0.1
    P_r, Q_r = 0.3 * torch.randn(r, H, 4, generator=g, dtype=torch.float64), 0.3 * torch.randn(r, H, 4, generator=g, dtype=torch.float64)
    B_r, C_r = torch.randn(H, 4, generator=g, dtype=torch.float64), torch.randn(H, 4, generator=g, dtype=torch.float64)
    K_ref, Ct = dplr_reference(lam_r, P_r, Q_r, B_r, C_r, dt, 31)
    K = dplr_kernel(lam_r, P_r, B_r, Ct, dt, 31, Q=Q_r, conj_pairs=False)
    assert max_abs(K, K_ref) < F64_ATOL


def test_dplr_kernel_bad_input():
    Lam, P, B, _ = nplr_legs(4)
    with pytest.raises(ValueError, match="'P'"):
        dplr_kernel(Lam, P, B, B, torch.tensor(0.1, dtype=torch.float64), 8)
    with pytest.raises(ValueError, match="'L'"):
        dplr_kernel(Lam, P.unsqueeze(0), B, B, torch.tensor(0.1, dtype=torch.float64), 0)


# ------------------------------------------------------------------------------------------
# the dense LTI scan and the state terms of the convolution mode
# ------------------------------------------------------------------------------------------


def random_lti(H=3, N=5, seed=8, dtype=torch.float64):
    g = rng(seed)
    A = torch.randn(H, N, N, generator=g, dtype=torch.float64) * 0.3
    B = torch.randn(H, N, generator=g, dtype=torch.float64)
    C = torch.randn(H, N, generator=g, dtype=torch.float64)
    return A.to(dtype), B.to(dtype), C.to(dtype)


@pytest.mark.parametrize("T", [1, 9, 37])
def test_scan_equals_convolution_with_the_powers_kernel(T):
    A, B, C = random_lti()
    u = torch.randn(2, T, 3, dtype=torch.float64)
    y, _ = ssm_scan(u, A, B, C)
    K = krylov_kernel(A, B, C, T)  # [H, T]
    assert max_abs(y, direct_conv(u, K.T.contiguous())) < F64_ATOL


@pytest.mark.parametrize("T,chunk", [(1, 4), (9, 4), (37, 8), (37, 64), (64, 16)])
def test_free_response_and_final_state_equal_the_scan(T, chunk):
    A, B, C = random_lti()
    u = torch.randn(2, T, 3, dtype=torch.float64)
    h0 = torch.randn(2, 3, 5, dtype=torch.float64)
    y, hT = ssm_scan(u, A, B, C, initial_state=h0, output_final_state=True)
    y0, _ = ssm_scan(u, A, B, C)
    assert max_abs(ssm_free_response(A, C, h0, T, chunk_size=chunk), y - y0) < F64_ATOL
    assert max_abs(ssm_final_state(u, A, B, initial_state=h0, chunk_size=chunk), hT) < F64_ATOL


def test_state_terms_gradients_equal_the_scan():
    A, B, C = (t.requires_grad_(True) for t in random_lti())
    u = torch.randn(2, 21, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 21, 3, dtype=torch.float64)
    wh = torch.randn(2, 3, 5, dtype=torch.float64)
    y, hT = ssm_scan(u, A, B, C, initial_state=h0, output_final_state=True)
    y0, _ = ssm_scan(u, A, B, C)
    g1 = torch.autograd.grad(((y - y0) * w).sum() + (hT * wh).sum(), (A, B, C, u, h0))
    g2 = torch.autograd.grad(
        (ssm_free_response(A, C, h0, 21, chunk_size=4) * w).sum() + (ssm_final_state(u, A, B, initial_state=h0, chunk_size=4) * wh).sum(),
        (A, B, C, u, h0),
    )
    for a, b in zip(g1, g2):
        assert max_abs(a, b) < F64_ATOL


def test_scan_bad_input():
    A, B, C = random_lti()
    u = torch.randn(2, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="'Bbar'"):
        ssm_scan(u, A, B[:, :2], C)
    with pytest.raises(ValueError, match="'initial_state'"):
        ssm_scan(u, A, B, C, initial_state=torch.zeros(2, 3, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="'u'"):
        ssm_scan(u[0], A, B, C)
