"""`seqmix show` for 6 mixers at T = 256: target under 20 s on a 2-core CPU.

    python bench/show.py              # the target's case: 6 mixers, T = 256, 3 repeats per thread count
    python bench/show.py --quick      # T = 64, one repeat (a smoke run, not the target)

1. End to end: the command itself, ``python -m seqmix show softmax_attention linear_attention
   s6 mamba2 gla metala -T 256 --input mqar`` (registry defaults, d_model 64), in a fresh
   process each time (imports included), with torch limited to 1 and to 2 threads
   (OMP_NUM_THREADS); PNG and --html side by side; min over the repeats. The target is
   judged on the best setting that uses at most 2 cores.
2. Stages, in this process: building the mixers, inspecting them (maps, decays, numbers),
   drawing the PNG, writing the HTML report.
3. The decay spectrum's source: ``dsf(x).lam`` with the DSF building B and C on first use
   (what show does) against the same system with B and C built (what it cost before), for
   the largest DSF of the six (Mamba-2: N = 16384, d_in = 128).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch

from _common import ROOT, base_parser, print_table, setup, target_line, timeit, write_json

from seqmix.analysis import show

MIXERS = ["softmax_attention", "linear_attention", "s6", "mamba2", "gla", "metala"]
TARGET_S = 20.0


def end_to_end(T: int, threads: int, html: bool, repeats: int) -> float:
    """Min wall seconds of the command in a fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "-m", "seqmix", "show", *MIXERS, "-T", str(T), "--input", "mqar", "--out", out]
            if html:
                cmd.append("--html")
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            dt = time.perf_counter() - t0
            if r.returncode != 0:
                raise RuntimeError(f"seqmix show failed: {r.stderr[-2000:]}")
            best = min(best, dt)
    return best


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--thread-counts", default="1,2", help="torch threads of the end-to-end runs (default 1,2)")
    args = p.parse_args()
    info = setup(args)
    T = 64 if args.quick else 256
    repeats = 1 if args.quick else args.repeats
    counts = [int(c) for c in args.thread_counts.split(",")]

    # 1. end to end
    rows, e2e = [], {}
    for threads in counts:
        for html in (False, True):
            s = end_to_end(T, threads, html, repeats)
            e2e[(threads, html)] = s
            rows.append([f"seqmix show x6, T={T}" + (" --html" if html else ""), threads, s, s / TARGET_S])
    print_table(f"end to end (fresh process, min of {repeats})", ["case", "threads", "seconds", "of target"], rows)

    # 2. stages in this process
    inp = show.make_input("mqar", T)
    stage = {}
    t0 = time.perf_counter()
    mixers, sources = show.mixers_for_show(MIXERS)
    stage["build mixers"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    views = show.inspect_mixers(mixers, inp, sources=sources)
    stage["inspect (maps, decays, numbers)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    png = show.figure_png(show.show_figure(views))
    stage["draw + PNG"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    html = show.html_report(views)
    stage["HTML report"] = time.perf_counter() - t0
    print_table(f"stages (this process, {torch.get_num_threads()} threads, one run)", ["case", "seconds"],
                [[k, v] for k, v in stage.items()])
    print(f"  PNG: {len(png) / 2**10:.0f} KiB, HTML: {len(html) / 2**10:.0f} KiB")

    # 3. the lazy DSF
    m = mixers[MIXERS.index("mamba2")]
    x = show.embed(inp, m.d_model)
    with torch.no_grad():
        lazy = timeit(lambda: m.dsf(x).lam, repeats=repeats)["min_ms"]
        eager = timeit(lambda: (lambda s: (s.B, s.C, s.lam))(m.dsf(x)), repeats=1, warmup=0)["min_ms"]
        system = m.dsf(x)
    print_table("decays of mamba2 (N = %d, d_in = %d)" % (system.N, system.d_in), ["case", "ms", "ratio"],
                [["dsf(x).lam, B and C built on first use", lazy, 1.0], ["dsf(x) with B and C built", eager, eager / lazy]])

    best = min(e2e[(t, False)] for t in counts if t <= 2) if any(t <= 2 for t in counts) else None
    print()
    targets = [target_line(
        f"seqmix show for 6 mixers at T = {T} in under {TARGET_S:.0f} s on 2 cores" + (" (quick run: not the target size)" if args.quick else ""),
        None if best is None or args.quick else best < TARGET_S,
        f"{best:.1f} s (min over {repeats} runs, best of threads {', '.join(str(t) for t in counts if t <= 2)})" if best is not None else "no run with <= 2 threads",
    )]
    write_json(args, "show", {
        "machine": info, "T": T, "mixers": MIXERS, "repeats": repeats,
        "end_to_end_s": [{"threads": t, "html": h, "seconds": s} for (t, h), s in e2e.items()],
        "stages_s": stage, "decays_ms": {"lazy": lazy, "eager": eager}, "targets": targets,
    })


if __name__ == "__main__":
    main()
