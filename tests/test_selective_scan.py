"""seqmix.ops.selective_scan: the chunked mode (default) and the fused mode (hand-written
backwards) against the reference loop, in float64, float32 and bfloat16, forward and every
gradient; all of them against Mamba's selective_scan_ref semantics and against linear_recurrence;
the chunked mode's kept memory (chunk-boundary states, not every state)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqmix.ops import backends, linear_recurrence
from seqmix.ops.selective_scan import scan_chunk_size, selective_scan
from tolerances import BF16_MODE_RTOL, F32_RTOL, F64_ATOL, max_abs, rel_err
from scan_inputs import make


@pytest.fixture(autouse=True)
def _torch_modes():
    """This file tests the torch modes: "auto" must not route them to the C++ kernel (which
    tests/test_cpp_scan.py ties to the reference mode)."""
    with backends.auto_uses_torch():
        yield




def run(mode, a, with_state=True, chunk_size=None, loss="both"):
    """Output, final state and the gradients w.r.t. every input of a random projection of
    (y, h_T) (loss "both"), of y alone ("y") or of h_T alone ("h")."""
    y, h = selective_scan(
        a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"],
        initial_state=a["h0"] if with_state else None, output_final_state=True, mode=mode, chunk_size=chunk_size,
    )
    g = torch.Generator().manual_seed(9)
    w = torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)
    wh = torch.randn(h.shape, generator=g, dtype=torch.float64).to(h.dtype)
    terms = {"both": (y * w).sum() + (h * wh).sum(), "y": (y * w).sum(), "h": (h * wh).sum()}
    leaves = [t for t in a.values() if t.requires_grad]
    grads = torch.autograd.grad(terms[loss], leaves, allow_unused=True)
    return y.detach(), h.detach(), grads


def assert_agree(got, ref, tol, measure):
    (y1, h1, g1), (y2, h2, g2) = ref, got
    assert measure(y2, y1) < tol and measure(h2, h1) < tol
    assert len(g1) == len(g2)
    for i, (u, v) in enumerate(zip(g1, g2)):
        if u is None or v is None:  # an input the loss does not reach: None, or zeros from a Function
            assert all(t is None or not t.any() for t in (u, v)), f"gradient {i} missing in one mode"
            continue
        assert v.dtype == u.dtype
        assert measure(v, u) < tol, f"gradient {i}: {measure(v, u):.3g}"


def rel(a, b):
    return rel_err(a.double(), b.double())


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("T", [1, 2, 13])
@pytest.mark.parametrize("with_state", [False, True])
def test_fused_equals_reference_float64(per_channel, T, with_state):
    a = make(T=T, per_channel=per_channel)
    y1, h1, g1 = run("reference", a, with_state)
    y2, h2, g2 = run("fused", a, with_state)
    assert max_abs(y1, y2) < F64_ATOL and max_abs(h1, h2) < F64_ATOL
    for u, v in zip(g1, g2):
        if u is None or v is None:
            assert u is None and v is None
            continue
        assert max_abs(u, v) < F64_ATOL


def test_fused_float32_relative():
    a = make(T=40, D=5, N=6, dtype=torch.float32)
    y1, h1, g1 = run("reference", a)
    y2, h2, g2 = run("fused", a)
    assert y2.dtype == torch.float32
    assert rel_err(y2, y1) < F32_RTOL and rel_err(h2, h1) < F32_RTOL
    for u, v in zip(g1, g2):
        assert rel_err(v, u) < F32_RTOL


# ------------------------------------------------------------------------------------------
# the chunked mode (the default)
# ------------------------------------------------------------------------------------------

# T against the chunk size L: L divides T, does not, L > T, L = 1 (a chunk per step), and the
# automatic L (scan_chunk_size: at least 16, so one short chunk here)
CHUNK_CASES = [(16, 4), (13, 4), (13, 5), (5, 8), (7, 1), (13, None)]


@pytest.mark.parametrize("per_channel", [False, True], ids=["shared_BC", "per_channel_BC"])
@pytest.mark.parametrize("T,L", CHUNK_CASES)
@pytest.mark.parametrize("with_state", [False, True], ids=["h0=0", "h0"])
def test_chunked_equals_reference_float64(per_channel, T, L, with_state):
    a = make(T=T, per_channel=per_channel)
    assert_agree(run("chunked", a, with_state, chunk_size=L), run("reference", a, with_state), F64_ATOL, max_abs)


@pytest.mark.parametrize("loss", ["y", "h"])
def test_chunked_gradients_of_the_output_or_the_final_state_alone(loss):
    a = make(T=11)
    assert_agree(run("chunked", a, chunk_size=4, loss=loss), run("reference", a, loss=loss), F64_ATOL, max_abs)


def test_chunked_with_some_inputs_constant():
    """A, B, C without gradients (the backward skips their sums) and per-channel B with shared C."""
    a = make(T=10)
    for k in ("A", "B", "C"):
        a[k] = a[k].detach()
    a["B"] = a["B"].unsqueeze(2).expand(-1, -1, 3, -1).contiguous() * torch.linspace(0.5, 1.5, 3, dtype=torch.float64).view(1, 1, 3, 1)
    assert_agree(run("chunked", a, chunk_size=3), run("reference", a), F64_ATOL, max_abs)


@pytest.mark.parametrize("per_channel", [False, True], ids=["shared_BC", "per_channel_BC"])
@pytest.mark.parametrize("T,L", [(64, 16), (70, 16), (40, None)])
def test_chunked_float32_relative(per_channel, T, L):
    a = make(T=T, D=5, N=6, per_channel=per_channel, dtype=torch.float32)
    got = run("chunked", a, chunk_size=L)
    assert got[0].dtype == torch.float32
    assert_agree(got, run("reference", a), F32_RTOL, rel_err)


@pytest.mark.parametrize("per_channel", [False, True], ids=["shared_BC", "per_channel_BC"])
@pytest.mark.parametrize("T,L", [(48, 16), (45, 16)])
def test_chunked_bfloat16(per_channel, T, L):
    """bf16 inputs are computed in float32 by every mode, then rounded: the modes agree within
    BF16_MODE_RTOL, outputs and gradients stay bf16."""
    a = make(T=T, D=5, N=6, per_channel=per_channel, dtype=torch.bfloat16)
    got = run("chunked", a, chunk_size=L)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32  # the state stays float32
    assert_agree(got, run("reference", a), BF16_MODE_RTOL, rel)


def test_chunked_under_autocast_equals_float32():
    a = make(T=30, D=4, N=3, dtype=torch.float32)
    plain = run("chunked", a, chunk_size=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = run("chunked", a, chunk_size=8)
    assert_agree(under, plain, F32_RTOL, rel_err)


def test_chunked_without_gradients_equals_reference():
    a = {k: v.detach() for k, v in make(T=21, per_channel=True).items()}
    for L in (1, 4, 21, 64, None):
        y1, h1 = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], initial_state=a["h0"],
                                output_final_state=True, mode="reference")
        y2, h2 = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], initial_state=a["h0"],
                                output_final_state=True, mode="chunked", chunk_size=L)
        assert max_abs(y1, y2) < F64_ATOL and max_abs(h1, h2) < F64_ATOL
        assert y2.is_contiguous()


def test_chunked_is_the_default_and_splits_carry_the_state():
    """mode defaults to chunked; two calls that carry the final state equal one call."""
    a = {k: v.detach() for k, v in make(T=20).items()}
    full, h_full = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], output_final_state=True, chunk_size=3)
    dflt = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], chunk_size=3, mode="chunked")[0]
    assert torch.equal(full, dflt)
    parts = [slice(0, 7), slice(7, 20)]
    h, ys = None, []
    for s in parts:
        y, h = selective_scan(a["x"][:, s], a["delta"][:, s], a["A"], a["B"][:, s], a["C"][:, s], a["D"],
                              initial_state=h, output_final_state=True, chunk_size=3)
        ys.append(y)
    assert max_abs(torch.cat(ys, 1), full) < F64_ATOL and max_abs(h, h_full) < F64_ATOL


def _saved_sizes(mode, a, L=None):
    """The numel of every tensor autograd keeps for the backward of one scan."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], mode=mode, chunk_size=L)
    return sizes


def test_chunked_keeps_chunk_boundary_states_not_every_state():
    """What the backward keeps: fused keeps a and every state (T·B·D·N floats each), chunked the
    n + 1 boundary states ((T/L + 1)·B·D·N) and inputs of O(T·B·(D + N))."""
    Bt, T, D, N, L = 2, 64, 4, 8, 16
    a = make(B=Bt, T=T, D=D, N=N, dtype=torch.float32)
    assert max(_saved_sizes("fused", a)) >= T * Bt * D * N
    sizes = _saved_sizes("chunked", a, L)
    assert (T // L + 1) * Bt * D * N in sizes
    assert max(sizes) <= max(T * Bt * D, T * Bt * N, (T // L + 1) * Bt * D * N) < T * Bt * D * N


def test_scan_chunk_size_rule():
    assert scan_chunk_size(1, 512, 16) == 256  # the LM's Mamba at batch 1: 32 KiB per step
    assert scan_chunk_size(8, 512, 16) == 32
    assert scan_chunk_size(16, 512, 16) == 16
    assert scan_chunk_size(64, 512, 16) == 16  # never below 16
    assert scan_chunk_size(1, 4, 4) == 256  # never above 256
    for b in (1, 3, 7, 100):
        L = scan_chunk_size(b, 100, 16)
        assert 16 <= L <= 256 and L & (L - 1) == 0


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_chunk_size_bad_input(bad):
    a = {k: v.detach() for k, v in make().items()}
    with pytest.raises(ValueError, match="'chunk_size'"):
        selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], chunk_size=bad)


def mamba_reference(u, delta, A, B, C, D, delta_bias):
    """Mamba's selective_scan_ref semantics, channel-first (b, d, l) as there: delta_softplus with
    the bias added inside, deltaA = exp(delta·A), deltaB_u = delta·B·u, y = Σ_n x·C + D·u."""
    delta = F.softplus(delta + delta_bias[..., None])
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    x = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for dA, dBu, C_i in zip(deltaA.unbind(2), deltaB_u.unbind(2), C.unbind(2)):
        x = dA * x + dBu
        ys.append(torch.einsum("bdn,bn->bd", x, C_i))
    return torch.stack(ys, 2) + u * D[:, None]


def test_semantics_equal_mamba_reference():
    g = torch.Generator().manual_seed(3)
    Bt, D, N, L = 2, 5, 4, 17
    u = torch.randn(Bt, D, L, generator=g, dtype=torch.float64)
    dt_pre = torch.randn(Bt, D, L, generator=g, dtype=torch.float64)
    bias = torch.randn(D, generator=g, dtype=torch.float64)
    A = -torch.exp(torch.randn(D, N, generator=g, dtype=torch.float64))
    B = torch.randn(Bt, N, L, generator=g, dtype=torch.float64)
    C = torch.randn(Bt, N, L, generator=g, dtype=torch.float64)
    Dv = torch.randn(D, generator=g, dtype=torch.float64)
    ref = mamba_reference(u, dt_pre, A, B, C, Dv, bias)
    delta = F.softplus(dt_pre + bias[:, None]).transpose(1, 2)
    for mode in ("reference", "chunked", "fused"):
        y, _ = selective_scan(u.transpose(1, 2), delta, A, B.transpose(1, 2), C.transpose(1, 2), Dv, mode=mode)
        assert max_abs(y.transpose(1, 2), ref) < F64_ATOL
        # Mamba's own arguments: the pre-activation, delta_bias and delta_softplus
        y, _ = selective_scan(u.transpose(1, 2), dt_pre.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2), Dv,
                              mode=mode, delta_bias=bias, delta_softplus=True)
        assert max_abs(y.transpose(1, 2), ref) < F64_ATOL


# ------------------------------------------------------------------------------------------
# delta_bias and delta_softplus (Mamba's selective_scan_fn convention)
# ------------------------------------------------------------------------------------------


def _pre(a, softplus, seed=1):
    """a with delta replaced by a pre-activation (|delta + bias| up to 30, across softplus's threshold 20;
    without softplus both >= 0, Δ = delta + bias) and a delta_bias [D] leaf "bias"."""
    g = torch.Generator().manual_seed(seed)
    d = a["delta"].detach()
    bias = torch.randn(d.shape[-1], generator=g, dtype=torch.float64) * 3
    z = torch.rand(d.shape, generator=g, dtype=torch.float64) * 60 - 30
    z.view(-1)[:4] = torch.tensor([20.0, -20.0, 30.0, 20.5], dtype=torch.float64)[: z.numel()]
    delta = z - bias if softplus else z.abs() * 0.05
    bias = bias if softplus else bias.abs()
    return {**a, "delta": delta.to(d.dtype).requires_grad_(True), "bias": bias.to(d.dtype).requires_grad_(True)}


def _run_act(mode, a, softplus, with_bias, chunk_size=None, explicit=False):
    """y, h_T and every gradient (delta's and the bias's included) with Δ from the op's delta_bias /
    delta_softplus, or (explicit) with Δ = F.softplus(delta + bias) formed here and passed as delta."""
    bias = a["bias"] if with_bias else None
    kw = dict(initial_state=a["h0"], output_final_state=True, mode=mode, chunk_size=chunk_size)
    if explicit:
        z = a["delta"] + bias if with_bias else a["delta"]
        y, h = selective_scan(a["x"], F.softplus(z) if softplus else z, a["A"], a["B"], a["C"], a["D"], **kw)
    else:
        y, h = selective_scan(a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"], delta_bias=bias, delta_softplus=softplus, **kw)
    g = torch.Generator().manual_seed(9)
    loss = (y * torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)).sum() + \
        (h * torch.randn(h.shape, generator=g, dtype=torch.float64).to(h.dtype)).sum()
    leaves = [a[k] for k in ("x", "delta", "A", "B", "C", "D", "h0")] + ([bias] if with_bias else [])
    return y.detach(), h.detach(), torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("softplus,with_bias", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("per_channel", [False, True], ids=["shared_BC", "per_channel_BC"])
@pytest.mark.parametrize("mode,T,L", [("reference", 13, None), ("fused", 13, None), ("chunked", 13, 4), ("chunked", 16, 4),
                                      ("chunked", 1, None), ("fused", 1, None)])
def test_delta_bias_softplus_every_mode_float64(mode, T, L, per_channel, softplus, with_bias):
    """Every torch mode with delta_bias / delta_softplus equals the reference mode given Δ =
    F.softplus(delta + delta_bias) explicitly: y, h_T and every gradient, delta's and delta_bias's included."""
    a = _pre(make(T=T, per_channel=per_channel), softplus)
    got = _run_act(mode, a, softplus, with_bias, chunk_size=L)
    assert_agree(got, _run_act("reference", a, softplus, with_bias, explicit=True), F64_ATOL, max_abs)


@pytest.mark.parametrize("mode", ["chunked", "fused"])
def test_delta_bias_softplus_float32_relative(mode):
    a = _pre(make(T=40, D=5, N=6, dtype=torch.float32), True)
    got = _run_act(mode, a, True, True, chunk_size=16)
    assert got[0].dtype == torch.float32 and got[2][-1].dtype == torch.float32
    assert_agree(got, _run_act("reference", a, True, True, explicit=True), F32_RTOL, rel_err)


def test_delta_bias_softplus_values_checks_and_bad_input():
    """With delta_softplus the pre-activation may be negative; delta + delta_bias without softplus must be
    >= 0 (check_values); delta_bias must be a finite floating [D] tensor, delta_softplus a bool."""
    a = {k: v.detach() for k, v in make(D=3).items()}
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    selective_scan(a["x"], -a["delta"] - 5, a["A"], a["B"], a["C"], delta_softplus=True)  # no error
    with pytest.raises(ValueError, match=r"Δ = delta \+ delta_bias >= 0"):
        selective_scan(*args, delta_bias=torch.full((3,), -1.0, dtype=torch.float64))
    for bad, match in [(torch.zeros(4, dtype=torch.float64), r"'delta_bias' must have shape \[D\]"),
                       (torch.zeros(3, 1, dtype=torch.float64), r"'delta_bias' must be \[D\]"),
                       (torch.zeros(3, dtype=torch.int32), "'delta_bias' must have a floating dtype"),
                       (torch.tensor([0.0, float("inf"), 0.0], dtype=torch.float64), "'delta_bias'")]:
        with pytest.raises(ValueError, match=match):
            selective_scan(*args, delta_bias=bad, delta_softplus=True)
    with pytest.raises(ValueError, match="'delta_softplus' must be a bool"):
        selective_scan(*args, delta_softplus=1)


def test_mamba_backend_passes_delta_bias_and_softplus_through(monkeypatch):
    """backends.py's "mamba" run function hands delta_bias (as float32, as its kernel takes it) and
    delta_softplus to selective_scan_fn instead of dropping them (a stand-in module records the call)."""
    import sys
    import types

    seen = {}

    def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False):
        seen.update(delta_bias=delta_bias, delta_softplus=delta_softplus)
        return u

    mod = types.ModuleType("mamba_ssm.ops.selective_scan_interface")
    mod.selective_scan_fn = selective_scan_fn
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.selective_scan_interface", mod)
    a = {k: v.detach() for k, v in make(D=3).items()}
    bias = torch.ones(3, dtype=torch.float64)
    backends.get("mamba").run["selective_scan"](a["x"], a["delta"], a["A"], a["B"], a["C"], None, output_final_state=False,
                                                delta_bias=bias, delta_softplus=True)
    assert seen["delta_softplus"] is True and seen["delta_bias"].dtype == torch.float32 and torch.equal(seen["delta_bias"], bias.float())


def test_equals_linear_recurrence_with_one_head_per_channel():
    a = make(T=11)
    x, delta, A, B, C = (a[k].detach() for k in ("x", "delta", "A", "B", "C"))
    Bt, T, D = x.shape
    N = A.shape[1]
    y, h = selective_scan(x, delta, A, B, C, output_final_state=True)
    o, S = linear_recurrence(
        C.unsqueeze(2).expand(Bt, T, D, N), delta.unsqueeze(-1) * B.unsqueeze(2), x.unsqueeze(-1),
        delta.unsqueeze(-1) * A, output_final_state=True, mode="recurrent",
    )
    assert max_abs(y, o[..., 0]) < F64_ATOL and max_abs(h, S[..., 0]) < F64_ATOL


def test_bad_input():
    a = {k: v.detach() for k, v in make().items()}
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="'A'"):
        selective_scan(a["x"], a["delta"], -a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="'delta'"):
        selective_scan(a["x"], -a["delta"], a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="'B'"):
        selective_scan(a["x"], a["delta"], a["A"], a["B"][..., :2], a["C"])
    with pytest.raises(ValueError, match="'initial_state'"):
        selective_scan(*args, initial_state=a["h0"][:, :2])
    with pytest.raises(ValueError, match="mode"):
        selective_scan(*args, mode="parallel")
    with pytest.raises(ValueError, match="'x'"):
        selective_scan(a["x"].masked_fill(a["x"] > 1, float("nan")), a["delta"], a["A"], a["B"], a["C"])
