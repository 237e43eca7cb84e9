"""The generalized (diagonal-plus-rank-one) delta op and its mixers RWKV-7, Gated DeltaProduct
and Comba, against their own loops and flash-linear-attention's naive references (optional: skipped without fla)."""

from __future__ import annotations

import math

import pytest
from fla_ref import fla_naive
import torch
import torch.nn.functional as F

import seqmix
from seqmix.ops.delta_rule import delta_product, delta_rule, delta_rule_map
from tolerances import F64_ATOL, max_abs


def build(name, **kw):
    torch.manual_seed(0)
    cfg = {**seqmix.mixer_entry(name).example_config(), **kw}
    return seqmix.build_mixer(name, **cfg).double().eval()


def x_(T=19, d=16, seed=1, dtype=torch.float64):
    return torch.randn(2, T, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def rand_dplr(T=21, H=2, K=4, V=3, keywise=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = r(2, T, H, K), F.normalize(r(2, T, H, K), dim=-1), r(2, T, H, V)
    kappa = F.normalize(r(2, T, H, K), dim=-1)
    lr = torch.rand(2, T, H, K, generator=g, dtype=torch.float64)
    logw = -0.6 * torch.rand(2, T, H, K if keywise else 1, generator=g, dtype=torch.float64)
    logw = logw if keywise else logw[..., 0]
    wk = logw if keywise else logw.unsqueeze(-1)
    return q, k, v, kappa, lr, logw, -(lr * kappa), kappa * (-wk).exp()


@pytest.mark.parametrize("keywise", [True, False])
def test_general_op_modes_agree_forward_and_backward(keywise):
    q, k, v, _, _, logw, a, b = rand_dplr(keywise=keywise)
    beta = torch.rand(q.shape[:3], dtype=torch.float64)
    S0 = torch.randn(2, 2, 4, 3, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, beta, logw, a, b, S0)]

    def run(mode, C=8):
        o, S = delta_rule(*leaves[:5], a=leaves[5], b=leaves[6], initial_state=leaves[7], output_final_state=True, mode=mode, chunk_size=C)
        grads = torch.autograd.grad((o * o).sum() + (S * S).sum(), leaves)
        return o, S, grads

    o_r, S_r, g_r = run("recurrent")
    for mode, C in (("chunk", 8), ("chunk", 5), ("parallel", 8)):
        o, S, gr = run(mode, C)
        assert max_abs(o, o_r) < 1e-11 and max_abs(S, S_r) < 1e-11, mode
        assert all(max_abs(x, y) < 1e-10 for x, y in zip(gr, g_r)), f"gradients of {mode}"
    o0, _ = delta_rule(q, k, v, beta, logw, a=a, b=b, mode="recurrent")
    assert max_abs(torch.einsum("bhts,bshv->bthv", delta_rule_map(q, k, beta, logw, a=a, b=b), v), o0) < 1e-12


def test_general_op_defaults_are_the_delta_rule():
    q, k, v, *_ = rand_dplr()
    beta, g = torch.rand(q.shape[:3], dtype=torch.float64), -torch.rand(q.shape[:3], dtype=torch.float64)
    o_tied, _ = delta_rule(q, k, v, beta, g, mode="chunk", chunk_size=8)
    for kw in ({"a": -beta.unsqueeze(-1) * k}, {"b": k}, {"a": -beta.unsqueeze(-1) * k, "b": k}):
        for mode in ("recurrent", "chunk", "parallel"):
            assert max_abs(delta_rule(q, k, v, beta, g, mode=mode, chunk_size=8, **kw)[0], o_tied) < 1e-12


def test_general_op_matches_fla_dplr_naive():
    """RWKV-7's transition through fla's dplr_recurrence (S ← S·exp(gk) + kᵀv + βᵀ(αS): α = −κ̂, β = κ̂ ⊙ a)."""
    naive = fla_naive("ops/generalized_delta_rule/dplr/naive.py", "dplr_recurrence")
    q, k, v, kappa, lr, logw, a, b = rand_dplr(T=37)
    S0 = torch.randn(2, 2, 4, 3, dtype=torch.float64)
    tr = lambda t: t.transpose(1, 2).float()  # noqa: E731
    o_f, S_f = naive(tr(q), tr(k), tr(v), tr(-kappa), tr(kappa * lr), tr(logw), initial_state=S0.float(), output_final_state=True)
    one = torch.ones(q.shape[:3], dtype=torch.float64)
    for mode in ("recurrent", "chunk", "parallel"):
        o, S = delta_rule(q, k, v, one, logw, a=a, b=b, scale=4**-0.5, initial_state=S0, output_final_state=True, mode=mode, chunk_size=8)
        assert max_abs(o, o_f.transpose(1, 2).double()) < 1e-5 and max_abs(S, S_f.double()) < 1e-5, mode


def test_gated_deltaproduct_matches_fla_naive():
    naive = fla_naive("ops/gated_delta_product/naive.py", "naive_recurrent_gated_delta_product")
    m = build("gated_deltaproduct")
    P = m._params(x_(), None, False)
    S0 = torch.randn(2, m.H, m.K, m.V, dtype=torch.float64)
    o_f, S_f = naive(*(t.float() for t in (P.q, P.k, P.v, P.g, P.beta)), scale=m._scale, initial_state=S0.float(),
                     output_final_state=True, num_householder=2)
    for mode in ("recurrent", "chunk", "parallel"):
        o, S = delta_product(P.q, P.k, P.v, P.beta, P.g, num_householder=2, scale=m._scale, initial_state=S0,
                             output_final_state=True, mode=mode, chunk_size=4)
        assert max_abs(o, o_f.double()) < 1e-5 and max_abs(S, S_f.double()) < 1e-5, mode


def test_gated_deltaproduct_core_sums_to_the_output_and_n1_is_gated_deltanet():
    m = build("gated_deltaproduct", num_householder=3)
    x = x_()
    values, mixed = m.core(x)
    P = m._params(x, None, False)
    o, _ = delta_product(P.q, P.k, P.v, P.beta, P.g, num_householder=3, scale=m._scale, mode="chunk", chunk_size=8)
    assert values.shape == (2, 19, m.H * 3, m.V)
    assert max_abs(mixed.view(2, 19, m.H, 3, m.V).sum(3), o) < 1e-12
    ev = m.spectrum(x[:, :6])  # Λ_t = α Π_j (I − β_j k_jᵀk_j): |eigenvalues| <= 1 for β ∈ [0, 2]
    assert float(ev.abs().max()) <= 1 + 1e-9 and float(ev.real.min()) < 0  # negative eigenvalues reachable
    a, b = build("gated_deltaproduct", num_householder=1), build("gated_deltanet", negative_eigenvalues=True)
    b.load_state_dict(a.state_dict())
    assert max_abs(a(x), b(x)) < 1e-12


def test_comba_matches_fla_naive_and_is_splr():
    naive = fla_naive("ops/comba/naive.py", "naive_recurrent_comba")
    m = build("comba")
    x = x_()
    P = m._params(x, None, False)
    o_f, S_f = naive(*(t.float() for t in (P.q, P.k, P.v, P.p, P.beta, P.g)), scale=m._scale, output_final_state=True)
    for mode in ("recurrent", "chunk", "parallel"):
        o, S = delta_rule(P.q, P.k, P.v, P.beta, P.g, b=P.p, scale=m._scale, output_final_state=True, mode=mode, chunk_size=8)
        assert max_abs(o, o_f.double()) < 1e-5 and max_abs(S, S_f.double()) < 1e-5, mode
    # Λ = α(I − β kᵀp) with p = σ(d) k: eigenvalues α (K − 1 times) and α(1 − βσ(d)) along k
    ev = m.spectrum(x).reshape(2, 19, m.H, m.V, m.K)
    alpha, beta, s = P.g.exp(), P.beta, torch.sigmoid(m.p_decay)
    want = torch.stack([alpha * (1 - beta * s)] + [alpha] * (m.K - 1), -1).sort(-1).values
    assert max_abs(ev.real.sort(-1).values, want.unsqueeze(3).expand_as(ev.real)) < 1e-10
    # the output correction: with D = 0 the readout is q S
    assert max_abs(P.q + m.D.view(m.H, 1) * P.p, build("comba", output_correction=False)._params(x, None, False).q) < 1e-12


def test_rwkv7_transition_and_core():
    m = build("rwkv7")
    x = x_()
    P = m._params(x, None, False)
    w = P["logw"].exp()
    assert float(w.detach().min()) >= math.exp(-math.exp(-0.5)) - 1e-12  # w ∈ [e^{−e^{−1/2}}, 1]
    # Λ_t per head: Diag(w) − (a ⊙ κ̂)ᵀ κ̂, the paper's form, from the op's (I + a'ᵀb') Diag(w)
    M = torch.diag_embed(w) - (P["a"] * P["kappa"]).unsqueeze(-1) * P["kappa"].unsqueeze(-2)
    M_op = (torch.eye(m.K, dtype=torch.float64) + P["ra"].unsqueeze(-1) * P["rb"].unsqueeze(-2)) @ torch.diag_embed(w)
    assert max_abs(M, M_op) < 1e-12
    ev = torch.linalg.eigvals(M).reshape(2, 19, m.H, 1, m.K).expand(2, 19, m.H, m.V, m.K).reshape(2, 19, -1)
    got = m.spectrum(x)
    assert max_abs(got.abs().sort(-1).values, ev.abs().sort(-1).values) < 1e-10
    # the core against fla's dplr naive (α = −κ̂, β = κ̂ ⊙ a, gk = log w; naive scales q by K^{-1/2})
    naive = fla_naive("ops/generalized_delta_rule/dplr/naive.py", "dplr_recurrence")
    values, mixed = m.core(x)
    tr = lambda t: t.transpose(1, 2).float()  # noqa: E731
    o_f, _ = naive(tr(P["r"] * m.K**0.5), tr(P["k"]), tr(P["v"]), tr(-P["kappa"]), tr(P["kappa"] * P["a"]), tr(P["logw"]))
    assert max_abs(mixed, o_f.transpose(1, 2).double()) < 1e-4


def test_rwkv7_value_residual_option():
    m = build("rwkv7")  # value_residual is on by default (RWKV-7)
    assert m.config.value_residual and m.uses_context
    x = x_()
    y0 = m(x)
    context = {}
    assert max_abs(m(x, context=context), y0) == 0  # a first layer: lerp(v, v, ·) = v ...
    assert context["v_first"].shape == (2, 19, 16)  # ... that hands its v to the later ones
    assert max_abs(context["v_first"], m._params(x, None, False)["v"].flatten(2)) == 0
    assert max_abs(m(x, context={"v_first": torch.zeros(2, 19, 16, dtype=torch.float64)}), y0) > 1e-6  # the mix acts
    with pytest.raises(ValueError, match=r"'context'\['v_first'\].*\[2, 19, 16\]"):
        m(x, context={"v_first": torch.zeros(2, 18, 16, dtype=torch.float64)})
    with pytest.raises(ValueError, match="argument 'context' must be a dict"):
        m(x, context=[1])
    off = build("rwkv7", value_residual=False)
    assert not any(n.startswith(("v0", "v1", "v2")) for n, _ in off.named_parameters())
    c = {}
    y = off(x, context=c)  # no ν parameters; the first layer's v is still written for the later layers
    assert "v_first" in c and max_abs(off(x, context={"v_first": torch.zeros_like(x)}), y) == 0
    # a mixer without uses_context ignores the context
    g = build("gla")
    assert not g.uses_context and max_abs(g(x, context={"v_first": x}), g(x)) == 0


def _rwkv7_lm(n_layers=2, seed=0, **mixer):
    from seqmix.models.lm import LanguageModel, ModelConfig

    torch.manual_seed(seed)
    kw = {**seqmix.mixer_entry("rwkv7").example_config(), **mixer}
    kw.pop("d_model")
    cfg = ModelConfig(mixer="rwkv7", mixer_kwargs=kw, d_model=16, n_layers=n_layers, vocab_size=11, max_seq_len=32)
    return LanguageModel(cfg).double().eval()


def test_rwkv7_value_residual_through_the_backbone():
    """The second layer reads the first layer's v (RWKV-7 eq. 13) through the backbone's context."""
    lm = _rwkv7_lm()
    ids = torch.randint(0, 11, (2, 13), generator=torch.Generator().manual_seed(3))
    seen = []
    hooks = [b.mixer.register_forward_hook(lambda mod, args, kw, out: seen.append((args[0], kw["context"], out)), with_kwargs=True)
             for b in lm.blocks]
    logits = lm(ids)
    for h in hooks:
        h.remove()
    (x0, c0, _), (x1, c1, y1) = seen
    assert c0 is c1  # one dict for the pass
    v0 = lm.blocks[0].mixer._params(x0, None, False)["v"].flatten(2)
    assert max_abs(c1["v_first"], v0) == 0  # layer 0 wrote its own values
    m1 = lm.blocks[1].mixer
    assert max_abs(m1(x1, context={"v_first": v0}), y1) == 0
    assert max_abs(m1(x1), y1) > 1e-6  # without layer 0's v the second layer's output differs
    # perturbing v_first alone moves layer 1: a nonzero gradient of its output w.r.t. v_first
    vf = v0.detach().clone().requires_grad_()
    (gv,) = torch.autograd.grad(m1(x1.detach(), context={"v_first": vf}).square().sum(), vf)
    assert float(gv.abs().max()) > 1e-8
    # the ν LoRA of layer 0 mixes v with itself (zero gradient, but used: DDP sees every parameter); layer 1's learns
    logits.square().sum().backward()
    for name in ("v1", "v2"):
        assert float(getattr(lm.blocks[0].mixer, name).weight.grad.abs().max()) == 0
        assert float(getattr(lm.blocks[1].mixer, name).weight.grad.abs().max()) > 0


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_rwkv7_value_residual_decoding_equals_the_full_pass(mode):
    """With the residual on, every mode of the whole model agrees, and a prefill followed by step-by-step
    decoding through the Cache reproduces the full pass (each step's v_first is layer 0's v of that token)."""
    from seqmix import Cache

    lm = _rwkv7_lm(n_layers=3, seed=1)
    ids = torch.randint(0, 11, (2, 17), generator=torch.Generator().manual_seed(4))
    for b in lm.blocks:
        b.mixer.mode = mode
    with torch.no_grad():
        full = lm.hidden(ids)
        for b in lm.blocks:
            b.mixer.mode = "recurrent"
        assert max_abs(full, lm.hidden(ids)) < F64_ATOL
        for b in lm.blocks:
            b.mixer.mode = mode
        cache = Cache()
        parts = [lm.hidden(ids[:, :6], cache=cache)]  # prefill in the mode, then T == 1 steps
        parts += [lm.hidden(ids[:, t:t + 1], cache=cache, start=t) for t in range(6, 17)]
    assert max_abs(torch.cat(parts, 1), full) < F64_ATOL


def test_rwkv7_value_residual_off_is_the_layer_without_it():
    """value_residual = False: no ν parameters, each layer is the mixer on its own (no
    value residual between the layers); with the residual on and σ(ν) = 0 the model equals it, and with its init it does not."""
    off, on = _rwkv7_lm(value_residual=False), _rwkv7_lm(value_residual=True)
    ids = torch.randint(0, 11, (2, 13), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        h = off.embed(ids) + off.pos.weight[:13]
        for b in off.blocks:  # the old Block: the mixer without a context
            h = h + b.mixer(b.norm1(h))
            h = h + b.channel(b.norm2(h))
        assert max_abs(off.hidden(ids), off.norm_f(h)) == 0
        missing, unexpected = on.load_state_dict(off.state_dict(), strict=False)
        assert not unexpected and sorted(missing) == sorted(f"blocks.{i}.mixer.{n}" for i in range(2)
                                                              for n in ("v0", "v1.weight", "v2.weight"))
        assert max_abs(on.hidden(ids), off.hidden(ids)) > 1e-6
        for b in on.blocks:
            b.mixer.v0.fill_(-1e4)  # σ(ν) = 0: v unchanged
        assert max_abs(on.hidden(ids), off.hidden(ids)) == 0