"""Forgetting attention (FoX: Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate") as a pure op: softmax attention whose scores carry a data-dependent decay bias.

    o_i = Σ_{j <= i} softmax_j(s · q_iᵀ k_j + Σ_{l=j+1..i} log f_l) v_j           (FoX, arXiv:2503.02130)
        = Σ_{j <= i} softmax_j(s · q_iᵀ k_j + c_i − c_j) v_j,   c_t = Σ_{l<=t} log f_l

The op takes c, the *cumulative* log forget gate at every key position (fla's ``g`` is the
per-step log f: pass ``g.cumsum(1)``), so that a KV cache can hold c per cached token.

Shapes (the layout of :func:`~seqmix.ops.softmax_attention`; queries are the last Tq of the
Tk positions, as when new tokens are appended to a cache):

    q  [B, Tq, H, K]     k  [B, Tk, H, K]     v  [B, Tk, H, V]     c  [B, Tk, H]
    o  [B, Tq, H, V];    probs [B, H, Tq, Tk]

Modes:

* ``parallel``: the reference, the explicit [Tq, Tk] score matrix plus the bias c_i − c_j,
  masked (causal, optional sliding window), softmax, times v.
* ``sdpa``: the bias folded into the keys. Softmax is invariant to a constant per row, so
  s·q_iᵀk_j + c_i − c_j and s·q_iᵀk_j − c_j give the same row: with q̃_i = [s·q_i, 1] and
  k̃_j = [k_j, −c_j] (one extra channel) FoX is plain causal softmax attention of width K + 1,
  run by torch SDPA (``is_causal``: no [T, T] bias is materialized). The same augmented keys
  are what the KV cache stores (:func:`forgetting_keys`), and a decoding step is
  :func:`~seqmix.ops.attention_decode` over them.

Precision (docs/scale.md): c, the scores and the softmax are float32 or wider; half inputs
are computed in float32 and the output is cast back. Both modes (and the reference) lose
the absolute precision of c_i − c_j once |c| is large (ulp(|c|): 1e-3 at |c| = 1e4 in
float32), as fla's kernels do; a cache may rebase c by any constant (only differences enter).
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_finite, check_shape, check_tensor
from .attention import _check_appended_qkv, _check_window, _scale, attention_decode, attention_mask, softmax_attention
from .precision import autocast_off, compute_dtype

MODES = ("parallel", "sdpa")

_WHERE = "forgetting_attention"


def _check(q, k, v, c, where):
    _check_appended_qkv(q, k, v, where)
    (B, Tq, H, K), Tk = q.shape, k.shape[1]
    check_tensor("c", c, rank=3, layout="[B, Tk, H]", where=where)
    check_shape("c", c, (B, Tk, H), "[B, Tk, H] (cumulative log forget gate at every key position)", where)


def forgetting_probs(q, k, c, *, scale: float | None = None, window: int | None = None, check_values: bool = True) -> torch.Tensor:
    """The reference attention matrix [B, H, Tq, Tk]: softmax_j(s·q_iᵀk_j + c_i − c_j) over the
    visible keys (float32 or wider). Arguments as :func:`forgetting_attention`."""
    where = "forgetting_probs"
    _check(q, k, None, c, where)
    _check_window(window, where)
    s = _scale(scale, q.shape[-1], where)
    if check_values:
        for name, t in (("q", q), ("k", k), ("c", c)):
            check_finite(name, t, where)
    Tq, Tk = q.shape[1], k.shape[1]
    dt = compute_dtype(q, k, c)
    with autocast_off(q.device.type):
        qh, kh = q.to(dt).transpose(1, 2), k.to(dt).transpose(1, 2)  # [B, H, T, K]
        ch = c.to(dt).transpose(1, 2)  # [B, H, Tk]
        scores = (qh @ kh.transpose(-1, -2)) * s + ch[..., Tk - Tq :, None] - ch[..., None, :]
        mask = attention_mask(Tq, Tk, window=window, device=q.device)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def forgetting_keys(k: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The augmented keys k̃_j = [k_j, −c_j] [B, T, H, K + 1] (float32 or wider): what the
    ``sdpa`` mode attends over and what a KV cache stores (the decay bias of every cached
    token, one float per token and head)."""
    dt = compute_dtype(k, c)
    return torch.cat([k.to(dt), -c.to(dt).unsqueeze(-1)], dim=-1)


def forgetting_queries(q: torch.Tensor, scale: float) -> torch.Tensor:
    """The augmented queries q̃_i = [s·q_i, 1] [B, T, H, K + 1] (float32 or wider)."""
    dt = compute_dtype(q)
    q = q.to(dt)
    return torch.cat([q * scale, torch.ones_like(q[..., :1])], dim=-1)


def forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    c: torch.Tensor,
    *,
    scale: float | None = None,
    window: int | None = None,
    mode: str = "auto",
    check_values: bool = True,
) -> torch.Tensor:
    """Forgetting attention; see the module docstring.

    Args:
        q [B, Tq, H, K], k [B, Tk, H, K], v [B, Tk, H, V]; c [B, Tk, H]: the cumulative log
            forget gate c_t = Σ_{l<=t} log f_l at every key position (queries: the last Tq).
        scale: multiplies qᵀk (not the bias); None = 1/sqrt(K).
        window: each query sees its last ``window`` tokens (itself included); None = all.
        mode: "parallel" (explicit matrix, the reference), "sdpa" (augmented keys) or "auto" (= "sdpa").

    Returns:
        o [B, Tq, H, V] in v's dtype.
    """
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    _check(q, k, v, c, _WHERE)
    _check_window(window, _WHERE)
    s = _scale(scale, q.shape[-1], _WHERE)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v), ("c", c)):
            check_finite(name, t, _WHERE)
    dt = compute_dtype(q, k, v, c)
    with autocast_off(q.device.type):
        if mode == "parallel":
            probs = forgetting_probs(q, k, c, scale=s, window=window, check_values=False)
            o = (probs @ v.to(probs.dtype).transpose(1, 2)).transpose(1, 2)
        else:
            qa, ka = forgetting_queries(q, s).to(dt), forgetting_keys(k, c).to(dt)
            o = softmax_attention(qa, ka, v.to(dt), scale=1.0, window=window, mode="sdpa", check_values=False, backend="torch")
    return o.to(v.dtype)


def forgetting_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """One query per sequence over the augmented keys of a cache (:func:`forgetting_keys`):
    q [B, H, K], keys [B, L, H, K + 1], values [B, L, H, V] -> o [B, H, V]. O(L) per token."""
    where = "forgetting_decode"
    check_tensor("q", q, rank=3, layout="[B, H, K]", where=where)
    check_shape("keys", keys, (q.shape[0], None, q.shape[1], q.shape[2] + 1), "[B, L, H, K + 1] (augmented keys)", where)
    s = _scale(scale, q.shape[-1], where)
    qa = forgetting_queries(q, s).to(keys.dtype)
    return attention_decode(qa, keys, values, scale=1.0)
