"""Settings of the process seqmix runs in (not of seqmix's computation).

:func:`keep_freed_memory` tells glibc's malloc to keep the memory a process frees for its next
allocations instead of handing it back to the operating system. PyTorch's CPU tensors come from
malloc, and glibc maps every block above its mmap threshold (128 KiB at first, raised as large
blocks are freed, 32 MiB at most) fresh from the OS and trims the heap's free top above twice
that: so a training step whose tensors total more than a few tens of MB gets its memory back
from the kernel on every step, page by page, each page faulted in and zeroed (system time). At
T = 16k a forward+backward of a recurrent mixer at d_model 128 took 5-7 page faults per token,
1.4 µs each, where at T = 512 it took none: the cost per token grows with T although the
computation does not (``python bench/scaling.py``; docs/performance.md). jemalloc and tcmalloc
(``LD_PRELOAD``, as PyTorch's CPU performance guide suggests) keep freed memory in the same way.

The setting is process-wide and opt-in: the process's resident memory then stays at its peak.
glibc does not always honour it: a probe that allocates, touches and frees 64 MiB six times in a
fresh process faulted on every step in 2 of 6 processes even with the setting (the others: once,
then never); the cause was not found. ``python bench/scaling.py`` re-times a mixer with it where
the default allocator's page faults miss the target, and prints what it gave.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
# glibc's defaults (malloc/malloc.c), restored by keep_freed_memory(False)
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
_DEFAULT_MMAP_THRESHOLD = 128 * 1024
_DEFAULT_MMAP_MAX = 65536
_TRIM_MAX = 2**31 - 1  # mallopt's int: a free heap top of 2 GiB is the most it keeps


def _mallopt():
    """glibc's mallopt, or None (another OS or C library: musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory(enable: bool = True) -> bool:
    """Keep freed memory in this process (``enable``), or set glibc's default values back (``False``;
    glibc's adaptive mmap threshold stays off, as after any mallopt call). Returns whether the setting
    was applied: False where the C library is not glibc (nothing changes there).

    With ``enable``: no block is mmapped (``M_MMAP_MAX = 0``: every allocation comes from the heap)
    and the heap's free top is trimmed only above 2 GiB (mallopt's largest value), so what a step frees
    usually serves the next step without page faults (not always: the module docstring)."""
    if not isinstance(enable, bool):
        raise ValueError(f"keep_freed_memory: argument 'enable' must be a bool, got {type(enable).__name__}")
    mallopt = _mallopt()
    if mallopt is None:
        return False
    if enable:
        settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_MAX))
    else:
        settings = ((_M_MMAP_MAX, _DEFAULT_MMAP_MAX), (_M_MMAP_THRESHOLD, _DEFAULT_MMAP_THRESHOLD),
                    (_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD))
    return all(mallopt(param, value) == 1 for param, value in settings)
