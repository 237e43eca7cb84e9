"""ABC (the ``abc`` preset of Gated Slot Attention, slot_gate='lse'): its core against flash-linear-
attention's naive ABC references (the recurrent one, and the paper's cumulative-sum form; both compute in
float32, hence F32_RTOL), the log-sum-exp gate's softmax identity, decoding with the positions and the
running log-sum-exp carried, and the ops' bad input."""

from __future__ import annotations

import pytest
import torch

import seqmix
from fla_ref import fla_naive
from seqmix.mixers.base import Cache
from seqmix.ops import lse_gate, rotary
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, max_abs, rel_err

B = 2


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return seqmix.build_mixer("abc", **{**seqmix.mixer_entry("abc").example_config(), **overrides}).double().eval()


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def fla_inputs(m, x):
    """ABC's inputs as fla's layer makes them (no conv): q, k = RoPE(x W), v = x W_v, the slot logits s = clamp(x W_s),
    in fla's naive layout [B, H, T, ·]."""
    Bt, T, _ = x.shape
    pos = torch.arange(T)
    q = rotary(m.W_q(x).view(Bt, T, m.H, m.K), pos)
    k = rotary(m.W_k(x).view(Bt, T, m.H, m.K), pos)
    v = m.W_v(x).view(Bt, T, m.H, m.V)
    s = m.W_f(x).view(Bt, T, m.H, m.M).clamp(-32, 32)
    return (t.transpose(1, 2) for t in (q, k, v, s))


def test_abc_core_matches_fla_naive():
    recurrent = fla_naive("ops/abc/naive.py", "naive_recurrent_abc")
    cumsum = fla_naive("ops/abc/naive.py", "naive_cumsum_abc")
    m = build()
    x = randn(B, 19, m.d_model)
    q, k, v, s = fla_inputs(m, x)
    o_ref, _ = recurrent(q, k, v, s, scale=m.K**-0.5)
    o_paper, _ = cumsum(q, k, v, s)
    assert rel_err(o_paper, o_ref) < F32_RTOL  # fla's two references agree
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref.transpose(1, 2)) < F32_RTOL, mode


def test_abc_decodes_with_positions_and_normalizer_carried():
    m = build()
    x = randn(B, 13, m.d_model)
    m.mode = "recurrent"
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, :4], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(4, 13)], 1)
    assert max_abs(steps, y) < F64_ATOL
    st = cache.get(m)
    assert st["pos"] == 13 and st["z"].shape == (B, m.H, m.M)
    assert_decodes_splits_and_maps(m, x, "abc")
    # without RoPE and with GSA's gate the state has no z and no position
    gsa = seqmix.build_mixer("gsa", **seqmix.mixer_entry("gsa").example_config())
    c2 = Cache()
    gsa(x.float(), cache=c2)
    assert set(c2.get(gsa)) == {"Sk", "Sv"}


def test_lse_gate_is_a_running_softmax():
    logits = randn(B, 11, 3, 5)
    w, la, zT = lse_gate(logits)
    # S_t = Σ_s (Π_{r=s+1}^{t} α_r) w_s x_s equals Σ_s softmax_{s<=t}(κ)_s x_s
    xs = randn(B, 11, 3, 5, seed=2)
    S, ref = torch.zeros(B, 3, 5, dtype=torch.float64), []
    for t in range(11):
        S = la[:, t].exp() * S + w[:, t] * xs[:, t]
        ref.append((torch.softmax(logits[:, : t + 1], dim=1) * xs[:, : t + 1]).sum(1))
        assert max_abs(S, ref[-1]) < 1e-12
    assert max_abs(zT, torch.logsumexp(logits, dim=1)) < 1e-12
    # carried: two calls equal one
    w1, la1, z1 = lse_gate(logits[:, :4])
    w2, la2, z2 = lse_gate(logits[:, 4:], z1)
    assert max_abs(torch.cat([w1, w2], 1), w) < 1e-12 and max_abs(torch.cat([la1, la2], 1), la) < 1e-12
    with pytest.raises(ValueError, match="'logits'"):
        lse_gate(torch.zeros(2, 0, 3))
    with pytest.raises(ValueError, match="'z0'"):
        lse_gate(logits, torch.zeros(B, 4))


def test_abc_config_errors():
    with pytest.raises(ValueError, match="rope"):
        seqmix.build_mixer("abc", d_model=12, heads=2, expand_k=0.5)  # d_k' = 3: odd
    with pytest.raises(ValueError, match="slot_gate"):
        seqmix.build_mixer("abc", slot_gate="softmax")
