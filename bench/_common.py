"""Shared tools of the benchmark scripts: timing, the machine's matmul peak, peak memory,
exponent fits, tables and JSON. Every script times competing implementations side by
side in one run and prints ratios; nothing here asserts (targets are printed as met or
not met)."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing

OUT_DIR = ROOT / "bench" / "out"


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes (seconds): a smoke run, not the targets")
    p.add_argument("--repeats", type=int, default=3, help="timed repetitions per measurement (the minimum is reported)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--json", type=Path, default=None, help="where to write the JSON results (default bench/out/<script>.json)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements (each forks a process)")
    return p


def add_decode_tokens(p: argparse.ArgumentParser, quick: int, full: int) -> None:
    """The --decode-tokens option: decoding steps timed per context (default ``quick`` with
    --quick, else ``full``); :func:`setup` fills the default."""
    p.add_argument("--decode-tokens", type=int, default=None,
                   help=f"decoding steps timed per context, the min is reported (default {full}; {quick} with --quick)")
    p.set_defaults(decode_tokens_defaults=(quick, full))


def setup(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    defaults = getattr(args, "decode_tokens_defaults", None)
    if defaults is not None and args.decode_tokens is None:
        args.decode_tokens = defaults[0] if args.quick else defaults[1]
    return machine_info(args.device)


def decode_timings(m, contexts, *, d_model: int, tokens: int, device: str = "cpu", batch: int = 1, warmup: int = 3) -> dict:
    """Decoding cost of mixer ``m`` after contexts of L tokens: one Cache per L, prefilled (no
    grad; timed), then ``tokens`` one-token steps decoded round-robin over the caches, so that a
    change in the machine's load hits every length alike. Returns {L: dict(prefill_ms,
    state_floats (per sequence, after the prefill), state_floats_after (after decoding),
    state_bytes, ms_per_token (min), median_ms)}."""
    from seqmix import Cache

    caches, out = {}, {}
    with torch.no_grad():
        for L in contexts:
            caches[L] = Cache()
            sync(device)
            t0 = time.perf_counter()
            m(torch.randn(batch, L, d_model, generator=torch.Generator().manual_seed(L)).to(device), cache=caches[L])
            sync(device)
            out[L] = dict(prefill_ms=(time.perf_counter() - t0) * 1e3, state_floats=caches[L].floats() // batch,
                          state_bytes=caches[L].nbytes() // batch)
        toks = torch.randn(warmup + tokens, batch, 1, d_model, generator=torch.Generator().manual_seed(0)).to(device)
        times = {L: [] for L in contexts}
        for i, tok in enumerate(toks):
            for L in contexts:
                sync(device)
                t0 = time.perf_counter()
                m(tok, cache=caches[L])
                sync(device)
                if i >= warmup:  # the first steps at a new shape pay one-time costs
                    times[L].append((time.perf_counter() - t0) * 1e3)
    for L in contexts:
        out[L].update(state_floats_after=caches[L].floats() // batch, ms_per_token=min(times[L]),
                      median_ms=statistics.median(times[L]))
    return out


def machine_info(device: str) -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    return info


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def timeit(fn, *, repeats: int = 3, warmup: int = 1, device: str = "cpu") -> dict:
    """Runs fn warmup + repeats times; returns min and median wall time in ms."""
    for _ in range(warmup):
        fn()
    sync(device)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append((time.perf_counter() - t0) * 1e3)
    return {"min_ms": min(ts), "median_ms": statistics.median(ts), "runs": len(ts)}


def matmul_peak_gflops(device: str = "cpu", dtype=torch.float32, sizes=(1024, 2048, 3072), repeats: int = 3) -> float:
    """The machine's float32 matmul rate (best over a few square sizes), measured now."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = timeit(lambda: a @ b, repeats=repeats, device=device)["min_ms"]
        best = max(best, 2 * n**3 / (t * 1e-3) / 1e9)
    return best


def _rss_mb() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) / 1024
    return out


def _peak_rss(builder, args) -> float:
    """In the fresh process of :func:`peak_memory_mb`: MB that one call of ``builder(*args)()`` adds."""
    fn = builder(*args)
    fn()  # warm-up: one-time allocations (thread pools, caches) are not the op's memory
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets this process's high-water mark of resident memory
    before = _rss_mb()["VmRSS"]
    fn()
    return _rss_mb()["VmHWM"] - before


_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def peak_memory_mb(builder, *args, device: str = "cpu") -> float | None:
    """Peak memory (MB) that one call of ``builder(*args)()`` adds.

    ``builder`` is a module-level function (it is sent to another process) returning the
    function to measure. CPU: a fresh process (spawned: a fork would inherit the OpenMP
    pool and can hang), with glibc told to return freed blocks of 64 KiB or more, builds
    the inputs, runs the function once to warm up, resets its high-water mark of
    resident memory (/proc/self/clear_refs), runs it again and reports VmHWM minus the
    resident memory before the call: the peak of everything the call allocated
    (tensors, autograd buffers, temporaries; blocks under 64 KiB may be reused unseen).
    CUDA: torch.cuda.max_memory_allocated around a call in this process.
    """
    if str(device).startswith("cuda"):
        fn = builder(*args)
        fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    # glibc keeps freed small blocks resident, so a second call would reuse the first's pages
    # unseen: in the child, every block of 64 KiB or more is mmapped and returned when freed
    return in_fresh_process(_peak_rss, builder, args, env=_MALLOC_ENV)


def _call_child(queue, threads, fn, args):
    try:
        torch.set_num_threads(threads)
        queue.put(fn(*args))
    except Exception as e:  # report, do not hang the parent
        queue.put(RuntimeError(f"{type(e).__name__}: {e}"))


def in_fresh_process(fn, *args, env: dict[str, str] | None = None):
    """``fn(*args)`` in a fresh process (spawned: a fork would inherit the OpenMP pool and can
    hang) at this process's thread count, with ``env`` added to its environment; its picklable
    result returned (its exception re-raised as a RuntimeError). ``fn`` is a module-level function.
    Timings taken there do not depend on what this process ran before: glibc's malloc raises its
    mmap threshold as large blocks are freed, so one process's history decides whether a later
    tensor of a few MB is served from the heap or mapped fresh and faulted in by the kernel."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_call_child, args=(q, torch.get_num_threads(), fn, args))
    with mock.patch.dict(os.environ, env or {}):  # the child reads its environment at start; ours is restored
        p.start()
    res = q.get()
    p.join()
    if isinstance(res, Exception):
        raise res
    return res


def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log y against log x: y ~ x^slope."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c, justify="right" if c not in ("case", "mode", "impl", "target", "status") else "left")
    for r in rows:
        table.add_row(*[fmt(v) for v in r])
    Console(width=200).print(table)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def target_line(name: str, met: bool | None, detail: str) -> dict:
    status = "n/a" if met is None else ("MET" if met else "NOT MET")
    print(f"  [{status:7s}] {name}: {detail}")
    return {"target": name, "met": met, "detail": detail}


def write_json(args, script: str, payload: dict) -> Path:
    path = args.json or OUT_DIR / f"{script}{'-quick' if args.quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path


def mixer_fwd_bwd(m, x):
    """A closure running one forward + backward of mixer m on x (y.sum() into the parameters and x), for timeit."""
    def run():
        x.grad = None
        m.zero_grad(set_to_none=True)
        m(x).sum().backward()

    return run


def write_doc_section(path: Path, marker: str, text: str) -> Path:
    """Replaces the text between ``<!-- {marker} -->`` and ``<!-- /{marker} -->`` in the Markdown file ``path``
    with ``text`` (a script's results section: the script owns that text, the rest of the page is written by
    hand); where the markers are absent they are appended at the end of the file with the text between them."""
    path = Path(path)
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    page = path.read_text() if path.exists() else ""
    block = f"{start}\n{text.strip()}\n{end}"
    i, j = page.find(start), page.find(end)
    if i >= 0 and j > i:
        page = page[:i] + block + page[j + len(end):]
    elif i >= 0 or j >= 0:
        raise SystemExit(f"{path}: only one of the markers {start!r} / {end!r} is present; fix the page by hand")
    else:
        page = page.rstrip("\n") + ("\n\n" if page.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    print(f"wrote the section {marker!r} of {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return path
