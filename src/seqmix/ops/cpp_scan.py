"""The selective scan as a fused C++ CPU kernel: the ``"cpp"`` backend of ``selective_scan``.

Same recurrence as :mod:`seqmix.ops.selective_scan` (Mamba eqs. 2a/2b with Δ after its
softplus; DSF eq. 19 with a diagonal Λ_t), per batch b, channel d and state n:

    h_t[n] = exp(Δ_t[d] A[d, n]) h_(t-1)[n] + Δ_t[d] x_t[d] B_t[n]
    y_t[d] = Σ_n C_t[n] h_t[n] + D[d] x_t[d]

The torch modes run it as whole-tensor passes over [L, B, D, N] chunk buffers (about fifteen
per chunk, forward and backward); the kernel (``csrc/selective_scan.cpp``) instead runs, for
each (b, block of ``BLOCK`` = 32 channels) in parallel (``at::parallel_for``), one loop over t,
inside it the loop over n, and innermost the block's channels as SIMD lanes (vectorized across
channels: the state [N, 32] of the block in L1, y and the per-channel sums over n accumulated per
lane without horizontal sums; in float32 an exp written as plain arithmetic, Cephes' polynomial,
about 1 ulp; std::exp in float64; N = 8 and 16 compiled as constants). When every row of A is constant over n (dsf_ssd's scalar A,
``A.expand(D, N)``; checked bit for bit by the kernel) exp runs once per (t, d) instead of N
times, the same values. Forward: y, the final state, and the states entering each chunk of L
steps (kept for the backward: O(T/L · B·D·N) memory). Backward: chunks from the last, each
recomputed from its boundary state into a buffer of L·N·32, then the adjoint recurrence backwards
in time producing dΔ, dA, dx, dB, dC, dD and dh0 in the same pass (sums over channels and over
the batch go through per-unit partial buffers reduced here). A small scan (every state and decay
of the call, 2·B·T·Dp·N floats with D padded to whole blocks, within ``keep_all_floats()``) keeps
them all instead, and its backward reads them rather than recomputing them (the
recompute takes a third of the backward's time at the main job's B 16, T 32, d 64, n 8). The kept
values are the recomputed ones bit for bit (the same arithmetic), so the gradients do not depend
on which way was taken. Against a per-channel kernel (one channel at a time, the loop over n
vectorized), the decays and states are the same bits and the sums (y, dΔ, dx,
dB, dC) differ by rounding only; the kernel alone (1 thread) runs 1.6x faster forward and 1.7x
forward+backward at the main job's size with S6's A, 3.9x and 2.6x with a scalar A, about 1.45x
both at (8, 512, 512, 16) and (1, 4096, 512, 16).

Mamba's ``delta_bias`` and ``delta_softplus`` (its ``selective_scan_fn``'s arguments) are computed
in the kernel: Δ = softplus(delta + delta_bias) (or delta + delta_bias), softplus with PyTorch's
threshold 20 (Δ = z above it; mamba_ssm's kernel uses the same), in float32 as plain arithmetic that
vectorizes (exp_s, and log1p by a degree-9 polynomial fitted for this file), in float64 by std::exp /
std::log1p; for groups of 16 steps ahead of their use, so that the evaluations overlap (inside each
step, softplus's dependency chain lengthened the step's own). The backward evaluates Δ and σ =
softplus' once more (per chunk, before the recompute) and returns the gradients w.r.t. delta (the
pre-activation: dΔ · σ(delta + delta_bias)) and delta_bias (summed over the batch and time). This
spares the caller torch's softplus and its backward: 1 thread, AVX-512, forward + backward
through the op with S6's A, torch's ``F.softplus(pre + bias)`` forward + backward alone took about
130 µs at (B, T, D, N) = (16, 32, 64, 8), and the fused op ran in 0.91x the time of softplus + op
(forward alone 0.78x); at (8, 512, 512, 16) 0.94-0.96x (forward 0.90-0.95x; a noisy machine).

Shapes: x, delta [B, T, D]; A [D, N]; B, C [B, T, N] or [B, T, D, N]; D [D] or None;
delta_bias [D] or None; initial_state [B, D, N] or None. float32 and float64 are computed in their dtype; float16 and
bfloat16 inputs in float32 (y cast back, the final state in float32, as the torch path).

The kernel is compiled with ``torch.utils.cpp_extension.load`` on first use (never at import),
into torch's extensions directory (``TORCH_EXTENSIONS_DIR`` if set), one line on stderr when
it compiles. It needs a C++ compiler (``c++``, or ``$CXX``) and the ``ninja`` executable on
PATH. ``SEQMIX_CPP=0`` switches the backend off. It is built for the widest vectors the CPU has
(``isa``: AVX-512 with 512-bit vectors, else AVX2 + FMA, else the compiler's default; the flags
are part of the build's name): on this project's Xeon, AVX-512 ran the forward 1.7x faster than
AVX2 at the main job's size and forward + backward 7-28% faster.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

from .autograd import first_order

SOURCE = Path(__file__).with_name("csrc") / "selective_scan.cpp"
#: chunk length L of the kernel when the op's ``chunk_size`` is None: states kept every L steps
CHUNK = 64
#: a scan that needs a gradient keeps every state and decay for its backward (no recompute) when
#: they are at most this many floats (2·B·(T+1)·Dp·N, Dp = D padded to whole blocks of the kernel's
#: BLOCK channels), else the chunk-boundary states. None: by the build (``keep_all_floats``)
KEEP_ALL_FLOATS: int | None = None
#: the CPU features of each instruction set the kernel can be built for (/proc/cpuinfo's names), widest first
ISA_FLAGS = {"avx512": (("avx512f", "avx512dq", "avx512vl", "avx2", "fma"),
                        ["-mavx2", "-mfma", "-mavx512f", "-mavx512dq", "-mavx512vl", "-mprefer-vector-width=512"]),
             "avx2": (("avx2", "fma"), ["-mavx2", "-mfma"])}

_module = None
_failure: str | None = None

__all__ = ["available", "load", "selective_scan_cpp", "CHUNK", "isa", "keep_all_floats"]


def _disabled() -> bool:
    return os.environ.get("SEQMIX_CPP", "1").strip().lower() in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> tuple[str, ...]:
    """This CPU's feature names (/proc/cpuinfo's first "flags" line; x86-64 Linux, else none), read once:
    ``isa`` runs on every scan call through ``keep_all_floats`` (reading the file took ~36 µs)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        return tuple(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return ()


def isa(cpu_flags: list[str] | None = None) -> str:
    """The widest instruction set of ``ISA_FLAGS`` whose features ``cpu_flags`` (default: this
    CPU's, from /proc/cpuinfo on x86-64 Linux) all has — "avx512" (16 float32 lanes), "avx2" (8) —
    or "generic" (the compiler's default). ``SEQMIX_CPP_ISA`` = avx2 / generic caps it (e.g. to
    compare builds, or where 512-bit vectors lower the clock)."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    cap = os.environ.get("SEQMIX_CPP_ISA", "").strip().lower()
    order = [*ISA_FLAGS, "generic"]
    if cap and cap not in order:
        raise ValueError(f"SEQMIX_CPP_ISA = {cap!r}: expected one of {', '.join(order)} (or unset: the widest this CPU has)")
    for name in order[order.index(cap) if cap else 0:-1]:
        if all(f in flags for f in ISA_FLAGS[name][0]):
            return name
    return "generic"


def _isa_flags() -> list[str]:
    """The compiler flags of ``isa()``; the build's name records them."""
    name = isa()
    return list(ISA_FLAGS[name][1]) if name in ISA_FLAGS else []


def keep_all_floats() -> int:
    """``KEEP_ALL_FLOATS`` if set, else by the build: 2^21 floats (8 MiB of float32) for an AVX2 or
    generic build, 0 (always recompute the chunks) for an AVX-512 one. Measured at the main job's
    sizes (B 16, T 32, d 32-128, n 8; forward + backward through the op, 1 thread): with
    AVX2 keeping everything was 1-9% faster than recomputing, with AVX-512 (exp twice as wide)
    recomputing was 0-7% faster (no large allocation to fault in)."""
    if KEEP_ALL_FLOATS is not None:
        return KEEP_ALL_FLOATS
    return 0 if isa() == "avx512" else 1 << 21


def _cflags() -> list[str]:
    return ["-O3", "-fopenmp", "-fopenmp-simd", "-fno-trapping-math", *_isa_flags()]


def _name() -> str:
    """The build's name: a digest of the source, the flags and torch's version (its headers), so that a
    build of that name is this kernel for this torch."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(_cflags()).encode() + torch.__version__.encode()).hexdigest()[:10]
    return f"seqmix_selective_scan_{digest}"


def _import_built(name: str):
    """The build ``name`` that a process (this one or another) made earlier, imported directly from torch's
    extensions directory; None when there is none (or it does not import). This skips cpp_extension.load's
    lock file, which a process killed inside load() leaves behind: every later load() would wait on it forever."""
    import importlib.util

    from torch.utils import cpp_extension

    try:
        path = Path(cpp_extension._get_build_directory(name, verbose=False)) / f"{name}.so"
        if not path.is_file():
            return None
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001  (a private helper of torch that moved, a half-written file: build it)
        return None
    return module


def available() -> tuple[bool, str]:
    """(usable, reason) without compiling: switched off, no compiler, no ninja, a failed
    compile earlier in this process, compiled, or "compiles on first use"."""
    if _disabled():
        return False, "switched off by SEQMIX_CPP=0"
    if _module is not None:
        return True, "compiled"
    if _failure is not None:
        return False, _failure
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return False, f"no C++ compiler found ({cxx!r} is not on PATH; set CXX or install g++/clang++)"
    if shutil.which("ninja") is None:
        return False, "the 'ninja' build tool is not on PATH (torch.utils.cpp_extension needs it)"
    if not SOURCE.is_file():
        return False, f"the kernel source {SOURCE.name} is missing from the installed package"
    return True, "C++ compiler found; compiles on first use"


def load():
    """The compiled extension (compiling it on the first call of the process, unless torch's
    extensions directory already holds this build). Raises RuntimeError saying why not."""
    global _module, _failure
    if _module is not None:
        return _module
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    from torch.utils import cpp_extension

    name = _name()
    _module = _import_built(name)
    if _module is not None:
        return _module
    print(f"seqmix: compiling the C++ selective scan kernel ({name}, about a minute, once) ...", file=sys.stderr, flush=True)
    try:
        _module = cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=_cflags(),
                                     extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # compiler or linker error, missing headers, ...
        msg = str(e).strip().splitlines()
        _failure = f"the C++ kernel failed to compile ({type(e).__name__}: {msg[-1] if msg else ''})"
        raise RuntimeError(_failure) from e
    return _module


def _sum_blocks(part: torch.Tensor) -> torch.Tensor:
    """Σ over the blocks of channels of a per-block partial gradient [B, T, blocks, N] -> [B, T, N]. One
    or two blocks (d_inner <= 64): the block itself or one add, the value ``sum(2)`` gives (a + b in either
    order) at a fraction of a reduction's fixed cost (14 µs per call at B 16, T 32)."""
    blocks = part.shape[2]
    if blocks == 1:
        return part.squeeze(2)
    if blocks == 2:
        return torch.add(part[:, :, 0], part[:, :, 1])
    return part.sum(2)


class _CppScan(torch.autograd.Function):
    """Inputs (contiguous, one dtype): x, delta [B, T, D]; A [D, N]; Bm, Cm [B, T, N] or
    [B, T, D, N]; Dv [D] or None; h0 [B, D, N] or None; L; delta_bias [D] or None; delta_softplus.
    Returns (y [B, T, D], h_T)."""

    @staticmethod
    def forward(ctx, x, delta, A, Bm, Cm, Dv, h0, L, bias, softplus):
        ext = load()
        Bt, T, D = x.shape
        Dp = -(-D // ext.BLOCK) * ext.BLOCK  # the kept tensors' channels, padded to whole blocks
        keep = 2 if 2 * Bt * (T + 1) * Dp * A.shape[1] <= keep_all_floats() else 1  # every state, or the chunks' first
        y, hT, states, decays = ext.forward(x, delta, A, Bm, Cm, Dv, h0, L, keep, bias, softplus)
        ctx.save_for_backward(x, delta, A, Bm, Cm, Dv, states, decays, bias)
        ctx.L, ctx.softplus = L, softplus
        ctx.has_D, ctx.has_h0, ctx.has_bias = Dv is not None, h0 is not None, bias is not None
        return y, hT

    @staticmethod
    @first_order("selective_scan (backend 'cpp')", "selective_scan(..., backend='torch', mode='reference')")
    def backward(ctx, dy, dhT):
        x, delta, A, Bm, Cm, Dv, states, decays, bias = ctx.saved_tensors
        Bt, T, D = x.shape
        N = A.shape[1]
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dhT = x.new_zeros(Bt, D, N) if dhT is None else dhT.contiguous()
        dx, ddelta, dA_part, dB, dC, dD_part, dh0, dbias_part = load().backward(
            x, delta, A, Bm, Cm, Dv, states, decays, dy, dhT, ctx.L, bias, ctx.softplus)
        if Bm.dim() == 3:  # shared by the channels: per-block partial sums [B, T, blocks, N]
            dB = _sum_blocks(dB)
        if Cm.dim() == 3:
            dC = _sum_blocks(dC)
        need = ctx.needs_input_grad
        return (dx, ddelta, dA_part.sum(0) if need[2] else None, dB, dC,
                dD_part.sum(0) if ctx.has_D and need[5] else None,
                dh0 if ctx.has_h0 and need[6] else None, None,
                dbias_part.sum(0) if ctx.has_bias and need[8] else None, None)


def selective_scan_cpp(x, delta, A, B, C, D=None, *, initial_state=None, output_final_state=False, chunk_size=None,
                       delta_bias=None, delta_softplus=False):
    """The selective scan by the C++ kernel (module docstring); arguments as
    :func:`seqmix.ops.selective_scan` (already checked there). Returns (y [B, T, D], h_T [B, D, N])."""
    out_dtype = x.dtype
    dt = x.dtype
    for t in (delta, A, B, C, D, initial_state, delta_bias):
        if t is not None:
            dt = torch.promote_types(dt, t.dtype)
    if dt in (torch.float16, torch.bfloat16):
        dt = torch.float32
    x, delta, A, B, C = (t.to(dt).contiguous() for t in (x, delta, A, B, C))
    D = D.to(dt).contiguous() if D is not None else None
    h0 = initial_state.to(dt).contiguous() if initial_state is not None else None
    bias = delta_bias.to(dt).contiguous() if delta_bias is not None else None
    softplus = bool(delta_softplus)
    L = chunk_size or CHUNK
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, delta, A, B, C, D, h0, bias))
    if needs_grad:
        y, h = _CppScan.apply(x, delta, A, B, C, D, h0, L, bias, softplus)
    else:
        y, h = load().forward(x, delta, A, B, C, D, h0, L, 0, bias, softplus)[:2]
    return y.to(out_dtype), h
