"""Optional kernel backends behind seqmix's ops, and the rule that picks one.

Four ops take ``backend=``: :func:`~seqmix.ops.linear_recurrence`,
:func:`~seqmix.ops.selective_scan`, the short convolution :func:`~seqmix.ops.causal_conv1d`
and :func:`~seqmix.ops.softmax_attention`. The values:

* ``"torch"``: seqmix's own pure-PyTorch path (always there, every device and dtype).
* ``"fla"``: flash-linear-attention's Triton chunk kernels for ``linear_recurrence``
  (``fla.ops.gla.chunk_gla`` for key-wise decays, ``fla.ops.simple_gla.chunk_simple_gla`` for
  one decay per head or none). CUDA, real float16/bfloat16/float32, no value-wise decay.
* ``"mamba"``: ``mamba_ssm``'s ``selective_scan_fn`` for the selective scan and the
  ``causal_conv1d`` package's ``causal_conv1d_fn`` for the short convolution. CUDA only.
* ``"cpp"``: seqmix's own fused C++ kernel for the selective scan on CPU
  (:mod:`seqmix.ops.cpp_scan`; float32/float64, half inputs via float32), compiled with
  ``torch.utils.cpp_extension`` on first use. Needs a C++ compiler and ``ninja`` on PATH;
  ``SEQMIX_CPP=0`` switches it off. Measured several times faster than the torch modes for
  training (docs/performance.md), so ``"auto"`` picks it on CPU.
* ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal`` for
  softmax attention (FlashAttention-2 / memory-efficient kernels on CUDA); the plain causal
  mask only.
* ``"auto"`` (the default of every op): the first backend of :data:`AUTO_ORDER` that is
  installed and covers the call, otherwise ``"torch"``. It never fails for a reason of
  availability. While ``torch.compile`` traces, it takes only backends that trace without a
  graph break (``Backend.traceable``: torch and sdpa), so a compiled mixer is one graph.

Asking for a backend by name that is not installed, or that does not cover the call (device,
dtype, decay kind, shapes, options), raises a ``ValueError`` that says why. Each backend
declares what it covers as a function of a :class:`Call` (the facts the op knows before
running); ``seqmix backends`` prints the table of :func:`listing`.

The extras that install the libraries: ``pip install seqmix[gpu]`` (flash-linear-attention,
mamba-ssm, causal-conv1d; they build CUDA/Triton code and are never needed).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Callable

import torch

OPS = ("linear_recurrence", "selective_scan", "short_conv", "softmax_attention")

#: what ``backend="auto"`` tries, per op, before falling back to ``"torch"``
AUTO_ORDER = {
    "linear_recurrence": ("fla",),
    "selective_scan": ("mamba", "cpp"),
    "short_conv": ("mamba",),
    "softmax_attention": ("sdpa",),
}


@dataclass(frozen=True)
class Call:
    """What the dispatcher knows of one call of an op, before running it.

    device: "cpu", "cuda", ...; dtype: the inputs' dtype; mode: the op's ``mode`` argument
    (None for ops without one); info: op-specific facts (decay kind, shapes, options).
    """

    op: str
    device: str
    dtype: torch.dtype
    mode: str | None = None
    info: dict = field(default_factory=dict)


@dataclass
class Backend:
    """One backend: the ops it implements, the module each needs, what it covers, how it runs.

    requires: op -> importable module name (the import check of :meth:`status`).
    covers: (call) -> None when the backend runs this call, else the reason it does not.
    run: op -> function taking the op's own arguments (already checked by the op).
    pip: what to install.
    available: op -> (usable, reason), replacing the import check of :meth:`status` for a
    backend that is not a module (a kernel compiled on first use); cheap, never compiles.
    prepare: () -> None when ready, else the reason; called once a call is routed to the
    backend (it may compile: lazily, on first use, never at import or in ``listing``).
    traceable: torch.compile traces through it without a graph break (torch's own functions);
    ``backend="auto"`` skips the others while torch.compile traces, so the compiled graph holds
    seqmix's torch path instead (a kernel library or a compiled extension breaks the graph).
    """

    name: str
    description: str
    requires: dict[str, str | None]
    covers: Callable[[Call], str | None]
    run: dict[str, Callable]
    pip: str = ""
    available: Callable[[str], tuple[bool, str]] | None = None
    prepare: Callable[[], str | None] | None = None
    traceable: bool = False

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(self.requires)

    def status(self, op: str) -> tuple[bool, str]:
        """(installed, reason): whether the module this op needs imports, and if not, why."""
        if self.available is not None:
            return self.available(op)
        mod = self.requires.get(op)
        if mod is None:
            return True, "part of torch"
        try:
            importlib.import_module(mod)
        except Exception as e:  # ImportError, or a broken build failing at import (CUDA mismatch, ...)
            hint = f"; install with: pip install {self.pip}" if self.pip else ""
            return False, f"cannot import {mod!r} ({type(e).__name__}: {e}){hint}"
        return True, f"{mod} imports"


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    """Adds (or replaces) a backend of the registry."""
    _REGISTRY[backend.name] = backend


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return ("auto",) + tuple(_REGISTRY)


def get(name: str) -> Backend:
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; expected one of {', '.join(names())}")
    return _REGISTRY[name]


def resolve(op: str, backend: str, call: Call) -> Backend:
    """The backend that runs this call.

    ``backend="auto"``: the first of AUTO_ORDER[op] that is installed and covers the call, else
    torch. A backend named explicitly must implement the op, be installed and cover the call,
    otherwise a ValueError says which of the three fails and why.
    """
    if not isinstance(backend, str):
        raise ValueError(f"{op}: argument 'backend' must be a string, got {type(backend).__name__}")
    if backend == "auto":
        tracing = torch.compiler.is_compiling()
        for name in AUTO_ORDER.get(op, ()):
            b = _REGISTRY.get(name)
            if b is not None and tracing and not b.traceable:
                continue
            # covers (a few comparisons) before status (an import): a backend that cannot run this call
            # (fla or mamba_ssm on CPU) costs no import attempt, which is about 0.4 ms per call where the
            # import fails (flash-linear-attention without triton: 'fla.ops' raises, nothing is cached)
            if b is not None and op in b.requires and b.covers(call) is None and b.status(op)[0] and _ready(b) is None:
                return b
        return _REGISTRY["torch"]
    if backend not in _REGISTRY:
        raise ValueError(f"{op}: unknown backend {backend!r}; expected one of {', '.join(names())}")
    b = _REGISTRY[backend]
    if op not in b.requires:
        have = [n for n, x in _REGISTRY.items() if op in x.requires]
        raise ValueError(f"{op}: backend {backend!r} does not implement this op; backends for it: {', '.join(['auto'] + have)}")
    ok, why = b.status(op)
    if not ok:
        raise ValueError(f"{op}: backend {backend!r} is not installed: {why}")
    reason = b.covers(call)
    if reason is not None:
        raise ValueError(f"{op}: backend {backend!r} does not cover this call: {reason} (backend='torch' or 'auto' runs it)")
    why = _ready(b)
    if why is not None:
        raise ValueError(f"{op}: backend {backend!r} is not available: {why} (backend='torch' or 'auto' runs it)")
    return b


def _ready(b: Backend) -> str | None:
    """None when the backend can run now (preparing it if it has a prepare step), else why not."""
    return None if b.prepare is None else b.prepare()


def listing() -> list[dict]:
    """One row per (backend, op): name, op, installed, reason, description."""
    rows = []
    for b in _REGISTRY.values():
        for op in b.ops:
            ok, why = b.status(op)
            rows.append(dict(backend=b.name, op=op, installed=ok, reason=why, description=b.description))
    return rows


# --------------------------------------------------------------------------------------
# torch (seqmix's own code: the ops run their own path when this backend is picked)
# --------------------------------------------------------------------------------------

register(Backend(
    name="torch",
    description="seqmix's pure-PyTorch implementation (every device, dtype and option)",
    requires={op: None for op in OPS},
    traceable=True,
    covers=lambda call: None,
    run={},
))


# --------------------------------------------------------------------------------------
# flash-linear-attention
# --------------------------------------------------------------------------------------

_FLA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FLA_MAX_HEAD_DIM = 256  # fla's chunk kernels tile K and V in blocks of at most 64/128 up to 256


def _fla_covers(call: Call) -> str | None:
    i = call.info
    if call.device != "cuda":
        return f"fla's Triton kernels run on CUDA, the inputs are on {call.device}"
    if i.get("complex") or call.dtype not in _FLA_DTYPES:
        return f"fla takes real float16, bfloat16 or float32 inputs, got {'complex inputs' if i.get('complex') else call.dtype}"
    if i.get("valuewise"):
        return "fla's gla/simple_gla kernels take no value-wise decay (gv)"
    if call.mode not in ("auto", "chunk"):
        return f"fla runs the chunk form; mode {call.mode!r} is a torch reference mode"
    if i.get("K", 0) > _FLA_MAX_HEAD_DIM or i.get("V", 0) > _FLA_MAX_HEAD_DIM:
        return f"head dims K = {i.get('K')}, V = {i.get('V')} exceed fla's {_FLA_MAX_HEAD_DIM}"
    return None


def _fla_linear_recurrence(q, k, v, gk, *, scale, initial_state, output_final_state):
    """q, k [B, T, H, K], v [B, T, H, V] (fla's default layout); gk [B, T, H, K] key-wise,
    [B, T, H] per head or None (log-decays, as fla's ``g``). Returns (o, final state or None)."""
    if gk is not None and gk.dim() == 4:
        from fla.ops.gla import chunk_gla

        return chunk_gla(q=q, k=k, v=v, g=gk, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state)
    from fla.ops.simple_gla import chunk_simple_gla

    return chunk_simple_gla(q=q, k=k, v=v, g=gk, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state)


register(Backend(
    name="fla",
    description="flash-linear-attention Triton chunk kernels (chunk_gla, chunk_simple_gla)",
    requires={"linear_recurrence": "fla.ops.gla"},
    covers=_fla_covers,
    run={"linear_recurrence": _fla_linear_recurrence},
    pip="flash-linear-attention (or seqmix[gpu])",
))


# --------------------------------------------------------------------------------------
# mamba_ssm (selective scan) and causal_conv1d (short convolution)
# --------------------------------------------------------------------------------------

_MAMBA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _mamba_covers(call: Call) -> str | None:
    i = call.info
    if call.device != "cuda":
        return f"the CUDA kernels of mamba_ssm / causal_conv1d run on CUDA, the inputs are on {call.device}"
    if call.dtype not in _MAMBA_DTYPES:
        return f"the kernels take float16, bfloat16 or float32, got {call.dtype}"
    if call.op == "selective_scan":
        if call.mode == "reference":
            return "mode 'reference' is the torch reference loop"
        if i.get("initial_state"):
            return "selective_scan_fn starts from a zero state (no initial_state)"
        if i.get("per_channel_BC"):
            return "selective_scan_fn is used with B, C shared by the channels ([B, T, N]); per-channel B, C are not covered"
    if call.op == "short_conv":
        if not 2 <= i.get("W", 0) <= 4:
            return f"causal_conv1d_fn takes kernel widths 2 to 4, got {i.get('W')}"
        if i.get("state") or i.get("output_final_state"):
            return "the carried conv state (state / output_final_state) is not covered; decoding uses the torch path"
    return None


def _mamba_selective_scan(x, delta, A, B, C, D, *, output_final_state, initial_state=None, chunk_size=None,
                          delta_bias=None, delta_softplus=False):
    """x, delta [B, T, D]; A [D, N]; B, C [B, T, N]; D [D] or None; delta is Δ, or its pre-activation
    with delta_bias [D] / delta_softplus (passed through: selective_scan_fn's own arguments).
    mamba_ssm's layout is channel-first: u, delta [B, D, T], B, C [B, N, T]. initial_state is
    always None here (not covered); chunk_size is the torch modes' (ignored)."""
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

    out = selective_scan_fn(
        x.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2), C.transpose(1, 2),
        D=D, z=None, delta_bias=delta_bias.float() if delta_bias is not None else None,  # its kernel takes a float32 bias
        delta_softplus=delta_softplus, return_last_state=output_final_state,
    )
    y, h = out if output_final_state else (out, None)
    return y.transpose(1, 2), h


def _mamba_short_conv(x, weight, bias, *, activation):
    """x [B, T, C] (a channel-last view of causal_conv1d's [B, C, T]); weight [C, W]; bias [C]."""
    from causal_conv1d import causal_conv1d_fn

    return causal_conv1d_fn(x.transpose(1, 2), weight, bias, activation=activation).transpose(1, 2)


register(Backend(
    name="mamba",
    description="mamba_ssm selective_scan_fn and causal_conv1d_fn (CUDA)",
    requires={"selective_scan": "mamba_ssm.ops.selective_scan_interface", "short_conv": "causal_conv1d"},
    covers=_mamba_covers,
    run={"selective_scan": _mamba_selective_scan, "short_conv": _mamba_short_conv},
    pip="mamba-ssm causal-conv1d (or seqmix[gpu])",
))


# --------------------------------------------------------------------------------------
# cpp: seqmix's fused C++ CPU kernel of the selective scan (compiled on first use)
# --------------------------------------------------------------------------------------

_CPP_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _cpp_covers(call: Call) -> str | None:
    if call.device != "cpu":
        return f"the C++ kernel runs on CPU, the inputs are on {call.device}"
    if call.dtype not in _CPP_DTYPES:
        return f"the C++ kernel takes float32 or float64 (float16/bfloat16 via float32), got {call.dtype}"
    if call.mode == "reference":
        return "mode 'reference' is the torch reference loop"
    return None


def _cpp_available(op: str) -> tuple[bool, str]:
    from . import cpp_scan

    return cpp_scan.available()


def _cpp_prepare() -> str | None:
    from . import cpp_scan

    try:
        cpp_scan.load()
    except RuntimeError as e:
        return str(e)
    return None


def _cpp_selective_scan(x, delta, A, B, C, D, *, output_final_state, initial_state=None, chunk_size=None, **delta_act):
    """x, delta [B, T, D]; A [D, N]; B, C [B, T, N] or [B, T, D, N]; D [D] or None;
    initial_state [B, D, N] or None; chunk_size: the kernel's L (states kept every L steps)."""
    from .cpp_scan import selective_scan_cpp

    return selective_scan_cpp(x, delta, A, B, C, D, initial_state=initial_state,
                              output_final_state=output_final_state, chunk_size=chunk_size, **delta_act)


register(Backend(
    name="cpp",
    description="seqmix's fused C++ CPU kernel (selective scan; compiled on first use)",
    requires={"selective_scan": None},
    covers=_cpp_covers,
    run={"selective_scan": _cpp_selective_scan},
    available=_cpp_available,
    prepare=_cpp_prepare,
))


# --------------------------------------------------------------------------------------
# torch SDPA (FlashAttention-2 / memory-efficient kernels on CUDA)
# --------------------------------------------------------------------------------------


def _sdpa_covers(call: Call) -> str | None:
    i = call.info
    if call.mode == "parallel":
        return "mode 'parallel' is the explicit-matrix reference"
    if not i.get("plain_causal", False):
        return "sdpa is used with the plain causal mask only (no window, prefix, offset or key_valid)"
    return None


def _sdpa_attention(q, k, v, *, scale):
    """q [B, T, H, K], k [B, T, Hkv, K], v [B, T, Hkv, V] (grouped kv heads read by SDPA itself, ``enable_gqa``: no
    copy of the repeated heads); plain causal mask."""
    gqa = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}  # (passed only where needed: torch >= 2.5)
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale, **gqa)
    return o.transpose(1, 2)


register(Backend(
    name="sdpa",
    description="torch scaled_dot_product_attention, is_causal (FlashAttention-2 kernels on CUDA)",
    requires={"softmax_attention": None},
    covers=_sdpa_covers,
    run={"softmax_attention": _sdpa_attention},
    traceable=True,
))


@contextlib.contextmanager
def auto_uses_torch():
    """Within this block ``backend="auto"`` always runs the torch path (to time a model's
    torch path against its backend path: bench/gpu.py)."""
    saved = dict(AUTO_ORDER)
    AUTO_ORDER.update({op: () for op in AUTO_ORDER})
    try:
        yield
    finally:
        AUTO_ORDER.clear()
        AUTO_ORDER.update(saved)
