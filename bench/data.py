"""The harness's speed: MQAR generation and the labelled-positions-only head (issue: harness).

    python bench/data.py            # 100k examples per MQAR task, the head at V = 8192
    python bench/data.py --quick    # 10k examples, seconds

1. MQAR generation, vectorized (seqmix.data.multiquery_ar) against a per-example loop in
   Zoology's style (numpy choice without replacement for keys, values and the power-law
   gaps, one example at a time), both measured in this run on the same task; the loop runs
   on fewer examples and its rate (examples/s) is compared. Target: 100k examples of
   every Zoology/DSF task in at most 10 s each ("seconds, not minutes").
2. The B'MOJO synthetic tasks: 12,800 examples each (MAD's training-set size).
3. One training step (forward + backward) of the 2-layer MQAR model (linear attention,
   d = 64, L = 64, B = 64, V = 8192) with logits at the 4 labelled positions per sequence
   against logits at all 64 positions then masked.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from _common import base_parser, print_table, setup, target_line, timeit, write_json

from seqmix.data import multiquery_ar
from seqmix.data.base import IGNORE
from seqmix.data.synthetic import FuzzyMQARConfig, InductionHeadsConfig, NoisyMQARConfig, SelectiveCopyingConfig

TASKS = ((64, 4), (128, 8), (256, 16), (512, 64))


def loop_reference(rng: np.random.RandomState, M: int, V: int, L: int, N: int, a: float = 0.01):
    """One example at a time, as Zoology's generator draws them (numpy legacy choice)."""
    space = (L - 2 * N) // 2
    w = a * np.arange(1, space + 1) ** (a - 1)
    p = w / w.sum()
    inputs = np.zeros((M, L), np.int64)
    labels = np.full((M, L), IGNORE, np.int64)
    for i in range(M):
        k = rng.choice(np.arange(1, V // 2), N, replace=False)
        v = rng.choice(np.arange(V // 2, V), N, replace=False)
        inputs[i, 0:2 * N:2], inputs[i, 1:2 * N:2] = k, v
        pos = 2 * N + 2 * rng.choice(space, N, replace=False, p=p)
        inputs[i, pos], labels[i, pos] = k, v
    return inputs, labels


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    p = base_parser(__doc__)
    args = p.parse_args()
    info = setup(args)
    M = 10_000 if args.quick else 100_000
    M_loop = 1_000 if args.quick else 5_000
    rows, results, targets = [], [], []
    for L, N in TASKS:
        t_vec = min(_seconds(lambda: multiquery_ar(np.random.default_rng(0), num_examples=M, seq_len=L, num_kv_pairs=N))
                    for _ in range(args.repeats))
        t_loop = min(_seconds(lambda: loop_reference(np.random.RandomState(0), M_loop, 8192, L, N)) for _ in range(max(1, args.repeats - 1)))
        rate_vec, rate_loop = M / t_vec, M_loop / t_loop
        rows.append([f"mqar({L},{N})", M, t_vec, rate_vec, M_loop, t_loop, rate_loop, rate_vec / rate_loop])
        results.append(dict(task=f"mqar({L},{N})", examples=M, seconds=t_vec, loop_examples=M_loop, loop_seconds=t_loop,
                            speedup=rate_vec / rate_loop))
    print_table("MQAR generation (V = 8192): vectorized vs per-example loop",
                ["case", "examples", "s", "examples/s", "loop examples", "loop s", "loop examples/s", "speedup"], rows)
    if not args.quick:
        worst = max(r["seconds"] for r in results)
        targets.append(target_line("100k MQAR examples in <= 10 s for every task", worst <= 10, f"slowest {worst:.2f} s"))

    syn = []
    for cfg in (SelectiveCopyingConfig(), InductionHeadsConfig(), NoisyMQARConfig(), FuzzyMQARConfig()):
        t = min(_seconds(lambda: cfg.generate(np.random.default_rng(0))) for _ in range(args.repeats))
        syn.append([cfg.slice_name, cfg.num_examples, t, cfg.num_examples / t])
        results.append(dict(task=cfg.slice_name, examples=cfg.num_examples, seconds=t))
    print_table("B'MOJO synthetic tasks (MAD defaults)", ["case", "examples", "s", "examples/s"], syn)

    from seqmix.models import build_model

    torch.manual_seed(0)
    B, L, V = 64, 64, 8192
    m = build_model(dict(mixer="linear_attention", d_model=64, vocab_size=V, max_seq_len=L, channel_mixer="none"))
    x = torch.randint(0, V, (B, L))
    lab = torch.full((B, L), IGNORE)
    lab[:, 8:64:14] = 5000  # 4 labelled positions per sequence, as MQAR (64, 4)

    def scored():
        logits, t = m.scored_logits(x, lab)
        F.cross_entropy(logits, t).backward()

    def full():
        logits = m(x)
        F.cross_entropy(logits.view(-1, V), lab.view(-1), ignore_index=IGNORE).backward()

    a = timeit(scored, repeats=args.repeats, device=args.device)["min_ms"]
    b = timeit(full, repeats=args.repeats, device=args.device)["min_ms"]
    print_table("one fwd+bwd of the MQAR model (d = 64, L = 64, B = 64, V = 8192)", ["impl", "ms", "speedup"],
                [["logits at labels", a, b / a], ["logits everywhere", b, 1.0]])
    results.append(dict(case="head", scored_ms=a, full_ms=b, speedup=b / a))
    targets.append(target_line("labelled-positions head faster than the full head", a < b, f"{b / a:.2f}x"))
    write_json(args, "data", dict(machine=info, results=results, targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
