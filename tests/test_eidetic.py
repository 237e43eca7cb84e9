"""seqmix.ops.eidetic: the innovation test and the three computations of the eidetic memory
(the streaming heap of decoding, the doubling scan of training, the sorted reference)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from seqmix.ops.eidetic import eidetic_select, heap_push, innovation, predictor_weights
from tolerances import max_abs


def scores(B, n, seed, ties=False):
    g = torch.Generator().manual_seed(seed)
    if ties:  # few distinct values: ties everywhere
        return torch.randint(0, 4, (B, n), generator=g).double()
    return torch.rand(B, n, generator=g, dtype=torch.float64)


def as_sets(ids, vis):
    """[B, G+1, m] ids/visible -> per (batch, group) the sorted tuple of visible ids."""
    B, G1, _ = ids.shape
    return [[tuple(sorted(ids[b, g][vis[b, g]].tolist())) for g in range(G1)] for b in range(B)]


def brute_topk(eps, valid, m, S, init_eps=None, init_valid=None, init_pos=None):
    """Per prefix of groups: the m best by (ε desc, earlier first) over init ∪ candidates seen."""
    B, n = eps.shape
    out = []
    for b in range(B):
        rows = []
        pool = []  # (ε, position rank, id)
        if init_eps is not None:
            for i in range(m):
                if init_valid[b, i]:
                    pool.append((float(init_eps[b, i]), int(init_pos[b, i]), i))
        rows.append(tuple(sorted(i for _, _, i in sorted(pool, key=lambda e: (-e[0], e[1]))[:m])))
        for g in range(n // S):
            for j in range(g * S, (g + 1) * S):
                if valid[b, j]:
                    pool.append((float(eps[b, j]), 10**6 + j, m + j))
            rows.append(tuple(sorted(i for _, _, i in sorted(pool, key=lambda e: (-e[0], e[1]))[:m])))
        out.append(rows)
    return out


# -- the innovation test -------------------------------------------------------------------


def test_predictor_weights():
    for kind in ("uniform", "exponential"):
        c = predictor_weights(5, kind, 0.5)
        assert abs(float(c.sum()) - 1) < 1e-15 and bool((c > 0).all())
    c = predictor_weights(4, "exponential", 0.5)
    assert max_abs(c[1:] / c[:-1], torch.full((3,), 0.5, dtype=torch.float64)) < 1e-15
    with pytest.raises(ValueError, match="span"):
        predictor_weights(0)
    with pytest.raises(ValueError, match="kind"):
        predictor_weights(3, "learned")


@pytest.mark.parametrize("error", ["l2sq", "l2", "relative_l2", "cosine"])
def test_innovation_is_the_prediction_error(error):
    g = torch.Generator().manual_seed(0)
    B, T, d, k = 2, 11, 5, 3
    y = torch.randn(B, T, d, generator=g, dtype=torch.float64, requires_grad=True)
    c = predictor_weights(k, "exponential", 0.7)
    eps, state = innovation(y, c, error=error)
    # written out: ŷ_t = Σ_j c_j y_{t-j}, zeros before the start
    ypad = F.pad(y.detach(), (0, 0, k, 0))
    y_hat = sum(c[j - 1] * ypad[:, k - j : k - j + T] for j in range(1, k + 1))
    diff = y.detach() - y_hat
    expected = {
        "l2sq": diff.pow(2).mean(-1),
        "l2": diff.norm(dim=-1),
        "relative_l2": diff.norm(dim=-1) / y.detach().norm(dim=-1),
        "cosine": 1 - F.cosine_similarity(y.detach(), y_hat, dim=-1, eps=1e-300),
    }[error]
    assert max_abs(eps, expected) < 1e-12
    assert not eps.requires_grad  # the selection never carries a gradient
    assert max_abs(state, y.detach()[:, -k:].transpose(1, 2)) == 0
    # carrying the predictor buffer is one pass
    e1, s1 = innovation(y[:, :4], c, error=error)
    e2, _ = innovation(y[:, 4:], c, error=error, state=s1)
    assert max_abs(torch.cat([e1, e2], 1), eps) < 1e-12


# -- the selection -------------------------------------------------------------------------


@pytest.mark.parametrize("m,S,n_groups,ties,with_init", list(itertools.product([1, 3, 5], [1, 2, 4], [1, 5], [False, True], [False, True])))
def test_topk_scan_reference_and_brute_force_agree(m, S, n_groups, ties, with_init):
    B = 3
    n = S * n_groups
    eps = scores(B, n, seed=m * 100 + S, ties=ties)
    valid = torch.rand(B, n, generator=torch.Generator().manual_seed(5)) > 0.2
    init = {}
    if with_init:
        init = dict(
            init_eps=scores(B, m, seed=9, ties=ties),
            init_pos=torch.randperm(50)[:m].expand(B, m).clone(),
            init_valid=torch.rand(B, m, generator=torch.Generator().manual_seed(6)) > 0.3,
        )
    ref = eidetic_select(eps, valid, m, group_size=S, mode="reference", **init)
    scan = eidetic_select(eps, valid, m, group_size=S, mode="scan", **init)
    brute = brute_topk(eps, valid, m, S, *(init[k] for k in ("init_eps", "init_valid", "init_pos")) if init else ())
    assert as_sets(*ref) == brute
    assert as_sets(*scan) == brute


@pytest.mark.parametrize("m,S,ties", list(itertools.product([1, 2, 4], [1, 3], [False, True])))
def test_literal_closed_form_is_the_push_loop(m, S, ties):
    B, n = 3, 12
    eps = scores(B, n, seed=m + 7 * S, ties=ties)
    valid = torch.rand(B, n, generator=torch.Generator().manual_seed(2)) > 0.15
    for init in ({}, dict(init_eps=scores(B, m, 3), init_pos=torch.zeros(B, m, dtype=torch.long),
                          init_valid=torch.arange(m).expand(B, m) < 1)):
        a = eidetic_select(eps, valid, m, group_size=S, rule="literal", mode="reference", **init)
        b = eidetic_select(eps, valid, m, group_size=S, rule="literal", mode="scan", **init)
        assert as_sets(*a) == as_sets(*b)
    # and it differs from top-k somewhere: the literal rule never evicts
    t = eidetic_select(eps, valid, m, group_size=S, rule="topk")
    if m < n and not ties:
        assert as_sets(*t) != as_sets(*b)


@pytest.mark.parametrize("rule,ties", list(itertools.product(["topk", "literal"], [False, True])))
def test_streaming_heap_equals_prefix_selection(rule, ties):
    """Pushing tokens one at a time (decoding) keeps the set the prefix selection computes."""
    B, n, m = 4, 17, 3
    eps = scores(B, n, seed=11, ties=ties)
    mem_eps = torch.zeros(B, m, dtype=torch.float64)
    mem_pos = torch.zeros(B, m, dtype=torch.long)
    mem_valid = torch.zeros(B, m, dtype=torch.bool)
    mem_id = torch.zeros(B, m, dtype=torch.long)
    ids, vis = eidetic_select(eps, torch.ones(B, n, dtype=torch.bool), m, group_size=1, rule=rule)
    expected = as_sets(ids, vis)
    for t in range(n):
        slot, ins = heap_push(mem_eps, mem_pos, mem_valid, eps[:, t], torch.full((B,), t), rule=rule)
        hot = F.one_hot(slot, m).bool() & ins.unsqueeze(-1)
        mem_eps = torch.where(hot, eps[:, t : t + 1], mem_eps)
        mem_pos = torch.where(hot, t, mem_pos)
        mem_id = torch.where(hot, m + t, mem_id)
        mem_valid = mem_valid | hot
        got = [tuple(sorted(mem_id[b][mem_valid[b]].tolist())) for b in range(B)]
        assert got == [expected[b][t + 1] for b in range(B)], f"after token {t}"


def test_selection_bad_input():
    eps, valid = torch.rand(2, 6, dtype=torch.float64), torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match="rule"):
        eidetic_select(eps, valid, 2, group_size=2, rule="newest")
    with pytest.raises(ValueError, match="m_e"):
        eidetic_select(eps, valid, -1, group_size=2)
    with pytest.raises(ValueError, match="group_size"):
        eidetic_select(eps, valid, 2, group_size=4)
    with pytest.raises(ValueError, match="valid"):
        eidetic_select(eps, valid.float(), 2, group_size=2)
    with pytest.raises(ValueError, match="rule"):
        heap_push(eps[:, :2], torch.zeros(2, 2, dtype=torch.long), valid[:, :2], eps[:, 0], 0, rule="fifo")
    ids, vis = eidetic_select(eps, valid, 0, group_size=2)  # m_e = 0: an empty memory, no error
    assert ids.shape == (2, 4, 0) and vis.shape == (2, 4, 0)
