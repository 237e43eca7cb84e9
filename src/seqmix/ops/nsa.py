"""NSA: natively trainable sparse attention (Yuan et al. 2025, "Native Sparse Attention"), as its map.

Three softmax attentions over the same keys, mixed per query head by gates g ∈ (0, 1)³:

    Φ = g_cmp Φ_cmp + g_slc Φ_slc + g_swa Φ_swa

* compression: the keys and values of each block of C positions are mean-pooled (k̄_c, v̄_c); query t
  attends to the blocks that ended at or before it, (c + 1)C − 1 <= t, so Φ_cmp[t, s] = Σ_c P[t, c] / |c|
  over the block c that holds s (P the softmax of q_t·k̄_c over the visible blocks; a query before the end
  of the first block reads nothing there);
* selection: each block is scored by P averaged over the query heads that share a key head (GQA group);
  the first block, the query's own block and the one before it are always taken; the top n blocks
  (``block_count`` >= 3, so that the three forced ones always fit) are kept, and Φ_slc is softmax attention over their tokens s <= t;
* sliding window: Φ_swa is causal softmax attention over the last ``window`` tokens (0: no branch).

So NSA's Φ is softmax attention's map restricted to a data-chosen set of blocks, plus a coarse
(block-averaged) map and a local one. It has no finite-state DSF; decoding keeps every key and value.
Shapes: q [B, Tq, HQ, K] (the scale already in q), k [B, Tk, H, K], v [B, Tk, H, V], the gates
[B, Tq, HQ]; HQ a multiple of H; queries at positions start .. start + Tq − 1, Tk = start + Tq.
Computed in float32 or wider; no host reads.
"""

from __future__ import annotations

import torch

from .._checks import check_positive_int, check_shape, check_tensor
from .attention import repeat_kv
from .precision import full_precision, upcast

_WHERE = "nsa"


def _check(q, k, v, gates, block_size, block_count, window, start, where):
    check_tensor("q", q, rank=4, layout="[B, Tq, HQ, K]", where=where)
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    B, Tq, HQ, K = q.shape
    H = k.shape[2]
    check_shape("k", k, (B, None, H, K), "[B, Tk, H, K]", where)
    if H == 0 or HQ % H:
        raise ValueError(f"{where}: the query heads of 'q' ({HQ}) must be a multiple of the key heads of 'k' ({H})")
    if k.shape[1] != start + Tq:
        raise ValueError(f"{where}: argument 'k' must hold the keys of positions 0 .. start + Tq − 1, got {k.shape[1]} keys "
                         f"(start = {start}, Tq = {Tq})")
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, Tk, H, V]", where=where)
        check_shape("v", v, (B, k.shape[1], H, None), "[B, Tk, H, V]", where)
    for name, g in zip(("g_cmp", "g_slc", "g_swa"), gates):
        check_tensor(name, g, rank=3, layout="[B, Tq, HQ]", where=where)
        check_shape(name, g, (B, Tq, HQ), "[B, Tq, HQ]", where)
    check_positive_int("block_size", block_size, where)
    if not isinstance(block_count, int) or block_count < 3:
        raise ValueError(f"{where}: argument 'block_count' must be an integer >= 3 (the first, own and previous blocks are "
                         f"always selected), got {block_count!r}")
    if not isinstance(window, int) or window < 0:
        raise ValueError(f"{where}: argument 'window' must be an integer >= 0, got {window!r}")
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"{where}: argument 'start' must be an integer >= 0, got {start!r}")


def _masked_softmax(scores, mask):
    """Softmax over the last dimension where mask, 0 elsewhere and on rows without any entry (finite throughout)."""
    low = torch.finfo(scores.dtype).min
    P = torch.softmax(scores.masked_fill(~mask, low), dim=-1)
    return P * mask.to(P.dtype)


@full_precision
def nsa_probs(q, k, g_cmp, g_slc, g_swa, *, block_size: int, block_count: int, window: int, start: int = 0) -> torch.Tensor:
    """NSA's map Φ [B, HQ, Tq, Tk] (module docstring), float32 or wider."""
    _check(q, k, None, (g_cmp, g_slc, g_swa), block_size, block_count, window, start, "nsa_probs")
    B, Tq, HQ, K = q.shape
    Tk, H = k.shape[1], k.shape[2]
    G, C = HQ // H, block_size
    nb = -(-Tk // C)
    dev = q.device
    dt = torch.promote_types(upcast(q).dtype, upcast(k).dtype)
    q, k = q.to(dt), repeat_kv(k.to(dt), G)  # [B, Tk, HQ, K]
    qpos = torch.arange(start, start + Tq, device=dev).view(Tq, 1)
    kpos = torch.arange(Tk, device=dev).view(1, Tk)
    blk = torch.arange(nb, device=dev).view(1, nb)
    # compression: mean-pooled blocks, visible once complete
    pad = nb * C - Tk
    kp = torch.cat([k, k.new_zeros(B, pad, HQ, K)], 1) if pad else k
    first = torch.clamp(blk[0] * C, max=Tk)
    count = (torch.clamp(first + C, max=Tk) - first).to(dt)  # tokens per block
    kbar = kp.view(B, nb, C, HQ, K).sum(2) / count.view(1, nb, 1, 1)
    visible = (blk + 1) * C - 1 <= qpos  # [Tq, nb]
    Pc = _masked_softmax(torch.einsum("bthk,bnhk->bhtn", q, kbar), visible.expand(B, HQ, Tq, nb))
    member = (kpos // C == blk.view(nb, 1)).to(dt) / count.view(nb, 1)  # [nb, Tk]: block c's pooling weights
    Phi_cmp = Pc @ member  # [B, HQ, Tq, Tk]
    # selection: group-averaged compression scores, forced blocks first, the top block_count kept
    own = qpos // C
    forced = (blk == own) | (blk == 0) | (blk == own - 1)
    scores = Pc.view(B, H, G, Tq, nb).mean(2)
    scores = torch.where(forced, torch.ones_like(scores), scores)
    idx = torch.topk(scores, min(block_count, nb), dim=-1).indices
    chosen = torch.zeros(B, H, Tq, nb, dtype=torch.bool, device=dev).scatter(-1, idx, True) & (visible | forced)
    sel = chosen.gather(-1, (kpos // C).view(1, 1, 1, Tk).expand(B, H, Tq, Tk)) & (kpos <= qpos)
    sel = repeat_kv(sel, G, dim=1)  # [B, HQ, Tq, Tk]
    S = torch.einsum("bthk,bshk->bhts", q, k)
    Phi = g_slc.to(dt).transpose(1, 2).unsqueeze(-1) * _masked_softmax(S, sel)
    Phi = Phi + g_cmp.to(dt).transpose(1, 2).unsqueeze(-1) * Phi_cmp
    if window:
        local = (kpos <= qpos) & (kpos > qpos - window)
        Phi = Phi + g_swa.to(dt).transpose(1, 2).unsqueeze(-1) * _masked_softmax(S, local.expand(B, HQ, Tq, Tk))
    return Phi


@full_precision
def nsa_attention(q, k, v, g_cmp, g_slc, g_swa, *, block_size: int, block_count: int, window: int, start: int = 0) -> torch.Tensor:
    """o [B, Tq, HQ, V] = Φ v (v repeated over each key head's query group), in v's dtype."""
    _check(q, k, v, (g_cmp, g_slc, g_swa), block_size, block_count, window, start, _WHERE)
    P = nsa_probs(q, k, g_cmp, g_slc, g_swa, block_size=block_size, block_count=block_count, window=window, start=start)
    vr = repeat_kv(v, q.shape[2] // k.shape[2]).to(P.dtype)
    return torch.einsum("bhts,bshv->bthv", P, vr).to(v.dtype)


__all__ = ["nsa_attention", "nsa_probs"]
