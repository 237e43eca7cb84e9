"""The delta-rule mixers beyond the registry-wide contract: their spectra, the β ∈ [0, 2]
option, and what `seqmix show` draws for a non-diagonal Λ_i."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.analysis import show
from tolerances import F64_ATOL, assert_fused_step_agrees, assert_modes_agree_f64, max_abs


def build(name, **kw):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{"d_model": 16, "heads": 2, "chunk_size": 8, **kw}).double().eval()


def x_(T=13, d=16, seed=1):
    return torch.randn(2, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_gated_deltanet_spectrum_is_alpha_and_alpha_one_minus_beta():
    m = build("gated_deltanet")
    x = x_()
    P = m._params(x, None, False)
    ev = m.spectrum(x).reshape(2, 13, m.H, m.V, m.K)  # [B, T, H, V, K]
    alpha, beta = P.g.exp(), P.beta  # [B, T, H]
    assert float(ev.imag.abs().max()) < 1e-12
    got = ev.real.sort(-1).values
    expected = torch.stack([alpha * (1 - beta)] + [alpha] * (m.K - 1), -1).sort(-1).values  # keys are unit vectors
    assert max_abs(got, expected.unsqueeze(3).expand_as(got)) < 1e-12
    # the diagonal part (decays) is α on every key channel
    assert max_abs(m.decays(x).reshape(2, 13, m.H, m.V, m.K), alpha[..., None, None].expand(2, 13, m.H, m.V, m.K)) == 0


def test_negative_eigenvalues_option():
    m = build("deltanet", negative_eigenvalues=True)
    x = x_(T=19)
    beta = m._params(x, None, False).beta.detach()
    assert float(beta.max()) > 1  # β = 2σ reaches past 1 ...
    assert float(m.spectrum(x).real.min()) < 0  # ... so an eigenvalue 1 − β is negative
    assert_modes_agree_f64(m, x, "deltanet, negative eigenvalues")


def test_kda_gate_is_keywise():
    m = build("kda")
    g = m._params(x_(), None, False).g.detach()
    assert g.shape == (2, 13, m.H, m.K) and float(g.max()) <= 0
    assert float((g - g[..., :1]).abs().max()) > 0  # not one value per head


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="expand_k"):
        seqmix.build_mixer("deltanet", d_model=16, heads=3)
    with pytest.raises(ValueError, match="decay"):
        seqmix.build_mixer("deltanet", decay="rwkv7")


def test_show_draws_the_eigenvalues_of_the_transition():
    inp = show.make_input("mqar", 24, seed=3)
    m = build("gated_deltanet").float()
    views = show.inspect_mixers([m], inp, seed=3)
    v = views[-1] if views[-1].name == "gated_deltanet" else views[0]
    assert not v.diagonal
    fig = show.show_figure(views)
    im = next(a for ax in fig.axes for a in ax.get_images() if a.get_gid() == f"decays:{v.label}")
    with torch.no_grad():
        mag = m.spectrum(show.embed(inp, m.d_model, seed=3))[0].abs().double()  # [T, N]
    arr = torch.from_numpy(im.get_array().data)
    for row in arr:  # every plotted row is a column of |eig Λ_i|
        assert float((mag - row.unsqueeze(1)).abs().amax(0).min()) < 1e-6
    assert any("non-diagonal" in ax.get_title() for ax in fig.axes)


def test_delta_models_are_extras_of_the_mqar_presets():
    from seqmix.experiments import get_preset

    for name in ("dsf-fig2", "metala-table-a7"):
        p = get_preset(name)
        default = [m.label for m in p.select(None, "tiny")]
        assert "DeltaNet" not in default and "Gated DeltaNet" not in default  # the paper's set is unchanged
        runs = p.runs("tiny", ["DeltaNet", "Gated DeltaNet"])
        assert {r.label for r in runs} == {"DeltaNet", "Gated DeltaNet"}
        assert {r.model.mixer for r in runs} == {"deltanet", "gated_deltanet"}
        assert {"deltanet", "gated_deltanet"} <= set(p.mixers())


# -- the options of real models (Qwen3-Next's and Kimi-Linear's layers) ---------------------------------


def test_fused_conv_is_the_three_convs():
    """One conv over [q; k; v] (one state) computes what conv_q, conv_k, conv_v compute."""
    a = build("gated_deltanet")
    b = build("gated_deltanet", fused_conv=True)
    sd = {k: v for k, v in a.state_dict().items() if not k.startswith("conv_")}
    sd["conv.weight"] = torch.cat([a.conv_q.weight, a.conv_k.weight, a.conv_v.weight])
    b.load_state_dict(sd)
    x = x_(T=19)
    assert max_abs(a(x), b(x)) < 1e-12
    cache = seqmix.Cache()
    y = torch.cat([b(x[:, :9], cache=cache)] + [b(x[:, t : t + 1], cache=cache) for t in range(9, 19)], 1)
    assert set(cache.get(b)) == {"S", "conv"} and max_abs(y, b(x)) < 1e-12
    assert b.state_size() == a.state_size()


def test_k_heads_shares_q_and_k_among_value_heads():
    """GVA (k_heads < heads): the same as heads = value heads with each q/k head's projection repeated."""
    g = build("gated_deltanet", heads=4, k_heads=2, expand_k=0.5)
    full = build("gated_deltanet", heads=4, expand_k=1.0)
    sd = dict(g.state_dict())
    for name in ("W_q.weight", "W_k.weight"):  # [k_heads·K, d] -> each head's rows twice (repeat_interleave)
        sd[name] = sd[name].view(2, 4, 16).repeat_interleave(2, 0).reshape(16, 16)
    for name in ("conv_q.weight", "conv_k.weight"):
        sd[name] = sd[name].view(2, 4, -1).repeat_interleave(2, 0).reshape(16, -1)
    full.load_state_dict(sd)
    x = x_(T=19)
    assert (g.K, full.K) == (4, 4) and max_abs(g(x), full(x)) < 1e-12 and max_abs(g.phi(x), full.phi(x)) < 1e-12
    assert g.state_size() < full.state_size()  # the conv of q and k is half as wide
    with pytest.raises(ValueError, match="k_heads"):
        seqmix.build_mixer("gated_deltanet", d_model=16, heads=4, k_heads=3)
    with pytest.raises(ValueError, match="k_heads"):
        seqmix.build_mixer("kda", d_model=16, heads=4, k_heads=2)


def test_norm_shared_sigmoid_gate_rank_and_l2_eps():
    """norm_shared: one [V] weight is the per-channel weight repeated; gate_act / gate_rank: σ(x W¹ W²);
    qk_l2_eps: x / sqrt(Σx² + ε) (close to F.normalize for unit-scale keys)."""
    a = build("kda")
    b = build("kda", norm_shared=True)
    sd = dict(a.state_dict())
    sd["norm.weight"] = sd["norm.weight"][: a.V]
    b.load_state_dict(sd)
    with torch.no_grad():
        a.norm.weight.copy_(b.norm.weight.repeat(a.H))
    x = x_()
    assert max_abs(a(x), b(x)) < 1e-12
    s = build("kda", gate_act="sigmoid", gate_rank=3)
    assert isinstance(s.W_g, torch.nn.Sequential) and s.W_g[0].out_features == 3
    o = torch.randn(2, 13, s.H, s.V, dtype=torch.float64)
    want = s.W_o(s.norm(o.flatten(2)) * torch.sigmoid(s.W_g[1](s.W_g[0](x))))
    assert max_abs(s._readout(o, x), want) < 1e-12
    e = build("kda", qk_l2_eps=1e-6)
    e.load_state_dict(a.state_dict())
    assert 0 < max_abs(e(x), a(x)) < 1e-4
    with pytest.raises(ValueError, match="gate_rank"):
        seqmix.build_mixer("kda", d_model=16, heads=2, gate=False, gate_rank=2)


def test_rwkv7_without_token_shift_and_bonus_is_rwkv7_with_them_zeroed():
    """token_shift=False is μ = 0 (every stream reads x), bonus=False is ρ = 0: the same outputs on the same weights, without
    those parameters and without the shift state; RoPE (rope_theta) on r and k is a different map."""
    kw = dict(decay_rank=4, a_rank=4, gate_rank=4, v_rank=4)
    full = build("rwkv7", **kw)
    bare = build("rad_rwkv7", **kw)
    assert {n for n, _ in full.named_parameters()} - {n for n, _ in bare.named_parameters()} == {"mu", "r_k"}
    bare.load_state_dict({k: v for k, v in full.state_dict().items() if k not in ("mu", "r_k")})
    with torch.no_grad():
        full.mu.zero_(), full.r_k.zero_()
    x = x_()
    assert max_abs(full(x), bare(x)) < 1e-12
    assert bare.state_size() == full.state_size() - 16
    roped = build("rad_rwkv7", rope_theta=10000.0, **kw)
    roped.load_state_dict(bare.state_dict())
    assert max_abs(roped(x), bare(x)) > 1e-3
    assert_modes_agree_f64(roped, x, "rad_rwkv7 rope")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_l2_normalize_gives_f_normalize_numbers(dtype):
    """The delta-rule mixers' L2 norm of q and k (seqmix.mixers.layers.l2_normalize, without F.normalize's Python
    wrappers): the same numbers as F.normalize(t, dim=-1, eps), bit for bit, a zero row included."""
    import torch.nn.functional as F

    from seqmix.mixers.layers import l2_normalize

    t = torch.randn(2, 3, 4, 16, dtype=dtype, generator=torch.Generator().manual_seed(0))
    t[0, 0, 0] = 0
    assert torch.equal(l2_normalize(t), F.normalize(t, dim=-1))
    assert torch.equal(l2_normalize(t, 1e-3), F.normalize(t, dim=-1, eps=1e-3))


#: the delta-rule configs whose decoding step takes DeltaNet._fused_step: each preset, with the options it touches
FUSED_CASES = {
    "deltanet": ("deltanet", {}), "gated_deltanet": ("gated_deltanet", {}), "kda": ("kda", {}),
    "qwen3_next_gdn": ("qwen3_next_gdn", {"heads": 4, "k_heads": 2}), "kimi_kda": ("kimi_kda", {"gate_rank": 8}),
    "negative-no_conv-no_gate": ("gated_deltanet", {"negative_eigenvalues": True, "conv_size": None, "gate": False}),
    "sigmoid-scale_none-bias": ("gated_deltanet", {"gate_act": "sigmoid", "scale": "none", "qkv_bias": True}),
    "gva-separate_convs": ("gated_deltanet", {"heads": 4, "k_heads": 2}),
}


def test_the_fused_step_takes_the_configs_it_covers_and_leaves_the_rest():
    for name, kw in FUSED_CASES.values():
        assert build(name, **kw).__dict__["_step_fusable"], (name, kw)
    for name, kw in (("gated_deltaproduct", {}), ("gated_deltanet2", {}), ("precond_gated_deltanet", {}), ("comba", {})):
        assert not build(name, **kw).__dict__["_step_fusable"], name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["f64", "f32", "bf16"])
@pytest.mark.parametrize("in_place", [False, True], ids=["new-state", "in-place"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_step_equals_the_general_step(case, in_place, dtype):
    """DeltaNet._fused_step (a decoding step after a prefill, in one pass) against the general path (_params, _core_op,
    _readout in mode "step"): four steps after a prefill of 4 tokens, outputs and every state entry; float64 within
    F64_ATOL, float32 within F32_RTOL, bfloat16 within BF16_MODE_RTOL; the states written in place or not."""
    import copy

    name, kw = FUSED_CASES[case]
    fused = build(name, **kw)
    with torch.no_grad():  # biases and the short convs away from their init, so that every term counts
        for p in fused.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    fused = fused.to(torch.float32 if dtype == torch.bfloat16 else dtype).to(dtype)
    general = copy.deepcopy(fused)
    general.__dict__["_step_fusable"] = False
    assert_fused_step_agrees(fused, general, x_(T=8).to(dtype), 4, 4, in_place, dtype)


def test_the_fused_step_runs_and_hands_the_general_paths_values():
    """The fused path is the one a decoding step after a prefill takes (a spy on it), and its MixOut's values and mixed
    outputs are the general path's (the per-map values the analysis reads)."""
    import copy

    m = build("gated_deltanet")
    general = copy.deepcopy(m)
    general.__dict__["_step_fusable"] = False
    x = x_(T=6)
    calls = []
    orig = type(m)._fused_step
    m._fused_step = lambda *a: calls.append(1) or orig(m, *a)
    with torch.no_grad():
        outs = []
        for mm in (m, general):
            c = seqmix.Cache()
            mm(x[:, :5], cache=c)
            outs.append(mm._forward(x[:, 5:], state=c.get(mm), mode="step", need_state=True))
    assert calls == [1]
    f, g = outs
    got = lambda v: v() if callable(v) else v  # noqa: E731  (the fused step hands its values and mixed lazily)
    for a, b in ((f.y, g.y), (got(f.values), got(g.values)), (got(f.mixed), got(g.mixed))):
        assert a.shape == b.shape and max_abs(a, b) < F64_ATOL


#: RWKV-7's configs (RWKV7._fused_step): the preset, RAD-RWKV7 with RoPE and biases, and the options the step touches
RWKV7_FUSED_CASES = {
    "rwkv7": ("rwkv7", {}),
    "rwkv7-value_residual-no_bonus": ("rwkv7", {"value_residual": True, "bonus": False}),
    "rad_rwkv7-rope-bias": ("rad_rwkv7", {"rope_theta": 10000.0, "qkv_bias": True}),
    "rad_rwkv7-rope-token_shift-bonus": ("rad_rwkv7", {"rope_theta": 500.0, "token_shift": True, "bonus": True}),
}


def _perturbed(name, kw, dtype):
    m = build(name, **kw)
    with torch.no_grad():  # every parameter away from its init (zero LoRA factors, ones), so that every term counts
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    return m.to(torch.float32 if dtype == torch.bfloat16 else dtype).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=["f64", "f32", "bf16"])
@pytest.mark.parametrize("in_place", [False, True], ids=["new-state", "in-place"])
@pytest.mark.parametrize("case", list(RWKV7_FUSED_CASES))
def test_rwkv7_fused_step_equals_the_general_step(case, in_place, dtype):
    """RWKV7._fused_step (a decoding step after a prefill, in one pass) against the general path (_params, the op's
    step, the readout): four steps after a prefill of 4 tokens, outputs and every state entry (S, the token shift, the
    RoPE position); float64 within F64_ATOL, float32 within F32_RTOL, bfloat16 within BF16_MODE_RTOL."""
    import copy

    name, kw = RWKV7_FUSED_CASES[case]
    fused = _perturbed(name, kw, dtype)
    assert fused.__dict__["_step_fusable"]
    general = copy.deepcopy(fused)
    general.__dict__["_step_fusable"] = False
    assert_fused_step_agrees(fused, general, x_(T=8).to(dtype), 4, 4, in_place, dtype)


def test_rwkv7_fused_step_reads_and_writes_the_value_residual_context():
    """In a backbone's pass (a context dict): the first RWKV-7 layer's fused step writes its v under V_FIRST and a later
    layer's mixes it in, as the general path does; a subclass with its own parameter functions keeps the general path."""
    import copy

    from seqmix.mixers.delta import RWKV7, V_FIRST

    fused = _perturbed("rwkv7", {"value_residual": True}, torch.float64)
    general = copy.deepcopy(fused)
    general.__dict__["_step_fusable"] = False
    x = x_(T=6).double()
    v_first = torch.randn(2, 1, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    outs = []
    with torch.no_grad():
        for m in (fused, general):
            c = seqmix.Cache()
            m(x[:, :5], cache=c)
            first, later = {}, {V_FIRST: v_first}
            a = m._forward(x[:, 5:], state=dict(c.get(m)), mode="step", need_state=True, context=first)
            b = m._forward(x[:, 5:], state=dict(c.get(m)), mode="step", need_state=True, context=later)
            outs.append((a.y, b.y, first[V_FIRST]))
    for f, g in zip(*outs):
        assert max_abs(f, g) < F64_ATOL
    assert max_abs(outs[0][0], outs[0][1]) > 1e-3  # (the residual changes the output: the test sees it)

    class Own(RWKV7):
        def _params(self, *a, **kw):
            return super()._params(*a, **kw)

    assert not Own(d_model=16, heads=2, decay_rank=4, a_rank=4, gate_rank=4, v_rank=4).__dict__["_step_fusable"]


def test_fused_step_with_a_bias_on_some_short_convs():
    """The three convs stepped as one take each conv's bias, zeros for a conv without one (DeltaNet builds them without;
    a model may give one a bias)."""
    import copy

    from torch import nn

    fused = build("gated_deltanet")
    fused.conv_k.bias = nn.Parameter(torch.randn(fused.conv_k.weight.shape[0], dtype=torch.float64))
    general = copy.deepcopy(fused)
    general.__dict__["_step_fusable"] = False
    assert_fused_step_agrees(fused, general, x_(T=8), 4, 4, True, torch.float64)


def test_rwkv7_fused_step_in_a_language_model_with_the_value_residual():
    """Three RWKV-7 layers with the value residual in seqmix's LanguageModel: token-by-token decoding after a prefill (the
    fused steps, the first layer's values handed through the pass's context) gives the logits of one pass."""
    from seqmix.models import LanguageModel, ModelConfig

    torch.manual_seed(0)
    lm = LanguageModel(ModelConfig(mixer="rwkv7", mixer_kwargs=dict(heads=2, value_residual=True, decay_rank=4, a_rank=4,
                                                                    gate_rank=4, v_rank=4, chunk_size=4),
                                   d_model=16, n_layers=3, vocab_size=40, max_seq_len=64)).double().eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    calls = []
    from seqmix.mixers.delta import RWKV7

    orig = RWKV7._fused_step
    RWKV7._fused_step = lambda self, *a: calls.append(1) or orig(self, *a)
    try:
        with torch.no_grad():
            whole = lm.hidden(ids)
            cache = seqmix.Cache()
            steps = [lm.hidden(ids[:, :8], cache)] + [lm.hidden(ids[:, t:t + 1], cache, start=t) for t in range(8, 12)]
    finally:
        RWKV7._fused_step = orig
    assert len(calls) == 12  # four steps of three layers
    assert max_abs(torch.cat(steps, 1), whole) < F64_ATOL * max(1.0, float(whole.abs().max()))
