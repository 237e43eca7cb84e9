"""Rotary position embedding (RoPE; Su et al. 2021, RoFormer, eq. 34) as a pure op.

Each query or key vector of a head is cut into pairs of channels; the pair j of a token at
absolute position p is rotated by the angle p·θ_j, θ_j = theta^(-2j/R):

    (a, b)  ->  (a cos pθ_j − b sin pθ_j,  a sin pθ_j + b cos pθ_j)        j = 0 .. R/2 − 1

so q_pᵀ k_s depends on p − s only. R = ``rotary_dim`` (even, ≤ the head width K); channels
R .. K − 1 pass unchanged (partial rotary: GPT-NeoX's rotary_pct, RecurrentGemma's
partial_rotary_factor = 0.5, Qwen3-Next's 0.25 — the rotated channels are the first R).

Which channels form a pair (``interleaved``):

* ``False`` (default; GPT-NeoX, Llama, Qwen, Gemma in transformers: ``rotate_half``): channel
  j pairs with channel j + R/2 (the rotated part is split in two halves);
* ``True`` (GPT-J, the RoFormer paper, Mesh-TensorFlow): channel 2j pairs with 2j + 1.

The two are the same rotation up to a fixed permutation of the channels, so a checkpoint
trained with one needs its q and k projection rows permuted to run with the other.

Angles are computed in float32 (float64 for float64 inputs), the rotation too; the result is
cast back to x's dtype. Shapes: x [B, T, H, K]; positions [T] or [B, T] (integers).

:func:`rotary_reference` is the obviously-correct loop over pairs that the tests tie
:func:`rotary` to.
"""

from __future__ import annotations

import torch

from .._checks import check_tensor

_WHERE = "rotary"


def _check(x, positions, rotary_dim, theta, where):
    check_tensor("x", x, rank=4, layout="[B, T, H, K]", where=where)
    K = x.shape[-1]
    R = K if rotary_dim is None else rotary_dim
    if isinstance(R, bool) or not isinstance(R, int) or R < 2 or R % 2 or R > K:
        raise ValueError(f"{where}: argument 'rotary_dim' must be an even integer in [2, K = {K}] (channels rotated in pairs), got {rotary_dim!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(f"{where}: argument 'theta' (the RoPE base) must be a number > 1, got {theta!r}")
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.dim() not in (1, 2) \
            or positions.shape[-1] != x.shape[1] or (positions.dim() == 2 and positions.shape[0] not in (1, x.shape[0])):
        got = f"{list(positions.shape)} {positions.dtype}" if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"{where}: argument 'positions' must be an integer tensor [T] or [B, T] with T = {x.shape[1]}, got {got}")
    return R


def rotary_angles(positions: torch.Tensor, rotary_dim: int, theta: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """p·θ_j: [..., R/2] for positions [...] (θ_j = theta^(-2j/R), j = 0 .. R/2 − 1)."""
    j = torch.arange(0, rotary_dim, 2, device=positions.device, dtype=dtype)
    inv_freq = 1.0 / (theta ** (j / rotary_dim))
    return positions.to(dtype).unsqueeze(-1) * inv_freq


def rotary(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    rotary_dim: int | None = None,
    theta: float = 10000.0,
    interleaved: bool = False,
) -> torch.Tensor:
    """Rotates the first ``rotary_dim`` channels of every head of x by its token's position.

    Args:
        x: [B, T, H, K] queries or keys.
        positions: [T] or [B, T] absolute positions (integers) of the T tokens.
        rotary_dim: R, even, ≤ K (default K: full rotary).
        theta: the base of the frequencies θ_j = theta^(-2j/R).
        interleaved: pairs (2j, 2j+1) (GPT-J) instead of (j, j + R/2) (GPT-NeoX / Llama).

    Returns:
        [B, T, H, K], x's dtype.
    """
    R = _check(x, positions, rotary_dim, theta, _WHERE)
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    ang = rotary_angles(positions, R, theta, dt)  # [T, R/2] or [B, T, R/2]
    if ang.dim() == 2:
        ang = ang.unsqueeze(0)
    cos, sin = ang.cos().unsqueeze(2), ang.sin().unsqueeze(2)  # [B|1, T, 1, R/2]
    xr = x[..., :R].to(dt)
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = xr[..., : R // 2], xr[..., R // 2 :]
        rot = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    rot = rot.to(x.dtype)
    return rot if R == x.shape[-1] else torch.cat((rot, x[..., R:]), dim=-1)


def rotary_reference(x, positions, *, rotary_dim=None, theta=10000.0, interleaved=False):
    """The reference: a loop over the R/2 channel pairs, each rotated as a complex number
    (a + ib)·e^{ipθ_j}, in float64."""
    R = _check(x, positions, rotary_dim, theta, "rotary_reference")
    pos = positions.to(torch.float64)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    out = x.to(torch.float64).clone()
    for j in range(R // 2):
        ia, ib = (2 * j, 2 * j + 1) if interleaved else (j, j + R // 2)
        theta_j = theta ** (-2.0 * j / R)
        z = torch.complex(out[..., ia], out[..., ib]) * torch.polar(torch.ones_like(pos), pos * theta_j).unsqueeze(-1)
        out[..., ia], out[..., ib] = z.real, z.imag
    return out.to(x.dtype)
