"""linear_recurrence: every mode against the reference loop, forward and backward."""

from __future__ import annotations

import itertools

import pytest
import torch

import seqmix.ops.recurrence as recurrence_module
from seqmix.ops import linear_recurrence, recurrence_map, recurrence_step
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

B, H, K, V = 2, 3, 5, 4
DECAYS = ["none", "head", "key"]


def make(T, decay, value_decay, dtype=torch.float64, strength=1.0, seed=0, complex_=False):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, V)
    gk = {"none": None, "head": -strength * r(B, T, H).abs(), "key": -strength * r(B, T, H, K).abs()}[decay]
    gv = -strength * r(B, T, H, V).abs() if value_decay else None
    S0 = r(B, H, K, V)
    if complex_:
        q, k = torch.complex(q, r(B, T, H, K)), torch.complex(k, r(B, T, H, K))
        if gk is not None:
            gk = torch.complex(gk, r(*gk.shape))
    cast = (lambda t: t) if complex_ else (lambda t: t.to(dtype))
    return [None if t is None else cast(t) for t in (q, k, v, gk, gv, S0)]


def run(mode, q, k, v, gk, gv, S0, **kw):
    return linear_recurrence(q, k, v, gk, gv, initial_state=S0, output_final_state=True, mode=mode, scale=0.7, **kw)


CASES = list(itertools.product(DECAYS, [False, True], [16, 19]))


@pytest.mark.parametrize("decay,value_decay,T", CASES)
@pytest.mark.parametrize("mode", ["scan", "chunk", "parallel"])
def test_modes_match_recurrent_float64(mode, decay, value_decay, T, monkeypatch):
    monkeypatch.setattr(recurrence_module, "SCAN_CHUNK_BYTES", 1)  # the scan's shortest chunk, 16 steps: T = 19 crosses one
    args = make(T, decay, value_decay)
    o_ref, S_ref = run("recurrent", *args)
    for chunk in (4, 8, 64):
        o, S = run(mode, *args, chunk_size=chunk)
        assert max_abs(o, o_ref) < F64_ATOL
        assert max_abs(S, S_ref) < F64_ATOL


@pytest.mark.parametrize("decay,value_decay", list(itertools.product(DECAYS, [False, True])))
@pytest.mark.parametrize("mode", ["scan", "chunk", "parallel"])
def test_gradients_match_recurrent_float64(mode, decay, value_decay, monkeypatch):
    monkeypatch.setattr(recurrence_module, "SCAN_CHUNK_BYTES", 1)  # 16-step chunks: T = 19 crosses one
    T = 19
    base = make(T, decay, value_decay)

    def grads(m):
        leaves = [None if t is None else t.clone().requires_grad_(True) for t in base]
        o, S = run(m, *leaves, chunk_size=8)
        w = torch.randn(o.shape, generator=torch.Generator().manual_seed(3), dtype=o.dtype)
        loss = (o * w).sum() + S.sum()
        used = [t for t in leaves if t is not None]
        return torch.autograd.grad(loss, used)

    for a, b in zip(grads(mode), grads("recurrent")):
        assert max_abs(a, b) < F64_ATOL


@pytest.mark.parametrize("decay,value_decay", list(itertools.product(DECAYS, [False, True])))
def test_float32_relative_error(decay, value_decay):
    args64 = make(37, decay, value_decay)
    o_ref, _ = run("recurrent", *args64)
    args32 = [None if t is None else t.float() for t in args64]
    for mode in ("recurrent", "scan", "chunk", "parallel"):
        o, S = run(mode, *args32, chunk_size=16)
        assert o.dtype == torch.float32 and S.dtype == torch.float32
        assert rel_err(o.double(), o_ref) < F32_RTOL


@pytest.mark.parametrize("decay", ["head", "key"])
@pytest.mark.parametrize("value_decay", [False, True])
def test_strong_decays_stay_finite_and_accurate(decay, value_decay):
    """Log-decays down to -40 per step: the chunk form never exponentiates an unbounded sum."""
    args64 = make(45, decay, value_decay, strength=40.0)
    o_ref, S_ref = run("recurrent", *args64)
    leaves = [None if t is None else t.float().requires_grad_(True) for t in args64]
    o, S = run("chunk", *leaves, chunk_size=32)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert rel_err(o.double(), o_ref) < 1e-3  # float32 with cumulative decays of ~1e3 inside a chunk
    (o.sum() + S.sum()).backward()
    for t in leaves:
        if t is not None:
            assert torch.isfinite(t.grad).all()
    # float64: the same exactness as with mild decays
    o64, _ = run("chunk", *args64, chunk_size=32)
    assert max_abs(o64, o_ref) < F64_ATOL


@pytest.mark.parametrize("decay", ["head", "key"])
@pytest.mark.parametrize("mode", ["scan", "chunk", "parallel"])  # scan: complex inputs run the reference loop
def test_complex_decays(mode, decay):
    args = make(19, decay, False, complex_=True)
    o_ref, S_ref = run("recurrent", *args)
    assert o_ref.is_complex()
    o, S = run(mode, *args, chunk_size=8)
    assert max_abs(o, o_ref) < F64_ATOL and max_abs(S, S_ref) < F64_ATOL
    if mode == "scan":  # the gradients too (the scan's own backward has no conjugates: it must not run here)
        def grads(m):
            leaves = [None if t is None else t.clone().requires_grad_(True) for t in args]
            o, S = run(m, *leaves)
            loss = (o.abs() ** 2).sum() + (S.abs() ** 2).sum()
            return torch.autograd.grad(loss, [t for t in leaves if t is not None])
        for a, b in zip(grads("scan"), grads("recurrent")):
            assert max_abs(a, b) < F64_ATOL


def test_scan_decay_gradient_is_accurate_elementwise_under_strong_decays(monkeypatch):
    """float32, key-wise log-decays -10·U(0, 1) per step: the decay's gradient matches the float64 reference
    element by element (99th percentile of the relative error < 1e-4; forming a_t ⊙ S_(t-1) as
    S_t - k_tᵀ v_t cancels where a_t is small: 1e-2 there)."""
    monkeypatch.setattr(recurrence_module, "SCAN_CHUNK_BYTES", 1)
    g = torch.Generator().manual_seed(8)
    Bs, T, Hs, Ks, Vs = 1, 96, 2, 8, 1
    q, k, v = (torch.randn(Bs, T, Hs, n, generator=g, dtype=torch.float64) for n in (Ks, Ks, Vs))
    gk = -10 * torch.rand(Bs, T, Hs, Ks, generator=g, dtype=torch.float64)
    w = torch.randn(Bs, T, Hs, Vs, generator=g, dtype=torch.float64)

    def grad_gk(mode, dtype):
        leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v, gk)]
        o, _ = linear_recurrence(*leaves, mode=mode)
        return torch.autograd.grad((o * w.to(dtype)).sum(), leaves[3])[0].double()

    ref = grad_gk("recurrent", torch.float64)
    err = ((grad_gk("scan", torch.float32) - ref).abs() / ref.abs().clamp_min(1e-30)).flatten()
    assert err.quantile(0.99) < 1e-4, float(err.quantile(0.99))


@pytest.mark.parametrize("decay", ["head", "key"])
def test_scan_second_derivatives_match_recurrent(decay, monkeypatch):
    """create_graph=True (a Hessian-vector product): the scan's backward is then autograd's through the
    reference loop, so the second derivative equals the reference's."""
    monkeypatch.setattr(recurrence_module, "SCAN_CHUNK_BYTES", 1)
    args = make(20, decay, True)

    def hvp(mode):
        leaves = [t.clone().requires_grad_(True) for t in args]
        o, S = run(mode, *leaves)
        g = torch.autograd.grad((o ** 2).sum() + (S ** 2).sum(), leaves, create_graph=True)
        return torch.autograd.grad(sum((gi ** 2).sum() for gi in g), leaves)

    for a, b in zip(hvp("scan"), hvp("recurrent")):
        assert max_abs(a, b) < 1e-9


def test_auto_mode_picks_the_scan_for_small_real_states():
    from seqmix.ops.recurrence import auto_mode

    kw = dict(valuewise=False, chunk_size=32)
    assert auto_mode(300, 16, 1, keywise=True, complex_=False, **kw) == "scan"
    assert auto_mode(300, 16, 1, keywise=True, complex_=True, **kw) == "recurrent"
    assert auto_mode(300, 64, 64, keywise=True, complex_=False, **kw) == "chunk"
    assert auto_mode(1, 16, 1, keywise=True, complex_=False, **kw) == "recurrent"
    assert auto_mode(20, 16, 1, keywise=True, complex_=False, **kw) == "parallel"
    # a diagonal state (value-wise decays, K == 1), however wide V: the scan where its decays need tiles shorter than 16
    assert auto_mode(300, 1, 512, keywise=False, valuewise=True, complex_=False, chunk_size=32, strong_decays=True) == "scan"
    assert auto_mode(300, 1, 512, keywise=False, valuewise=True, complex_=False, chunk_size=32) == "chunk"


def test_step_equals_recurrent():
    q, k, v, gk, gv, S0 = make(9, "key", True)
    o_ref, S_ref = run("recurrent", q, k, v, gk, gv, S0)
    S = S0
    for t in range(9):
        o_t, S = recurrence_step(q[:, t], k[:, t], v[:, t], gk[:, t], gv[:, t], S, scale=0.7)
        assert max_abs(o_t, o_ref[:, t]) < F64_ATOL
    assert max_abs(S, S_ref) < F64_ATOL
    o1, S1 = linear_recurrence(q[:, :1], k[:, :1], v[:, :1], gk[:, :1], gv[:, :1], initial_state=S0, scale=0.7,
                               mode="step", output_final_state=True)
    assert max_abs(o1[:, 0], o_ref[:, 0]) < F64_ATOL


def test_state_carry_equals_one_pass():
    q, k, v, gk, gv, S0 = make(30, "key", True)
    o_ref, S_ref = run("chunk", q, k, v, gk, gv, S0, chunk_size=8)
    cut = 13
    o1, S1 = run("chunk", q[:, :cut], k[:, :cut], v[:, :cut], gk[:, :cut], gv[:, :cut], S0, chunk_size=8)
    o2, S2 = run("parallel", q[:, cut:], k[:, cut:], v[:, cut:], gk[:, cut:], gv[:, cut:], S1)
    assert max_abs(torch.cat([o1, o2], 1), o_ref) < F64_ATOL and max_abs(S2, S_ref) < F64_ATOL


@pytest.mark.parametrize("decay,value_decay", list(itertools.product(DECAYS, [False, True])))
def test_map_reproduces_output(decay, value_decay):
    q, k, v, gk, gv, _ = make(17, decay, value_decay)
    o_ref, _ = linear_recurrence(q, k, v, gk, gv, mode="recurrent", scale=0.7)
    A = recurrence_map(q, k, gk, gv, scale=0.7)
    if gv is None:
        assert A.shape == (B, H, 17, 17)
        o = torch.einsum("bhts,bshv->bthv", A, v)
    else:
        assert A.shape == (B, H * V, 17, 17)
        o = torch.einsum("bhvts,bshv->bthv", A.view(B, H, V, 17, 17), v)
    assert max_abs(o, o_ref) < F64_ATOL
    assert torch.triu(A, 1).abs().max() == 0


@pytest.mark.parametrize("decay", ["head", "key"])
def test_scan_gradcheck_and_saved_memory(decay, monkeypatch):
    """The scan's hand-written backward: gradcheck over several chunks (T = 40 > 2 chunks of at least
    16 steps), and what autograd keeps: the inputs and one state per chunk, not a state per step."""
    monkeypatch.setattr(recurrence_module, "SCAN_CHUNK_BYTES", 1)  # 16-step chunks
    g = torch.Generator().manual_seed(5)
    Bs, T, Hs, Ks, Vs = 1, 40, 1, 2, 2
    q, k, v = (torch.randn(Bs, T, Hs, n, generator=g, dtype=torch.float64) for n in (Ks, Ks, Vs))
    gk = -torch.rand(Bs, T, Hs, *([Ks] if decay == "key" else []), generator=g, dtype=torch.float64)
    gv = -torch.rand(Bs, T, Hs, Vs, generator=g, dtype=torch.float64)
    S0 = torch.randn(Bs, Hs, Ks, Vs, generator=g, dtype=torch.float64)
    leaves = [t.requires_grad_(True) for t in (q, k, v, gk, gv, S0)]
    assert torch.autograd.gradcheck(lambda *xs: run("scan", *xs), leaves)

    def kept(mode):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            run(mode, *leaves)
        return sum(saved)

    inputs = sum(t.numel() for t in leaves[:5])
    chunks = -(-T // recurrence_module.scan_steps(Bs, Hs, Ks, Vs, 8))
    assert chunks >= 2 and kept("scan") <= inputs + chunks * S0.numel()
    assert kept("recurrent") > inputs + T * S0.numel()  # the reference loop's graph keeps every step's state


def test_scan_without_gradient_matches():
    args = make(50, "key", False)
    o_ref, S_ref = run("recurrent", *args)
    with torch.no_grad():
        o, S = run("scan", *args)
    assert max_abs(o, o_ref) < F64_ATOL and max_abs(S, S_ref) < F64_ATOL


def test_auto_mode_runs_and_matches():
    q, k, v, gk, gv, S0 = make(70, "head", False)
    o_ref, _ = run("recurrent", q, k, v, gk, gv, S0)
    o, _ = run("auto", q, k, v, gk, gv, S0, chunk_size=16)
    assert max_abs(o, o_ref) < F64_ATOL


def test_half_precision_computes_in_float32():
    q, k, v, gk, gv, S0 = make(20, "key", False)
    o_ref, _ = run("recurrent", q, k, v, gk, gv, S0)
    args = [None if t is None else t.to(torch.bfloat16) for t in (q, k, v, gk, gv)] + [S0.float()]
    o, S = run("chunk", *args, chunk_size=8)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert rel_err(o.double(), o_ref) < 5e-2  # bfloat16 inputs carry 3 significant digits


def test_backward_of_recurrent_is_linear_in_T():
    """The reference loop uses unbind: the autograd graph holds O(T) nodes, no select_backward."""
    q, k, v, gk, _, _ = make(64, "key", False)
    q.requires_grad_(True)
    o, _ = linear_recurrence(q, k, v, gk, mode="recurrent")
    names = set()
    stack = [o.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in names:
            continue
        names.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    assert not any("Select" in type(f).__name__ for f in names)


BAD = [
    ("q", dict(q=torch.randn(2, 5, 3)), "'q'"),
    ("k shape", dict(k=torch.randn(2, 5, 3, 6)), "'k'"),
    ("v batch", dict(v=torch.randn(3, 5, 3, 4)), "'v'"),
    ("gk shape", dict(gk=-torch.rand(2, 5, 3, 2)), "'gk'"),
    ("gk positive", dict(gk=torch.rand(2, 5, 3) + 0.1), "<= 0"),
    ("gv shape", dict(gv=-torch.rand(2, 5, 3, 5)), "'gv'"),
    ("state shape", dict(initial_state=torch.randn(2, 3, 4, 5)), "'initial_state'"),
    ("nan", dict(v=torch.full((2, 5, 3, 4), float("nan"))), "non-finite"),
    ("inf decay", dict(gk=torch.full((2, 5, 3), float("-inf"))), "non-finite"),
    ("int dtype", dict(q=torch.ones(2, 5, 3, 4, dtype=torch.long)), "dtype"),
    ("mode", dict(mode="fast"), "mode"),
    ("chunk", dict(chunk_size=0), "chunk_size"),
    ("step T", dict(mode="step"), "T == 1"),
]


@pytest.mark.parametrize("what,override,match", BAD, ids=[b[0] for b in BAD])
def test_bad_input(what, override, match):
    args = dict(q=torch.randn(2, 5, 3, 4), k=torch.randn(2, 5, 3, 4), v=torch.randn(2, 5, 3, 4))
    args.update(override)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=match):
        linear_recurrence(q, k, v, **args)


# -- small decay factors (subnormal floats) ----------------------------------------------------


def test_decay_factors_below_the_flush_bound_are_zero():
    x = torch.tensor([0.0, -1.0, -59.9, -60.1, -90.0, -float("inf")])
    f = recurrence_module._decay_exp(x)
    assert torch.equal(f[:3], torch.exp(x[:3])) and torch.equal(f[3:], torch.zeros(3))
    assert torch.equal(recurrence_module._decay_exp(x.double()), torch.exp(x.double()))  # float64's bound: -600
    assert recurrence_module._decay_exp(torch.tensor([-601.0], dtype=torch.float64)).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("per_head", [True, False])
def test_strong_decays_chunk_equals_the_reference(dtype, per_head):
    # decays strong enough that the chunk form's factors fall below e^-60 (Mamba-2 at its initialization): the
    # chunk and parallel forms take them as 0, the reference computes them; outputs, final state and gradients agree
    g = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 96, 2, 8, 4
    q, k, v = (torch.randn(B, T, H, d, generator=g, dtype=dtype) for d in (K, K, V))
    gk = -torch.rand(*((B, T, H) if per_head else (B, T, H, K)), generator=g, dtype=dtype) * 8.0
    S0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    outs = {}
    for mode in ("recurrent", "chunk", "parallel"):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v, gk, S0)]
        o, S = linear_recurrence(*xs[:4], initial_state=xs[4], mode=mode, chunk_size=32, output_final_state=True)
        (o.square().sum() + S.square().sum()).backward()
        outs[mode] = [o.detach(), S.detach()] + [t.grad for t in xs]
    for mode in ("chunk", "parallel"):
        for got, ref in zip(outs[mode], outs["recurrent"]):
            if dtype == torch.float64:
                assert max_abs(got, ref) < F64_ATOL * max(1.0, float(ref.abs().max()))
            else:
                assert rel_err(got, ref) < F32_RTOL
