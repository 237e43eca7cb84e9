"""Causal softmax attention as a pure op: torch SDPA, an explicit masked-matrix reference,
a sliding window, memory tokens prefixed to the keys, and a KV-cache decoding step.

    o_i = Σ_{j visible from i} softmax_j(scale · q_iᵀ k_j) v_j                 (DSF paper eq. 2)

Shapes (the layout of ``linear_recurrence``):

    q            [B, Tq, H, K]
    k            [B, Tk, H, K]      (the same K as q)
    v            [B, Tk, H, V]
    o            [B, Tq, H, V];     probs [B, H, Tq, Tk]

Which keys a query sees is decided by :func:`attention_mask`, the one place where the
causal, sliding-window and memory-token rules live:

* key columns [0, prefix) are memory tokens, visible to every query (B'MOJO prefixes its
  fading and eidetic memory tokens this way);
* key columns [prefix, Tk) are the sequence tokens at positions 0 .. Tk - prefix - 1;
* query i sits at position offset + i (default: the queries are the last Tq tokens, as when
  new tokens are appended to a KV cache);
* a query at position p sees the sequence key at position s iff s <= p and p - s < window
  (window = None: no limit), i.e. its last ``window`` tokens including itself;
* key_valid [B, Tk] (optional) hides keys marked False (padding, memory slots that do not
  exist yet). A query that sees no key at all gets o = 0 and a zero row of probs.

Modes:

* ``parallel``: the reference, scores as an explicit [Tq, Tk] matrix per head, masked with
  -inf, softmax, times v.
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels, no [T, T]
  matrix on backends that support it); ``is_causal`` when the mask is plain causal,
  otherwise the boolean mask of :func:`attention_mask`.
* ``auto``: ``sdpa``.

:func:`attention_probs` returns the matrix itself [B, H, Tq, Tk] (the reference's
probabilities; a mixer's phi).

Decoding: :func:`attention_step` appends one token to a KV cache [B, L, H, K|V] and attends
over it; with a window the cache keeps only the last window - 1 tokens (the window
includes the current token), so its memory is bounded by w.

The scale defaults to 1/sqrt(K) (Vaswani et al.; torch's default); the DSF paper drops it
in its derivations (dsf note §1), pass ``scale=1.0`` for that.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import backends as _backends
from .._checks import check_choice, check_finite, check_shape, check_tensor, fmt_shape
from .precision import autocast_off

MODES = ("parallel", "sdpa")

_WHERE = "softmax_attention"


# --------------------------------------------------------------------------------------
# the mask
# --------------------------------------------------------------------------------------


def _check_window(window, where):
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{where}: argument 'window' must be None or an integer >= 1 (tokens seen, including the current one), got {window!r}")


def attention_mask(
    T_q: int,
    T_k: int | None = None,
    *,
    window: int | None = None,
    prefix: int = 0,
    offset: int | None = None,
    key_valid: torch.Tensor | None = None,
    device=None,
) -> torch.Tensor:
    """Which keys each query may attend to (True = visible).

    Args:
        T_q, T_k: numbers of queries and keys (T_k defaults to T_q).
        window: each query sees its last ``window`` sequence tokens (itself included); None = all.
        prefix: the first ``prefix`` key columns are memory tokens, visible to every query.
        offset: sequence position of query 0; default T_k - prefix - T_q (queries are the
            last tokens of the sequence).
        key_valid: [B, T_k] bool, keys marked False are hidden.

    Returns:
        [T_q, T_k] bool, or [B, 1, T_q, T_k] when ``key_valid`` is given (broadcasts over heads).
    """
    where = "attention_mask"
    T_k = T_q if T_k is None else T_k
    for name, val, lo in (("T_q", T_q, 1), ("T_k", T_k, 1), ("prefix", prefix, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{where}: argument '{name}' must be an integer >= {lo}, got {val!r}")
    _check_window(window, where)
    if prefix > T_k:
        raise ValueError(f"{where}: argument 'prefix' must be <= T_k = {T_k} (memory tokens are key columns), got {prefix}")
    n_seq = T_k - prefix
    if offset is None:
        offset = n_seq - T_q
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"{where}: argument 'offset' must be an integer (position of query 0), got {offset!r}")
    if key_valid is not None:
        device = key_valid.device
    q_pos = torch.arange(T_q, device=device).unsqueeze(1) + offset  # [T_q, 1]
    k_pos = torch.arange(n_seq, device=device).unsqueeze(0)  # [1, n_seq]
    lag = q_pos - k_pos
    seq = lag >= 0
    if window is not None:
        seq = seq & (lag < window)
    mask = torch.cat([torch.ones(T_q, prefix, dtype=torch.bool, device=device), seq], dim=1)
    if key_valid is not None:
        if not isinstance(key_valid, torch.Tensor) or key_valid.dtype != torch.bool or key_valid.dim() != 2 or key_valid.shape[1] != T_k:
            got = fmt_shape(key_valid.shape) + f" {key_valid.dtype}" if isinstance(key_valid, torch.Tensor) else type(key_valid).__name__
            raise ValueError(f"{where}: argument 'key_valid' must be a bool tensor [B, T_k] = [?, {T_k}], got {got}")
        mask = mask & key_valid[:, None, None, :]
    return mask


def _plain_causal(T_q, T_k, window, prefix, offset, key_valid) -> bool:
    return window is None and prefix == 0 and key_valid is None and T_q == T_k and offset in (None, 0)


# --------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------


def _check_qkv(q, k, v, where, *, step=False):
    lay = "[B, H, K]" if step else "[B, T, H, K]"
    r = 3 if step else 4
    check_tensor("q", q, rank=r, layout=lay, where=where)
    check_tensor("k", k, rank=r, layout=lay, where=where)
    check_tensor("v", v, rank=r, layout=lay.replace("K]", "V]"), where=where)
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"{where}: argument 'k' must have the width of the queries q (K = {q.shape[-1]}), got {k.shape[-1]} "
            f"(q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}): queries and keys of mismatched width"
        )
    if step:
        check_shape("k", k, q.shape, "[B, H, K]", where)
        check_shape("v", v, (*q.shape[:2], None), "[B, H, V]", where)
    else:
        B, _, H, K = q.shape
        if q.shape[1] == 0 or k.shape[1] == 0:
            raise ValueError(f"{where}: sequence lengths must be >= 1, got q {fmt_shape(q.shape)} and k {fmt_shape(k.shape)}")
        check_shape("k", k, (B, None, H, K), "[B, Tk, H, K]", where)
        check_shape("v", v, (B, k.shape[1], H, None), "[B, Tk, H, V]", where)


def _scale(scale, K, where):
    if scale is None:
        return 1.0 / math.sqrt(K)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{where}: argument 'scale' must be a positive number or None (1/sqrt(K)), got {scale!r}")
    return float(scale)


# --------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------


def _prepare(q, k, v, scale, window, prefix, offset, key_valid, check_values, where):
    """Checks the arguments (v may be None); returns (scale, whether the mask is plain causal)."""
    _check_qkv(q, k, v if v is not None else k[..., :1], where)
    _check_window(window, where)
    scale = _scale(scale, q.shape[-1], where)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t is not None:
                check_finite(name, t, where)
    return scale, _plain_causal(q.shape[1], k.shape[1], window, prefix, offset, key_valid)


def _visible(Tq, Tk, window, prefix, offset, key_valid, device, plain):
    """(mask, empty): the mask of :func:`attention_mask` in which a query that sees no key
    sees every key instead (a finite softmax), and ``empty`` marks those rows (or None)."""
    mask = attention_mask(Tq, Tk, window=window, prefix=prefix, offset=offset, key_valid=key_valid, device=device)
    if plain:
        return mask, None
    no_key = ~mask.any(-1, keepdim=True)
    if bool(no_key.any()):
        return mask | no_key, no_key
    return mask, None


def _probs(qh, kh, scale, mask, empty):
    """The reference: softmax of the masked score matrix. qh [B, H, Tq, K], kh [B, H, Tk, K] -> [B, H, Tq, Tk]."""
    dt = torch.float32 if qh.dtype in (torch.float16, torch.bfloat16) else qh.dtype
    with autocast_off(qh.device.type):  # scores and softmax in float32 (docs/scale.md)
        scores = (qh.to(dt) @ kh.to(dt).transpose(-1, -2)) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return probs.masked_fill(empty, 0.0) if empty is not None else probs


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float | None = None,
    window: int | None = None,
    prefix: int = 0,
    offset: int | None = None,
    key_valid: torch.Tensor | None = None,
    check_values: bool = True,
) -> torch.Tensor:
    """The attention matrix [B, H, Tq, Tk] (rows sum to 1, or 0 for a query that sees no key):
    q [B, Tq, H, K], k [B, Tk, H, K]; the other arguments as in :func:`softmax_attention`."""
    where = "attention_probs"
    scale, plain = _prepare(q, k, None, scale, window, prefix, offset, key_valid, check_values, where)
    mask, empty = _visible(q.shape[1], k.shape[1], window, prefix, offset, key_valid, q.device, plain)
    return _probs(q.transpose(1, 2), k.transpose(1, 2), scale, mask, empty)


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    window: int | None = None,
    prefix: int = 0,
    offset: int | None = None,
    key_valid: torch.Tensor | None = None,
    mode: str = "auto",
    check_values: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """Masked softmax attention; see the module docstring for the mask rules and modes.

    Args:
        q [B, Tq, H, K], k [B, Tk, H, K], v [B, Tk, H, V].
        scale: multiplies qᵀk; None = 1/sqrt(K).
        window, prefix, offset, key_valid: as in :func:`attention_mask`.
        mode: "parallel" (explicit matrix, the reference), "sdpa" or "auto" (= "sdpa").
        check_values: check q, k, v for NaN/Inf.
        backend: "auto", "torch" or "sdpa" (SDPA with is_causal, plain causal mask only):
            see :mod:`seqmix.ops.backends`; "torch" runs ``mode`` as documented above.

    Returns:
        o [B, Tq, H, V] (the matrix itself: :func:`attention_probs`)
    """
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    scale, plain = _prepare(q, k, v, scale, window, prefix, offset, key_valid, check_values, _WHERE)
    if backend != "torch":
        be = _backends.resolve(_WHERE, backend, _backends.Call(_WHERE, q.device.type, q.dtype, mode, dict(plain_causal=plain)))
        if be.name != "torch":
            return be.run[_WHERE](q, k, v, scale=scale)
    Tq, Tk = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, ·]
    if mode in ("sdpa", "auto") and plain:  # SDPA's is_causal needs no [Tq, Tk] mask
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)
    else:
        mask, empty = _visible(Tq, Tk, window, prefix, offset, key_valid, q.device, plain)
        if mode == "parallel":
            probs = _probs(qh, kh, scale, mask, empty)
            with autocast_off(q.device.type):  # the reference: float32 for half inputs, autocast or not
                o = (probs @ vh.to(probs.dtype)).to(v.dtype)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
            if empty is not None:
                o = o.masked_fill(empty, 0.0)
    return o.transpose(1, 2)


def kv_cache_trim(k: torch.Tensor, v: torch.Tensor, window: int | None):
    """What a KV cache must keep to continue: every token (window None) or the last
    window - 1 tokens (the next query's window is those plus itself). k [B, L, H, K], v [B, L, H, V]."""
    if window is None:
        return k, v
    keep = window - 1
    start = max(k.shape[1] - keep, 0)
    return k[:, start:], v[:, start:]


def attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    window: int | None = None,
):
    """One decoding step with a KV cache.

    q, k [B, H, K]; v [B, H, V]; k_cache [B, L, H, K], v_cache [B, L, H, V] or None (empty).
    The cache holds the previous tokens this query may see (at most window - 1 of them).
    Returns (o [B, H, V], k_cache', v_cache'), the caches trimmed by :func:`kv_cache_trim`.
    """
    where = "attention_step"
    _check_qkv(q, k, v, where, step=True)
    _check_window(window, where)
    scale = _scale(scale, q.shape[-1], where)
    if (k_cache is None) != (v_cache is None):
        raise ValueError(f"{where}: arguments 'k_cache' and 'v_cache' must be given together")
    keys, values = k.unsqueeze(1), v.unsqueeze(1)
    if k_cache is not None:
        check_shape("k_cache", k_cache, (q.shape[0], None, *q.shape[1:]), "[B, L, H, K]", where)
        check_shape("v_cache", v_cache, (q.shape[0], k_cache.shape[1], *v.shape[1:]), "[B, L, H, V]", where)
        keys = torch.cat([k_cache, keys], dim=1)
        values = torch.cat([v_cache, values], dim=1)
    if window is not None and keys.shape[1] > window:
        keys, values = keys[:, -window:], values[:, -window:]
    dt = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    scores = torch.einsum("bhk,blhk->bhl", q.to(dt), keys.to(dt)) * scale
    p = torch.softmax(scores, dim=-1)
    o = torch.einsum("bhl,blhv->bhv", p, values.to(dt)).to(v.dtype)
    k_new, v_new = kv_cache_trim(keys, values, window)
    return o, k_new, v_new
