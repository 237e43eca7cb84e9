"""Log-linear attention: the op ``seqmix.ops.log_linear`` and the mixers log_linear_mamba2 and
log_linear_gdn. The Fenwick partition and the scalar-decay op against flash-linear-attention's naive
reference (optional: skipped without fla), the delta-rule base against its own definitions, every mode
against the parallel reference, state carrying at any offset, the O(log T) state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from seqmix.ops import delta_rule, linear_recurrence
from seqmix.ops.log_linear import fenwick_levels, hierarchical_mask, levels_needed, log_linear_attention
from fla_ref import fla_naive
from tolerances import F32_RTOL, F64_ATOL, assert_modes_agree_f64, max_abs, rel_err

MODES = ("parallel", "recurrent", "chunk")


def rnd(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def inputs(B=2, T=19, H=3, K=4, V=5, L=6, dtype=torch.float64, delta=False):
    q, k, v = rnd(B, T, H, K, seed=1, dtype=dtype), rnd(B, T, H, K, seed=2, dtype=dtype), rnd(B, T, H, V, seed=3, dtype=dtype)
    g = -rnd(B, T, H, seed=4, dtype=dtype).abs() * 0.5
    lam = F.softplus(rnd(B, T, H, L, seed=5, dtype=dtype))
    beta = torch.sigmoid(rnd(B, T, H, seed=6, dtype=dtype)) if delta else None
    if delta:
        k = F.normalize(k, dim=-1)
    return q, k, v, lam, g, beta


# -- the Fenwick partition ---------------------------------------------------------------------


def test_levels_are_floor_log2_of_xor_plus_one():
    lev = fenwick_levels(40)
    for i in range(40):
        for j in range(40):
            want = -1 if j > i else (0 if i == j else (i ^ j).bit_length())
            assert int(lev[i, j]) == want
    assert [levels_needed(t) for t in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 3, 3, 4, 4, 5, 5, 6]
    # O(log T) buckets per query: at most levels_needed(T) distinct levels in a row
    assert int(fenwick_levels(1000).max()) + 1 == levels_needed(1000)


@pytest.mark.parametrize("T", [1, 7, 16, 37])
def test_partition_matches_fla_level_masks(T):
    construct_level_mask = fla_naive("ops/log_linear_attn/naive.py", "construct_level_mask")
    L = levels_needed(T) + 1
    lam = torch.arange(1, L + 1, dtype=torch.float64).view(1, L, 1).expand(1, L, T)  # [B, L, T]: λ^(ℓ) = ℓ + 1
    fla_H = sum(construct_level_mask(level, lam) for level in range(L))[0]
    ours = hierarchical_mask(torch.arange(1, L + 1, dtype=torch.float64).expand(1, T, 1, L))[0, 0]
    assert torch.equal(fla_H, ours)


# -- the op ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_scalar_decay_op_matches_fla_naive(mode):
    naive = fla_naive("ops/log_linear_attn/naive.py", "naive_log_linear_attn")
    q, k, v, lam, g, _ = inputs()
    ref = naive(q, k, v, g, lam)
    o, _ = log_linear_attention(q, k, v, lam, g, mode=mode, chunk_size=4)
    assert max_abs(o, ref) < F64_ATOL


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
def test_unit_level_weights_give_the_base_op(delta):
    """λ ≡ 1: H is the causal mask and the op is its base (linear_recurrence / delta_rule)."""
    q, k, v, lam, g, beta = inputs(delta=delta)
    lam = torch.ones_like(lam)
    base = delta_rule(q, k, v, beta, g, mode="recurrent")[0] if delta else linear_recurrence(q, k, v, g, mode="recurrent")[0]
    for mode in MODES:
        o, _ = log_linear_attention(q, k, v, lam, g, beta, mode=mode, chunk_size=4)
        assert max_abs(o, base) < F64_ATOL, mode


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
def test_one_level_isolates_its_bucket(delta):
    """λ = e_ℓ: o_i is the base output on the tokens of bucket ℓ of i alone (checked against the base op
    run on v masked to that bucket, query by query): an independent check of the level assignment."""
    B, T, H = 1, 13, 2
    q, k, v, lam, g, beta = inputs(B=B, T=T, H=H, delta=delta)
    lev = fenwick_levels(T)
    for ell in (0, 1, 3):
        lam1 = torch.zeros_like(lam)
        lam1[..., ell] = 1
        o, _ = log_linear_attention(q, k, v, lam1, g, beta, mode="recurrent")
        for i in (5, 8, 12):
            vm = v * (lev[i] == ell).view(1, T, 1, 1)
            ref = (delta_rule(q, k, vm, beta, g)[0] if delta else linear_recurrence(q, k, vm, g)[0])[:, i]
            assert max_abs(o[:, i], ref) < F64_ATOL, (ell, i)


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
def test_modes_agree_and_gradients(delta):
    q, k, v, lam, g, beta = inputs(delta=delta)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, lam, g) + ((beta,) if delta else ())]
    w = rnd(*v.shape, seed=9)
    outs = {}
    for mode in MODES:
        o, S = log_linear_attention(*leaves[:5], leaves[5] if delta else None, mode=mode, chunk_size=4, output_final_state=True)
        grads = torch.autograd.grad((o * w).sum() + S.sum(), leaves)
        outs[mode] = (o.detach(), S.detach(), grads)
    ref = outs["parallel"]
    for mode in ("recurrent", "chunk"):
        assert max_abs(outs[mode][0], ref[0]) < F64_ATOL
        assert max_abs(outs[mode][1], ref[1]) < F64_ATOL
        for a, b in zip(outs[mode][2], ref[2]):
            assert max_abs(a, b) < F64_ATOL


@pytest.mark.parametrize("delta", [False, True], ids=["linear", "delta"])
@pytest.mark.parametrize("mode", MODES)
def test_split_and_carry_at_any_offset(delta, mode):
    q, k, v, lam, g, beta = inputs(delta=delta)
    T = q.shape[1]
    full, S_full = log_linear_attention(q, k, v, lam, g, beta, mode="parallel", output_final_state=True)
    for cut in (1, 3, 8, 13, T - 1):
        a = slice(0, cut)
        b = slice(cut, T)
        part = lambda t, s: None if t is None else t[:, s]  # noqa: E731
        o1, S1 = log_linear_attention(q[:, a], k[:, a], v[:, a], lam[:, a], g[:, a], part(beta, a), mode=mode, chunk_size=4,
                                      output_final_state=True)
        assert S1.shape[2] == levels_needed(cut)
        o2, S2 = log_linear_attention(q[:, b], k[:, b], v[:, b], lam[:, b], g[:, b], part(beta, b), mode=mode, chunk_size=4,
                                      initial_state=S1, offset=cut, output_final_state=True)
        assert max_abs(torch.cat([o1, o2], 1), full) < F64_ATOL, cut
        assert max_abs(S2, S_full) < F64_ATOL, cut


def test_step_mode_and_state_growth():
    q, k, v, lam, g, _ = inputs(T=17)
    full, _ = log_linear_attention(q, k, v, lam, g, mode="parallel")
    S, outs = None, []
    for t in range(17):
        o, S = log_linear_attention(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], lam[:, t:t + 1], g[:, t:t + 1], mode="step",
                                    initial_state=S, offset=t, output_final_state=True)
        assert S.shape[2] == levels_needed(t + 1)  # O(log T) level states
        outs.append(o)
    assert max_abs(torch.cat(outs, 1), full) < F64_ATOL


def test_float32_and_half_inputs():
    q, k, v, lam, g, _ = inputs(dtype=torch.float32)
    ref, _ = log_linear_attention(*(t.double() for t in (q, k, v, lam, g)), mode="parallel")
    for mode in MODES:
        o, _ = log_linear_attention(q, k, v, lam, g, mode=mode, chunk_size=4)
        assert o.dtype == torch.float32 and rel_err(o, ref) < F32_RTOL
    o, _ = log_linear_attention(*(t.bfloat16() for t in (q, k, v, lam, g)), mode="chunk", chunk_size=4)
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()


def test_bad_arguments():
    q, k, v, lam, g, _ = inputs(T=9, L=3)
    with pytest.raises(ValueError, match="level_scales"):  # 9 tokens need 5 levels
        log_linear_attention(q, k, v, lam, g)
    q, k, v, lam, g, _ = inputs()
    with pytest.raises(ValueError, match="mode"):
        log_linear_attention(q, k, v, lam, g, mode="fft")
    with pytest.raises(ValueError, match="'g'"):
        log_linear_attention(q, k, v, lam, -g)
    with pytest.raises(ValueError, match="initial_state"):
        log_linear_attention(q, k, v, lam, g, initial_state=torch.zeros(2, 3, 2, 4, 5, dtype=torch.float64), offset=5)


# -- the mixers --------------------------------------------------------------------------------


def build(name, dtype=torch.float64, **kw):
    torch.manual_seed(0)
    m = seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **kw}).to(dtype).eval()
    with torch.no_grad():  # level weights that differ per level (L starts at 1)
        m.L.copy_(1 + rnd(*m.L.shape, seed=11, dtype=dtype))
    return m


def test_log_linear_mamba2_core_matches_fla_naive():
    naive = fla_naive("ops/log_linear_attn/naive.py", "naive_log_linear_attn")
    m = build("log_linear_mamba2")
    x = rnd(2, 19, m.d_model, seed=3)
    values, mixed = m.core(x)
    x_in, _, delta, Bm, Cm, _ = m._inputs(x)
    lam = m.level_scales(x)
    # fla's layer: q = C, k = B, v = Δ·x, g = Δ·a (the same product Δ_s B_s x_s as seqmix's k = ΔB, v = x)
    ref = naive(Cm, Bm, delta.unsqueeze(-1) * x_in, delta * -m.A_log.exp(), lam)
    assert max_abs(mixed - m.D.unsqueeze(-1) * values, ref) < F64_ATOL


@pytest.mark.parametrize("name", ["log_linear_mamba2", "log_linear_gdn"])
def test_unit_level_weights_give_the_base_mixer(name):
    """With λ ≡ 1 (L = 0 would give softplus(0); set W_λ = 0 and L so that softplus = 1) the mixer is its base."""
    m = build(name)
    base_name = "mamba2" if name == "log_linear_mamba2" else "gated_deltanet"
    torch.manual_seed(0)
    base = seqmix.build_mixer(base_name, **seqmix.mixer_entry(name).example_config()).double().eval()
    sd = {k: v for k, v in m.state_dict().items() if k not in ("L", "W_lambda.weight")}
    base.load_state_dict(sd)
    with torch.no_grad():
        m.W_lambda.weight.zero_()
        m.L.fill_(1.0)
    x = rnd(2, 19, m.d_model, seed=3)
    # softplus(0) = log 2: the output is log 2 times the base core; compare the cores
    _, mixed = m.core(x)
    _, mixed_base = base.core(x)
    if name == "log_linear_mamba2":
        values, _ = m.core(x)
        skip = m.D.unsqueeze(-1) * values
        assert max_abs(mixed - skip, torch.log(torch.tensor(2.0, dtype=x.dtype)) * (mixed_base - skip)) < F64_ATOL
    else:
        assert max_abs(mixed, torch.log(torch.tensor(2.0, dtype=x.dtype)) * mixed_base) < F64_ATOL


@pytest.mark.parametrize("name", ["log_linear_mamba2", "log_linear_gdn"])
def test_mixer_modes_decoding_and_state(name):
    m = build(name)
    x = rnd(2, 21, m.d_model, seed=4)
    y = assert_modes_agree_f64(m, x, name)
    cache = Cache()
    steps = [m(x[:, t:t + 1], cache=cache) for t in range(21)]
    assert max_abs(torch.cat(steps, 1), y) < F64_ATOL
    st = cache.get(m)
    assert st["pos"] == 21 and st["S"].shape[2] == levels_needed(21)
    assert cache.floats() == 2 * m.state_size(seq_len=21)
    assert m.state_size(seq_len=1 << 10) < m.state_size(seq_len=(1 << 10) + 1)  # grows with log T


@pytest.mark.parametrize("name", ["log_linear_mamba2", "log_linear_gdn"])
def test_mixer_refuses_sequences_beyond_its_levels(name):
    m = build(name, num_levels=3)  # 3 levels cover 4 tokens
    m(rnd(1, 4, m.d_model))
    with pytest.raises(ValueError, match="num_levels"):
        m(rnd(1, 5, m.d_model))
    cache = Cache()
    m(rnd(1, 4, m.d_model), cache=cache)
    with pytest.raises(ValueError, match="num_levels"):
        m(rnd(1, 1, m.d_model), cache=cache)


def test_dsf_transition_is_the_fenwick_carry():
    """The DSF's Λ_t merges levels 0..ctz(t) into ctz(t)+1 (binary counter), times the base decay."""
    m = build("log_linear_mamba2")
    x = rnd(1, 8, m.d_model, seed=2)
    system = m.dsf(x)
    Lam = system.transition()  # [B, T, N, N]
    n, K = levels_needed(8), m.config.d_state
    assert Lam.shape[-1] == m.d_inner * K * n
    _, q, k, gk, _ = m._parts(x)
    for t, merged in ((1, [0, 1]), (4, [0, 1, 2, 3]), (6, [0, 1, 2])):  # ctz(t) + 2 levels merge into the last of them
        carry = torch.eye(n, dtype=torch.float64)
        carry[merged] = 0
        carry[merged[-1], merged] = 1
        block = Lam[0, t, : n * K, : n * K]  # head 0, value channel 0
        want = gk[0, t, 0].exp() * torch.kron(carry, torch.eye(K, dtype=torch.float64))
        assert max_abs(block, want) < F64_ATOL, t
    # the DSF reproduces phi (dense check of the contract at a second length)
    values, mixed = m.core(x)
    assert max_abs(system.evaluate(values.flatten(2)), mixed.flatten(2)) < F64_ATOL
