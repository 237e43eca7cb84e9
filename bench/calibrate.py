"""Calibrating a preset's tiny scale: the two measurements behind the tables of
docs/harness.md ("Calibrating the main job", "Tiny presets").

1. ``cost`` (one point after another) and ``ratio`` (every point side by side in interleaved
   rounds, ratios to a reference model: the main job's step-time target): the CPU time of one
   training step (forward, backward, AdamW; 1 thread, ``time.process_time``, so a loaded
   machine inflates it little) of every (model, task, d, n)
   of a preset's tiny grid, at the grid's batch size and sequence length. Multiply by the steps
   per run and the seeds, divide by the workers, to size a budget.
2. ``run``: one run of the grid (seed 0's config of that model, task and d) with fields changed,
   on fresh data (as many examples as steps × batch, unless --repeat), evaluated every
   --eval-every steps; prints the accuracy curve and the CPU time. This is how each row of the
   calibration tables was made.
3. ``escape``: the same run for every (model, d, seed, rate) of a grid, on --workers processes;
   prints each run's best accuracy and the step at which it left the plateau (its first
   evaluation at or above --left), and per (model, d) how many seeds left it at any of the rates:
   the tables of the sixth calibration (docs/harness.md).

    python bench/calibrate.py                  # = cost dsf-fig2 (the main job)
    python bench/calibrate.py cost dsf-fig2
    python bench/calibrate.py ratio dsf-fig2   # side by side, ratios to softmax; the <= 1.3x target
    python bench/calibrate.py run dsf-fig2 softmax --d 64 --steps 2500 --set model.init_std=0.1
    python bench/calibrate.py run dsf-fig2 S6 --d 64 --seed 1 --set train.lr=0.01
    python bench/calibrate.py run bmojo-fig2 Mamba --d 64 --task "mqar(32,4)" --steps 1500
    python bench/calibrate.py run dsf-fig2 softmax --steps 2500 --set model.mixer_kwargs.n=64 --seq-len 64 --kv 8
    python bench/calibrate.py run lra-tiny S6 --task pathfinder16 --steps 6000 --seed 1
    python bench/calibrate.py escape dsf-fig2 --models S6 SSD --d 32 64 --seeds 0 1 2 --lrs 0.01 \
        --steps 4000 --repeat --set train.schedule=constant --set train.warmup=0.5

--set takes a dotted path into the run's config (as in its config.json) and a JSON value
(a bare word is taken as a string); --segment the same for a field of every train and test
task config (data.train and data.test are lists, which --set does not index).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time

import torch

from seqmix.experiments import PRESETS
from seqmix.train import RunConfig, Trainer, make_run_config


def _grid(preset: str):
    if preset not in PRESETS:
        raise SystemExit(f"calibrate: unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")
    return PRESETS[preset].runs("tiny", skip_missing=True)


def _grid_steps(preset: str) -> dict:
    """{(model, task, d, n): (step, "batch×length")} for each point of the tiny grid: ``step()`` runs one
    training step (the trainer's loss, backward, AdamW) on a fixed random batch of the grid's shape."""
    out = {}
    for r in _grid(preset):
        key = (r.label, r.tags.get("task"), r.model.d_model, r.tags.get("n"))
        if key in out:
            continue
        trainer = Trainer(r, progress=False)
        model = trainer.build_model()
        opt = torch.optim.AdamW(model.parameters(), lr=r.train.lr)
        L, V = r.data.train[0].seq_len, model.config.vocab_size
        x = torch.randint(1, V, (r.data.batch_size, L))
        if getattr(model.config, "classifier", None) is not None:  # a classification task: one class per sequence
            y = torch.randint(0, model.config.classifier.num_classes, (r.data.batch_size,))
        else:
            y = torch.full_like(x, -100)
            y[:, L // 2::4] = x[:, L // 2::4]  # some labelled positions, as a task's targets

        def step(trainer=trainer, model=model, opt=opt, x=x, y=y):
            loss = trainer.loss(model, x, y)[0]
            opt.zero_grad()
            loss.backward()
            opt.step()

        out[key] = (step, f"{r.data.batch_size}×{L}")
    return out


def step_costs(preset: str, steps: int = 10, warmup: int = 3) -> list[list]:
    """[model, task, d, n, batch × length, ms of CPU per step] for each point of the tiny grid."""
    rows = []
    for key, (step, shape) in _grid_steps(preset).items():
        for i in range(warmup + steps):
            if i == warmup:
                t0 = time.process_time()
            step()
        rows.append([*key, shape, 1e3 * (time.process_time() - t0) / steps])
    return rows


#: the target on the main job: these models' training steps <= this many times softmax attention's
STEP_TARGETS = {"dsf-fig2": (("S6", "SSD"), 1.3)}


def step_ratios(preset: str, ref: str, rounds: int = 7, steps: int = 30, warmup: int = 10) -> list[list]:
    """[model, task, d, n, ms per step, ratio to ``ref``'s step at the same (task, d, n)]: every point's
    step timed side by side (each round runs ``steps`` steps of every point; CPU time, median of the
    rounds), so that a change of the machine's load hits every model alike."""
    grid = _grid_steps(preset)
    for step, _ in grid.values():
        for _ in range(warmup):
            step()
    ms = {k: [] for k in grid}
    for _ in range(rounds):
        for k, (step, _) in grid.items():
            t0 = time.process_time()
            for _ in range(steps):
                step()
            ms[k].append(1e3 * (time.process_time() - t0) / steps)
    med = {k: statistics.median(v) for k, v in ms.items()}
    rows = []
    for k, v in med.items():
        base = med.get((ref, *k[1:]))
        rows.append([*k, v, v / base if base else None])
    return rows


def _set(blob: dict, path: str, value: str) -> None:
    keys = path.split(".")
    node = blob
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            raise SystemExit(f"calibrate: --set {path}: {k!r} is not a section of the run's config")
        node = node[k]
    try:
        node[keys[-1]] = json.loads(value)
    except json.JSONDecodeError:
        node[keys[-1]] = value


def calibration_run(args) -> RunConfig:
    """The grid's seed-0 run of (label, task, d), with the changes of ``args``."""
    grid = [r for r in _grid(args.preset) if r.label == args.label and r.train.seed == 0
            and (args.d is None or r.model.d_model == args.d) and (args.task is None or r.tags.get("task") == args.task)]
    if not grid:
        raise SystemExit(f"calibrate: preset {args.preset!r} has no tiny run of model {args.label!r}"
                         + (f" at d = {args.d}" if args.d else "") + (f" on task {args.task!r}" if args.task else ""))
    blob = json.loads(grid[0].model_dump_json())
    blob["experiment"] = f"calibration/{args.preset}"
    train = blob["train"]
    train.update(seed=args.seed, max_steps=args.steps, epochs=10**6, eval_every_steps=args.eval_every)
    tasks = blob["data"]["train"] + blob["data"]["test"]
    for seg in tasks:
        if args.seq_len:
            seg["seq_len"] = args.seq_len
        if args.kv:
            seg["num_kv_pairs"] = args.kv
        for item in args.segment:
            path, _, value = item.partition("=")
            _set(seg, path, value)
    if args.seq_len:
        blob["model"]["max_seq_len"] = args.seq_len
    for item in args.set:
        path, _, value = item.partition("=")
        _set(blob, path, value)
    if not args.repeat:  # fresh data at the final batch size (--set data.batch_size=64 included)
        blob["data"]["train"][0]["num_examples"] = args.steps * blob["data"]["batch_size"]
    try:
        return make_run_config(**blob)  # one ValueError naming each bad field
    except ValueError as e:
        raise SystemExit(f"calibrate: the run's config after --set/--segment: {e}") from None


def left_at(history: list[tuple[int, float]], left: float) -> int | None:
    """The step of the first evaluation whose accuracy is at least ``left`` (None: never): where a run
    left the plateau. ``history``: [(step, accuracy)] in training order."""
    if not 0 < left <= 1:
        raise ValueError(f"left_at: argument 'left' must be an accuracy in (0, 1], got {left}")
    return next((step for step, acc in history if acc >= left), None)


def train_once(cfg: RunConfig, out: str | None = None):
    """Train ``cfg`` in ``out/<run id>`` (default: a temporary folder); returns (result, CPU seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        res = Trainer(cfg, run_dir=f"{out or tmp}/{cfg.run_id}", progress=False).fit()
        return res, time.process_time() - t0


def _escape_run(job: dict) -> dict:
    """One run of the escape grid (in a worker process): the job with its best accuracy, steps, CPU
    time and curve [(step, accuracy)]."""
    torch.set_num_threads(1)
    res, cpu = train_once(calibration_run(argparse.Namespace(**job["args"])))
    return {**job, "best": res.accuracy, "steps": res.steps, "cpu": cpu,
            "history": [(h.get("step"), h["accuracy"]) for h in res.history]}


def _unique(values: list) -> list:
    return list(dict.fromkeys(values))


def escape_jobs(args) -> list[dict]:
    """The grid's runs, one per (model, d, seed, rate) in that order (repeated values counted once); every
    config is built first, so a bad model, d, rate or field stops the grid before any run starts."""
    if any(item.partition("=")[0] == "train.lr" for item in args.set):
        raise SystemExit("calibrate: escape takes its rates from --lrs; drop --set train.lr")
    if any(not lr > 0 for lr in args.lrs):
        raise SystemExit(f"calibrate: --lrs must be positive learning rates, got {args.lrs}")
    jobs = []
    for label, d, seed, lr in itertools.product(*map(_unique, (args.models, args.d, args.seeds, args.lrs))):
        run_args = {**vars(args), "label": label, "d": d, "seed": seed, "set": [*args.set, f"train.lr={lr!r}"]}
        calibration_run(argparse.Namespace(**run_args))
        jobs.append({"model": label, "d": d, "seed": seed, "lr": lr, "args": run_args})
    return jobs


def escape_grid(jobs: list[dict], workers: int):
    """Each job's result, in the jobs' order, ``workers`` runs at a time; a run that fails cancels the
    runs not yet started."""
    if workers == 1:
        yield from map(_escape_run, jobs)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        yield from pool.map(_escape_run, jobs)
    finally:
        pool.shutdown(cancel_futures=True)


def escape_row(r: dict, left: float) -> str:
    step = left_at(r["history"], left)
    curve = " ".join(f"{100 * a:.0f}" for _, a in r["history"])
    return (f"| {r['model']} | {r['d']} | {r['seed']} | {r['lr']:.6g} | {100 * r['best']:.1f} | "
            f"{'never' if step is None else step} | {r['cpu']:.0f} | {curve} |")


def escape_summary(rows: list[dict], left: float) -> list[str]:
    """Per (model, d), in the rows' order: the seeds that left the plateau at any of their rates, and
    the runs that did."""
    lines = []
    for key in _unique([(r["model"], r["d"]) for r in rows]):
        cell = [r for r in rows if (r["model"], r["d"]) == key]
        seeds = _unique([r["seed"] for r in cell])
        gone = [s for s in seeds if any(left_at(r["history"], left) is not None for r in cell if r["seed"] == s)]
        runs = sum(left_at(r["history"], left) is not None for r in cell)
        lines.append(f"| {key[0]} | {key[1]} | {len(gone)} of {len(seeds)}{' (' + ', '.join(map(str, gone)) + ')' if gone else ''} | "
                     f"{runs} of {len(cell)} |")
    return lines


def print_escape(args) -> None:
    """The grid's table, a row per run as it finishes (in the grid's order), then the count of seeds that
    left the plateau per (model, d)."""
    try:
        left_at([], args.left)
    except ValueError:
        raise SystemExit(f"calibrate: --left must be an accuracy in (0, 1], got {args.left}") from None
    if args.workers < 1:
        raise SystemExit(f"calibrate: --workers must be at least 1, got {args.workers}")
    jobs = escape_jobs(args)
    data = "the grid's training set, repeated" if args.repeat else "fresh data"
    changes = " ".join(args.set + args.segment) or "none"
    print(f"{args.preset}: {args.steps} steps, {data}, changes: {changes}; 'left' = the first evaluation "
          f"(every {args.eval_every} steps) at >= {100 * args.left:.0f}%")
    print("| model | d | seed | lr | best % | left at step | CPU s | curve |\n|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for r in escape_grid(jobs, args.workers):
        rows.append(r)
        print(escape_row(r, args.left), flush=True)
    print("\n| model | d | seeds that left (at any rate) | runs that left |\n|---|---|---|---|")
    print("\n".join(escape_summary(rows, args.left)))
    print(f"\n{len(rows)} runs, {sum(r['cpu'] for r in rows):.0f} CPU-s in all")


def _run_options(a: argparse.ArgumentParser) -> None:
    """The options of ``run`` and ``escape`` that change the grid's run (calibration_run reads them)."""
    a.add_argument("--task", default=None, help="task name of the grid, e.g. 'mqar(32,4)' (default: the first)")
    a.add_argument("--steps", type=int, default=2500)
    a.add_argument("--eval-every", type=int, default=250)
    a.add_argument("--seq-len", type=int, default=None, help="change the task's sequence length")
    a.add_argument("--kv", type=int, default=None, help="change the task's key-value pairs (MQAR)")
    a.add_argument("--repeat", action="store_true", help="keep the grid's training set (epochs over it) instead of fresh data")
    a.add_argument("--set", action="append", default=[], metavar="PATH=JSON", help="change a field of the run's config")
    a.add_argument("--segment", action="append", default=[], metavar="PATH=JSON",
                   help="change a field of every train and test task config (e.g. resolution=16)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what")  # none (as `make bench` calls it): the main job's step costs
    c = sub.add_parser("cost", help="CPU ms per training step of each point of a preset's tiny grid (1 thread)")
    c.add_argument("preset")
    c.add_argument("--steps", type=int, default=10, help="timed steps per point")
    q = sub.add_parser("ratio", help="every point's training step side by side (interleaved rounds, 1 thread), "
                                     "ratios to a reference model; the main job's step-time target")
    q.add_argument("preset")
    q.add_argument("--ref", default="softmax", help="the model the ratios are taken to (default: softmax)")
    q.add_argument("--rounds", type=int, default=7)
    q.add_argument("--steps", type=int, default=30, help="steps of each point per round")
    r = sub.add_parser("run", help="one run of the tiny grid with fields changed; prints its accuracy curve")
    r.add_argument("preset")
    r.add_argument("label", help="the model's label in the preset")
    r.add_argument("--d", type=int, default=None, help="d_model of the grid (default: the first)")
    r.add_argument("--seed", type=int, default=0)
    _run_options(r)
    r.add_argument("--out", default=None, help="run folder parent (default: a temporary one)")
    e = sub.add_parser("escape", help="the run of `run` for every (model, d, seed, rate) of a grid; prints when each "
                                      "left the plateau and how many seeds did per (model, d)")
    e.add_argument("preset")
    e.add_argument("--models", nargs="+", required=True, metavar="LABEL", help="the models' labels in the preset")
    e.add_argument("--d", nargs="+", type=int, required=True, help="d_model values of the grid")
    e.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    e.add_argument("--lrs", nargs="+", type=float, required=True, help="peak learning rates")
    e.add_argument("--left", type=float, default=0.4,
                   help="accuracy that counts as off the plateau (default 0.4: MQAR (32, 4)'s plateau is 20-30%%)")
    e.add_argument("--workers", type=int, default=2, help="runs at a time, one process and one thread each")
    _run_options(e)
    args = p.parse_args()
    if args.what == "escape":
        print_escape(args)
        return
    if args.what is None:
        args = argparse.Namespace(what="cost", preset="dsf-fig2", steps=10)
    torch.set_num_threads(1)

    if args.what == "cost":
        print(f"{args.preset}: CPU ms per training step, 1 thread (time.process_time over {args.steps} steps)")
        print("| model | task | d | n | batch × L | ms / step |\n|---|---|---|---|---|---|")
        for row in step_costs(args.preset, args.steps):
            print("| " + " | ".join(str(v) for v in row[:-1]) + f" | {row[-1]:.1f} |", flush=True)
        return
    if args.what == "ratio":
        from _common import target_line

        print(f"{args.preset}: CPU ms per training step, 1 thread, every point side by side ({args.rounds} rounds of "
              f"{args.steps} steps each, median); ratio: x {args.ref}'s step at the same task, d and n")
        print("| model | task | d | n | ms / step | ratio |\n|---|---|---|---|---|---|")
        rows = step_ratios(args.preset, args.ref, args.rounds, args.steps)
        for row in rows:
            print("| " + " | ".join(str(v) for v in row[:4]) + f" | {row[4]:.2f} | " + (f"{row[5]:.2f}x |" if row[5] else "- |"))
        models, limit = STEP_TARGETS.get(args.preset, ((), None))
        for row in rows:
            if row[0] in models and row[5] is not None:
                target_line(f"{args.preset}: {row[0]}'s training step at d = {row[2]} <= {limit}x {args.ref}'s", row[5] <= limit,
                            f"{row[5]:.2f}x ({row[4]:.2f} ms)")
        return
    cfg = calibration_run(args)
    res, cpu = train_once(cfg, args.out)
    curve = " ".join(f"{h.get('step')}:{100 * h['accuracy']:.0f}" for h in res.history)
    print(f"{args.preset} {args.label} d={cfg.model.d_model} seed={args.seed} {' '.join(args.set + args.segment)}: "
          f"best {100 * res.accuracy:.1f}% in {res.steps} steps, {cpu:.0f} CPU-s | accuracy by step: {curve}")


if __name__ == "__main__":
    main()
