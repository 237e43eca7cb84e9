"""Feature maps φ, ψ of separable attention (DSF paper eq. 13), parameter-free.

    ζ(q_iᵀ k_j) = φ(q_i)ᵀ ψ(k_j) / η_i                                          (13)

Every map acts on the last dimension, x [..., K] -> [..., n]:

    identity   x                                   n = K      (generalized linear / normalized attention, eq. 17, 22)
    elu1       elu(x) + 1  (> 0)                   n = K      (linear attention, eq. 16)
    relu       max(x, 0)                           n = K
    exp        exp(x)      (> 0)                   n = K
    taylor     concat_{p=0..P} x^{⊗p} / sqrt(p!)   n = Σ_p K^p   (Lemma 1, Appendix C, eq. 25)
    square     x^{⊗2} in the symmetric basis       n = K(K+1)/2  (ReBased's quadratic kernel: φ(q)ᵀφ(k) = (qᵀk)²)

The Taylor features of degree P (Kronecker powers, the coefficients 1/sqrt(p!) of the
dsf note §3.5) satisfy exactly

    taylor(q)ᵀ taylor(k) = Σ_{p=0}^{P} (qᵀk)^p / p!   ->   exp(qᵀk)  as P -> ∞,

so separable attention with these features and η_i = φ(q_i)ᵀ Σ_{j<=i} φ(k_j) converges
to softmax attention (Lemma 1). The Kronecker power repeats every monomial (x_1 x_2 and
x_2 x_1); the monomial basis of the paper's eq. (24) holds the same kernel in
C(K+p-1, p) entries per degree, but needs multinomial coefficients; seqmix keeps the
Kronecker form (simpler, and the kernel is identical). The feature dimension grows
combinatorially, Σ_p K^p = (K^{P+1} - 1)/(K - 1): see :func:`taylor_feature_dim`.

``basis="symmetric"`` stores each monomial once, as the paper's eq. (24) and Based (Arora et
al. 2024) do: for every multiset α of p indices (i_1 <= ... <= i_p) the feature
x^α / sqrt(α!) with α! = Π_i α_i! (the count of each index), so that

    Σ_{|α| = p} x^α y^α / α! = (xᵀy)^p / p!          (the multinomial theorem)

and the kernel is the Kronecker form's exactly, in Σ_p C(K+p-1, p) features instead of Σ_p K^p
(1 + K + K(K+1)/2 at P = 2: Based's 153 features for K = 16, where the Kronecker form has 273).

For even P the truncated exponential Σ_{p<=P} s^p/p! is > 0 for every real s, so the
row-sum normalizer of Taylor attention is positive; for odd P it can be negative.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import check_choice, check_tensor

import itertools

FEATURE_MAPS = ("identity", "elu1", "relu", "exp", "taylor", "square")
#: how the Kronecker powers of the Taylor features are stored (module docstring)
TAYLOR_BASES = ("kronecker", "symmetric")
#: maps whose features are > 0 everywhere, so that φ(q)ᵀ Σ ψ(k) > 0 (a valid row-sum normalizer)
POSITIVE_FEATURE_MAPS = ("elu1", "exp")


def taylor_feature_dim(K: int, order: int, basis: str = "kronecker") -> int:
    """The width of :func:`taylor_features` for inputs of width K: Σ_{p=0}^{P} K^p (Kronecker basis)
    or Σ_{p=0}^{P} C(K+p-1, p) (symmetric basis)."""
    check_choice("basis", basis, TAYLOR_BASES, "taylor_feature_dim")
    if basis == "symmetric":
        return sum(math.comb(K + p - 1, p) for p in range(order + 1))
    return sum(K**p for p in range(order + 1))


def _monomials(x: torch.Tensor, p: int) -> torch.Tensor:
    """x^α / sqrt(α!) for every multiset α of p indices of x [..., K], in lexicographic order:
    [..., C(K+p-1, p)]."""
    K = x.shape[-1]
    combos = list(itertools.combinations_with_replacement(range(K), p))
    idx = torch.tensor(combos, dtype=torch.long, device=x.device)  # [M, p]
    coef = [1.0 / math.sqrt(math.prod(math.factorial(c.count(i)) for i in set(c))) for c in combos]
    out = x[..., idx].prod(-1)  # [..., M]
    return out * torch.tensor(coef, dtype=out.dtype, device=x.device)


def square_features(x: torch.Tensor) -> torch.Tensor:
    """x^{⊗2} in the symmetric basis, [..., K] -> [..., K(K+1)/2]: x_i² and sqrt(2)·x_i x_j (i < j), so
    that square_features(x)ᵀ square_features(y) = (xᵀy)² (ReBased's kernel)."""
    check_tensor("x", x, where="square_features")
    return _monomials(x, 2) * math.sqrt(2.0)


def taylor_features(x: torch.Tensor, order: int, basis: str = "kronecker") -> torch.Tensor:
    """concat_{p=0..P} x^{⊗p} / sqrt(p!) along the last dimension: [..., K] -> [..., Σ_p K^p]
    (``basis="kronecker"``), or the same kernel's symmetric basis (module docstring):
    [..., Σ_p C(K+p-1, p)].

    Block p holds the Kronecker power x^{⊗p} flattened row-major (x^{⊗0} = 1), or the monomials
    x^α / sqrt(α!) of degree p in lexicographic order."""
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"taylor_features: argument 'order' (taylor_order) must be an integer >= 0, got {order!r}")
    check_tensor("x", x, where="taylor_features")
    check_choice("basis", basis, TAYLOR_BASES, "taylor_features")
    if basis == "symmetric":
        return torch.cat([torch.ones_like(x[..., :1])] + [_monomials(x, p) for p in range(1, order + 1)], dim=-1)
    blocks = [torch.ones_like(x[..., :1])]
    power = blocks[0]
    for p in range(1, order + 1):
        power = (power.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2)  # x^{⊗p} = x^{⊗(p-1)} ⊗ x
        blocks.append(power / math.sqrt(math.factorial(p)))
    return torch.cat(blocks, dim=-1)


def feature_dim(name: str, K: int, order: int = 2, basis: str = "kronecker") -> int:
    """Width n of the features of ``name`` for inputs of width K."""
    check_choice("feature map", name, FEATURE_MAPS, "feature_dim")
    if name == "square":
        return K * (K + 1) // 2
    return taylor_feature_dim(K, order, basis) if name == "taylor" else K


def apply_feature_map(name: str, x: torch.Tensor, order: int = 2, basis: str = "kronecker") -> torch.Tensor:
    """φ(x) for the feature map ``name`` (one of FEATURE_MAPS); ``order`` is the Taylor degree P and
    ``basis`` how its powers are stored."""
    check_choice("feature map", name, FEATURE_MAPS, "apply_feature_map")
    if name == "square":
        return square_features(x)
    if name == "identity":
        return x
    if name == "elu1":
        return F.elu(x) + 1
    if name == "relu":
        return F.relu(x)
    if name == "exp":
        return x.exp()
    return taylor_features(x, order, basis)
