"""The window + linear hybrids: the window op (seqmix.ops.window_softmax), LoLCATs attention (eq. 7, one
normalization), Liger's key-pooled gate (``decay="key_pool"``, ``liger_gla``) and Liger attention. Beyond the
contract suite (tests/test_contract.py runs on every registered name): each against a reference written from
the paper's equation, the special cases that reduce them to existing mixers, the modes at windows below, at
and above the chunk, and the decoding step's bounded work."""

from __future__ import annotations

import math

import pytest
import torch

import seqmix
from seqmix.mixers import hybrid
from seqmix.mixers.base import Cache
from seqmix.ops.window_attention import window_softmax
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, assert_modes_agree_f64, forward_and_grads, max_abs, rel_err

D64 = torch.float64


def x_of(d=16, T=19, B=2, seed=1, dtype=D64):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def build(name, dtype=D64, **kw):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **kw}).to(dtype).eval()


def perturb_(m, scale=0.3):
    """Moves every parameter off its init (the Hedgehog maps off the identity, γ off 0.1), so that no term is trivial."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


# -- the op -------------------------------------------------------------------------------------


def _brute(q, k, v, w, valid):
    """The module docstring's sums, one query at a time."""
    B, T, H, _ = q.shape
    R = k.shape[1] - T
    num = q.new_zeros(B, T, H, v.shape[-1])
    den, mx = q.new_zeros(B, T, H), q.new_zeros(B, T, H)
    for t in range(T):
        js = [j for j in range(R + t - w + 1, R + t + 1) if j >= 0 and bool(valid[j])]
        s = torch.einsum("bhk,bjhk->bhj", q[:, t], k[:, js])
        m = s.amax(-1)
        p = torch.exp(s - m.unsqueeze(-1))
        num[:, t], den[:, t], mx[:, t] = torch.einsum("bhj,bjhv->bhv", p, v[:, js]), p.sum(-1), m
    return num, den, mx


@pytest.mark.parametrize("T,R,w,C", [(19, 0, 5, 8), (19, 5, 5, 8), (16, 4, 7, 4), (7, 3, 1, 4), (3, 0, 10, 8), (20, 9, 12, 5),
                                     (1, 5, 5, 8), (1, 4, 4, 4), (1, 3, 6, 4)])  # (T = 1: the fused step, a masked slot in the window)
def test_window_softmax_modes_equal_the_sums_one_query_at_a_time(T, R, w, C):
    g = torch.Generator().manual_seed(T + R + w)
    q, k, v = (torch.randn(2, n, 2, c, generator=g, dtype=D64, requires_grad=True) for n, c in ((T, 4), (R + T, 4), (R + T, 3)))
    valid = torch.ones(R + T, dtype=torch.bool)
    valid[: R // 2] = False  # cache slots before position 0
    ref = _brute(q, k, v, w, valid)
    outs = {mode: window_softmax(q, k, v, window=w, key_valid=valid, mode=mode, chunk_size=C) for mode in ("parallel", "chunk")}
    for mode, out in outs.items():
        for a, b in zip(out, ref):
            assert max_abs(a, b) < F64_ATOL, mode
    weights = torch.randn(outs["chunk"][0].shape, generator=g, dtype=D64)
    grads = {mode: torch.autograd.grad((o[0] * weights).sum() + o[1].sum(), (q, k, v)) for mode, o in outs.items()}
    for a, b in zip(grads["chunk"], grads["parallel"]):
        assert max_abs(a, b) < F64_ATOL


def test_window_softmax_weights_and_float32():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 13, 2, 4, generator=g) for _ in range(3))
    num, den, m, p = window_softmax(q, k, v, window=4, mode="parallel", return_weights=True)
    assert p.shape == (2, 2, 13, 13) and float(torch.triu(p, 1).abs().max()) == 0.0 and float(torch.tril(p, -4).abs().max()) == 0.0
    assert max_abs(torch.einsum("bhts,bshv->bthv", p, v), num) < 1e-5
    c = window_softmax(q, k, v, window=4, mode="chunk", chunk_size=4)
    assert all(rel_err(a, b) < F32_RTOL for a, b in zip(c, (num, den, m)))


def test_window_softmax_bad_input_names_the_argument():
    q = torch.randn(1, 4, 2, 3)
    for kw, name in (({"window": 0}, "window"), ({"window": 2, "mode": "sdpa"}, "mode"),
                     ({"window": 2, "mode": "chunk", "return_weights": True}, "return_weights"),
                     ({"window": 2, "key_valid": torch.ones(3, dtype=torch.bool)}, "key_valid")):
        with pytest.raises(ValueError, match=name):
            window_softmax(q, q, q, **kw)
    with pytest.raises(ValueError, match="'k'"):
        window_softmax(q, q[:, :2], q[:, :2], window=2)


# -- LoLCATs attention ----------------------------------------------------------------------------


def eq7(m, x):
    """LoLCATs eq. 7 written out per token from the mixer's own q, k, v and feature maps (its parametrization), the
    combination independent of the mixer's: y_t = [Σ_win γ e^{s − c_t} v + λ φ(q_t)ᵀ Σ_{j<=t−w} ψ(k_j) v_jᵀ] / [same sums]."""
    q, k, v = m._rotated(x)
    fq, fk = m._query_features(q), m._key_features(k)
    gamma, lam = m.window_factors()
    w, T = m.window, x.shape[1]
    out = torch.zeros_like(v)
    for t in range(T):
        win = list(range(max(0, t - w + 1), t + 1))
        s = torch.einsum("bhk,bjhk->bhj", q[:, t], k[:, win])
        c = s.amax(-1, keepdim=True)
        e = gamma.view(1, -1, 1) * torch.exp(s - c)
        num = torch.einsum("bhj,bjhv->bhv", e, v[:, win])
        den = e.sum(-1)
        if t - w >= 0:
            a = lam.view(1, -1, 1) * torch.einsum("bhf,bjhf->bhj", fq[:, t], fk[:, : t - w + 1])
            num = num + torch.einsum("bhj,bjhv->bhv", a, v[:, : t - w + 1])
            den = den + a.sum(-1)
        out[:, t] = num / den.unsqueeze(-1)
    return out


@pytest.mark.parametrize("kw", [{}, {"affine_window_factor": True}, {"window": 1, "chunk_size": 4}, {"window": 11, "chunk_size": 4},
                                {"rope": True}], ids=["w5", "affine", "w1", "w11", "rope"])
def test_lolcats_every_mode_is_eq7(kw):
    m = perturb_(build("lolcats", **kw))
    x = x_of()
    ref = eq7(m, x)
    for mode in m.modes:
        m.mode = mode
        _, mixed = m.core(x, mode=mode)
        assert max_abs(mixed, ref) < F64_ATOL, mode
    assert max_abs(torch.einsum("bhts,bshv->bthv", m.phi(x), m._rotated(x)[2]), ref) < F64_ATOL


@pytest.mark.parametrize("w,C,T", [(1, 8, 19), (8, 8, 16), (13, 4, 19), (40, 8, 19), (3, 16, 35)])
def test_lolcats_modes_decoding_and_splits_agree_at_windows_below_at_and_above_the_chunk(w, C, T):
    m = perturb_(build("lolcats", window=w, chunk_size=C))
    x = x_of(T=T)
    assert_modes_agree_f64(m, x, f"lolcats w={w} C={C}")
    assert_decodes_splits_and_maps(m, x, f"lolcats w={w} C={C}", split=min(w + 1, T - 2))
    m32 = perturb_(build("lolcats", torch.float32, window=w, chunk_size=C))
    x32 = x.float()
    y_ref, g_ref = forward_and_grads(m32, x32, m32.reference_mode)
    # (a window covering the whole sequence, w >= T, leaves the linear part empty: the window's weight cancels in the
    # normalized sum and the window logit's gradient is zero in exact arithmetic, rounding noise in float32, where a
    # relative error says nothing; each gradient is held to F32_RTOL of itself, or to F32_RTOL / 100 of the largest gradient)
    scale = max(float(b.abs().max()) for b in g_ref if b is not None)
    for mode in ("chunk", "parallel"):
        y, g = forward_and_grads(m32, x32, mode)
        assert rel_err(y, y_ref) < F32_RTOL
        for a, b in zip(g, g_ref):
            if a is not None:
                assert rel_err(a, b) < F32_RTOL or max_abs(a, b) < F32_RTOL * scale * 1e-2, (mode, rel_err(a, b), max_abs(a, b))


def _attention_twin(m, **kw):
    """softmax_attention with m's q/k/v/o weights, heads, scale, RoPE (its scaling too) and qk-norm."""
    c = m.config
    att = seqmix.build_mixer("softmax_attention", d_model=c.d_model, n=c.n, heads=c.heads, scale=c.scale, rope=c.rope,
                             rope_theta=c.rope_theta, rope_scaling=c.rope_scaling, qk_norm=c.qk_norm, qk_norm_eps=c.qk_norm_eps,
                             **kw).to(D64)
    att.load_state_dict({k: v for k, v in m.state_dict().items() if k.startswith(("W_qk", "W_v", "W_o", "q_norm", "k_norm"))})
    return att


#: Llama 3.1's RoPE scaling at a small context (original 8 tokens: the test lengths reach past it)
LLAMA3 = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize("rope", [False, True])
def test_lolcats_with_the_window_covering_the_sequence_is_softmax_attention(rope):
    """w >= T: the linear sums are empty and γ cancels: softmax attention exactly, whatever φ, ψ and γ."""
    m = perturb_(build("lolcats", window=32, rope=rope, scale="sqrt"))
    att = _attention_twin(m)
    x = x_of(T=19)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), att(x)) < F64_ATOL, mode
    # a window shorter than the sequence: not softmax attention (the check can fail)
    short = build("lolcats", window=4, rope=rope, scale="sqrt")
    short.load_state_dict(m.state_dict())
    assert max_abs(short(x), att(x)) > 1e-3


def test_lolcats_with_scaled_rope_and_qk_norm_covering_the_sequence_is_that_softmax_attention():
    """The options a real teacher needs (Llama 3's scaled RoPE, Qwen3's per-head qk-norm with weights off 1): with the
    window covering the sequence the student is softmax attention with the same options, in every mode; dropping either
    option from the student leaves it another map (the check can fail)."""
    m = perturb_(build("lolcats", window=32, rope=True, rope_scaling=LLAMA3, qk_norm="head", scale="sqrt"))
    att = _attention_twin(m)
    assert float((att.q_norm.weight.detach() - 1).abs().max()) > 0.1  # the norm's weights are not the identity
    x = x_of(T=19)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), att(x)) < F64_ATOL, mode
    for off in ({"rope_scaling": None}, {"qk_norm": "none"}):
        other = build("lolcats", **{**m.config.model_dump(), **off})
        other.load_state_dict(m.state_dict(), strict=False)
        assert max_abs(other(x), att(x)) > 1e-3, off


@pytest.mark.parametrize("name,kw", [("lolcats", {"window": 4, "rope": True, "qk_norm": "head"}),
                                     ("liger_attention", {"window": 4}), ("rad_rwkv7", {})], ids=["lolcats", "liger_attention", "rad_rwkv7"])
def test_scaled_rope_students_agree_across_modes_decoding_and_splits(name, kw):
    """The students that take a teacher's RoPE, with its scaling (and lolcats with a qk-norm): every mode, step decoding
    (positions from the state), splits, phi and the DSF agree in float64, at lengths past the scaling's original
    context."""
    m = perturb_(build(name, rope_scaling=LLAMA3, **kw))
    x = x_of(T=19)
    assert_modes_agree_f64(m, x, name)
    assert_decodes_splits_and_maps(m, x, name, split=7)


def test_rope_scaling_and_qk_norm_options_are_checked_naming_the_field():
    with pytest.raises(ValueError, match="rope_scaling"):
        build("lolcats", rope=False, rope_scaling=LLAMA3)
    with pytest.raises(ValueError, match="rope_scaling"):
        build("lolcats", rope=True, rope_scaling={"type": "llama3", "factor": 8.0})  # fields missing
    with pytest.raises(ValueError, match="rope_scaling"):
        build("liger_attention", rope_theta=None, rope_scaling=LLAMA3)
    with pytest.raises(ValueError, match="rope_scaling"):
        build("rad_rwkv7", rope_theta=None, rope_scaling=LLAMA3)
    with pytest.raises(ValueError, match="rope"):
        build("linear_attention", n=6, heads=2, rope=True)  # K = 3: RoPE turns pairs
    with pytest.raises(ValueError, match="qk_norm"):
        build("linear_attention", qk_norm="full")


def test_lolcats_with_the_factor_saturated_toward_softmax_is_sliding_window_attention():
    """affine factors, γ → 1: the linear terms' weight 1 − γ vanishes: softmax over the last w tokens."""
    m = perturb_(build("lolcats", window=4, affine_window_factor=True, scale="sqrt"))
    with torch.no_grad():
        m.window_logit.fill_(60.0)  # σ(60) = 1 − 9e-27
    att = _attention_twin(m, window=4)
    x = x_of()
    assert max_abs(m(x), att(x)) < F64_ATOL
    with torch.no_grad():
        m.window_logit.fill_(0.0)
    assert max_abs(m(x), att(x)) > 1e-3


def test_lolcats_window_zero_is_linear_attention_and_the_factor_toward_linear_leaves_the_window_out():
    m = perturb_(build("lolcats", window=0))
    lin = seqmix.build_mixer("linear_attention", **{k: v for k, v in m.config.model_dump().items()
                                                    if k not in ("window", "window_factor", "affine_window_factor")}).to(D64)
    missing, unexpected = lin.load_state_dict(m.state_dict(), strict=False)
    assert not missing and unexpected == ["window_logit"]
    x = x_of()
    for mode in m.modes:
        m.mode = lin.mode = mode
        assert max_abs(m(x), lin(x)) < F64_ATOL, mode
    # w > 0, γ → 0: the window's terms vanish from both sums, so row t >= w is the linear map over j <= t − w only
    w = build("lolcats", window=3)
    w.load_state_dict(m.state_dict())
    with torch.no_grad():
        w.window_logit.fill_(-60.0)
    with torch.no_grad():
        phi, lin_map = w.phi(x), lin.phi(x)
    t = torch.arange(x.shape[1])
    lag = t.view(-1, 1) - t.view(1, -1)
    assert float(phi[:, :, 3:][..., ((lag >= 0) & (lag < 3))[3:]].abs().max()) < 1e-20  # the band of the rows t >= w
    below = lin_map * (lag >= 3)  # linear attention restricted to j <= t − 3, renormalized
    assert max_abs(phi[:, :, 3:], (below / below.sum(-1, keepdim=True))[:, :, 3:]) < F64_ATOL


def test_lolcats_decays_and_spectrum_are_the_dsf_transitions():
    """Λ_t is block lower triangular (the register's shift, the linear state's identity, the coupling below): its
    eigenvalues are its diagonal, 0 and 1, which decays(x) and spectrum(x) return without building it."""
    m = perturb_(build("lolcats", window=3))
    x = x_of(T=6, B=1)
    system = m.dsf(x)
    assert torch.equal(m.decays(x), system.lam)
    ev = torch.linalg.eigvals(system.transition()).real.sort(-1).values
    assert max_abs(ev, m.spectrum(x).sort(-1).values) < 1e-6  # (a nilpotent block's eigenvalues are found to ~eps^(1/w))
    assert set(m.decays(x).unique().tolist()) == {0.0, 1.0}


def test_lolcats_decoding_step_reads_the_window_and_one_leaving_token_only(monkeypatch):
    """O(w + state) per token: the step's window op sees the window's w keys (the new one last), the key feature map runs on
    the one token leaving the window, and the cache holds the same floats at every position."""
    m = perturb_(build("lolcats", window=4))
    seen = {"keys": [], "step": [], "features": []}
    import seqmix.ops.window_attention as wa

    op, step_op = hybrid.window_softmax, wa._full_window_step
    monkeypatch.setattr(hybrid, "window_softmax", lambda q, k, v, **kw: seen["keys"].append(k.shape[1]) or op(q, k, v, **kw))
    monkeypatch.setattr(wa, "_full_window_step", lambda q, k, v, valid=None: seen["step"].append(k.shape[1]) or step_op(q, k, v, valid))
    qk_features = m._qk_features  # (φ(q_t), ψ(k_{t−w})): the key features of the token leaving the window
    monkeypatch.setattr(m, "_qk_features", lambda q, k: seen["features"].append(k.shape[1]) or qk_features(q, k))
    cache, x = Cache(), x_of(T=40)
    m(x[:, :20], cache=cache)
    floats = cache.floats()
    seen["keys"].clear(), seen["step"].clear(), seen["features"].clear()
    for t in range(20, 40):
        m(x[:, t:t + 1], cache=cache)
        assert cache.floats() == floats == 2 * m.state_size()
    # the window op on the window's 4 keys (the new one included), by its fused step every time
    assert seen["step"] == [4] * 20 and seen["keys"] == [4] * 20 and seen["features"] == [1] * 20


# -- Liger ----------------------------------------------------------------------------------------


def _n_params(m):
    return sum(p.numel() for p in m.parameters())


def test_liger_gate_has_no_parameters_of_its_own_and_is_the_pooled_key():
    """α_t = σ(Pool(x W_K))^{1/16}: the same parameter count as the mixer without a decay, and decays(x) is that
    expression (per key channel; with decay_per_head the mean over the head's channels)."""
    cfg = {**seqmix.mixer_entry("liger_gla").example_config(), "d_model": 16}
    liger = build("liger_gla")
    no_gate = seqmix.build_mixer("general_form", **{**seqmix.mixer_entry("liger_gla").defaults, **cfg, "decay": "none", "tau": 1.0})
    gla = seqmix.build_mixer("gla", **cfg)
    assert _n_params(liger) == _n_params(no_gate) < _n_params(gla)
    assert [n for n, _ in liger.named_parameters()] == ["W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"]
    x = x_of()
    k = (x @ liger.W_k.weight.T).view(2, 19, 2, 8)
    # decays(x): [B, T, (h, value channel, key channel)], every value channel of a head has its key channels' decays
    assert max_abs(liger.decays(x).view(2, 19, 2, 8, 8), (torch.sigmoid(k) ** (1 / 16)).unsqueeze(3).expand(2, 19, 2, 8, 8)) < F64_ATOL
    head = build("liger_gla", decay_per_head=True)
    assert _n_params(head) == _n_params(liger)
    pooled = torch.sigmoid(k.mean(-1)) ** (1 / 16)
    assert max_abs(head.decays(x).view(2, 19, 2, 64), pooled.unsqueeze(-1).expand(2, 19, 2, 64)) < F64_ATOL
    with pytest.raises(ValueError, match="key_pool"):
        seqmix.build_mixer("liger_gla", key="one")


def test_liger_feature_map_is_a_softmax_per_head():
    m = build("liger_gla")
    x = x_of()
    P = m._params(x, None, False)
    assert max_abs(P.q, torch.softmax((x @ m.W_q.weight.T).view(2, 19, 2, 8), -1)) < F64_ATOL
    assert max_abs(P.k.sum(-1), torch.ones(2, 19, 2, dtype=D64)) < F64_ATOL


def test_liger_attention_is_the_weighted_sum_of_its_window_and_its_recurrence():
    """β = 1, α = 0: sliding-window softmax attention with RoPE on the same weights; β = 0, α = 1: liger_gla; the
    default 1/2, 1/2 their mean; and no parameter beyond liger_gla's."""
    m = perturb_(build("liger_attention"))
    x = x_of()
    rec = seqmix.build_mixer("liger_gla", **{k: v for k, v in m.config.model_dump().items()
                                             if k not in ("window", "window_weight", "linear_weight", "rope_theta", "rope_scaling")}).to(D64)
    rec.load_state_dict(m.state_dict())
    assert _n_params(m) == _n_params(rec)
    att = seqmix.build_mixer("softmax_attention", d_model=16, heads=2, scale="sqrt", window=5, rope=True, rope_theta=10000.0).to(D64)
    with torch.no_grad():
        att.W_qk.weight.copy_(torch.cat([m.W_q.weight, m.W_k.weight])), att.W_v.weight.copy_(m.W_v.weight)
        att.W_o.weight.copy_(m.W_o.weight)
    parts = {}
    for (beta, alpha), want in (((1.0, 0.0), att), ((0.0, 1.0), rec)):
        one = build("liger_attention", window_weight=beta, linear_weight=alpha)
        one.load_state_dict(m.state_dict())
        for mode in one.modes:
            one.mode = mode
            assert max_abs(one(x), want(x)) < F64_ATOL, (beta, mode)
        parts[beta] = want(x)
    assert max_abs(m(x), 0.5 * (parts[1.0] + parts[0.0])) < F64_ATOL


@pytest.mark.parametrize("w,C", [(1, 8), (8, 8), (13, 4)])
def test_liger_attention_modes_decoding_and_splits_agree(w, C):
    m = perturb_(build("liger_attention", window=w, chunk_size=C))
    x = x_of()
    assert_modes_agree_f64(m, x, f"liger_attention w={w}")
    assert_decodes_splits_and_maps(m, x, f"liger_attention w={w}", split=7)
