"""Long Range Arena: data generation and training throughput.

    python bench/lra.py --part generators      # ListOps 96k, Pathfinder-32 10k (the targets)
    python bench/lra.py --part training        # examples/s and peak memory per mixer
    python bench/lra.py --part pathfinder-probe  # is Pathfinder-32 easy learnable at all?
    python bench/lra.py --part pathfinder-probe --probe-resolution 16  # the same at 16 × 16 (4 dashes)
    python bench/lra.py --quick                # small sizes, seconds

1. Generators. ListOps: the vectorised lockstep generator (seqmix.data.lra.listops_generate)
   making 96,000 trees of 500-2000 tokens, against the recursive reference draw
   (listops_tree, one tree at a time with rejection, as LRA's script) timed on fewer trees
   in the same run; target ≤ 60 s for 96k. Pathfinder-32: 10,000 images per difficulty;
   target ≤ 60 s for 10k (hard, LRA's level).
2. Training: one optimizer step (forward, backward, AdamW) of the LRA classifier (2 layers,
   d = 64, mean pooling) per mixer on ListOps at L = 2000 and Image at L = 1024, examples/s;
   the peak memory of a step at L ∈ {256, 512, 1024, 2048} and the fitted exponent of
   memory in L (target: ≤ 1.2 for the linear-time mixers, about 2 for softmax attention).
3. Pathfinder probe (the control behind lra-tiny's Pathfinder caveat): on the tiny scale's
   Pathfinder-32 (easy, 2 distractors), (a) the best accuracy of one threshold on the two
   markers' distance (from the generator's parts: how much a shortcut feature separates), and
   (b) a 3-layer CNN (not a seqmix model) trained from scratch for 1,000 steps at batch 32 on
   fresh images, its test accuracy every 250 steps: the images carry the label and a model
   with 2-D locality finds it within the budget at which the sequence models stay at chance.
   --probe-resolution 16: the same on Pathfinder-16 (32 × 32's pixel sizes, 4 dashes, the
   markers kept clear of the other curve: docs/lra.md, "Pathfinder-16"); --no-clear-markers
   drops that last option.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from _common import base_parser, fit_exponent, peak_memory_mb, print_table, setup, target_line, write_json

from seqmix.data.lra import listops_generate, listops_tree, pathfinder_generate

MIXERS = {"softmax": ("softmax_attention", {"heads": 4, "n": 64}), "linear": ("linear_attention", {"heads": 4, "n": 64}),
          "normalized": ("normalized_attention", {"heads": 4, "n": 64}), "S6": ("s6", {"d_state": 16}),
          "MetaLA": ("metala", {"heads": 4})}
LINEAR_TIME = ("linear", "normalized", "S6", "MetaLA")


def bench_generators(quick: bool) -> tuple[list, list]:
    n_lo, n_pf = (4_000, 1_000) if quick else (96_000, 10_000)
    rows, targets = [], []
    t0 = time.perf_counter()
    a = listops_generate(np.random.default_rng(0), n_lo)
    t_vec = time.perf_counter() - t0
    # the recursive reference: rejection until m trees of the right length
    m, rng, kept = (20 if quick else 100), np.random.default_rng(1), 0
    t0 = time.perf_counter()
    while kept < m:
        _, L = listops_tree(rng)
        kept += 500 < L < 2000
    t_ref = time.perf_counter() - t0
    rate_vec, rate_ref = n_lo / t_vec, m / t_ref
    rows.append(["ListOps 500-2000 (vectorised)", n_lo, t_vec, rate_vec, rate_vec / rate_ref])
    rows.append(["ListOps 500-2000 (recursive reference)", m, t_ref, rate_ref, 1.0])
    lengths = (a.inputs > 0).sum(1)
    print(f"ListOps lengths: min {lengths.min()}, median {int(np.median(lengths))}, max {lengths.max()}; "
          f"label counts {np.bincount(a.labels, minlength=10).tolist()}")
    targets.append(target_line("ListOps 96k in <= 60 s", (t_vec <= 60) if not quick else None,
                               f"{n_lo:,} in {t_vec:.1f} s ({rate_vec:,.0f}/s; reference {rate_ref:,.1f}/s, "
                               f"{rate_vec / rate_ref:.0f}x; 96k at this rate: {96_000 / rate_vec:.1f} s)"))
    for level, length in (("easy", 6), ("medium", 9), ("hard", 14)):
        t0 = time.perf_counter()
        pathfinder_generate(np.random.default_rng(2), n_pf, contour_length=length)
        t = time.perf_counter() - t0
        rows.append([f"Pathfinder-32 {level}", n_pf, t, n_pf / t, None])
        if level == "hard":
            targets.append(target_line("Pathfinder-32 10k in <= 60 s", (t <= 60) if not quick else None,
                                       f"{n_pf:,} hard images in {t:.1f} s ({n_pf / t:,.0f}/s)"))
    t0 = time.perf_counter()
    pathfinder_generate(np.random.default_rng(3), 100, resolution=128, contour_length=14)
    t = time.perf_counter() - t0
    rows.append(["Path-X 128 hard", 100, t, 100 / t, None])
    print_table("LRA generators", ["case", "examples", "seconds", "examples/s", "x reference"], rows)
    return rows, targets


def _model(mixer: str, kw: dict, L: int, vocab: int, classes: int):
    from seqmix.models import ModelConfig, build_model

    torch.manual_seed(0)
    return build_model(ModelConfig(mixer=mixer, mixer_kwargs=kw, d_model=64, n_layers=2, vocab_size=vocab, max_seq_len=L,
                                   classifier={"num_classes": classes, "pooling": "mean"}))


def step_builder(mixer: str, kw: dict, L: int, B: int, vocab: int, classes: int):
    """One training step (module level: sent to the memory-measuring process)."""
    m = _model(mixer, kw, L, vocab, classes)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, vocab, (B, L), generator=g)
    y = torch.randint(0, classes, (B,), generator=g)

    def step():
        logits, target = m.scored_logits(x, y)
        F.cross_entropy(logits, target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bench_training(quick: bool, memory: bool) -> tuple[list, list, list]:
    B = 2 if quick else 4
    cases = (("ListOps", 2000 if not quick else 256, 16, 10), ("Image", 1024 if not quick else 128, 257, 10))
    rows = []
    for task, L, vocab, classes in cases:
        for label, (mixer, kw) in MIXERS.items():
            step = step_builder(mixer, kw, L, B, vocab, classes)
            step()
            t0 = time.perf_counter()
            n = 2
            for _ in range(n):
                step()
            dt = (time.perf_counter() - t0) / n
            rows.append([f"{task} L={L}", label, B, dt * 1e3, B / dt])
    print_table("LRA training step (2 layers, d = 64)", ["case", "impl", "batch", "ms/step", "examples/s"], rows)
    mem_rows, targets = [], []
    if memory:
        Ls = (128, 256, 512) if quick else (256, 512, 1024, 2048)
        for label, (mixer, kw) in MIXERS.items():
            mb = [peak_memory_mb(step_builder, mixer, kw, L, B, 16, 10) for L in Ls]
            e = fit_exponent(Ls, mb)
            mem_rows.append([label, *mb, e])
            if label in LINEAR_TIME:
                targets.append(target_line(f"{label}: memory exponent <= 1.2", e <= 1.2 if not quick else None, f"{e:.2f}"))
            else:
                targets.append(target_line(f"{label}: memory exponent about 2", abs(e - 2) <= 0.4 if not quick else None, f"{e:.2f}"))
        print_table(f"peak memory of a training step (MB), batch {B}", ["impl", *[f"L={L}" for L in Ls], "exponent"], mem_rows)
    return rows, mem_rows, targets


def pathfinder_probe(quick: bool, resolution: int = 32, clear_markers: bool = True) -> list:
    """Part 3 (module docstring): [what, accuracy %] rows."""
    steps, batch = (100, 32) if quick else (1_000, 32)
    R = resolution
    kw = dict(contour_length=6, num_distractors=2)
    if R == 16:
        kw = dict(contour_length=4, num_distractors=2, pixel_scale=1, clear_markers=clear_markers)
    train = pathfinder_generate(np.random.default_rng(0), steps * batch, resolution=R, **kw)
    test, parts = pathfinder_generate(np.random.default_rng(1), 2_000, resolution=R, return_parts=True, **kw)
    m = parts["markers"].astype(np.float64)
    dist = np.sqrt(((m[:, 0] - m[:, 1]) ** 2).sum(-1))
    rows = [["markers' distance < t (best t)", 100 * max(((dist < t) == test.labels).mean() for t in np.arange(2, 40, 0.5))],
            ["majority class", 100 * max(test.labels.mean(), 1 - test.labels.mean())]]
    torch.manual_seed(0)
    img = lambda a: torch.tensor(a.inputs > 1, dtype=torch.float32).view(-1, 1, R, R)  # noqa: E731
    X, Y, Xt, Yt = img(train), torch.tensor(train.labels), img(test), torch.tensor(test.labels)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 32, 3, padding=1, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(32 * (R // 4) ** 2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.AdamW(cnn.parameters(), lr=1e-3)
    for s in range(steps):
        i = slice(batch * s, batch * (s + 1))
        loss = F.cross_entropy(cnn(X[i]), Y[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (s + 1) % max(1, steps // 4) == 0:
            with torch.no_grad():
                rows.append([f"3-layer CNN after {s + 1} steps (batch {batch})", 100 * (cnn(Xt).argmax(1) == Yt).float().mean().item()])
    task = "Pathfinder-32 easy" if R == 32 else \
        f"Pathfinder-16, 4 dashes ({'markers clear' if clear_markers else 'markers may touch'})"
    print_table(f"{task}, 2,000 test images: accuracy %", ["what", "accuracy %"],
                [[w, f"{a:.1f}"] for w, a in rows])
    return rows


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--part", choices=("generators", "training", "pathfinder-probe", "all"), default="all")
    p.add_argument("--probe-resolution", type=int, choices=(16, 32), default=32, help="pathfinder-probe: image side")
    p.add_argument("--no-clear-markers", action="store_true", help="pathfinder-probe at 16: markers may touch the other curve")
    args = p.parse_args()
    info = setup(args)
    out = {"machine": info}
    targets = []
    if args.part in ("generators", "all"):
        rows, t = bench_generators(args.quick)
        out["generators"], targets = rows, targets + t
    if args.part in ("training", "all"):
        rows, mem, t = bench_training(args.quick, not args.no_memory)
        out["training"], out["memory"], targets = rows, mem, targets + t
    if args.part == "pathfinder-probe":
        out["pathfinder_probe"] = pathfinder_probe(args.quick, args.probe_resolution, not args.no_clear_markers)
    out["targets"] = targets
    write_json(args, "lra" + ("" if args.part == "all" else f"-{args.part}"), out)


if __name__ == "__main__":
    main()
