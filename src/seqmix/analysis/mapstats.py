"""Numbers about a token-mixing map Φ and a transition spectrum Λ (docs/show.md).

Maps are tensors [..., T, T] (the leading dimensions are maps: heads or channels); every
function returns one value per map ([...]) so that callers can average or list them.
Everything is computed in float64.

    map_distance(phi, ref)        Frobenius distance ||Φ - P||_F (and relative to ||P||_F) and the
                                  row-wise KL(P_t || Φ̂_t) to a reference map P (softmax attention)
    row_profile(phi)              Φ̂: |Φ| normalized per row over s <= t (a map read as attention weights)
    effective_rank(phi)           exp(entropy of the normalized singular values) (Roy & Vetterli 2007)
    band_mass(phi, w)             fraction of Σ|Φ| on the band 0 <= t - s < w
    lag_quantile(phi, q)          per row, the smallest lag L with q of the row's |Φ| mass at t - s < L; mean over rows
    decay_summary(lam)            the spectrum |Λ_i| [T, N]: distinct values per step, distinct trajectories,
                                  trajectories up to scale (Λ's input-dependent parameters), memory lengths
    dense_map_bytes / check_seq_len   the memory of a dense map, and the error when it is too large
"""

from __future__ import annotations

import math

import torch

from .._checks import check_positive_int, check_tensor, fmt_shape

__all__ = [
    "row_profile", "map_distance", "effective_rank", "band_mass", "lag_quantile", "memory_lengths",
    "count_distinct", "decay_summary", "dense_map_bytes", "check_seq_len", "DEFAULT_MAX_MAP_BYTES",
]

#: the largest dense map (all maps of one mixer, float32) `seqmix show` builds by default
DEFAULT_MAX_MAP_BYTES = 2**30
#: distinctness tolerance of Λ values (the DSF holds float32 computations in float64)
DISTINCT_TOL = 1e-6


def _square(name: str, phi, where: str) -> torch.Tensor:
    check_tensor(name, phi, layout="[..., T, T]", where=where)
    if phi.dim() < 2 or phi.shape[-1] != phi.shape[-2]:
        raise ValueError(f"{where}: argument '{name}' must be square maps [..., T, T], got {fmt_shape(phi.shape)}")
    return phi.detach().to(torch.float64)


def _causal(T: int, device=None) -> torch.Tensor:
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


# ------------------------------------------------------------------------------------------
# distance to a reference map
# ------------------------------------------------------------------------------------------


def row_profile(phi: torch.Tensor, *, eps: float = 1e-12) -> torch.Tensor:
    """Φ̂[t, s] = (|Φ[t, s]| + eps) / Σ_{s'<=t} (|Φ[t, s']| + eps) for s <= t, 0 above the diagonal:
    each row of the map read as a distribution over the past (the eps keeps it strictly
    positive on s <= t, so that a KL to it is finite). [..., T, T] float64."""
    phi = _square("phi", phi, "row_profile")
    mask = _causal(phi.shape[-1], phi.device)
    a = torch.where(mask, phi.abs() + eps, torch.zeros((), dtype=phi.dtype))
    return a / a.sum(-1, keepdim=True)


def map_distance(phi: torch.Tensor, ref: torch.Tensor, *, eps: float = 1e-12) -> dict[str, torch.Tensor]:
    """Distances of maps Φ [..., T, T] to a reference P [T, T] (or broadcastable):

        frobenius      ||Φ - P||_F
        frobenius_rel  ||Φ - P||_F / ||P||_F
        kl             (1/T) Σ_t KL(P̂_t || Φ̂_t), P̂ and Φ̂ the row profiles (:func:`row_profile`):
                       how well Φ's rows, read as attention weights, match P's (0 iff equal profiles)

    Each [...] (one value per map)."""
    phi = _square("phi", phi, "map_distance")
    ref = _square("ref", ref, "map_distance")
    if ref.shape[-1] != phi.shape[-1]:
        raise ValueError(f"map_distance: argument 'ref' must be [T, T] with T = {phi.shape[-1]}, got {fmt_shape(ref.shape)}")
    fro = torch.linalg.matrix_norm(phi - ref)
    ref_norm = torch.linalg.matrix_norm(ref)
    p, q = row_profile(ref, eps=eps), row_profile(phi, eps=eps)
    # 0·log 0 = 0 above the diagonal (both are 0 there)
    terms = torch.where(p > 0, p * (p.log() - q.clamp_min(1e-300).log()), torch.zeros((), dtype=p.dtype))
    kl = terms.sum(-1).mean(-1)
    return {"frobenius": fro, "frobenius_rel": fro / ref_norm.clamp_min(1e-300), "kl": kl.expand_as(fro)}


# ------------------------------------------------------------------------------------------
# structure of a map
# ------------------------------------------------------------------------------------------


def effective_rank(phi: torch.Tensor) -> torch.Tensor:
    """exp(H(p)) with p = σ / Σσ the normalized singular values (Roy & Vetterli's effective rank):
    T for any map with T equal singular values (a diagonal map with |entries| all equal, an
    orthogonal map), 1 for a rank-one map, 0 for the zero map. [...]"""
    phi = _square("phi", phi, "effective_rank")
    s = torch.linalg.svdvals(phi)
    total = s.sum(-1, keepdim=True)
    p = s / total.clamp_min(1e-300)
    H = -torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros((), dtype=p.dtype)).sum(-1)
    return torch.where(total[..., 0] > 0, H.exp(), torch.zeros((), dtype=H.dtype))


def band_mass(phi: torch.Tensor, width: int) -> torch.Tensor:
    """Σ_{0 <= t-s < width} |Φ[t, s]| / Σ_{t, s} |Φ[t, s]|: the fraction of the map's mass within
    ``width`` tokens of the diagonal (1 for a window-``width`` attention; the zero map gives 0). [...]"""
    phi = _square("phi", phi, "band_mass")
    check_positive_int("width", width, "band_mass")
    T = phi.shape[-1]
    lag = torch.arange(T).view(T, 1) - torch.arange(T).view(1, T)
    band = (lag >= 0) & (lag < width)
    a = phi.abs()
    total = a.sum((-1, -2))
    inside = torch.where(band, a, torch.zeros((), dtype=a.dtype)).sum((-1, -2))
    return torch.where(total > 0, inside / total.clamp_min(1e-300), torch.zeros((), dtype=a.dtype))


def lag_quantile(phi: torch.Tensor, q: float = 0.9) -> torch.Tensor:
    """Per row t, the smallest L with Σ_{0 <= t-s < L} |Φ[t, s]| >= q·Σ_{s <= t} |Φ[t, s]|; the
    mean over the rows with mass: how far back a map looks (1 for a diagonal map). [...]"""
    phi = _square("phi", phi, "lag_quantile")
    if not 0 < q <= 1:
        raise ValueError(f"lag_quantile: argument 'q' must lie in (0, 1], got {q}")
    T = phi.shape[-1]
    a = torch.where(_causal(T, phi.device), phi.abs(), torch.zeros((), dtype=phi.dtype))
    # row t reversed: lag 0 first (entry s = t), then lag 1, ...
    idx = (torch.arange(T).view(T, 1) - torch.arange(T).view(1, T)).clamp(min=0)  # [t, lag] -> s = t - lag
    by_lag = torch.gather(a, -1, idx.expand(*a.shape[:-2], T, T))
    by_lag = torch.where(torch.arange(T).view(1, T) <= torch.arange(T).view(T, 1), by_lag, torch.zeros((), dtype=a.dtype))
    cum = by_lag.cumsum(-1)
    total = cum[..., -1:]
    L = (cum < q * total * (1 - 1e-12)).sum(-1) + 1  # [..., T]
    has = total[..., 0] > 0
    Lf = torch.where(has, L.to(torch.float64), torch.zeros((), dtype=torch.float64))
    return Lf.sum(-1) / has.sum(-1).clamp_min(1)


# ------------------------------------------------------------------------------------------
# the transition spectrum
# ------------------------------------------------------------------------------------------


def _as_points(lam: torch.Tensor) -> torch.Tensor:
    """[T, N] real or complex -> [T·c, N] real coordinates (c = 2 for complex)."""
    lam = lam.detach()
    if lam.is_complex():
        lam = torch.cat([lam.real, lam.imag], 0)
    return lam.to(torch.float64)


def count_distinct(points: torch.Tensor, *, tol: float = DISTINCT_TOL) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct columns of points [..., M, N], per leading index: two columns are the same when
    they differ by at most tol·max(1, max|points|) in every coordinate. Returns (counts [...],
    new [..., N]: True at the first column of each group, in the order ``order`` [..., N]),
    as a pair (counts, order[new]) when points is 2-d.

    The columns are ordered by a fixed random projection, then neighbours are compared: near-equal
    columns have near-equal projections and end up adjacent (a different column would need a
    projection within tol of theirs)."""
    M, N = points.shape[-2:]
    if N == 0:
        z = torch.zeros(points.shape[:-2], dtype=torch.long)
        return (z, torch.zeros(0, dtype=torch.long)) if points.dim() == 2 else (z, torch.zeros(*points.shape[:-2], 0, dtype=torch.bool))
    r = torch.randn(M, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    order = torch.einsum("m,...mn->...n", r, points).argsort(-1)  # [..., N]
    s = torch.gather(points, -1, order.unsqueeze(-2).expand(points.shape))
    atol = tol * max(1.0, float(points.abs().max()))
    new = torch.ones(order.shape, dtype=torch.bool)
    new[..., 1:] = (s[..., 1:] - s[..., :-1]).abs().amax(-2) > atol
    counts = new.sum(-1)
    if points.dim() == 2:
        return counts, order[new]
    return counts, new


def memory_lengths(lam: torch.Tensor) -> torch.Tensor:
    """Per state dimension n, the e-folding time of the average decay, τ_n = -1 / mean_i log|Λ_i,n|
    (steps until a stored value has shrunk by e on average; inf when |Λ| does not shrink it).
    lam [T, N] -> [N] float64."""
    logmag = lam.detach().abs().to(torch.float64).clamp_min(1e-300).log().mean(0)
    return torch.where(logmag < 0, -1 / logmag.clamp(max=-1e-300), torch.full_like(logmag, math.inf))


def decay_summary(lam: torch.Tensor, *, tol: float = DISTINCT_TOL) -> dict:
    """Facts about a transition spectrum lam [T, N] (the diagonal of Λ_i over time, one sequence):

        N                 state size of the DSF
        distinct_values   max over i of the number of distinct values of Λ_i (1 for attention,
                          heads for multi-head attention; d·n for S6 with a different A per state)
        trajectories      distinct columns i -> Λ_i,n (state dimensions that evolve differently)
        parameters        distinct columns of log|Λ| up to a positive factor: the number of
                          input-dependent parameters of Λ_i (1 attention, heads, d for S6:
                          log Λ = -Δ_i^c A^c_n is Δ^c scaled); 0 when Λ does not change over time
        time_varying      whether Λ_i changes with i
        memory            median over n of :func:`memory_lengths` (steps; inf: no forgetting)
        order             the indices of distinct trajectories sorted by memory length (for plots)
    """
    check_tensor("lam", lam, rank=2, layout="[T, N]", complex_ok=True, where="decay_summary")
    T, N = lam.shape
    pts = _as_points(lam)
    # distinct values per step: per i, the N values as points of R^1 (or R^2 for complex)
    c = pts.shape[0] // T
    per_step = pts.view(c, T, N).permute(1, 0, 2)  # [T, c, N]
    distinct_values = int(count_distinct(per_step, tol=tol)[0].max()) if T else 0
    n_traj, reps = count_distinct(pts, tol=tol)
    n_traj = int(n_traj)
    logmag = lam.detach().abs().to(torch.float64).clamp_min(1e-300).log()  # [T, N]
    time_varying = bool((logmag - logmag[:1]).abs().max() > tol * max(1.0, float(logmag.abs().max()))) if T > 1 else False
    if time_varying:
        norms = torch.linalg.vector_norm(logmag, dim=0, keepdim=True)
        directions = torch.where(norms > 0, logmag / norms.clamp_min(1e-300), torch.zeros((), dtype=logmag.dtype))
        n_params = int(count_distinct(directions, tol=max(tol, 1e-5))[0])
    else:
        n_params = 0
    tau = memory_lengths(lam)
    order = reps[tau[reps].argsort()]
    return {
        "N": N,
        "distinct_values": distinct_values,
        "trajectories": n_traj,
        "parameters": n_params,
        "time_varying": time_varying,
        "memory": float(tau.median()) if N else math.nan,
        "order": order,
    }


# ------------------------------------------------------------------------------------------
# dense maps: memory
# ------------------------------------------------------------------------------------------


def dense_map_bytes(maps: int, T: int, *, bytes_per_entry: int = 4) -> int:
    """Bytes of ``maps`` dense T×T maps (float32 by default)."""
    return int(maps) * int(T) * int(T) * int(bytes_per_entry)


def _fmt_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def check_seq_len(T: int, maps: int, *, max_bytes: int = DEFAULT_MAX_MAP_BYTES, what: str = "the mixer", name: str = "seq_len") -> None:
    """Raises a ValueError naming ``name`` when ``maps`` dense T×T float32 maps need more than
    ``max_bytes``: how much they would take and the largest T that fits."""
    need = dense_map_bytes(maps, T)
    if need > max_bytes:
        fit = int(math.isqrt(max(1, max_bytes // (4 * max(1, maps)))))
        raise ValueError(
            f"argument '{name}' = {T} is too large for dense maps: {what} has {maps} map(s) of {T}×{T}, "
            f"which take {_fmt_bytes(need)} in float32 (limit {_fmt_bytes(max_bytes)}); use {name} <= {fit}"
        )
