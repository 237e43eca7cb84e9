"""The momentum delta rule (seqmix.ops.momentum_delta) and Momentum DeltaNet: the op's modes against each
other (float64, initial and final states; the chunk mode at several chunk sizes, forward and gradients, and in
float32 under strong decays), against fla's naive references (recurrent and chunk; float32
inside: F32_RTOL), the gated delta rule as its μ = 0 case, the mixer's core against fla's reference on
inputs made from its weights as fla's layer makes them, and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from fla_ref import fla_naive
from seqmix.ops import delta_rule, momentum_delta_rule, momentum_delta_rule_map
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, max_abs, rel_err

B, T, H, K, V = 2, 13, 3, 4, 5


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q = r(B, T, H, K)
    k = F.normalize(r(B, T, H, K), dim=-1)
    p = F.normalize(r(B, T, H, K), dim=-1)
    return q, k, r(B, T, H, V), p, -u(B, T, H), -u(B, T, H), u(B, T, H), 2 * u(B, T, H)


def test_modes_agree_with_states():
    q, k, v, p, la, lm, beta, eta = inputs()
    g = torch.Generator().manual_seed(3)
    S0, M0 = (torch.randn(B, H, K, V, generator=g, dtype=torch.float64) for _ in range(2))
    o1, (S1, M1) = momentum_delta_rule(q, k, v, p, la, lm, beta, eta, scale=0.5, initial_state=(S0, M0), output_final_state=True)
    for mode, C in (("parallel", 64), ("chunk", 1), ("chunk", 4), ("chunk", 13), ("chunk", 64)):
        o2, (S2, M2) = momentum_delta_rule(q, k, v, p, la, lm, beta, eta, scale=0.5, initial_state=(S0, M0), output_final_state=True,
                                           mode=mode, chunk_size=C)
        assert max(max_abs(o1, o2), max_abs(S1, S2), max_abs(M1, M2)) < F64_ATOL, (mode, C)
    Phi = momentum_delta_rule_map(q, k, p, la, lm, beta, eta, scale=0.5)
    o0, _ = momentum_delta_rule(q, k, v, p, la, lm, beta, eta, scale=0.5)
    assert max_abs(torch.einsum("bhts,bshv->bthv", Phi, v), o0) < F64_ATOL
    # a step carries both states
    o_s, (S_s, M_s) = momentum_delta_rule(q[:, :1], k[:, :1], v[:, :1], p[:, :1], la[:, :1], lm[:, :1], beta[:, :1], eta[:, :1],
                                          scale=0.5, initial_state=(S0, M0), output_final_state=True, mode="step")
    assert max_abs(o_s, o1[:, :1]) < F64_ATOL


def _loss_and_grads(mode, dtype, decay_scale=1.0, chunk_size=4):
    """A loss of o and the final states, and its gradients w.r.t. every input and both initial states."""
    q, k, v, p, la, lm, beta, eta = inputs(4)
    g = torch.Generator().manual_seed(5)
    S0, M0 = (torch.randn(B, H, K, V, generator=g, dtype=torch.float64) for _ in range(2))
    xs = [t.to(dtype).requires_grad_() for t in (q, k, v, p, decay_scale * la, lm, beta, eta, S0, M0)]
    o, (S, M) = momentum_delta_rule(*xs[:8], scale=0.5, initial_state=(xs[8], xs[9]), output_final_state=True, mode=mode,
                                    chunk_size=chunk_size)
    w = torch.Generator().manual_seed(6)
    loss = sum((t * torch.randn(t.shape, generator=w, dtype=torch.float64).to(dtype)).sum() for t in (o, S, M))
    return [o, S, M, *torch.autograd.grad(loss, xs)]


def test_chunk_gradients_match_recurrent():
    ref = _loss_and_grads("recurrent", torch.float64)
    for C in (4, 13):
        got = _loss_and_grads("chunk", torch.float64, chunk_size=C)
        assert max(max_abs(a, b) for a, b in zip(ref, got)) < F64_ATOL, C
    # float32, and decays down to exp(−30) a token (a chunk's cumulative decay far below float32's range)
    ref = _loss_and_grads("recurrent", torch.float64, decay_scale=30.0)
    got = _loss_and_grads("chunk", torch.float32, decay_scale=30.0, chunk_size=8)
    assert all(torch.isfinite(t).all() for t in got)
    assert max(rel_err(b, a) for a, b in zip(ref, got)) < F32_RTOL


def test_op_matches_fla_naive():
    rec = fla_naive("ops/momentum_delta_rule/naive.py", "recurrent_momentum_delta_rule_ref")
    chunk = fla_naive("ops/momentum_delta_rule/naive.py", "chunk_momentum_delta_rule_ref")
    q, k, v, p, la, lm, beta, eta = inputs(1)
    o_ref, st = rec(q, k, v, la, lm, p, beta, eta, scale=0.5, output_final_state=True)
    o_chunk, _ = chunk(q, k, v, p, la, lm, beta, eta, scale=0.5, chunk_size=8)
    for mode in ("recurrent", "chunk", "parallel"):
        o, (S, M) = momentum_delta_rule(q, k, v, p, la, lm, beta, eta, scale=0.5, output_final_state=True, mode=mode, chunk_size=8)
        assert rel_err(o, o_ref) < F32_RTOL and rel_err(S, st[0]) < F32_RTOL and rel_err(M, st[1]) < F32_RTOL, mode
        assert rel_err(o, o_chunk) < F32_RTOL, mode


def test_zero_momentum_is_the_gated_delta_rule():
    """μ = 0 and p = α k: S_t = (I − βη kᵀk) α S_{t−1} + βη kᵀ v, the gated delta rule with writing strength βη."""
    q, k, v, _, la, _, beta, eta = inputs(2)
    lm = torch.full_like(la, float("-inf"))
    o_gdn, _ = delta_rule(q, k, v, beta * 0.5 * eta, la, scale=0.5)
    for mode in ("recurrent", "chunk"):
        o, _ = momentum_delta_rule(q, k, v, la.exp().unsqueeze(-1) * k, la, lm, beta, 0.5 * eta, scale=0.5, mode=mode, chunk_size=4)
        assert max_abs(o, o_gdn) < F64_ATOL, mode


def test_mixer_core_matches_fla_naive():
    rec = fla_naive("ops/momentum_delta_rule/naive.py", "recurrent_momentum_delta_rule_ref")
    torch.manual_seed(0)
    m = seqmix.build_mixer("momentum_deltanet", d_model=16, heads=2, expand_v=1.0, conv_size=None).double().eval()
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    # fla's layer, written from its code's equations, on the mixer's weights (no conv)
    Hm, Km, Vm = m.H, m.K, m.V
    q = F.silu(m.W_q(x)).view(2, 11, Hm, Km)
    k = F.silu(m.W_k(x)).view(2, 11, Hm, Km)
    v = F.silu(m.W_v(x)).view(2, 11, Hm, Vm)
    q = q - m.D_log.exp().view(Hm, 1) * k
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    eta = torch.tanh(m.W_eta(x) / 4.0) + 1
    theta = torch.atan(eta * m.log_factor.exp())
    beta = torch.sin(theta) ** 2 * torch.sigmoid(m.W_beta(x))
    la = -m.A_log.exp() * F.softplus(m.W_a(x) + m.dt_bias) + torch.log(torch.cos(theta) ** 2)
    lm = (-m.mu_log.exp() * F.softplus(m.W_mu(x) + m.mu_bias)).clamp_min(-2.0)
    o_ref, _ = rec(q, k, v, la, lm, la.exp().unsqueeze(-1) * k, beta, eta, scale=Km**-0.5)
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode
    assert_decodes_splits_and_maps(m, x, "momentum_deltanet")
    ev = m.spectrum(x)
    assert ev.abs().max() < 1 + 1e-9  # a stable pair


def test_bad_input():
    q, k, v, p, la, lm, beta, eta = inputs()
    with pytest.raises(ValueError, match="'p'"):
        momentum_delta_rule(q, k, v, p[..., :2], la, lm, beta, eta)
    with pytest.raises(ValueError, match="'eta'"):
        momentum_delta_rule(q, k, v, p, la, lm, beta, eta[:, :2])
    with pytest.raises(ValueError, match="log_alpha"):
        momentum_delta_rule(q, k, v, p, -la, lm, beta, eta)
    with pytest.raises(ValueError, match="mode"):
        momentum_delta_rule(q, k, v, p, la, lm, beta, eta, mode="fft")
    with pytest.raises(ValueError, match="chunk_size"):
        momentum_delta_rule(q, k, v, p, la, lm, beta, eta, mode="chunk", chunk_size=0)
    with pytest.raises(ValueError, match="initial_state"):
        momentum_delta_rule(q, k, v, p, la, lm, beta, eta, initial_state=torch.zeros(B, H, K, V))
    with pytest.raises(ValueError, match="step"):
        momentum_delta_rule(q, k, v, p, la, lm, beta, eta, mode="step")
