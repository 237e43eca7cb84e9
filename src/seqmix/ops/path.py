"""PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations") as a pure op.

Between key j and query i the positions are encoded by the product of the data-dependent
Householder-like factors of the tokens in between,

    H_t = I − β_t w_t w_tᵀ                     (w_t unit norm, β_t ∈ (0, 2): eigenvalues 1 − β_t and 1)
    P_{i,j} = H_i H_{i−1} ⋯ H_{j+1}             (P_{i,i} = I)
    o_i = Σ_{j<=i} softmax_j(s · q_iᵀ P_{i,j} k_j + b_{i,j}) v_j                  (the PaTH paper)

with an optional forget-gate bias b_{i,j} = c_i − c_j, c_t = Σ_{l<=t} log f_l (PaTH-FoX). In the
recurrent view the key of token j is carried forward to the current position, k_j ← H_t k_j at
every later t, and a query reads the carried keys: score(i, j) = q_iᵀ k_j^{(i)}.

Shapes (queries are the last Tq of the Tk positions; the first L = Tk − Tq keys are a cache):

    q    [B, Tq, H, K]
    k    [B, Tk, H, K]   the first L keys already carried to position L − 1 (just before the
                         first query, as a decoding cache stores them), the last Tq raw
    v    [B, Tk, H, V]
    w    [B, Tq, H, K], beta [B, Tq, H]: the factors H_t of the Tq new positions
    c    [B, Tk, H] or None: the cumulative log forget gate at every key position
    o    [B, Tq, H, V];  keys carried to the last position [B, Tk, H, K] (output_final_keys)

Modes (the score matrix S_{i,j} = q_iᵀ P_{i,j} k_j; the softmax is the same afterwards):

* ``parallel``: the reference, every product P_{i,j} formed explicitly as a K×K matrix,
  O(T² K²) and O(T²) Python steps: tiny T only.
* ``recurrent``: the decoding algorithm over the sequence: at each t every earlier key is
  carried by H_t (a rank-one update, O(T K)), then the query reads them: O(T² K).
* ``chunk``: the UT-transform (WY) form of the PaTH paper and fla's kernels. In a chunk of C positions the product of its
  factors is I − Wᵀ Z with (I + tril₋₁(diag(β) W Wᵀ)) Z = diag(β) W (one unit-triangular
  solve); the same solve gives the intra-chunk scores, the queries carried back to the chunk
  start and the keys carried to the chunk end, and a loop over chunk distances (every chunk
  at once) carries the queries back across whole chunks: O(T² K) in matmuls.

The bias of the forget gate: FoX adds c_i − c_j to the scaled logit; flash-linear-attention's
PaTH kernels (and naive_path_attn) add it before the scale, (q_iᵀP k_j + c_i − c_j)·s.
``gate_scaled`` picks (default True: fla's, the authors' implementation).

Precision: half inputs are computed in float32 (the carried keys, the solve, the softmax).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_choice, check_finite, check_shape, check_tensor
from .attention import _check_appended_qkv, _scale
from .precision import autocast_off, compute_dtype

MODES = ("parallel", "recurrent", "chunk")

_WHERE = "path_attention"


def _check(q, k, v, w, beta, c, where):
    _check_appended_qkv(q, k, v, where)
    (B, Tq, H, K), Tk = q.shape, k.shape[1]
    check_tensor("w", w, rank=4, layout="[B, Tq, H, K]", where=where)
    check_shape("w", w, (B, Tq, H, K), "[B, Tq, H, K] (one Householder vector per new position)", where)
    check_tensor("beta", beta, rank=3, layout="[B, Tq, H]", where=where)
    check_shape("beta", beta, (B, Tq, H), "[B, Tq, H]", where)
    if c is not None:
        check_tensor("c", c, rank=3, layout="[B, Tk, H]", where=where)
        check_shape("c", c, (B, Tk, H), "[B, Tk, H] (cumulative log forget gate at every key position)", where)


def householder(w: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """H_t = I − β_t w_t w_tᵀ as explicit matrices: w [..., K], beta [...] -> [..., K, K]."""
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    return eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]


# --------------------------------------------------------------------------------------
# the three ways to the score matrix S_{i,j} = q_iᵀ P_{i,j} k_j ([B, H, Tq, Tk], no mask)
# --------------------------------------------------------------------------------------


def _scores_parallel(q, k, w, beta, final):
    """The reference: P_{i,j} as explicit K×K products. q [B, H, Tq, K], k [B, H, Tk, K]."""
    B, H, Tq, K = q.shape
    L = k.shape[2] - Tq
    Hm = householder(w, beta)  # [B, H, Tq, K, K]
    eye = torch.eye(K, dtype=q.dtype, device=q.device).expand(B, H, K, K)
    rows = []
    for i in range(Tq):
        row = [None] * (L + Tq)
        P = eye
        row[L + i] = (q[:, :, i, None, :] @ k[:, :, L + i, :, None])[..., 0, 0]
        for j in range(i - 1, -1, -1):
            P = P @ Hm[:, :, j + 1]  # H_i ⋯ H_{j+1}
            row[L + j] = (q[:, :, i, None, :] @ P @ k[:, :, L + j, :, None])[..., 0, 0]
        zero = torch.zeros_like(row[L + i])
        for j in range(i + 1, Tq):
            row[L + j] = zero
        if L:
            P = P @ Hm[:, :, 0]  # the cached keys sit at position L − 1: carried by H_i ⋯ H_0
            pre = (q[:, :, i, None, :] @ P @ k[:, :, :L].transpose(-1, -2))[..., 0, :]  # [B, H, L]
            row[:L] = list(pre.unbind(-1))
        rows.append(torch.stack(row, -1))
    S = torch.stack(rows, 2)
    keys = None
    if final:  # every key carried to the last position: H_{Tq−1} ⋯ H_{j+1} k_j
        out = [None] * (L + Tq)
        P = eye
        for j in range(Tq - 1, -1, -1):
            out[L + j] = (P @ k[:, :, L + j, :, None])[..., 0]
            P = P @ Hm[:, :, j]
        if L:
            out[:L] = list((k[:, :, :L] @ P.transpose(-1, -2)).unbind(2))
        keys = torch.stack(out, 2)
    return S, keys


def _scores_recurrent(q, k, w, beta, final):
    """The decoding algorithm: at step t carry every earlier key by H_t, then read them."""
    B, H, Tq, K = q.shape
    Tk = k.shape[2]
    L = Tk - Tq
    keys = k
    pos = torch.arange(Tk, device=q.device)
    rows = []
    for t in range(Tq):
        before = (pos < L + t).to(q.dtype)[:, None]  # keys at earlier positions are carried by H_t
        proj = (keys @ w[:, :, t, :, None]) * beta[:, :, t, None, None]  # β_t (k_jᵀ w_t) [B, H, Tk, 1]
        keys = keys - before * proj * w[:, :, t, None, :]
        rows.append((keys @ q[:, :, t, :, None])[..., 0])  # [B, H, Tk]
    return torch.stack(rows, 2), keys if final else None


def _scores_chunk(q, k, w, beta, final, C):
    """The UT-transform form, chunks of C positions (see the module docstring)."""
    B, H, Tq, K = q.shape
    Tk = k.shape[2]
    L = Tk - Tq
    n = -(-Tq // C)
    pad = n * C - Tq
    # padded positions: w = 0, β = 0 (H = I), q = k = 0
    Qc = F.pad(q, (0, 0, 0, pad)).view(B, H, n, C, K)
    Kc = F.pad(k[:, :, L:], (0, 0, 0, pad)).view(B, H, n, C, K)
    Wc = F.pad(w, (0, 0, 0, pad)).view(B, H, n, C, K)
    bc = F.pad(beta, (0, pad)).view(B, H, n, C, 1)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    # (I + tril₋₁(diag(β) W Wᵀ)) [Z | A] = [diag(β) W | tril₋₁(diag(β) W Kᵀ)]
    T = eye + (bc * (Wc @ Wc.transpose(-1, -2))).masked_fill(~strict, 0.0)
    rhs = torch.cat([bc * Wc, (bc * (Wc @ Kc.transpose(-1, -2))).masked_fill(~strict, 0.0)], dim=-1)
    ZA = torch.linalg.solve_triangular(T, rhs, upper=False, unitriangular=True)
    Z, A = ZA[..., :K], ZA[..., K:]  # chunk product I − Wᵀ Z; A_{s,j} = β_s w_sᵀ (H_{s−1} ⋯ H_{j+1} k_j)
    QW = (Qc @ Wc.transpose(-1, -2)).masked_fill(~lower, 0.0)  # q_iᵀ w_s, s <= i
    S_intra = (Qc @ Kc.transpose(-1, -2)).masked_fill(~lower, 0.0) - QW @ A  # [B, H, n, C, C]
    Qh = Qc - QW @ Z  # q_iᵀ H_i ⋯ H_(chunk start)
    Kh = Kc - A.transpose(-1, -2) @ Wc  # H_(chunk end) ⋯ H_{j+1} k_j
    # blocks [n (query chunk), n (key chunk), B, H, C, C]
    S = q.new_zeros(n, n, B, H, C, C)
    ar = torch.arange(n, device=q.device)
    S = S.index_put((ar, ar), S_intra.permute(2, 0, 1, 3, 4))
    r = Qh
    for delta in range(1, n):
        a, b = ar[delta:], ar[: n - delta]
        blk = r[:, :, delta:] @ Kh[:, :, : n - delta].transpose(-1, -2)
        S = S.index_put((a, b), blk.permute(2, 0, 1, 3, 4))
        # carry the queries of chunks a across chunk b: r ← r (I − W_bᵀ Z_b)
        rb = r[:, :, delta:]
        rb = rb - (rb @ Wc[:, :, : n - delta].transpose(-1, -2)) @ Z[:, :, : n - delta]
        r = torch.cat([r[:, :, :delta], rb], dim=2)
    S = S.permute(2, 3, 0, 4, 1, 5).reshape(B, H, n * C, n * C)[:, :, :Tq, :Tq]
    if L:  # r: every query carried back to the segment start, where the cached keys sit
        S = torch.cat([r.reshape(B, H, n * C, K)[:, :, :Tq] @ k[:, :, :L].transpose(-1, -2), S], dim=-1)
    keys = None
    if final:  # carry every key to the last position, chunk product by chunk product
        keys = torch.cat([k[:, :, :L], Kh.reshape(B, H, n * C, K)], dim=2)
        pos = torch.arange(L + n * C, device=q.device)
        for cix in range(n):
            before = (pos < L + cix * C).to(q.dtype)[:, None]
            keys = keys - before * ((keys @ Z[:, :, cix].transpose(-1, -2)) @ Wc[:, :, cix])
        keys = keys[:, :, : L + Tq]
    return S, keys


# --------------------------------------------------------------------------------------
# the op
# --------------------------------------------------------------------------------------


def path_scores(q, k, w, beta, *, mode: str = "chunk", chunk_size: int = 64, output_final_keys: bool = False, check_values: bool = True):
    """S_{i,j} = q_iᵀ P_{i,j} k_j, [B, H, Tq, Tk] (float32 or wider; zero above the diagonal),
    and the keys carried to the last position [B, Tk, H, K] (or None). Arguments as
    :func:`path_attention`."""
    where = "path_scores"
    check_choice("mode", mode, MODES + ("auto",), where)
    _check(q, k, None, w, beta, None, where)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"{where}: argument 'chunk_size' must be an integer >= 1, got {chunk_size!r}")
    if check_values:
        for name, t in (("q", q), ("k", k), ("w", w), ("beta", beta)):
            check_finite(name, t, where)
    dt = compute_dtype(q, k, w, beta)
    with autocast_off(q.device.type):
        qh, kh, wh = (t.to(dt).transpose(1, 2) for t in (q, k, w))
        bh = beta.to(dt).transpose(1, 2)
        if mode == "parallel":
            S, keys = _scores_parallel(qh, kh, wh, bh, output_final_keys)
        elif mode == "recurrent":
            S, keys = _scores_recurrent(qh, kh, wh, bh, output_final_keys)
        else:
            S, keys = _scores_chunk(qh, kh, wh, bh, output_final_keys, chunk_size)
    return S, keys.transpose(1, 2) if keys is not None else None


def path_probs(S, c=None, *, scale: float, gate_scaled: bool = True) -> torch.Tensor:
    """The attention matrix [B, H, Tq, Tk] from the scores of :func:`path_scores`: causal
    softmax of s·S + (c_i − c_j) (or s·(S + c_i − c_j) with ``gate_scaled``)."""
    Tq, Tk = S.shape[-2], S.shape[-1]
    with autocast_off(S.device.type):
        logits = S
        if c is not None:
            ch = c.to(S.dtype).transpose(1, 2)  # [B, H, Tk]
            bias = ch[..., Tk - Tq :, None] - ch[..., None, :]
            logits = S * scale + (bias * scale if gate_scaled else bias)
        else:
            logits = S * scale
        visible = torch.arange(Tk, device=S.device)[None, :] <= torch.arange(Tk - Tq, Tk, device=S.device)[:, None]
        return torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)


def path_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    c: torch.Tensor | None = None,
    scale: float | None = None,
    gate_scaled: bool = True,
    mode: str = "chunk",
    chunk_size: int = 64,
    output_final_keys: bool = False,
    check_values: bool = True,
):
    """PaTH attention; see the module docstring.

    Args:
        q, k, v: [B, Tq, H, K], [B, Tk, H, K] (the first Tk − Tq already carried to position Tk − Tq − 1), [B, Tk, H, V].
        w, beta: [B, Tq, H, K] (unit vectors) and [B, Tq, H]: the factors of the new positions.
        c: [B, Tk, H] cumulative log forget gate (PaTH-FoX) or None.
        scale: multiplies the scores; None = 1/sqrt(K). gate_scaled: the scale multiplies the forget bias too.
        mode: "parallel" (explicit products, the reference), "recurrent" or "chunk" ("auto" = "chunk").
        chunk_size: chunk length of the chunk mode.
        output_final_keys: also return every key carried to the last position [B, Tk, H, K]
            (float32 or wider): a decoding cache's next state.

    Returns:
        o [B, Tq, H, V] in v's dtype (and the carried keys).
    """
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    _check(q, k, v, w, beta, c, _WHERE)
    s = _scale(scale, q.shape[-1], _WHERE)
    if check_values:
        for name, t in (("q", q), ("k", k), ("v", v), ("w", w), ("beta", beta), ("c", c)):
            if t is not None:
                check_finite(name, t, _WHERE)
    S, keys = path_scores(q, k, w, beta, mode="chunk" if mode == "auto" else mode, chunk_size=chunk_size,
                          output_final_keys=output_final_keys, check_values=False)
    with autocast_off(q.device.type):
        probs = path_probs(S, c, scale=s, gate_scaled=gate_scaled)
        o = (probs @ v.to(probs.dtype).transpose(1, 2)).transpose(1, 2).to(v.dtype)
    return (o, keys) if output_final_keys else o
