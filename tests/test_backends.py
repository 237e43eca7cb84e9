"""The backend dispatch (seqmix.ops.backends): fallback, refusals, listing, CLI; the CUDA
comparisons of every backend against the torch path skip without CUDA or the library."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from seqmix.ops import backends, causal_conv1d, linear_recurrence, selective_scan, softmax_attention
from tolerances import F32_RTOL, max_abs, rel_err


def installed(mod: str) -> bool:
    """Whether ``mod`` imports (as the backend imports it: fla's ops need triton, so
    flash-linear-attention installed for its naive references alone does not count)."""
    try:
        importlib.import_module(mod)
        return True
    except Exception:  # ImportError, or whatever a half-installed package raises at import
        return False


def lr_inputs(device="cpu", dtype=torch.float32, T=37, decay="key", seed=0):
    g = torch.Generator().manual_seed(seed)
    B, H, K, V = 2, 2, 16, 16

    def r(*s, sc=1.0):
        return (torch.randn(*s, generator=g) * sc).to(device=device, dtype=dtype)

    gk = {"key": -torch.rand(B, T, H, K, generator=g) * 0.2, "head": -torch.rand(B, T, H, generator=g) * 0.2, "none": None}[decay]
    gk = gk.to(device=device, dtype=dtype) if gk is not None else None
    return r(B, T, H, K), r(B, T, H, K, sc=K ** -0.5), r(B, T, H, V), gk, r(B, H, K, V)


def scan_inputs(device="cpu", dtype=torch.float32, T=33):
    g = torch.Generator().manual_seed(1)
    Bt, D, N = 2, 8, 4
    x = torch.randn(Bt, T, D, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(Bt, T, D, generator=g))
    A = -torch.rand(D, N, generator=g)
    Bm, Cm, Dv = torch.randn(Bt, T, N, generator=g), torch.randn(Bt, T, N, generator=g), torch.randn(D, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, delta, A, Bm, Cm, Dv)]


# --------------------------------------------------------------------------------------
# CPU: auto falls back, explicit requests are refused with the reason
# --------------------------------------------------------------------------------------


def test_auto_on_cpu_is_the_torch_path_for_every_op():
    q, k, v, gk, S0 = lr_inputs()
    for kw in (dict(), dict(mode="chunk")):
        a = linear_recurrence(q, k, v, gk, initial_state=S0, output_final_state=True, backend="auto", **kw)
        b = linear_recurrence(q, k, v, gk, initial_state=S0, output_final_state=True, backend="torch", **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, delta, A, Bm, Cm, Dv = scan_inputs()
    with backends.auto_uses_torch():  # on CPU, auto may pick seqmix's own C++ kernel (tests/test_cpp_scan.py)
        assert torch.equal(selective_scan(x, delta, A, Bm, Cm, Dv)[0], selective_scan(x, delta, A, Bm, Cm, Dv, backend="torch")[0])
    w = torch.randn(8, 4)
    assert torch.equal(causal_conv1d(x, w)[0], causal_conv1d(x, w, backend="torch")[0])
    assert torch.equal(softmax_attention(q, k, v), softmax_attention(q, k, v, backend="torch"))
    for op, call in [("linear_recurrence", backends.Call("linear_recurrence", "cpu", torch.float32, "auto", dict(K=16, V=16))),
                     ("selective_scan", backends.Call("selective_scan", "cpu", torch.float32, "reference")),
                     ("short_conv", backends.Call("short_conv", "cpu", torch.float32, None, dict(W=4)))]:
        assert backends.resolve(op, "auto", call).name == "torch"


@pytest.mark.parametrize("name,call", [
    ("fla", lambda: linear_recurrence(*lr_inputs()[:4], backend="fla")),
    ("mamba", lambda: selective_scan(*scan_inputs(), backend="mamba")),
    ("mamba", lambda: causal_conv1d(torch.randn(2, 9, 8), torch.randn(8, 4), backend="mamba")),
])
def test_explicit_backend_on_cpu_is_refused_with_the_reason(name, call):
    mods = {"fla": "fla.ops.gla", "mamba": "mamba_ssm"}
    expected = "does not cover this call: .*CUDA" if installed(mods[name]) else "is not installed: cannot import .* pip install"
    with pytest.raises(ValueError, match=f"backend '{name}' {expected}"):
        call()


def test_unknown_or_unsupported_backend_names():
    q, k, v, gk, _ = lr_inputs()
    with pytest.raises(ValueError, match="unknown backend 'triton'.*expected one of auto, torch"):
        linear_recurrence(q, k, v, gk, backend="triton")
    x, delta, A, Bm, Cm, Dv = scan_inputs()
    with pytest.raises(ValueError, match="backend 'fla' does not implement this op; backends for it: auto, torch, mamba"):
        selective_scan(x, delta, A, Bm, Cm, Dv, backend="fla")
    with pytest.raises(ValueError, match="plain causal mask"):
        softmax_attention(q, k, v, window=4, backend="sdpa")
    with pytest.raises(ValueError, match="explicit-matrix reference"):
        softmax_attention(q, k, v, mode="parallel", backend="sdpa")
    with pytest.raises(ValueError, match="'backend' must be a string"):
        linear_recurrence(q, k, v, gk, backend=None)


def test_sdpa_backend_equals_the_reference_on_cpu():
    q, k, v, _, _ = lr_inputs(dtype=torch.float64)
    o_ref = softmax_attention(q, k, v, mode="parallel", backend="torch")
    assert max_abs(softmax_attention(q, k, v, backend="sdpa"), o_ref) < 1e-12
    # grouped kv heads (GQA): the backend reads them itself (enable_gqa), the reference repeats them
    kg, vg = k[:, :, :1], v[:, :, :1]
    assert max_abs(softmax_attention(q, kg, vg, backend="sdpa"), softmax_attention(q, kg, vg, mode="parallel", backend="torch")) < 1e-12


def test_what_the_gpu_backends_cover():
    """The coverage rules of the real adapters, asked with CUDA calls (no import needed)."""
    fla = backends.get("fla").covers

    def lr(dtype=torch.bfloat16, mode="auto", **info):
        return backends.Call("linear_recurrence", "cuda", dtype, mode, dict(dict(K=64, V=64), **info))

    assert fla(lr()) is None and fla(lr(torch.float32, "chunk")) is None
    assert "value-wise" in fla(lr(valuewise=True))
    assert "complex" in fla(lr(complex=True))
    assert "float64" in fla(lr(torch.float64))
    assert "reference mode" in fla(lr(mode="recurrent"))
    assert "exceed" in fla(lr(K=512))
    assert "CUDA" in fla(backends.Call("linear_recurrence", "cpu", torch.float32, "auto", dict(K=8, V=8)))
    mamba = backends.get("mamba").covers

    def scan(**info):
        return backends.Call("selective_scan", "cuda", torch.float32, "fused", info)

    assert mamba(scan()) is None
    assert "initial_state" in mamba(scan(initial_state=True))
    assert "per-channel" in mamba(scan(per_channel_BC=True))
    assert "reference" in mamba(backends.Call("selective_scan", "cuda", torch.float32, "reference", {}))
    conv = backends.Call("short_conv", "cuda", torch.bfloat16, None, dict(W=4))
    assert mamba(conv) is None
    assert "widths 2 to 4" in mamba(backends.Call("short_conv", "cuda", torch.bfloat16, None, dict(W=7)))
    assert "state" in mamba(backends.Call("short_conv", "cuda", torch.bfloat16, None, dict(W=4, state=True)))


class _Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self, q, k, v, gk, *, scale, initial_state, output_final_state):
        self.calls += 1
        return linear_recurrence(q, k, v, gk, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, backend="torch")


def test_an_installed_backend_is_picked_only_where_it_covers(monkeypatch):
    """A stand-in backend (module 'math' always imports; it covers float64 only)."""
    run = _Counter()
    fake = backends.Backend(
        name="fake", description="test stand-in", requires={"linear_recurrence": "math"},
        covers=lambda call: None if call.dtype == torch.float64 else f"float64 only, got {call.dtype}",
        run={"linear_recurrence": run},
    )
    monkeypatch.setitem(backends._REGISTRY, "fake", fake)
    monkeypatch.setitem(backends.AUTO_ORDER, "linear_recurrence", ("fake",))
    q, k, v, gk, S0 = lr_inputs(dtype=torch.float64)
    linear_recurrence(q, k, v, gk)  # auto: covered -> the stand-in
    assert run.calls == 1
    linear_recurrence(q.float(), k.float(), v.float(), gk.float())  # auto: not covered -> torch
    assert run.calls == 1
    linear_recurrence(q, k, v, gk, backend="fake")
    assert run.calls == 2
    with pytest.raises(ValueError, match="backend 'fake' does not cover this call: float64 only, got torch.float32"):
        linear_recurrence(q.float(), k.float(), v.float(), gk.float(), backend="fake")
    # not installed: auto skips it, an explicit request says why
    monkeypatch.setitem(fake.requires, "linear_recurrence", "seqmix_no_such_module")
    linear_recurrence(q, k, v, gk)
    assert run.calls == 2
    with pytest.raises(ValueError, match="backend 'fake' is not installed: cannot import 'seqmix_no_such_module'"):
        linear_recurrence(q, k, v, gk, backend="fake")


def test_auto_asks_coverage_before_importing(monkeypatch):
    """auto asks a backend whether it covers the call before importing its module: a backend that does
    not cover it (fla on CPU) costs no import (a failing one, fla without triton, took 0.4 ms a call)."""
    imports = []
    fake = backends.Backend(
        name="fake", description="test stand-in", requires={"linear_recurrence": "math"},
        covers=lambda call: "CUDA only", run={"linear_recurrence": None},
        available=lambda op: imports.append(op) or (True, "imports"),
    )
    monkeypatch.setitem(backends._REGISTRY, "fake", fake)
    monkeypatch.setitem(backends.AUTO_ORDER, "linear_recurrence", ("fake",))
    q, k, v, gk, S0 = lr_inputs()
    linear_recurrence(q, k, v, gk, initial_state=S0)
    linear_recurrence(q[:, :1], k[:, :1], v[:, :1], gk[:, :1], initial_state=S0, mode="step")
    assert imports == []


def test_listing_and_cli(capsys):
    rows = backends.listing()
    ops = {(r["backend"], r["op"]) for r in rows}
    for op in backends.OPS:
        assert ("torch", op) in ops
    assert {("fla", "linear_recurrence"), ("mamba", "selective_scan"), ("mamba", "short_conv"), ("sdpa", "softmax_attention")} <= ops
    for r in rows:
        if r["backend"] == "fla" and not installed("fla.ops.gla"):
            assert not r["installed"] and "cannot import" in r["reason"] and "pip install" in r["reason"]
    from seqmix.cli import main

    assert main(["backends", "--format", "plain"]) == 0
    out = capsys.readouterr().out
    for r in rows:
        assert r["backend"] in out and r["op"] in out
    if not installed("fla.ops.gla"):
        assert "cannot import 'fla.ops.gla'" in out


# --------------------------------------------------------------------------------------
# CUDA: every backend against the torch path, forward and backward
# --------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the GPU backends run on CUDA only)")


def _grads(fn, leaves):
    leaves = [t.detach().clone().requires_grad_(True) for t in leaves]
    out = fn(*leaves)
    o = out[0] if isinstance(out, tuple) else out
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(9)).to(o.device, o.dtype)
    return o.detach().float(), [g.float() for g in torch.autograd.grad((o * w).sum(), leaves)]


def _assert_close(a, b, tol):
    oa, ga = a
    ob, gb = b
    assert rel_err(oa, ob) < tol
    for x, y in zip(ga, gb):
        assert rel_err(x, y) < tol


@needs_cuda
@pytest.mark.skipif(not installed("fla.ops.gla"), reason="flash-linear-attention is not installed (pip install seqmix[gpu])")
@pytest.mark.parametrize("decay", ["key", "head", "none"])
def test_fla_matches_torch_on_cuda(decay):
    q, k, v, gk, S0 = lr_inputs("cuda", T=200, decay=decay)
    leaves = [t for t in (q, k, v, gk) if t is not None]

    def run(backend):
        def f(*xs):
            gk_ = xs[3] if gk is not None else None
            return linear_recurrence(xs[0], xs[1], xs[2], gk_, scale=0.25, initial_state=S0, backend=backend)[0]
        return f

    _assert_close(_grads(run("fla"), leaves), _grads(run("torch"), leaves), 1e-3)  # fla accumulates in float32 with tf32 matmuls


@needs_cuda
@pytest.mark.skipif(not installed("mamba_ssm"), reason="mamba-ssm is not installed (pip install seqmix[gpu])")
def test_mamba_selective_scan_matches_torch_on_cuda():
    leaves = scan_inputs("cuda")
    _assert_close(_grads(lambda *a: selective_scan(*a, backend="mamba")[0], leaves),
                  _grads(lambda *a: selective_scan(*a, backend="torch")[0], leaves), 10 * F32_RTOL)


@needs_cuda
@pytest.mark.skipif(not installed("causal_conv1d"), reason="causal-conv1d is not installed (pip install seqmix[gpu])")
def test_causal_conv1d_backend_matches_torch_on_cuda():
    g = torch.Generator().manual_seed(3)
    leaves = [torch.randn(2, 50, 64, generator=g).cuda(), torch.randn(64, 4, generator=g).cuda(), torch.randn(64, generator=g).cuda()]
    _assert_close(_grads(lambda x, w, b: causal_conv1d(x, w, b, activation="silu", backend="mamba")[0], leaves),
                  _grads(lambda x, w, b: causal_conv1d(x, w, b, activation="silu", backend="torch")[0], leaves), 10 * F32_RTOL)


@needs_cuda
def test_sdpa_matches_reference_on_cuda():
    q, k, v, _, _ = lr_inputs("cuda", dtype=torch.float32)
    _assert_close(_grads(lambda q, k, v: softmax_attention(q, k, v, backend="sdpa"), [q, k, v]),
                  _grads(lambda q, k, v: softmax_attention(q, k, v, mode="parallel", backend="torch"), [q, k, v]), 1e-3)
