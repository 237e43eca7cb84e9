"""linear_recurrence's chunk form for a per-head decay that no token changes (``_chunk_fixed``: lightning attention's
fixed γ_h as the mixer hands it, a layer constant broadcast along time) against the reference loop and the general
chunk form, and the routing between the two."""

from __future__ import annotations

import pytest
import torch

import seqmix
import seqmix.ops.recurrence as rec
from seqmix.ops import linear_recurrence
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

B, H, K, V = 2, 4, 6, 5


def make(T, log_gamma, dtype, seed=0, per_batch=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=g, dtype=dtype) for d in (K, K, V))
    S0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    gamma = -torch.tensor(log_gamma, dtype=dtype)
    if per_batch:  # one decay per sequence and head, still the same at every token
        gamma = torch.stack([gamma, gamma * 0.5])
        gk = gamma.view(B, 1, H).expand(B, T, H)
    else:
        gk = gamma.view(1, 1, H).expand(B, T, H)  # a layer constant broadcast: stride 0 along batch and time
    return q, k, v, gk, S0


def runs_fixed(monkeypatch) -> list:
    calls = []
    real = rec._chunk_fixed

    def spy(*a, **kw):
        calls.append(a[0].shape)
        return real(*a, **kw)

    monkeypatch.setattr(rec, "_chunk_fixed", spy)
    return calls


# decays from none (γ = 1) to strong enough that a chunk's factors fall below e^-60 (taken as 0)
DECAYS = [[0.0, 0.01, 0.3, 2.0], [0.25, 0.0625, 0.0156, 0.0039], [100.0, 8.0, 0.0, 1.0]]


@pytest.mark.parametrize("T,C", [(64, 16), (37, 16), (5, 8), (130, 64)])
@pytest.mark.parametrize("log_gamma", DECAYS)
@pytest.mark.parametrize("per_batch", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_fixed_decay_chunk_equals_the_reference_float64(T, C, log_gamma, per_batch, with_state, monkeypatch):
    q, k, v, gk, S0 = make(T, log_gamma, torch.float64, per_batch=per_batch)
    S0 = S0 if with_state else None
    calls = runs_fixed(monkeypatch)
    o, S = linear_recurrence(q, k, v, gk, initial_state=S0, output_final_state=True, mode="chunk", chunk_size=C, scale=0.7)
    assert len(calls) == 1  # the fixed-decay form ran
    o_ref, S_ref = linear_recurrence(q, k, v, gk.contiguous(), initial_state=S0, output_final_state=True, mode="recurrent",
                                     scale=0.7)
    assert max_abs(o, o_ref) < F64_ATOL * max(1.0, float(o_ref.abs().max()))
    assert max_abs(S, S_ref) < F64_ATOL * max(1.0, float(S_ref.abs().max()))


@pytest.mark.parametrize("log_gamma", DECAYS)
def test_fixed_decay_chunk_float32_relative(log_gamma, monkeypatch):
    q, k, v, gk, S0 = make(100, log_gamma, torch.float32)
    calls = runs_fixed(monkeypatch)
    o, S = linear_recurrence(q, k, v, gk, initial_state=S0, output_final_state=True, mode="chunk", chunk_size=32)
    o_ref, S_ref = linear_recurrence(*(t.double() for t in (q, k, v, gk)), initial_state=S0.double(),
                                     output_final_state=True, mode="recurrent")
    assert len(calls) == 1 and o.dtype == torch.float32
    assert rel_err(o, o_ref) < F32_RTOL and rel_err(S, S_ref) < F32_RTOL


def test_half_inputs_compute_in_float32_and_match_the_general_chunk_form(monkeypatch):
    q, k, v, gk, S0 = make(48, DECAYS[1], torch.float32)
    calls = runs_fixed(monkeypatch)
    args = [t.to(torch.bfloat16) for t in (q, k, v)]
    o = linear_recurrence(*args, gk, mode="chunk", chunk_size=16)[0]
    o_general = linear_recurrence(*args, gk.contiguous(), mode="chunk", chunk_size=16)[0]
    assert len(calls) == 1 and o.dtype == torch.bfloat16
    assert rel_err(o.float(), o_general.float()) < 1e-2


def test_routing(monkeypatch):
    q, k, v, gk, S0 = make(40, DECAYS[1], torch.float64)
    calls = runs_fixed(monkeypatch)
    kw = dict(mode="chunk", chunk_size=16)
    linear_recurrence(q, k, v, gk.contiguous(), **kw)  # a decay per token (materialized): the general form
    linear_recurrence(q, k, v, gk.unsqueeze(-1).expand(B, 40, H, K), **kw)  # key-wise: the general form
    linear_recurrence(q, k, v, gk, -torch.ones(B, 40, H, V, dtype=torch.float64) * 0.1, **kw)  # a value-wise decay too
    linear_recurrence(q, k, v, gk, sub_chunk_size=8, **kw)  # tiles asked for: the general form
    linear_recurrence(q, k, v, gk, mode="recurrent")
    assert calls == []
    # autograd records: the general chunk form and its hand-written backward; its gradients are the reference's
    qg = q.clone().requires_grad_(True)
    o = linear_recurrence(qg, k, v, gk, **kw)[0]
    assert calls == []
    o.sum().backward()
    qr = q.clone().requires_grad_(True)
    linear_recurrence(qr, k, v, gk, mode="recurrent")[0].sum().backward()
    assert max_abs(qg.grad, qr.grad) < F64_ATOL * max(1.0, float(qr.grad.abs().max()))
    with torch.no_grad():  # the same inputs without autograd: the fixed-decay form
        linear_recurrence(qg, k, v, gk, **kw)
    assert len(calls) == 1
    linear_recurrence(q, k, v, gk, **kw)  # grad enabled but nothing that requires it: nothing recorded, the fixed form
    assert len(calls) == 2


def test_lightning_attention_mixer_takes_it_and_keeps_its_numbers(monkeypatch):
    torch.manual_seed(0)
    m = seqmix.build_mixer("lightning_attention", d_model=32, heads=4, chunk_size=16).double().eval()
    x = torch.randn(2, 45, 32, dtype=torch.float64)
    calls = runs_fixed(monkeypatch)
    with torch.no_grad():
        y = m(x)
        cache = seqmix.Cache()
        y_prefill = m(x, cache=cache)
        ref = m.core(x, mode="recurrent")[1]
        fast = m.core(x, mode="chunk")[1]
    assert len(calls) >= 2
    assert max_abs(fast, ref) < F64_ATOL * max(1.0, float(ref.abs().max()))
    assert torch.equal(y, y_prefill)
    # the prefill's state continues as the reference's: the next token from the cache equals a pass over T + 1 tokens
    x1 = torch.randn(2, 1, 32, dtype=torch.float64)
    with torch.no_grad():
        step = m(x1, cache=cache)
        m.mode = "recurrent"
        whole = m(torch.cat([x, x1], 1))
    assert max_abs(step[:, 0], whole[:, -1]) < F64_ATOL * max(1.0, float(whole.abs().max()))
