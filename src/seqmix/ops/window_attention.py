"""The sliding window of a window + linear hybrid: softmax over each query's last ``window`` tokens
with its normalizer kept apart, so that a mixer can weigh it against a linear part (LoLCATs eq. 7:
one normalization over both; Liger attention: a weighted sum of the two normalized outputs).

For queries at the last T positions of a key sequence of R + T tokens (R cached tokens, then the
queries' own), query t sees the valid keys j among its last ``window`` positions, itself included,
W(t) = {j : R + t − window < j <= R + t, valid_j}:

    s_tj = q_tᵀ k_j          (q scaled by the caller)
    m_t  = max_{j ∈ W(t)} s_tj                             (LoLCATs' stabilizer c_n)
    num_t = Σ_{j ∈ W(t)} exp(s_tj − m_t) v_j,    den_t = Σ_{j ∈ W(t)} exp(s_tj − m_t)

num_t / den_t is sliding-window softmax attention; the returned triple lets a hybrid add terms to the
numerator and the denominator before it divides. Shapes (the layout of ``linear_recurrence``):

    q  [B, T, H, K];   k [B, R + T, H, K];   v [B, R + T, H, V];   key_valid [R + T] bool or None
    num [B, T, H, V];  den, m [B, T, H]  (float32 or wider)

Modes:

* ``parallel``: the reference, the scores as an explicit [T, R + T] matrix per head masked by
  :func:`~seqmix.ops.attention.attention_mask` (``return_weights`` also gives the weights
  exp(s − m) there, [B, H, T, R + T], a mixer's map);
* ``chunk``: blocks of C queries, each against the C + window − 1 keys it can see (an unfold of
  the keys): O(T·(C + window)) work and memory instead of O(T·(R + T)).

A decoding step is O(window) per token: the chunk mode at T = 1 runs the fused :func:`window_softmax_step` over
the last ``window`` keys, the invalid ones (a window not yet full) masked.
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, fmt_shape, reads_values
from .attention import attention_mask
from .precision import compute_dtype, full_precision

MODES = ("parallel", "chunk")

_WHERE = "window_softmax"


def _check(q, k, v, window, key_valid, check_values):
    check_tensor("q", q, rank=4, layout="[B, T, H, K]", where=_WHERE)
    check_tensor("k", k, rank=4, layout="[B, R + T, H, K]", where=_WHERE)
    check_tensor("v", v, rank=4, layout="[B, R + T, H, V]", where=_WHERE)
    B, T, H, K = q.shape
    if T == 0:
        raise ValueError(f"{_WHERE}: argument 'q' must hold T >= 1 queries, got {fmt_shape(q.shape)}")
    check_shape("k", k, (B, None, H, K), "[B, R + T, H, K] (q's B, H, K)", _WHERE)
    if k.shape[1] < T:
        raise ValueError(f"{_WHERE}: argument 'k' must hold R + T >= T = {T} keys (the queries are the last T), got {k.shape[1]}")
    check_shape("v", v, (B, k.shape[1], H, None), "[B, R + T, H, V] (k's B, R + T, H)", _WHERE)
    check_positive_int("window", window, _WHERE)
    if key_valid is not None and (not isinstance(key_valid, torch.Tensor) or key_valid.dtype != torch.bool
                                  or tuple(key_valid.shape) != (k.shape[1],)):
        got = f"{fmt_shape(key_valid.shape)} {key_valid.dtype}" if isinstance(key_valid, torch.Tensor) else type(key_valid).__name__
        raise ValueError(f"{_WHERE}: argument 'key_valid' must be a bool tensor [R + T] = [{k.shape[1]}] or None, got {got}")
    if check_values and reads_values(q):
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_finite(name, t, _WHERE)


def _normalize(s, mask, dim: int = -1, keepdim: bool = False):
    """(weights exp(s − m) with 0 outside the mask, den, m) of scores s over the keys' axis ``dim`` (m = 0 on a row
    with no key); den and m with that axis removed, or kept (``keepdim``)."""
    s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    return p, p.sum(dim, keepdim=keepdim), (m if keepdim else m.squeeze(dim))


def _parallel(q, k, v, window, key_valid, want_weights):
    T, L = q.shape[1], k.shape[1]
    mask = attention_mask(T, L, window=window, offset=L - T, device=q.device)  # [T, R + T]
    if key_valid is not None:
        mask = mask & key_valid.to(q.device)
    p, den, m = _normalize(torch.einsum("bthk,bshk->bhts", q, k), mask)
    num = torch.einsum("bhts,bshv->bthv", p, v)
    return num, den.transpose(1, 2), m.transpose(1, 2), (p if want_weights else None)


def _chunk(q, k, v, window, key_valid, C):
    """Query block b (queries bC .. bC + C − 1) against keys R + bC − window + 1 .. R + bC + C − 1 (L = C + window − 1
    of them, padded with invalid keys where they fall outside 0 .. R + T − 1): local query i sees local key j iff
    i <= j <= i + window − 1."""
    B, T, H, K = q.shape
    R = k.shape[1] - T
    V = v.shape[-1]
    n = -(-T // C)
    L = C + window - 1
    left = window - 1 - R  # keys before position 0 of the key sequence that block 0 would read (> 0: padding)
    start = max(-left, 0)  # where block 0's keys begin in the key sequence
    pad_l, total = max(left, 0), n * C + window - 1  # the padded key sequence block b reads at [bC, bC + L)
    valid = key_valid.to(q.device) if key_valid is not None else torch.ones(R + T, dtype=torch.bool, device=q.device)
    kk, vv, ok = k[:, start:], v[:, start:], valid[start:]
    pad_r = total - pad_l - kk.shape[1]
    kk = torch.nn.functional.pad(kk, (0, 0, 0, 0, pad_l, pad_r))
    vv = torch.nn.functional.pad(vv, (0, 0, 0, 0, pad_l, pad_r))
    ok = torch.nn.functional.pad(ok, (pad_l, pad_r), value=False)
    kb = kk.unfold(1, L, C)  # [B, n, H, K, L]
    vb = vv.unfold(1, L, C)  # [B, n, H, V, L]
    okb = ok.unfold(0, L, C)  # [n, L]
    qb = torch.nn.functional.pad(q, (0, 0, 0, 0, 0, n * C - T)).view(B, n, C, H, K)
    i = torch.arange(C, device=q.device).unsqueeze(1)
    j = torch.arange(L, device=q.device).unsqueeze(0)
    band = (j >= i) & (j <= i + window - 1)  # [C, L]
    mask = band.unsqueeze(0) & okb.unsqueeze(1)  # [n, C, L]
    s = torch.einsum("bnchk,bnhkl->bnhcl", qb, kb)
    p, den, m = _normalize(s, mask.unsqueeze(1))  # mask [n, 1, C, L] over heads
    num = torch.einsum("bnhcl,bnhvl->bnchv", p, vb).reshape(B, n * C, H, V)[:, :T]
    return num, den.transpose(2, 3).reshape(B, n * C, H)[:, :T], m.transpose(2, 3).reshape(B, n * C, H)[:, :T]


@full_precision
def window_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, key_valid: torch.Tensor | None = None,
                   mode: str = "chunk", chunk_size: int = 64, return_weights: bool = False, check_values: bool = True,
                   check_shapes: bool = True):
    """(num, den, m) of the module docstring: sliding-window softmax over each query's last ``window`` keys
    with its normalizer apart. q [B, T, H, K] (scaled; the queries are the last T positions of k);
    k [B, R + T, H, K]; v [B, R + T, H, V]; key_valid [R + T] bool (False: no token there, such as a cache
    slot before position 0), None: all valid. ``mode``: "parallel" (the explicit matrix, the reference)
    or "chunk" (blocks of ``chunk_size`` queries). ``return_weights`` (parallel only): also the weights
    exp(s_tj − m_t) on the visible keys, [B, H, T, R + T]. Computed in float32 or wider. In the chunk mode one
    query (a decoding step) is the fused step of :func:`window_softmax_step` over the last ``window`` keys, its
    invalid keys (a window not yet full) masked. ``check_shapes=False``: a
    mixer's decoding step that built its inputs skips the argument checks."""
    if check_shapes:
        check_choice("mode", mode, MODES, _WHERE)
        check_positive_int("chunk_size", chunk_size, _WHERE)
        _check(q, k, v, window, key_valid, check_values)
        if return_weights and mode != "parallel":
            raise ValueError(f"{_WHERE}: argument 'return_weights' needs mode 'parallel' (the explicit matrix), got mode {mode!r}")
    if mode == "chunk" and q.shape[1] == 1:  # (the parallel mode stays the reference)
        if k.shape[1] != window:  # (a decoding step hands exactly the window's keys: no slice)
            k, v = k[:, -window:], v[:, -window:]
            key_valid = key_valid[-window:] if key_valid is not None else None
        return _full_window_step(q, k, v, key_valid)
    dt = compute_dtype(q, k, v)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if mode == "parallel":
        num, den, m, p = _parallel(q, k, v, window, key_valid, return_weights)
        return (num, den, m, p) if return_weights else (num, den, m)
    return _chunk(q, k, v, window, key_valid, min(chunk_size, q.shape[1]))


@full_precision
def window_softmax_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, check_shapes: bool = True
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoding step of :func:`window_softmax` with a full window: the query q [B, 1, H, K] (scaled)
    against its window's keys k [B, w, H, K] and values v [B, w, H, V], the query's own token last, every
    key valid -> (num [B, 1, H, V], den, m [B, 1, H]), in float32 or wider (autocast off). The same numbers as
    ``window_softmax(q, k, v, window=w, mode="parallel")`` (tests/test_decode_steps.py) without its mask and
    einsums: elementwise products summed in the window's own layout. ``check_shapes=False``: a mixer's decoding
    step that built the inputs itself skips the shape checks."""
    if check_shapes:
        where = "window_softmax_step"
        check_tensor("q", q, rank=4, layout="[B, 1, H, K]", where=where)
        check_tensor("k", k, rank=4, layout="[B, w, H, K]", where=where)
        check_tensor("v", v, rank=4, layout="[B, w, H, V]", where=where)
        if q.shape[1] != 1:
            raise ValueError(f"{where}: argument 'q' must hold one query (a decoding step), got {fmt_shape(q.shape)}; "
                             "window_softmax takes several")
        B, _, H, K = q.shape
        check_shape("k", k, (B, None, H, K), "[B, w, H, K] (q's B, H, K)", where)
        check_shape("v", v, (B, k.shape[1], H, None), "[B, w, H, V] (k's B, w, H)", where)
    return _full_window_step(q, k, v)


def _full_window_step(q, k, v, key_valid=None):
    """The body of :func:`window_softmax_step` (no checks; autocast off by the caller's decorator): the scores as q ⊙ k
    summed over K and the numerator as p ⊙ v summed over the window, elementwise in the keys' own [B, w, H, K] layout
    (two matmuls over the heads would first copy the window into head-major matrices: 1.5x this form's time at w 64,
    batch 1, and 4.7x at batch 4, on the 2-core CPU). ``key_valid`` [w] bool or None: the keys outside it weigh 0
    (:func:`_normalize`, the other modes' masking)."""
    dt = compute_dtype(q, k, v)
    if q.dtype != dt or k.dtype != dt or v.dtype != dt:
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
    s = (k * q).sum(-1)  # [B, w, H]
    if key_valid is None:
        m = s.amax(1, keepdim=True)  # [B, 1, H]
        p = torch.exp(s - m)
        den = p.sum(1, keepdim=True)
    else:
        p, den, m = _normalize(s, key_valid.to(s.device).view(1, -1, 1), dim=1, keepdim=True)
    return (p.unsqueeze(-1) * v).sum(1, keepdim=True), den, m
