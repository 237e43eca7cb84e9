"""Wall attention: softmax attention whose logits decay per channel (fla's ``wall_attn``).

With per-channel log-decays g_t <= 0 and their prefix sums G_t = Σ_{r<=t} g_r, the logit of the pair (t, s) is
the gated-linear-attention score of the two tokens, and the weights are its softmax:

    l_ts = Σ_n q_tn k_sn exp(G_tn − G_sn)   (+ c_t − c_s with a per-head scalar gate, FoX-style)
    Φ[t, s] = softmax_{s<=t}(l_ts)

so a channel whose decay is strong sees only recent keys, inside one softmax (the scale in q). Φ is linear in
v; no finite-state DSF (the softmax couples every past key). An optional window limits the keys to the last
``window``. Shapes: q, G_q [B, Tq, H, K]; k, G_k [B, Tk, H, K] (the cumulative log-decays at the queries' and
the keys' positions); c_q [B, Tq, H], c_k [B, Tk, H] or None; queries at positions start .. start + Tq − 1,
Tk = start + Tq. The reference materializes [B, H, Tq, Tk, K] (memory O(T²K)); float32 or wider.
"""

from __future__ import annotations

import torch

from .._checks import check_shape, check_tensor
from .precision import full_precision, upcast

_WHERE = "wall_attention"


def _check(q, k, G_q, G_k, c_q, c_k, v, window, start, where):
    check_tensor("q", q, rank=4, layout="[B, Tq, H, K]", where=where)
    B, Tq, H, K = q.shape
    Tk = start + Tq
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    check_shape("k", k, (B, Tk, H, K), "[B, Tk = start + Tq, H, K]", where)
    check_tensor("G_q", G_q, rank=4, layout="[B, Tq, H, K]", where=where)
    check_shape("G_q", G_q, (B, Tq, H, K), "[B, Tq, H, K]", where)
    check_tensor("G_k", G_k, rank=4, layout="[B, Tk, H, K]", where=where)
    check_shape("G_k", G_k, (B, Tk, H, K), "[B, Tk, H, K]", where)
    if (c_q is None) != (c_k is None):
        raise ValueError(f"{where}: arguments 'c_q' and 'c_k' must both be given (the scalar gate) or both be None")
    if c_q is not None:
        check_shape("c_q", c_q, (B, Tq, H), "[B, Tq, H]", where)
        check_shape("c_k", c_k, (B, Tk, H), "[B, Tk, H]", where)
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, Tk, H, V]", where=where)
        check_shape("v", v, (B, Tk, H, None), "[B, Tk, H, V]", where)
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"{where}: argument 'window' must be None or an integer >= 1, got {window!r}")


@full_precision
def wall_probs(q, k, G_q, G_k, c_q=None, c_k=None, *, window: int | None = None, start: int = 0) -> torch.Tensor:
    """Wall attention's map Φ [B, H, Tq, Tk] (module docstring), float32 or wider."""
    _check(q, k, G_q, G_k, c_q, c_k, None, window, start, "wall_probs")
    Tq, Tk = q.shape[1], k.shape[1]
    dt = torch.promote_types(upcast(q).dtype, upcast(k).dtype)
    qpos = torch.arange(start, start + Tq, device=q.device).view(Tq, 1)
    kpos = torch.arange(Tk, device=q.device).view(1, Tk)
    mask = kpos <= qpos
    if window is not None:
        mask = mask & (qpos - kpos < window)
    diff = G_q.to(dt).unsqueeze(2) - G_k.to(dt).unsqueeze(1)  # [B, Tq, Tk, H, K]
    diff = diff.masked_fill(~mask.view(1, Tq, Tk, 1, 1), float("-inf"))  # exp only where s <= t (no overflow)
    logits = torch.einsum("bthk,bshk,btshk->bhts", q.to(dt), k.to(dt), diff.exp())
    if c_q is not None:
        logits = logits + (c_q.to(dt).transpose(1, 2).unsqueeze(-1) - c_k.to(dt).transpose(1, 2).unsqueeze(-2))
    low = torch.finfo(dt).min
    return torch.softmax(logits.masked_fill(~mask, low), -1) * mask.to(dt)


@full_precision
def wall_attention(q, k, v, G_q, G_k, c_q=None, c_k=None, *, window: int | None = None, start: int = 0) -> torch.Tensor:
    """o [B, Tq, H, V] = Φ v, in v's dtype."""
    _check(q, k, G_q, G_k, c_q, c_k, v, window, start, _WHERE)
    P = wall_probs(q, k, G_q, G_k, c_q, c_k, window=window, start=start)
    return torch.einsum("bhts,bshv->bthv", P, v.to(P.dtype)).to(v.dtype)


__all__ = ["wall_attention", "wall_probs"]
