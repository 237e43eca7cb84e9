"""B'MOJO's eidetic memory: the innovation test and the bounded selection of past tokens
(B'MOJO paper §3.2, Algorithm 1, App. B.2; bmojo note §4.3-4.4).

The innovation test. A fixed, non-learned predictor (a running weighted average, "short 1D
grouped causal convolutions") predicts the SSM output y_t from its k previous values; the
prediction error is the token's innovation score:

    ŷ_t = Σ_{j=1..k} c_j y_{t-j}        (y_{τ<0} = 0, or a carried buffer; c_j >= 0, Σ c_j = 1)
    ε_t = error(y_t, ŷ_t)               one scalar per token, computed without gradients

:func:`predictor_weights` gives c ("uniform": c_j = 1/k, "exponential": c_j ∝ λ^(j-1));
:func:`innovation` runs the predictor as a depthwise causal conv (``causal_conv1d`` with the
current tap set to 0) and returns ε [B, T] and the predictor buffer (the last k outputs) to
carry. Errors ("error" below): "l2sq" (1/d)‖y - ŷ‖², "l2" ‖y - ŷ‖, "relative_l2"
‖y - ŷ‖/‖y‖, "cosine" 1 - cos(y, ŷ).

The selection. Algorithm 1 keeps u_t if ε_t > min_{ε ∈ M_{t-1}} ε. Two readings (``rule``):

* "topk" (default): a min-heap of capacity m_e. If |M| < m_e insert; else if ε_t > min ε in M,
  evict the minimum and insert. It keeps exactly the top-m_e tokens by ε among all tokens seen,
  ties going to the earlier token (an equal ε does not evict; among equal minima the latest
  arrival is evicted).
* "literal": no eviction. Insert iff M is empty or (|M| < m_e and ε_t > min ε in M). Since every
  inserted token exceeds the first one's score, min ε stays the first token's score: M is the
  first token plus the first m_e - 1 later tokens that beat it (the degenerate reading, bmojo
  note §4.4, capped at m_e).

Three computations of the same sets:

* :func:`heap_push`: one token into a bounded memory (decoding; the streaming heap). Slots are
  unordered; the memory keeps ε and the absolute positions (for ties) of its tokens.
* :func:`eidetic_select` mode "scan" (training): candidates grouped (chunks of the attention, or
  single tokens), the memory after each group is an inclusive prefix "merge" over the groups,
  computed by a doubling (Hillis-Steele) scan of log2(G) steps, each one stable sort of
  [B, G, 2·m_e] keys; for "literal", a closed form (a cumulative count). No loop over time.
* :func:`eidetic_select` mode "reference": "topk" sorts, for each group, every candidate of the
  earlier groups (O(G·n) memory, obviously correct); "literal" pushes the candidates one by one
  with :func:`heap_push` (the rule as written).

Index convention of :func:`eidetic_select`: candidates are numbered after the m_e slots of the
initial memory, i.e. id < m_e is slot id of ``init``, id = m_e + j is candidate j.
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_positive_int, check_shape, check_tensor, fmt_shape
from .conv import causal_conv1d
from .precision import autocast_off, upcast

RULES = ("topk", "literal")
ERRORS = ("l2sq", "l2", "relative_l2", "cosine")
WEIGHTS = ("uniform", "exponential")
SELECT_MODES = ("scan", "reference")

__all__ = ["predictor_weights", "innovation", "heap_push", "eidetic_select", "RULES", "ERRORS", "WEIGHTS", "SELECT_MODES"]

_NEG = float("-inf")


# ------------------------------------------------------------------------------------------
# the innovation test
# ------------------------------------------------------------------------------------------


def predictor_weights(span: int, kind: str = "uniform", decay: float = 0.5, dtype=torch.float64) -> torch.Tensor:
    """c [span]: c[j-1] multiplies y_{t-j}; non-negative, summing to 1 (a running weighted average)."""
    where = "predictor_weights"
    check_positive_int("span", span, where)
    check_choice("kind", kind, WEIGHTS, where)
    if kind == "uniform":
        c = torch.ones(span, dtype=dtype)
    else:
        if not (isinstance(decay, (int, float)) and 0 < decay <= 1):
            raise ValueError(f"{where}: argument 'decay' must be in (0, 1] (c_j ∝ decay^(j-1)), got {decay!r}")
        c = torch.tensor([float(decay) ** j for j in range(span)], dtype=dtype)
    return c / c.sum()


def _error(y: torch.Tensor, y_hat: torch.Tensor, error: str) -> torch.Tensor:
    diff = y - y_hat
    if error == "l2sq":
        return diff.pow(2).mean(-1)
    if error == "l2":
        return diff.pow(2).sum(-1).sqrt()
    norm = y.pow(2).sum(-1).sqrt()
    if error == "relative_l2":
        return diff.pow(2).sum(-1).sqrt() / norm.clamp_min(torch.finfo(y.dtype).tiny)
    den = (norm * y_hat.pow(2).sum(-1).sqrt()).clamp_min(torch.finfo(y.dtype).tiny)
    return 1 - (y * y_hat).sum(-1) / den  # cosine: ŷ = 0 gives 1


def innovation(y: torch.Tensor, weights: torch.Tensor, *, error: str = "l2sq", state: torch.Tensor | None = None):
    """ε_t = error(y_t, Σ_j c_j y_{t-j}) without gradients.

    y [B, T, d]; weights c [k] (:func:`predictor_weights`); state [B, d, k]: y_{-k..-1}, the
    k outputs before y (oldest first; zeros if None). Returns (ε [B, T], new state [B, d, k]:
    the last k outputs, to carry)."""
    where = "innovation"
    check_tensor("y", y, rank=3, layout="[B, T, d]", where=where)
    check_tensor("weights", weights, rank=1, layout="[k]", where=where)
    check_choice("error", error, ERRORS, where)
    B, T, d = y.shape
    k = weights.shape[0]
    if state is not None:
        check_shape("state", state, (B, d, k), "[B, d, k]", where)
    with torch.no_grad(), autocast_off(y.device.type):
        y = upcast(y.detach())  # the scores rank tokens: float32 or wider, so that rounding flips fewer ranks
        state = upcast(state)
        # causal_conv1d's last tap multiplies y_t: set it to 0 and put c_j on the tap of y_{t-j}
        taps = torch.cat([weights.flip(0), weights.new_zeros(1)]).to(y.dtype)
        y_hat, new_state = causal_conv1d(y, taps.expand(d, k + 1), None, state, output_final_state=True)
        return _error(y, y_hat, error), new_state


# ------------------------------------------------------------------------------------------
# the streaming heap (decoding)
# ------------------------------------------------------------------------------------------


def heap_push(mem_eps, mem_pos, mem_valid, eps_t, pos_t, *, rule: str = "topk"):
    """Where one new token goes in a bounded memory of m_e slots (Algorithm 1's update).

    mem_eps [B, m_e] (ε of the stored tokens), mem_pos [B, m_e] (their positions, int),
    mem_valid [B, m_e] (bool: slot in use); eps_t [B], pos_t [B] or int (the new token).
    Returns (slot [B] long, insert [B] bool): write the token into ``slot`` where ``insert``.
    """
    where = "heap_push"
    check_choice("rule", rule, RULES, where)
    check_tensor("mem_eps", mem_eps, rank=2, layout="[B, m_e]", where=where)
    Bt, m = mem_eps.shape
    if mem_valid.shape != (Bt, m) or mem_valid.dtype != torch.bool:
        raise ValueError(f"{where}: argument 'mem_valid' must be a bool tensor [B, m_e] = [{Bt}, {m}], got {fmt_shape(mem_valid.shape)} {mem_valid.dtype}")
    if eps_t.shape != (Bt,):
        raise ValueError(f"{where}: argument 'eps_t' must be [B] = [{Bt}], got {fmt_shape(eps_t.shape)}")
    if m == 0:
        return torch.zeros(Bt, dtype=torch.long, device=mem_eps.device), torch.zeros(Bt, dtype=torch.bool, device=mem_eps.device)
    free = ~mem_valid
    has_free = free.any(-1)
    first_free = free.to(torch.int8).argmax(-1)
    inf = torch.tensor(float("inf"), dtype=mem_eps.dtype, device=mem_eps.device)
    key = torch.where(mem_valid, mem_eps, inf)
    min_eps = key.min(-1).values
    if rule == "literal":
        count = mem_valid.sum(-1)
        insert = (count == 0) | (has_free & (eps_t > min_eps))
        return first_free, insert
    # topk: evict the minimum; among equal minima the latest arrival (the largest position)
    is_min = mem_valid & (mem_eps == min_eps.unsqueeze(-1))
    latest = torch.where(is_min, mem_pos, torch.full_like(mem_pos, torch.iinfo(mem_pos.dtype).min)).argmax(-1)
    slot = torch.where(has_free, first_free, latest)
    insert = has_free | (eps_t > min_eps)
    return slot, insert


# ------------------------------------------------------------------------------------------
# the prefix selection (training)
# ------------------------------------------------------------------------------------------


def _sort_init(eps, pos, valid):
    """Keys of the initial memory in (valid first, ε descending, position ascending) order:
    returns (key [B, m], id [B, m]) with key = -inf for empty slots."""
    key = torch.where(valid, eps, torch.full_like(eps, _NEG))
    by_pos = torch.sort(torch.where(valid, pos, torch.full_like(pos, torch.iinfo(pos.dtype).max)), dim=-1, stable=True).indices
    key = key.gather(-1, by_pos)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    return key.gather(-1, order), by_pos.gather(-1, order)


def _merge(key_a, id_a, key_b, id_b, m):
    """top-m of two sets, a older than b, each in (key desc, arrival) order: one stable sort."""
    key = torch.cat([key_a, key_b], -1)
    ids = torch.cat([id_a, id_b], -1)
    key, order = torch.sort(key, dim=-1, descending=True, stable=True)
    return key[..., :m], ids.gather(-1, order[..., :m])


def _topk_scan(key_init, id_init, key, m):
    """Inclusive prefix top-m over [init, group_0, ..., group_{G-1}] (Hillis-Steele doubling)."""
    Bt, G, S = key.shape
    ids = torch.arange(S * G, device=key.device).view(1, G, S).expand(Bt, G, S) + m
    # each group's own top-m, in (key desc, arrival) order, padded to m slots
    k_loc, order = torch.sort(key, dim=-1, descending=True, stable=True)
    i_loc = ids.gather(-1, order)
    if S >= m:
        k_loc, i_loc = k_loc[..., :m], i_loc[..., :m]
    else:
        k_loc = torch.cat([k_loc, k_loc.new_full((Bt, G, m - S), _NEG)], -1)
        i_loc = torch.cat([i_loc, i_loc.new_zeros(Bt, G, m - S)], -1)
    K = torch.cat([key_init.unsqueeze(1), k_loc], 1)  # [B, G+1, m]
    I = torch.cat([id_init.unsqueeze(1), i_loc], 1)
    d = 1
    while d < G + 1:
        k_new, i_new = _merge(K[:, :-d], I[:, :-d], K[:, d:], I[:, d:], m)
        K = torch.cat([K[:, :d], k_new], 1)
        I = torch.cat([I[:, :d], i_new], 1)
        d *= 2
    return I, K > _NEG


def _topk_reference(key_init, id_init, key, m):
    """For every g: sort every candidate of groups < g (and the initial memory) and keep m."""
    Bt, G, S = key.shape
    flat = torch.cat([key_init, key.reshape(Bt, G * S)], -1)  # init first: they are older
    ids = torch.cat([id_init, torch.arange(G * S, device=key.device).expand(Bt, G * S) + m], -1)
    grp = torch.cat([torch.full((m,), -1, device=key.device), torch.arange(G, device=key.device).repeat_interleave(S)])
    seen = grp.unsqueeze(0) < torch.arange(G + 1, device=key.device).unsqueeze(1)  # [G+1, m + G·S]
    masked = torch.where(seen.unsqueeze(0), flat.unsqueeze(1), flat.new_full((), _NEG))
    k_sorted, order = torch.sort(masked, dim=-1, descending=True, stable=True)
    I = ids.unsqueeze(1).expand(-1, G + 1, -1).gather(-1, order[..., :m])
    return I, k_sorted[..., :m] > _NEG


def _literal_closed(eps_init, valid_init, eps, valid, m, G, S):
    """The "literal" rule without a loop: a candidate is kept iff it passes the first stored
    token's score (or is the very first token) and fewer than m tokens were kept before it."""
    Bt, n = eps.shape
    count = valid_init.sum(-1)  # [B]
    inf = torch.tensor(float("inf"), dtype=eps.dtype, device=eps.device)
    min_init = torch.where(valid_init, eps_init, inf).min(-1).values if m else inf.expand(Bt)
    first = valid.to(torch.int8).argmax(-1)  # first valid candidate
    eps_first = eps.gather(-1, first.unsqueeze(-1)).squeeze(-1)
    threshold = torch.where(count > 0, min_init, eps_first)
    is_first = (torch.arange(n, device=eps.device).unsqueeze(0) == first.unsqueeze(-1)) & (count == 0).unsqueeze(-1)
    passing = valid & ((eps > threshold.unsqueeze(-1)) | is_first)
    rank = passing.cumsum(-1)
    kept = passing & (rank + count.unsqueeze(-1) <= m)
    # slots: the initial memory (valid ones first, in arrival order), then the kept candidates
    init_order = torch.sort((~valid_init).to(torch.int8), dim=-1, stable=True).indices
    kept_order = torch.sort((~kept).to(torch.int8), dim=-1, stable=True).indices[:, :m]
    ids = torch.cat([init_order, kept_order + m], -1)  # [B, 2m]
    v_init = valid_init.gather(-1, init_order)
    k_kept = kept.gather(-1, kept_order)
    grp_kept = kept_order // S
    g = torch.arange(G + 1, device=eps.device).view(1, G + 1, 1)
    vis = torch.cat([v_init.unsqueeze(1).expand(-1, G + 1, -1), k_kept.unsqueeze(1) & (grp_kept.unsqueeze(1) < g)], -1)
    order = torch.sort((~vis).to(torch.int8), dim=-1, stable=True).indices[..., :m]
    return ids.unsqueeze(1).expand(-1, G + 1, -1).gather(-1, order), vis.gather(-1, order)


def _literal_reference(eps_init, pos_init, valid_init, eps, valid, m, G, S):
    """Pushes the candidates one by one with :func:`heap_push` (rule "literal")."""
    Bt, n = eps.shape
    ids = torch.where(valid_init, torch.arange(m, device=eps.device).expand(Bt, m), torch.zeros_like(pos_init))
    mem_eps, mem_valid = eps_init.clone(), valid_init.clone()
    mem_pos = torch.where(valid_init, pos_init, torch.full_like(pos_init, -1))
    out_I, out_V = [ids.clone()], [mem_valid.clone()]
    for j, (e, v) in enumerate(zip(eps.unbind(-1), valid.unbind(-1))):
        slot, ins = heap_push(mem_eps, mem_pos, mem_valid, e, torch.full_like(mem_pos[:, 0], j), rule="literal")
        ins = ins & v
        hot = torch.nn.functional.one_hot(slot, m).bool() & ins.unsqueeze(-1)
        mem_eps = torch.where(hot, e.unsqueeze(-1), mem_eps)
        ids = torch.where(hot, torch.full_like(ids, j + m), ids)
        mem_valid = mem_valid | hot
        if (j + 1) % S == 0:
            out_I.append(ids.clone())
            out_V.append(mem_valid.clone())
    return torch.stack(out_I, 1), torch.stack(out_V, 1)


def eidetic_select(
    eps: torch.Tensor,
    valid: torch.Tensor,
    m_e: int,
    *,
    group_size: int,
    init_eps: torch.Tensor | None = None,
    init_pos: torch.Tensor | None = None,
    init_valid: torch.Tensor | None = None,
    rule: str = "topk",
    mode: str = "scan",
):
    """The eidetic memory after each group of candidates.

    eps [B, n] (the candidates' scores, in arrival order), valid [B, n] (bool; padding and
    unavailable tokens False), n = G·group_size; init_eps, init_pos, init_valid [B, m_e]: the
    memory before the first candidate (None: empty).

    Returns (ids [B, G+1, m_e], visible [B, G+1, m_e]): P_0 = the initial memory, P_g = the
    memory after the candidates of groups 0..g-1 (ids index [init slots ; candidates], see the
    module docstring; slots with visible False are empty). A chunk c of B'MOJO reads P_c
    (everything before the chunk); Algorithm 1 at token t reads P_{t+1} (groups of one token).
    """
    where = "eidetic_select"
    check_choice("rule", rule, RULES, where)
    check_choice("mode", mode, SELECT_MODES, where)
    check_tensor("eps", eps, rank=2, layout="[B, n]", where=where)
    if isinstance(m_e, bool) or not isinstance(m_e, int) or m_e < 0:
        raise ValueError(f"{where}: argument 'm_e' must be an integer >= 0, got {m_e!r}")
    check_positive_int("group_size", group_size, where)
    Bt, n = eps.shape
    if valid.shape != (Bt, n) or valid.dtype != torch.bool:
        raise ValueError(f"{where}: argument 'valid' must be a bool tensor [B, n] = [{Bt}, {n}], got {fmt_shape(valid.shape)} {valid.dtype}")
    if n % group_size:
        raise ValueError(f"{where}: the number of candidates n = {n} must be a multiple of group_size = {group_size} (pad with valid = False)")
    G, S, m = n // group_size, group_size, m_e
    dev = eps.device
    if m == 0:
        empty = torch.zeros(Bt, G + 1, 0, dtype=torch.long, device=dev)
        return empty, empty.bool()
    if init_eps is None:
        init_eps = eps.new_zeros(Bt, m)
        init_pos = torch.zeros(Bt, m, dtype=torch.long, device=dev)
        init_valid = torch.zeros(Bt, m, dtype=torch.bool, device=dev)
    for name, t in (("init_eps", init_eps), ("init_pos", init_pos), ("init_valid", init_valid)):
        if t is None or t.shape != (Bt, m):
            raise ValueError(f"{where}: argument '{name}' must be [B, m_e] = [{Bt}, {m}] (give init_eps, init_pos and init_valid together)")
    if rule == "literal":
        if mode == "reference":
            return _literal_reference(init_eps, init_pos, init_valid, eps, valid, m, G, S)
        return _literal_closed(init_eps, init_valid, eps, valid, m, G, S)
    key_init, id_init = _sort_init(init_eps, init_pos, init_valid)
    key = torch.where(valid, eps, torch.full_like(eps, _NEG)).view(Bt, G, S)
    if mode == "reference":
        return _topk_reference(key_init, id_init, key, m)
    return _topk_scan(key_init, id_init, key, m)
