"""seqmix.ops.mkl: MKL's vector math functions are called once on one thread when seqmix is imported, so that
no first call runs on several threads at once (the module's docstring: a race of oneMKL 2024.2 that returns
inexact values from one thread's chunk). The race itself needs a fresh process and strikes a fraction of them:
bench/vml_race.py counts it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from seqmix.ops import mkl


class _Record(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if args and isinstance(args[0], torch.Tensor):
            self.calls.append((getattr(func, "__name__", str(func)), args[0].dtype, args[0].numel(), args[0].device.type))
        return out


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL: nothing to resolve")
def test_every_vml_op_is_called_once_per_dtype_on_one_element():
    with _Record() as rec:
        assert mkl.resolve_vml(force=True)
    called = {(name, dtype) for name, dtype, numel, device in rec.calls if numel == 1 and device == "cpu"}
    for dtype in mkl.VML_DTYPES:
        for name in mkl.VML_OPS:
            assert (name, dtype) in called, (name, dtype)
    assert {"exp", "log", "sqrt", "tanh", "erf", "log1p", "expm1", "sin", "cos"} <= set(mkl.VML_OPS)
    assert set(mkl.VML_DTYPES) == {torch.float32, torch.float64}
    with _Record() as rec:
        assert not mkl.resolve_vml()  # once per process
    assert rec.calls == []


def test_nothing_to_do_without_mkl(monkeypatch):
    monkeypatch.setattr(mkl, "_resolved", False)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    with _Record() as rec:
        assert not mkl.resolve_vml()
    assert rec.calls == []


def test_importing_seqmix_resolves_before_anything_else_runs():
    """In a fresh interpreter, ``import seqmix`` leaves the module resolved (with MKL) without the caller
    doing anything."""
    code = "import torch, seqmix; from seqmix.ops import mkl; print(mkl._resolved == torch.backends.mkl.is_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"
