"""Log-linear attention (Guo et al. 2025, "Log-Linear Attention"): a base linear recurrence whose
keys are split into O(log T) Fenwick-tree buckets, each read with its own data-dependent weight.

For a query at absolute position i and a key at j <= i, the Fenwick level is

    level(i, j) = 0                          if i == j
                = bitlen(i xor j)            otherwise     (= floor(log2(i xor j)) + 1)

i.e. the prefix [0, i] is cut into the token i itself (level 0) and, for each set bit b of i,
the block of 2^b tokens just before the lower bits of i (level b + 1): the partition of
flash-linear-attention's ``construct_level_mask`` (checked in tests/test_log_linear.py). With
λ_i^(ℓ) >= 0 the level weights of query i (paper §3, eq. for o_t):

    o_i = Σ_ℓ λ_i^(ℓ) q_i S_i^(ℓ),     S_i^(ℓ) = Σ_{j: level(i,j) = ℓ} Π(i ← j) β_j k_jᵀ v_j

    Φ = Φ_base ⊙ H,     H[i, j] = λ_i^(level(i, j))            (paper eq. 6 / §3.2)

where Π(i ← j) is the base transition from j to i:

    base "linear" (beta None): Π = exp(Σ_{r=j+1..i} g_r), the scalar/key-wise decay of
        :func:`~seqmix.ops.linear_recurrence` (log-linear Mamba-2: q = C, k = ΔB, v = x);
    base "delta" (beta given): Π = M_i ⋯ M_{j+1}, M_r = (I − β_r k_rᵀk_r) Diag(α_r), the gated
        delta rule of :func:`~seqmix.ops.delta_rule` (log-linear Gated DeltaNet).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; level_scales λ [B, T, H, L] (L levels available:
positions up to 2^(L−1) − 1, i.e. T <= 2^(L−1) from position 0); g [B, T, H] or [B, T, H, K]
(log-decay <= 0) or None; beta [B, T, H] or None. State: [B, H, n, K, V], the n =
:func:`levels_needed` (tokens seen) Fenwick level states of the last position (level 0 = that
token's own write), plus the position ``offset`` (tokens seen), which the caller carries.

Modes (all the same numbers; tests tie each to ``parallel``):

* ``parallel``: the reference. Materializes H and the base map (``recurrence_map`` /
  ``delta_rule_map``) and applies Φ_base ⊙ H: O(T²), obviously correct. A carried state adds
  each stored level's free response (the base op with v = 0, one run per level, levels folded
  into the batch) weighted by λ_i at its new level max(ℓ, bitlen((offset−1) xor i)); the final
  state is the base op run with v masked to each new level's tokens (the state is linear in v).
* ``recurrent``: the Fenwick recurrence, O(log T) states. At position p > 0 the binary counter
  carries: with c = ctz(p), levels 0..c of position p−1 merge into level c+1 (which is empty:
  bit c of p−1 is 0), then every level state takes one base step (``recurrence_step`` /
  ``delta_rule_step``, levels folded into the batch) with v written only into level 0.
* ``chunk``: ``parallel`` on chunks of ``chunk_size`` tokens, each continuing from the previous
  chunk's level states: O(T·C) for the masks plus O(T log T) for the level states.
* ``step``: one token (T == 1): one iteration of ``recurrent``.

Half inputs are computed in float32 (the ops it calls do so too); the output is cast back.
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, fmt_shape, reads_values
from .delta_rule import delta_rule, delta_rule_map, delta_rule_step
from .precision import full_precision
from .recurrence import _check_qkv, _compute_dtype, linear_recurrence, recurrence_map, recurrence_step

MODES = ("recurrent", "chunk", "parallel", "step")
_WHERE = "log_linear_attention"


def levels_needed(n_tokens: int) -> int:
    """Level states held after ``n_tokens`` tokens (those of position n_tokens − 1): bitlen(n−1) + 1
    (0 for no token)."""
    return (n_tokens - 1).bit_length() + 1 if n_tokens > 0 else 0


def _bitlen(x: torch.Tensor, below: int) -> torch.Tensor:
    """bitlen of non-negative int64 entries (0 -> 0), each of them < 2^bitlen(below), exactly: a loop over
    the bits whose length is known without reading x (positions p < below give p ^ p' < 2^bitlen(below))."""
    out = torch.zeros_like(x)
    y = x.clone()
    for _ in range(max(int(below), 1).bit_length()):
        out += (y > 0).long()
        y = y >> 1
    return out


def fenwick_levels(T: int, offset: int = 0, device=None) -> torch.Tensor:
    """[T, T] int64: level(offset + i, offset + j) for j <= i, −1 above the diagonal."""
    p = torch.arange(offset, offset + T, device=device)
    lev = _bitlen(p.unsqueeze(1) ^ p.unsqueeze(0), offset + T)
    return torch.where(p.unsqueeze(1) >= p.unsqueeze(0), lev, torch.full_like(lev, -1))


def hierarchical_mask(level_scales: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """H [B, H, T, T] with H[i, j] = λ_i^(level(offset+i, offset+j)) for j <= i, 0 above the diagonal.
    level_scales: [B, T, H, L]."""
    Bt, T, Hh, L = level_scales.shape
    lev = fenwick_levels(T, offset, level_scales.device)  # [T, T]
    lam = level_scales.permute(0, 2, 1, 3)  # [B, H, T, L]
    Hm = torch.gather(lam, -1, lev.clamp(min=0).expand(Bt, Hh, T, T))
    return Hm * (lev >= 0)


def _check(q, k, v, level_scales, g, beta, S0, offset, *, check_values):
    Bt, T, H, K, V = _check_qkv(q, k, v, _WHERE)
    check_tensor("level_scales", level_scales, rank=4, layout="[B, T, H, L]", where=_WHERE)
    check_shape("level_scales", level_scales, (Bt, T, H, None), "[B, T, H, L]", _WHERE)
    L = level_scales.shape[-1]
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{_WHERE}: argument 'offset' (tokens already seen) must be an int >= 0, got {offset!r}")
    need = levels_needed(offset + T)
    if need > L:
        raise ValueError(
            f"{_WHERE}: argument 'level_scales' has L = {L} levels, but positions up to {offset + T - 1} need {need} "
            f"(T + offset <= 2^(L-1) = {2 ** (L - 1)}); give more levels or a shorter sequence"
        )
    if g is not None and g.shape not in ((Bt, T, H), (Bt, T, H, K)):
        raise ValueError(f"{_WHERE}: argument 'g' (log-decay) must be [B, T, H] or [B, T, H, K] = {fmt_shape((Bt, T, H, K))}, got {fmt_shape(g.shape)}")
    if beta is not None:
        check_shape("beta", beta, (Bt, T, H), "[B, T, H]", _WHERE)
    if S0 is not None:
        n0 = levels_needed(offset)
        check_tensor("initial_state", S0, rank=5, layout="[B, H, n, K, V]", where=_WHERE)
        check_shape("initial_state", S0, (Bt, H, n0, K, V), f"[B, H, n = levels_needed(offset = {offset}), K, V]", _WHERE)
    if check_values and reads_values(q):
        for name, t in (("q", q), ("k", k), ("v", v), ("level_scales", level_scales), ("g", g), ("beta", beta), ("initial_state", S0)):
            if t is not None:
                check_finite(name, t, _WHERE)
        if g is not None and float(g.detach().max()) > 0:
            raise ValueError(f"{_WHERE}: argument 'g' holds log-decays and must be <= 0; got a maximum of {float(g.detach().max()):.4g}")
    return Bt, T, H, K, V, L


# --------------------------------------------------------------------------------------
# the base system, levels folded into the batch
# --------------------------------------------------------------------------------------


def _rep(t, n):  # [B, ...] -> [n·B, ...] (level-major)
    return None if t is None else t.unsqueeze(0).expand(n, *t.shape).reshape(n * t.shape[0], *t.shape[1:])


def _base_run(q, k, v, g, beta, scale, S0, n, mode):
    """The base op on n level copies (q, k, g, beta repeated; v [n·B, T, H, V], S0 [n·B, H, K, V] or None):
    (o [n·B, T, H, V], final state [n·B, H, K, V])."""
    if beta is None:
        return linear_recurrence(_rep(q, n), _rep(k, n), v, _rep(g, n), scale=scale, initial_state=S0,
                                 output_final_state=True, mode=mode, check_values=False, backend="torch")
    return delta_rule(_rep(q, n), _rep(k, n), v, _rep(beta, n), _rep(g, n), scale=scale, initial_state=S0,
                      output_final_state=True, mode=mode, check_values=False)


def _base_map(q, k, g, beta, scale):
    if beta is None:
        return recurrence_map(q, k, g, scale=scale, check_values=False)
    return delta_rule_map(q, k, beta, g, scale=scale, check_values=False)


def _levels(S):  # [B, H, n, K, V] -> [n, B, H, K, V]
    return S.permute(2, 0, 1, 3, 4)


# --------------------------------------------------------------------------------------
# parallel (the reference) on one segment that continues from a state
# --------------------------------------------------------------------------------------


def _segment(q, k, v, lam, g, beta, scale, S0, offset, want_state, base_mode="parallel"):
    """One segment of T tokens at absolute positions offset.. offset+T−1 (parallel form)."""
    Bt, T, H, K = q.shape
    V = v.shape[-1]
    Phi = _base_map(q, k, g, beta, scale) * hierarchical_mask(lam, offset)  # [B, H, T, T]
    o = torch.einsum("bhts,bshv->bthv", Phi, v)
    p = torch.arange(offset, offset + T, device=q.device)
    if S0 is not None and offset > 0:
        n0 = S0.shape[2]
        zero_v = v.new_zeros(n0 * Bt, T, H, V)
        o_l, _ = _base_run(q, k, zero_v, g, beta, scale, _levels(S0).reshape(n0 * Bt, H, K, V), n0, base_mode)
        o_l = o_l.view(n0, Bt, T, H, V)
        m = _bitlen((offset - 1) ^ p, offset + T)  # [T]: the level of token offset−1 seen from each new position
        lev = torch.maximum(torch.arange(n0, device=q.device).unsqueeze(1), m.unsqueeze(0))  # [n0, T]
        w = torch.gather(lam.unsqueeze(0).expand(n0, *lam.shape), -1,
                         lev.view(n0, 1, T, 1, 1).expand(n0, Bt, T, H, 1))  # [n0, B, T, H, 1]
        o = o + (w * o_l).sum(0)
    S = None
    if want_state:
        end = offset + T - 1
        n = levels_needed(offset + T)
        lev_new = _bitlen(end ^ p, offset + T)  # [T]: level of each new token seen from the last position
        onehot = (lev_new.unsqueeze(0) == torch.arange(n, device=q.device).unsqueeze(1)).to(v.dtype)  # [n, T]
        v_masked = (onehot.view(n, 1, T, 1, 1) * v.unsqueeze(0)).reshape(n * Bt, T, H, V)
        S_in = None
        if S0 is not None and offset > 0:
            n0 = S0.shape[2]
            m_end = (end ^ (offset - 1)).bit_length()
            to = torch.arange(n0, device=S0.device).clamp(min=m_end)  # stored level ℓ -> level max(ℓ, m_end)
            regroup = (to.unsqueeze(0) == torch.arange(n, device=S0.device).unsqueeze(1)).to(S0.dtype)  # [n, n0]
            S_in = torch.einsum("ml,bhlkv->mbhkv", regroup, S0).reshape(n * Bt, H, K, V)
        _, S = _base_run(q, k, v_masked, g, beta, scale, S_in, n, base_mode)
        S = S.view(n, Bt, H, K, V).permute(1, 2, 0, 3, 4)
    return o, S


def _chunk(q, k, v, lam, g, beta, scale, S0, offset, C, want_state):
    T = q.shape[1]
    outs, S = [], S0
    for s in range(0, T, C):
        e = min(s + C, T)
        sl = slice(s, e)
        o, S = _segment(q[:, sl], k[:, sl], v[:, sl], lam[:, sl], g[:, sl] if g is not None else None,
                        beta[:, sl] if beta is not None else None, scale, S, offset + s, want_state or e < T)
        outs.append(o)
    return torch.cat(outs, 1), S


# --------------------------------------------------------------------------------------
# recurrent: the Fenwick states
# --------------------------------------------------------------------------------------


def _ctz(p: int) -> int:
    return (p & -p).bit_length() - 1


def _recurrent(q, k, v, lam, g, beta, scale, S0, offset):
    Bt, T, H, K = q.shape
    V = v.shape[-1]
    zero = q.new_zeros(Bt, H, K, V)
    levels = list(_levels(S0).unbind(0)) if S0 is not None and offset > 0 else []
    outs = []
    qs, ks, vs, ls = q.unbind(1), k.unbind(1), v.unbind(1), lam.unbind(1)
    gs = g.unbind(1) if g is not None else (None,) * T
    bs = beta.unbind(1) if beta is not None else (None,) * T
    for t in range(T):
        p = offset + t
        if p == 0:
            levels = [zero]
        else:  # the binary counter carries: levels 0..c merge into level c + 1 (empty before)
            c = _ctz(p)
            levels = levels + [zero] * (c + 2 - len(levels))
            merged = levels[0]
            for lv in levels[1 : c + 2]:
                merged = merged + lv
            levels = [zero] * (c + 1) + [merged] + levels[c + 2 :]
        n = len(levels)
        S = torch.stack(levels, 0).reshape(n * Bt, H, K, V)
        v_in = torch.cat([vs[t].unsqueeze(0), vs[t].new_zeros(n - 1, Bt, H, V)], 0).reshape(n * Bt, H, V)
        if beta is None:
            o, S = recurrence_step(_rep(qs[t], n), _rep(ks[t], n), v_in, _rep(gs[t], n), state=S, scale=scale, check_values=False)
        else:
            o, S = delta_rule_step(_rep(qs[t], n), _rep(ks[t], n), v_in, _rep(bs[t], n), _rep(gs[t], n), S, scale=scale,
                                   check_values=False)
        levels = list(S.view(n, Bt, H, K, V).unbind(0))
        w = ls[t][..., :n].permute(2, 0, 1).unsqueeze(-1)  # [n, B, H, 1]
        outs.append((w * o.view(n, Bt, H, V)).sum(0))
    S = torch.stack(levels, 2) if levels else None
    return torch.stack(outs, 1), S


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


@full_precision
def log_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    level_scales: torch.Tensor,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    offset: int = 0,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
):
    """o_i = Σ_ℓ λ_i^(ℓ) q_i S_i^(ℓ) over the Fenwick levels (module docstring); Φ = Φ_base ⊙ H.

    Args:
        q, k: [B, T, H, K]. v: [B, T, H, V].
        level_scales: λ [B, T, H, L] (>= 0 in the mixers: softplus), L >= levels_needed(offset + T).
        g: log-decay <= 0, [B, T, H] or [B, T, H, K], or None.
        beta: None (base: the linear recurrence, log-linear Mamba-2) or [B, T, H] in [0, 2]
            (base: the gated delta rule, log-linear Gated DeltaNet).
        scale: multiplies the output.
        initial_state: [B, H, levels_needed(offset), K, V] or None (zeros).
        offset: tokens already seen (the absolute position of the first token): the Fenwick
            partition depends on absolute positions.
        output_final_state: also return the level states [B, H, levels_needed(offset + T), K, V].
        mode: "parallel" (reference), "recurrent", "chunk", "step" (T == 1) or "auto".
        chunk_size: C of the chunk mode.

    Returns:
        (o [B, T, H, V], final state or None)
    """
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    check_positive_int("chunk_size", chunk_size, _WHERE)
    Bt, T, H, K, V, L = _check(q, k, v, level_scales, g, beta, initial_state, offset, check_values=check_values)
    if mode == "step" and T != 1:
        raise ValueError(f"{_WHERE}: mode 'step' takes one token (T == 1), got T = {T}; use 'recurrent' or 'chunk'")
    out_dtype = q.dtype
    dt = _compute_dtype(q, k, v, level_scales, g, beta, initial_state)
    q, k, v, lam = q.to(dt), k.to(dt), v.to(dt), level_scales.to(dt)
    g = g.to(dt) if g is not None else None
    beta = beta.to(dt) if beta is not None else None
    S0 = initial_state.to(dt) if initial_state is not None else None
    if mode == "auto":
        mode = "recurrent" if T == 1 else ("parallel" if T <= chunk_size else "chunk")
    if mode in ("recurrent", "step"):
        o, S = _recurrent(q, k, v, lam, g, beta, scale, S0, offset)
    elif mode == "parallel":
        o, S = _segment(q, k, v, lam, g, beta, scale, S0, offset, output_final_state)
    else:
        o, S = _chunk(q, k, v, lam, g, beta, scale, S0, offset, chunk_size, output_final_state)
    return o.to(out_dtype), (S if output_final_state else None)
