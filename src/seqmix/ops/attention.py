"""Causal softmax attention as a pure op: torch SDPA, an explicit masked-matrix reference,
a sliding window, memory tokens prefixed to the keys, and a KV-cache decoding step.

    o_i = Σ_{j visible from i} softmax_j(scale · q_iᵀ k_j) v_j                 (DSF paper eq. 2)

Shapes (the layout of ``linear_recurrence``):

    q            [B, Tq, H, K]
    k            [B, Tk, Hkv, K]    (the same K as q)
    v            [B, Tk, Hkv, V]
    o            [B, Tq, H, V];     probs [B, H, Tq, Tk]

Grouped keys and values (GQA, Ainslie et al. 2023; MQA, Shazeer 2019, is Hkv = 1): k and v
may have Hkv heads with H % Hkv == 0; query head h reads key/value head h // (H / Hkv)
(transformers' ``repeat_kv``: each kv head serves H / Hkv consecutive query heads).

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

Decoding: :class:`KVCache` holds the keys and values in preallocated buffers:
an append writes into free slots (amortized O(1) per token, no torch.cat per token; the
capacity doubles when full), with a window it keeps only the last window - 1 tokens (the
window includes the current token) in a bounded buffer of at most max(2(w - 1), w - 1 + 64)
slots. :func:`attention_decode` is one query over the cached keys.
:func:`attention_step` is the functional form (appends with torch.cat, O(L) copy per token):
the reference the cache is tested against.

The scale defaults to 1/sqrt(K) (Vaswani et al.; torch's default); the DSF paper drops it
in its derivations (dsf note §1), pass ``scale=1.0`` for that.

Options of real models on the scores s_ij = scale·q_iᵀk_j (all off by default), each a statement
about the map Φ[i, j] = softmax_j(s_ij) of the DSF:

* ``softcap`` c (Gemma 2's attention-logit soft-capping): s_ij -> c·tanh(s_ij / c), scores
  bounded in (−c, c), so no row of Φ can put more than e^{2c} times the weight of another key on
  one key. Both modes compute the explicit matrix (SDPA has no soft-capping).
* ``alibi`` m [H] (ALiBi, Press et al. 2022; BLOOM): s_ij -> s_ij − m_h (i − j): Φ[i, j] is
  multiplied by a fixed per-head decay e^{−m_h (i − j)} before the normalization — the data-
  independent special case of FoX's forget gate (log f_t = −m_h for every t), i.e. the scalar
  decay Λ = e^{−m_h} of a linear-attention DSF put on the softmax map. :func:`alibi_slopes` gives
  the paper's geometric slopes. Memory-token columns (``prefix``) get no bias.
* ``sinks`` z [H] (GPT-OSS's learned attention sinks): a constant term in every row's normalizer,
  Φ[i, j] = e^{s_ij} / (e^{z_h} + Σ_{l visible} e^{s_il}): the rows sum to less than 1 (the rest
  goes to no value) — softmax attention with an input-independent η of normalized attention
  (DSF eq. 22) added to its row sum. SDPA reads it as a zero key and value with logit z_h.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import backends as _backends
from .._checks import check_choice, check_finite, check_shape, check_tensor, fmt_shape, reads_values
from .precision import autocast_enabled, autocast_off

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
    # query i (position offset + i) sees sequence key j iff 0 <= (offset + i) - j < window: the band of diagonals
    # offset - window + 1 <= j - i <= offset, as tril and triu of a matrix of ones
    seq = torch.ones(T_q, n_seq, dtype=torch.bool, device=device).tril(offset)
    if window is not None:
        seq = seq.triu(offset - window + 1)
    mask = torch.cat([torch.ones(T_q, prefix, dtype=torch.bool, device=device), seq], dim=1) if prefix else seq
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
    H, Hkv = q.shape[-2], k.shape[-2]
    if Hkv < 1 or H % Hkv:
        raise ValueError(
            f"{where}: argument 'k' must have a number of heads that divides the queries' H = {H} "
            f"(grouped keys and values), got {Hkv} (q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)})"
        )
    if step:
        check_shape("k", k, (q.shape[0], Hkv, q.shape[-1]), "[B, Hkv, K]", where)
        check_shape("v", v, (q.shape[0], Hkv, None), "[B, Hkv, V]", where)
    else:
        B, _, H, K = q.shape
        if q.shape[1] == 0 or k.shape[1] == 0:
            raise ValueError(f"{where}: sequence lengths must be >= 1, got q {fmt_shape(q.shape)} and k {fmt_shape(k.shape)}")
        check_shape("k", k, (B, None, Hkv, K), "[B, Tk, Hkv, K]", where)
        check_shape("v", v, (B, k.shape[1], Hkv, None), "[B, Tk, Hkv, V]", where)


def _check_appended_qkv(q, k, v, where):
    """q [B, Tq, H, K], k [B, Tk, H, K] and v [B, Tk, H, V] or None, the queries the last Tq >= 1 of
    the Tk positions (as when new tokens are appended to a cache)."""
    check_tensor("q", q, rank=4, layout="[B, Tq, H, K]", where=where)
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    B, Tq, H, K = q.shape
    check_shape("k", k, (B, None, H, K), "[B, Tk, H, K] (q's B, H, K)", where)
    Tk = k.shape[1]
    if Tq == 0 or Tk < Tq:
        raise ValueError(f"{where}: argument 'k' must have Tk >= Tq >= 1 positions (queries are the last Tq), got Tq = {Tq}, Tk = {Tk}")
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, Tk, H, V]", where=where)
        check_shape("v", v, (B, Tk, H, None), "[B, Tk, H, V]", where)


def repeat_kv(x: torch.Tensor, groups: int, dim: int = 2) -> torch.Tensor:
    """Each of the Hkv heads of x (on ``dim``) repeated ``groups`` times in a row: [.., Hkv, ..]
    -> [.., Hkv·groups, ..], head h of the result is head h // groups of x (transformers' repeat_kv)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=dim)


def _scale(scale, K, where):
    if type(scale) is float and 0.0 < scale < math.inf:  # (the common case first: no call)
        return scale
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
    if check_values and reads_values(q):
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t is not None:
                check_finite(name, t, where)
    return scale, _plain_causal(q.shape[1], k.shape[1], window, prefix, offset, key_valid)


#: the masks :func:`_visible` keeps for the next call with the same arguments (the layers of one forward pass ask for
#: the same mask): at most this many, each of at most MASK_KEEP_MAX_ELEMENTS entries (a [T, T] bool mask: T = 2048; 16 MiB in all)
MASK_KEEP_COUNT, MASK_KEEP_MAX_ELEMENTS = 4, 1 << 22
_KEPT_MASKS: dict = {}


def _may_have_empty_rows(Tq, Tk, prefix, offset, key_valid) -> bool:
    """Whether a query can see no key: only with ``key_valid``, or without memory tokens where a query sits before
    position 0 or after the last key (with the default offset: more queries than keys)."""
    if key_valid is not None:
        return True
    off = Tk - prefix - Tq if offset is None else offset  # (the default puts the queries last: negative when Tq > Tk)
    return not prefix and not 0 <= off <= Tk - Tq


def _visible(Tq, Tk, window, prefix, offset, key_valid, device, additive=None):
    """(mask, empty): the mask of :func:`attention_mask` in which a query that sees no key
    sees every key instead (a finite softmax), and ``empty`` marks those rows (None where no row can be empty:
    :func:`_may_have_empty_rows`). Without ``key_valid`` the mask is kept for the next call with the same arguments
    (``MASK_KEEP_COUNT`` of them; not while torch.compile traces): the layers of a forward pass share one.

    ``additive``: a dtype: (mask, empty, bias), the mask also as an additive bias of that dtype, 0 where a key is
    seen and −inf elsewhere, kept with the mask. Added to finite scores it gives what ``torch.where(mask, s, −inf)``
    gives, in one add instead of a select (measured 3x the time of the add on [1, 8, 512, 512] on the CPU), and it is
    what SDPA makes of a boolean mask at every call."""
    key = None
    if key_valid is None and not torch.compiler.is_compiling() and Tq * Tk <= MASK_KEEP_MAX_ELEMENTS:
        # (a mask made in inference mode is an inference tensor: kept apart from the others)
        key = (Tq, Tk, window, prefix, offset, torch.device(device) if device is not None else None, torch.is_inference_mode_enabled())
    kept = _KEPT_MASKS.get(key) if key is not None else None
    if kept is None:
        mask = attention_mask(Tq, Tk, window=window, prefix=prefix, offset=offset, key_valid=key_valid, device=device)
        empty = None
        if _may_have_empty_rows(Tq, Tk, prefix, offset, key_valid):
            empty = ~mask.any(-1, keepdim=True)  # kept whether or not a row is empty: asking would read the mask on the host
            mask = mask | empty
        kept = (mask, empty, {})  # (the additive biases made from the mask, by dtype)
        if key is not None:
            while len(_KEPT_MASKS) >= MASK_KEEP_COUNT:
                try:  # (another thread may evict or add at the same time: a missed eviction is harmless)
                    _KEPT_MASKS.pop(next(iter(_KEPT_MASKS)), None)
                except (RuntimeError, StopIteration):
                    break
            _KEPT_MASKS[key] = kept
    mask, empty, biases = kept
    if additive is None:
        return mask, empty
    bias = biases.get(additive)
    if bias is None:
        bias = biases[additive] = torch.zeros(mask.shape, dtype=additive, device=mask.device).masked_fill_(~mask, float("-inf"))
    return mask, empty, bias


def alibi_slopes(heads: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
    """ALiBi's per-head slopes m [heads] (Press et al. 2022): for n = 2^⌊log2 heads⌋, the geometric
    sequence m_h = 2^{−8h/n}, h = 1 .. n; the heads beyond n take every other slope of the sequence
    for 2n (m = 2^{−4(2i−1)/n}, i = 1 ..), as BLOOM builds them."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"alibi_slopes: argument 'heads' must be an integer >= 1, got {heads!r}")
    n = 2 ** int(math.floor(math.log2(heads)))
    exps = [8.0 * h / n for h in range(1, n + 1)]
    exps += [4.0 * (2 * i - 1) / n for i in range(1, min(n, heads - n) + 1)]
    return torch.tensor([2.0 ** -e for e in exps], device=device, dtype=torch.float64).to(dtype)


def _lags(Tq, Tk, prefix, offset, device, dtype):
    """i − j of every (query, key) pair [Tq, Tk] (the positions of :func:`attention_mask`; 0 in the
    memory-token columns)."""
    n_seq = Tk - prefix
    offset = n_seq - Tq if offset is None else offset
    lag = (torch.arange(Tq, device=device, dtype=dtype).unsqueeze(1) + offset) - torch.arange(n_seq, device=device, dtype=dtype)
    return torch.cat([torch.zeros(Tq, prefix, device=device, dtype=dtype), lag], dim=1) if prefix else lag


def _scores(qh, kh, scale, softcap, bias):
    """s = scale·q kᵀ, soft-capped, plus the bias [.., Tq, Tk] (ALiBi): [B, H, Tq, Tk] in qh's dtype. Where autograd
    records nothing, each step writes the product's own buffer (the same numbers: the same kernels, in place)."""
    scores = qh @ kh.transpose(-1, -2)
    if not scores.requires_grad:  # (inference: one [B, H, Tq, Tk] buffer instead of one per step)
        if scale != 1.0:
            scores.mul_(scale)
        if softcap is not None:
            scores.div_(softcap).tanh_().mul_(softcap)
        return scores if bias is None else scores.add_(bias)
    if scale != 1.0:
        scores = scores * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    return scores if bias is None else scores + bias


def _softmax_rows(scores, sinks):
    """softmax over the last dimension, with a sink logit z_h [H] in each row's normalizer (dropped
    from the result): scores [B, H, Tq, Tk]."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    z = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, z], dim=-1), dim=-1)[..., :-1]


def _alibi_bias(alibi, Tq, Tk, prefix, offset, device, dtype):
    """−m_h (i − j): [1, H, Tq, Tk], or None."""
    if alibi is None:
        return None
    return -alibi.to(dtype).view(1, -1, 1, 1) * _lags(Tq, Tk, prefix, offset, device, dtype)


def _check_extras(softcap, alibi, sinks, H, where):
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap)
                                or softcap <= 0):
        raise ValueError(f"{where}: argument 'softcap' must be None or a finite number > 0, got {softcap!r}")
    for name, t in (("alibi", alibi), ("sinks", sinks)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != H or not t.is_floating_point()):
            got = f"{fmt_shape(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{where}: argument '{name}' must be None or a float tensor [H] = [{H}] (one per query head), got {got}")


def _score_dtype(dtype):
    """The scores' and softmax's dtype: float32 for half inputs (docs/scale.md)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _probs(qh, kh, scale, mask, empty, *, softcap=None, alibi=None, sinks=None, prefix=0, offset=None, additive=None):
    """The reference: softmax of the masked score matrix. qh [B, H, Tq, K], kh [B, H, Tk, K] -> [B, H, Tq, Tk].
    ``additive``: the mask as an additive bias in the scores' dtype (:func:`_visible`), added instead of the
    select: the same numbers where the scores are finite (soft-capped scores always are)."""
    dt = _score_dtype(qh.dtype)
    with autocast_off(qh.device.type):  # scores and softmax in float32 (docs/scale.md)
        bias = _alibi_bias(alibi, qh.shape[2], kh.shape[2], prefix, offset, qh.device, dt)
        scores = _scores(qh.to(dt), kh.to(dt), scale, softcap, bias)
        if additive is None:
            scores = torch.where(mask, scores, float("-inf"))
        else:
            scores = scores + additive if scores.requires_grad else scores.add_(additive)
        probs = _softmax_rows(scores, sinks)
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
    softcap: float | None = None,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention matrix [B, H, Tq, Tk] (rows sum to 1, less with sinks, 0 for a query that sees
    no key): q [B, Tq, H, K], k [B, Tk, H, K]; the other arguments as in :func:`softmax_attention`."""
    where = "attention_probs"
    scale, _ = _prepare(q, k, None, scale, window, prefix, offset, key_valid, check_values, where)
    _check_extras(softcap, alibi, sinks, q.shape[2], where)
    mask, empty = _visible(q.shape[1], k.shape[1], window, prefix, offset, key_valid, q.device)
    k = repeat_kv(k, q.shape[2] // k.shape[2])
    return _probs(q.transpose(1, 2), k.transpose(1, 2), scale, mask, empty, softcap=softcap, alibi=alibi, sinks=sinks,
                  prefix=prefix, offset=offset)


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
    softcap: float | None = None,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    check_shapes: bool = True,
) -> torch.Tensor:
    """Masked softmax attention; see the module docstring for the mask rules, modes and options.

    Args:
        q [B, Tq, H, K], k [B, Tk, Hkv, K], v [B, Tk, Hkv, V] (H % Hkv == 0: grouped kv heads).
        scale: multiplies qᵀk; None = 1/sqrt(K).
        window, prefix, offset, key_valid: as in :func:`attention_mask`.
        mode: "parallel" (explicit matrix, the reference), "sdpa" or "auto" (= "sdpa").
        check_values: check q, k, v for NaN/Inf (a host read: where ``seqmix.debug`` allows it, by default on CPU tensors).
        backend: "auto", "torch" or "sdpa" (SDPA with is_causal, plain causal mask only):
            see :mod:`seqmix.ops.backends`; "torch" runs ``mode`` as documented above.
        softcap: c, scores c·tanh(s/c) (Gemma 2); None = none.
        alibi: slopes m [H], scores s_ij − m_h (i − j) (ALiBi); None = none.
        sinks: logits z [H] added to each row's normalizer (GPT-OSS); None = none.
        dropout_p: dropout on the probabilities (training: each entry of the matrix zeroed with probability
            p, the others scaled by 1/(1 - p), as ``F.dropout`` of the matrix; SDPA's ``dropout_p``);
            0 = none. A draw from torch's generator: pass 0 where the result must be deterministic.
        check_shapes: check the arguments' shapes, dtypes, mode, window and extras (False: a caller that made
            them itself and checked its own configuration, as the attention mixers do for their q, k, v; a
            wrong argument then fails inside torch instead of with this op's message).

    Returns:
        o [B, Tq, H, V] (the matrix itself: :func:`attention_probs`)
    """
    if check_shapes:
        check_choice("mode", mode, MODES + ("auto",), _WHERE)
        scale, plain = _prepare(q, k, v, scale, window, prefix, offset, key_valid, check_values, _WHERE)
        _check_extras(softcap, alibi, sinks, q.shape[2], _WHERE)
    else:  # (the values are checked where asked, as _prepare does)
        if check_values and reads_values(q):
            for name, t in (("q", q), ("k", k), ("v", v)):
                check_finite(name, t, _WHERE)
        scale = _scale(scale, q.shape[-1], _WHERE)
        plain = _plain_causal(q.shape[1], k.shape[1], window, prefix, offset, key_valid)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        raise ValueError(f"{_WHERE}: argument 'dropout_p' must be a number in [0, 1), got {dropout_p!r}")
    groups = q.shape[2] // k.shape[2]
    if softcap is not None or alibi is not None or sinks is not None:
        return _attention_with_extras(q, k, v, scale, window, prefix, offset, key_valid, mode, softcap, alibi, sinks, dropout_p)
    if backend != "torch" and not dropout_p:  # the kernel backends take no dropout
        be = _backends.resolve(_WHERE, backend, _backends.Call(_WHERE, q.device.type, q.dtype, mode, dict(plain_causal=plain)))
        if be.name != "torch":
            return be.run[_WHERE](q, k, v, scale=scale)  # (grouped kv heads: the backend reads them itself)
    Tq, Tk = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, ·] (k, v: [B, Hkv, T, ·])
    gqa = groups > 1  # SDPA reads the grouped heads itself (enable_gqa), the reference repeats them
    if mode in ("sdpa", "auto") and plain:  # SDPA's is_causal needs no [Tq, Tk] mask
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa, dropout_p=dropout_p)
    else:
        if mode == "parallel":
            mask, empty = _visible(Tq, Tk, window, prefix, offset, key_valid, q.device)
            kh, vh = repeat_kv(kh, groups, 1), repeat_kv(vh, groups, 1)
            probs = _dropout(_probs(qh, kh, scale, mask, empty), dropout_p)
            with autocast_off(q.device.type):  # the reference: float32 for half inputs, autocast or not
                o = (probs @ vh.to(probs.dtype)).to(v.dtype)
        else:  # the kept additive mask: SDPA would make it from the boolean one at every call
            _, empty, bias = _visible(Tq, Tk, window, prefix, offset, key_valid, q.device, q.dtype)
            o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, scale=scale, enable_gqa=gqa, dropout_p=dropout_p)
            if empty is not None:
                o = o.masked_fill(empty, 0.0)
    return o.transpose(1, 2)


def _dropout(probs: torch.Tensor, p: float) -> torch.Tensor:
    """The attention matrix with dropout p (training; the identity for p = 0): ``F.dropout`` of the matrix,
    as transformers' eager attention applies it, so one draw of torch's generator gives the same zeros."""
    return F.dropout(probs, p) if p else probs


def _attention_with_extras(q, k, v, scale, window, prefix, offset, key_valid, mode, softcap, alibi, sinks, dropout_p=0.0):
    """softmax_attention with soft-capping, ALiBi or sinks: the explicit matrix ("parallel", and
    any mode with soft-capping, or with sinks and dropout), or SDPA with a float bias (ALiBi; a sink as a
    zero key and value whose logit is z_h)."""
    Tq, Tk = q.shape[1], k.shape[1]
    groups = q.shape[2] // k.shape[2]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    explicit = mode == "parallel" or softcap is not None or (dropout_p and sinks is not None)  # dropout on Φ, not on a sink's column
    # (the reference, mode "parallel", selects by the boolean mask; the others add the kept additive bias)
    additive = None if mode == "parallel" else _score_dtype(q.dtype) if explicit else q.dtype
    mask, empty, *bias = _visible(Tq, Tk, window, prefix, offset, key_valid, q.device, additive)
    if explicit:
        kh, vh = repeat_kv(kh, groups, 1), repeat_kv(vh, groups, 1)
        probs = _probs(qh, kh, scale, mask, empty, softcap=softcap, alibi=alibi, sinks=sinks, prefix=prefix, offset=offset,
                       additive=bias[0] if bias else None)
        probs = _dropout(probs, dropout_p)
        with autocast_off(q.device.type):
            o = (probs @ vh.to(probs.dtype)).to(v.dtype)
        return o.transpose(1, 2)
    H = q.shape[2]
    alibi_bias = _alibi_bias(alibi, Tq, Tk, prefix, offset, q.device, q.dtype)  # [1, H, Tq, Tk] or None
    bias = bias[0] if alibi_bias is None else alibi_bias + bias[0]  # (the lags are finite: the select's numbers)
    if bias.dim() == 2:  # (no ALiBi and no key_valid: one [Tq, Tk] bias for every head)
        bias = bias.view(1, 1, Tq, Tk)
    if sinks is not None:  # one more key: k = 0, v = 0, logit z_h
        B = q.shape[0]
        kh = torch.cat([kh, kh.new_zeros(B, kh.shape[1], 1, kh.shape[-1])], dim=2)
        vh = torch.cat([vh, vh.new_zeros(B, vh.shape[1], 1, vh.shape[-1])], dim=2)
        z = sinks.to(q.dtype).view(1, H, 1, 1).expand(bias.shape[0], H, Tq, 1)
        bias = torch.cat([bias.expand(bias.shape[0], H, Tq, Tk), z], dim=-1)
    o = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias, scale=scale, enable_gqa=groups > 1, dropout_p=dropout_p)
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


def attention_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, scale: float | None = None,
                     softcap: float | None = None, alibi: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                     heads_first: bool = False) -> torch.Tensor:
    """One query per sequence over the keys it sees (every one of them): a decoding step's read.

    q [B, H, K]; keys [B, L, Hkv, K], values [B, L, Hkv, V] (any strides: views of a
    :class:`KVCache`'s buffers), the last key the query's own (ALiBi's lags: L − 1 − l); ``heads_first``:
    keys [B, Hkv, L, K], values [B, Hkv, L, V] (:meth:`KVCache.append_step`'s views, read without a transpose).
    ``softcap``, ``alibi``, ``sinks`` as in :func:`softmax_attention`. Returns o [B, H, V].
    Scores and softmax in float32 or wider: in float32 and float64 without softcap and sinks, one SDPA
    call (no mask: the query sees every key; ALiBi's lags as its additive mask); otherwise the explicit
    scores and softmax.
    """
    B, H, K = q.shape
    Hkv, L = (keys.shape[1], keys.shape[2]) if heads_first else (keys.shape[2], keys.shape[1])
    if type(scale) is not float or not 0.0 < scale < math.inf:  # (a positive float, the common case: no call)
        scale = _scale(scale, K, "attention_decode")
    kh, vh = (keys, values) if heads_first else (keys.transpose(1, 2), values.transpose(1, 2))  # [B, Hkv, L, ·]
    if softcap is None and sinks is None and q.dtype in (torch.float32, torch.float64) and keys.dtype == values.dtype == q.dtype:
        bias = None
        if alibi is not None:  # ALiBi: the score of key l less slope_h · (L − 1 − l), as SDPA's additive mask
            lag = torch.arange(1 - L, 1, device=q.device, dtype=q.dtype)
            bias = (alibi.to(q.dtype).view(1, H, 1, 1) * lag)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), kh, vh, attn_mask=bias, scale=scale, enable_gqa=H != Hkv)  # [B, H, 1, V]
        return o.view(B, H, -1)
    dt = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    if autocast_enabled(q.device.type):  # (the explicit read below in dt: autocast off around it)
        with torch.autocast(q.device.type, enabled=False):
            return _decode_explicit(q, kh, vh, dt, scale, softcap, alibi, sinks).to(values.dtype)
    o = _decode_explicit(q, kh, vh, dt, scale, softcap, alibi, sinks)
    return o if o.dtype == values.dtype else o.to(values.dtype)


def _decode_explicit(q, kh, vh, dt, scale, softcap, alibi, sinks):
    """:func:`attention_decode`'s explicit read (soft-capping, sinks, half inputs): q [B, H, K], kh [B, Hkv, L, K],
    vh [B, Hkv, L, V] -> o [B, H, V] in ``dt`` (autocast off)."""
    B, H, K = q.shape
    Hkv, L = kh.shape[1], kh.shape[2]
    if q.dtype != dt:
        q = q.to(dt)
    if kh.dtype != dt:
        kh = kh.to(dt)
    if vh.dtype != dt:
        vh = vh.to(dt)
    qg = q.view(B, Hkv, H // Hkv, K)  # query heads grouped by the kv head they read
    bias = None
    if alibi is not None:
        lag = torch.arange(L - 1, -1, -1, device=q.device, dtype=dt)
        bias = -alibi.to(dt).view(1, Hkv, H // Hkv, 1) * lag
    s = _scores(qg, kh, scale, softcap, bias)  # [B, Hkv, G, L]
    if sinks is not None:
        z = sinks.to(dt).view(1, Hkv, H // Hkv, 1).expand(B, Hkv, H // Hkv, 1)
        p = torch.softmax(torch.cat([s, z], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return (p @ vh).reshape(B, H, -1)  # [B, Hkv, G, V] -> [B, H, V]


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
    """One decoding step with a functional KV cache (torch.cat per token: the reference of
    :class:`KVCache`).

    q [B, H, K], k [B, Hkv, K]; v [B, Hkv, V]; k_cache [B, L, Hkv, K], v_cache [B, L, Hkv, V] or
    None (empty). The cache holds the previous tokens this query may see (at most window - 1).
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
        check_shape("k_cache", k_cache, (q.shape[0], None, *k.shape[1:]), "[B, L, Hkv, K]", where)
        check_shape("v_cache", v_cache, (q.shape[0], k_cache.shape[1], *v.shape[1:]), "[B, L, Hkv, V]", where)
        keys = torch.cat([k_cache, keys], dim=1)
        values = torch.cat([v_cache, values], dim=1)
    if window is not None and keys.shape[1] > window:
        keys, values = keys[:, -window:], values[:, -window:]
    o = attention_decode(q, keys, values, scale=scale).to(v.dtype)
    k_new, v_new = kv_cache_trim(keys, values, window)
    return o, k_new, v_new


# --------------------------------------------------------------------------------------
# the KV cache in preallocated blocks
# --------------------------------------------------------------------------------------


def _owns_storage(t: torch.Tensor) -> bool:
    """Whether t is all of its tensor (not a view of a larger one, such as q and k rotated as one): a cache may keep
    it without keeping anything else alive. (By the view's base, which no aten op reads, where the storage itself
    would be read through an alias op per call.)"""
    base = t._base
    return t.storage_offset() == 0 and (base is None or base.numel() == t.numel())


class KVCache:
    """The keys and values of a softmax attention layer for decoding, in preallocated buffers.

    Buffers k [B, Hkv, C, K] and v [B, Hkv, C, V] (heads first, so that each head's keys are
    one contiguous [C, K] block for the read) hold the cached tokens in slots [start, end), in
    time order; ``keys`` / ``values`` are views of them in the ops' layout [B, L, Hkv, ·].

    * :meth:`append` writes new tokens into free slots: no torch.cat per token. When they do
      not fit, the buffers are reallocated: without a window the capacity C doubles (at least the
      tokens plus ``BLOCK`` slots), so a token costs amortized O(1) copies. A prefill into an empty
      cache without a window whose k and v are given away (``take=True``: the attention mixers') and
      are tensors of their own (no views of larger ones) keeps them as the buffers, not copied: the
      cache then holds exactly the prompt (a forward pass with a cache costs no copy) and the first
      decoding step moves it into buffers of ``BLOCK`` free slots (the given tensors are never
      written into). With a window w only the last
      w - 1 tokens are kept, moved to the front of a buffer of max(2(w - 1), w - 1 + BLOCK)
      slots (one move of w - 1 tokens every >= w - 1 appends). A multi-token append with a
      window attends over torch.cat(cache, new) once per call and keeps the last w - 1.
    * :meth:`append_step` writes one token (a decoding step) where it fits and returns the buffers'
      head-first views, the layout of the read and of transformers' cache.
    * While autograd records (grad enabled and a tensor that requires grad), appends are
      functional (torch.cat, no buffer written in place): the keys of earlier steps are saved
      for the backward pass, so writing into their buffer would invalidate it.
    * ``floats()`` / ``nbytes()`` count the used part (B·L·Hkv·(K + V)), as :class:`Cache` does
      for tensors; ``capacity`` says how many slots are allocated.
    * ``map_(fn)`` applies fn to both buffers (beam search's ``index_select`` on the batch,
      ``detach``, a device move): fn must act on the batch dimension or elementwise.
    * ``seen`` counts every token appended since the start: the absolute position of the next
      token (RoPE's positions), which a window's trimming does not change.
    """

    BLOCK = 64

    def __init__(self, window: int | None = None):
        _check_window(window, "KVCache")
        self.window = window
        self.k: torch.Tensor | None = None  # [B, Hkv, C, K]
        self.v: torch.Tensor | None = None  # [B, Hkv, C, V]
        self.start = self.end = 0
        self.seen = 0
        self._inference = False  # whether the buffers are inference tensors (:meth:`_set_buffers`)
        self._exact = False  # whether the buffers are a prefill's own keys and values (:meth:`append`)
        self._views = None  # (k, start, end, the head-first views): the last ones made (:meth:`head_first`)

    # -- views and sizes -------------------------------------------------------------------

    @property
    def keep(self) -> int | None:
        """Tokens kept after a call: all (None) or window - 1."""
        return None if self.window is None else self.window - 1

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    @property
    def keys(self) -> torch.Tensor | None:
        """[B, L, Hkv, K]: the cached keys (a view)."""
        return None if self.k is None else self.k[:, :, self.start : self.end].transpose(1, 2)

    @property
    def values(self) -> torch.Tensor | None:
        """[B, L, Hkv, V]: the cached values (a view)."""
        return None if self.v is None else self.v[:, :, self.start : self.end].transpose(1, 2)

    def head_first(self) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        """(k [B, Hkv, L, K], v [B, Hkv, L, V]): the cached keys and values in the buffers' own layout
        (views; transformers' cache layout)."""
        k, start, end = self.k, self.start, self.end
        if k is None:
            return None, None
        views = self._views  # (the views append_step made for this token: the same buffers, start and end)
        if views is not None and views[0] is k and views[1] == start and views[2] == end:
            return views[3]
        return k[:, :, start:end], self.v[:, :, start:end]

    def floats(self) -> int:
        if self.k is None:
            return 0
        B, H, _, K = self.k.shape
        return len(self) * B * H * (K + self.v.shape[-1]) * (2 if self.k.is_complex() else 1)

    def nbytes(self) -> int:
        if self.k is None:
            return 0
        B, H, _, K = self.k.shape
        return len(self) * B * H * (K * self.k.element_size() + self.v.shape[-1] * self.v.element_size())

    def map_(self, fn) -> "KVCache":
        if self.k is not None:
            exact = self._exact  # (fn keeps the slots: a prefill's exact buffers stay so, and grow by BLOCK first)
            self._set_buffers(fn(self.k), fn(self.v))
            self._exact = exact
        return self

    def __getstate__(self):  # (copies and pickles: the buffers, not the kept views, which a copy would not share)
        return {**self.__dict__, "_views": None}

    def __setstate__(self, state):
        self.__dict__.update({"_exact": False, **state})
        self._views = None  # (also for a cache pickled before the views were kept)
        self._inference = self.k is not None and self.k.is_inference()  # (a copy's buffers are its own tensors)

    def _set_buffers(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """The buffers [B, Hkv, C, ·], and whether they are inference tensors (known once here: a decoding step's
        test of :meth:`_functional` then reads a flag instead of calling the tensor)."""
        self.k, self.v = k, v
        self._inference = k.is_inference()
        self._views = None  # (views of the previous buffers would keep them alive)
        self._exact = False  # (whether the buffers are a prefill's own keys and values, with no free slot: append)

    # -- appending -------------------------------------------------------------------------

    def _store(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        """New buffers of ``capacity`` slots holding keys [B, L, Hkv, K], values [B, L, Hkv, V] in slots [0, L)
        (L = 0: empty buffers of their batch, heads, widths and dtypes, nothing copied)."""
        B, L, H, K = keys.shape
        self._set_buffers(keys.new_empty(B, H, capacity, K), values.new_empty(B, H, capacity, values.shape[-1]))
        if L:
            self.k[:, :, :L] = keys.transpose(1, 2)
            self.v[:, :, :L] = values.transpose(1, 2)
        self.start, self.end = 0, L

    def _functional(self, k, v) -> bool:
        """Whether this append must not write in place (autograd, or inference tensors outside inference mode)."""
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or (self.k is not None and self.k.requires_grad)):
            return True
        return self.k is not None and self._inference and not torch.is_inference_mode_enabled()

    def append(self, k: torch.Tensor, v: torch.Tensor, *, check_shapes: bool = True,
               take: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends T tokens k [B, T, Hkv, K], v [B, T, Hkv, V].

        Returns (keys, values) [B, L + T, Hkv, ·]: the cached tokens followed by the new ones,
        every key the new queries may see (the caller's window mask does the rest). They are
        views of the buffers, valid until the next append. The cache then keeps the last
        window - 1 of them (all without a window). ``check_shapes=False``: the first append's k and v are not
        checked (a caller that made them itself, as the attention mixers do); a later append is always compared
        with the buffers' batch, heads and widths. ``take=True``: k and v are given away (made for this call and
        never written afterwards, as the attention mixers' are): a prefill into an empty cache without a window whose
        k and v are tensors of their own keeps them as its buffers, without a copy; otherwise the cache copies them."""
        where = "KVCache.append"
        # (unchecked, an empty cache takes k and v as they come; against buffers the shapes are always compared: a
        # caller's x of another batch than the cache's must not write into it by broadcasting)
        fits = not check_shapes if self.k is None else (
            isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == v.dim() == 4
            and k.shape[1] == v.shape[1] > 0 and (k.shape[0], k.shape[2], k.shape[3]) == (self.k.shape[0], self.k.shape[1], self.k.shape[3])
            and (v.shape[0], v.shape[2], v.shape[3]) == (self.v.shape[0], self.v.shape[1], self.v.shape[3]))
        if not fits:  # the full checks (the first append, or a shape that is not the buffers'): each names what is wrong
            check_tensor("k", k, rank=4, layout="[B, T, Hkv, K]", where=where)
            check_tensor("v", v, rank=4, layout="[B, T, Hkv, V]", where=where)
            check_shape("v", v, (*k.shape[:3], None), "[B, T, Hkv, V]", where)
            if self.k is not None:
                B, H, _, K = self.k.shape
                check_shape("k", k, (B, None, H, K), "[B, T, Hkv, K] (the cache's B, Hkv, K)", where)
                check_shape("v", v, (B, None, H, self.v.shape[-1]), "[B, T, Hkv, V] (the cache's B, Hkv, V)", where)
        T = k.shape[1]
        self.seen += T
        L = len(self)
        if self._functional(k, v) or (self.window is not None and T > 1) or (self.k is not None and self.k.dtype != k.dtype):
            keys = k if L == 0 else torch.cat([self.keys.to(k.dtype), k], 1)
            values = v if L == 0 else torch.cat([self.values.to(v.dtype), v], 1)
            keep = keys.shape[1] if self.keep is None else min(self.keep, keys.shape[1])
            if self._functional(k, v):  # the buffers are the cat itself (full: the next append reallocates)
                self._set_buffers(keys.transpose(1, 2), values.transpose(1, 2))
                self.start, self.end = keys.shape[1] - keep, keys.shape[1]
            else:
                self._store(keys[:, keys.shape[1] - keep :], values[:, values.shape[1] - keep :], self._capacity(keep))
            return keys, values
        if take and L == 0 and self.keep is None and T > 1 and _owns_storage(k) and _owns_storage(v):
            # a prefill whose keys and values are tensors of their own: they are the buffers as they are (no copy; full,
            # so the first decoding step moves them into buffers with room, as transformers' cache concatenates)
            self._set_buffers(k.transpose(1, 2), v.transpose(1, 2))
            self.start, self.end, self._exact = 0, T, True
        elif L == 0 and (self.k is None or T > self.capacity):
            self._store(k, v, self._capacity(T))  # an empty cache: the new tokens are the new buffers' first
        else:
            if self.k is None or self.end + T > self.capacity:
                self._store(self.keys, self.values, self._capacity(L + T))
            self.k[:, :, self.end : self.end + T] = k.transpose(1, 2)
            self.v[:, :, self.end : self.end + T] = v.transpose(1, 2)
            self.end += T
        keys, values = self.keys, self.values
        if self.keep is not None:
            self.start = max(self.start, self.end - self.keep)
        return keys, values

    def append_step(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One token (a decoding step) written into the next free slot, in place: k [B, 1, Hkv, K], v [B, 1, Hkv, V]
        of the buffers' batch, heads, widths and dtype. Returns (keys [B, Hkv, L + 1, K], values [B, Hkv, L + 1, V]):
        head-first views of every key the new query sees (as :meth:`append`'s, heads first: the read takes them
        without a transpose), valid until the next append; or None, writing nothing, where the token does not fit
        the buffers so (no buffers yet, no free slot, another shape or dtype, a functional append under autograd):
        the caller then runs :meth:`append`."""
        kb, vb = self.k, self.v
        # (_functional inline: a call fewer per step)
        if kb is None or self.end >= kb.shape[2] or k.dtype != kb.dtype or v.dtype != vb.dtype \
                or (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or kb.requires_grad)) \
                or (self._inference and not torch.is_inference_mode_enabled()):
            return None
        B, H, _, K = kb.shape
        if k.shape != (B, 1, H, K) or v.shape != (B, 1, H, vb.shape[3]):
            return None
        e, start = self.end, self.start
        kb[:, :, e:e + 1] = k.view(B, H, 1, K)  # (a view: the token axis has size 1)
        vb[:, :, e:e + 1] = v.view(B, H, 1, -1)
        self.end, self.seen = e + 1, self.seen + 1
        if self.window is not None:
            self.start = max(start, self.end - self.window + 1)
        views = kb[:, :, start:e + 1], vb[:, :, start:e + 1]
        self._views = (kb, start, e + 1, views)  # (head_first's, while the buffers, start and end are these)
        return views

    def _capacity(self, need: int) -> int:
        """Slots of a new buffer that must hold ``need`` tokens: doubling without a window (and room for
        ``BLOCK`` more: the decoding steps after a prefill), bounded with one."""
        if self.window is None:  # (buffers that are a prefill's own tensors grow by BLOCK first: no doubling of a long prompt's)
            return need + self.BLOCK if self._exact else max(2 * self.capacity, need + self.BLOCK)
        return max(2 * self.keep, self.keep + self.BLOCK, need)
