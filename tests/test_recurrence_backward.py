"""The chunk mode's hand-written backward (recurrence._ChunkOneTile) against the reference loop."""

from __future__ import annotations

import itertools

import pytest
import torch

from seqmix.ops import linear_recurrence
from tolerances import F64_ATOL, max_abs

B, H, K, V = 2, 3, 5, 4


def make(T, decay, value_decay, *, complex_=False, seed=0, with_state=True):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    gk = {"none": None, "head": -r(B, T, H).abs() * 0.5, "key": -r(B, T, H, K).abs() * 0.5}[decay]
    gv = -r(B, T, H, V).abs() * 0.5 if value_decay else None
    S0 = r(B, H, K, V) if with_state else None
    if complex_:
        q, k = torch.complex(q, r(B, T, H, K)), torch.complex(k, r(B, T, H, K))
        gk = torch.complex(gk, r(*gk.shape)) if gk is not None else None
    return q, k, v, gk, gv, S0


def outputs_and_grads(mode, args, **kw):
    leaves = [None if t is None else t.clone().requires_grad_(True) for t in args]
    q, k, v, gk, gv, S0 = leaves
    o, S = linear_recurrence(q, k, v, gk, gv, initial_state=S0, output_final_state=True, mode=mode, scale=0.7, **kw)
    wo = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(o.dtype)
    wS = torch.randn(S.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(S.dtype)
    loss = (o * wo).sum().real + (S * wS).sum().real  # the final state's gradient flows too
    used = [t for t in leaves if t is not None]
    return o, S, torch.autograd.grad(loss, used)


def graph_names(t):
    seen, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return {type(f).__name__ for f in seen}


CASES = list(itertools.product(["none", "head", "key"], [False, True], [16, 19], [True, False]))


@pytest.mark.parametrize("decay,value_decay,T,with_state", CASES)
def test_manual_backward_equals_reference_float64(decay, value_decay, T, with_state):
    """Outputs, final state and every gradient (incl. the initial state) equal the loop; T = 19
    is not a multiple of the chunk (padded tail)."""
    args = make(T, decay, value_decay, with_state=with_state)
    o_ref, S_ref, g_ref = outputs_and_grads("recurrent", args)
    for C in (4, 8):
        o, S, g = outputs_and_grads("chunk", args, chunk_size=C, chunk_backward="manual")
        assert max_abs(o, o_ref) < F64_ATOL and max_abs(S, S_ref) < F64_ATOL
        for a, b in zip(g, g_ref):
            assert max_abs(a, b) < F64_ATOL


@pytest.mark.parametrize("decay", ["head", "key"])
def test_manual_backward_complex_decays(decay):
    args = make(19, decay, False, complex_=True)
    o_ref, S_ref, g_ref = outputs_and_grads("recurrent", args)
    o, S, g = outputs_and_grads("chunk", args, chunk_size=8)
    assert o.is_complex() and max_abs(o, o_ref) < F64_ATOL and max_abs(S, S_ref) < F64_ATOL
    for a, b in zip(g, g_ref):
        assert max_abs(a, b) < F64_ATOL


def test_manual_path_is_the_one_taken_and_autograd_stays_selectable():
    args = [t.requires_grad_(True) if t is not None else None for t in make(19, "key", True)]
    q, k, v, gk, gv, S0 = args
    o, _ = linear_recurrence(q, k, v, gk, gv, initial_state=S0, mode="chunk", chunk_size=8)
    assert any("ChunkOneTile" in n for n in graph_names(o))
    o2, _ = linear_recurrence(q, k, v, gk, gv, initial_state=S0, mode="chunk", chunk_size=8, chunk_backward="autograd")
    assert not any("ChunkOneTile" in n for n in graph_names(o2))
    assert max_abs(o, o2) < F64_ATOL


def test_strong_decays_fall_back_to_autograd_tiles():
    """Decay spans above e^30 inside a chunk need sub-chunk tiles: autograd runs them (documented)."""
    q, k, v, gk, gv, S0 = make(19, "key", False)
    gk = gk * 40
    o, _ = linear_recurrence(q.requires_grad_(True), k, v, gk, initial_state=S0, mode="chunk", chunk_size=8)
    assert not any("ChunkOneTile" in n for n in graph_names(o))


@pytest.mark.parametrize("decay,value_decay", [("key", False), ("head", True), ("none", True)])
def test_gradcheck_small(decay, value_decay):
    g = torch.Generator().manual_seed(5)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)

    T = 7
    q, k, v, S0 = r(1, T, 2, 2), r(1, T, 2, 2), r(1, T, 2, 3), r(1, 2, 2, 3)
    gk = {"none": None, "head": -torch.rand(1, T, 2, generator=g, dtype=torch.float64),
          "key": -torch.rand(1, T, 2, 2, generator=g, dtype=torch.float64)}[decay]
    gv = -torch.rand(1, T, 2, 3, generator=g, dtype=torch.float64) if value_decay else None
    inputs = [t for t in (q, k, v, gk, gv, S0) if t is not None]
    for t in inputs:
        t.requires_grad_(True)

    def f(*xs):
        it = iter(xs)
        q_, k_, v_ = next(it), next(it), next(it)
        gk_ = next(it) if gk is not None else None
        gv_ = next(it) if gv is not None else None
        S0_ = next(it)
        return linear_recurrence(q_, k_, v_, gk_, gv_, initial_state=S0_, output_final_state=True, mode="chunk",
                                 chunk_size=4, check_values=False)

    assert torch.autograd.gradcheck(f, tuple(inputs), fast_mode=True)


def saved_elements(T, backward, K_=16, V_=16, C=16):
    """Elements kept for the backward by one forward (saved-tensor hooks)."""
    q, k, v = (torch.randn(1, T, 1, d, requires_grad=True) for d in (K_, K_, V_))
    gk = (-torch.rand(1, T, 1, K_) * 0.1).requires_grad_(True)
    seen = {}

    def pack(t):
        seen[(t.data_ptr(), tuple(t.shape), t.dtype)] = t.numel()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_recurrence(q, k, v, gk, mode="chunk", chunk_size=C, chunk_backward=backward, check_values=False)
    return sum(seen.values())


def test_kept_memory_is_linear_in_T_and_below_autograd():
    K_, V_, C = 16, 16, 16
    m1, m2 = saved_elements(256, "manual"), saved_elements(512, "manual")
    assert 1.9 < m2 / m1 < 2.1  # linear in T
    per_token = m2 / 512
    # q~, k~, v~, E, G (5 of width <= 16), A (C = 16), boundary states (K V / C per token)
    assert per_token <= 5 * 16 + C + K_ * V_ / C + 1
    assert m2 < saved_elements(512, "autograd")


def test_bad_chunk_backward():
    q = torch.randn(1, 4, 1, 2)
    with pytest.raises(ValueError, match="chunk_backward"):
        linear_recurrence(q, q, q, mode="chunk", chunk_backward="fast")


def test_autocast_does_not_lower_the_chunk_core():
    """Under bf16 autocast the hand-written chunk form still computes in its inputs' float32."""
    q, k, v, gk, gv, S0 = (None if t is None else t.float() for t in make(40, "key", False))
    o_ref, _ = linear_recurrence(q, k, v, gk, initial_state=S0, mode="chunk", chunk_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o, _ = linear_recurrence(q, k, v, gk, initial_state=S0, mode="chunk", chunk_size=8)
    assert o.dtype == torch.float32 and max_abs(o, o_ref) < 1e-5
