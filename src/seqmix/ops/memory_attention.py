"""Sliding-window attention whose keys are extended, chunk by chunk, by memory tokens: the
attention of B'MOJO (paper §3.3, App. B.2, Fig. 6; bmojo note §4.5).

Queries are raw tokens at absolute positions start .. start+T-1, cut into chunks of length c
(chunk of position p: p // c, aligned at multiples of c). A query at position p sees

* the raw tokens s with 0 <= p - s < w (its last w tokens, itself included), and
* the m memory tokens of its own chunk (those marked valid), never another chunk's.

Shapes (the layout of ``seqmix.ops.attention``):

    q                [B, T, H, K]       queries (positions start .. start+T-1)
    k, v             [B, Tk, H, K|V]    raw keys at positions start+T-Tk .. start+T-1
                                        (Tk - T cached earlier tokens first)
    k_mem, v_mem     [B, G, m, H, K|V]  memory block g for chunk start//c + g
    mem_valid        [B, G, m] bool     (slots that do not exist yet, e.g. in chunk 0)
    o                [B, T, H, V]

G = the number of chunks the queries touch (:func:`n_chunks`).

Modes:

* ``parallel`` (the reference): every memory block and every raw key in one key list
  [G·m + Tk], the explicit mask of :func:`memory_attention_mask`, softmax of the masked score
  matrix. Memory O(T·(G·m + Tk)).
* ``chunk`` (the paper's efficient implementation): each chunk prefixed by its memory tokens
  and preceded by the raw tokens of the r = ceil((w-1)/c) chunks before it, i.e. the tile
  [raw_{g-r} .. raw_{g-1}, memory_g, raw_g] of the interleaved sequence of Fig. 6, then causal
  sliding-window attention with window K = w + m inside every tile (one batched SDPA over the
  tiles). With c = w (the paper) the tile is the interleaved sequence [memory_0, chunk_0,
  memory_1, chunk_1, ...] of App. B.2 seen through a sliding window of K = w + m_f + m_e,
  minus the keys that window never reaches (the previous chunk's memory). Time and memory
  O(T·(w + m)): linear in T. The sequence is padded to whole chunks and the tile's raw span to
  whole chunks (the padding is masked), so any c <= w works.

Why the window is K = w + m (the index property; :func:`interleave_positions` and the tests
check it at mask level): query j of a tile sits at tile position r·c + m + j. A raw key i of
the span before the chunk is r·c + m + j - i positions away, i.e. within K iff its raw lag
r·c + j - i is < w; a memory slot i' is m + j - i' < m + c <= K away (always seen); a raw key of
the chunk itself is seen iff it is not in the future. With c > w a token late in a chunk
would be farther than K from its memory: impossible, so c <= w is required.

A query that sees no key at all (only possible for padded rows) gets o = 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .._checks import check_choice, check_finite, check_tensor, fmt_shape
from .attention import attention_mask

MODES = ("parallel", "chunk")

_WHERE = "chunked_memory_attention"

__all__ = [
    "chunked_memory_attention", "memory_attention_mask", "interleave_positions", "tile_mask", "n_chunks", "MODES",
]


def n_chunks(start: int, T: int, chunk: int) -> int:
    """Chunks of length ``chunk`` (aligned at multiples of it) that positions start..start+T-1 touch."""
    return (start + T - 1) // chunk - start // chunk + 1


def _span_chunks(window: int, chunk: int) -> int:
    """r: whole chunks of raw tokens before a chunk that its queries' windows reach."""
    return -(-(window - 1) // chunk)


def _check_geometry(window, chunk, start, where):
    for name, val, lo in (("window", window, 1), ("chunk", chunk, 1), ("start", start, 0)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{where}: argument '{name}' must be an integer >= {lo}, got {val!r}")
    if chunk > window:
        raise ValueError(
            f"{where}: argument 'chunk' = {chunk} must be <= window = {window}: in the interleaved sequence a token "
            f"late in a longer chunk is farther than K = window + memory from its chunk's memory tokens"
        )


# ------------------------------------------------------------------------------------------
# masks
# ------------------------------------------------------------------------------------------


def memory_attention_mask(
    T: int,
    Tk: int | None = None,
    *,
    window: int,
    chunk: int,
    n_mem: int,
    start: int = 0,
    mem_valid: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
    device=None,
) -> torch.Tensor:
    """The reference mask over the keys [memory block 0, ..., memory block G-1, raw keys]:
    [T, G·m + Tk] bool, or [B, 1, T, G·m + Tk] with ``mem_valid`` [B, G, m] / ``key_valid`` [B, Tk]."""
    where = "memory_attention_mask"
    Tk = T if Tk is None else Tk
    _check_geometry(window, chunk, start, where)
    if Tk < T:
        raise ValueError(f"{where}: the raw keys (Tk = {Tk}) must include the T = {T} queries' own tokens")
    G = n_chunks(start, T, chunk)
    raw = attention_mask(T, Tk, window=window, device=device)  # queries are the last T raw keys
    group = (start + torch.arange(T, device=device)) // chunk - start // chunk  # [T]
    mem = (group.unsqueeze(1) == torch.arange(G, device=device).repeat_interleave(n_mem).unsqueeze(0))  # [T, G·m]
    mask = torch.cat([mem, raw], 1)
    if mem_valid is None and key_valid is None:
        return mask
    Bt = (mem_valid if mem_valid is not None else key_valid).shape[0]
    valid = torch.ones(Bt, G * n_mem + Tk, dtype=torch.bool, device=mask.device)
    if mem_valid is not None:
        if mem_valid.shape != (Bt, G, n_mem):
            raise ValueError(f"{where}: argument 'mem_valid' must be [B, G, m] = [{Bt}, {G}, {n_mem}], got {fmt_shape(mem_valid.shape)}")
        valid[:, : G * n_mem] = mem_valid.reshape(Bt, G * n_mem)
    if key_valid is not None:
        if key_valid.shape != (Bt, Tk):
            raise ValueError(f"{where}: argument 'key_valid' must be [B, Tk] = [{Bt}, {Tk}], got {fmt_shape(key_valid.shape)}")
        valid[:, G * n_mem :] = key_valid
    return mask & valid[:, None, None, :]


def tile_mask(window: int, chunk: int, n_mem: int, device=None) -> torch.Tensor:
    """The causal sliding window of K = window + n_mem inside one tile [raw span (r·c), memory (m),
    chunk (c)]: [c, (r+1)·c + m] bool (before any validity)."""
    r = _span_chunks(window, chunk)
    return attention_mask(chunk, r * chunk + n_mem + chunk, window=window + n_mem, offset=r * chunk + n_mem, device=device)


def interleave_positions(L: int, window: int, n_mem: int, device=None):
    """Where each token sits in the paper's interleaved sequence [memory_0, chunk_0, memory_1,
    chunk_1, ...] (chunks of length window, from position 0): returns (raw [L], memory [C, m])
    positions, C = ceil(L / window). Sliding-window attention of window + n_mem over that
    sequence (``attention_mask``) restricted to raw queries is :func:`memory_attention_mask`."""
    C = -(-L // window)
    t = torch.arange(L, device=device)
    raw = (t // window) * (window + n_mem) + n_mem + t % window
    mem = torch.arange(C, device=device).unsqueeze(1) * (window + n_mem) + torch.arange(n_mem, device=device).unsqueeze(0)
    return raw, mem


# ------------------------------------------------------------------------------------------
# the op
# ------------------------------------------------------------------------------------------


def _check(q, k, v, k_mem, v_mem, mem_valid, key_valid, G, where):
    check_tensor("q", q, rank=4, layout="[B, T, H, K]", where=where)
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    check_tensor("v", v, rank=4, layout="[B, Tk, H, V]", where=where)
    check_tensor("k_mem", k_mem, rank=5, layout="[B, G, m, H, K]", where=where)
    check_tensor("v_mem", v_mem, rank=5, layout="[B, G, m, H, V]", where=where)
    B, T, H, K = q.shape
    Tk, V, m = k.shape[1], v.shape[-1], k_mem.shape[2]
    if T == 0 or k.shape != (B, Tk, H, K) or Tk < T:
        raise ValueError(f"{where}: argument 'k' must be [B, Tk, H, K] with Tk >= T = {T} (the queries' own tokens last), got {fmt_shape(k.shape)} for q {fmt_shape(q.shape)}")
    if v.shape[:3] != (B, Tk, H):
        raise ValueError(f"{where}: argument 'v' must be [B, Tk, H, V] = [{B}, {Tk}, {H}, ?], got {fmt_shape(v.shape)}")
    if k_mem.shape != (B, G, m, H, K):
        raise ValueError(f"{where}: argument 'k_mem' must be [B, G, m, H, K] with G = {G} chunks touched, got {fmt_shape(k_mem.shape)}")
    if v_mem.shape != (B, G, m, H, V):
        raise ValueError(f"{where}: argument 'v_mem' must be [B, G, m, H, V] = {fmt_shape((B, G, m, H, V))}, got {fmt_shape(v_mem.shape)}")
    if mem_valid is not None and (mem_valid.shape != (B, G, m) or mem_valid.dtype != torch.bool):
        raise ValueError(f"{where}: argument 'mem_valid' must be a bool tensor [B, G, m] = [{B}, {G}, {m}], got {fmt_shape(mem_valid.shape)}")
    if key_valid is not None and (key_valid.shape != (B, Tk) or key_valid.dtype != torch.bool):
        raise ValueError(f"{where}: argument 'key_valid' must be a bool tensor [B, Tk] = [{B}, {Tk}], got {fmt_shape(key_valid.shape)}")
    return B, T, H, K, Tk, V, m


def _compute_dtype(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _parallel(q, k, v, k_mem, v_mem, mask, scale):
    """The reference: explicit scores over [memory blocks ; raw keys], masked softmax."""
    B, T, H, K = q.shape
    G, m = k_mem.shape[1], k_mem.shape[2]
    dt = _compute_dtype(q.dtype)
    keys = torch.cat([k_mem.reshape(B, G * m, H, K), k], 1).to(dt)
    vals = torch.cat([v_mem.reshape(B, G * m, H, v.shape[-1]), v], 1).to(dt)
    scores = torch.einsum("bthk,bshk->bhts", q.to(dt), keys) * scale
    mask = mask if mask.dim() == 4 else mask[None, None]
    empty = ~mask.any(-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(~(mask | empty), float("-inf")), -1).masked_fill(empty, 0.0)
    o = torch.einsum("bhts,bshv->bthv", probs, vals)
    return o.to(v.dtype), probs


def _on_grid(x, first, grid0, n_grid):
    """x [B, n, ...] holding positions first..first+n-1 -> [B, n_grid, ...] holding grid0.., zeros elsewhere."""
    left = first - grid0
    if left < 0:
        x, left = x[:, -left:], 0
    right = n_grid - left - x.shape[1]
    if right < 0:
        x, right = x[:, : x.shape[1] + right], 0
    pad = [0, 0] * (x.dim() - 2) + [left, right]
    return F.pad(x, pad)


def _tiles(x, G, c, r):
    """[B, (G+r)·c, ...] -> [B, G, (r+1)·c, ...]: chunk g with the r chunks before it."""
    t = x.unfold(1, (r + 1) * c, c)  # [B, G, ..., (r+1)c]
    return t.movedim(-1, 2)


def _chunk(q, k, v, k_mem, v_mem, mem_valid, key_valid, window, c, start, scale):
    B, T, H, K = q.shape
    Tk, V, m = k.shape[1], v.shape[-1], k_mem.shape[2]
    G = n_chunks(start, T, c)
    r = _span_chunks(window, c)
    c0 = start // c
    grid0, n_grid = (c0 - r) * c, (G + r) * c
    first = start + T - Tk
    kg, vg = _on_grid(k, first, grid0, n_grid), _on_grid(v, first, grid0, n_grid)
    avail = torch.ones(B, Tk, dtype=torch.bool, device=q.device) if key_valid is None else key_valid
    pos = grid0 + torch.arange(n_grid, device=q.device)
    valid = _on_grid(avail.to(torch.uint8).unsqueeze(-1), first, grid0, n_grid).squeeze(-1).bool() & (pos >= 0)
    span_k, span_v, span_ok = _tiles(kg, G, c, r), _tiles(vg, G, c, r), _tiles(valid, G, c, r)
    rc = r * c
    keys = torch.cat([span_k[:, :, :rc], k_mem, span_k[:, :, rc:]], 2)  # [B, G, rc + m + c, H, K]
    vals = torch.cat([span_v[:, :, :rc], v_mem, span_v[:, :, rc:]], 2)
    mv = mem_valid if mem_valid is not None else torch.ones(B, G, m, dtype=torch.bool, device=q.device)
    ok = torch.cat([span_ok[:, :, :rc], mv, span_ok[:, :, rc:]], 2)  # [B, G, n_keys]
    mask = tile_mask(window, c, m, device=q.device) & ok.unsqueeze(2)  # [B, G, c, n_keys]
    empty = ~mask.any(-1, keepdim=True)
    qg = _on_grid(q, start, c0 * c, G * c).view(B, G, c, H, K)

    def heads(t):  # [B, G, n, H, E] -> [B·G, H, n, E]
        return t.flatten(0, 1).transpose(1, 2)

    dt = _compute_dtype(q.dtype)
    o = F.scaled_dot_product_attention(
        heads(qg).to(dt), heads(keys).to(dt), heads(vals).to(dt), attn_mask=(mask | empty).flatten(0, 1).unsqueeze(1), scale=scale
    )  # [B·G, H, c, V]
    o = o.masked_fill(empty.flatten(0, 1).unsqueeze(1), 0.0)
    o = o.transpose(1, 2).reshape(B, G * c, H, V)
    lead = start - c0 * c
    return o[:, lead : lead + T].to(v.dtype)


def chunked_memory_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_mem: torch.Tensor,
    v_mem: torch.Tensor,
    *,
    window: int,
    chunk: int | None = None,
    start: int = 0,
    mem_valid: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
    scale: float | None = None,
    mode: str = "chunk",
    return_probs: bool = False,
    check_values: bool = True,
):
    """Sliding-window attention (window w) plus each chunk's memory tokens (module docstring).

    Args:
        q [B, T, H, K]; k [B, Tk, H, K], v [B, Tk, H, V] (the queries' own tokens last);
        k_mem [B, G, m, H, K], v_mem [B, G, m, H, V]; mem_valid [B, G, m]; key_valid [B, Tk].
        window: w >= 1 raw tokens per query (itself included).
        chunk: chunk length c, 1 <= c <= w (default w, the paper's).
        start: absolute position of query 0 (chunks are aligned at multiples of c).
        scale: multiplies qᵀk (None: 1/sqrt(K)).
        mode: "parallel" (explicit-mask reference) or "chunk" (the interleaved tiles).
        return_probs: mode "parallel" only: also return the attention matrix [B, H, T, G·m + Tk]
            over the keys [memory blocks ; raw keys].

    Returns o [B, T, H, V] (and probs).
    """
    check_choice("mode", mode, MODES, _WHERE)
    chunk = window if chunk is None else chunk
    _check_geometry(window, chunk, start, _WHERE)
    G = n_chunks(start, q.shape[1], chunk) if isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[1] else 1
    B, T, H, K, Tk, V, m = _check(q, k, v, k_mem, v_mem, mem_valid, key_valid, G, _WHERE)
    if scale is None:
        scale = 1.0 / math.sqrt(K)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v), ("k_mem", k_mem), ("v_mem", v_mem)):
            check_finite(name, t, _WHERE)
    if return_probs and mode != "parallel":
        raise ValueError(f"{_WHERE}: return_probs needs mode 'parallel' (the chunk mode never forms the matrix), got mode {mode!r}")
    if mode == "parallel":
        mask = memory_attention_mask(
            T, Tk, window=window, chunk=chunk, n_mem=m, start=start, mem_valid=mem_valid, key_valid=key_valid, device=q.device
        )
        o, probs = _parallel(q, k, v, k_mem, v_mem, mask, scale)
        return (o, probs) if return_probs else o
    return _chunk(q, k, v, k_mem, v_mem, mem_valid, key_valid, window, chunk, start, scale)
