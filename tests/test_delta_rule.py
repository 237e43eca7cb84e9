"""delta_rule: every mode against the reference loop, forward and backward, and the map
against an explicit product of transitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqmix.ops.delta_rule import delta_rule, delta_rule_map, delta_rule_step
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

B, H, K, V = 2, 3, 5, 4
DECAYS = ["none", "head", "key"]


def make(T, decay, *, strength=1.0, beta_max=1.0, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q = r(B, T, H, K)
    k = F.normalize(r(B, T, H, K), dim=-1)
    v = r(B, T, H, V)
    beta = beta_max * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    gg = {"none": None, "head": -strength * r(B, T, H).abs(), "key": -strength * r(B, T, H, K).abs()}[decay]
    S0 = r(B, H, K, V)
    return [None if t is None else t.to(dtype) for t in (q, k, v, beta, gg, S0)]


def run(mode, q, k, v, beta, g, S0, **kw):
    return delta_rule(q, k, v, beta, g, initial_state=S0, output_final_state=True, mode=mode, scale=0.7, **kw)


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("T", [16, 19])
def test_modes_match_recurrent_float64(decay, T):
    args = make(T, decay, beta_max=2.0)
    o_ref, S_ref = run("recurrent", *args)
    for mode, chunk in (("chunk", 4), ("chunk", 8), ("chunk", 64), ("parallel", 64)):
        o, S = run(mode, *args, chunk_size=chunk)
        assert max_abs(o, o_ref) < F64_ATOL, (mode, chunk)
        assert max_abs(S, S_ref) < F64_ATOL, (mode, chunk)
    # no initial state, no final state (parallel then uses the materialized map)
    o_ref0, _ = delta_rule(*args[:5], mode="recurrent")
    for mode in ("chunk", "parallel"):
        o, S = delta_rule(*args[:5], mode=mode, chunk_size=8)
        assert S is None and max_abs(o, o_ref0) < F64_ATOL


@pytest.mark.parametrize("decay", DECAYS)
def test_gradients_match_recurrent_float64(decay):
    base = make(19, decay, beta_max=2.0)
    w = torch.randn(B, 19, H, V, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grads(mode, **kw):
        leaves = [None if t is None else t.clone().requires_grad_(True) for t in base]
        o, S = run(mode, *leaves, **kw)
        loss = (o * w).sum() + S.square().sum()
        live = [t for t in leaves if t is not None]
        return torch.autograd.grad(loss, live)

    ref = grads("recurrent")
    for mode in ("chunk", "parallel"):
        for a, b in zip(grads(mode, chunk_size=8), ref):
            assert max_abs(a, b) < F64_ATOL, mode
    # the materialized map's gradient (no state in or out)
    leaves = [None if t is None else t.clone().requires_grad_(True) for t in base[:5]]
    live = [t for t in leaves if t is not None]
    g_map = torch.autograd.grad((delta_rule(*leaves, mode="parallel") [0] * w).sum(), live)
    leaves2 = [None if t is None else t.clone().requires_grad_(True) for t in base[:5]]
    live2 = [t for t in leaves2 if t is not None]
    g_rec = torch.autograd.grad((delta_rule(*leaves2, mode="recurrent")[0] * w).sum(), live2)
    for a, b in zip(g_map, g_rec):
        assert max_abs(a, b) < F64_ATOL


def explicit_map(q, k, beta, g, scale):
    """Φ[t, s] = scale · q_t M_t ⋯ M_{s+1} β_s k_sᵀ with the K×K matrices M_r built explicitly."""
    Bb, T, Hh, Kk = q.shape
    I = torch.eye(Kk, dtype=q.dtype)
    out = torch.zeros(Bb, Hh, T, T, dtype=q.dtype)
    for b in range(Bb):
        for h in range(Hh):
            M = []
            for r in range(T):
                a = torch.ones(Kk, dtype=q.dtype) if g is None else (g[b, r, h].exp() * torch.ones(Kk, dtype=q.dtype))
                kr = k[b, r, h]
                M.append((I - beta[b, r, h] * torch.outer(kr, kr)) @ torch.diag(a))
            for s in range(T):
                x = beta[b, s, h] * k[b, s, h]
                for t in range(s, T):
                    if t > s:
                        x = M[t] @ x
                    out[b, h, t, s] = scale * q[b, t, h] @ x
    return out


@pytest.mark.parametrize("decay", DECAYS)
def test_map_is_the_product_of_transitions(decay):
    q, k, v, beta, g, _ = make(7, decay, beta_max=2.0)
    Phi = delta_rule_map(q, k, beta, g, scale=0.7)
    assert max_abs(Phi, explicit_map(q, k, beta, g, 0.7)) < F64_ATOL
    o, _ = delta_rule(q, k, v, beta, g, mode="recurrent", scale=0.7)
    assert max_abs(torch.einsum("bhts,bshv->bthv", Phi, v), o) < F64_ATOL


@pytest.mark.parametrize("decay", DECAYS)
def test_step_chain_equals_recurrent(decay):
    q, k, v, beta, g, S0 = make(6, decay)
    o_ref, S_ref = run("recurrent", q, k, v, beta, g, S0)
    S = S0
    outs = []
    for t in range(6):
        o, S = delta_rule_step(q[:, t], k[:, t], v[:, t], beta[:, t], g[:, t] if g is not None else None, S, scale=0.7)
        outs.append(o)
    assert max_abs(torch.stack(outs, 1), o_ref) < F64_ATOL and max_abs(S, S_ref) < F64_ATOL
    o1, S1 = run("step", q[:, :1], k[:, :1], v[:, :1], beta[:, :1], g[:, :1] if g is not None else None, S0)
    o_r, S_r = run("recurrent", q[:, :1], k[:, :1], v[:, :1], beta[:, :1], g[:, :1] if g is not None else None, S0)
    assert max_abs(o1, o_r) < F64_ATOL and max_abs(S1, S_r) < F64_ATOL


def test_delta_rule_retrieves_the_last_value_written():
    """The delta rule's defining property: with β = 1 and a unit key, reading at k_t right
    after writing v_t under it returns v_t exactly, whatever was stored before (plain linear
    attention returns v_t plus the old content)."""
    q, k, v, beta, _, S0 = make(5, "none")
    o, _ = delta_rule(k, k, v, torch.ones_like(beta), initial_state=S0, mode="recurrent")
    assert max_abs(o, v) < F64_ATOL


def cut(args, n):
    """The first n tokens of (q, k, v, beta, g, S0)."""
    return [None if t is None else t[:, :n] for t in args[:5]] + [args[5]]


@pytest.mark.parametrize("decay", DECAYS)
def test_float32_stable_for_beta_up_to_2_and_strong_decays(decay):
    T = 200
    q, k, v, beta, g, S0 = make(T, decay, strength=20.0, beta_max=2.0, seed=5)
    beta[:, ::3] = 2.0  # the edge of the range
    beta[:, 1::3] = 0.0
    args32 = [None if t is None else t.float() for t in (q, k, v, beta, g, S0)]
    # parallel solves one triangular system of size T: it is the mode of T <= chunk_size (auto)
    for mode, n in (("chunk", T), ("recurrent", T), ("parallel", 64)):
        o_ref, S_ref = run("recurrent", *cut((q, k, v, beta, g, S0), n))
        o, S = run(mode, *cut(args32, n), chunk_size=64)
        assert o.dtype == torch.float32 and torch.isfinite(o).all()
        assert rel_err(o, o_ref) < F32_RTOL, mode
        assert rel_err(S, S_ref) < F32_RTOL, mode


def test_half_inputs_accumulate_in_float32():
    q, k, v, beta, g, S0 = make(40, "head")
    o_ref, _ = run("recurrent", q, k, v, beta, g, S0)
    args = [t.to(torch.bfloat16) for t in (q, k, v, beta, g, S0)]
    o, S = run("chunk", *args, chunk_size=16)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert rel_err(o.double(), o_ref) < 5e-2  # bfloat16 inputs: about 3 significant digits


def test_bad_input_raises_value_error():
    q, k, v, beta, g, S0 = make(4, "head")
    with pytest.raises(ValueError, match="'beta'"):
        delta_rule(q, k, v, beta[..., :1])
    with pytest.raises(ValueError, match=r"'beta' must lie in \[0, 2\]"):
        delta_rule(q, k, v, beta + 2.5)
    with pytest.raises(ValueError, match="'g'"):
        delta_rule(q, k, v, beta, -g)
    with pytest.raises(ValueError, match="'g'"):
        delta_rule(q, k, v, beta, g[..., None].expand(B, 4, H, K + 1))
    with pytest.raises(ValueError, match="'v'"):
        delta_rule(q, k, v[:, :3], beta)
    with pytest.raises(ValueError, match="'initial_state'"):
        delta_rule(q, k, v, beta, initial_state=S0[..., :2])
    with pytest.raises(ValueError, match="'q'"):
        delta_rule(q.masked_fill(q > 1, float("nan")), k, v, beta)
    with pytest.raises(ValueError, match="mode"):
        delta_rule(q, k, v, beta, mode="fast")
    with pytest.raises(ValueError, match="T == 1"):
        delta_rule(q, k, v, beta, mode="step")
