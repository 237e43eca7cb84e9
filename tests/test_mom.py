"""MoM (src/seqmix/mixers/delta.py): the masked E·H-head form against fla's semantics — each memory a gated
delta rule over the sequence of the tokens routed to it, run by fla's naive_recurrent_gated_delta_rule on
that compacted sequence (float32 inside: F32_RTOL) — the router, the shared memory, and config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from fla_ref import fla_naive
from tolerances import F32_RTOL, assert_decodes_splits_and_maps, rel_err

B = 2


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return seqmix.build_mixer("mom", **{**seqmix.mixer_entry("mom").example_config(), **overrides}).double().eval()


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("shared", [False, True])
def test_mom_equals_memories_over_their_routed_tokens(shared):
    naive = fla_naive("ops/gated_delta_rule/naive.py", "naive_recurrent_gated_delta_rule")
    m = build(conv_size=None, shared_memory=shared)
    x = randn(B, 17, m.d_model)
    T, E, H, K, V = 17, m.E, m.H, m.K, m.V
    # the inputs as fla's layer makes them (no conv), from the mixer's weights
    q = F.normalize(F.silu(m.W_q(x)).view(B, T, H, K), dim=-1)
    k = F.normalize(F.silu(m.W_k(x)).view(B, T, E, H, K), dim=-1)
    v = F.silu(m.W_v(x)).view(B, T, E, H, V)
    beta = torch.sigmoid(m.W_beta(x)).view(B, T, E, H)
    g = -m.A_log.exp() * F.softplus(m.W_a(x).view(B, T, E, H) + m.dt_bias)
    r = torch.softmax(m.W_router(x), -1)
    top, idx = torch.topk(r, m.config.topk, -1)
    expected = torch.zeros(B, T, H, V, dtype=torch.float64)
    for b in range(B):
        for e in range(E):
            if e < m.config.num_memories:
                rows = (idx[b] == e).any(-1).nonzero()[:, 0]  # the tokens routed to memory e, in order
                weight = (top[b] * (idx[b] == e)).sum(-1)[rows] / top[b, rows].sum(-1)
            else:  # the shared memory: every token, weight 1
                rows, weight = torch.arange(T), torch.ones(T, dtype=torch.float64)
            if len(rows) == 0:
                continue
            o, _ = naive(q[b : b + 1, rows], k[b : b + 1, rows, e], v[b : b + 1, rows, e], beta[b : b + 1, rows, e],
                         g[b : b + 1, rows, e], scale=K**-0.5)
            expected[b, rows] += weight.view(-1, 1, 1) * o[0]
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed.view(B, T, E, H, V).sum(2), expected) < F32_RTOL, mode
    assert_decodes_splits_and_maps(m, x, f"mom shared={shared}")


def test_router_weights_and_state():
    m = build()
    x = randn(B, 9, m.d_model)
    w, mask = m.routing(x)
    assert torch.allclose(w.sum(-1), torch.ones(B, 9, dtype=torch.float64))
    assert (mask.sum(-1) == m.config.topk).all() and ((w > 0) == (mask > 0)).all()
    assert m.state_size() == 3 * 2 * 8 * 8 + (16 + 3 * 32) * 3
    assert build(shared_memory=True).E == 4


def test_mom_config_errors():
    with pytest.raises(ValueError, match="topk"):
        seqmix.build_mixer("mom", num_memories=2, topk=3)
    with pytest.raises(ValueError, match="heads"):
        seqmix.build_mixer("mom", d_model=18, heads=4)
