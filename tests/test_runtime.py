"""seqmix.runtime.keep_freed_memory: glibc keeps freed memory for the next allocation (page faults counted)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import seqmix.runtime

_PROBE = textwrap.dedent("""
    import resource, sys, torch
    import seqmix.runtime
    applied = seqmix.runtime.keep_freed_memory() if sys.argv[1] == "keep" else None
    def step():  # a 64 MiB tensor, above glibc's largest mmap threshold, touched and freed
        t = torch.ones(16 * 2**20)
        del t
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        step()
    print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 6)
""")


def _faults(setting: str):
    out = subprocess.run([sys.executable, "-c", _PROBE, setting], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    applied, faults = out.stdout.split()
    return applied, float(faults)


@pytest.mark.skipif(seqmix.runtime._mallopt() is None, reason="glibc's mallopt is not available here")
def test_keep_freed_memory_removes_the_page_faults_of_a_repeated_allocation():
    applied, keep = _faults("keep")
    _, default = _faults("default")
    assert applied == "True"
    pages = 64 * 2**20 / 4096
    assert default > 0.9 * pages  # glibc maps the 64 MiB fresh on every step: a fault per page
    # kept: a step reuses an earlier step's pages (the first repeated step may still extend the heap, where
    # PyTorch's aligned block does not fit the freed one: measured 16384 faults, then 0 in the next five)
    assert keep < 0.6 * pages


def test_keep_freed_memory_checks_its_argument():
    with pytest.raises(ValueError, match="'enable' must be a bool"):
        seqmix.runtime.keep_freed_memory("yes")
