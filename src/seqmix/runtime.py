"""Settings of the process seqmix runs in (not of seqmix's computation).

glibc's malloc hands large freed blocks back to the operating system, and PyTorch's CPU tensors
come from malloc: it maps every block above its mmap threshold (128 KiB at first, raised as large
blocks are freed, 32 MiB at most) fresh from the OS and trims the heap's free top above twice
that. So a training step whose tensors total more than a few tens of MB gets its memory back from
the kernel on every step, page by page, each page faulted in and zeroed (system time). At
T = 16k a forward+backward of a recurrent mixer at d_model 128 took 5-7 page faults per token,
1.4 µs each, where at T = 512 it took none: the cost per token grows with T although the
computation does not (``python bench/scaling.py``; docs/performance.md). jemalloc and tcmalloc
(``LD_PRELOAD``, as PyTorch's CPU performance guide suggests) keep freed memory instead.

Two ways to keep it with glibc, both opt-in (the process's resident memory then stays at its
peak):

- :func:`keep_freed_memory_env` (reliable): the environment a *new* process needs,
  ``GLIBC_TUNABLES`` with no mmapped blocks, no heap trim below 2 GiB, and no per-thread cache
  (tcache) or fastbins for small blocks. glibc reads it when a process starts. The last two
  matter: a small block freed into the tcache or a fastbin stays marked in use, so when it sits
  between a freed large block and the heap's top the two cannot merge, the next large request
  (``posix_memalign`` asks a little more than the freed block holds) extends the heap, and every
  step faults its pages in again. A probe that allocates, touches and frees 64 MiB six times
  (``tests/test_runtime.py``) faulted on every step in 4 of 8 fresh processes with the first two
  settings alone (and on one step in six in the other 4), and never after its first step in each
  of 10 with all four (docs/performance.md, the allocator). From a shell::

      GLIBC_TUNABLES=$(python -m seqmix.runtime) seqmix train --config run.json

- :func:`keep_freed_memory` (in the running process, no restart): ``mallopt`` for the first two
  settings. It cannot turn the tcache off, so it is not reliable: with it the probe still faulted
  on every step in 1 of 8 fresh processes (2 of 6 in an earlier count), and on one step in six
  in the others.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
# glibc's defaults (malloc/malloc.c), restored by keep_freed_memory(False)
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
_DEFAULT_MMAP_THRESHOLD = 128 * 1024
_DEFAULT_MMAP_MAX = 65536
_TRIM_MAX = 2**31 - 1  # mallopt's int: a free heap top of 2 GiB is the most it keeps
# glibc's tunables (glibc >= 2.26) read at process start: the two mallopt settings, and no tcache or
# fastbins, whose freed small blocks pin a freed large block apart from the heap's top
KEEP_FREED_MEMORY_TUNABLES = ("glibc.malloc.mmap_max=0", f"glibc.malloc.trim_threshold={_TRIM_MAX}",
                              "glibc.malloc.tcache_count=0", "glibc.malloc.mxfast=0")


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


def glibc_malloc() -> bool:
    """Whether this process's C library is glibc (Linux), whose malloc the settings here concern."""
    return _mallopt() is not None


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


def _tunables(environ) -> dict[str, str]:
    """{tunable: value} of ``environ``'s GLIBC_TUNABLES (the last entry of a name wins, as in glibc)."""
    out = {}
    for entry in environ.get("GLIBC_TUNABLES", "").split(":"):
        if entry:
            name, _, value = entry.partition("=")
            out[name] = value
    return out


def _check_environ(environ, where):
    if environ is not None and not isinstance(environ, Mapping):
        raise ValueError(f"{where}: argument 'environ' must be a mapping of environment variables (or None), "
                         f"got {type(environ).__name__}")


def keep_freed_memory_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"GLIBC_TUNABLES": ...}``: the environment variable a new process needs to keep freed memory
    (the module docstring), the settings of ``environ``'s own ``GLIBC_TUNABLES`` (default: this
    process's environment) kept where they name another tunable. Pass it to a subprocess's
    environment; it has no effect on a process already running. On a C library other than glibc
    the variable is ignored."""
    _check_environ(environ, "keep_freed_memory_env")
    environ = os.environ if environ is None else environ
    ours = {t.split("=")[0] for t in KEEP_FREED_MEMORY_TUNABLES}
    kept = [f"{n}={v}" for n, v in _tunables(environ).items() if n not in ours]
    return {"GLIBC_TUNABLES": ":".join([*kept, *KEEP_FREED_MEMORY_TUNABLES])}


def freed_memory_is_kept(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``environ``'s GLIBC_TUNABLES sets every value of :data:`KEEP_FREED_MEMORY_TUNABLES` (a
    later entry of the same name overrides an earlier one), in a glibc process. Default:
    ``os.environ``, Python's copy of the environment the process started with, which is what glibc
    read, unless the program changed GLIBC_TUNABLES since: such a change has no effect on the
    allocator, but this function would count it. (``/proc/self/environ`` does not help: glibc
    parses the variable in place, and the start environment then shows its first entry only.)"""
    _check_environ(environ, "freed_memory_is_kept")
    have = _tunables(os.environ if environ is None else environ)
    want = dict(t.split("=") for t in KEEP_FREED_MEMORY_TUNABLES)
    return glibc_malloc() and all(have.get(n) == v for n, v in want.items())


if __name__ == "__main__":  # GLIBC_TUNABLES=$(python -m seqmix.runtime) COMMAND
    print(keep_freed_memory_env()["GLIBC_TUNABLES"])
