"""The generalized delta rule: a linear recurrence with a rank-one (non-diagonal) transition.

In the row convention of :func:`~seqmix.ops.linear_recurrence` (state S ∈ R^{K×V} per head,
k_t a row vector, k_tᵀ v_t ∈ R^{K×V}, o_t = scale · q_t S_t):

    S_t = (I − β_t k_tᵀ k_t) Diag(α_t) S_{t-1} + β_t k_tᵀ v_t,        o_t = scale · q_t S_t

that is: decay first (α_t ∈ (0, 1], one per head or one per key channel), then the delta
rule on the decayed state, S ← S + β_t k_tᵀ (v_t − k_t S): the value stored under k_t
moves a fraction β_t of the way to v_t. The papers write the same update in the column
convention (state ∈ R^{V×K}, o = S q): S_t = S_{t-1} α_t (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ
(DeltaNet, Yang et al. 2024, eq. 1-2 of §2.2; Gated DeltaNet, Yang, Kautz, Hatamizadeh
2025, eq. 10); the transition acts on the key side, so in our convention it multiplies S
from the left. Decay before the delta step, as in Gated DeltaNet's and KDA's reference
recurrences (with a key-wise α the two orders differ: here the transition is
(I − β kᵀk) Diag(α)).

    α = 1        DeltaNet            g None
    α_t scalar   Gated DeltaNet      g [B, T, H]     (log α_t, <= 0)
    α_t ∈ R^K    KDA-style gate      g [B, T, H, K]  (log α_t, <= 0)

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; initial_state [B, H, K, V];
output o [B, T, H, V] and final state [B, H, K, V].

Modes (all return the same numbers; tests tie each to ``recurrent``):

* ``recurrent``: the reference loop over time (``unbind``).
* ``chunk``: the chunkwise-parallel form (DeltaNet paper §3.2, the WY/UT representation).
  Within a chunk, with S_0 the state entering it and Γ_t = Diag(α_1 ⋯ α_t) (local), the
  state is S_t = Γ_t S_0 + Σ_{i<=t} (Γ_t Γ_i⁻¹ k_iᵀ) u_i, and the pseudo-values u_i solve
  the unit lower-triangular system (I + A) U = Diag(β)(V − K̃ S_0) with
  A[t, i] = β_t k_t Γ_t Γ_i⁻¹ k_iᵀ (i < t) and K̃_t = k_t Γ_t: one triangular solve per
  chunk gives U = U_0 − W S_0 (U_0, W independent of S_0), so only four small matmuls per
  chunk remain sequential: U = U_0 − W S_0, o = Q̃ S_0 + P U, S_C = Γ_C S_0 + K_wᵀ U
  (P the decayed causal q-k scores). Every exponent is <= 0, except inside the key-wise
  scores, which reuse the safe tiles of ``linear_recurrence`` (:func:`_tiled_scores`).
* ``parallel``: the materialized map, the whole sequence as one chunk:
  Φ = P (I + A)⁻¹ Diag(β), o = Φ v (+ the initial state's term); memory O(T²).
* ``step``: one token (T == 1), given and returning the state.

Stability: the transition's eigenvalues are α (on the directions orthogonal to k, for a
scalar α) and α(1 − β‖k‖²) along k, so with unit keys (the mixers L2-normalize them) and
β ∈ [0, 2] every |eigenvalue| <= 1; β outside [0, 2] is refused. The triangular system is
unit lower-triangular, hence always solvable. Half inputs are computed in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange

from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, fmt_shape, reads_values
from .precision import full_precision
from .inplace import writable
from .recurrence import _compute_dtype, _decay_exp, _exp_where, _read, _step_dtype, _tile_factors, _tile_size, _tiled_scores

MODES = ("recurrent", "chunk", "parallel", "step")
BETA_MAX = 2.0

_WHERE = "delta_rule"


def _check_inputs(q, k, v, beta, g, initial_state, *, check_values: bool, where: str, step: bool = False, a=None, b=None):
    lay = "[B, H, K]" if step else "[B, T, H, K]"
    r = 3 if step else 4
    check_tensor("q", q, rank=r, layout=lay, where=where)
    check_tensor("k", k, rank=r, layout=lay, where=where)
    check_tensor("v", v, rank=r, layout=lay.replace("K]", "V]"), where=where)
    lead = tuple(q.shape[:-1])
    K = q.shape[-1]
    lead_s = "[B, H" if step else "[B, T, H"
    check_shape("k", k, (*lead, K), lay, where)
    check_shape("v", v, (*lead, None), lay.replace("K]", "V]"), where)
    V = v.shape[-1]
    if not step and q.shape[1] == 0:
        raise ValueError(f"{where}: sequence length T must be >= 1, got q of shape {fmt_shape(q.shape)}")
    check_tensor("beta", beta, rank=len(lead), layout=lead_s + "]", where=where)
    check_shape("beta", beta, lead, lead_s + "]", where)
    if g is not None:
        check_tensor("g", g, where=where)
        if g.shape not in (lead, (*lead, K)):
            raise ValueError(
                f"{where}: argument 'g' (log-decay) must have shape {lead_s}] = {fmt_shape(lead)} (one per head) or "
                f"{lead_s}, K] = {fmt_shape((*lead, K))} (key-wise), got {fmt_shape(g.shape)}"
            )
    for name, t in (("a", a), ("b", b)):
        if t is not None:
            check_tensor(name, t, rank=r, layout=lay, where=where)
            check_shape(name, t, (*lead, K), lay, where)
    if initial_state is not None:
        B, H = (q.shape[0], q.shape[-2])
        check_tensor("initial_state", initial_state, rank=4, layout="[B, H, K, V]", where=where)
        check_shape("initial_state", initial_state, (B, H, K, V), "[B, H, K, V]", where)
    if check_values and reads_values(q):
        for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta), ("g", g), ("a", a), ("b", b), ("initial_state", initial_state)):
            if t is not None:
                check_finite(name, t, where)
        b = beta.detach()
        if float(b.min()) < 0 or float(b.max()) > BETA_MAX:
            raise ValueError(
                f"{where}: argument 'beta' must lie in [0, {BETA_MAX:g}] (the transition I − β kᵀk is a contraction for unit keys "
                f"only there), got values in [{float(b.min()):.4g}, {float(b.max()):.4g}]"
            )
        if g is not None and float(g.detach().max()) > 0:
            raise ValueError(f"{where}: argument 'g' holds log-decays and must be <= 0 (α <= 1); got a maximum of {float(g.detach().max()):.4g}")
    return K, V


# --------------------------------------------------------------------------------------
# step and recurrent (the reference)
# --------------------------------------------------------------------------------------


def _step(S, q_t, k_t, v_t, b_t, a_t, scale, ra_t=None, rb_t=None):
    """S [B,H,K,V]; q_t,k_t [B,H,K]; v_t [B,H,V]; b_t [B,H]; a_t [B,H,K|1] (decay, not log) or None;
    ra_t, rb_t [B,H,K] the general rank-one pair (None: the delta rule's −β k, k)."""
    if a_t is not None:
        S = S * a_t.unsqueeze(-1)
    if ra_t is None and rb_t is None:
        kS = (k_t.unsqueeze(-2) @ S).squeeze(-2)  # k_t S: what S stores under k_t [B,H,V]
        u = b_t.unsqueeze(-1) * (v_t - kS)
        S = S + k_t.unsqueeze(-1) * u.unsqueeze(-2)
    else:  # S ← S + a_tᵀ (b_t S) + β_t k_tᵀ v_t
        ra_t = -b_t.unsqueeze(-1) * k_t if ra_t is None else ra_t
        rb_t = k_t if rb_t is None else rb_t
        r = (rb_t.unsqueeze(-2) @ S).squeeze(-2)  # b_t S [B,H,V]
        S = S + ra_t.unsqueeze(-1) * r.unsqueeze(-2) + k_t.unsqueeze(-1) * (b_t.unsqueeze(-1) * v_t).unsqueeze(-2)
    o_t = (q_t.unsqueeze(-2) @ S).squeeze(-2)
    if scale != 1.0:
        o_t = o_t * scale
    return o_t, S


def _recurrent(q, k, v, beta, g, scale, S, ra=None, rb=None):
    T = q.shape[1]
    a = g.exp().unbind(1) if g is not None else (None,) * T
    ras = ra.unbind(1) if ra is not None else (None,) * T
    rbs = rb.unbind(1) if rb is not None else (None,) * T
    outs = []
    for q_t, k_t, v_t, b_t, a_t, ra_t, rb_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1), a, ras, rbs):
        o_t, S = _step(S, q_t, k_t, v_t, b_t, a_t, scale, ra_t, rb_t)
        outs.append(o_t)
    return torch.stack(outs, dim=1), S


# --------------------------------------------------------------------------------------
# the chunk quantities shared by chunk and parallel
# --------------------------------------------------------------------------------------


def _shared_decays(G):
    """What the score maps of one block share of its decays G [.., C, K|1] (cumulative log-decay from the block's
    start): with a decay per head the matrix exp(G_t − G_i) [.., C, C] for i <= t (0 above), with key-wise decays
    (the tile c, :func:`~seqmix.ops.recurrence._tile_factors`); None without decays. Made once per block for
    :func:`_scores` (the tied chunk forms two maps, the general one four)."""
    if G is None:
        return None
    C = G.shape[-2]
    if G.shape[-1] == 1:
        Gs = G[..., 0]
        return _exp_where(Gs.unsqueeze(-1) - Gs.unsqueeze(-2), torch.ones(C, C, dtype=torch.bool, device=G.device).tril())
    c = _tile_size(C, None, G)
    return c, _tile_factors(G, c)


def _scores(q, k, G, strict: bool, shared=None):
    """Decayed causal scores S[.., t, i] = Σ_k q_tk k_ik exp(G_tk − G_ik) for i <= t (i < t if strict), else 0.
    q,k [.., C, K]; G [.., C, K|1] cumulative log-decay from the block's start, or None. ``shared``:
    :func:`_shared_decays` of G, made once for the block's maps (None: made here)."""
    C = q.shape[-2]
    mask = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1 if strict else 0)
    if G is None:
        A = q @ k.transpose(-1, -2)
    else:
        shared = _shared_decays(G) if shared is None else shared
        if G.shape[-1] == 1:
            A = (q @ k.transpose(-1, -2)) * shared
        else:
            A = _tiled_scores(q, k, G, *shared).reshape(*q.shape[:-2], C, C)
    return torch.where(mask, A, torch.zeros((), dtype=A.dtype, device=A.device))


def _block(q, k, v, beta, G):
    """Everything of a block (chunk) that does not depend on the state entering it.

    q,k [.., C, K]; v [.., C, V]; beta [.., C]; G [.., C, K|1] local cumulative log-decay or None.
    Returns (P, U0, W, Qt, Kw, dC): P [.., C, C] the decayed causal q-k scores; U0 [.., C, V] and
    W [.., C, K] with U = U0 − W S_0; Qt = q Γ_t; Kw = k Γ_C Γ_t⁻¹; dC [.., K|1, 1] = Γ_C (or None).
    """
    C = q.shape[-2]
    shared = _shared_decays(G)  # (the two maps' decays, made once)
    P = _scores(q, k, G, strict=False, shared=shared)
    A = beta.unsqueeze(-1) * _scores(k, k, G, strict=True, shared=shared)
    I = torch.eye(C, dtype=A.dtype, device=A.device)
    if G is None:
        Kt, Qt, Kw, dC = k, q, k, None
    else:
        E = _decay_exp(G)  # (the chunk form's decay factors: below e^-60 exactly 0, recurrence._decay_exp)
        Kt, Qt = k * E, q * E
        Kw = k * _decay_exp(G[..., -1:, :] - G)
        dC = E[..., -1, :].unsqueeze(-1)
    # the UT transform: T = (I + A)⁻¹ Diag(β) by one unit lower-triangular solve (C right-hand
    # sides, fewer than the K + V of solving for [U0, W] directly), then [U0, W] = T [V, K̃] as a matmul
    Tm = torch.linalg.solve_triangular(I + A, torch.diag_embed(beta), upper=False, unitriangular=True)
    X = Tm @ torch.cat([v, Kt], dim=-1)
    V = v.shape[-1]
    return P, X[..., :V], X[..., V:], Qt, Kw, dC


def _block_general(q, k, v, beta, G, ra, rb):
    """The block quantities of the general rank-one transition M_t = (I + a_tᵀ b_t) Γ-step (see ``delta_rule``).

    With r_t = b_t D_t S_{t-1} (what the rank-one part reads, a V-row) and Γ the local cumulative decay:
        (I − A_ba) R = B̃ S_0 + A_bk Diag(β) V,   A_xy[t, i] = x_t Γ_t Γ_i⁻¹ y_iᵀ (i < t),   B̃_t = b_t Γ_t
        o = Q̃ S_0 + P_qa R + P_qk Diag(β) V,      S_C = Γ_C S_0 + (a Γ_C Γ⁻¹)ᵀ R + (k Γ_C Γ⁻¹)ᵀ Diag(β) V
    so R = U0 + W S_0 with W = (I − A_ba)⁻¹ B̃ and U0 = (I − A_ba)⁻¹ A_bk Diag(β) V (one unit
    lower-triangular solve). Returns (P_qa, P_qk, U0, W, Qt, Aw, Kw, bV, dC).
    """
    C = q.shape[-2]
    shared = _shared_decays(G)  # (the four maps' decays, made once)
    P_qa = _scores(q, ra, G, strict=False, shared=shared)
    P_qk = _scores(q, k, G, strict=False, shared=shared)
    A_ba = _scores(rb, ra, G, strict=True, shared=shared)
    A_bk = _scores(rb, k, G, strict=True, shared=shared)
    I = torch.eye(C, dtype=A_ba.dtype, device=A_ba.device)
    bV = beta.unsqueeze(-1) * v
    if G is None:
        Bt, Qt, Aw, Kw, dC = rb, q, ra, k, None
    else:
        E = _decay_exp(G)
        Bt, Qt = rb * E, q * E
        Ed = _decay_exp(G[..., -1:, :] - G)
        Aw, Kw = ra * Ed, k * Ed
        dC = E[..., -1, :].unsqueeze(-1)
    X = torch.linalg.solve_triangular(I - A_ba, torch.cat([A_bk @ bV, Bt], dim=-1), upper=False, unitriangular=True)
    V = v.shape[-1]
    return P_qa, P_qk, X[..., :V], X[..., V:], Qt, Aw, Kw, bV, dC


def _chunk(q, k, v, beta, g, scale, S0, C, want_state, ra=None, rb=None):
    B, T, H, K = q.shape
    V = v.shape[-1]
    n = math.ceil(T / C)
    pad = n * C - T
    general = ra is not None or rb is not None
    if general:  # the delta rule's defaults for the half that is not given
        ra = -beta.unsqueeze(-1) * k if ra is None else ra
        rb = k if rb is None else rb
    if pad:  # padded tokens: k = 0, β = 0, a = b = 0, log-decay 0: they neither write nor decay the state
        q, k, v, g, ra, rb = (F.pad(x, (0, 0, 0, 0, 0, pad)) if x is not None and x.dim() == 4 else x for x in (q, k, v, g, ra, rb))
        beta = F.pad(beta, (0, 0, 0, pad))
        if g is not None and g.dim() == 3:
            g = F.pad(g, (0, 0, 0, pad))

    def chunked(x):
        return rearrange(x, "b (n c) h x -> b h n c x", c=C).contiguous()

    q, k, v = chunked(q), chunked(k), chunked(v)
    if scale != 1.0:
        q = q * scale
    beta = rearrange(beta, "b (n c) h -> b h n c", c=C)
    G = None
    if g is not None:
        G = chunked(g if g.dim() == 4 else g.unsqueeze(-1)).cumsum(-2)
    if general:
        return _chunk_general_loop(q, k, v, beta, G, chunked(ra), chunked(rb), S0, B, H, K, V, T, want_state)
    P, U0, W, Qt, Kw, dC = _block(q, k, v, beta, G)

    # across chunks: the state is passed sequentially (four small matmuls per chunk)
    S = S0 if S0 is not None else torch.zeros(B, H, K, V, dtype=q.dtype, device=q.device)
    starts, Us = [], []
    dCs = dC.unbind(2) if dC is not None else (None,) * n
    for U0_i, W_i, Kw_i, dC_i in zip(U0.unbind(2), W.unbind(2), Kw.unbind(2), dCs):
        starts.append(S)
        U_i = U0_i - W_i @ S
        Us.append(U_i)
        S = (S * dC_i if dC_i is not None else S) + Kw_i.transpose(-1, -2) @ U_i
    S_start = torch.stack(starts, dim=2)  # [B,H,n,K,V]
    U = torch.stack(Us, dim=2)  # [B,H,n,C,V]
    o = Qt @ S_start + P @ U
    o = rearrange(o, "b h n c v -> b (n c) h v")[:, :T]
    return o, (S if want_state else None)


def _chunk_general_loop(q, k, v, beta, G, ra, rb, S0, B, H, K, V, T, want_state):
    """The sequential part of the general chunk mode: R_i = U0_i + W_i S, S ← Γ_C S + Awᵀ R_i + Kwᵀ βV_i."""
    P_qa, P_qk, U0, W, Qt, Aw, Kw, bV, dC = _block_general(q, k, v, beta, G, ra, rb)
    KV = Kw.transpose(-1, -2) @ bV  # the state-independent writes of each chunk [B,H,n,K,V]
    S = S0 if S0 is not None else torch.zeros(B, H, K, V, dtype=q.dtype, device=q.device)
    n = q.shape[2]
    starts, Rs = [], []
    dCs = dC.unbind(2) if dC is not None else (None,) * n
    for U0_i, W_i, Aw_i, KV_i, dC_i in zip(U0.unbind(2), W.unbind(2), Aw.unbind(2), KV.unbind(2), dCs):
        starts.append(S)
        R_i = U0_i + W_i @ S
        Rs.append(R_i)
        S = (S * dC_i if dC_i is not None else S) + Aw_i.transpose(-1, -2) @ R_i + KV_i
    o = Qt @ torch.stack(starts, dim=2) + P_qa @ torch.stack(Rs, dim=2) + P_qk @ bV
    o = rearrange(o, "b h n c v -> b (n c) h v")[:, :T]
    return o, (S if want_state else None)


def _map_general(q, k, beta, g, scale, ra, rb):
    """Φ [B,H,T,T] of the general transition (zero initial state): Φ = (P_qk + P_qa (I − A_ba)⁻¹ A_bk) Diag(β)."""
    ra = -beta.unsqueeze(-1) * k if ra is None else ra
    rb = k if rb is None else rb
    qh, kh, ah, bh_ = (rearrange(x, "b t h k -> b h t k") for x in (q, k, ra, rb))
    beh = rearrange(beta, "b t h -> b h t")
    G = None
    if g is not None:
        G = rearrange(g if g.dim() == 4 else g.unsqueeze(-1), "b t h k -> b h t k").to(torch.float64).cumsum(-2)
    if scale != 1.0:
        qh = qh * scale
    T = qh.shape[-2]
    shared = _shared_decays(G)
    P_qa = _scores(qh, ah, G, strict=False, shared=shared).to(qh.dtype)
    P_qk = _scores(qh, kh, G, strict=False, shared=shared).to(qh.dtype)
    A_ba = _scores(bh_, ah, G, strict=True, shared=shared).to(qh.dtype)
    A_bk = _scores(bh_, kh, G, strict=True, shared=shared).to(qh.dtype)
    I = torch.eye(T, dtype=qh.dtype, device=qh.device)
    X = torch.linalg.solve_triangular(I - A_ba, A_bk, upper=False, unitriangular=True)
    return (P_qk + P_qa @ X) * beh.unsqueeze(-2)


def _map(q, k, beta, g, scale):
    """Φ [B,H,T,T] with o_t = Σ_s Φ[t, s] v_s (zero initial state), and the block's parts."""
    qh = rearrange(q, "b t h k -> b h t k")
    kh = rearrange(k, "b t h k -> b h t k")
    bh = rearrange(beta, "b t h -> b h t")
    G = None
    if g is not None:  # whole-sequence cumulative log-decay, in float64 so that differences stay exact
        G = rearrange(g if g.dim() == 4 else g.unsqueeze(-1), "b t h k -> b h t k").to(torch.float64).cumsum(-2)
    if scale != 1.0:
        qh = qh * scale
    C = qh.shape[-2]
    shared = _shared_decays(G)
    P = _scores(qh, kh, G, strict=False, shared=shared).to(qh.dtype)
    A = bh.unsqueeze(-1) * _scores(kh, kh, G, strict=True, shared=shared).to(qh.dtype)
    I = torch.eye(C, dtype=A.dtype, device=A.device)
    # Φ = P (I + A)⁻¹ Diag(β): solve X (I + A) = P from the right, then scale the columns by β
    Phi = torch.linalg.solve_triangular(I + A, P, upper=False, left=False, unitriangular=True) * bh.unsqueeze(-2)
    return Phi, qh, kh, bh, G


def _parallel(q, k, v, beta, g, scale, S0, want_state, ra=None, rb=None):
    T = q.shape[1]
    if S0 is None and not want_state:
        Phi = _map(q, k, beta, g, scale)[0] if ra is None and rb is None else _map_general(q, k, beta, g, scale, ra, rb)
        return torch.einsum("bhts,bshv->bthv", Phi, v), None
    # with a state in or out: the same as one chunk of length T
    return _chunk(q, k, v, beta, g, scale, S0, T, want_state, ra, rb)


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def auto_mode(T: int, chunk_size: int) -> str:
    """``recurrent`` for one token, ``parallel`` up to one chunk, ``chunk`` beyond."""
    if T == 1:
        return "recurrent"
    if T <= chunk_size:
        return "parallel"
    return "chunk"


def _prep(q, k, v, beta, g, initial_state, dt=None):
    dt = dt or _compute_dtype(q, k, v, beta, g, initial_state)
    out_dtype = q.dtype
    conv = [x.to(dt) if x is not None else None for x in (q, k, v, beta, g, initial_state)]
    return (*conv, out_dtype)


@full_precision
def delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
):
    """Runs S_t = (I − β_t k_tᵀk_t) Diag(exp g_t) S_{t-1} + β_t k_tᵀ v_t, o_t = scale · q_t S_t,
    or with ``a``/``b`` the general rank-one transition S_t = (I + a_tᵀ b_t) Diag(exp g_t) S_{t-1} + β_t k_tᵀ v_t.

    Args:
        q, k: [B, T, H, K] (the mixers pass L2-normalized keys). v: [B, T, H, V].
        beta: [B, T, H], in [0, 2] (the writing strength β_t).
        g: log-decay (<= 0): [B, T, H] (one per head, Gated DeltaNet), [B, T, H, K]
            (key-wise, KDA) or None (DeltaNet).
        scale: multiplies the output.
        initial_state: [B, H, K, V] or None (zeros).
        output_final_state: also return S_T.
        mode: "recurrent", "chunk", "parallel", "step" (T == 1) or "auto".
        chunk_size: C of the chunk mode (any T works; the tail chunk is padded).
        check_values: also check for NaN/Inf, β ∈ [0, 2] and g <= 0 (host reads: where ``seqmix.debug`` allows
            them, by default on CPU tensors).
        a, b: [B, T, H, K] or None: the general diagonal-plus-rank-one transition
            M_t = (I + a_tᵀ b_t) Diag(α_t) = Diag(α_t) + a_tᵀ (b_t ⊙ α_t) (b reads the decayed state).
            None means the delta rule's own half: a = −β k, b = k (both None: the tied fast path).
            RWKV-7: a = −(a ⊙ κ̂), b = κ̂ / w, β = 1; Comba: a = −β k, b = p.

    Returns:
        (o [B, T, H, V], final_state [B, H, K, V] or None)
    """
    if mode == "step" and not check_values and q.dim() == 4 and q.shape[1] == 1:
        # a mixer's decoding step on inputs it built (check_values=False): the step itself, no argument checks
        o, S = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], g[:, 0] if g is not None else None, initial_state,
                               scale=scale, check_values=False, check_shapes=False, a=a[:, 0] if a is not None else None,
                               b=b[:, 0] if b is not None else None)
        return o.unsqueeze(1), (S if output_final_state else None)
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    check_positive_int("chunk_size", chunk_size, _WHERE)
    K, V = _check_inputs(q, k, v, beta, g, initial_state, check_values=check_values, where=_WHERE, a=a, b=b)
    B, T, H, _ = q.shape
    if mode == "step":
        if T != 1:
            raise ValueError(f"{_WHERE}: mode 'step' takes one token (T == 1), got T = {T}; use 'recurrent' or 'chunk'")
        o, S = delta_rule_step(q[:, 0], k[:, 0], v[:, 0], beta[:, 0], g[:, 0] if g is not None else None, initial_state,
                               scale=scale, check_values=False, check_shapes=False, a=a[:, 0] if a is not None else None,
                               b=b[:, 0] if b is not None else None)
        return o.unsqueeze(1), (S if output_final_state else None)
    dt = _compute_dtype(q, k, v, beta, g, initial_state, a, b)
    a, b = (x.to(dt) if x is not None else None for x in (a, b))
    q, k, v, beta, g, S0, out_dtype = _prep(q, k, v, beta, g, initial_state, dt)
    if mode == "auto":
        mode = auto_mode(T, chunk_size)
    if mode == "recurrent":
        if S0 is None:
            S0 = torch.zeros(B, H, K, V, dtype=q.dtype, device=q.device)
        ak = (g if g is None or g.dim() == 4 else g.unsqueeze(-1))
        o, S = _recurrent(q, k, v, beta, ak, scale, S0, a, b)
    elif mode == "parallel":
        o, S = _parallel(q, k, v, beta, g, scale, S0, output_final_state, a, b)
    else:
        o, S = _chunk(q, k, v, beta, g, scale, S0, chunk_size, output_final_state, a, b)
    return o.to(out_dtype), (S if output_final_state else None)


@full_precision
def delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    state: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    check_values: bool = True,
    check_shapes: bool = True,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
):
    """One decoding step. q, k [B, H, K]; v [B, H, V]; beta [B, H]; g [B, H] or [B, H, K] or None;
    state [B, H, K, V] or None (zeros); a, b [B, H, K] or None (the general rank-one pair of
    ``delta_rule``). Returns (o [B, H, V], new state [B, H, K, V]): :func:`fused_step`, the state written
    in place inside :func:`~seqmix.ops.inplace.states_in_place`. ``check_shapes=False``: a caller that built
    the inputs itself (a mixer's decoding step) skips the argument checks too."""
    where = "delta_rule_step"
    if check_shapes or check_values:
        _check_inputs(q, k, v, beta, g, state, check_values=check_values, where=where, step=True, a=a, b=b)
    dt = _step_dtype(q, k, v, beta, g, state, a, b)
    out_dtype = q.dtype
    if q.dtype != dt or k.dtype != dt or v.dtype != dt or beta.dtype != dt or any(x is not None and x.dtype != dt for x in (g, a, b)):
        q, k, v, beta, g, a, b = (x if x is None or x.dtype == dt else x.to(dt) for x in (q, k, v, beta, g, a, b))
    if state is None:
        S, in_place = torch.zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], dtype=dt, device=q.device), True
    else:
        S, in_place = (state, True) if writable(state, dt) else (state if state.dtype == dt else state.to(dt), False)
    o, S = fused_step(S, q, k, v, beta, g, scale, a, b, in_place)
    return (o if o.dtype == out_dtype else o.to(out_dtype)), S


def fused_step(S, q, k, v, beta, g, scale, a=None, b=None, in_place=False):
    """The step of :func:`_step` (the reference) in as few kernels as it takes: decay S in place, read
    k S and b S as batched matmuls, write the rank-one corrections with ``addcmul_``, read o = scale · q S.

    S [B, H, K, V]; q, k [B, H, K]; v [B, H, V]; beta [B, H]; g [B, H] or [B, H, K] or None (log-decay:
    not exponentiated, unlike :func:`_step`); a, b [B, H, K] or None (the general pair: S ← S + aᵀ(b S) +
    β kᵀ v). Every tensor in the compute dtype. ``in_place``: S is the caller's to overwrite (the returned
    state is S itself); otherwise S is left as it is. Returns (o [B, H, V], the new state)."""
    # autograd records the step (training through the step mode, a recurrent reference's gradients): the reads
    # save S for the backward pass, so the writes after them make new tensors instead of writing S in place
    rec = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (S, q, k, v, beta, g, a, b))
    fresh = in_place
    if g is not None:  # [B, H, K, 1] key-wise or [B, H, 1, 1] per head
        d = g.exp()
        d = d.unsqueeze(-1) if g.dim() == 3 else d.view(*d.shape, 1, 1)
        S = S.mul_(d) if fresh else S * d
        fresh = True
    if not fresh and not rec:
        S = S.clone()
    beta_ = beta.view(*beta.shape, 1, 1)

    def add(S, x, y):  # S + x ⊙ y: in place where nothing saved S
        return torch.addcmul(S, x, y) if rec else S.addcmul_(x, y)

    if a is None and b is None:  # S ← S + kᵀ (β (v − k S)): the value under k moves a fraction β toward v
        u = (v - _read(k, S)) * beta_[..., 0]  # [B, H, V]
        S = add(S, k.unsqueeze(-1), u.unsqueeze(-2))
    else:  # S ← S + aᵀ (b S) + β kᵀ v, with a = −β k and b = k where not given
        r = _read(k if b is None else b, S)  # b S [B, H, V], of the decayed S
        S = add(S, (-beta_[..., 0] * k if a is None else a).unsqueeze(-1), r.unsqueeze(-2))
        S = add(S, k.unsqueeze(-1), v.unsqueeze(-2) * beta_)
    o = _read(q, S)
    return (o * scale if scale != 1.0 else o), S


@full_precision
def delta_rule_map(
    q: torch.Tensor,
    k: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    scale: float = 1.0,
    check_values: bool = True,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
) -> torch.Tensor:
    """The materialized causal map Φ [B, H, T, T] of the delta rule (zero initial state):
    o[:, t, h] = Σ_s Φ[:, h, t, s] v[:, s, h], Φ[t, s] = scale · q_t M_t ⋯ M_{s+1} β_s k_sᵀ with
    M_r = (I − β_r k_rᵀk_r) Diag(α_r). The same Φ for every value channel: the transition acts on keys."""
    where = "delta_rule_map"
    dummy_v = q.new_zeros(q.shape[:-1] + (1,))
    _check_inputs(q, k, dummy_v, beta, g, None, check_values=check_values, where=where, a=a, b=b)
    if a is None and b is None:
        q, k, _, beta, g, _, _ = _prep(q, k, dummy_v, beta, g, None)
        return _map(q, k, beta, g, scale)[0]
    dt = _compute_dtype(q, k, beta, g, a, b)
    a, b = (x.to(dt) if x is not None else None for x in (a, b))
    q, k, _, beta, g, _, _ = _prep(q, k, dummy_v, beta, g, None, dt)
    return _map_general(q, k, beta, g, scale, a, b)


# --------------------------------------------------------------------------------------
# products of n_h delta steps per token (DeltaProduct): the same op on an interleaved sequence
# --------------------------------------------------------------------------------------


def _interleave(q, g, n):
    """q [B, T, H, K] -> [B, T·n, H, K], nonzero only at each token's last micro-step (the readout);
    g [B, T, H(, K)] -> [B, T·n, H(, K)], nonzero only at its first (the gate acts once per token)."""
    qm = torch.zeros(q.shape[0], q.shape[1], n, *q.shape[2:], dtype=q.dtype, device=q.device)
    qm[:, :, -1] = q
    gm = None
    if g is not None:
        gm = torch.zeros(g.shape[0], g.shape[1], n, *g.shape[2:], dtype=g.dtype, device=g.device)
        gm[:, :, 0] = g
        gm = gm.flatten(1, 2)
    return qm.flatten(1, 2), gm


def _check_product(q, k, v, beta, g, n, where):
    check_positive_int("num_householder", n, where)
    check_tensor("q", q, rank=4, layout="[B, T, H, K]", where=where)
    B, T, H, K = q.shape
    check_tensor("k", k, rank=4, layout="[B, T·n, H, K]", where=where)
    check_shape("k", k, (B, T * n, H, K), "[B, T·n, H, K]", where)
    if v is not None:
        check_tensor("v", v, rank=4, layout="[B, T·n, H, V]", where=where)
        check_shape("v", v, (B, T * n, H, None), "[B, T·n, H, V]", where)
    check_tensor("beta", beta, rank=3, layout="[B, T·n, H]", where=where)
    check_shape("beta", beta, (B, T * n, H), "[B, T·n, H]", where)
    if g is not None:
        check_tensor("g", g, where=where)
        if g.shape not in ((B, T, H), (B, T, H, K)):
            raise ValueError(f"{where}: argument 'g' (log-decay, once per token) must have shape [B, T, H] or [B, T, H, K] = "
                             f"{fmt_shape((B, T, H, K))}, got {fmt_shape(g.shape)}")


def delta_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    *,
    num_householder: int,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int = 64,
    check_values: bool = True,
):
    """DeltaProduct (Siems et al. 2025, eq. 4): n = ``num_householder`` delta steps per token,

        S_t = M_{t,n} ⋯ M_{t,1} Diag(α_t) S_{t-1} + Σ_j M_{t,n} ⋯ M_{t,j+1} β_{t,j} k_{t,j}ᵀ v_{t,j},
        M_{t,j} = I − β_{t,j} k_{t,j}ᵀ k_{t,j},     o_t = scale · q_t S_t,

    run as :func:`delta_rule` on the sequence of T·n micro-steps (token t's steps at t·n .. t·n + n − 1):
    the gate at each token's first micro-step, the query at its last; every mode of ``delta_rule``
    (chunk length ``chunk_size`` tokens = n·chunk_size micro-steps). The transition of a token is a
    gated product of n Householder-like factors: Diag(α) plus rank n.

    Shapes: q [B, T, H, K]; k [B, T·n, H, K], v [B, T·n, H, V], beta [B, T·n, H] (micro-step j of
    token t at t·n + j, flash-linear-attention's layout); g [B, T, H], [B, T, H, K] or None.
    Returns (o [B, T, H, V], final state [B, H, K, V] or None).
    """
    where = "delta_product"
    _check_product(q, k, v, beta, g, num_householder, where)
    n = num_householder
    qm, gm = _interleave(q, g, n)
    if mode == "step":  # one token = n micro-steps of the reference loop
        if q.shape[1] != 1:
            raise ValueError(f"{where}: mode 'step' takes one token (T == 1), got T = {q.shape[1]}")
        mode = "recurrent"
    o, S = delta_rule(qm, k, v, beta, gm, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                      mode=mode, chunk_size=chunk_size * n, check_values=check_values)
    return o[:, n - 1 :: n], S


def delta_product_map(q, k, beta, g=None, *, num_householder: int, scale: float = 1.0, check_values: bool = True) -> torch.Tensor:
    """Φ [B, H, T, T, n] of :func:`delta_product` (zero initial state): o_t = Σ_{s, j} Φ[t, s, j] v_{s, j}."""
    where = "delta_product_map"
    _check_product(q, k, None, beta, g, num_householder, where)
    n = num_householder
    qm, gm = _interleave(q, g, n)
    Phi = delta_rule_map(qm, k, beta, gm, scale=scale, check_values=check_values)  # [B, H, T·n, T·n]
    B, H, T = Phi.shape[0], Phi.shape[1], q.shape[1]
    return Phi[:, :, n - 1 :: n].reshape(B, H, T, T, n)
