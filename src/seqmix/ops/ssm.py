"""Linear time-invariant state-space kernels: discretization, HiPPO, the Vandermonde kernel of
diagonal SSMs (S4D), the Cauchy kernel with the Woodbury correction of DPLR SSMs (S4), and the
dense LTI scan (S4's recurrent mode).

Continuous-time SSM, one channel (convblog note §4.1):

    x'(t) = A x(t) + B u(t),      y(t) = C x(t) (+ D u(t))

Discretized with step Δ (convblog note §4.2):

    zoh:       Ā = exp(ΔA),                    B̄ = (ΔA)⁻¹ (exp(ΔA) - I) ΔB
    bilinear:  Ā = (I - Δ/2 A)⁻¹ (I + Δ/2 A),   B̄ = (I - Δ/2 A)⁻¹ ΔB        (the standard factor)

and unrolled into the convolution kernel (convblog note §4.5)

    K_l = C Āˡ B̄,   l = 0..L-1,        y = K * u  (+ D u).

:func:`krylov_kernel` computes K from brute-force powers of Ā (the reference every fast
kernel is tested against); :func:`vandermonde_kernel` and :func:`dplr_kernel` are the fast
paths of S4D and S4. Complex diagonal systems are stored as conjugate pairs: M = N/2 modes
(λ_n, B_n, C_n) stand for the 2M modes λ_n and conj(λ_n), whose kernel is 2·Re of the
half sum; :func:`dplr_kernel` takes ``conj_pairs=True`` for that layout.

The last section holds Mamba-3's selective pieces (time-varying, not LTI): the trapezoidal
two-tap recurrence folded into ``linear_recurrence`` (:func:`trapezoidal_recurrence`, its map
:func:`trapezoidal_map` and the loop it is tested against) and the cumulative-angle rotation of
its complex states (:func:`rotate_pairs`, the "RoPE trick").

Layouts: a batch of H independent single-input single-output systems (one per channel):
A [H, N] (diagonal) or [H, N, N] (dense), B and C [H, N], Δ [H]; sequences u [B, T, H]
(time second, channels last, as everywhere in seqmix); states [B, H, N].
"""

from __future__ import annotations

import math

import torch

from .._checks import check_choice, check_positive_int, check_tensor, fmt_shape
from .conv import fft_conv
from .precision import full_precision
from .recurrence import linear_recurrence, recurrence_map

__all__ = [
    "DISCRETIZATIONS", "discretize", "krylov_kernel", "vandermonde", "vandermonde_transpose",
    "vandermonde_kernel", "cauchy", "dplr_kernel", "hippo_legs", "nplr_legs", "s4d_init", "S4D_INITS",
    "ssm_scan", "ssm_free_response", "ssm_final_state", "diagonal_ssm_conv",
    "rotate_pairs", "trapezoidal_recurrence", "trapezoidal_recurrence_reference", "trapezoidal_map",
]

DISCRETIZATIONS = ("zoh", "bilinear")
S4D_INITS = ("lin", "inv", "real", "legs")


# ------------------------------------------------------------------------------------------
# discretization
# ------------------------------------------------------------------------------------------


def _phi1(z: torch.Tensor) -> torch.Tensor:
    """(exp(z) - 1) / z, with its limit 1 at z = 0 (no 0/0 in the value or the gradient)."""
    small = z.abs() < 1e-8
    z_safe = torch.where(small, torch.ones_like(z), z)
    return torch.where(small, 1 + z / 2, torch.expm1(z_safe) / z_safe)


def discretize(A: torch.Tensor, B: torch.Tensor, dt: torch.Tensor, method: str = "zoh", *, structure: str = "diagonal"):
    """(Ā, B̄) of the continuous system (A, B) with step Δ.

    structure="diagonal": A [..., N] holds the diagonal (real or complex), B [..., N],
        dt broadcastable to A.shape[:-1].
    structure="dense": A [..., N, N], B [..., N], dt broadcastable to A.shape[:-2].

    zoh: Ā = exp(ΔA), B̄ = (ΔA)⁻¹(exp(ΔA) - I)ΔB (dense: the top-right block of the matrix
    exponential of [[ΔA, ΔB], [0, 0]], so A need not be invertible).
    bilinear: Ā = (I - Δ/2·A)⁻¹(I + Δ/2·A), B̄ = (I - Δ/2·A)⁻¹ΔB.
    """
    where = "discretize"
    check_choice("method", method, DISCRETIZATIONS, where)
    check_choice("structure", structure, ("diagonal", "dense"), where)
    check_tensor("A", A, complex_ok=True, where=where)
    check_tensor("B", B, complex_ok=True, where=where)
    check_tensor("dt", dt, where=where)
    if structure == "diagonal":
        dt = dt.unsqueeze(-1)
        dA = dt * A
        if method == "zoh":
            return torch.exp(dA), _phi1(dA) * dt * B
        den = 1 - dA / 2
        return (1 + dA / 2) / den, dt * B / den
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{where}: a dense 'A' must be [..., N, N], got {fmt_shape(A.shape)}")
    N = A.shape[-1]
    if B.shape[-1] != N:
        raise ValueError(f"{where}: argument 'B' must be [..., N={N}], got {fmt_shape(B.shape)}")
    dt = dt.unsqueeze(-1)  # [..., 1] against B [..., N]
    dtype = torch.promote_types(A.dtype, B.dtype)
    A, B = A.to(dtype), B.to(dtype)
    if method == "zoh":
        lead = torch.broadcast_shapes(A.shape[:-2], B.shape[:-1], dt.shape[:-1])
        M = torch.zeros(*lead, N + 1, N + 1, dtype=dtype, device=A.device)
        M[..., :N, :N] = dt.unsqueeze(-1) * A
        M[..., :N, N] = dt * B
        E = torch.linalg.matrix_exp(M)
        return E[..., :N, :N], E[..., :N, N]
    eye = torch.eye(N, dtype=dtype, device=A.device)
    half = dt.unsqueeze(-1) / 2 * A
    lhs = eye - half
    Abar = torch.linalg.solve(lhs, eye + half)
    Bbar = torch.linalg.solve(lhs, (dt * B).unsqueeze(-1)).squeeze(-1)
    return Abar, Bbar


# ------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------


def krylov_kernel(Abar: torch.Tensor, Bbar: torch.Tensor, C: torch.Tensor, L: int, *, structure: str = "dense") -> torch.Tensor:
    """The reference kernel from brute-force powers: K_l = C Āˡ B̄ for l < L.

    Abar [..., N, N] (dense) or [..., N] (diagonal); Bbar, C [..., N]. Returns [..., L]
    (complex if any input is). A loop of L matrix-vector products (O(N²L)).
    """
    check_positive_int("L", L, "krylov_kernel")
    check_choice("structure", structure, ("diagonal", "dense"), "krylov_kernel")
    x = Bbar
    out = []
    for _ in range(L):
        out.append((C * x).sum(-1))
        x = Abar * x if structure == "diagonal" else (Abar @ x.unsqueeze(-1)).squeeze(-1)
    return torch.stack(out, -1)


def vandermonde(c: torch.Tensor, log_z: torch.Tensor, L: int) -> torch.Tensor:
    """V[..., l] = Σ_n c[..., n] · z_n^l for l < L, with z_n = exp(log_z[..., n]).

    c [..., N] and log_z [..., N] broadcast in their leading dimensions (e.g. c [B, H, N]
    against log_z [H, N]). Two levels (b ≈ √L): with l = j·b + r, z^l = z^(jb) · z^r, so

        V[..., j, r] = Σ_n (c_n z_n^(jb)) · z_n^r,

    one matmul [L/b, N] @ [N, b] per system; the powers z^(jb) and z^r are each exp of a
    multiple of log_z (no repeated multiplication), 2N√L exponentials instead of N·L and no
    [N, L] tensor. Returns [..., L] complex (real for real inputs). O(N·L) per system.
    """
    check_positive_int("L", L, "vandermonde")
    b = math.isqrt(L - 1) + 1  # block length: b·b >= L
    J = -(-L // b)
    rdt = log_z.real.dtype
    r = torch.arange(b, device=log_z.device, dtype=rdt)
    P = torch.exp(log_z.unsqueeze(-1) * r)  # [..., N, b]: z^r
    Q = torch.exp(log_z.unsqueeze(-1) * (torch.arange(J, device=log_z.device, dtype=rdt) * b))  # [..., N, J]: z^(jb)
    dtype = torch.promote_types(c.dtype, P.dtype)
    A = c.to(dtype).unsqueeze(-1) * Q.to(dtype)  # [..., N, J]
    V = A.transpose(-1, -2) @ P.to(dtype)  # [..., J, b]
    return V.flatten(-2)[..., :L]


def vandermonde_transpose(u: torch.Tensor, log_z: torch.Tensor) -> torch.Tensor:
    """s[..., n] = Σ_l u[..., l] · z_n^(L-1-l): the state a diagonal system reaches after reading
    u from a zero state (up to B̄). u [..., L]; log_z [..., N]. Returns [..., N] complex."""
    L = u.shape[-1]
    ls = torch.arange(L - 1, -1, -1, device=log_z.device, dtype=log_z.real.dtype)
    powers = torch.exp(log_z.unsqueeze(-1) * ls)  # [..., N, L]
    dtype = torch.promote_types(u.dtype, powers.dtype)
    return (powers.to(dtype) @ u.to(dtype).unsqueeze(-1)).squeeze(-1)


def vandermonde_kernel(Abar_log: torch.Tensor, Bbar: torch.Tensor, C: torch.Tensor, L: int, *, conj_pairs: bool = True) -> torch.Tensor:
    """Kernel of a diagonal SSM: K_l = Σ_n C_n B̄_n Ā_nˡ (S4D), as the real part times 2 when
    the modes are stored as conjugate pairs. Abar_log = log Ā [H, M]; Bbar, C [H, M].
    Returns [H, L] real."""
    V = vandermonde(C * Bbar, Abar_log, L)
    if not V.is_complex():
        return V
    return 2 * V.real if conj_pairs else V.real


CAUCHY_CHUNK_ELEMENTS = 2**20  # terms v_n / (z_l - w_n) held at once by cauchy(mode="chunked")


def _cauchy_terms(v, z, w):  # [..., L, N]: v_n / (z_l - w_n)
    return v.unsqueeze(-2) / (z.unsqueeze(-1) - w.unsqueeze(-2))


def _node_chunks(shape, L: int, chunk_elements: int):
    """Slices of the L nodes with at most ``chunk_elements`` terms each (batch shape × N × nodes), or
    one node each where one node's batch × N terms alone are more."""
    c = max(1, chunk_elements // max(1, math.prod(shape)))
    return [slice(l0, min(L, l0 + c)) for l0 in range(0, L, c)]


def _to_input(grad, t):
    """A gradient in the broadcast shape back to input t's shape and (real or complex) dtype."""
    grad = grad.sum_to_size(t.shape)
    return grad.to(t.dtype) if t.is_complex() else grad.real.to(t.dtype)


class _ChunkedCauchy(torch.autograd.Function):
    """r = Σ_n v_n / (z_l - w_n) over chunks of the nodes; the backward recomputes each chunk's
    terms, so neither pass holds the [..., L, N] terms of all nodes at once. Holomorphic in
    (v, z, w), so each gradient is the upstream one times the conjugate derivative (PyTorch's
    convention for complex autograd): ∂r_l/∂v_n = q_ln, ∂r_l/∂w_n = v_n q_ln², ∂r_l/∂z_l =
    -Σ_n v_n q_ln², with q_ln = 1 / (z_l - w_n)."""

    @staticmethod
    def forward(ctx, v, z, w, chunk_elements):
        vb, wb = torch.broadcast_tensors(v, w)
        L = z.shape[-1]
        out = torch.cat([_cauchy_terms(vb, z[sl], wb).sum(-1) for sl in _node_chunks(vb.shape, L, chunk_elements)], -1)
        ctx.save_for_backward(v, z, w)
        ctx.chunk_elements = chunk_elements
        return out

    @staticmethod
    def backward(ctx, g):
        v, z, w = ctx.saved_tensors
        vb, wb = torch.broadcast_tensors(v, w)
        gv = gw = 0
        gz = []
        for sl in _node_chunks(vb.shape, z.shape[-1], ctx.chunk_elements):
            q = 1 / (z[sl].unsqueeze(-1) - wb.unsqueeze(-2))  # [..., c, N]
            gc = g[..., sl].unsqueeze(-1)  # [..., c, 1]
            vq2 = (vb.unsqueeze(-2) * q * q).conj()
            if ctx.needs_input_grad[0]:
                gv = gv + (gc * q.conj()).sum(-2)
            if ctx.needs_input_grad[2]:
                gw = gw + (gc * vq2).sum(-2)
            if ctx.needs_input_grad[1]:
                gz.append(-(gc * vq2).sum(-1).reshape(-1, q.shape[-2]).sum(0))
        return (_to_input(gv, v) if ctx.needs_input_grad[0] else None,
                _to_input(torch.cat(gz), z) if ctx.needs_input_grad[1] else None,
                _to_input(gw, w) if ctx.needs_input_grad[2] else None, None)


CAUCHY_MODES = ("naive", "chunked")


def cauchy(v: torch.Tensor, z: torch.Tensor, w: torch.Tensor, *, mode: str = "chunked",
           chunk_elements: int = CAUCHY_CHUNK_ELEMENTS) -> torch.Tensor:
    """The Cauchy kernel r[..., l] = Σ_n v[..., n] / (z[l] - w[..., n]) (O(N·L) terms).

    v, w [..., N] (broadcasting); z [L] the nodes. Returns [..., L].

    ``mode="naive"`` (the reference) forms every term at once: [..., L, N], which autograd keeps
    for the backward (S4 at d_model 128, d_state 64, L = 16k: 2.1 GB per call).
    ``mode="chunked"`` (default) sums ``chunk_elements`` terms at a time and recomputes them in
    the backward (``_ChunkedCauchy``): the memory is bounded by the chunk, not by L.
    """
    where = "cauchy"
    check_choice("mode", mode, CAUCHY_MODES, where)
    check_positive_int("chunk_elements", chunk_elements, where)
    for name, t in (("v", v), ("z", z), ("w", w)):
        check_tensor(name, t, complex_ok=True, where=where)
    if z.dim() != 1:
        raise ValueError(f"{where}: argument 'z' must be [L] (the nodes), got {fmt_shape(z.shape)}")
    if v.dim() == 0 or w.dim() == 0 or v.shape[-1] != w.shape[-1]:
        raise ValueError(f"{where}: arguments 'v' and 'w' must be [..., N] with the same N, got {fmt_shape(v.shape)} and {fmt_shape(w.shape)}")
    try:
        torch.broadcast_shapes(v.shape, w.shape)
    except RuntimeError:
        raise ValueError(f"{where}: the batch shapes of arguments 'v' {fmt_shape(v.shape)} and 'w' {fmt_shape(w.shape)} do not broadcast") from None
    if mode == "naive" or z.numel() == 0:
        return _cauchy_terms(v, z, w).sum(-1)
    return _ChunkedCauchy.apply(v, z, w, chunk_elements)


def dplr_kernel(
    Lambda: torch.Tensor,
    P: torch.Tensor,
    B: torch.Tensor,
    C_tilde: torch.Tensor,
    dt: torch.Tensor,
    L: int,
    *,
    Q: torch.Tensor | None = None,
    conj_pairs: bool = True,
) -> torch.Tensor:
    """Kernel of a bilinear-discretized DPLR system, A = diag(Λ) - P Q* (S4 Algorithm 1).

    Lambda [..., M] (Re < 0), P and Q [r, ..., M] (Q defaults to P), B, C_tilde [..., M]
    (complex), dt [...]. With ``conj_pairs`` each mode stands for itself and its conjugate
    (N = 2M states, real kernel). C_tilde is C̃ = C(I - Ā^L): the generating function
    K̂(ω) = Σ_l K_l ωˡ = C̃(I - Āω)⁻¹B̄ at the L roots of unity is then exact, and
    K = irfft(K̂) (convblog note §9.3):

        K̂(ω) = 2/(1+ω) · [R00 - R01 (I + R11)⁻¹ R10],   R_ab = Δ Σ_n a_n b_n / (z - Δλ_n),
        z = 2(1-ω)/(1+ω),   (a, b) ∈ {C̃, Q̄} × {B, P}                              (Woodbury)

    At ω = -1 (the Nyquist bin of an even L) 1+ω = 0; the exact value there is
    K̂(-1) = C̃(I + Ā)⁻¹B̄ = Δ/2 · C̃B, used instead. Returns [..., L] real.
    """
    where = "dplr_kernel"
    check_positive_int("L", L, where)
    for name, t in (("Lambda", Lambda), ("P", P), ("B", B), ("C_tilde", C_tilde)):
        check_tensor(name, t, complex_ok=True, where=where)
    if P.dim() != Lambda.dim() + 1:
        raise ValueError(f"{where}: argument 'P' must be [r, *Lambda.shape] = [r, {', '.join(map(str, Lambda.shape))}], got {fmt_shape(P.shape)}")
    Q = P if Q is None else Q
    cdtype = torch.promote_types(torch.promote_types(Lambda.dtype, B.dtype), torch.promote_types(P.dtype, C_tilde.dtype))
    if not cdtype.is_complex:
        cdtype = torch.complex128 if cdtype == torch.float64 else torch.complex64
    Lambda, P, Q, B, C_tilde = (t.to(cdtype) for t in (Lambda, P, Q, B, C_tilde))
    if conj_pairs:
        def full(x):
            return torch.cat([x, x.conj()], -1)

        Lambda, P, Q, B, C_tilde = full(Lambda), full(P), full(Q), full(B), full(C_tilde)
    dt = dt.to(Lambda.real.dtype)
    r = P.shape[0]
    left = torch.stack([C_tilde, *Q.conj().unbind(0)], -2)  # [..., 1+r, N]
    right = torch.stack([B, *P.unbind(0)], -2)  # [..., 1+r, N]
    v = left.unsqueeze(-2) * right.unsqueeze(-3)  # [..., 1+r, 1+r, N]
    w = (dt.unsqueeze(-1) * Lambda).unsqueeze(-2).unsqueeze(-2)  # [..., 1, 1, N]

    nodes = torch.arange(L // 2 + 1, device=Lambda.device, dtype=Lambda.real.dtype)
    omega = torch.exp(torch.complex(torch.zeros_like(nodes), -2 * math.pi * nodes / L))
    nyquist = L % 2 == 0
    om = omega[:-1] if nyquist else omega
    z = 2 * (1 - om) / (1 + om)
    R = dt.reshape(*dt.shape, 1, 1, 1) * cauchy(v, z, w)  # [..., 1+r, 1+r, Lz]
    R = R.movedim(-1, -3)  # [..., Lz, 1+r, 1+r]
    R00, R01, R10, R11 = R[..., :1, :1], R[..., :1, 1:], R[..., 1:, :1], R[..., 1:, 1:]
    eye = torch.eye(r, dtype=cdtype, device=R.device)
    Kh = (R00 - R01 @ torch.linalg.solve(eye + R11, R10))[..., 0, 0]  # [..., Lz]
    Kh = Kh * (2 / (1 + om))
    if nyquist:
        k_nyq = dt / 2 * (C_tilde * B).sum(-1)
        Kh = torch.cat([Kh, k_nyq.unsqueeze(-1)], -1)
    return torch.fft.irfft(Kh, n=L)


# ------------------------------------------------------------------------------------------
# HiPPO and the initializations of S4 / S4D
# ------------------------------------------------------------------------------------------


def hippo_legs(N: int, dtype=torch.float64):
    """HiPPO-LegS (convblog note §8.3; the minus sign included):
    A_nk = -√(2n+1)√(2k+1) (n > k), -(n+1) (n = k), 0 (n < k); B_n = √(2n+1). Returns (A [N, N], B [N])."""
    check_positive_int("N", N, "hippo_legs")
    q = torch.arange(N, dtype=torch.float64)
    r = torch.sqrt(2 * q + 1)
    A = -(r.unsqueeze(1) * r.unsqueeze(0)).tril(-1) - torch.diag(q + 1)
    return A.to(dtype), r.to(dtype)


def nplr_legs(N: int):
    """The NPLR / DPLR form of HiPPO-LegS (convblog note §8.6), in float64.

    With P_n = √(n + 1/2), A + PPᵀ = -I/2 + S with S skew-symmetric, so
    A = V (diag(Λ) - P̃P̃*) V* with V unitary, Λ = -1/2 + iω (iω the eigenvalues of S),
    P̃ = V*P, B̃ = V*B. The eigenvalues come in conjugate pairs; the M = N/2 with ω > 0 are
    returned. Returns (Lambda [M], P [M], B [M], V [N, M]) complex128; the full V is
    [V, conj(V)].
    """
    where = "nplr_legs"
    check_positive_int("N", N, where)
    if N % 2:
        raise ValueError(f"{where}: argument 'N' (the state size) must be even (conjugate pairs), got {N}")
    A, B = hippo_legs(N)
    P = torch.sqrt(torch.arange(N, dtype=torch.float64) + 0.5)
    S = A + torch.outer(P, P) + 0.5 * torch.eye(N, dtype=torch.float64)
    omega, V = torch.linalg.eigh(-1j * S.to(torch.complex128))  # S v = iω v, V unitary
    keep = omega > 0
    if int(keep.sum()) != N // 2:
        raise ValueError(f"{where}: the skew part of LegS has a zero eigenvalue at N = {N}; use another N")
    V = V[:, keep]
    Lambda = torch.complex(torch.full_like(omega[keep], -0.5), omega[keep])
    Vh = V.conj().T
    return Lambda, Vh @ P.to(torch.complex128), Vh @ B.to(torch.complex128), V


def s4d_init(name: str, N: int):
    """Diagonal initializations of S4D (convblog note §9.4; peer-ssm note §2.1), in float64.

    * ``lin``:  λ_n = -1/2 + iπn,                    n < N/2 (conjugate pairs), B = 1
    * ``inv``:  λ_n = -1/2 + i(N/π)(N/(2n+1) - 1),   n < N/2, B = 1
    * ``legs``: λ_n = the eigenvalues of LegS's normal part (:func:`nplr_legs`), B = V*B_LegS
    * ``real``: λ_n = -(n+1), n < N, real (S4D-Real, Mamba's A), B = 1

    Returns (Lambda, B): complex [N/2] for the complex inits (N must be even), real [N] for ``real``.
    """
    check_choice("init", name, S4D_INITS, "s4d_init")
    check_positive_int("N", N, "s4d_init")
    if name == "real":
        return -(torch.arange(N, dtype=torch.float64) + 1), torch.ones(N, dtype=torch.float64)
    if N % 2:
        raise ValueError(f"s4d_init: argument 'N' (d_state) must be even for the complex init {name!r} (conjugate pairs), got {N}")
    M = N // 2
    n = torch.arange(M, dtype=torch.float64)
    if name == "legs":
        Lambda, _, B, _ = nplr_legs(N)
        return Lambda, B
    imag = math.pi * n if name == "lin" else (N / math.pi) * (N / (2 * n + 1) - 1)
    return torch.complex(torch.full_like(n, -0.5), imag), torch.ones(M, dtype=torch.complex128)


# ------------------------------------------------------------------------------------------
# dense LTI scan (S4's recurrent mode) and the state terms of its convolution mode
# ------------------------------------------------------------------------------------------


def _check_scan(u, Abar, Bbar, C, state, where):
    check_tensor("u", u, rank=3, layout="[B, T, H]", where=where)
    check_tensor("Abar", Abar, rank=3, layout="[H, N, N]", complex_ok=True, where=where)
    H, N = Abar.shape[0], Abar.shape[-1]
    if Abar.shape != (H, N, N) or u.shape[-1] != H:
        raise ValueError(f"{where}: 'Abar' must be [H, N, N] with H = u.shape[-1] = {u.shape[-1]}, got {fmt_shape(Abar.shape)}")
    for name, t in (("Bbar", Bbar), ("C", C)):
        if t is not None and t.shape != (H, N):
            raise ValueError(f"{where}: argument '{name}' must be [H, N] = [{H}, {N}], got {fmt_shape(t.shape)}")
    if state is not None and state.shape != (u.shape[0], H, N):
        raise ValueError(f"{where}: argument 'initial_state' must be [B, H, N] = [{u.shape[0]}, {H}, {N}], got {fmt_shape(state.shape)}")


def _matvec(A, x):  # A [H, N, N], x [B, H, N] -> [B, H, N]
    return (A @ x.unsqueeze(-1)).squeeze(-1)


@full_precision
def ssm_scan(u, Abar, Bbar, C, *, initial_state=None, output_final_state: bool = False):
    """The recurrence of a dense LTI system, one channel per head (the reference loop):

        h_t = Ā h_{t-1} + B̄ u_t,     y_t = C h_t

    u [B, T, H]; Abar [H, N, N]; Bbar, C [H, N]; initial_state [B, H, N] or None (zeros).
    Returns (y [B, T, H], final state [B, H, N] or None). O(T·N²) per channel.
    """
    _check_scan(u, Abar, Bbar, C, initial_state, "ssm_scan")
    B_, T, H = u.shape
    N = Abar.shape[-1]
    dtype = torch.promote_types(u.dtype, Abar.dtype)
    h = initial_state.to(dtype) if initial_state is not None else torch.zeros(B_, H, N, dtype=dtype, device=u.device)
    ys = []
    for u_t in u.to(dtype).unbind(1):  # unbind, never u[:, t]: see ops.recurrence
        h = _matvec(Abar, h) + Bbar * u_t.unsqueeze(-1)
        ys.append((C * h).sum(-1))
    return torch.stack(ys, 1), (h if output_final_state else None)


@full_precision
def ssm_free_response(Abar, C, initial_state, T: int, *, chunk_size: int = 64):
    """y_t = C Ā^(t+1) h_0 for t < T: what a dense LTI system outputs from the state h_0 with
    zero input (the initial-state term of the convolution mode).

    Two levels (c = chunk_size): W_r = C Ā^(r+1) for r < c by c matrix-vector steps, and
    g_j = Ā^(jc) h_0 for the T/c chunks; y_(jc+r) = W_r g_j. O((c + T/c)·N² + T·N) per
    channel and sequence instead of O(T·N²). Abar [H, N, N]; C [H, N]; initial_state
    [B, H, N]. Returns [B, T, H].
    """
    where = "ssm_free_response"
    check_positive_int("T", T, where)
    check_positive_int("chunk_size", chunk_size, where)
    H, N = C.shape
    c = min(chunk_size, T)
    n = math.ceil(T / c)
    W, w = [], C
    AT = Abar.transpose(-1, -2)
    for _ in range(c):  # W_r = C Ā^(r+1), as row vectors: w <- w Ā
        w = (AT @ w.unsqueeze(-1)).squeeze(-1)
        W.append(w)
    W = torch.stack(W, 1)  # [H, c, N]
    Ac = torch.linalg.matrix_power(Abar, c)
    g, gs = initial_state.to(torch.promote_types(initial_state.dtype, Abar.dtype)), []
    for _ in range(n):
        gs.append(g)
        g = _matvec(Ac, g)
    G = torch.stack(gs, 1)  # [B, n, H, N]
    y = torch.einsum("hrn,bjhn->bjrh", W.to(G.dtype), G)  # [B, n, c, H]
    return y.reshape(y.shape[0], n * c, H)[:, :T]


@full_precision
def ssm_final_state(u, Abar, Bbar, *, initial_state=None, chunk_size: int = 64):
    """h_T = Ā^T h_0 + Σ_s Ā^(T-1-s) B̄ u_s: the state after reading u [B, T, H] (the final
    state of the convolution mode).

    Two levels (c = chunk_size): M_r = Āʳ B̄ for r < c; the state each chunk writes,
    S_j = Σ_r M_(c-1-r) u_(jc+r), by one contraction; the chunks are chained by
    h <- Ā^c h + S_j (u is zero-padded at the front to a multiple of c). Returns [B, H, N].
    """
    where = "ssm_final_state"
    _check_scan(u, Abar, Bbar, None, initial_state, where)
    check_positive_int("chunk_size", chunk_size, where)
    B_, T, H = u.shape
    N = Abar.shape[-1]
    c = min(chunk_size, T)
    n = math.ceil(T / c)
    dtype = torch.promote_types(u.dtype, Abar.dtype)
    Ms, m = [], Bbar
    for _ in range(c):  # M_r = Āʳ B̄
        Ms.append(m)
        m = (Abar @ m.unsqueeze(-1)).squeeze(-1)
    M = torch.stack(Ms[::-1], 0)  # [c, H, N], M[r] = Ā^(c-1-r) B̄
    up = torch.nn.functional.pad(u.to(dtype), (0, 0, n * c - T, 0)).reshape(B_, n, c, H)
    S = torch.einsum("rhn,bjrh->bjhn", M.to(dtype), up)  # [B, n, H, N]
    Ac = torch.linalg.matrix_power(Abar, c).to(dtype)
    h = torch.zeros(B_, H, N, dtype=dtype, device=u.device)
    for S_j in S.unbind(1):
        h = _matvec(Ac, h) + S_j
    if initial_state is not None:
        h = h + _matvec(torch.linalg.matrix_power(Abar, T).to(dtype), initial_state.to(dtype))
    return h


# ------------------------------------------------------------------------------------------
# the convolution mode of a diagonal LTI system with a carried state (S4D, H3, GSS)
# ------------------------------------------------------------------------------------------


@full_precision
def diagonal_ssm_conv(
    u: torch.Tensor,
    log_Abar: torch.Tensor,
    Bbar: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    kernel: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    conj_pairs: bool = True,
    check_values: bool = True,
):
    """One diagonal LTI system per channel, run as a convolution, continuing from a state.

        y_t = Σ_(s<=t) K_(t-s) u_s + D u_t + c·Re Σ_n C_n Ā_n^(t+1) h0_n        (free response of h0)
        h_T = Ā^T h0 + B̄ ⊙ Σ_s Ā^(T-1-s) u_s                                     (the final state)
        K_l = c·Re Σ_n C_n B̄_n Ā_nˡ                                              (vandermonde_kernel)

    with c = 2 for conjugate pairs (complex modes, ``conj_pairs``), else 1 (real modes: no
    Re). The convolution is :func:`~seqmix.ops.conv.fft_conv`, the two state terms are
    :func:`vandermonde` and :func:`vandermonde_transpose`, so the result equals the
    recurrence h_t = Ā h_(t-1) + B̄ u_t, y_t = c·Re(C h_t) + D u_t started from h0.

    u [B, T, H]; log_Abar = log Ā, Bbar, C [H, M]; D [H] or None; kernel: K [H, >=T] when the
    caller has it already; initial_state [B, H, M] or None (zeros). Returns
    (y [B, T, H], h_T [B, H, M] or None).
    """
    where = "diagonal_ssm_conv"
    check_tensor("u", u, rank=3, layout="[B, T, H]", where=where)
    Bt, T, H = u.shape
    for name, t in (("log_Abar", log_Abar), ("Bbar", Bbar), ("C", C)):
        check_tensor(name, t, rank=2, layout="[H, M]", complex_ok=True, where=where)
        if t.shape[0] != H or t.shape != log_Abar.shape:
            raise ValueError(f"{where}: argument '{name}' must be [H, M] = [{H}, {log_Abar.shape[-1]}], got {fmt_shape(t.shape)}")
    M = log_Abar.shape[-1]
    if initial_state is not None and initial_state.shape != (Bt, H, M):
        raise ValueError(f"{where}: argument 'initial_state' must be [B, H, M] = [{Bt}, {H}, {M}], got {fmt_shape(initial_state.shape)}")
    scale = 2.0 if conj_pairs and log_Abar.is_complex() else 1.0
    if kernel is None:
        kernel = vandermonde_kernel(log_Abar, Bbar, C, T, conj_pairs=conj_pairs)
    y = fft_conv(u, kernel[:, :T].transpose(0, 1), D, check_values=check_values)
    if initial_state is not None:  # c·Re Σ_n C_n Ā_n^(t+1) h0_n
        free = vandermonde(C * log_Abar.exp() * initial_state, log_Abar, T)  # [B, H, T]
        y = y + (scale * free.real if free.is_complex() else free).transpose(1, 2).to(y.dtype)
    S = None
    if output_final_state:
        S = Bbar * vandermonde_transpose(u.transpose(1, 2), log_Abar)
        if initial_state is not None:
            S = S + (T * log_Abar).exp() * initial_state
    return y, S


# ------------------------------------------------------------------------------------------
# Mamba-3: trapezoidal two-tap recurrence, cumulative-angle rotation
# ------------------------------------------------------------------------------------------


def _wide(*ts):
    """The compute dtype of the Mamba-3 pieces: float32 for half inputs, else the promoted dtype."""
    dt = None
    for t in ts:
        if t is not None:
            dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def rotate_pairs(x: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """Rotates the channel pairs (2j, 2j+1), j < R, of x by the angle −φ_j: as complex numbers
    (x_2j + i x_2j+1)·e^(−iφ_j); channels 2R .. K−1 pass unchanged.

    Mamba-3's "RoPE trick" (Lahoti et al., Prop. on complex SSMs): the complex diagonal
    transition Λ_t = α_t e^(iθ_t) on R pairs is the real transition α_t with B_t and C_t both
    rotated by −φ_t, φ_t = Σ_(r≤t) θ_r, since Re(c̄_t e^(i(φ_t−φ_s)) b_s) = ⟨R(−φ_t)c_t, R(−φ_s)b_s⟩.

    x [B, T, H, K]; phi [B, T, H, R] with 2R ≤ K. Computed in float32 or wider; returns that dtype.
    """
    R = phi.shape[-1]
    if 2 * R > x.shape[-1]:
        raise ValueError(f"rotate_pairs: argument 'phi' has R = {R} angles, more than K/2 = {x.shape[-1] // 2} pairs of x")
    dt = _wide(x, phi)
    x, phi = x.to(dt), phi.to(dt)
    if R == 0:
        return x
    a, b = x[..., 0 : 2 * R : 2], x[..., 1 : 2 * R : 2]
    cos, sin = phi.cos(), phi.sin()
    rot = torch.stack((a * cos + b * sin, b * cos - a * sin), dim=-1).flatten(-2)
    return rot if 2 * R == x.shape[-1] else torch.cat((rot, x[..., 2 * R :]), dim=-1)


def _trap_weights(gamma, eta):
    """(w, η_next): the folded key weight w_t = γ_t + η_(t+1) (w_(T−1) = γ_(T−1)) and η_(t+1) (0 at T−1)."""
    eta_next = torch.cat((eta[:, 1:], torch.zeros_like(eta[:, :1])), dim=1)
    return gamma + eta_next, eta_next


def trapezoidal_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    gamma: torch.Tensor,
    eta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    prev: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int | None = None,
):
    """Mamba-3's trapezoidal recurrence (generalized trapezoidal rule, a two-tap input):

        S_t = α_t S_(t−1) + β_t k_(t−1)ᵀ v_(t−1) + γ_t k_tᵀ v_t,    o_t = q_t S_t,
        α_t = exp(g_t),   β_t = η_t α_t   (Mamba-3: γ_t = λ_t Δ_t, η_t = (1 − λ_t) Δ_t)

    run by ``linear_recurrence`` (every mode: recurrent, chunk, parallel, step) on a folded key.
    Reindexing the β term (β_(s+1) Π_(r=s+2..t) α_r = η_(s+1) Π_(r=s+1..t) α_r) gives

        S_t = Σ_(s≤t) (Π_(r=s+1..t) α_r) w_s^(t) k_sᵀ v_s,   w_s^(t) = γ_s + η_(s+1) [s < t],

    i.e. the one-tap recurrence of k̃_s = (γ_s + η_(s+1)) k_s, whose state S̃_t = S_t + η_(t+1) k_tᵀ v_t
    holds the next token's trapezoid input too; hence o_t = q_t S̃_t − η_(t+1) (q_t·k_t) v_t (a
    diagonal correction, like RWKV's bonus), and the last token of the call uses w = γ (η_T unknown),
    so the final state is the true S_T. A call that continues a sequence gets ``prev`` = (k_(−1), v_(−1)),
    the previous call's last key and value, and starts from S_(−1) + η_0 k_(−1)ᵀ v_(−1).

    Args:
        q, k: [B, T, H, K]; v: [B, T, H, V]; g: log α, [B, T, H] (<= 0); gamma, eta: [B, T, H].
        initial_state: [B, H, K, V] or None (zeros); prev: ([B, H, K], [B, H, V]) or None (zeros).
        mode, chunk_size: as ``linear_recurrence``.

    Returns:
        (o [B, T, H, V], final state [B, H, K, V] or None); half inputs are computed in float32
        and o is cast back.
    """
    out_dtype = v.dtype
    dt = _wide(q, k, v, g, gamma, eta, initial_state)
    q, k, v, g, gamma, eta = (t.to(dt) for t in (q, k, v, g, gamma, eta))
    w, eta_next = _trap_weights(gamma, eta)
    S0 = initial_state.to(dt) if initial_state is not None else None
    if prev is not None:
        k_prev, v_prev = prev[0].to(dt), prev[1].to(dt)
        carry = eta[:, 0, :, None, None] * k_prev.unsqueeze(-1) * v_prev.unsqueeze(-2)
        S0 = carry if S0 is None else S0 + carry
    o, S = linear_recurrence(
        q, k * w.unsqueeze(-1), v, g, initial_state=S0, output_final_state=output_final_state,
        mode=mode, chunk_size=chunk_size, check_values=False,
    )
    o = o - (eta_next * (q * k).sum(-1)).unsqueeze(-1) * v
    return o.to(out_dtype if out_dtype in (torch.float16, torch.bfloat16) else dt), S


def trapezoidal_recurrence_reference(q, k, v, g, gamma, eta, *, initial_state=None, prev=None):
    """The loop written from the equations (two taps, no folding): returns (o, final state)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    dt = _wide(q, k, v, g, gamma, eta, initial_state)
    S = initial_state.to(dt) if initial_state is not None else torch.zeros(B, H, K, V, dtype=dt, device=q.device)
    kv_prev = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
    if prev is not None:
        kv_prev = prev[0].to(dt).unsqueeze(-1) * prev[1].to(dt).unsqueeze(-2)
    outs = []
    for t in range(T):
        a = g[:, t].to(dt).exp()[..., None, None]
        kv = k[:, t].to(dt).unsqueeze(-1) * v[:, t].to(dt).unsqueeze(-2)
        S = a * S + eta[:, t].to(dt)[..., None, None] * a * kv_prev + gamma[:, t].to(dt)[..., None, None] * kv
        outs.append((q[:, t].to(dt).unsqueeze(-2) @ S).squeeze(-2))
        kv_prev = kv
    return torch.stack(outs, 1), S


def trapezoidal_map(q, k, g, gamma, eta) -> torch.Tensor:
    """[B, H, T, T]: the map of :func:`trapezoidal_recurrence` (zero initial state),
    Φ[t, s] = (q_t·k_s) Π_(r=s+1..t) α_r (γ_s + η_(s+1) [s < t])."""
    dt = _wide(q, k, g, gamma, eta)
    q, k, g, gamma, eta = (t.to(dt) for t in (q, k, g, gamma, eta))
    w, eta_next = _trap_weights(gamma, eta)
    A = recurrence_map(q, k * w.unsqueeze(-1), g, check_values=False)
    return A - torch.diag_embed((eta_next * (q * k).sum(-1)).transpose(1, 2))
