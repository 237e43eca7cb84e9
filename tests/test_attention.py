"""The attention family beyond the contract suite: the sliding window and its bounded KV
cache, the Taylor DSF of softmax attention (Lemma 1), every feature map x normalizer of
separable attention, the presets, multi-head structure (Appendix G), the options and their
bad input."""

from __future__ import annotations

import math

import pytest
import torch

import seqmix
from seqmix import Cache, DSF
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

D, N, H = 16, 8, 2


def build(name, dtype=torch.float64, seed=0, **cfg):
    torch.manual_seed(seed)
    base = {"d_model": D, "n": N, "heads": H}
    if name not in ("softmax_attention", "sliding_window_attention"):
        base["chunk_size"] = 8
    return seqmix.build_mixer(name, **{**base, **cfg}).to(dtype).eval()


def x_of(T, dtype=torch.float64, seed=1, scale=1.0, batch=2):
    return scale * torch.randn(batch, T, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def grads(m, x, mode):
    m.mode = mode
    x = x.clone().requires_grad_(True)
    y = m(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)
    return y.detach(), torch.autograd.grad((y * w).sum(), [x, *m.parameters()])


# -- softmax attention with a sliding window -----------------------------------------------


@pytest.mark.parametrize("window", [1, 4, 7])
def test_window_modes_agree_float64(window):
    m = build("softmax_attention", window=window)
    x = x_of(19)
    y_ref, g_ref = grads(m, x, "parallel")
    y, g = grads(m, x, "sdpa")
    assert max_abs(y, y_ref) < F64_ATOL
    assert all(max_abs(a, b) < F64_ATOL for a, b in zip(g, g_ref))


@pytest.mark.parametrize("window", [1, 4, 7])
def test_window_decoding_split_and_bounded_cache(window):
    m = build("softmax_attention", window=window)
    T = 19
    x = x_of(T)
    m.mode = "parallel"
    y_full = m(x)
    cache = Cache()
    steps = []
    for t in range(T):
        steps.append(m(x[:, t : t + 1], cache=cache))
        kv = cache.get(m)["kv"]
        assert kv.keys.shape[1] == min(t + 1, window - 1)  # the KV cache never exceeds w - 1 tokens ...
        assert kv.capacity <= max(2 * (window - 1), window - 1 + kv.BLOCK)  # ... nor its buffer a bound
        assert cache.floats() == 2 * m.state_size(t + 1)
    assert max_abs(torch.cat(steps, 1), y_full) < F64_ATOL
    for mode in m.modes:
        m.mode = mode
        for cut in (1, 5, T - 2):
            c = Cache()
            y = torch.cat([m(x[:, :cut], cache=c), m(x[:, cut:], cache=c)], 1)
            assert max_abs(y, y_full) < F64_ATOL, (mode, cut)
    assert m.state_size() == (N + D) * (window - 1)


def test_sliding_window_attention_preset_is_windowed_softmax_with_a_bounded_cache():
    """The preset: softmax attention's class at window 64 under its own name (seqmix.linearize's windowed student); its
    state, the window's keys and values, is constant in the context: 150 decoded tokens keep 63 in a bounded buffer."""
    m = build("sliding_window_attention")
    assert type(m) is type(build("softmax_attention")) and m.config.window == 64
    assert m.registry_name == "sliding_window_attention"
    x = x_of(150)
    y_full = m(x)
    cache = Cache()
    with torch.no_grad():  # the buffers written in place (no autograd record)
        steps = []
        for t in range(x.shape[1]):
            steps.append(m(x[:, t : t + 1], cache=cache))
            kv = cache.get(m)["kv"]
            assert len(kv) == min(t + 1, 63) and kv.capacity <= max(2 * 63, 63 + kv.BLOCK)
    assert max_abs(torch.cat(steps, 1), y_full) < F64_ATOL
    assert cache.floats() == 2 * m.state_size() == 2 * (N + D) * 63  # state_size() needs no seq_len: it is bounded


def test_window_phi_is_banded_and_matches_forward():
    m = build("softmax_attention", window=3)
    x = x_of(10)
    P = m.phi(x)
    assert torch.tril(P, -3).abs().max() == 0 and torch.triu(P, 1).abs().max() == 0
    assert max_abs(P.sum(-1), torch.ones_like(P[..., 0])) < F64_ATOL
    values, mixed = m.core(x, mode="sdpa")
    assert max_abs(torch.einsum("bmts,bsmp->btmp", P, values), mixed) < F64_ATOL
    # a window at least as long as the sequence is full causal attention
    full, wide = build("softmax_attention"), build("softmax_attention", window=10)
    assert max_abs(full(x), wide(x)) == 0 and max_abs(full(x), m(x)) > 1e-3


def test_softmax_cache_without_window_grows_and_state_size_needs_seq_len():
    m = build("softmax_attention")
    cache = Cache()
    m(x_of(5), cache=cache)
    kv = cache.get(m)["kv"]
    assert kv.keys.shape == (2, 5, H, N // H) and kv.values.shape == (2, 5, H, D // H)
    assert m.state_size(5) == 5 * (N + D)
    with pytest.raises(ValueError, match="seq_len"):
        m.state_size()


def test_softmax_matches_the_formula_and_scale_option():
    for scale, s in (("sqrt", 1 / math.sqrt(N // H)), ("none", 1.0), (0.3, 0.3)):
        m = build("softmax_attention", scale=scale)
        x = x_of(6)
        q, k = m.W_qk(x).chunk(2, -1)
        q, k = q.view(2, 6, H, -1), k.view(2, 6, H, -1)
        scores = torch.einsum("bthk,bshk->bhts", q, k) * s
        expected = torch.softmax(scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf")), -1)
        assert max_abs(m.phi(x), expected) < F64_ATOL, scale


# -- the Taylor DSF of softmax attention (Lemma 1) -----------------------------------------


@pytest.mark.parametrize("P", [0, 1, 2, 3])
def test_taylor_dsf_is_the_taylor_separable_attention(P):
    """dsf(x, taylor_order=P) reproduces separable attention with φ = ψ = Taylor features of
    degree P and the row-sum η, built as a separate mixer with the same weights."""
    m = build("softmax_attention", scale="sqrt")
    taylor = build("separable_attention", feature_map="taylor", taylor_order=P, normalizer="row_sum" if P % 2 == 0 else "abs_row_sum", scale="sqrt")
    taylor.load_state_dict(m.state_dict())
    x = x_of(16, scale=0.5)
    values, _ = m.core(x)
    system = m.dsf(x, taylor_order=P)
    assert system.N == D * sum((N // H) ** p for p in range(P + 1))
    B, T, M, V = values.shape
    y = system.evaluate(values.reshape(B, T, M * V))
    if P % 2 == 0:  # the same normalizer: the same system
        assert max_abs(y, taylor.core(x)[1].reshape(B, T, M * V)) < F64_ATOL
    # independently: the truncated exponential kernel, normalized by its row sums
    q, k, _ = m._qkv(x)
    s = torch.einsum("bthk,bshk->bhts", q, k)
    kern = sum(s**p / math.factorial(p) for p in range(P + 1)) * torch.ones(T, T, dtype=s.dtype).tril()
    A = kern / kern.sum(-1, keepdim=True)
    assert max_abs(y, torch.einsum("bhts,bshv->bthv", A, values).reshape(B, T, M * V)) < F64_ATOL


def test_taylor_dsf_converges_to_softmax():
    m = build("softmax_attention")
    x = x_of(12, scale=0.5)
    values, mixed = m.core(x)
    B, T, M, V = values.shape
    errs = [max_abs(m.dsf(x, taylor_order=P).evaluate(values.reshape(B, T, M * V)), mixed.reshape(B, T, M * V)) for P in range(5)]
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-3 * errs[0]


def test_taylor_dsf_with_projections():
    m = build("softmax_attention")
    x = x_of(8, scale=0.5)
    P = 4
    system = m.dsf(x, taylor_order=P, projections=True)
    y = system.evaluate(x)
    assert max_abs(y, m(x)) < 1e-3  # the Taylor model approximates the mixer itself
    fq, fk, eta = m.separable_parts(x, taylor_order=P)
    o = torch.einsum("bhts,bshv->bthv", seqmix.recurrence_map(fq, fk) / eta.transpose(1, 2).unsqueeze(-1), m._qkv(x)[2])
    assert max_abs(y, m.W_o(o.flatten(2))) < F64_ATOL


def test_taylor_dsf_bad_input():
    m = build("softmax_attention")
    x = x_of(8)
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="'taylor_order'"):
            m.dsf(x, taylor_order=bad)
    with pytest.raises(ValueError, match=r"taylor_order = 9 is too large for memory.*GiB"):
        m.dsf(x, taylor_order=9)
    with pytest.raises(ValueError, match="window"):
        build("softmax_attention", window=3).dsf(x)


# -- separable attention: every feature map x normalizer -----------------------------------

COMBOS = [
    dict(feature_map="elu1", normalizer="row_sum"),
    dict(feature_map="elu1", key_feature_map="exp", normalizer="row_sum"),
    dict(feature_map="identity", normalizer="none"),
    dict(feature_map="relu", normalizer="abs_row_sum"),
    dict(feature_map="identity", key_feature_map="elu1", normalizer="abs_row_sum"),
    dict(feature_map="taylor", taylor_order=1, normalizer="abs_row_sum"),
    dict(feature_map="taylor", taylor_order=2, normalizer="row_sum", scale="sqrt"),
    dict(feature_map="identity", normalizer="exp"),
    dict(feature_map="identity", normalizer="softplus", eta_bias=False),
    dict(feature_map="elu1", normalizer="sigmoid", heads=4, n=16),
    dict(feature_map="exp", normalizer="row_sum", output_projection=False),
]


@pytest.mark.parametrize("cfg", COMBOS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_separable_modes_dsf_phi_and_decoding(cfg):
    m = build("separable_attention", **cfg)
    x = x_of(19)
    y_ref, g_ref = grads(m, x, "recurrent")
    for mode in ("chunk", "parallel"):
        y, g = grads(m, x, mode)
        assert max_abs(y, y_ref) < F64_ATOL and all(max_abs(a, b) < F64_ATOL for a, b in zip(g, g_ref)), mode
    values, mixed = m.core(x)
    Bt, T, M, V = values.shape
    assert max_abs(torch.einsum("bmts,bsmp->btmp", m.phi(x), values), mixed) < F64_ATOL
    assert max_abs(m.dsf(x).evaluate(values.reshape(Bt, T, M * V)), mixed.reshape(Bt, T, M * V)) < F64_ATOL
    cache = Cache()
    m.mode = "recurrent"
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    assert max_abs(steps, y_ref) < F64_ATOL
    assert cache.floats() == 2 * m.state_size(T)
    mf = build("separable_attention", dtype=torch.float32, **cfg)
    xf = x.float()
    mf.mode = "chunk"
    a = mf(xf)
    mf.mode = "recurrent"
    assert rel_err(a, mf(xf)) < F32_RTOL


def test_presets_are_the_paper_models():
    x = x_of(10)
    lin = build("linear_attention")
    assert (lin.config.feature_map, lin.config.normalizer, lin.config.scale) == ("elu1", "row_sum", "none")
    P = lin.phi(x)
    assert max_abs(P.sum(-1), torch.ones_like(P[..., 0])) < F64_ATOL  # eq. (16): rows sum to 1
    gla = build("generalized_linear_attention")
    q, k, _ = gla._qkv(x)
    s = torch.einsum("bthk,bshk->bhts", q, k) * torch.ones(10, 10, dtype=x.dtype).tril()
    assert max_abs(gla.phi(x), s / (1 + s.sum(-1, keepdim=True).abs())) < F64_ATOL  # φ = ψ = id, η = 1 + |row sum|
    norm = build("normalized_attention")
    assert norm.W_eta.out_features == H and norm.W_eta.bias is not None  # one η per head, with a bias
    q, k, _ = norm._qkv(x)
    s = torch.einsum("bthk,bshk->bhts", q, k) * torch.ones(10, 10, dtype=x.dtype).tril()
    z = norm.W_eta(x).transpose(1, 2).unsqueeze(-1)  # [B, H, T, 1]
    assert max_abs(norm.phi(x), s * torch.exp(-z)) < F64_ATOL  # eq. (22): (q_iᵀk_j) exp(-w_η·u_i - b)


def test_normalizers_by_name_change_only_eta():
    x = x_of(7)
    ms = {nm: build("normalized_attention", normalizer=nm) for nm in ("exp", "softplus", "sigmoid")}
    z = ms["exp"].W_eta(x).transpose(1, 2).unsqueeze(-1)
    raw = ms["exp"].phi(x) * z.exp()
    expected = {"exp": z.exp(), "softplus": torch.nn.functional.softplus(z), "sigmoid": torch.sigmoid(z)}
    for nm, m in ms.items():
        assert max_abs(m.phi(x), raw / expected[nm]) < F64_ATOL, nm


def test_multi_head_dsf_is_block_diagonal_with_one_scalar_per_head():
    """Appendix G: Λ_i holds `heads` distinct scalars; B and C do not mix heads."""
    heads = 4
    m = build("linear_attention", heads=heads, n=16)
    x = x_of(6)
    system = m.dsf(x)
    per_head = system.N // heads
    lam = system.lam.reshape(2, 6, heads, per_head)
    assert max_abs(lam, lam[..., :1].expand_as(lam)) < 1e-14  # one value per head
    assert float((lam[..., 1:, 0] - lam[..., :1, 0]).abs().max()) > 1e-6  # ... different across heads
    V = D // heads
    B = system.B.reshape(2, 6, heads, per_head, heads, V)
    C = system.C.reshape(2, 6, heads, V, heads, per_head)
    off = ~torch.eye(heads, dtype=torch.bool)
    assert B.permute(2, 4, 0, 1, 3, 5)[off].abs().max() == 0
    assert C.permute(2, 4, 0, 1, 3, 5)[off].abs().max() == 0
    single = build("linear_attention", heads=1, n=16).dsf(x)
    assert max_abs(single.lam, single.lam[..., :1].expand_as(single.lam)) < 1e-14


def test_output_projection_option_and_projections_dsf():
    x = x_of(9)
    for out in (True, False):
        m = build("normalized_attention", output_projection=out, eta_bias=False)
        assert isinstance(m.W_o, torch.nn.Identity) != out
        assert max_abs(m.dsf(x, projections=True).evaluate(x), m(x)) < F64_ATOL
    with pytest.raises(ValueError, match="bias"):
        build("linear_attention", bias=True).dsf(x, projections=True)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,cfg,field",
    [
        ("softmax_attention", {"window": 0}, "window"),
        ("softmax_attention", {"window": -3}, "window"),
        ("softmax_attention", {"scale": -1.0}, "scale"),
        ("softmax_attention", {"scale": "cube"}, "scale"),
        ("normalized_attention", {"normalizer": "tanh"}, "normalizer"),
        ("separable_attention", {"feature_map": "cosine"}, "feature_map"),
        ("separable_attention", {"key_feature_map": "cosine"}, "key_feature_map"),
        ("separable_attention", {"feature_map": "taylor", "taylor_order": -1}, "taylor_order"),
        ("separable_attention", {"feature_map": "taylor", "taylor_order": 9}, "taylor_order"),
        ("separable_attention", {"feature_map": "identity", "normalizer": "row_sum"}, "row_sum"),
        ("separable_attention", {"feature_map": "taylor", "taylor_order": 3, "normalizer": "row_sum"}, "taylor_order"),
        ("separable_attention", {"feature_map": "taylor", "key_feature_map": "elu1"}, "key_feature_map"),
        ("linear_attention", {"n": 9}, "heads"),
    ],
)
def test_bad_config_names_the_field(name, cfg, field):
    with pytest.raises(ValueError, match=field):
        build(name, **cfg)


def test_too_large_taylor_order_says_how_much_memory():
    with pytest.raises(ValueError, match=r"too large for memory.*GiB"):
        build("separable_attention", feature_map="taylor", taylor_order=12)
