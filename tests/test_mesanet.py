"""MesaNet: the op ``seqmix.ops.mesa`` and the mixer ``mesanet``. The op against the ridge
regression it solves (float64, closed form), both solvers and every mode against the recurrent
reference, CG converging to the exact solve, the hand-written gradients (backward="manual": the Gram
matrices' adjoint, the CG's gathered dH) against autograd through the same computation, and
against flash-linear-attention's naive references (exact, chunked CG, one-step decoding; optional:
skipped without fla)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from seqmix.ops.mesa import gram_states, mesa_net, mesa_solve
from fla_ref import fla_naive
from tolerances import F32_RTOL, F64_ATOL, assert_modes_agree_f64, max_abs, rel_err

MODES = ("recurrent", "parallel", "chunk")


def rnd(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def inputs(B=2, T=16, H=3, K=8, V=8, dtype=torch.float64):
    q = F.normalize(rnd(B, T, H, K, seed=1, dtype=dtype), dim=-1)
    k = F.normalize(rnd(B, T, H, K, seed=2, dtype=dtype), dim=-1)
    v = rnd(B, T, H, V, seed=3, dtype=dtype)
    beta = torch.sigmoid(rnd(B, T, H, seed=4, dtype=dtype))
    g = F.logsigmoid(rnd(B, T, H, seed=5, dtype=dtype) + 2)
    lamb = torch.rand(H, K, generator=torch.Generator().manual_seed(6), dtype=dtype) + 0.25
    return q, k, v, beta, g, lamb


def test_exact_solver_is_the_ridge_regression():
    """γ = β = 1: o_t = q_t (K_tᵀK_t + Diag λ)⁻¹ K_tᵀ V_t, the ridge regression of v on k over tokens <= t."""
    q, k, v, beta, g, lamb = inputs(B=1, H=1)
    beta, g = torch.ones_like(beta), None
    o, _ = mesa_net(q, k, v, beta, g, lamb, solver="exact", mode="recurrent")
    for t in (0, 5, 15):
        Kt, Vt = k[0, : t + 1, 0], v[0, : t + 1, 0]
        W = torch.linalg.solve(Kt.T @ Kt + torch.diag(lamb[0]), Kt.T @ Vt)  # [K, V]
        assert max_abs(o[0, t, 0], q[0, t, 0] @ W) < F64_ATOL


@pytest.mark.parametrize("solver", ["exact", "cg"])
def test_modes_agree_with_gradients(solver):
    leaves = [t.clone().requires_grad_(True) for t in inputs()]
    w = rnd(*leaves[2].shape, seed=9)
    res = {}
    for mode in MODES:
        o, (G, Hm) = mesa_net(*leaves, solver=solver, cg_steps=10, mode=mode, chunk_size=4, output_final_state=True)
        grads = torch.autograd.grad((o * w).sum() + G.sum() + Hm.sum(), leaves)
        res[mode] = (o.detach(), G.detach(), Hm.detach(), grads)
    ref = res["recurrent"]
    for mode in ("parallel", "chunk"):
        for a, b in zip(res[mode][:3], ref[:3]):
            assert max_abs(a, b) < F64_ATOL, mode
        for a, b in zip(res[mode][3], ref[3]):
            assert max_abs(a, b) < F64_ATOL, mode


@pytest.mark.parametrize("mode", MODES)
def test_split_and_carry(mode):
    q, k, v, beta, g, lamb = inputs(T=19)
    full, S = mesa_net(q, k, v, beta, g, lamb, solver="exact", mode="recurrent", output_final_state=True)
    for cut in (1, 8, 17):
        a, b = slice(0, cut), slice(cut, None)
        o1, S1 = mesa_net(q[:, a], k[:, a], v[:, a], beta[:, a], g[:, a], lamb, solver="exact", mode=mode, chunk_size=4,
                          output_final_state=True)
        o2, S2 = mesa_net(q[:, b], k[:, b], v[:, b], beta[:, b], g[:, b], lamb, solver="exact", mode=mode, chunk_size=4,
                          initial_state=S1, output_final_state=True)
        assert max_abs(torch.cat([o1, o2], 1), full) < F64_ATOL
        assert max_abs(S2[0], S[0]) < F64_ATOL and max_abs(S2[1], S[1]) < F64_ATOL


def test_cg_converges_to_the_exact_solve():
    """K steps of CG solve a K×K SPD system exactly (in exact arithmetic); more steps, smaller error."""
    q, k, v, beta, g, lamb = inputs()
    exact, _ = mesa_net(q, k, v, beta, g, lamb, solver="exact", mode="parallel")
    errs = [max_abs(mesa_net(q, k, v, beta, g, lamb, solver="cg", cg_steps=n, cg_eps=0.0, mode="parallel")[0], exact)
            for n in (1, 3, 8, 12)]
    assert errs[0] > errs[1] > errs[2] and errs[-1] < 1e-8, errs
    # the Jacobi start is also a start: it converges to the same solution
    jac, _ = mesa_net(q, k, v, beta, g, lamb, solver="cg", cg_steps=12, cg_init="jacobi", cg_eps=0.0, mode="parallel")
    assert max_abs(jac, exact) < 1e-8


@pytest.mark.parametrize("cg_init", ["zero", "jacobi"])
def test_manual_cg_backward_is_autograd_through_the_steps(cg_init):
    """backward="manual" (the custom autograd Function _CGSolve, dH as one bmm over the steps) against
    plain autograd through the same CG steps: the same forward and gradients (float64, tight)."""
    B, T, H, K = 2, 7, 3, 6
    A = rnd(B, T, H, K, K, seed=11)
    Hm = (A @ A.transpose(-1, -2) / K).requires_grad_(True)
    q = rnd(B, T, H, K, seed=12).requires_grad_(True)
    lamb = (torch.rand(H, K, generator=torch.Generator().manual_seed(13), dtype=torch.float64) + 0.25).requires_grad_(True)
    w = rnd(B, T, H, K, seed=14)
    res = {}
    for how in ("manual", "autograd"):
        x = mesa_solve(Hm, q, lamb, solver="cg", cg_steps=9, cg_init=cg_init, backward=how)
        res[how] = (x.detach(), torch.autograd.grad((x * w).sum(), (Hm, q, lamb)))
    assert max_abs(res["manual"][0], res["autograd"][0]) == 0  # the forward is the same computation
    for a, b in zip(res["manual"][1], res["autograd"][1]):
        assert max_abs(a, b) < F64_ATOL * max(1.0, max_abs(b, torch.zeros_like(b)))
    assert max_abs(res["manual"][1][0], torch.zeros_like(Hm)) > 1e-3  # the test sees dH


def test_manual_cg_backward_twice_names_the_option():
    """A second backward through one manual CG solve (retain_graph=True) is refused with a clear error
    naming backward='autograd', which supports it."""
    B, T, H, K = 1, 3, 2, 4
    A = rnd(B, T, H, K, K, seed=21)
    Hm = (A @ A.transpose(-1, -2) / K).requires_grad_(True)
    q = rnd(B, T, H, K, seed=22).requires_grad_(True)
    lamb = torch.ones(H, K, dtype=torch.float64)
    x = mesa_solve(Hm, q, lamb, solver="cg", cg_steps=3, backward="manual")
    x.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward='autograd'"):
        x.sum().backward()
    y = mesa_solve(Hm, q, lamb, solver="cg", cg_steps=3, backward="autograd")
    y.sum().backward(retain_graph=True)
    y.sum().backward()


@pytest.mark.parametrize("decay", [True, False])
@pytest.mark.parametrize("solver", ["cg", "exact"])
@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_manual_backward_through_the_op(mode, solver, decay):
    """The whole op in a chunked mode, backward="manual" (_GramChunks' adjoint, _CGSolve) against
    autograd through the same forward: gradients of every input and of the initial state (float64)."""
    q, k, v, beta, g, lamb = inputs(T=13)
    A = rnd(2, 3, 8, 8, seed=21)
    S0 = (rnd(2, 3, 8, 8, seed=20), A @ A.transpose(-1, -2) / 8)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, beta, g, lamb, *S0)]
    w = rnd(*v.shape, seed=9)
    wH = rnd(2, 3, 8, 8, seed=22)
    res = {}
    for how in ("manual", "autograd"):
        args = leaves[:4] + [leaves[4] if decay else None, leaves[5]]
        o, (G, Hm) = mesa_net(*args, solver=solver, cg_steps=12, mode=mode, chunk_size=4, backward=how,
                              initial_state=tuple(leaves[6:]), output_final_state=True)
        res[how] = torch.autograd.grad((o * w).sum() + G.sum() + (Hm * wH).sum(), leaves, allow_unused=True)
    for name, a, b in zip("q k v beta g lamb G0 H0".split(), res["manual"], res["autograd"]):
        if a is None or b is None:
            assert a is None and b is None and name == "g" and not decay, name
            continue
        assert max_abs(b, torch.zeros_like(b)) > 1e-6, name  # every gradient is seen
        assert max_abs(a, b) < F64_ATOL, name


@pytest.mark.parametrize("decay", [True, False])
def test_gram_states_manual_backward(decay):
    """_GramChunks' hand-written adjoint against autograd through the chunk form and through the loop,
    with padding (T = 11 in chunks of 4), an initial state and a gradient on H_T."""
    _, k, _, beta, g, _ = inputs(T=11)
    leaves = [t.clone().requires_grad_(True) for t in (k, beta, g, rnd(2, 3, 8, 8, seed=7))]
    wa, wT = rnd(2, 11, 3, 8, 8, seed=30), rnd(2, 3, 8, 8, seed=31)
    res = {}
    for name, kw in (("manual", dict(mode="chunk", backward="manual")), ("chunk", dict(mode="chunk", backward="autograd")),
                     ("loop", dict(mode="recurrent"))):
        gg = leaves[2] if decay else None
        Ha, HT = gram_states(leaves[0], leaves[1], gg, initial_state=leaves[3], chunk_size=4, **kw)
        res[name] = torch.autograd.grad((Ha * wa).sum() + (HT * wT).sum(), leaves, allow_unused=True)
    for ref in ("chunk", "loop"):
        for a, b in zip(res["manual"], res[ref]):
            assert (a is None) == (b is None) == (not decay and a is None)
            if a is not None:
                assert max_abs(a, b) < F64_ATOL, ref


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_gram_states_modes_match_the_loop(mode):
    _, k, _, beta, g, _ = inputs(T=11)
    H0 = rnd(2, 3, 8, 8, seed=7)
    for gg in (g, None):
        ref, ref_T = gram_states(k, beta, gg, initial_state=H0, mode="recurrent")
        for C in (3, 4, 11, 16):
            got, got_T = gram_states(k, beta, gg, initial_state=H0, mode=mode, chunk_size=C)
            assert got.shape == (2, 11, 3, 8, 8)
            assert max_abs(got, ref) < F64_ATOL and max_abs(got_T, ref_T) < F64_ATOL


def test_solve_of_a_zero_right_hand_side_is_zero():
    Hm = torch.zeros(2, 3, 4, 4, dtype=torch.float64)
    x = mesa_solve(Hm, torch.zeros(2, 3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64), solver="cg")
    assert torch.isfinite(x).all() and float(x.abs().max()) == 0


# -- fla's naive references ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_exact_matches_fla_naive(mode):
    naive = fla_naive("ops/mesa_net/naive.py", "naive_mesa_net_exact")
    q, k, v, beta, g, lamb = inputs(dtype=torch.float32)
    ref, h_kk, h_kv = naive(q, k, v, g, lamb, beta)  # fla computes in float32
    o, (G, Hm) = mesa_net(q, k, v, beta, g, lamb, solver="exact", mode=mode, chunk_size=4, output_final_state=True)
    assert rel_err(o, ref) < F32_RTOL and rel_err(G, h_kv) < F32_RTOL and rel_err(Hm, h_kk) < F32_RTOL


@pytest.mark.parametrize("steps", [5, 30])
@pytest.mark.parametrize("mode", MODES)
def test_cg_matches_fla_naive_chunked_cg(mode, steps):
    naive = fla_naive("ops/mesa_net/naive.py", "naive_mesa_net_CG")
    q, k, v, beta, g, lamb = inputs(dtype=torch.float32)
    ref, _, _ = naive(q, k, v, g, lamb, beta, chunk_size=8, max_CG_iteration=steps)
    o, _ = mesa_net(q, k, v, beta, g, lamb, solver="cg", cg_steps=steps, cg_init="zero", mode=mode, chunk_size=4)
    assert rel_err(o, ref) < F32_RTOL


def test_jacobi_cg_steps_match_fla_naive_decoding():
    naive = fla_naive("ops/mesa_net/naive.py", "naive_mesa_net_decoding_one_step")
    q, k, v, beta, g, lamb = inputs(dtype=torch.float32)
    B, T, H, K = q.shape
    h_kk, h_kv, S = torch.zeros(B, H, K, K), torch.zeros(B, H, K, K), None
    for t in range(T):
        ref, h_kk, h_kv = naive(q[:, t], k[:, t], v[:, t], g[:, t], lamb, beta[:, t], h_kk, h_kv, max_CG_iteration=3)
        s = slice(t, t + 1)
        o, S = mesa_net(q[:, s], k[:, s], v[:, s], beta[:, s], g[:, s], lamb, solver="cg", cg_steps=3, cg_init="jacobi",
                        mode="step", initial_state=S, output_final_state=True)
        assert rel_err(o[:, 0], ref) < F32_RTOL, t
    assert rel_err(S[0], h_kv) < F32_RTOL and rel_err(S[1], h_kk) < F32_RTOL


def test_bad_arguments():
    q, k, v, beta, g, lamb = inputs()
    with pytest.raises(ValueError, match="lamb"):
        mesa_net(q, k, v, beta, g, -lamb)
    with pytest.raises(ValueError, match="solver"):
        mesa_net(q, k, v, beta, g, lamb, solver="lu")
    with pytest.raises(ValueError, match="mode"):
        mesa_net(q, k, v, beta, g, lamb, mode="fft")
    with pytest.raises(ValueError, match="'g'"):
        mesa_net(q, k, v, beta, -g + 0.1, lamb)


# -- the mixer ----------------------------------------------------------------------------------


def build(dtype=torch.float64, **kw):
    torch.manual_seed(0)
    return seqmix.build_mixer("mesanet", **{**seqmix.mixer_entry("mesanet").example_config(), **kw}).to(dtype).eval()


@pytest.mark.parametrize("solver", ["exact", "cg"])
def test_mixer_modes_and_decoding(solver):
    m = build(solver=solver)
    x = rnd(2, 19, m.d_model, seed=3)
    y = assert_modes_agree_f64(m, x, f"mesanet {solver}")
    cache = Cache()
    steps = [m(x[:, t:t + 1], cache=cache) for t in range(19)]
    assert max_abs(torch.cat(steps, 1), y) < F64_ATOL
    st = cache.get(m)
    assert st["G"].shape == (2, m.H, m.K, m.V) and st["H"].shape == (2, m.H, m.K, m.K)


def test_mixer_solvers_differ_and_agree_in_the_limit():
    x = rnd(2, 12, 16, seed=3)
    exact = build(solver="exact")(x)
    few = build(solver="cg", cg_steps=2)(x)
    many = build(solver="cg", cg_steps=40, cg_eps=0.0)(x)
    assert max_abs(few, exact) > 1e-4
    assert max_abs(many, exact) < 1e-8


def test_dsf_readout_is_the_solved_query():
    """C_t = q_tᵀ(H_t + λ)⁻¹: the DSF's C equals the solve of the mixer's q against its own H_t."""
    m = build(solver="exact")
    x = rnd(1, 9, m.d_model, seed=2)
    q, k, v, beta, g, lamb, _ = m._params(x, None, False)
    Hm = torch.zeros(1, m.H, m.K, m.K, dtype=x.dtype)
    qt, _, _ = m.readout(x)
    for t in range(9):
        bk = beta[:, t, :, None] * k[:, t]
        Hm = g[:, t].exp()[..., None, None] * Hm + bk.unsqueeze(-1) * k[:, t].unsqueeze(-2)
        want = torch.linalg.solve(Hm + torch.diag_embed(lamb), q[:, t].unsqueeze(-1)).squeeze(-1)
        assert max_abs(qt[:, t], want) < F64_ATOL
    system = m.dsf(x)
    values, mixed = m.core(x)
    assert max_abs(system.evaluate(values.flatten(2)), mixed.flatten(2)) < F64_ATOL
