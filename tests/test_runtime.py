"""seqmix.runtime.keep_freed_memory: glibc keeps freed memory for the next allocation (page faults counted)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import seqmix.runtime

_PROBE = textwrap.dedent("""
    import resource, sys, torch
    import seqmix.runtime
    applied = seqmix.runtime.keep_freed_memory() if sys.argv[1] in ("keep", "restored") else None
    if sys.argv[1] == "restored":
        applied = applied and seqmix.runtime.keep_freed_memory(False)
    def step():  # a 64 MiB tensor, above glibc's largest mmap threshold, touched and freed
        t = torch.ones(16 * 2**20)
        del t
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(6):
        step()
    print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 6)
""")


def _faults(setting: str, env: dict | None = None):
    out = subprocess.run([sys.executable, "-c", _PROBE, setting], capture_output=True, text=True, timeout=120,
                         env=None if env is None else {**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    applied, faults = out.stdout.split()
    return applied, float(faults)


@pytest.mark.skipif(seqmix.runtime._mallopt() is None, reason="glibc's mallopt is not available here")
def test_keep_freed_memory_removes_the_page_faults_of_a_repeated_allocation():
    """With glibc's defaults every step maps its 64 MiB fresh (a fault per page). With the setting a
    step reuses an earlier step's pages, but not in every process: in 2 of 6 fresh processes on the
    development machine (and once in CI) every step still faulted (the tcache, which mallopt cannot
    switch off: the module docstring). So the setting must work in at least one of six fresh processes."""
    _, default = _faults("default")
    pages = 64 * 2**20 / 4096
    assert default > 0.9 * pages
    applied, restored = _faults("restored")  # keep_freed_memory(False): glibc's default values again
    assert applied == "True" and restored > 0.9 * pages
    kept = []
    for _ in range(6):
        applied, keep = _faults("keep")
        assert applied == "True"
        kept.append(keep)
        if keep < 0.6 * pages:  # the first repeated step may extend the heap once, the next five reuse it
            break
    assert min(kept) < 0.6 * pages, kept


@pytest.mark.skipif(seqmix.runtime._mallopt() is None, reason="glibc's tunables are not available here")
def test_freed_memory_is_kept_in_a_process_started_with_the_variable():
    probe = "import seqmix.runtime as r; print(r.freed_memory_is_kept())"
    for env, expected in ((seqmix.runtime.keep_freed_memory_env({}), "True"), ({"GLIBC_TUNABLES": ""}, "False")):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert out.stdout.strip() == expected, out.stderr[-2000:]


@pytest.mark.skipif(seqmix.runtime._mallopt() is None, reason="glibc's tunables are not available here")
def test_keep_freed_memory_env_removes_the_page_faults_in_every_process():
    """GLIBC_TUNABLES from keep_freed_memory_env(), read when the process starts: no repeated step faults
    its 64 MiB in again, in each of four fresh processes (the tcache and fastbins off too: with the first
    two settings alone 4 of 8 processes faulted on every step)."""
    env = seqmix.runtime.keep_freed_memory_env({})
    pages = 64 * 2**20 / 4096
    for _ in range(4):
        _, faults = _faults("env", env)
        assert faults < 0.01 * pages
    _, faults = _faults("env", {"GLIBC_TUNABLES": ""})  # the probe itself: glibc's defaults fault every step
    assert faults > 0.9 * pages


def test_keep_freed_memory_env_keeps_other_tunables():
    env = seqmix.runtime.keep_freed_memory_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_max=7"})
    tunables = env["GLIBC_TUNABLES"].split(":")
    assert "glibc.malloc.arena_max=2" in tunables and "glibc.malloc.mmap_max=7" not in tunables
    assert set(seqmix.runtime.KEEP_FREED_MEMORY_TUNABLES) <= set(tunables)
    assert seqmix.runtime.freed_memory_is_kept(env) == (seqmix.runtime._mallopt() is not None)
    assert not seqmix.runtime.freed_memory_is_kept({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"})
    overridden = {"GLIBC_TUNABLES": env["GLIBC_TUNABLES"] + ":glibc.malloc.mmap_max=65536"}  # a later entry wins
    assert not seqmix.runtime.freed_memory_is_kept(overridden)
    with pytest.raises(ValueError, match="'environ' must be a mapping"):
        seqmix.runtime.freed_memory_is_kept("GLIBC_TUNABLES=x")
    with pytest.raises(ValueError, match="'environ' must be a mapping"):
        seqmix.runtime.keep_freed_memory_env(["x"])
    out = subprocess.run([sys.executable, "-m", "seqmix.runtime"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GLIBC_TUNABLES": ""})
    assert out.stdout.strip() == ":".join(seqmix.runtime.KEEP_FREED_MEMORY_TUNABLES)


def test_keep_freed_memory_checks_its_argument():
    with pytest.raises(ValueError, match="'enable' must be a bool"):
        seqmix.runtime.keep_freed_memory("yes")
