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
