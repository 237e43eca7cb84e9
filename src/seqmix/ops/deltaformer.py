"""DeltaFormer attention: the delta rule's erase step inside softmax attention (DeltaFormer; fla's
``deltaformer_attn``).

Per head, the values are first corrected by a delta rule whose "state readout" is softmax attention over
the earlier tokens, then read by causal softmax attention:

    u_t = v_t − β_t Σ_{s<t} softmax_{s<t}(q_t·k_s) u_s          (strictly causal: the past's u)
    o_t = Σ_{s<=t} softmax_{s<=t}(q_t·k_s) u_s

(the scale is in q; fla's naive reference scores both passes with q·k). In matrices, with P_< the strictly
causal and P_<= the causal softmax maps, (I + Diag(β) P_<) u = v, a unit lower-triangular system, so

    Φ = P_<= (I + Diag(β) P_<)⁻¹,      o = Φ v

— softmax attention composed with the inverse of another: no finite-state DSF, and decoding keeps every
key and every u (not v: the u's are what later tokens read).

Modes: ``recurrent`` (u token by token, the reference) and ``parallel`` (one triangular solve). A call
takes the new tokens' q, v, β, all keys so far and the earlier tokens' u (``u_prev``), so a prefill, a
continuation and a decoding step are one function. Shapes: q [B, Tq, H, K], k [B, Tk, H, K], v [B, Tq, H, V],
beta [B, Tq, H], u_prev [B, Tk − Tq, H, V] or None (Tk = Tq). Computed in float32 or wider.
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_shape, check_tensor
from .precision import full_precision, upcast

MODES = ("recurrent", "parallel")
_WHERE = "deltaformer"


def _probs(q, k, start: int, strict: bool):
    """Causal softmax of q·k [B, H, Tq, Tk] over s < t (strict) or s <= t, rows without a key are 0."""
    Tq, Tk = q.shape[1], k.shape[1]
    qpos = torch.arange(start, start + Tq, device=q.device).view(Tq, 1)
    kpos = torch.arange(Tk, device=q.device).view(1, Tk)
    mask = kpos < qpos if strict else kpos <= qpos
    S = torch.einsum("bthk,bshk->bhts", q, k).masked_fill(~mask, torch.finfo(q.dtype).min)
    return torch.softmax(S, dim=-1) * mask.to(q.dtype)


def deltaformer_probs(q, k, beta, *, check: bool = True) -> torch.Tensor:
    """Φ [B, H, T, T] = P_<= (I + Diag(β) P_<)⁻¹ (zero initial history), float32 or wider."""
    if check:
        _check(q, k, None, beta, None, _WHERE)
    dt = torch.promote_types(upcast(q).dtype, upcast(k).dtype)
    q, k, beta = q.to(dt), k.to(dt), beta.to(dt)
    T = q.shape[1]
    Pl, Ple = _probs(q, k, 0, True), _probs(q, k, 0, False)
    eye = torch.eye(T, dtype=dt, device=q.device)
    M = eye + beta.transpose(1, 2).unsqueeze(-1) * Pl  # I + Diag(β) P_<
    # Φ = P_<= M⁻¹: solve Φ M = P_<=, i.e. Mᵀ Φᵀ = P_<=ᵀ (Mᵀ unit upper triangular)
    return torch.linalg.solve_triangular(M.transpose(-1, -2), Ple.transpose(-1, -2), upper=True, unitriangular=True).transpose(-1, -2)


def _check(q, k, v, beta, u_prev, where):
    check_tensor("q", q, rank=4, layout="[B, Tq, H, K]", where=where)
    B, Tq, H, K = q.shape
    check_tensor("k", k, rank=4, layout="[B, Tk, H, K]", where=where)
    check_shape("k", k, (B, None, H, K), "[B, Tk, H, K]", where)
    Tk = k.shape[1]
    if Tk < Tq:
        raise ValueError(f"{where}: argument 'k' must hold at least the Tq = {Tq} new keys, got {Tk}")
    check_tensor("beta", beta, rank=3, layout="[B, Tq, H]", where=where)
    check_shape("beta", beta, (B, Tq, H), "[B, Tq, H]", where)
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, Tq, H, V]", where=where)
        check_shape("v", v, (B, Tq, H, None), "[B, Tq, H, V]", where)
        if Tk > Tq:
            if u_prev is None:
                raise ValueError(f"{where}: argument 'u_prev' must hold the u of the {Tk - Tq} earlier tokens, got None")
            check_tensor("u_prev", u_prev, rank=4, layout="[B, Tk − Tq, H, V]", where=where)
            check_shape("u_prev", u_prev, (B, Tk - Tq, H, v.shape[-1]), "[B, Tk − Tq, H, V]", where)


@full_precision
def deltaformer_attention(q, k, v, beta, *, u_prev=None, mode: str = "parallel"):
    """(o [B, Tq, H, V], u [B, Tq, H, V]) for the new tokens (module docstring), in float32 or wider."""
    check_choice("mode", mode, MODES, _WHERE)
    _check(q, k, v, beta, u_prev, _WHERE)
    Tq, Tk = q.shape[1], k.shape[1]
    start = Tk - Tq
    dt = torch.promote_types(torch.promote_types(upcast(q).dtype, upcast(k).dtype), upcast(v).dtype)
    q, k, v, beta = q.to(dt), k.to(dt), v.to(dt), beta.to(dt)
    Pl, Ple = _probs(q, k, start, True), _probs(q, k, start, False)  # [B, H, Tq, Tk]
    rhs = v.transpose(1, 2)  # [B, H, Tq, V]
    b = beta.transpose(1, 2).unsqueeze(-1)  # [B, H, Tq, 1]
    if start:
        up = u_prev.to(dt).transpose(1, 2)  # [B, H, start, V]
        rhs = rhs - b * (Pl[..., :start] @ up)
    A = Pl[..., start:]  # [B, H, Tq, Tq], strictly lower
    if mode == "parallel":
        M = torch.eye(Tq, dtype=dt, device=q.device) + b * A
        u = torch.linalg.solve_triangular(M, rhs, upper=False, unitriangular=True)
    else:
        rows = []
        for t in range(Tq):
            acc = rhs[:, :, t]
            if t:
                acc = acc - b[:, :, t] * (A[:, :, t, :t].unsqueeze(-2) @ torch.stack(rows, 2)).squeeze(-2)
            rows.append(acc)
        u = torch.stack(rows, 2)
    o = Ple[..., start:] @ u
    if start:
        o = o + Ple[..., :start] @ up
    return o.transpose(1, 2), u.transpose(1, 2)


__all__ = ["MODES", "deltaformer_attention", "deltaformer_probs"]
