"""Theory checks of the DSF paper about S6 (seed 000, §4.2-4.3; dsf note §4.3-4.4), in float64.

1. The reversed sigmoid (DSF eq. 23, Appendix I): with A = a·I, S6's transition is

       exp(-a·softplus(x)) = (1 + eˣ)^(-a) = σ(-x)^a,

   so Λ_i = diag(σ_rev(W̄_Δ u_i)^a) ⊗ I_n: the qLSTM forget gate with a reversed sigmoid
   and a learnt exponent a. :func:`softplus_transition` and :func:`reversed_sigmoid_transition`
   are the two sides.

2. S6 versus generalized linear attention (DSF eq. 17 vs 19; the exact condition is the dsf
   note's §4.3 [D], the paper's ambiguity A24). With W_V = I, no D, keys k_i = b_i and
   queries q_i = c_i (φ = ψ = identity), the layers have the same map Φ for every input iff,
   for every channel c and j <= i,

       Δ_j^c · exp(-A^c Σ_(k=j+1..i) Δ_k^c) = 1/η_i        (elementwise over the n states),

   i.e. iff (a) A = a·I (one decay for all states and channels), (b) Δ_i^c = 1/η_i for every
   channel, and (c) η_i · exp(-a/η_i) = η_(i-1). :func:`equivalence_condition` checks (a)-(c),
   :func:`equivalence_normalizer` solves (c) for η given η_0, and :func:`s6_dsf` /
   :func:`linear_attention_dsf` build both systems (same channel-major state layout) so
   that their maps can be compared block by block.

Sign convention: the paper's A is positive, Λ = exp(-ΔA) (Mamba stores A_code = -exp(A_log)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..dsf import DSF

__all__ = [
    "softplus_transition", "reversed_sigmoid_transition", "s6_dsf", "linear_attention_dsf",
    "equivalence_normalizer", "equivalence_condition", "map_difference",
]


def softplus_transition(x: torch.Tensor, a) -> torch.Tensor:
    """exp(-a·softplus(x)): S6's transition with A = a·I and Δ = softplus(x) (DSF eq. 19, 31-32).

    softplus(x) = log(1 + eˣ) exactly (``logaddexp``): torch's F.softplus, which the mixers use as
    Mamba does, switches to x above x = 20 (an error of log(1 + e⁻ˣ) < 2e-9 there)."""
    return torch.exp(-a * torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device)))


def reversed_sigmoid_transition(x: torch.Tensor, a) -> torch.Tensor:
    """σ_rev(x)^a = σ(-x)^a, the right-hand side of DSF eq. (23) (computed as exp(a·logσ(-x)))."""
    return torch.exp(a * F.logsigmoid(-x))


def s6_dsf(b: torch.Tensor, c: torch.Tensor, delta: torch.Tensor, A: torch.Tensor) -> DSF:
    """S6 in DSF form, eq. (19) without D (dsf note §3.8), in the paper's sign convention.

    b, c [batch, T, n] (b_i = W_B u_i, c_i = W_C u_i); delta [batch, T, d] (Δ_i > 0);
    A [d, n] positive. Λ_i = exp(-(Δ_i ⊗ I_n) ⊙ A), B_i = Δ_i ⊗ b_i, C_i = I_d ⊗ c_iᵀ, with the
    channel-major state (channel c owns entries c·n .. c·n + n - 1). Input and output: [batch, T, d].
    """
    Bt, T, d = delta.shape
    n = b.shape[-1]
    q = c.unsqueeze(2).expand(Bt, T, d, n)
    k = delta.unsqueeze(-1) * b.unsqueeze(2)
    return DSF.from_recurrence(q, k, 1, gk=-delta.unsqueeze(-1) * A)


def linear_attention_dsf(q: torch.Tensor, k: torch.Tensor, eta: torch.Tensor, d: int) -> DSF:
    """Generalized linear attention (DSF eq. 15/17, corrected 15b) with W_V = I_d and one head.

    q, k [batch, T, n] (the features φ(q_i), ψ(k_i)); eta [batch, T] (> 0) the normalizer.
    Φ[i, j] = (q_iᵀ k_j / η_i) I_d; the state is channel-major like :func:`s6_dsf`'s.
    """
    return DSF.from_separable(q.unsqueeze(2), k.unsqueeze(2), eta.unsqueeze(-1), value_dim=d)


def equivalence_normalizer(a: float, eta0, T: int, *, iters: int = 200) -> torch.Tensor:
    """The normalizers η_0..η_(T-1) with η_i · exp(-a/η_i) = η_(i-1) (condition (c)), float64.

    g(η) = η e^(-a/η) is strictly increasing on (0, ∞) with g(η) < η and g(η + a) >= η, so
    η_i lies in [η_(i-1), η_(i-1) + a]; found by bisection. eta0: a float or a [batch] tensor.
    Returns [batch, T] (or [T] for a float eta0).
    """
    if a < 0:
        raise ValueError(f"equivalence_normalizer: argument 'a' (the shared decay rate) must be >= 0, got {a}")
    e = torch.as_tensor(eta0, dtype=torch.float64)
    if bool((e <= 0).any()):
        raise ValueError("equivalence_normalizer: argument 'eta0' must be > 0")
    etas = [e]
    for _ in range(T - 1):
        prev = etas[-1]
        lo, hi = prev.clone(), prev + a
        for _ in range(iters):
            mid = (lo + hi) / 2
            below = mid * torch.exp(-a / mid) < prev
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        etas.append((lo + hi) / 2)
    return torch.stack(etas, -1)


def equivalence_condition(A: torch.Tensor, delta: torch.Tensor, eta: torch.Tensor, *, atol: float = 1e-10) -> dict:
    """Checks the exact S6 ⇔ generalized-linear-attention condition (module docstring).

    A [d, n] (positive, paper convention); delta [batch, T, d]; eta [batch, T]. Returns
    {"scalar_A": bool, "shared_delta": bool, "normalizer_recursion": bool, "holds": bool,
    "residual": max_{c, j <= i} |Δ_j^c exp(-A^c Σ_(k=j+1..i) Δ_k^c) - 1/η_i|}.
    """
    A, delta, eta = (t.detach().to(torch.float64) for t in (A, delta, eta))
    scalar_A = bool((A - A.flatten()[0]).abs().max() <= atol)
    shared = bool((delta - 1 / eta.unsqueeze(-1)).abs().max() <= atol)
    a = A.flatten()[0]
    recursion = bool((eta[:, 1:] * torch.exp(-a / eta[:, 1:]) - eta[:, :-1]).abs().max() <= atol) if eta.shape[1] > 1 else True
    # the condition itself, over every (i, j <= i, channel, state)
    cums = torch.cumsum(delta, 1)  # Σ_(k<=i) Δ_k
    seg = cums.unsqueeze(2) - cums.unsqueeze(1)  # [batch, i, j, d] = Σ_(k=j+1..i) Δ_k
    lhs = delta.unsqueeze(1).unsqueeze(-1) * torch.exp(-A * seg.unsqueeze(-1))  # [batch, i, j, d, n]
    diff = (lhs - (1 / eta).view(*eta.shape, 1, 1, 1)).abs()
    T = delta.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, T, T, 1, 1)
    residual = float(torch.where(causal, diff, torch.zeros_like(diff)).max())
    return {
        "scalar_A": scalar_A,
        "shared_delta": shared,
        "normalizer_recursion": recursion,
        "holds": scalar_A and shared and recursion,
        "residual": residual,
    }


def map_difference(s6: DSF, attention: DSF) -> float:
    """max |Φ_S6 - Φ_attention| over every block (both systems from this module)."""
    return float((s6.blocks() - attention.blocks()).abs().max())
