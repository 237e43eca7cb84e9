"""MoBA: mixture of block attention (Lu et al. 2025, "MoBA: Mixture of Block Attention for Long-Context LLMs").

Softmax attention in which each query reads only a few blocks of keys. The keys are cut into blocks of
``block_size`` positions; block i is summarized by the mean of its keys k̄_i, and query t (in block
j = t // block_size) scores every block that ended before its own, g_{t,i} = q_t · k̄_i (i < j), keeps the
top_k − 1 best (all of them when fewer are complete) and always reads its own block causally:

    S(t) = {s <= t : s // C = j}  ∪  {s : s // C ∈ top_{k−1}(g_{t,·})}
    Φ[t, s] = exp(q_t·k_s) / Σ_{s' ∈ S(t)} exp(q_t·k_{s'})   for s ∈ S(t), else 0

so Φ is softmax attention's map restricted to a data-dependent block-sparse support (the scale, if any,
is in q). Its map is the model: MoBA has no finite-state DSF (the support moves with the query), and a
decoding step keeps every past key and value (the selection may pick any complete block).

``moba_mask`` gives the support [B, H, Tq, Tk] for queries at positions start .. start + Tq − 1 against
keys at 0 .. Tk − 1 (Tk = start + Tq): prefill, a continuation and a decoding step are the same call.
The gate is computed in float32 or wider (a flip of the selection is not a rounding error). Shapes:
q [B, Tq, H, K], k [B, Tk, H, K], v [B, Tk, H, V]. Everything stays on the inputs' device.
"""

from __future__ import annotations

import torch

from .._checks import check_positive_int, check_shape, check_tensor
from .precision import full_precision, upcast

_WHERE = "moba"


def _check(q, k, v, block_size, topk, start, where):
    check_tensor("q", q, rank=4, layout="[B, Tq, H, K]", where=where)
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    B, Tq, H, K = q.shape
    check_shape("k", k, (B, None, H, K), "[B, Tk, H, K]", where)
    if k.shape[1] != start + Tq:
        raise ValueError(f"{where}: argument 'k' must hold the keys of positions 0 .. start + Tq − 1 = {start + Tq - 1}, "
                         f"got {k.shape[1]} keys (start = {start}, Tq = {Tq})")
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, Tk, H, V]", where=where)
        check_shape("v", v, (B, k.shape[1], H, None), "[B, Tk, H, V]", where)
    check_positive_int("block_size", block_size, where)
    check_positive_int("topk", topk, where)
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"{where}: argument 'start' must be an integer >= 0, got {start!r}")


@full_precision
def moba_mask(q: torch.Tensor, k: torch.Tensor, *, block_size: int, topk: int, start: int = 0) -> torch.Tensor:
    """The support of MoBA's map, bool [B, H, Tq, Tk] (module docstring)."""
    _check(q, k, None, block_size, topk, start, "moba_mask")
    B, Tq, H, K = q.shape
    Tk = k.shape[1]
    C = block_size
    nb = -(-Tk // C)
    dev = q.device
    qpos = torch.arange(start, start + Tq, device=dev)
    kpos = torch.arange(Tk, device=dev)
    own = (kpos.view(1, Tk) // C == qpos.view(Tq, 1) // C) & (kpos.view(1, Tk) <= qpos.view(Tq, 1))  # [Tq, Tk]
    if topk <= 1 or nb == 1:
        return own.view(1, 1, Tq, Tk).expand(B, H, Tq, Tk)
    kf = upcast(k)
    pad = nb * C - Tk
    kp = torch.cat([kf, kf.new_zeros(B, pad, H, K)], 1) if pad else kf
    counts = torch.clamp(torch.arange(nb, device=dev) * C, max=Tk)  # tokens before each block
    counts = (torch.clamp(counts + C, max=Tk) - counts).to(kf.dtype)  # tokens in each block
    kbar = kp.view(B, nb, C, H, K).sum(2) / counts.view(1, nb, 1, 1)  # [B, nb, H, K]
    gate = torch.einsum("bthk,bnhk->bhtn", upcast(q).to(kbar.dtype), kbar)  # [B, H, Tq, nb]
    eligible = torch.arange(nb, device=dev).view(1, nb) < (qpos // C).view(Tq, 1)  # blocks that ended before t's
    gate = gate.masked_fill(~eligible, float("-inf"))
    m = min(topk - 1, nb)
    idx = torch.topk(gate, m, dim=-1).indices  # [B, H, Tq, m]
    chosen = torch.zeros(B, H, Tq, nb, dtype=torch.bool, device=dev).scatter(-1, idx, True) & eligible
    picked = chosen.gather(-1, (kpos // C).view(1, 1, 1, Tk).expand(B, H, Tq, Tk))  # [B, H, Tq, Tk]
    return picked | own


@full_precision
def moba_probs(q, k, *, block_size: int, topk: int, start: int = 0) -> torch.Tensor:
    """MoBA's map Φ [B, H, Tq, Tk] (rows: softmax of q·k over the support), in float32 or wider."""
    mask = moba_mask(q, k, block_size=block_size, topk=topk, start=start)
    dt = torch.promote_types(upcast(q).dtype, upcast(k).dtype)
    scores = torch.einsum("bthk,bshk->bhts", q.to(dt), k.to(dt)).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)  # every row has its own key (s = t), so no row is empty


@full_precision
def moba_attention(q, k, v, *, block_size: int, topk: int, start: int = 0) -> torch.Tensor:
    """o [B, Tq, H, V] = Φ v with Φ = :func:`moba_probs` (computed in float32 or wider, returned in v's dtype)."""
    _check(q, k, v, block_size, topk, start, _WHERE)
    P = moba_probs(q, k, block_size=block_size, topk=topk, start=start)
    return torch.einsum("bhts,bshv->bthv", P, v.to(P.dtype)).to(v.dtype)


__all__ = ["moba_attention", "moba_mask", "moba_probs"]
