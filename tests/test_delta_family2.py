"""Issue 30's delta-family mixers: the generalized (diagonal-plus-rank-one) delta op, RWKV-7, Gated DeltaProduct
and Comba, against their own loops and flash-linear-attention's naive references (optional: skipped without fla)."""

from __future__ import annotations

import math

import pytest
from fla_ref import fla_naive
import torch
import torch.nn.functional as F

import seqmix
from seqmix.ops.delta_rule import delta_product, delta_rule, delta_rule_map
from tolerances import max_abs


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
    m = build("rwkv7", value_residual=True)
    x = x_()
    y0 = m(x)
    m.v_first = torch.zeros(2, 19, 16, dtype=torch.float64)
    assert max_abs(m(x), y0) > 1e-6  # the lerp toward v_first acts
    m.v_first = None
    assert max_abs(m(x), y0) == 0  # unset: the mixer's own v (lerp(v, v) = v)
