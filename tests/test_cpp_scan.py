"""The "cpp" backend of seqmix.ops.selective_scan (seqmix.ops.cpp_scan, a fused C++ CPU kernel)
against the torch reference mode: forward, final state and every gradient in float64 (tight)
and float32 (relative), bfloat16 inputs, gradcheck, the dispatch (auto picks it on CPU, the
refusals and their reasons, SEQMIX_CPP=0, a failed compile), and S6 mixers training with it.

Skips (with the reason) where the kernel cannot be built: no C++ compiler or no ninja."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.ops import backends, cpp_scan
from seqmix.ops.selective_scan import selective_scan
from tolerances import BF16_MODE_RTOL, rel_err
from scan_inputs import make

#: cpp vs reference in float64: the same arithmetic in another order (sums over n, t, b)
CPP_F64_ATOL = 1e-10
#: cpp vs the float64 reference, inputs in float32: max|a - b| / max|b|
CPP_F32_RTOL = 1e-5


def _why_not_built() -> str | None:
    ok, why = cpp_scan.available()
    if not ok:
        return why
    try:
        cpp_scan.load()
    except RuntimeError as e:
        return str(e)
    return None


_WHY = _why_not_built()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"the C++ selective scan cannot be built here: {_WHY}")




def run(backend, a, *, with_state=True, with_D=True, mode="chunked", chunk_size=None, loss="both"):
    """y, h_T and the gradients of a fixed random projection of (y, h_T) w.r.t. every input."""
    y, h = selective_scan(
        a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"] if with_D else None,
        initial_state=a["h0"] if with_state else None, output_final_state=True,
        mode=mode, chunk_size=chunk_size, backend=backend,
    )
    g = torch.Generator().manual_seed(9)
    w = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)
    wh = torch.randn(h.shape, generator=g, dtype=torch.float64).to(h.dtype)
    terms = {"both": (y * w).sum() + (h * wh).sum(), "y": (y * w).sum(), "h": (h * wh).sum()}
    leaves = [a[k] for k in ("x", "delta", "A", "B", "C")] + ([a["D"]] if with_D else []) + ([a["h0"]] if with_state else [])
    grads = torch.autograd.grad(terms[loss], leaves, allow_unused=True)
    return y.detach(), h.detach(), grads


def reference(a, **kw):
    return run("torch", a, mode="reference", **{k: v for k, v in kw.items() if k != "chunk_size"})


def assert_close(got, ref, measure, tol):
    (y, h, g), (y0, h0, g0) = got, ref
    assert y.dtype == y0.dtype and h.dtype == h0.dtype
    assert measure(y, y0) < tol, f"y: {measure(y, y0):.3g}"
    assert measure(h, h0) < tol, f"h_T: {measure(h, h0):.3g}"
    assert len(g) == len(g0)
    for i, (u, v) in enumerate(zip(g, g0)):
        if u is None or v is None:  # an input the loss does not reach: None, or zeros from a Function
            assert all(t is None or not t.any() for t in (u, v)), f"gradient {i} missing in one path"
            continue
        assert u.dtype == v.dtype and u.shape == v.shape
        assert measure(u, v) < tol, f"gradient {i}: {measure(u, v):.3g}"


def max_abs(a, b):
    return float((a.detach().double() - b.detach().double()).abs().max())


# ------------------------------------------------------------------------------------------
# numerics against the reference mode
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("B_channels,C_channels", [(False, False), (True, True), (False, True), (True, False)])
@pytest.mark.parametrize("T,chunk_size", [(1, None), (13, 5), (13, 13), (70, None), (9, 1)])
@pytest.mark.parametrize("with_state", [False, True])
def test_float64_equals_reference(B_channels, C_channels, T, chunk_size, with_state):
    """T = 13 in chunks of 5 and T = 70 in the default 64: the last chunk is shorter."""
    a = make(T=T, D=5, N=6, B_channels=B_channels, C_channels=C_channels)
    got = run("cpp", a, with_state=with_state, chunk_size=chunk_size)
    assert_close(got, reference(a, with_state=with_state), max_abs, CPP_F64_ATOL)


@pytest.mark.parametrize("loss", ["y", "h"])
def test_float64_no_D_and_one_output_used(loss):
    """D None (no gradient for it); a loss on y alone or on the final state alone (the other
    output's gradient reaches the backward as None)."""
    a = make(T=11, D=40, N=4)  # D > the kernel's block of 32 channels: two blocks, one partial
    got = run("cpp", a, with_D=False, chunk_size=4, loss=loss)
    assert_close(got, reference(a, with_D=False, loss=loss), max_abs, CPP_F64_ATOL)


@pytest.mark.parametrize("N", [1, 8, 16, 19])
def test_float64_state_sizes(N):
    a = make(B=3, T=20, D=4, N=N)
    assert_close(run("cpp", a, chunk_size=8), reference(a), max_abs, CPP_F64_ATOL)


def _scalar_A(a):
    """a's A replaced by one value per channel repeated over n (dsf_ssd passes A.expand(D, N)): a leaf
    [D, 1] expanded, so that its gradient is the sum over n, as the mixer's."""
    A1 = a["A"].detach()[:, :1].clone().requires_grad_(True)
    return {**a, "A": A1.expand_as(a["A"]), "A_leaf": A1}


@pytest.mark.parametrize("keep_all", [True, False])
@pytest.mark.parametrize("B_channels,C_channels", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("N", [4, 5, 8, 16, 17])
@pytest.mark.parametrize("D", [1, 5, 13, 33, 69])
def test_float64_channel_and_state_counts(monkeypatch, D, N, B_channels, C_channels, keep_all):
    """The kernel runs blocks of BLOCK (32) channels as SIMD lanes: channel counts below one block, not
    a multiple of the vector width (8 float32 / 4 float64) or of the block, and 2-3 blocks with a partial
    last one; N of the compiled-for sizes and others; shared, per-channel and mixed B / C; with h0 and
    the final state; the backward reading every kept state (small scans) or recomputing the chunks."""
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 1 << 21 if keep_all else 0)
    a = make(B=2, T=11, D=D, N=N, B_channels=B_channels, C_channels=C_channels, seed=D * 100 + N)
    assert_close(run("cpp", a, chunk_size=4), reference(a), max_abs, CPP_F64_ATOL)


@pytest.mark.parametrize("keep_all", [True, False])
@pytest.mark.parametrize("D,N,per_channel", [(5, 8, False), (40, 16, False), (13, 5, True), (64, 8, False)])
def test_float64_A_constant_over_n(monkeypatch, D, N, per_channel, keep_all):
    """A[d, n] equal over n (dsf_ssd's scalar A): the kernel computes exp(Δ A) once per (t, d) and keeps
    one decay per (t, d); outputs and gradients (A's summed over n by the expand) as the reference."""
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 1 << 21 if keep_all else 0)
    a = _scalar_A(make(B=2, T=19, D=D, N=N, per_channel=per_channel, seed=3))

    def grads(backend, **kw):
        y, h = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], initial_state=a["h0"],
                              output_final_state=True, backend=backend, **kw)
        g = torch.Generator().manual_seed(9)
        loss = (y * torch.randn(y.shape, generator=g, dtype=y.dtype)).sum() + (h * torch.randn(h.shape, generator=g, dtype=h.dtype)).sum()
        leaves = [a[k] for k in ("x", "delta", "A_leaf", "B", "C", "D", "h0")]
        return y.detach(), h.detach(), torch.autograd.grad(loss, leaves)

    assert_close(grads("cpp", chunk_size=8), grads("torch", mode="reference"), max_abs, CPP_F64_ATOL)


def test_A_constant_over_n_in_some_channels_only():
    """Rows of A constant over n in some channels but not all (and -0.0 beside 0.0): the general path,
    still the reference's values."""
    a = make(B=2, T=15, D=9, N=6, seed=4)
    A = a["A"].detach().clone()
    A[:4] = A[:4, :1]
    A[4, :3], A[4, 3:] = 0.0, -0.0
    a["A"] = A.requires_grad_(True)
    assert_close(run("cpp", a, chunk_size=4), reference(a), max_abs, CPP_F64_ATOL)


@pytest.mark.parametrize("scalar_A", [False, True])
def test_float32_main_job_shape(scalar_A):
    """The main job's size (batch 16, T 32, d 64, n 8, shared B / C; S6's A and SSD's scalar A), float32
    against the float64 reference, relative."""
    a64 = make(B=16, T=32, D=64, N=8, seed=5)
    if scalar_A:
        a64["A"] = a64["A"].detach()[:, :1].expand(64, 8).contiguous().requires_grad_(True)
    a32 = {k: v.detach().float().requires_grad_(True) for k, v in a64.items()}
    y, h, g = run("cpp", a32)
    y0, h0, g0 = reference(a64)
    assert rel_err(y.double(), y0) < CPP_F32_RTOL and rel_err(h.double(), h0) < CPP_F32_RTOL
    for i, (u, v) in enumerate(zip(g, g0)):
        assert rel_err(u.double(), v) < CPP_F32_RTOL, f"gradient {i}: {rel_err(u.double(), v):.3g}"


@pytest.mark.parametrize("per_channel", [False, True])
def test_float32_relative_to_float64_reference(per_channel):
    a64 = make(B=2, T=100, D=37, N=16, B_channels=per_channel, C_channels=per_channel)
    a32 = {k: v.detach().float().requires_grad_(True) for k, v in a64.items()}
    y, h, g = run("cpp", a32)
    y0, h0, g0 = reference(a64)
    assert y.dtype == torch.float32 and h.dtype == torch.float32
    assert rel_err(y.double(), y0) < CPP_F32_RTOL and rel_err(h.double(), h0) < CPP_F32_RTOL
    for i, (u, v) in enumerate(zip(g, g0)):
        assert u.dtype == torch.float32
        assert rel_err(u.double(), v) < CPP_F32_RTOL, f"gradient {i}: {rel_err(u.double(), v):.3g}"


def test_bfloat16_inputs_against_float32_reference():
    """bf16 inputs are computed in float32 and y rounded back to bf16 (the final state stays
    float32), like the torch modes: within one bf16 rounding of the float32 reference."""
    a32 = make(T=40, D=5, N=6, dtype=torch.float32)
    a16 = {k: v.detach().bfloat16().requires_grad_(True) for k, v in a32.items()}
    ref = reference({k: v.detach().float().requires_grad_(True) for k, v in a16.items()})
    y, h, g = run("cpp", a16)
    assert y.dtype == torch.bfloat16 and h.dtype == torch.float32
    assert rel_err(y.float(), ref[0]) < BF16_MODE_RTOL and rel_err(h, ref[1]) < BF16_MODE_RTOL
    for u, v in zip(g, ref[2]):
        assert u.dtype == torch.bfloat16
        assert rel_err(u.float(), v) < BF16_MODE_RTOL


def test_no_gradient_path_and_decoding_step():
    """Without autograd the forward alone runs (no states kept); T = 1 steps carried one by
    one equal the full pass."""
    a = make(T=9, D=4, N=3)
    with torch.no_grad():
        y_full, h_full = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], initial_state=a["h0"],
                                        output_final_state=True, backend="cpp")
        h, ys = a["h0"], []
        for t in range(9):
            s = slice(t, t + 1)
            y, h = selective_scan(a["x"][:, s], a["delta"][:, s], a["A"], a["B"][:, s], a["C"][:, s], a["D"],
                                  initial_state=h, output_final_state=True, backend="cpp")
            ys.append(y)
    assert max_abs(torch.cat(ys, 1), y_full) < CPP_F64_ATOL and max_abs(h, h_full) < CPP_F64_ATOL
    assert not y_full.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("N,per_channel,scalar_A", [(8, False, False), (16, True, False), (5, False, False), (8, False, True)])
def test_kept_states_give_the_recomputed_bits(monkeypatch, dtype, N, per_channel, scalar_A):
    """A small scan keeps every state and decay for its backward (cpp_scan.KEEP_ALL_FLOATS); a larger
    one keeps the chunks' first states and recomputes the rest: outputs and gradients are the same
    bits either way (the same arithmetic), for several N, per-channel B / C and A constant over n
    (one decay per (t, d) kept); D = 40: a full block of channels and a partial one."""
    a = make(B=3, T=45, D=40, N=N, per_channel=per_channel, dtype=dtype)
    if scalar_A:
        a["A"] = a["A"].detach()[:, :1].expand(40, N).contiguous().requires_grad_(True)
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 1 << 21)
    kept = run("cpp", a, chunk_size=16)
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 0)
    recomputed = run("cpp", a, chunk_size=16)
    assert_close(kept, recomputed, max_abs, 1e-300)  # max |a - b| = 0
    for u, v in zip(kept[2], recomputed[2]):
        assert torch.equal(u, v)


@pytest.mark.parametrize("per_channel", [False, True])
def test_gradcheck(per_channel):
    a = make(B=2, T=5, D=3, N=2, B_channels=per_channel, C_channels=per_channel)

    def f(x, delta, A, Bm, Cm, Dv, h0):
        return selective_scan(x, delta, A, Bm, Cm, Dv, initial_state=h0, output_final_state=True,
                              chunk_size=2, backend="cpp", check_values=False)

    assert torch.autograd.gradcheck(f, tuple(a[k] for k in ("x", "delta", "A", "B", "C", "D", "h0")))


# ------------------------------------------------------------------------------------------
# delta_bias and delta_softplus computed in the kernel
# ------------------------------------------------------------------------------------------


def pre_activations(a, *, softplus, seed=0):
    """a's delta replaced by pre-activations z - delta_bias spanning |z| <= 30 (both sides of softplus's
    threshold 20, and z = ±20 exactly, ±19.5, ±20.5, 0), and a delta_bias [D]; without softplus Δ = delta +
    delta_bias itself must be >= 0 (the scan's Δ), so both are drawn >= 0."""
    g = torch.Generator().manual_seed(seed)
    d = a["delta"].detach()
    bias = torch.randn(d.shape[-1], generator=g, dtype=torch.float64) * 3
    z = (torch.rand(d.shape, generator=g, dtype=torch.float64) * 60 - 30).to(d.dtype)
    special = torch.tensor([20.0, -20.0, 19.5, 20.5, -19.5, -20.5, 0.0, 30.0, -30.0], dtype=d.dtype)
    flat = z.view(-1)
    flat[: min(flat.numel(), special.numel())] = special[: flat.numel()]
    if softplus:
        delta = z - bias.to(d.dtype)
    else:
        bias, delta = bias.abs(), (z.abs() * 0.05)  # Δ = delta + bias in [0, 4.5]: decays that do not vanish
    return {**a, "delta": delta.requires_grad_(True), "bias": bias.to(d.dtype).requires_grad_(True)}


def run_act(backend, a, *, softplus, with_bias=True, mode="chunked", chunk_size=None):
    """As run(), with delta_bias (a["bias"], or None) and delta_softplus; the gradients of every input,
    delta_bias's last when given."""
    bias = a["bias"] if with_bias else None
    y, h = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], initial_state=a["h0"],
                          output_final_state=True, mode=mode, chunk_size=chunk_size, backend=backend,
                          delta_bias=bias, delta_softplus=softplus)
    g = torch.Generator().manual_seed(9)
    w = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)
    wh = torch.randn(h.shape, generator=g, dtype=torch.float64).to(h.dtype)
    leaves = [a[k] for k in ("x", "delta", "A", "B", "C", "D", "h0")] + ([bias] if with_bias else [])
    grads = torch.autograd.grad((y * w).sum() + (h * wh).sum(), leaves)
    return y.detach(), h.detach(), grads


@pytest.mark.parametrize("keep_all", [True, False])
@pytest.mark.parametrize("softplus,with_bias", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("B_channels,C_channels", [(False, False), (True, True)])
@pytest.mark.parametrize("T,D,chunk_size", [(13, 5, 5), (70, 40, None), (1, 3, None), (9, 33, 1)])
def test_float64_delta_bias_softplus_equals_reference(monkeypatch, T, D, chunk_size, B_channels, C_channels, softplus,
                                                      with_bias, keep_all):
    """Δ = softplus(delta + delta_bias) (or delta + delta_bias, or softplus(delta)) in the kernel against the
    reference mode, which applies F.softplus first in torch: y, h_T and every gradient, delta's (the
    pre-activation's) and delta_bias's included; pre-activations across the threshold 20 and up to |z| = 30;
    the backward reading every kept state or recomputing the chunks (of 5, 64, 1 steps; T = 70: groups of
    16 steps that end inside a chunk); a partial block of channels (D = 5, 40, 33)."""
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 1 << 21 if keep_all else 0)
    a = pre_activations(make(B=2, T=T, D=D, N=8, B_channels=B_channels, C_channels=C_channels, seed=T + D), softplus=softplus)
    got = run_act("cpp", a, softplus=softplus, with_bias=with_bias, chunk_size=chunk_size)
    ref = run_act("torch", a, softplus=softplus, with_bias=with_bias, mode="reference")
    assert_close(got, ref, max_abs, CPP_F64_ATOL)


@pytest.mark.parametrize("keep_all", [True, False])
@pytest.mark.parametrize("scalar_A", [False, True])
def test_float32_delta_softplus_main_job_shape(monkeypatch, scalar_A, keep_all):
    """The main job's S6 call (batch 16, T 32, d 64, n 8, shared B / C, delta_bias and softplus): float32
    inputs against the float64 reference, relative, every gradient."""
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 1 << 21 if keep_all else 0)
    a64 = pre_activations(make(B=16, T=32, D=64, N=8, seed=5), softplus=True, seed=5)
    if scalar_A:
        a64["A"] = a64["A"].detach()[:, :1].expand(64, 8).contiguous().requires_grad_(True)
    a32 = {k: v.detach().float().requires_grad_(True) for k, v in a64.items()}
    y, h, g = run_act("cpp", a32, softplus=True)
    y0, h0, g0 = run_act("torch", a64, softplus=True, mode="reference")
    assert y.dtype == torch.float32 and all(u.dtype == torch.float32 for u in g)
    assert rel_err(y.double(), y0) < CPP_F32_RTOL and rel_err(h.double(), h0) < CPP_F32_RTOL
    for i, (u, v) in enumerate(zip(g, g0)):
        assert rel_err(u.double(), v) < CPP_F32_RTOL, f"gradient {i}: {rel_err(u.double(), v):.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("per_channel", [False, True])
def test_kept_states_give_the_recomputed_bits_with_softplus(monkeypatch, dtype, per_channel):
    """With delta_bias and softplus: the backward reading every kept state or recomputing the chunks (Δ
    evaluated again in groups that start at other steps than the forward's: chunks of 12) gives the same
    bits, and a scan without a gradient the same outputs."""
    a = pre_activations(make(B=3, T=45, D=40, N=8, per_channel=per_channel, dtype=dtype), softplus=True)
    outs = []
    for keep_all in (1 << 21, 0):
        monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", keep_all)
        outs.append(run_act("cpp", a, softplus=True, chunk_size=12))
    with torch.no_grad():
        y, h = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], initial_state=a["h0"], output_final_state=True,
                              chunk_size=12, backend="cpp", delta_bias=a["bias"], delta_softplus=True)
    assert torch.equal(y, outs[0][0]) and torch.equal(h, outs[0][1])
    for y, h, g in outs[1:]:
        assert torch.equal(y, outs[0][0]) and torch.equal(h, outs[0][1])
        assert all(torch.equal(u, v) for u, v in zip(g, outs[0][2]))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-15), (torch.float32, 3e-7)])
def test_kernel_softplus_and_its_derivative(dtype, tol):
    """The kernel's softplus and σ one value at a time: with T = 1, h0 = 0, x = B = C = 1, y = Δ and
    dy/d(delta) = σ(z). Against torch's float64 F.softplus / sigmoid on a fine grid of z in [-30, 30]
    (the threshold 20: Δ = z and σ = 1 above it, as torch's softplus and its backward), relative to
    each value: float64 to rounding, float32 within a few ulp (exp_s and the log1p series)."""
    z = torch.cat([torch.linspace(-30, 30, 6001, dtype=torch.float64),
                   torch.tensor([20.0, 20.0 + 1e-6, 20.0 - 1e-6, -20.0, 1e-7, -1e-7, 0.0], dtype=torch.float64)])
    D = z.numel()
    x = torch.ones(1, 1, D, dtype=dtype)
    delta = z.to(dtype).view(1, 1, D).requires_grad_(True)
    A = -torch.ones(D, 1, dtype=dtype)
    ones = torch.ones(1, 1, 1, dtype=dtype)
    y, _ = selective_scan(x, delta, A, ones, ones, delta_softplus=True, backend="cpp")
    (dz,) = torch.autograd.grad(y.sum(), delta)
    zq = z.to(dtype).double()  # the values the kernel saw
    ref = torch.where(zq > 20, zq, torch.nn.functional.softplus(zq))
    sig = torch.where(zq > 20, torch.ones_like(zq), torch.sigmoid(zq))
    assert float(((y.detach().view(-1).double() - ref) / ref).abs().max()) < tol
    assert float(((dz.view(-1).double() - sig) / sig).abs().max()) < tol


def test_delta_bias_bad_input():
    a = make(D=3)
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    for bad, match in [(torch.zeros(4, dtype=torch.float64), r"argument 'delta_bias' must (be|have shape) \[D\]"),
                       (torch.zeros(1, 3, dtype=torch.float64), r"argument 'delta_bias' must (be|have shape) \[D\]"),
                       (torch.zeros(3, dtype=torch.int64), "argument 'delta_bias' must have a floating dtype"),
                       (torch.zeros(3, dtype=torch.complex64), "argument 'delta_bias' must have a floating dtype"),
                       ([0.0, 0.0, 0.0], "argument 'delta_bias' must be a torch.Tensor")]:
        with pytest.raises(ValueError, match=match):
            selective_scan(*args, delta_bias=bad, delta_softplus=True, backend="cpp")
    with pytest.raises(ValueError, match="argument 'delta_softplus' must be a bool"):
        selective_scan(*args, delta_softplus="yes", backend="cpp")
    with pytest.raises(ValueError, match="argument 'delta_bias'"):
        selective_scan(*args, delta_bias=torch.tensor([0.0, float("nan"), 0.0], dtype=torch.float64), backend="cpp")


def test_gradcheck_delta_bias_softplus():
    a = pre_activations(make(B=2, T=5, D=3, N=2), softplus=True)

    def f(x, delta, A, Bm, Cm, Dv, h0, bias):
        return selective_scan(x, delta, A, Bm, Cm, Dv, initial_state=h0, output_final_state=True, chunk_size=2,
                              backend="cpp", check_values=False, delta_bias=bias, delta_softplus=True)

    # z spread by ±30 would sit on softplus's flat or linear parts: gradcheck at moderate z
    a["delta"] = (a["delta"].detach() * 0.1).requires_grad_(True)
    assert torch.autograd.gradcheck(f, tuple(a[k] for k in ("x", "delta", "A", "B", "C", "D", "h0", "bias")))


# ------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------


def test_auto_picks_cpp_on_cpu_and_torch_where_it_does_not_cover(monkeypatch):
    call = backends.Call("selective_scan", "cpu", torch.float32, "chunked", dict(initial_state=True, per_channel_BC=True))
    assert backends.resolve("selective_scan", "auto", call).name == "cpp"
    for c in (backends.Call("selective_scan", "cpu", torch.float32, "reference"),
              backends.Call("selective_scan", "cpu", torch.complex64, "chunked")):
        assert backends.resolve("selective_scan", "auto", c).name == "torch"
    with backends.auto_uses_torch():
        assert backends.resolve("selective_scan", "auto", call).name == "torch"
    called = []
    real = backends.get("cpp").run["selective_scan"]
    monkeypatch.setitem(backends.get("cpp").run, "selective_scan", lambda *a, **k: called.append(1) or real(*a, **k))
    a = make()
    selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"])
    assert called == [1]
    selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], mode="reference")
    assert called == [1]


def test_what_cpp_covers():
    covers = backends.get("cpp").covers
    assert "runs on CPU, the inputs are on cuda" in covers(backends.Call("selective_scan", "cuda", torch.float32, "chunked"))
    assert "float32 or float64" in covers(backends.Call("selective_scan", "cpu", torch.complex64, "chunked"))
    assert "reference" in covers(backends.Call("selective_scan", "cpu", torch.float64, "reference"))
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for mode in ("chunked", "fused"):
            assert covers(backends.Call("selective_scan", "cpu", dt, mode, dict(initial_state=True, per_channel_BC=True))) is None
    rows = [r for r in backends.listing() if r["backend"] == "cpp"]
    assert [r["op"] for r in rows] == ["selective_scan"] and rows[0]["installed"]


def test_bad_input_gives_the_ops_value_error():
    a = make()
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="argument 'B' must be"):
        selective_scan(a["x"], a["delta"], a["A"], a["B"][..., :2], a["C"], backend="cpp")
    with pytest.raises(ValueError, match="initial_state"):
        selective_scan(*args, initial_state=a["h0"][:, :2], backend="cpp")
    with pytest.raises(ValueError, match="backend 'cpp' does not cover this call: mode 'reference'"):
        selective_scan(*args, mode="reference", backend="cpp")


def test_switched_off_by_env(monkeypatch):
    monkeypatch.setenv("SEQMIX_CPP", "0")
    a = make()
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    call = backends.Call("selective_scan", "cpu", torch.float64, "chunked")
    assert backends.resolve("selective_scan", "auto", call).name == "torch"
    with pytest.raises(ValueError, match="backend 'cpp' is not installed: switched off by SEQMIX_CPP=0"):
        selective_scan(*args, backend="cpp")
    assert any(r["backend"] == "cpp" and not r["installed"] for r in backends.listing())


def test_failed_compile_falls_back_under_auto_and_is_explained_when_asked(monkeypatch):
    def broken():
        raise RuntimeError("the C++ kernel failed to compile (stand-in error)")

    monkeypatch.setattr(cpp_scan, "load", broken)
    a = make()
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    call = backends.Call("selective_scan", "cpu", torch.float64, "chunked")
    assert backends.resolve("selective_scan", "auto", call).name == "torch"
    y = selective_scan(*args)[0]  # silently the torch path
    assert max_abs(y, selective_scan(*args, backend="torch")[0]) == 0
    with pytest.raises(ValueError, match=r"backend 'cpp' is not available: the C\+\+ kernel failed to compile \(stand-in"):
        selective_scan(*args, backend="cpp")


def test_isa_picks_the_widest_the_cpu_has_and_the_env_caps_it(monkeypatch):
    monkeypatch.delenv("SEQMIX_CPP_ISA", raising=False)
    full = ["fpu", "sse4_2", "avx2", "fma", "avx512f", "avx512dq", "avx512vl"]
    assert cpp_scan.isa(full) == "avx512"
    assert cpp_scan.isa([f for f in full if f != "avx512vl"]) == "avx2"  # AVX-512 needs all three of its features
    assert cpp_scan.isa(["sse4_2", "avx2"]) == "generic"  # AVX2 without FMA
    monkeypatch.setenv("SEQMIX_CPP_ISA", "avx2")
    assert cpp_scan.isa(full) == "avx2"
    monkeypatch.setenv("SEQMIX_CPP_ISA", "generic")
    assert cpp_scan.isa(full) == "generic"
    monkeypatch.setenv("SEQMIX_CPP_ISA", "avx1024")
    with pytest.raises(ValueError, match="SEQMIX_CPP_ISA = 'avx1024': expected one of avx512, avx2, generic"):
        cpp_scan.isa(full)


def test_keep_all_threshold_follows_the_build(monkeypatch):
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", None)
    monkeypatch.setattr(cpp_scan, "isa", lambda: "avx512")
    assert cpp_scan.keep_all_floats() == 0
    monkeypatch.setattr(cpp_scan, "isa", lambda: "avx2")
    assert cpp_scan.keep_all_floats() == 1 << 21
    monkeypatch.setattr(cpp_scan, "KEEP_ALL_FLOATS", 123)
    assert cpp_scan.keep_all_floats() == 123


_OTHER_BUILD = """
import torch
from seqmix.ops import cpp_scan
from scan_inputs import make
import test_cpp_scan as t
assert cpp_scan.isa() == "{isa}", cpp_scan.isa()
for keep in (0, 1 << 21):
    cpp_scan.KEEP_ALL_FLOATS = keep
    for per_channel in (False, True):
        a64 = make(B=2, T=21, D=40, N=8, B_channels=per_channel, C_channels=per_channel, seed=5)
        ref = t.reference(a64)
        t.assert_close(t.run("cpp", a64, chunk_size=8), ref, t.max_abs, t.CPP_F64_ATOL)
        a32 = {{k: v.detach().float().requires_grad_(True) for k, v in a64.items()}}
        y, h, g = t.run("cpp", a32, chunk_size=8)
        for u, v in zip((y, h, *g), (ref[0], ref[1], *ref[2])):
            assert t.rel_err(u.double(), v) < t.CPP_F32_RTOL, (keep, per_channel, t.rel_err(u.double(), v))
print("ok")
"""


@pytest.mark.parametrize("other", ["avx2", "generic"])
def test_narrower_builds_equal_the_reference(other):
    """The kernel built for a narrower instruction set than this CPU's widest (SEQMIX_CPP_ISA; a
    separate build, compiled in a subprocess) against the torch reference, float64 and float32,
    keeping every state and recomputing the chunks."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    order = [*cpp_scan.ISA_FLAGS, "generic"]
    if order.index(cpp_scan.isa()) >= order.index(other):
        pytest.skip(f"this CPU's widest build is {cpp_scan.isa()}: the default build already is {other} or narrower")
    here = Path(__file__).parent
    env = {**os.environ, "SEQMIX_CPP_ISA": other, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _OTHER_BUILD.format(isa=other)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


_LOAD_AND_RUN = """
from seqmix.ops import cpp_scan
from scan_inputs import make
import test_cpp_scan as t
a = make(B=1, T=9, D=8, N=4, seed=3)
t.assert_close(t.run("cpp", a, chunk_size=4), t.reference(a), t.max_abs, t.CPP_F64_ATOL)
print("ok")
"""


def test_a_build_lock_left_by_a_killed_process_does_not_block_loading(tmp_path, monkeypatch):
    """torch's cpp_extension.load() holds a lock file in the build's folder while it checks the build; a process
    killed there (a sweep worker stopped with SIGKILL) leaves it, and every later load() would wait on it forever.
    A process finding the build made imports it without the lock: here a copy of the build beside a planted lock,
    in an extensions folder of the test's own (TORCH_EXTENSIONS_DIR), loads and computes the reference's numbers."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from torch.utils import cpp_extension

    name = cpp_scan._name()
    built = Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    folder = Path(cpp_extension._get_build_directory(name, verbose=False))
    assert folder != built.parent and str(folder).startswith(str(tmp_path))
    shutil.copy(built, folder / built.name)
    (folder / "lock").touch()  # what a process killed inside cpp_extension.load() leaves
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    try:
        out = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN], env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("cpp_scan.load() waited on the stale build lock")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    assert "compiling" not in out.stderr  # the build was imported, not made again


# ------------------------------------------------------------------------------------------
# S6 mixers train with it
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["s6", "mamba", "dsf_ssd", "falcon_mamba", "jamba_mamba"])
def test_s6_mixers_gradients_equal_the_torch_path(name, monkeypatch):
    """The mixer's default path ("auto" -> cpp on CPU; S6 passes Δ's pre-activation with delta_bias = b_Δ
    and delta_softplus, dsf_ssd's shared [B, T, 1] one expanded) against the same mixer with auto held to
    the torch modes, float64: outputs and every parameter gradient (b_Δ's included)."""
    calls = []
    real = backends.get("cpp").run["selective_scan"]
    monkeypatch.setitem(backends.get("cpp").run, "selective_scan", lambda *a, **k: calls.append(k) or real(*a, **k))
    torch.manual_seed(0)
    kw = {"dt_rank": 4} if name in ("falcon_mamba", "jamba_mamba") else {}  # their presets' example (rank-1 RMS is a sign)
    m = seqmix.build_mixer(name, d_model=16, d_state=4, **kw).double()
    x = torch.randn(3, 21, 16, dtype=torch.float64)

    def fwd_bwd():
        m.zero_grad()
        y = m(x)
        (y * torch.sin(torch.arange(y.numel(), dtype=y.dtype)).view_as(y)).sum().backward()
        return y.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None]

    y1, g1 = fwd_bwd()
    with backends.auto_uses_torch():
        y0, g0 = fwd_bwd()
    assert calls and all(k.get("delta_softplus") is True and k.get("delta_bias") is m.dt_bias for k in calls)
    assert max_abs(y1, y0) < CPP_F64_ATOL
    assert len(g1) == len(g0) > 0 and m.dt_bias.grad is not None
    for u, v in zip(g1, g0):
        assert max_abs(u, v) < CPP_F64_ATOL


def test_two_layer_s6_model_trains():
    """A few Adam steps of a 2-layer S6 language model on a fixed batch lower the loss."""
    from seqmix.models.build import build_model

    torch.manual_seed(0)
    model = build_model({"mixer": "s6", "mixer_kwargs": {"d_state": 8}, "d_model": 32, "n_layers": 2,
                         "vocab_size": 32, "max_seq_len": 32})
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 32, (4, 24))
    losses = []
    for _ in range(8):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
