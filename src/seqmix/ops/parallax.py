"""Parallax: softmax attention with a first-order, data-dependent correction of its weights (fla's ``parallax``,
Algorithm 1 of its paper, "parameterized local linear attention").

With a = softmax(q·k) over the visible keys (the scale in q) and s2 = r·k for a second query r (unscaled):

    Φ[t, s] = a_{ts} (1 + Σ_j a_{tj} s2_{tj} − s2_{ts})

i.e. the softmax weights times one minus the centred second score: r moves weight from the keys that r
favours beyond the softmax average to the others (the rows still sum to 1). fla writes the same output as
O1/d1 (1 + d2/d1) − O2/d1 with O1 = Σ p1 v, O2 = Σ p1 s2 v. Φ is linear in v; no finite-state DSF. An
optional sliding window restricts the visible keys to the last ``window`` ones. Shapes: q, r [B, Tq, H, K],
k [B, Tk, H, K], v [B, Tk, H, V] (one key head per query head), queries at positions start .. start + Tq − 1,
Tk = start + Tq. Computed in float32 or wider.
"""

from __future__ import annotations

import torch

from .._checks import check_shape, check_tensor
from .precision import full_precision, upcast

_WHERE = "parallax"


def _check(q, r, k, v, window, start, where):
    check_tensor("q", q, rank=4, layout="[B, Tq, H, K]", where=where)
    B, Tq, H, K = q.shape
    check_tensor("r", r, rank=4, layout="[B, Tq, H, K]", where=where)
    check_shape("r", r, (B, Tq, H, K), "[B, Tq, H, K]", where)
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    check_shape("k", k, (B, start + Tq, H, K), "[B, Tk = start + Tq, H, K]", where)
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, Tk, H, V]", where=where)
        check_shape("v", v, (B, start + Tq, H, None), "[B, Tk, H, V]", where)
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"{where}: argument 'window' must be None or an integer >= 1, got {window!r}")


@full_precision
def parallax_probs(q, r, k, *, window: int | None = None, start: int = 0) -> torch.Tensor:
    """Parallax's map Φ [B, H, Tq, Tk] (module docstring), float32 or wider."""
    _check(q, r, k, None, window, start, "parallax_probs")
    Tq, Tk = q.shape[1], k.shape[1]
    dt = torch.promote_types(upcast(q).dtype, upcast(k).dtype)
    q, r, k = q.to(dt), r.to(dt), k.to(dt)
    qpos = torch.arange(start, start + Tq, device=q.device).view(Tq, 1)
    kpos = torch.arange(Tk, device=q.device).view(1, Tk)
    mask = kpos <= qpos
    if window is not None:
        mask = mask & (qpos - kpos < window)
    a = torch.softmax(torch.einsum("bthk,bshk->bhts", q, k).masked_fill(~mask, torch.finfo(dt).min), -1) * mask.to(dt)
    s2 = torch.einsum("bthk,bshk->bhts", r, k)
    return a * (1 + (a * s2).sum(-1, keepdim=True) - s2)


@full_precision
def parallax_attention(q, r, k, v, *, window: int | None = None, start: int = 0) -> torch.Tensor:
    """o [B, Tq, H, V] = Φ v, in v's dtype."""
    _check(q, r, k, v, window, start, _WHERE)
    P = parallax_probs(q, r, k, window=window, start=start)
    return torch.einsum("bhts,bshv->bthv", P, v.to(P.dtype)).to(v.dtype)


__all__ = ["parallax_attention", "parallax_probs"]
