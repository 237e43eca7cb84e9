"""MKL's vector math (VML) resolved once, before any op runs it on several threads.

torch on CPU computes the contiguous float32 / float64 unary ops (exp, log, sqrt, tanh, erf, ...) with
oneMKL's VML, each intra-op thread on its chunk. oneMKL 2024.2 (the version in torch's wheels) chooses a
VML function's kernel lazily, on its first call; when that first call runs on several threads at once, one
thread can run a low-accuracy kernel for its whole chunk of that one call (pytorch/pytorch#188792: errors
up to ~4000 ulp; later calls are exact). Seen here: the first ``torch.exp`` of a fresh process on a float64
[2, 21, 40, 8] tensor with two threads returned the second half off by up to 3.3e-9 relative, so a float64
reference computed first differed from a kernel computed second by 3e-8 and failed a tight equivalence test
(bench/vml_race.py counts how often a fresh process's first call is inexact, with and without seqmix).

:func:`resolve_vml` calls each of those functions once on a one-element tensor of each float dtype (one
thread: below any parallel grain), which settles the choice for the process; ``import seqmix`` runs it once
(about a millisecond). It does nothing where torch has no MKL. A process that ran such ops on
several threads before importing seqmix may already have had one inexact call; later calls are exact.
"""

from __future__ import annotations

import torch

#: the unary ops torch sends to VML on CPU (aten/src/ATen/cpu/vml.h), and their neighbours: a name that
#: does not reach VML costs one tiny call and changes nothing
VML_OPS = ("exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan",
           "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfc", "erfinv", "lgamma", "sigmoid", "abs",
           "trunc")

#: the dtypes with VML kernels (float32: vs*, float64: vd*)
VML_DTYPES = (torch.float32, torch.float64)

_resolved = False


def resolve_vml(force: bool = False) -> bool:
    """Call every op of ``VML_OPS`` once on a one-element CPU tensor of each dtype of ``VML_DTYPES`` (module
    docstring), once per process (``force``: again). Returns whether the calls ran (False: done before, or
    torch has no MKL)."""
    global _resolved
    if (_resolved and not force) or not torch.backends.mkl.is_available():
        return False
    with torch.no_grad():
        for dtype in VML_DTYPES:
            one = torch.full((1,), 0.5, dtype=dtype)
            for name in VML_OPS:
                getattr(torch, name)(one)
    _resolved = True
    return True
