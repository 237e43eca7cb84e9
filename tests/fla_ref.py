"""flash-linear-attention's naive references, for the tests that compare mixers against them.

fla (the optional extra ``reference``) ships pure-PyTorch ``naive*.py`` files beside its
Triton kernels. ``import fla.ops`` imports triton (GPU only), so each naive file is loaded
from its path: those files need torch and einops alone and run on the CPU. Nothing of fla's
code is copied into seqmix; without fla installed the calling test is skipped.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def fla_naive(path: str, fn: str):
    """The function ``fn`` of fla's file ``path`` (relative to the fla package, e.g.
    ``"ops/gla/naive.py"``), loaded from that file; skips the test without fla or the file."""
    spec = importlib.util.find_spec("fla")  # finds the package without running its __init__: with triton
    if spec is None or spec.origin is None:  # present, `import fla` registers fla's own models (e.g. "mamba")
        pytest.skip("flash-linear-attention is not installed (optional extra: pip install 'seqmix[reference]')")
    file = Path(spec.origin).parent / path
    if not file.exists():
        pytest.skip(f"the installed fla has no {path}")
    spec = importlib.util.spec_from_file_location(f"_fla_naive_{Path(path).parent.name}_{fn}", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def fla_naive_package(directory: str, module: str, fn: str, *, stub_triton: bool = False):
    """The function ``fn`` of fla's module ``module`` in ``directory`` (relative to the fla package, e.g.
    ``"ops/cyfa"``, ``"naive"``), loaded with that directory as a package, so that its relative imports
    (``from .utils import ...``) resolve to fla's own sibling files. ``stub_triton``: where triton is not
    installed, those siblings' ``import triton`` gets a stand-in whose ``triton.jit`` returns the function
    unchanged (fla's kernels are defined, never run): the naive code then runs, unchanged, on the CPU.
    Skips the test without fla or the file."""
    import sys
    import types

    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("flash-linear-attention is not installed (optional extra: pip install 'seqmix[reference]')")
    folder = Path(spec.origin).parent / directory
    if not (folder / f"{module}.py").exists():
        pytest.skip(f"the installed fla has no {directory}/{module}.py")
    pkg = f"_fla_pkg_{Path(directory).name}"
    added = {}
    if stub_triton and importlib.util.find_spec("triton") is None:
        def jit(fn=None, **_):
            return fn if fn is not None else (lambda f: f)
        triton = types.ModuleType("triton")
        triton.jit = jit
        language = types.ModuleType("triton.language")
        extra = types.ModuleType("triton.language.extra")
        extra.libdevice = types.ModuleType("triton.language.extra.libdevice")
        language.extra = extra
        triton.language = language
        added = {"triton": triton, "triton.language": language, "triton.language.extra": extra,
                 "triton.language.extra.libdevice": extra.libdevice}
    package = types.ModuleType(pkg)
    package.__path__ = [str(folder)]
    added[pkg] = package
    saved = {name: sys.modules.get(name) for name in added}
    sys.modules.update(added)
    try:
        mod = importlib.import_module(f"{pkg}.{module}")
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return getattr(mod, fn)
