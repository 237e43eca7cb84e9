"""State-space realizations of attention, linear attention and SSMs (B'MOJO paper §3.1, App. C;
bmojo note §5): the systems behind B'MOJO's "fading + eidetic" picture, as runnable float64
objects whose outputs the tests compare with the mixers'.

Every realization here is a linear system with a dense (block) transition, run by
``seqmix.ops.ltv_scan`` (x_t = A_t x_{t-1} + b_t; the state includes the current input), and a
read-out:

* attention (eq. 9): the nil-potent shift register of the last N key/value blocks
  b(u_t) = [k_t; v_t] (one more entry, a 1, marks filled slots), A_ATT = S ⊗ I with S the upper
  shift (the companion matrix with a zero last row), read out by softmax attention of q_t over
  the stored blocks: :func:`attention_realization` reproduces sliding-window attention of
  window N ("deadbeat in N steps").
* B'MOJO-F (§3.1): the same shift register with an input-dependent last block row,
  x^(N)_t = Σ_i a_i(u_t) x^(i)_{t-1} + b(u_t) (:func:`companion_realization`); a = 0 is attention.
* linear attention (eq. 11-13): the FIR shift register of the products φ(k_i) v_iᵀ, read out
  linearly, reproduces windowed linear attention (:func:`linear_attention_realization`); with
  ``global_memory=True`` a marginally stable integrator block accumulates everything that left
  the window (the local-global factorization, eq. 15-18), reproducing full causal linear
  attention. Eq. (17)-(18) as printed put the integrator on the newest slot; its stated
  meaning (eq. 16: Z̄_{t-K}, everything older than the window) needs it fed by the oldest
  slot, which is what is built here (bmojo note §11.20, loose indices).
* LTI systems: the controllable canonical (companion) form of a transfer function (eq. 19-20,
  :func:`ccf`), the companion form of a diagonal system (poles a_i: α from Π(z - a_i), the
  paper's "Representing Mamba", :func:`diagonal_to_ccf`) and the strictly causal rewriting of a
  non-strictly causal system (eq. 21-24, :func:`strictly_causal`).

Time conventions: the systems run as x_t = A x_{t-1} + B u_t, y_t = C x_t + D u_t (the state
includes u_t, Mamba's convention), except :func:`run_strict`, which runs eq. (20)'s
X_{t+1} = A X_t + B u_t, y_t = C X_t + D u_t.
"""

from __future__ import annotations

import math

import torch

from ..ops.ltv import ltv_scan

__all__ = [
    "shift_matrix", "companion_matrix", "attention_realization", "companion_realization",
    "linear_attention_realization", "ccf", "diagonal_to_ccf", "strictly_causal", "run_strict", "run_system",
    "poly_from_roots",
]


def shift_matrix(N: int, dtype=torch.float64) -> torch.Tensor:
    """S [N, N] with ones on the super-diagonal: (S x)_i = x_{i+1}, the last entry 0 (eq. 9, 13)."""
    return torch.diag(torch.ones(N - 1, dtype=dtype), 1)


def companion_matrix(alpha: torch.Tensor) -> torch.Tensor:
    """The controllable canonical form (eq. 20): the upper shift with last row -α.
    alpha [..., N] -> [..., N, N]."""
    N = alpha.shape[-1]
    A = shift_matrix(N, alpha.dtype).to(alpha.device).expand(*alpha.shape[:-1], N, N).clone()
    A[..., N - 1, :] = -alpha
    return A


def _kron_eye(A: torch.Tensor, p: int) -> torch.Tensor:
    """A ⊗ I_p for A [..., N, N]: the block version acting on N blocks of p entries."""
    eye = torch.eye(p, dtype=A.dtype, device=A.device)
    return torch.einsum("...ij,ab->...iajb", A, eye).reshape(*A.shape[:-2], A.shape[-1] * p, A.shape[-1] * p)


def _last_block(x: torch.Tensor, N: int) -> torch.Tensor:
    """e_N ⊗ x: x [..., p] written into the last of N blocks -> [..., N·p]."""
    return torch.cat([x.new_zeros(*x.shape[:-1], (N - 1) * x.shape[-1]), x], -1)


def companion_realization(a: torch.Tensor, b: torch.Tensor, N: int | None = None) -> torch.Tensor:
    """B'MOJO-F's companion form (§3.1): N blocks of p entries,

        x^(i)_t = x^(i+1)_{t-1}  (i < N),      x^(N)_t = Σ_i a_i(u_t) x^(i)_{t-1} + b(u_t),

    a [B, T, N] (the input-dependent last row; None or 0: the attention shift register),
    b [B, T, p]. Returns the states [B, T, N, p] (block N is the newest)."""
    Bt, T, p = b.shape
    if a is None:
        a = b.new_zeros(Bt, T, N)
    N = a.shape[-1]
    A = _kron_eye(companion_matrix(-a.to(torch.float64)), p)  # [B, T, N·p, N·p]
    x = ltv_scan(A, _last_block(b.to(torch.float64), N))
    return x.view(Bt, T, N, p)


def attention_realization(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *, scale: float | None = None):
    """Softmax attention of window N = ``window`` as a nil-potent system (eq. 9) with a softmax read-out.

    q, k [B, T, H, K], v [B, T, H, V] -> o [B, T, H, V] (float64). The state is the shift
    register of the last N blocks [k; v; 1] per head (2V-ish entries per block, plus the flag that
    marks a filled slot); the read-out is softmax(scale · q_tᵀ k_slot) over the filled slots."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = 1.0 / math.sqrt(K) if scale is None else scale
    blocks = torch.cat([k, v, torch.ones_like(k[..., :1])], -1).to(torch.float64)  # b(u_t) = [k_t; v_t; 1]
    blocks = blocks.transpose(1, 2).reshape(B * H, T, K + V + 1)
    Z = companion_realization(None, blocks, window)  # [B·H, T, N, K+V+1]
    ks, vs, filled = Z[..., :K], Z[..., K : K + V], Z[..., -1] > 0.5
    qh = q.transpose(1, 2).reshape(B * H, T, K).to(torch.float64)
    scores = torch.einsum("btk,btnk->btn", qh, ks) * scale
    p = torch.softmax(scores.masked_fill(~filled, float("-inf")), -1)
    o = torch.einsum("btn,btnv->btv", p, vs)
    return o.view(B, H, T, V).transpose(1, 2)


def linear_attention_realization(phi_q, phi_k, v, *, window: int, global_memory: bool = False, normalize: bool = True):
    """Linear attention as a linear system (eq. 11-13; with ``global_memory`` eq. 15-18).

    phi_q, phi_k [B, T, H, n] (features), v [B, T, H, V] -> o [B, T, H, V] (float64).
    State: K = window slots z_i = φ(k_i) [v_i; 1]ᵀ (the 1 column gives the denominator of (11)),
    shifted each step (A = S ⊗ I); with ``global_memory`` one more block G accumulates the slot
    leaving the window, G_t = G_{t-1} + z_{t-K} (a pole at 1). Read-out: φ(q_t)ᵀ (G_t + Σ slots),
    divided by the same with v = 1 when ``normalize``."""
    B, T, H, n = phi_q.shape
    V = v.shape[-1]
    vv = torch.cat([v, torch.ones_like(v[..., :1])], -1) if normalize else v
    P = vv.shape[-1]
    z = torch.einsum("bthn,bthp->bthnp", phi_k.to(torch.float64), vv.to(torch.float64)).reshape(B, T, H, n * P)
    z = z.transpose(1, 2).reshape(B * H, T, n * P)
    Kw = window
    if global_memory:
        M = torch.zeros(Kw + 1, Kw + 1, dtype=torch.float64)
        M[0, 0] = 1.0  # the integrator G (marginally stable)
        if Kw >= 1:
            M[0, 1] = 1.0  # fed by the oldest slot, the one leaving the window
        M[1:, 1:] = shift_matrix(Kw)
        N = Kw + 1
    else:
        M, N = shift_matrix(Kw), Kw
    states = ltv_scan(_kron_eye(M, n * P), _last_block(z, N)).view(B * H, T, N, n, P)
    Zbar = states.sum(2)  # [B·H, T, n, P]: G + Σ slots
    qh = phi_q.transpose(1, 2).reshape(B * H, T, n).to(torch.float64)
    o = torch.einsum("btn,btnp->btp", qh, Zbar)
    if normalize:
        o = o[..., :V] / o[..., V:]
    return o.view(B, H, T, V).transpose(1, 2)


# ------------------------------------------------------------------------------------------
# LTI realizations (App. C.3)
# ------------------------------------------------------------------------------------------


def poly_from_roots(roots: torch.Tensor) -> torch.Tensor:
    """Coefficients [..., N+1] of Π_i (z - r_i), lowest degree first (the last one is 1)."""
    N = roots.shape[-1]
    p = torch.zeros(*roots.shape[:-1], N + 1, dtype=roots.dtype, device=roots.device)
    p[..., 0] = 1.0
    for i in range(N):  # multiply by (z - r_i): a loop over the N roots, not over time
        shifted = torch.cat([torch.zeros_like(p[..., :1]), p[..., :-1]], -1)
        p = shifted - roots[..., i : i + 1] * p
    return p


def ccf(alpha: torch.Tensor, beta: torch.Tensor):
    """The controllable canonical realization (eq. 20) of W(z) = (β_0 + ... + β_{n-1} z^{n-1}) /
    (α_0 + ... + α_{n-1} z^{n-1} + z^n): returns (A, B, C) with A = companion(α), B = e_n, C = β."""
    N = alpha.shape[-1]
    B = torch.zeros_like(alpha)
    B[..., N - 1] = 1.0
    return companion_matrix(alpha), B, beta


def strictly_causal(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D):
    """Eq. (21)-(24): x_t = A x_{t-1} + B u_t, y_t = C x_t + D u_t rewritten with the state
    x̂_t = x_{t-1}, which has not seen u_t: x̂_{t+1} = A x̂_t + B u_t, y_t = (C A) x̂_t + (C B + D) u_t
    (C and B enter the feed-through only as the product CB). A [..., N, N], B, C [..., N]."""
    C_hat = (C.unsqueeze(-2) @ A).squeeze(-2)
    D_hat = (C * B).sum(-1) + D
    return A, B, C_hat, D_hat


def diagonal_to_ccf(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d=0.0):
    """The companion form of a diagonal LTI system x_t = diag(a) x_{t-1} + b u_t, y_t = c·x_t + d u_t
    (App. C.3, "Representing Mamba"): α from Π_i (z - a_i), β from the strictly causal part
    Σ_i ĉ_i b_i Π_{j≠i} (z - a_j) with ĉ = c ⊙ a, D̂ = c·b + d. a, b, c [..., N].
    Returns (A, B, C, D) for :func:`run_strict`: the same input-output map."""
    N = a.shape[-1]
    _, _, c_hat, d_hat = strictly_causal(torch.diag_embed(a), b, c, d)
    alpha = poly_from_roots(a)[..., :N]
    beta = torch.zeros_like(a)
    for i in range(N):  # Σ_i ĉ_i b_i Π_{j≠i} (z - a_j): a loop over the N poles
        others = torch.cat([a[..., :i], a[..., i + 1 :]], -1)
        beta = beta + (c_hat[..., i] * b[..., i]).unsqueeze(-1) * poly_from_roots(others)
    A, B, C = ccf(alpha, beta)
    return A, B, C, d_hat


def _channels(A, B, u):
    """Per-channel single-input systems as one batch: (inputs [B·H, T, N], A [B·H, T, N, N], u [B·H, T])."""
    Bt, T, H = u.shape
    N = A.shape[-1]
    u64 = u.to(torch.float64).transpose(1, 2).reshape(Bt * H, T)
    inp = u64.unsqueeze(-1) * B.to(torch.float64).repeat(Bt, 1).unsqueeze(1)
    A64 = A.to(torch.float64).repeat(Bt, 1, 1).unsqueeze(1).expand(Bt * H, T, N, N)
    return inp, A64, u64


def _feedthrough(D, Bt: int, H: int) -> torch.Tensor:
    """D (a scalar or [H]) as a column [B·H, 1] or a scalar tensor."""
    D = torch.as_tensor(D, dtype=torch.float64)
    return D.reshape(-1).repeat(Bt).unsqueeze(-1) if D.numel() == H and D.dim() else D


def run_system(A, B, C, D, u):
    """x_t = A x_{t-1} + B u_t, y_t = C x_t + D u_t (state includes u_t). A [H, N, N], B, C [H, N],
    D [H] or a scalar; u [batch, T, H] (one single-input system per channel). Returns y [batch, T, H]."""
    Bt, T, H = u.shape
    inp, A64, u64 = _channels(A, B, u)
    x = ltv_scan(A64, inp)
    y = (x * C.to(torch.float64).repeat(Bt, 1).unsqueeze(1)).sum(-1) + _feedthrough(D, Bt, H) * u64
    return y.view(Bt, H, T).transpose(1, 2)


def run_strict(A, B, C, D, u):
    """Eq. (20)'s convention: X_{t+1} = A X_t + B u_t, y_t = C X_t + D u_t, X_0 = 0. Shapes as
    :func:`run_system`. (The scan's state s_t = X_{t+1}; y_t reads s_{t-1}.)"""
    Bt, T, H = u.shape
    inp, A64, u64 = _channels(A, B, u)
    s = ltv_scan(A64, inp)
    X = torch.cat([torch.zeros_like(s[:, :1]), s[:, :-1]], 1)
    y = (X * C.to(torch.float64).repeat(Bt, 1).unsqueeze(1)).sum(-1) + _feedthrough(D, Bt, H) * u64
    return y.view(Bt, H, T).transpose(1, 2)
