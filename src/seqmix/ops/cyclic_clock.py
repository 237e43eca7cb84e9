"""The cyclic clock of Cyclic Flow Attention (CyFA): slots that index relative time.

CyFA (flash-linear-attention's CyclicFlowAttention layer, ``fla.ops.cyfa``; "CyFA: Linear Sequence
Modeling with Relative-Time-Partitioned Memory") keeps GSA's two slot memories, but its m slots (m even)
are the Fourier coordinates of a circle of P = m − 1 relative-time positions. A learned clock
λ_t = λ_{t−1} + δ_t (δ_t ∈ (0, 1)) sets where a token is written: the write weights are the atom

    a(λ)_{2j} = c_j cos(ω_j λ),   a(λ)_{2j+1} = −c_j sin(ω_j λ),   ω_j = 2π j / P,
    c_0 = P^{-1/2},  c_j = (2/P)^{1/2} (j >= 1)                                        (j = 0 .. m/2 − 1)

(slot 1, the sine of frequency 0, is never written: m − 1 = P active coordinates). A readout z ∈ R^m of
the key memory, Σ_s decay · (q_t·k_s) a(λ_s), rotated by +λ_t in each frequency pair holds
cos(ω_j (λ_t − λ_s)) and sin(ω_j (λ_t − λ_s)): a function of the relative clock time alone. A fixed
Fourier basis F [P, m] (row r: the atom's cosines and sines at the integer time r, column 1 zero) times
a learned table R [H, P, P] turns it into logits over the P relative times, a softmax picks the times,
and the same table, the transposed basis and the rotation by −λ_t bring the choice back to slot
coordinates:

    p_t = rot(−λ_t) Tᵀ softmax(T rot(λ_t) z_t),     T = R F  [H, P, m]

Phases are reduced in integer clock units before the conversion to radians (ω_j λ mod 2π computed as
2π/P · ((j·⌊λ⌋ mod P) + j·frac(λ)) mod P), so a clock in the thousands loses no phase precision.
Everything here is per token (no loop over time); shapes: λ [B, T, H]; z [B, T, H, m]; R [H, P, P].
"""

from __future__ import annotations

import math

import torch

from .._checks import check_tensor
from .precision import upcast


def _check_slots(m: int, where: str) -> None:
    if m < 4 or m % 2:
        raise ValueError(f"{where}: the number of slots m must be an even integer >= 4, got {m}")


def clock_phases(lam: torch.Tensor, m: int) -> torch.Tensor:
    """The phases ω_{j(i)} λ mod 2π of every slot i (j(i) = i // 2), [..., m] from λ [...]; float32 or wider."""
    _check_slots(m, "clock_phases")
    lam = upcast(lam)
    P = m - 1
    j = (torch.arange(m, device=lam.device) // 2).to(lam.dtype)
    whole = torch.floor(lam).unsqueeze(-1)
    frac = lam.unsqueeze(-1) - whole  # the gradient of the phase w.r.t. λ flows through here: ω_j
    units = torch.remainder(torch.remainder(whole, P) * j, P) + frac * j  # j λ mod P, in clock units
    return units * (2 * math.pi / P)


def clock_atom(lam: torch.Tensor, m: int) -> torch.Tensor:
    """The write weights a(λ) [..., m] (module docstring) from λ [...]."""
    ph = clock_phases(lam, m)
    j = torch.arange(m, device=ph.device) // 2
    c = ((1 + (j > 0).to(ph.dtype)) / (m - 1)).sqrt()  # P^{-1/2}, then (2/P)^{1/2}; in λ's dtype (float64 stays float64)
    even = torch.arange(m, device=ph.device) % 2 == 0
    return c * torch.where(even, torch.cos(ph), -torch.sin(ph))


def _rotate(x: torch.Tensor, ph: torch.Tensor, sign: float) -> torch.Tensor:
    """Each pair (x_{2j}, x_{2j+1}) rotated by sign·phase_j: x [..., m], ph [..., m] (equal within a pair)."""
    c, s = torch.cos(ph), sign * torch.sin(ph)
    xc, xs = x[..., 0::2], x[..., 1::2]
    cc, sc = c[..., 0::2], s[..., 0::2]
    return torch.stack([cc * xc - sc * xs, sc * xc + cc * xs], -1).flatten(-2)


def readout_basis(m: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """F [P, m], P = m − 1: row r holds the atom's cosines and sines at the integer clock time r
    (column 0 scaled by P^{-1/2}, column 1 zero, the others by (2/P)^{1/2})."""
    _check_slots(m, "readout_basis")
    P = m - 1
    r = torch.arange(P, device=device, dtype=torch.float64).unsqueeze(-1)
    i = torch.arange(m, device=device)
    w = (i // 2).to(torch.float64) * (2 * math.pi / P)
    F_ = torch.where(i % 2 == 1, torch.sin(r * w), torch.cos(r * w))
    scale = torch.full((m,), (2.0 / P) ** 0.5, dtype=torch.float64, device=device)
    scale[0], scale[1] = P ** -0.5, 0.0
    return (F_ * scale).to(dtype)


def cyclic_readout(z: torch.Tensor, lam: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """p [B, T, H, m] = rot(−λ) Rᵀ softmax(R F rot(λ) z) from the key memory's readout z [B, T, H, m], the
    clock λ [B, T, H] and the learned table R [H, P, P] (module docstring); float32 or wider."""
    check_tensor("z", z, rank=4, layout="[B, T, H, m]", where="cyclic_readout")
    m = z.shape[-1]
    _check_slots(m, "cyclic_readout")
    if tuple(lam.shape) != tuple(z.shape[:-1]):
        raise ValueError(f"cyclic_readout: argument 'lam' must have shape {tuple(z.shape[:-1])} ([B, T, H]), got {tuple(lam.shape)}")
    if tuple(table.shape) != (z.shape[2], m - 1, m - 1):
        raise ValueError(f"cyclic_readout: argument 'table' must have shape {(z.shape[2], m - 1, m - 1)} ([H, m−1, m−1]), got {tuple(table.shape)}")
    z = upcast(z)
    ph = clock_phases(lam, m).to(z.dtype)
    T = upcast(table).to(z.dtype) @ readout_basis(m, dtype=z.dtype, device=z.device)  # [H, P, m]
    logits = torch.einsum("hrm,bthm->bthr", T, _rotate(z, ph, 1.0))
    c = torch.einsum("hrm,bthr->bthm", T, torch.softmax(logits, dim=-1))
    return _rotate(c, ph, -1.0)


__all__ = ["clock_atom", "clock_phases", "cyclic_readout", "readout_basis"]
