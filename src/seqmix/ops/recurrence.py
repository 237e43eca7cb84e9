"""The gated linear recurrence: one op for every finite-state mixer of seqmix.

    S_t = (exp(gk_t)ᵀ exp(gv_t)) ⊙ S_{t-1} + k_tᵀ v_t,        o_t = scale · q_t S_t

This is the DSF recurrence (DSF paper eq. 11) written for a matrix state
S ∈ R^{K×V} per head: the general form of MetaLA (eq. 13-14) with a decay that
may act on keys (GLA, Mamba, MetaLA), on values, on both, or per head (RetNet,
SSD), or not at all (linear attention).

Shapes (the flash-linear-attention layout):

    q, k           [B, T, H, K]
    v              [B, T, H, V]
    gk             [B, T, H, K] (key-wise log-decay), [B, T, H] (one per head) or None
    gv             [B, T, H, V] (value-wise log-decay) or None
    initial_state  [B, H, K, V] or None
    output o       [B, T, H, V];  final state [B, H, K, V]

Decays are passed in log space and must be <= 0 (real part <= 0 when complex),
so that |decay| <= 1. Complex q, k, v, gk, gv are accepted (S4D, LRU): the
state and output are then complex.

Modes (all return the same numbers; tests tie each to ``recurrent``):

* ``recurrent``: the reference, a loop over time (``unbind``, never ``x[:, t]``:
  indexing inside the loop makes backward quadratic in T).
* ``scan``: the same loop over time in chunks of steps (:func:`scan_steps`), the states
  written in place into a buffer per chunk, with a hand-written backward (:class:`_Scan`)
  that keeps only the chunk-boundary states and recomputes the rest: memory O(T·(K+V))
  per head instead of the reference graph's T·K·V, and faster (forward 1.35x,
  forward+backward 1.8x at bench/recurrence.py's S6-like shape). Real inputs (complex ones
  run ``recurrent``).
* ``chunk``: chunkwise-parallel. Within a chunk of C tokens the output is a
  masked matmul; chunks are linked by passing the state, written and read with
  decays relative to the chunk's start and end (exponents <= 0). Inside a chunk,
  a per-head decay enters as an explicit masked [C, C] factor; key- or value-wise
  decays are taken relative to the start of tiles of c tokens. Where a host read costs no
  synchronisation (CPU tensors in eager mode), c is the largest tile whose decays span less
  than _MAX_LOG_GROWTH (one reduction per candidate): weak decays run as one matmul per
  chunk, strong ones as smaller tiles. Where none is allowed (an accelerator, ``meta``,
  torch.compile: ``seqmix.debug``), chunks with decays run in tiles of _TILE tokens whose
  own scores are formed pairwise: nothing is read and nothing overflows at any decay. Cumulative log-decays are local to a chunk and kept in
  float32 or wider. Memory is linear in T. Where every chunk is one tile (the usual
  case), the backward is written by hand (:class:`_ChunkOneTile`: 9 matmuls of the
  forward's operands, O(T(K+V)) kept per head); strong decays that need smaller tiles
  are differentiated by autograd. A per-head decay that no token changes (passed broadcast along time, as
  lightning attention's fixed γ_h) runs, without autograd, a form whose factors are made once from the H decays
  (:func:`_chunk_fixed`). ``chunk_size=None`` picks C by :func:`chunk_size_for`. A decay
  factor below e^-60 (float32; e^-600 in float64) is taken as exactly 0 in the chunk and parallel forms
  (:func:`_decay_exp`: subnormal floats slow a CPU's kernels many times; the terms it scales lie 26 orders of
  magnitude below the others).
* ``parallel``: the quadratic form o = (A ⊙ M) v through the materialized map of
  :func:`recurrence_map`; memory O(T²).
* ``step``: one token (T == 1), given and returning the state (decoding); the
  same update as one iteration of ``recurrent`` (:func:`recurrence_step`).
* ``auto``: the fastest correct mode for the shape (see :func:`auto_mode`).

Float16 and bfloat16 inputs are computed in float32; the state always
accumulates in float32 or wider, and the output is cast back to the input dtype.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange

from . import backends as _backends
from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, fmt_shape, reads_values
from .autograd import first_order
from .inplace import writable
from .precision import autocast_off, full_precision

MODES = ("recurrent", "scan", "chunk", "parallel", "step")
CHUNK_BACKWARDS = ("manual", "autograd")

_WHERE = "linear_recurrence"


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _check_qkv(q, k, v, where):
    """q, k [B, T, H, K] and v [B, T, H, V] (q's B, T, H); returns (B, T, H, K, V)."""
    check_tensor("q", q, rank=4, layout="[B, T, H, K]", where=where)
    B, T, H, K = q.shape
    check_shape("k", k, (B, T, H, K), "[B, T, H, K]", where)
    check_tensor("v", v, rank=4, layout="[B, T, H, V]", where=where)
    check_shape("v", v, (B, T, H, None), "[B, T, H, V]", where)
    return B, T, H, K, v.shape[-1]


def _check_inputs(q, k, v, gk, gv, initial_state, *, check_values: bool, where: str, step: bool = False):
    """Validates shapes, dtypes and value ranges; returns (B, T, H, K, V)."""
    lay = "[B, H, K]" if step else "[B, T, H, K]"
    r = 3 if step else 4
    check_tensor("q", q, rank=r, layout=lay, complex_ok=True, where=where)
    check_tensor("k", k, rank=r, layout=lay, complex_ok=True, where=where)
    check_tensor("v", v, rank=r, layout=lay.replace("K]", "V]"), complex_ok=True, where=where)
    if step:
        B, H, K = q.shape
        T = 1
        check_shape("k", k, (B, H, K), "[B, H, K]", where)
        check_shape("v", v, (B, H, None), "[B, H, V]", where)
        V = v.shape[-1]
    else:
        B, T, H, K = q.shape
        check_shape("k", k, (B, T, H, K), "[B, T, H, K]", where)
        check_shape("v", v, (B, T, H, None), "[B, T, H, V]", where)
        V = v.shape[-1]
        if T == 0:
            raise ValueError(f"{where}: sequence length T must be >= 1, got q of shape {fmt_shape(q.shape)}")
    lead = (B, H) if step else (B, T, H)
    lead_s = "[B, H" if step else "[B, T, H"
    if gk is not None:
        check_tensor("gk", gk, complex_ok=True, where=where)
        if not (gk.shape == (*lead, K) or gk.shape == lead):
            raise ValueError(
                f"{where}: argument 'gk' (log-decay) must have shape {lead_s}, K] = {fmt_shape((*lead, K))} "
                f"(key-wise) or {lead_s}] = {fmt_shape(lead)} (one per head), got {fmt_shape(gk.shape)}"
            )
    if gv is not None:
        check_tensor("gv", gv, complex_ok=True, where=where)
        check_shape("gv", gv, (*lead, V), f"{lead_s}, V]", where)
    if initial_state is not None:
        check_tensor("initial_state", initial_state, rank=4, layout="[B, H, K, V]", complex_ok=True, where=where)
        check_shape("initial_state", initial_state, (B, H, K, V), "[B, H, K, V]", where)
    if check_values and reads_values(q):
        for name, t in (("q", q), ("k", k), ("v", v), ("gk", gk), ("gv", gv), ("initial_state", initial_state)):
            if t is not None:
                check_finite(name, t, where)
        for name, g in (("gk", gk), ("gv", gv)):
            if g is not None:
                re = (g.real if g.is_complex() else g).detach()
                if float(re.max()) > 0:
                    raise ValueError(
                        f"{where}: argument '{name}' holds log-decays and must be <= 0 (|decay| <= 1); "
                        f"got a maximum of {float(re.max()):.4g}"
                    )
    return B, T, H, K, V


def _compute_dtype(*tensors) -> torch.dtype:
    """float32 for half inputs, otherwise the promoted dtype (complex if any input is complex)."""
    dt = None
    for t in tensors:
        if t is None:
            continue
        dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    if dt in (torch.float16, torch.bfloat16):
        dt = torch.float32
    return dt


#: the chunk and parallel forms' decay factors: a log-decay below −_FLUSH_BELOW[dtype] gives a factor of exactly 0
#: (:func:`_decay_exp`)
_FLUSH_BELOW = {torch.float32: 60.0, torch.float64: 600.0}


def _decay_exp(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """exp(x) of a log-decay x (a decay over a span of tokens, <= 0), as the chunk and parallel forms' factors: where
    x < −60 (float32; −600 in float64) the factor is exactly 0 instead of e^x < 1e-26. Such factors only scale terms
    26 orders of magnitude below the ones they are summed with, but their products with the operands fall below the
    smallest normal float (e^−87 in float32) where the decays are strong (Mamba-2's Δ·a at its initialization reaches
    hundreds over a chunk), and a CPU's matmul and elementwise kernels run many times slower on such subnormal
    numbers (``python bench/recurrence.py --subnormal``: the chunk form 2.8x faster at a Mamba-2-like shape with strong
    decays; docs/performance.md). As flushing subnormals to zero (FTZ, the
    GPU default) but local to these factors: no process-wide floating-point mode is changed. The reference
    (``recurrent``) and ``scan`` modes compute every factor as it is. ``mask``: only where True (0 elsewhere,
    exp never evaluated there: :func:`_exp_where`)."""
    t = _FLUSH_BELOW.get(x.dtype)
    drop = None if t is None else x < -t
    if mask is not None:  # (_exp_where: the masked-out entries 0 as well)
        drop = ~mask if drop is None else drop | ~mask
    return torch.exp(x if drop is None else x.masked_fill(drop, float("-inf")))


def _exp_where(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """exp(x) where mask, exactly 0 elsewhere; exp is never evaluated on masked-out entries,
    so neither the value nor the gradient can overflow there. x a log-decay where mask: its factors below
    e^−60 (float32) are 0 as well (:func:`_decay_exp`)."""
    if x.is_complex():
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        return torch.where(mask, torch.exp(torch.where(mask, x, zero)), zero)
    return _decay_exp(x, mask)


# --------------------------------------------------------------------------------------
# step and recurrent (the reference)
# --------------------------------------------------------------------------------------


def _step(S, q_t, k_t, v_t, ak_t, av_t, scale, delayed=False):
    """One update of the recurrence. S [B,H,K,V]; q_t,k_t [B,H,K]; v_t [B,H,V];
    ak_t [B,H,K] or [B,H,1] (decay, not log) or None; av_t [B,H,V] or None.
    ``delayed``: the output reads the state before the update (o_t = scale·q_t S_{t-1})."""
    if delayed:
        o_t = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    if ak_t is not None:
        S = S * ak_t.unsqueeze(-1)
    if av_t is not None:
        S = S * av_t.unsqueeze(-2)
    S = S + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
    if not delayed:
        o_t = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    if scale != 1.0:
        o_t = o_t * scale
    return o_t, S


def _recurrent(q, k, v, gk, gv, scale, S):
    """The reference loop. gk is [B,T,H,K] or [B,T,H,1]."""
    T = q.shape[1]
    ak = gk.exp().unbind(1) if gk is not None else (None,) * T
    av = gv.exp().unbind(1) if gv is not None else (None,) * T
    outs = []
    for q_t, k_t, v_t, ak_t, av_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), ak, av):
        o_t, S = _step(S, q_t, k_t, v_t, ak_t, av_t, scale)
        outs.append(o_t)
    return torch.stack(outs, dim=1), S


SCAN_CHUNK_BYTES = 4 * 2**20  # the states of one chunk of the "scan" mode: about 4 MiB, cache-resident


def scan_steps(B: int, H: int, K: int, V: int, itemsize: int = 4) -> int:
    """Steps per chunk of the "scan" mode: the chunk's states [L, B, H, K, V] in about
    ``SCAN_CHUNK_BYTES``, at least 16 and at most 256 steps."""
    return max(16, min(256, SCAN_CHUNK_BYTES // max(1, B * H * K * V * itemsize)))


def _scan_chunk_states(S, k, v, ak, av, states):
    """The states of one chunk, in place: states[t] = ak_t ⊙ av_t ⊙ S_(t-1) + k_tᵀ v_t.
    S [B,H,K,V]; k [B,L,H,K]; v [B,L,H,V]; ak [B,L,H,K|1] or None; av [B,L,H,V] or None;
    states [≥L,B,H,K,V] (its first L steps written). Returns the last state (a view of states)."""
    for t in range(k.shape[1]):
        h = states[t]
        if ak is not None:
            torch.mul(S, ak[:, t].unsqueeze(-1), out=h)
            if av is not None:
                h.mul_(av[:, t].unsqueeze(-2))
        elif av is not None:
            torch.mul(S, av[:, t].unsqueeze(-2), out=h)
        else:
            h.copy_(S)
        h.addcmul_(k[:, t].unsqueeze(-1), v[:, t].unsqueeze(-2))
        S = h
    return S


def _scan_forward(q, k, v, gk, gv, S0, scale, L, bounds=None):
    """The scan over chunks of L steps: (o [B,T,H,V], S_T). ``bounds``, a list, receives the state
    at the start of every chunk (what the backward recomputes a chunk from)."""
    B, T, H, K = q.shape
    buf = q.new_empty(min(L, T), B, H, K, v.shape[-1])
    outs, S = [], S0
    for t0 in range(0, T, L):
        sl = slice(t0, min(T, t0 + L))
        if bounds is not None:
            bounds.append(S)
        S = _scan_chunk_states(S, k[:, sl], v[:, sl], gk[:, sl].exp() if gk is not None else None,
                               gv[:, sl].exp() if gv is not None else None, buf)
        outs.append(torch.einsum("bthk,tbhkv->bthv", q[:, sl], buf[: sl.stop - t0]))
        S = S.clone()  # the buffer is rewritten by the next chunk
    o = torch.cat(outs, 1)
    return (o * scale if scale != 1.0 else o), S


class _Scan(torch.autograd.Function):
    """The "scan" mode: the recurrence over time in chunks of L steps, with a hand-written
    backward. Only the chunk-boundary states are kept (O(T·(K+V)) per head, not the T·K·V of
    the reference loop's graph); the backward recomputes a chunk's states from its boundary
    state, runs the adjoint G_t = scale·q_tᵀ do_t + a_(t+1) ⊙ G_(t+1) over the chunk (a_t the
    decay of step t: exp(gk_t)ᵀ exp(gv_t)) and forms the chunk's gradients with whole-chunk ops:

        dq_t = scale · S_t do_t,   dk_t = G_t v_t,   dv_t = G_tᵀ k_t,
        dgk_t = Σ_V G_t ⊙ a_t ⊙ S_(t-1),   dgv_t = Σ_K G_t ⊙ a_t ⊙ S_(t-1),   dS_0 = a_1 ⊙ G_1

    (a per-head gk sums dgk over K too; a_t ⊙ S_(t-1) is formed from the recomputed states, not
    as S_t - k_tᵀ v_t, which cancels where a_t is small). Real inputs only (complex ones run the
    reference loop). A backward that builds a graph (``create_graph=True``: Hessian-vector
    products, gradient penalties) is autograd's through the reference loop, recomputed from the
    saved inputs, so second derivatives are exact too."""

    @staticmethod
    def forward(ctx, q, k, v, gk, gv, S0, scale, L):
        bounds = []
        o, S = _scan_forward(q, k, v, gk, gv, S0, scale, L, bounds)
        ctx.save_for_backward(q, k, v, gk, gv, *bounds)
        ctx.scale, ctx.L = scale, L
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        q, k, v, gk, gv, *bounds = ctx.saved_tensors
        scale, L = ctx.scale, ctx.L
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward (the reference loop's)
            return _Scan._backward_by_autograd(ctx, q, k, v, gk, gv, bounds[0], do, dS)
        B, T, H, K = q.shape
        V = v.shape[-1]
        G = dS.clone() if dS is not None else q.new_zeros(B, H, K, V)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dgk = torch.empty_like(gk) if gk is not None and ctx.needs_input_grad[3] else None
        dgv = torch.empty_like(gv) if gv is not None and ctx.needs_input_grad[4] else None
        states, adj = q.new_empty(min(L, T), B, H, K, V), q.new_empty(min(L, T), B, H, K, V)
        for c in reversed(range(len(bounds))):
            sl = slice(c * L, min(T, (c + 1) * L))
            n = sl.stop - sl.start
            ak = gk[:, sl].exp() if gk is not None else None
            av = gv[:, sl].exp() if gv is not None else None
            _scan_chunk_states(bounds[c], k[:, sl], v[:, sl], ak, av, states)
            qdo = torch.einsum("bthk,bthv->tbhkv", q[:, sl], do[:, sl])
            if scale != 1.0:
                qdo.mul_(scale)
            for t in reversed(range(n)):  # G_t = scale q_tᵀ do_t + a_(t+1) ⊙ G_(t+1), then G <- a_t ⊙ G_t
                G.add_(qdo[t])
                adj[t].copy_(G)
                if ak is not None:
                    G.mul_(ak[:, t].unsqueeze(-1))
                if av is not None:
                    G.mul_(av[:, t].unsqueeze(-2))
            St, Gt = states[:n], adj[:n]
            dq[:, sl] = torch.einsum("tbhkv,bthv->bthk", St, do[:, sl]) * scale
            dk[:, sl] = torch.einsum("tbhkv,bthv->bthk", Gt, v[:, sl])
            dv[:, sl] = torch.einsum("tbhkv,bthk->bthv", Gt, k[:, sl])
            if dgk is not None or dgv is not None:  # G_t ⊙ a_t ⊙ S_(t-1)
                decayed = Gt * torch.cat([bounds[c].unsqueeze(0), states[: n - 1]])
                if ak is not None:
                    decayed.mul_(ak.permute(1, 0, 2, 3).unsqueeze(-1))
                if av is not None:
                    decayed.mul_(av.permute(1, 0, 2, 3).unsqueeze(-2))
                if dgk is not None:
                    g = decayed.sum(-1).permute(1, 0, 2, 3)
                    dgk[:, sl] = g if gk.shape[-1] == K else g.sum(-1, keepdim=True)
                if dgv is not None:
                    dgv[:, sl] = decayed.sum(-2).permute(1, 0, 2, 3)
        return dq, dk, dv, dgk, dgv, G, None, None

    @staticmethod
    def _backward_by_autograd(ctx, q, k, v, gk, gv, S0, do, dS):
        ins = (q, k, v, gk, gv, S0)
        want = [i for i, t in enumerate(ins) if t is not None and ctx.needs_input_grad[i]]
        with torch.enable_grad():
            o, S = _recurrent(q, k, v, gk, gv, ctx.scale, S0)
            grads = torch.autograd.grad((o, S), [ins[i] for i in want], (do, dS), create_graph=True, allow_unused=True)
        out = [None] * 8
        for i, g in zip(want, grads):
            out[i] = g if g is not None else torch.zeros_like(ins[i])
        return tuple(out)


def _scan(q, k, v, gk, gv, scale, S0):
    """The "scan" mode (real inputs; gk [B,T,H,K|1] or None): :class:`_Scan` where a gradient is
    needed, else its forward alone (nothing kept)."""
    B, T, H, K = q.shape
    L = scan_steps(B, H, K, v.shape[-1], q.element_size())
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, gk, gv, S0)):
        ins = (q, k, v, gk, gv, S0)
        if torch.compiler.is_compiling():
            # torch.compile cannot trace an autograd.Function given one tensor twice (HGRN's q = k = 1):
            # a copy enters instead (the gradients of both add up in the original)
            firsts = [t is None or all(t is not u for u in ins[:i]) for i, t in enumerate(ins)]
            ins = tuple(t if first else t.clone() for t, first in zip(ins, firsts))
        return _Scan.apply(*ins, scale, L)
    return _scan_forward(q, k, v, gk, gv, S0, scale, L)


# --------------------------------------------------------------------------------------
# parallel (quadratic) form and the materialized map
# --------------------------------------------------------------------------------------


def _segsum(g: torch.Tensor) -> torch.Tensor:
    """g [..., T] -> [..., T, T] with out[t, s] = sum_{r=s+1}^{t} g_r for s <= t (0 on the diagonal).

    Computed as a cumulative sum of a masked matrix (no difference of two large
    cumulative sums, hence no cancellation). Entries above the diagonal are
    meaningless and must be masked by the caller.
    """
    T = g.shape[-1]
    x = g.unsqueeze(-1).expand(*g.shape, T)  # x[.., r, s] = g_r
    strict = torch.ones(T, T, dtype=torch.bool, device=g.device).tril(-1)  # r > s
    x = torch.where(strict, x, torch.zeros((), dtype=g.dtype, device=g.device))
    return x.cumsum(dim=-2)  # out[t, s] = sum_{r <= t, r > s} g_r


def _map(q, k, gk, gv, scale):
    """Materialized map. q,k [B,T,H,K]; gk [B,T,H,K|1] or None; gv [B,T,H,V] or None.

    Returns A [B,H,T,T] (gv is None) or [B,H,V,T,T] with o_t = sum_s A[t,s] v_s.
    """
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    qh = rearrange(q, "b t h k -> b h t k")
    kh = rearrange(k, "b t h k -> b h t k")
    if gk is None:
        A = qh @ kh.transpose(-1, -2)
    elif gk.shape[-1] == 1:  # one decay per head: exact segment sums (no difference of two cumulative sums)
        D = _exp_where(_segsum(rearrange(gk[..., 0], "b t h -> b h t")), causal)
        A = (qh @ kh.transpose(-1, -2)) * D
    else:  # key-wise: the whole sequence as one block of safe tiles (matmuls; no [T, T, K] tensor)
        # cumulative sums over the whole sequence, in float64 so that their differences stay exact
        G = rearrange(gk, "b t h k -> b h t k").to(torch.complex128 if gk.is_complex() else torch.float64).cumsum(-2)
        A = _tiled_scores(qh, kh, G, _tile_size(T, None, G)).reshape(*qh.shape[:-2], T, T)
    A = torch.where(causal, A, torch.zeros((), dtype=A.dtype, device=A.device))
    if scale != 1.0:
        A = A * scale
    if gv is not None:
        Dv = _exp_where(_segsum(rearrange(gv, "b t h v -> b h v t")), causal)  # [B,H,V,T,T]
        A = A.unsqueeze(2) * Dv
    return A


def _parallel(q, k, v, gk, gv, scale, S0, want_state):
    A = _map(q, k, gk, gv, scale)
    if gv is None:
        o = torch.einsum("bhts,bshv->bthv", A, v)
    else:
        o = torch.einsum("bhvts,bshv->bthv", A, v)
    Gk = gk.cumsum(1) if gk is not None else None  # [B,T,H,K|1]
    Gv = gv.cumsum(1) if gv is not None else None
    if S0 is not None:
        qd = q * Gk.exp() if Gk is not None else q
        o_init = torch.einsum("bthk,bhkv->bthv", qd, S0) * scale
        if Gv is not None:
            o_init = o_init * Gv.exp()
        o = o + o_init
    S = None
    if want_state:
        kd = k * (Gk[:, -1:] - Gk).exp() if Gk is not None else k
        vd = v * (Gv[:, -1:] - Gv).exp() if Gv is not None else v
        S = torch.einsum("bthk,bthv->bhkv", kd, vd)
        if S0 is not None:
            dS = S0
            if Gk is not None:
                dS = dS * Gk[:, -1].exp().unsqueeze(-1)
            if Gv is not None:
                dS = dS * Gv[:, -1].exp().unsqueeze(-2)
            S = S + dS
    return o, S


# --------------------------------------------------------------------------------------
# chunkwise-parallel form
# --------------------------------------------------------------------------------------


def _intra_scalar(q, k, v, Gk):
    """Intra-chunk output when the decay is one scalar per head (or absent).

    q,k [B,H,n,C,K]; v [B,H,n,C,V]; Gk [B,H,n,C,1] local cumulative log-decay or None.
    """
    C = q.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    A = q @ k.transpose(-1, -2)
    if Gk is None:
        A = torch.where(causal, A, torch.zeros((), dtype=A.dtype, device=A.device))
    else:
        G = Gk[..., 0]
        A = A * _exp_where(G.unsqueeze(-1) - G.unsqueeze(-2), causal)
    return A @ v


_MAX_LOG_GROWTH = 30.0  # largest log-decay one tile may span: e^30 ~ 1e13 neither overflows nor underflows float32
#: the tile of key- or value-wise decays when one tile per chunk is not known to be safe (fla's sub-chunk)
_TILE = 16


def _largest_divisor(C: int, at_most: int) -> int:
    return next(d for d in range(max(min(C, at_most), 1), 0, -1) if C % d == 0)


def _tile_span(c: int, Gs) -> float:
    """Largest log-decay accumulated from the first to the last token of a tile of c tokens
    (real part), over all tiles: the exponent of the one-tile form's largest key factor (a host read)."""
    span = 0.0
    for G in Gs:
        if G is not None:
            Gr = (G.real if G.is_complex() else G).detach()
            firsts, lasts = Gr[..., ::c, :], Gr[..., c - 1 :: c, :]  # G at the first and last position of each tile
            span = max(span, float((firsts - lasts).max()))
    return span


def _tile_size(C: int, requested: int | None, *Gs) -> int:
    """The tile c of a block of C tokens (a divisor of C, at most ``requested``).

    Where a host read is allowed (:func:`seqmix._checks.reads_values`: CPU tensors in eager mode), c is the
    largest tile whose decays span less than _MAX_LOG_GROWTH in every tile (one read per candidate), and
    :func:`_tile_parts` forms a tile's own scores with one matmul (factors taken relative to the tile's
    first token, none above e^_MAX_LOG_GROWTH). Where none is (an accelerator, ``meta``, torch.compile),
    nothing is read: chunks with decays run in tiles of at most _TILE tokens whose own scores are formed
    pairwise, exact at any decay."""
    c = _largest_divisor(C, requested or C)
    Gs = [G for G in Gs if G is not None]
    if not Gs or C == 1:
        return c
    if reads_values(Gs[0]):
        while c > 1 and _tile_span(c, Gs) > _MAX_LOG_GROWTH:
            c = _largest_divisor(C, c // 2)
        return c
    return c if c < C else _largest_divisor(C, min(_TILE, C // 2))


def _tile_factors(Gk, c):
    """The factors of :func:`_tile_parts` made of the decays alone (several score maps of one block with the same
    decays share them: the delta rule's general chunk forms four): Gk [.., C, K|1] -> (exp(G_i − G_r) [.., s, c,
    K|1] of each tile's queries, exp(G_r − G_j) [.., s, C, K|1] of the keys before each tile (0 elsewhere), and
    exp(G_r − G_j) [.., s, c, K|1] of the tile's own keys where the decays' values are read (:func:`_tile_size`
    chose c safe), else None), r the tile's first position."""
    C = Gk.shape[-2]
    s = C // c
    before = torch.arange(C, device=Gk.device).view(1, C) < (torch.arange(s, device=Gk.device) * c).view(s, 1)
    G_t = _tiles(Gk, c)
    R = Gk[..., ::c, :].unsqueeze(-2)  # [.., s, 1, K|1]: G at the first position of each tile
    e_in = torch.exp(R - G_t) if reads_values(Gk) else None
    e_out = _exp_where(R - Gk.unsqueeze(-3), before.unsqueeze(-1)) if s > 1 else None  # (one tile: no key before it)
    return torch.exp(G_t - R), e_out, e_in


def _tile_parts(q, k, Gk, c, factors=None):
    """The decayed causal scores of a block in tiles of c tokens, as two parts.

    q,k [.., C, K]; Gk [.., C, K|1] cumulative log-decay (from the start of the block) or None.
    Returns (before [.., s, c, C], inside [.., s, c, c]), s = C/c tiles: for query i of tile a,
    before[.., a, i, j] = Σ_k q_ik k_jk exp(G_ik − G_jk) for keys j before the tile (0 elsewhere) and
    inside[.., a, i, j'] the same for key j' of the tile itself, j' <= i (0 above the diagonal); ``before`` is
    None for one tile (c = C: no key lies before it).

    Before the tile, exp(G_i − G_j) = exp(G_i − G_r) · exp(G_r − G_j) with r the tile's first position:
    both factors are <= 1 (the decays accumulate), so one matmul per tile against all earlier keys
    neither overflows nor loses the small terms' relative precision. Inside the tile: one matmul of the
    same factors, exp(G_r − G_j) <= e^_MAX_LOG_GROWTH, where :func:`_tile_size` read the decays and chose
    c so; without that read, the factors exp(G_i − G_j), j <= i, formed pairwise ([.., s, c, c, K] for
    key-wise decays): no exponent is positive, at any decay. ``factors``: :func:`_tile_factors` of (Gk, c), made
    once for several calls.
    """
    *lead, C, K = q.shape
    s = C // c
    dev = q.device
    pos = torch.arange(C, device=dev)
    tile_start = torch.arange(s, device=dev) * c
    before = pos.view(1, C) < tile_start.view(s, 1)  # [s, C]: key j lies before tile a
    q_t, k_t = _tiles(q, c), _tiles(k, c)  # [.., s, c, K]
    tril = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
    if Gk is None:
        A_in = (q_t @ k_t.transpose(-1, -2)).masked_fill(~tril, 0)
        if s == 1:
            return None, A_in
        A_out = q_t @ k.unsqueeze(-3).transpose(-1, -2)  # [.., s, c, C]
        return A_out.masked_fill(~before.unsqueeze(-2), 0), A_in
    e_q, e_out, e_in = factors if factors is not None else _tile_factors(Gk, c)
    qr = q_t * e_q.to(q.dtype)  # exponents <= 0
    A_out = None if e_out is None else qr @ (k.unsqueeze(-3) * e_out.to(k.dtype)).transpose(-1, -2)  # [.., s, C, K]: <= 0
    if e_in is not None:  # c was read to be safe: the tile's own keys by one matmul
        A_in = (qr @ (k_t * e_in.to(k.dtype)).transpose(-1, -2)).masked_fill(~tril, 0)
        return A_out, A_in
    G_t = _tiles(Gk, c)  # [.., s, c, K|1]
    pair = G_t.unsqueeze(-2) - G_t.unsqueeze(-3)  # [.., s, c, c, K|1]: G_i − G_j
    D = _exp_where(pair, tril.unsqueeze(-1))
    if Gk.shape[-1] == 1:
        A_in = (q_t @ k_t.transpose(-1, -2)) * D[..., 0].to(q.dtype)
    else:
        A_in = torch.einsum("...ik,...jk,...ijk->...ij", q_t, k_t, D.to(q.dtype))
    return A_out, A_in


def _tiled_scores(q, k, Gk, c, factors=None):
    """Decayed causal scores A[.., a, i, j] = Σ_k q_ik k_jk exp(G_ik - G_jk) for j <= i, else 0.

    q,k [.., C, K]; Gk [.., C, K|1] cumulative log-decay (from the start of the block) or None.
    Returns [.., s, c, C]: query i of tile a (s = C/c tiles) against every key of the block, the two
    parts of :func:`_tile_parts` put together (the tile's own keys on its diagonal block); ``factors`` as there."""
    *lead, C, _ = q.shape
    s = C // c
    A_out, A_in = _tile_parts(q, k, Gk, c, factors)
    if A_out is None:  # one tile: its own scores are the block's ([.., 1, C, C])
        return A_in
    eye = torch.eye(s, dtype=torch.bool, device=q.device).view(s, 1, s, 1)
    diag = torch.where(eye, A_in.unsqueeze(-2), torch.zeros((), dtype=A_in.dtype, device=q.device))  # [.., s, c, s, c]
    return A_out + diag.reshape(*lead, s, c, C)


def _tiles(x, c):  # [.., C, X] -> [.., C/c, c, X]
    return x.reshape(*x.shape[:-2], x.shape[-2] // c, c, x.shape[-1])


def _intra_tiled(q, k, v, Gk, Gv, c):
    """Intra-chunk output for key-wise and/or value-wise decays, in tiles of c tokens (:func:`_tile_parts`).

    q,k [B,H,n,C,K]; v [B,H,n,C,V]; Gk [B,H,n,C,K|1] or None; Gv [B,H,n,C,V] or None
    (local cumulative log-decays). The value-side decay is split at the same tile references as the
    key side (:func:`_tile_parts`): exp(W_i − W_r) · exp(W_r − W_j) for keys before the tile, and inside
    it too where c was read to be safe, else pairwise exp(W_i − W_j).
    """
    *lead, C, _ = q.shape
    V = v.shape[-1]
    A_out, A_in = _tile_parts(q, k, Gk, c)  # [.., s, c, C] (None for one tile), [.., s, c, c]
    v_t = _tiles(v, c)  # [.., s, c, V]
    if Gv is None:
        o = A_in @ v_t if A_out is None else A_out @ v.unsqueeze(-3) + A_in @ v_t
    else:
        s = C // c
        pos = torch.arange(C, device=q.device)
        before = (pos.view(1, C) < (torch.arange(s, device=q.device) * c).view(s, 1)).unsqueeze(-1)  # [s, C, 1]
        W_t = _tiles(Gv, c)
        Rv = Gv[..., ::c, :].unsqueeze(-2)  # [.., s, 1, V]
        o = None
        if A_out is not None:
            v_r = v.unsqueeze(-3) * _exp_where(Rv - Gv.unsqueeze(-3), before)  # [.., s, C, V]: exponents <= 0
            o = (A_out @ v_r) * torch.exp(W_t - Rv)
        if reads_values(Gv):  # c was read to be safe: exp(W_i − W_r) · exp(W_r − W_j) inside the tile too
            o_in = (A_in @ (v_t * torch.exp(Rv - W_t))) * torch.exp(W_t - Rv)
        else:
            tril = torch.ones(c, c, dtype=torch.bool, device=q.device).tril().unsqueeze(-1)
            Dv = _exp_where(W_t.unsqueeze(-2) - W_t.unsqueeze(-3), tril)  # [.., s, c, c, V]: exp(W_i − W_j), j <= i
            o_in = torch.einsum("...ij,...ijv,...jv->...iv", A_in, Dv, v_t)
        o = o_in if o is None else o + o_in
    return o.reshape(*lead, C, V)


def _chunk(q, k, v, gk, gv, scale, S0, C, sub_chunk_size, want_state, backward="manual"):
    B, T, H, K = q.shape
    V = v.shape[-1]
    n = math.ceil(T / C)
    # padded positions: q = k = v = 0 and log-decay 0, so they neither write nor decay the state
    q, k, v, gk, gv = (_padded(x, n * C - T) for x in (q, k, v, gk, gv))
    q, k, v = _chunked(q, C), _chunked(k, C), _chunked(v, C)
    if scale != 1.0:
        q = q * scale
    Gk = _chunked(gk, C).cumsum(-2) if gk is not None else None  # local cumulative log-decay [B,H,n,C,K|1]
    Gv = _chunked(gv, C).cumsum(-2) if gv is not None else None

    c = _tile_size(C, sub_chunk_size, Gk, Gv)
    if c == C and backward == "manual":
        o, S = _ChunkOneTile.apply(q, k, v, Gk, Gv, S0)
        o = _unchunked(o)[:, :T]
        return o, (S if want_state else None)
    if c == C:
        # one tile per chunk: decays relative to the chunk's first token; every factor lies in
        # [e^-_MAX_LOG_GROWTH, 1] or its inverse, and the inter-chunk operands reuse them
        q_i, k_i, v_i, q_r, k_w, v_w, o_fac = q, k, v, q, k, v, None
        if Gk is not None:
            first, last = Gk[..., :1, :], Gk[..., -1:, :]
            Ek = torch.exp(Gk - first)
            q_i, k_i = q * Ek, k / Ek
            q_r = q_i * _decay_exp(first)  # q_t exp(G_t): reads the state entering the chunk
            k_w = k_i * _decay_exp(last - first)  # k_t exp(G_last - G_t): writes the state leaving it
        if Gv is not None:
            first_v, last_v = Gv[..., :1, :], Gv[..., -1:, :]
            Ev = torch.exp(Gv - first_v)
            v_i = v / Ev
            v_w = v_i * _decay_exp(last_v - first_v)
            o_fac = Ev * _decay_exp(first_v)  # exp(G^V_t)
        A = (q_i @ k_i.transpose(-1, -2)).tril()
        o = A @ v_i
        if Gv is not None:
            o = o * Ev
    else:
        if gv is None and gk.shape[-1] == 1:
            o = _intra_scalar(q, k, v, Gk)  # strong per-head decay: one explicit [C, C] factor beats small tiles
        else:
            o = _intra_tiled(q, k, v, Gk, Gv, c)
        q_r = q * _decay_exp(Gk) if Gk is not None else q
        k_w = k * _decay_exp(Gk[..., -1:, :] - Gk) if Gk is not None else k
        v_w = v * _decay_exp(Gv[..., -1:, :] - Gv) if Gv is not None else v
        o_fac = _decay_exp(Gv) if Gv is not None else None

    # state written by each chunk, decayed to the chunk's end (exponents <= 0)
    U = k_w.transpose(-1, -2) @ v_w  # [B,H,n,K,V]
    dk = _decay_exp(Gk[..., -1, :]).unsqueeze(-1) if Gk is not None else None  # [B,H,n,K|1,1]
    dv = _decay_exp(Gv[..., -1, :]).unsqueeze(-2) if Gv is not None else None  # [B,H,n,1,V]

    # inter-chunk: a sequential scan over n chunks of an elementwise update
    S = S0 if S0 is not None else torch.zeros(B, H, K, V, dtype=U.dtype, device=U.device)
    starts = []
    dks = dk.unbind(2) if dk is not None else (None,) * n  # unbind, not [:, :, i]: see the module docstring
    dvs = dv.unbind(2) if dv is not None else (None,) * n
    for U_i, dk_i, dv_i in zip(U.unbind(2), dks, dvs):
        starts.append(S)
        if dk_i is not None:
            S = S * dk_i
        if dv_i is not None:
            S = S * dv_i
        S = S + U_i
    S_start = torch.stack(starts, dim=2)  # state entering each chunk [B,H,n,K,V]

    o_inter = q_r @ S_start
    if o_fac is not None:
        o_inter = o_inter * o_fac
    o = o + o_inter
    o = _unchunked(o)[:, :T]
    return o, (S if want_state else None)


def _fixed_decay(gk: torch.Tensor | None, gv: torch.Tensor | None, *tensors) -> torch.Tensor | None:
    """g [B, H] where the chunk form may run :func:`_chunk_fixed`: a real log-decay per head that no token changes
    (gk [B, T, H, 1] broadcast along time, stride 0: RetNet's, lightning attention's and TransNormer's fixed γ_h as
    the mixers hand them, a layer constant expanded), no value-wise decay, and nothing that autograd records
    (training keeps :class:`_ChunkOneTile`'s hand-written backward); else None."""
    if gk is None or gv is not None or gk.shape[-1] != 1 or gk.stride(1) != 0 or gk.shape[1] < 2 or gk.is_complex():
        return None
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (gk, *tensors)):
        return None
    return gk[:, 0, :, 0]


#: (C, device, dtype) -> :func:`_fixed_decay_counts` (a few [C, C + 2] tensors per chunk size in use)
_FIXED_COUNTS: dict = {}


def _fixed_decay_counts(C: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The token counts of :func:`_chunk_fixed`'s factors, [C, C + 2]: columns j < C the lag i − j of D (0 where
    j > i), column C the read's t + 1, column C + 1 the write's C − 1 − t; and an addend that is −inf where j > i
    (D's zeros: e^{g·0 − inf} = 0 at any g, none included) and 0 elsewhere. Made once per chunk size, device and dtype
    (made anew while torch.compile traces: the kept tensors are Python state)."""
    key = (C, str(device), dtype)
    kept = None if torch.compiler.is_compiling() else _FIXED_COUNTS.get(key)
    if kept is None:
        t = torch.arange(C, device=device, dtype=dtype).view(C, 1)
        lag = t - t.view(1, C)
        P = torch.cat([lag.clamp_min(0), t + 1, (C - 1) - t], dim=1)
        hidden = torch.zeros_like(P)
        hidden[:, :C] = torch.where(lag < 0, float("-inf"), 0.0)
        kept = (P, hidden)
        if not torch.compiler.is_compiling() and not P.is_inference():
            _FIXED_COUNTS[key] = kept
    return kept


def _chunk_fixed(q, k, v, g, scale, S0, C, want_state):
    """The chunk form for a log-decay g [B, H] (<= 0) the same at every token: the factors of a chunk are then the
    same for every chunk, made once from g: within a chunk o = ((q kᵀ) ⊙ D) v with D[i, j] = e^{g (i − j)} (i >= j, else
    0), the state entering it read as (q ⊙ e^{g (t + 1)}) S_in, the state leaving it
    e^{g C} S_in + (k ⊙ e^{g (C − 1 − t)})ᵀ v (t the position in the chunk). Every exponent is <= 0 (no factor above 1:
    no tile, no host read of the decays, at any decay); the per-token decay tensor is never chunked, cumulated or
    exponentiated. The numbers of :func:`_chunk` (tests/test_recurrence_fixed_decay.py ties both to the reference).
    q, k [B, T, H, K], v [B, T, H, V] (the compute dtype); S0 [B, H, K, V] or None; C the chunk size."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    n = math.ceil(T / C)
    pad = n * C - T  # padded positions: q = k = v = 0 (they add nothing; the last state is taken at position T below)
    q, k, v = (_chunked(_padded(x, pad), C) for x in (q, k, v))
    if scale != 1.0:
        q = q * scale
    gh = g.view(B, H, 1, 1)  # [B, H, 1, 1]
    P, hidden = _fixed_decay_counts(C, q.device, g.dtype)
    F = _decay_exp(torch.addcmul(hidden, gh, P)).unsqueeze(2)  # [B, H, 1, C, C + 2]: every factor at once
    D, read, write = F[..., :C], F[..., C:C + 1], F[..., C + 1:]
    across = _decay_exp(gh * C)  # [B, H, 1, 1]: e^{g C}
    A = (q @ k.transpose(-1, -2)).mul_(D)  # [B, H, n, C, C] (a fresh product: scaled in place)
    U = (k * write).transpose(-1, -2) @ v  # [B, H, n, K, V]: what each chunk writes, decayed to its end
    S = S0 if S0 is not None else torch.zeros(B, H, K, V, dtype=U.dtype, device=U.device)
    starts = torch.empty_like(U)  # the state entering each chunk
    for i, U_i in enumerate(U.unbind(2)):
        starts[:, :, i] = S
        S = torch.addcmul(U_i, S, across)
    o = torch.baddbmm(_flat3(q * read) @ _flat3(starts), _flat3(A), _flat3(v))  # intra-chunk + the state read
    o = _unchunked(o.view(B, H, n, C, V))[:, :T]
    if want_state and pad:  # the last chunk holds r = C − pad tokens: S_T = e^{g r} S_in + Σ_{t < r} e^{g (r − 1 − t)} k_tᵀ v_t
        r = C - pad
        t = P[:, C:C + 1] - 1  # [C, 1]: the position in the chunk
        w_last = _exp_where(gh * ((r - 1) - t), t < r)  # [B, H, C, 1]
        S = torch.addcmul((k[:, :, -1] * w_last).transpose(-1, -2) @ v[:, :, -1], starts[:, :, -1], _decay_exp(gh * r))
    return o, (S if want_state else None)


def _padded(x: torch.Tensor | None, pad: int) -> torch.Tensor | None:
    """x [B, T, H, X] with ``pad`` positions of zeros after its last (None stays None)."""
    return torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) if pad and x is not None else x


def _chunked(x: torch.Tensor | None, C: int) -> torch.Tensor | None:
    """[B, n·C, H, X] -> [B, H, n, C, X] ("b (n c) h x -> b h n c x" by view and permute), one copy into the layout of the
    matmuls, so that none of them copies again (einops' own call costs more than the copy at small sizes)."""
    if x is None:
        return None
    B, T, H, X = x.shape
    return x.reshape(B, T // C, C, H, X).permute(0, 3, 1, 2, 4).contiguous()


def _unchunked(o: torch.Tensor) -> torch.Tensor:
    """[B, H, n, C, V] -> [B, n·C, H, V] ("b h n c v -> b (n c) h v")."""
    B, H, n, C, V = o.shape
    return o.permute(0, 2, 3, 1, 4).reshape(B, n * C, H, V)


# --------------------------------------------------------------------------------------
# chunk mode's hand-written backward
# --------------------------------------------------------------------------------------


def _cj(x):
    """Conjugate of a complex tensor, the tensor itself otherwise. PyTorch's gradient of a
    holomorphic f is conj(f') times the output gradient, so every forward factor enters the
    backward conjugated."""
    return x.conj() if x.is_complex() else x


class _ChunkOneTile(torch.autograd.Function):
    """The chunk form with one tile per chunk (every decay span inside a chunk <= _MAX_LOG_GROWTH),
    with a backward written by hand: it keeps O(T(K+V)) per head and recomputes the rest.

    Inputs, chunked [B, H, n, C, ·]: q (already scaled), k, v; Gk [.., C, K|1] and Gv [.., C, V]
    the cumulative log-decays local to each chunk (G_t = Σ_{r <= t} g_r from the chunk's first
    token F = G_0 to its last L = G_{C-1}), or None; S0 [B, H, K, V] or None.
    Returns o [B, H, n, C, V] and the final state [B, H, K, V].

    Forward, per chunk, with the decays taken relative to the chunk's first token
    (E = e^{G - F}, Ē = e^{W - F_W} on the value side; all factors <= 1 or their inverse <= e^30):
        q̃ = q E,  k̃ = k / E,  ṽ = v / Ē,  S̃_in = e^{F} e^{F_W} ⊙ S_in
        o = (tril(q̃ k̃ᵀ) ṽ + q̃ S̃_in) Ē
        S_out = e^{L} e^{L_W} ⊙ S_in + e^{L-F} e^{L_W-F_W} ⊙ (k̃ᵀ ṽ)
    Kept: q̃, k̃, ṽ, G, W, the n + 1 chunk-boundary states (n K V = T K V / C per head) and o
    (value-wise decay only): O(T(K+V)) per head. A = tril(q̃ k̃ᵀ), E and Ē are recomputed.

    Backward: the adjoint of the states runs backwards over the chunks,
        dS_in = e^{L} e^{L_W} ⊙ dS_out + e^{F} e^{F_W} ⊙ q̃ᵀ dY,      dY = do Ē,
    then, with M = e^{L-F} e^{L_W-F_W} ⊙ dS_out and dA = tril(dY ṽᵀ), three accumulated
    matmul pairs give the gradients of q̃, k̃, ṽ:
        dq̃ = dA k̃ + dY S̃_inᵀ,   dk̃ = dAᵀ q̃ + ṽ Mᵀ,   dṽ = Aᵀ dY + k̃ M,
    and dq = dq̃ E, dk = dk̃ / E, dv = dṽ / Ē. The decays enter the true map only as e^{G_t} on
    q_t, e^{-G_t} on k_t and e^{L} on everything a chunk writes (F cancels), hence
        dG_t = q̃_t dq̃_t - k̃_t dk̃_t + [t = C-1] Σ_V dS_out ⊙ S_out,
        dW_t = o_t do_t - ṽ_t dṽ_t + [t = C-1] Σ_K dS_out ⊙ S_out,
    summed over K for a per-head decay. Complex inputs: every forward factor enters conjugated
    (PyTorch's convention). 9 matmuls against the forward's 4, elementwise work O(T(K+V)).
    """

    @staticmethod
    def forward(ctx, q, k, v, Gk, Gv, S0):
        with autocast_off(q.device.type):  # the op computes in the inputs' (>= float32) dtype
            return _ChunkOneTile._forward(ctx, q, k, v, Gk, Gv, S0)

    @staticmethod
    @first_order("linear_recurrence (mode 'chunk')", "linear_recurrence(..., chunk_backward='autograd'), or mode 'recurrent' or 'scan'")
    def backward(ctx, do, dS):
        with autocast_off(do.device.type):
            return _ChunkOneTile._backward(ctx, do, dS)

    @staticmethod
    def _forward(ctx, q, k, v, Gk, Gv, S0):
        B, H, n, C, K = q.shape
        V = v.shape[-1]
        Ek = Ev = None
        q_i, k_i, v_i = q, k, v
        if Gk is not None:
            Ek = torch.exp(Gk - Gk[..., :1, :])
            q_i, k_i = q * Ek, k / Ek
        if Gv is not None:
            Ev = torch.exp(Gv - Gv[..., :1, :])
            v_i = v / Ev
        first, write, decay = _chunk_scales(Gk, Gv)
        U = k_i.transpose(-1, -2) @ v_i  # [B,H,n,K,V]
        if write is not None:
            U = U * write
        S_all = torch.empty(B, H, n + 1, K, V, dtype=U.dtype, device=U.device)  # states at the chunk boundaries
        S = S0 if S0 is not None else torch.zeros(B, H, K, V, dtype=U.dtype, device=U.device)
        S_all[:, :, 0] = S
        decays = decay.unbind(2) if decay is not None else (None,) * n
        for i, (U_i, d_i) in enumerate(zip(U.unbind(2), decays)):
            S = torch.addcmul(U_i, S, d_i) if d_i is not None else S + U_i
            S_all[:, :, i + 1] = S
        S_in = S_all[:, :, :n] * first if first is not None else S_all[:, :, :n]
        flat = _flat3
        A = torch.bmm(flat(q_i), flat(k_i).transpose(-1, -2)).tril_()
        o = torch.baddbmm(torch.bmm(flat(q_i), flat(S_in)), A, flat(v_i)).view(B, H, n, C, V)
        if Ev is not None:
            o = o * Ev
        ctx.has_S0 = S0 is not None
        ctx.shapes = (Gk is not None and Gk.shape[-1] == 1,)
        ctx.save_for_backward(q_i, k_i, v_i, Gk, Gv, S_all, o if Gv is not None else None)
        return o, S

    @staticmethod
    def _backward(ctx, do, dS):
        # temporaries are freed as soon as they are used and products accumulate in place:
        # the backward's peak stays a few [B, H, n, C, K|V] tensors above what was kept
        q_i, k_i, v_i, Gk, Gv, S_all, o = ctx.saved_tensors
        (per_head,) = ctx.shapes
        B, H, n, C, K = q_i.shape
        V = v_i.shape[-1]
        flat, cj = _flat3, _cj
        first, write, decay = _chunk_scales(Gk, Gv)
        Ev = torch.exp(Gv - Gv[..., :1, :]) if Gv is not None else None
        dY = do * cj(Ev) if Ev is not None else do.contiguous()
        dYf = flat(dY)
        # adjoint of the chunk-boundary states, backwards over the chunks
        P = torch.bmm(flat(cj(q_i)).transpose(-1, -2), dYf).view(B, H, n, K, V)
        if first is not None:
            P.mul_(cj(first))
        dS_out = torch.empty(B, H, n, K, V, dtype=P.dtype, device=P.device)
        g = dS
        decays = decay.unbind(2) if decay is not None else (None,) * n
        for i in range(n - 1, -1, -1):
            dS_out[:, :, i] = g
            g = torch.addcmul(P[:, :, i], g, cj(decays[i])) if decays[i] is not None else g + P[:, :, i]
        dS0 = g if ctx.has_S0 else None
        del P
        # gradient of each chunk's last log-decay: Σ dS_out ⊙ conj(S_out), reduced now
        last_k = last_v = None
        if Gk is not None or Gv is not None:
            dL = dS_out * cj(S_all[:, :, 1:])
            last_k = dL.sum(-1) if Gk is not None else None  # [B,H,n,K]
            last_v = dL.sum(-2) if Gv is not None else None  # [B,H,n,V]
            del dL
        M = dS_out.mul_(cj(write)) if write is not None else dS_out

        qf, kf, vf = flat(cj(q_i)), flat(cj(k_i)), flat(cj(v_i))
        A = torch.bmm(flat(q_i), flat(k_i).transpose(-1, -2)).tril_()
        dv_i = torch.bmm(kf, flat(M)).baddbmm_(cj(A).transpose(-1, -2), dYf).view(v_i.shape)
        del A
        dA = torch.bmm(dYf, vf.transpose(-1, -2)).tril_()
        dk_i = torch.bmm(vf, flat(M).transpose(-1, -2)).baddbmm_(dA.transpose(-1, -2), qf).view(k_i.shape)
        del M
        S_in = S_all[:, :, :n] * first if first is not None else S_all[:, :, :n]
        dq_i = torch.bmm(dYf, flat(cj(S_in)).transpose(-1, -2)).baddbmm_(dA, kf).view(q_i.shape)
        del dA, S_in, dY, dYf

        dGk = dGv = None
        if Gk is not None:
            dGk = dq_i * cj(q_i)
            dGk.addcmul_(dk_i, cj(k_i), value=-1)
            if per_head:
                dGk = dGk.sum(-1, keepdim=True)
                last_k = last_k.sum(-1, keepdim=True)
            dGk[..., -1, :] += last_k
            Ek = torch.exp(Gk - Gk[..., :1, :])
            dq = dq_i.mul_(cj(Ek))
            dk = dk_i.div_(cj(Ek))
            del Ek
        else:
            dq, dk = dq_i, dk_i
        if Gv is not None:
            dGv = do * cj(o)
            dGv.addcmul_(dv_i, cj(v_i), value=-1)
            dGv[..., -1, :] += last_v
            dv = dv_i.div_(cj(Ev))
        else:
            dv = dv_i
        return dq, dk, dv, dGk, dGv, dS0


def _flat3(x):  # [.., C, X] -> [N, C, X] for bmm (a view when x is contiguous)
    return x.reshape(-1, *x.shape[-2:])


def _chunk_scales(Gk, Gv):
    """Per-chunk factors on the state, each [B, H, n, K|1, V|1] or None:
    e^{F} e^{F_W} (first token's decay), e^{L-F} e^{L_W-F_W} (write) and e^{L} e^{L_W} (decay across the chunk)."""
    if Gk is None and Gv is None:
        return None, None, None
    first = write = decay = None
    for G, unsq in ((Gk, -1), (Gv, -2)):
        if G is None:
            continue
        F, L = G[..., 0, :].unsqueeze(unsq), G[..., -1, :].unsqueeze(unsq)
        f, w, d = _decay_exp(F), _decay_exp(L - F), _decay_exp(L)
        first = f if first is None else first * f
        write = w if write is None else write * w
        decay = d if decay is None else decay * d
    return first, write, decay


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def chunk_size_for(T: int, K: int, V: int, *, keywise: bool = True, valuewise: bool = False) -> int:
    """The chunk size C that ``chunk_size=None`` uses: the power of two at or above max(K, V),
    clamped to [32, 128], and not above the power of two at or above T.

    Measured with ``python bench/recurrence.py --chunk-sweep`` (docs/performance.md; fwd+bwd of
    the hand-written backward on a loaded 2-core CPU): K = V = 64 key-wise, B = 2: best C = 64
    at T = 1024, 128 at T = 2048 (64 within 0.2%) and at T = 4096 (64 15% slower); exploratory
    runs at T = 4096: K = V = 16 -> 32, 32 -> 64 (32 within 7%), 128 -> 128. Per token the
    intra-chunk matmuls cost 2C(K+V) flops, the state's 4KV, plus a Python step per chunk:
    C near the head size balances them, and small C makes matmuls too thin for BLAS. The
    decay kind does not enter the rule (keywise and valuewise are accepted for a finer table).
    """
    def pow2_at_least(n: int) -> int:
        return 1 << (max(n, 1) - 1).bit_length()

    return min(min(128, max(32, pow2_at_least(max(K, V)))), pow2_at_least(T))


def auto_mode(T: int, K: int, V: int, *, keywise: bool, valuewise: bool, complex_: bool, chunk_size: int,
              strong_decays: bool = False) -> str:
    """The mode ``mode="auto"`` runs, from rules measured by ``bench/recurrence.py`` on CPU.

    * T == 1: ``recurrent`` (a single step).
    * T <= chunk_size: ``parallel`` (one small masked matmul).
    * key- or value-wise decays with a small state per head (K·V <= 64, e.g. S6 with
      K = d_state, V = 1): ``scan`` (``recurrent`` for complex inputs); the loop over T tiny
      elementwise updates beats the tiled chunk form, whose matmuls are too thin to pay off,
      and the scan's hand-written backward beats autograd through the loop (forward+backward
      1.8x at bench/recurrence.py's S6-like shape).
    * value-wise decays with K == 1 (a diagonal state: every value channel its own scalar
      recurrence, as RWKV-4, the RG-LRU and the LinRNNs run, their heads folded into one of
      H·V channels) whose decays are too strong for tiles of _TILE tokens (``strong_decays``:
      max|log α| > _MAX_LOG_GROWTH / _TILE, a host read by :func:`linear_recurrence`): ``scan``
      too, however wide V. The chunk form would run in tiles of fewer tokens, down to one (RWKV-4's
      decays reach e^{-20} per step); with weaker decays it beats the scan
      (``python bench/recurrence.py --cases diagonal``: docs/performance.md).
    * otherwise ``chunk``.
    """
    if T == 1:
        return "recurrent"
    if T <= chunk_size:
        return "parallel"
    if ((keywise or valuewise) and K * V <= 64) or (valuewise and K == 1 and strong_decays):
        return "recurrent" if complex_ else "scan"
    return "chunk"


@full_precision
def linear_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int | None = None,
    sub_chunk_size: int | None = None,
    check_values: bool = True,
    chunk_backward: str = "manual",
    backend: str = "auto",
):
    """Runs S_t = (exp(gk_t)ᵀ exp(gv_t)) ⊙ S_{t-1} + k_tᵀ v_t, o_t = scale · q_t S_t.

    Args:
        q, k: [B, T, H, K]. v: [B, T, H, V].
        gk: key-wise log-decay [B, T, H, K], one per head [B, T, H], or None (no decay).
        gv: value-wise log-decay [B, T, H, V] or None.
        scale: multiplies the output (flash-linear-attention uses K**-0.5; the DSF
            paper drops it, hence the default 1).
        initial_state: [B, H, K, V] or None (zeros).
        output_final_state: also return S_T.
        mode: "recurrent", "scan", "chunk", "parallel", "step" (T == 1) or "auto". "step" with
            ``check_values=False`` (a mixer's decoding step on inputs it built) runs the step without the
            argument checks.
        chunk_size: C of the chunk mode (any T works; the tail chunk is padded); None picks
            it from the shape by the rule measured on CPU (:func:`chunk_size_for`).
        sub_chunk_size: upper bound on the tile c used for key/value-wise decays in chunk mode (every tile
            size is exact); None: one tile per chunk where a host read shows the decays allow it, else
            tiles of 16 tokens (:func:`_tile_size`).
        check_values: also check for NaN/Inf and positive log-decays (one host read of each input, where
            ``seqmix.debug`` allows it: by default on CPU tensors in eager mode).
        chunk_backward: "manual" (default): the chunk mode's hand-written backward
            (:class:`_ChunkOneTile`; keeps O(T(K+V)) per head and recomputes the rest) wherever a
            chunk is one tile; "autograd": autograd through the chunk form (its graph keeps every
            intermediate; the "before" of bench/recurrence.py). Strong decays that need
            sub-chunk tiles always use autograd.
        backend: "auto" (default), "torch" or an optional kernel library ("fla");
            see :mod:`seqmix.ops.backends`. "auto" uses an installed backend only where it
            covers the call, otherwise this pure-PyTorch implementation.

    Returns:
        (o [B, T, H, V], final_state [B, H, K, V] or None)
    """
    if mode == "step" and not check_values and backend == "auto" and q.dim() == 4 and q.shape[1] == 1:
        # a mixer's decoding step on inputs it built (check_values=False): the step itself, no argument checks
        # and no backend lookup (no kernel backend runs a step)
        o, S = _recurrence_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0] if gk is not None else None,
                                gv[:, 0] if gv is not None else None, initial_state, scale)
        return o.unsqueeze(1), (S if output_final_state else None)
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size, _WHERE)
    check_choice("chunk_backward", chunk_backward, CHUNK_BACKWARDS, _WHERE)
    if sub_chunk_size is not None:
        check_positive_int("sub_chunk_size", sub_chunk_size, _WHERE)
    B, T, H, K, V = _check_inputs(q, k, v, gk, gv, initial_state, check_values=check_values, where=_WHERE)
    if backend != "torch":
        be = _backends.resolve(_WHERE, backend, _backends.Call(
            _WHERE, q.device.type, q.dtype, mode, dict(
                K=K, V=V, valuewise=gv is not None,
                complex=any(t is not None and t.is_complex() for t in (q, k, v, gk, gv, initial_state)))))
        if be.name != "torch":
            o, S = be.run[_WHERE](q, k, v, gk, scale=scale, initial_state=initial_state, output_final_state=output_final_state)
            return o, (S if output_final_state else None)
    if mode == "step":
        if T != 1:
            raise ValueError(f"{_WHERE}: mode 'step' takes one token (T == 1), got T = {T}; use 'recurrent' or 'chunk'")
        o, S = _recurrence_step(  # the inputs were checked above: the step itself (decoding's overhead)
            q[:, 0], k[:, 0], v[:, 0],
            gk[:, 0] if gk is not None else None,
            gv[:, 0] if gv is not None else None,
            initial_state, scale,
        )
        return o.unsqueeze(1), (S if output_final_state else None)

    if chunk_size is None:
        chunk_size = chunk_size_for(T, K, V, keywise=gk is not None and gk.dim() == 4 and K > 1, valuewise=gv is not None)
    dt = _compute_dtype(q, k, v, gk, gv, initial_state)
    out_dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) and not dt.is_complex else dt
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    if gk is not None:
        gk = (gk.unsqueeze(-1) if gk.dim() == 3 else gk).to(dt)
    gv = gv.to(dt) if gv is not None else None
    S0 = initial_state.to(dt) if initial_state is not None else None

    if mode == "auto":
        # a diagonal state's decays: whether the chunk form's tiles would be shorter than _TILE tokens (a tile of
        # c tokens spans at most c·max|log α|, which _tile_size keeps below _MAX_LOG_GROWTH)
        strong = gv is not None and K == 1 and T > chunk_size and reads_values(gv) \
            and float((gv.real if gv.is_complex() else gv).detach().min()) * _TILE < -_MAX_LOG_GROWTH
        mode = auto_mode(
            T, K, V,
            keywise=gk is not None and gk.shape[-1] > 1,
            valuewise=gv is not None,
            complex_=dt.is_complex,
            chunk_size=chunk_size,
            strong_decays=strong,
        )
    if mode == "scan" and dt.is_complex:
        mode = "recurrent"  # the scan's hand-written backward is for real inputs: the reference loop
    if mode in ("recurrent", "scan"):
        if S0 is None:
            S0 = torch.zeros(B, H, K, V, dtype=dt, device=q.device)
        o, S = (_recurrent if mode == "recurrent" else _scan)(q, k, v, gk, gv, scale, S0)
    elif mode == "parallel":
        o, S = _parallel(q, k, v, gk, gv, scale, S0, output_final_state)
    elif sub_chunk_size is None and (g := _fixed_decay(gk, gv, q, k, v, S0)) is not None:
        o, S = _chunk_fixed(q, k, v, g, scale, S0, chunk_size, output_final_state)  # a decay no token changes
    else:
        o, S = _chunk(q, k, v, gk, gv, scale, S0, chunk_size, sub_chunk_size, output_final_state, chunk_backward)
    return o.to(out_dtype), (S if output_final_state else None)


@full_precision
def recurrence_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    check_values: bool = True,
    check_shapes: bool = True,
    delayed: bool = False,
):
    """One decoding step. q, k [B, H, K]; v [B, H, V]; gk [B, H, K] or [B, H]; gv [B, H, V];
    state [B, H, K, V] or None (zeros). Returns (o [B, H, V], new state [B, H, K, V]): :func:`fused_step`,
    the state written in place inside :func:`~seqmix.ops.inplace.states_in_place`.
    ``delayed``: o = scale·q S_{t-1}, the state before this token's write (RWKV's bonus form, where the
    current token enters through a term of its own; the full-sequence modes get it by shifting k, v
    and the decay one step later). ``check_shapes=False`` (with ``check_values=False``): a caller that
    built the inputs itself (a mixer's decoding step) skips the argument checks."""
    if check_shapes or check_values:
        _check_inputs(q, k, v, gk, gv, state, check_values=check_values, where="recurrence_step", step=True)
    return _recurrence_step(q, k, v, gk, gv, state, scale, delayed)


def _recurrence_step(q, k, v, gk, gv, state, scale, delayed=False):
    """:func:`recurrence_step` after its checks (shapes as there; autocast already off): :func:`fused_step` in
    the compute dtype, the state written in place inside :func:`~seqmix.ops.inplace.states_in_place`."""
    dt = _step_dtype(q, k, v, gk, gv, state)
    out_dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) and not dt.is_complex else dt
    if state is None:
        S, in_place = torch.zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], dtype=dt, device=q.device), True
    else:
        S, in_place = (state, True) if writable(state, dt) else (state if state.dtype == dt else state.to(dt), False)
    if q.dtype != dt or k.dtype != dt or v.dtype != dt or (gk is not None and gk.dtype != dt) or (gv is not None and gv.dtype != dt):
        q, k, v, gk, gv = (t if t is None or t.dtype == dt else t.to(dt) for t in (q, k, v, gk, gv))
    o, S = fused_step(S, q, k, v, gk, gv, scale, delayed, in_place)
    return (o if out_dtype == dt else o.to(out_dtype)), S


def _step_dtype(*tensors) -> torch.dtype:
    """:func:`_compute_dtype` with the common case first: every tensor of one full-precision dtype."""
    dt = tensors[0].dtype
    if dt in (torch.float32, torch.float64):
        for t in tensors:
            if t is not None and t.dtype != dt:
                return _compute_dtype(*tensors)
        return dt
    return _compute_dtype(*tensors)


def fused_step(S, q, k, v, gk, gv, scale, delayed=False, in_place=False):
    """One step of the recurrence in as few kernels as it takes: the same update as :func:`_step` (the
    reference), S ← (exp(gk)ᵀ exp(gv)) ⊙ S + kᵀ v as an in-place decay (``mul_``) and one ``addcmul_``, and the
    read o = scale · q S as one batched matmul (``delayed``: of the state before the update).

    S [B, H, K, V]; q, k [B, H, K]; v [B, H, V]; gk [B, H, K] (key-wise) or [B, H] (per head) or None;
    gv [B, H, V] or None: log-decays (not exponentiated, unlike :func:`_step`). Every tensor in the compute
    dtype. ``in_place``: S is the caller's to overwrite (the returned state is S itself); otherwise S is left
    as it is and a new state is returned. Returns (o [B, H, V], the new state)."""
    o = _read(q, S) if delayed else None
    fresh = in_place  # whether S may be written: the caller's buffer, or a tensor made here
    if gk is not None:  # key-wise [B, H, K, 1] or per head [B, H, 1, 1]
        a = gk.exp()
        a = a.unsqueeze(-1) if gk.dim() == 3 else a.view(*a.shape, 1, 1)
        S = S.mul_(a) if fresh else S * a
        fresh = True
    if gv is not None:  # value-wise [B, H, 1, V]
        a = gv.exp().unsqueeze(-2)
        S = S.mul_(a) if fresh else S * a
        fresh = True
    k_, v_ = k.unsqueeze(-1), v.unsqueeze(-2)
    S = S.addcmul_(k_, v_) if fresh else torch.addcmul(S, k_, v_)
    if not delayed:
        o = _read(q, S)
    return (o.mul_(scale) if scale != 1.0 else o), S


def _read(q: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """q S per head: q [B, H, K], S [B, H, K, V] -> [B, H, V], one batched matrix-vector product (``bmm`` on
    [B·H] heads where S's layout allows it without a copy; with K = 1 one elementwise product)."""
    B, H, K = q.shape
    if K == 1:  # a vector state per head (the LinRNNs: one key channel): q S is a product per value channel
        return S[:, :, 0] * q
    if S.is_contiguous():
        return torch.bmm(q.reshape(B * H, 1, K), S.view(B * H, K, -1)).view(B, H, -1)
    return torch.matmul(q.unsqueeze(-2), S).squeeze(-2)


@full_precision
def recurrence_map(
    q: torch.Tensor,
    k: torch.Tensor,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    check_values: bool = True,
) -> torch.Tensor:
    """The materialized causal map of the recurrence (zero initial state).

    Returns [B, H, T, T] when there is no value-wise decay, with
    o[:, t, h] = Σ_s A[:, h, t, s] v[:, s, h]; otherwise one map per value channel,
    [B, H·V, T, T] (head-major: index h·V + v).
    """
    where = "recurrence_map"
    V = gv.shape[-1] if gv is not None else 1
    dummy_v = q.new_zeros(q.shape[:-1] + (V,)) if not q.is_complex() else q.real.new_zeros(q.shape[:-1] + (V,))
    _check_inputs(q, k, dummy_v, gk, gv, None, check_values=check_values, where=where)
    dt = _compute_dtype(q, k, gk, gv)
    q, k = q.to(dt), k.to(dt)
    if gk is not None:
        gk = (gk.unsqueeze(-1) if gk.dim() == 3 else gk).to(dt)
    gv = gv.to(dt) if gv is not None else None
    A = _map(q, k, gk, gv, scale)
    if gv is not None:
        A = A.flatten(1, 2)
    return A
