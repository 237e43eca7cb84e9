"""Stick-breaking attention (Tan et al. 2024, "Scaling Stick-Breaking Attention") as a pure op.

Query i breaks a stick of length 1 over the keys it sees, nearest first: key j takes the share
β_{i,j} of what the nearer keys left,

    z_{i,j} = s · q_iᵀ k_j,    β_{i,j} = σ(z_{i,j})
    A_{i,j} = β_{i,j} Π_{j<l<i} (1 − β_{i,l})                                    (arXiv:2410.17980)
    o_i     = Σ_{j<i} A_{i,j} v_j  (+ r_i v_i),    r_i = 1 − Σ_j A_{i,j} = Π_{j<i} (1 − β_{i,j})

No softmax normalization: the weights of a row sum to at most 1. In log space (stable for
any logit): log A_{i,j} = logσ(z_{i,j}) + Σ_{j<l<i} logσ(−z_{i,l}), a reverse cumulative sum
along the row.

Options (the paper and its released code; fla's ``naive_stickbreaking_attn`` has the same
``attend_current``):

* ``attend_current``: False (the paper): keys j < i, the product over j < l < i; True: keys
  j <= i, the product over j < l <= i.
* ``remainder``: "current" (the authors' code and tests: o_i + r_i v_i, the stick left over
  goes to the query's own value, so a row of the map sums to 1), or "drop" (o_i as is, as
  fla's naive op returns it, with r_i beside it).

Shapes (queries are the last Tq of the Tk positions, as when new tokens are appended to a
cache): q [B, Tq, H, K], k [B, Tk, H, K], v [B, Tk, H, V] -> o [B, Tq, H, V]; the map
[B, H, Tq, Tk] (:func:`stickbreaking_probs`, the remainder on the query's own column with
"current").

Modes:

* ``parallel``: the reference, the explicit [Tq, Tk] log-weight matrix with a reverse cumsum
  per row.
* ``chunk``: the FlashAttention-style form of the authors' kernel: key blocks of
  ``chunk_size`` visited from the nearest to the farthest, each query carrying the log of the
  stick left by the nearer blocks; memory O(Tq·chunk_size) per head for the forward pass (the
  Python loop runs over block distances, every query block at once).

Decoding needs only the past keys and values (a KV cache): the query's weights depend on its
own logits against them. Precision: logits, logσ and the cumulative sums in float32 or wider.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_choice, check_finite
from .attention import _check_appended_qkv, _scale
from .precision import autocast_off, compute_dtype

MODES = ("parallel", "chunk")
REMAINDERS = ("current", "drop")

_WHERE = "stickbreaking_attention"


def _check(q, k, v, where, remainder="drop"):
    _check_appended_qkv(q, k, v, where)
    check_choice("remainder", remainder, REMAINDERS, where)


def _visible(Tq, Tk, attend_current, device):
    """[Tq, Tk] bool: key j is broken by query i (i at position Tk − Tq + i)."""
    qpos = torch.arange(Tk - Tq, Tk, device=device)[:, None]
    kpos = torch.arange(Tk, device=device)[None, :]
    return kpos <= qpos if attend_current else kpos < qpos


def _log_weights(z, visible):
    """log A [.., Tq, Tk] (−inf where not visible) and log r [.., Tq] from logits z."""
    log_rest = F.logsigmoid(-z).masked_fill(~visible, 0.0)  # log(1 − β); 0 leaves the stick unchanged
    after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest  # Σ_{l > j, visible} log(1 − β_{i,l})
    log_a = (F.logsigmoid(z) + after).masked_fill(~visible, float("-inf"))
    return log_a, log_rest.sum(-1)


def stickbreaking_probs(
    q, k, *, scale: float | None = None, attend_current: bool = False, remainder: str = "current", check_values: bool = True,
) -> torch.Tensor:
    """The map [B, H, Tq, Tk] (float32 or wider): A_{i,j}, plus r_i on the query's own column
    with ``remainder="current"``. Arguments as :func:`stickbreaking_attention`."""
    where = "stickbreaking_probs"
    _check(q, k, None, where, remainder)
    s = _scale(scale, q.shape[-1], where)
    if check_values:
        check_finite("q", q, where)
        check_finite("k", k, where)
    Tq, Tk = q.shape[1], k.shape[1]
    dt = compute_dtype(q, k)
    with autocast_off(q.device.type):
        z = (q.to(dt).transpose(1, 2) @ k.to(dt).transpose(1, 2).transpose(-1, -2)) * s  # [B, H, Tq, Tk]
        log_a, log_r = _log_weights(z, _visible(Tq, Tk, attend_current, q.device))
        a = log_a.exp()
        if remainder == "current":
            a = a + F.pad(torch.diag_embed(log_r.exp()), (Tk - Tq, 0))  # r_i on the query's own column
    return a


def _parallel(q, k, v, s, attend_current):
    Tq, Tk = q.shape[1], k.shape[1]
    z = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) * s
    log_a, log_r = _log_weights(z, _visible(Tq, Tk, attend_current, q.device))
    return (log_a.exp() @ v.transpose(1, 2)).transpose(1, 2), log_r.transpose(1, 2)


def _chunk(q, k, v, s, attend_current, C):
    """Key blocks from the nearest to the farthest; block distance δ for every query block at once."""
    B, Tq, H, K = q.shape
    Tk, V = k.shape[1], v.shape[-1]
    n = -(-Tq // C)  # query blocks
    pad_end = n * C - Tq
    m = -(-(Tk - Tq) // C)  # prefix blocks (cached keys), left-padded to whole blocks
    pad_start = m * C - (Tk - Tq)
    qb = F.pad(q, (0, 0, 0, 0, 0, pad_end)).transpose(1, 2).reshape(B, H, n, C, K)
    kb = F.pad(k, (0, 0, 0, 0, pad_start, pad_end)).transpose(1, 2).reshape(B, H, m + n, C, K)
    vb = F.pad(v, (0, 0, 0, 0, pad_start, pad_end)).transpose(1, 2).reshape(B, H, m + n, C, V)
    real = torch.ones(Tk, dtype=torch.bool, device=q.device)
    real = F.pad(real, (pad_start, pad_end), value=False).view(m + n, C)  # [m + n, C]: not a padding key
    ar = torch.arange(C, device=q.device)
    diag = (ar[None, :] <= ar[:, None]) if attend_current else (ar[None, :] < ar[:, None])  # [C, C]
    o = q.new_zeros(B, H, n, C, V)
    log_r = q.new_zeros(B, H, n, C)  # log of the stick left after the blocks visited so far
    for delta in range(m + n):
        a0 = max(0, delta - m)  # query blocks a >= a0 see key block m + a − δ >= 0
        kbi = torch.arange(m + a0 - delta, m + n - delta, device=q.device)
        z = (qb[:, :, a0:] @ kb[:, :, kbi].transpose(-1, -2)) * s  # [B, H, n − a0, C, C]
        visible = real[kbi][:, None, :].expand(-1, C, -1)
        if delta == 0:
            visible = visible & diag
        log_a, log_rest = _log_weights(z, visible)
        log_a = log_a + log_r[:, :, a0:, :, None]
        o = o.index_add(2, torch.arange(a0, n, device=q.device), log_a.exp() @ vb[:, :, kbi])
        log_r = log_r.index_add(2, torch.arange(a0, n, device=q.device), log_rest)
    o = o.reshape(B, H, n * C, V)[:, :, :Tq].transpose(1, 2)
    return o, log_r.reshape(B, H, n * C)[:, :, :Tq].transpose(1, 2)


def stickbreaking_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    attend_current: bool = False,
    remainder: str = "current",
    mode: str = "parallel",
    chunk_size: int = 64,
    return_remainder: bool = False,
    check_values: bool = True,
):
    """Stick-breaking attention; see the module docstring.

    Args:
        q [B, Tq, H, K], k [B, Tk, H, K], v [B, Tk, H, V] (queries: the last Tq positions).
        scale: multiplies qᵀk; None = 1/sqrt(K).
        attend_current: a query also breaks the stick on its own key (j <= i).
        remainder: "current" (o_i + r_i v_i) or "drop" (o_i).
        mode: "parallel" (the reference) or "chunk"; "auto" = "chunk" when Tq > chunk_size, else "parallel".
        chunk_size: key/query block length of the chunk mode.
        return_remainder: also return r_i = 1 − Σ_j A_{i,j}, [B, Tq, H].

    Returns:
        o [B, Tq, H, V] in v's dtype (and r [B, Tq, H] in float32 or wider).
    """
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    _check(q, k, v, _WHERE, remainder)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{_WHERE}: argument 'chunk_size' must be an integer >= 1, got {chunk_size!r}")
    s = _scale(scale, q.shape[-1], _WHERE)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v)):
            check_finite(name, t, _WHERE)
    if mode == "auto":
        mode = "chunk" if q.shape[1] > chunk_size else "parallel"
    dt = compute_dtype(q, k, v)
    with autocast_off(q.device.type):
        qf, kf, vf = q.to(dt), k.to(dt), v.to(dt)
        o, log_r = _parallel(qf, kf, vf, s, attend_current) if mode == "parallel" else _chunk(qf, kf, vf, s, attend_current, chunk_size)
        r = log_r.exp()
        if remainder == "current":
            o = o + r.unsqueeze(-1) * vf[:, k.shape[1] - q.shape[1] :]
    o = o.to(v.dtype)
    return (o, r) if return_remainder else o
