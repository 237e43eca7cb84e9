"""seqmix.experiments: named presets that reproduce the seeds' figures and tables.

    from seqmix.experiments import PRESETS, reproduce
    reproduce("dsf-fig2", "tiny")            # trains the grid, prints the table, writes the plot

Presets: dsf-fig1, dsf-fig2, dsf-fig3, dsf-table2, metala-table-a7, bmojo-table3,
dsf-table1-lm (language modelling), each with scales "paper" and "tiny". How to add one: docs/harness.md, "Presets".
"""

from __future__ import annotations

import json

from dataclasses import dataclass, field
from pathlib import Path

from .base import LR_DSF, LR_METALA_512, Claim, ModelSpec, Preset, Scale, TaskSpec, cell_key, evaluate_claims, load_sweep, lr_waves
from .._checks import output_dir
from .presets import PRESETS


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass
class Reproduction:
    preset: Preset
    scale: str
    rows: list  # best-over-LR rows of this reproduction's runs
    table: str
    plot: Path | None
    claims: list = field(default_factory=list)
    failed: int = 0
    runs: list = field(default_factory=list)  # the RunConfigs of the grid
    elapsed: float = 0.0  # seconds this call took (0 for finished runs it skipped)
    train_time: float = 0.0  # seconds of training summed over the runs (resumed sessions included)


def plan_table(configs, done: set[str] = frozenset()) -> str:
    """The runs of a grid as a markdown table (model, task, d, n, lr, seed, run id; * = finished)."""
    lines = ["| model | task | d | n | lr | seed | run id |", "|---|---|---|---|---|---|---|"]
    for c in configs:
        n = c.tags.get("n")
        lines.append(f"| {c.label} | {c.tags.get('task', '')} | {c.model.d_model} | {'-' if n is None else n} | "
                     f"{c.train.lr:.3g} | {c.train.seed} | {c.run_id}{' *' if c.run_id in done else ''} |")
    return "\n".join(lines) + "\n"


def reproduce(name: str, scale: str = "tiny", *, out_dir: str | Path = "runs", workers: int | None = None,
              threads: int | None = None, models: list[str] | None = None, skip_missing: bool = False,
              plugins: tuple[str, ...] = (), progress: bool = True, console=None, launcher=None,
              dry_run: bool = False) -> Reproduction:
    """Runs (or resumes) a preset's grid, then prints the best-over-LR table (median and
    range over seeds), the paper's numbers and the claims check, and writes the plot to
    ``out_dir/<preset>-<scale>.png``. Results go to ``out_dir/results.sqlite``; runs already
    there are not run again. ``dry_run``: print the runs (model, size, lr, seed) and stop."""
    import time

    from rich.console import Console

    from ..train.results import best_lm_over_lr, best_over_lr, lm_plot, lm_table, plot, table
    from ..train.store import ResultsStore
    from ..analysis.trained import write_run_maps
    from ..train.sweep import run_sweep

    console = console or Console()
    preset = get_preset(name)
    sc = preset.scale(scale)
    _check_workers(workers, threads)
    for mod in plugins:
        __import__(mod)
    configs = preset.runs(scale, models, skip_missing=skip_missing)
    out_dir = Path(out_dir)
    console.rule(f"[bold]{preset.title}[/bold] — scale {scale}")
    console.print(f"preset {preset.name}, {preset.source}\n{sc.description}\n{len(configs)} runs ({len(sc.seeds)} seed(s) each); {sc.budget}")
    if dry_run:
        db = out_dir / "results.sqlite"
        done = ResultsStore(db).finished_ids() if db.exists() else set()
        console.print(plan_table(configs, done) + "(* finished: a real run skips it)" + (
            "; rates run in the order listed, and a cell (model, task, d, n, seed) stops at the first that reaches the "
            "early-stop accuracy (sweep_stop)" if sc.sweep_stop else ""), markup=False, highlight=False)
        return Reproduction(preset, scale, [], "", None, runs=configs)
    t0 = time.perf_counter()
    out_dir = output_dir(out_dir, "--out")
    store = ResultsStore(out_dir / "results.sqlite")
    outcomes, solved = [], set()
    waves = lr_waves(configs) if sc.sweep_stop else [configs]
    left = TimeLeft(waves, workers or sc.workers, done=store.finished_ids())
    for i, wave in enumerate(waves):
        todo = [c for c in wave if cell_key(c) not in solved]
        if len(waves) > 1:
            console.print(f"[dim]learning rates, round {i + 1}/{len(waves)}: {len(todo)} runs "
                          f"({len(wave) - len(todo)} cells already at the early-stop accuracy)[/dim]")
        left.start_round(i, todo)
        outcomes += run_sweep(todo, out_dir=out_dir, store=store, workers=workers or sc.workers, threads=threads,
                              plugins=plugins, progress=progress, console=console, launcher=launcher,
                              write_maps=write_run_maps, note=left.note) if todo else []
        solved |= {cell_key(o.config) for o in outcomes
                   if o.result is not None and o.config.train.early_stop is not None
                   and o.result.accuracy >= o.config.train.early_stop}
    ids = [o.config.run_id for o in outcomes if o.result is not None]
    order = [m.label for m in preset.models]
    x = preset.x
    lm = preset.metric == "bpb"
    if lm:  # language modelling: validation bits per byte, lower is better
        rows = best_lm_over_lr(store.rows(preset.experiment(scale), run_ids=ids))
        text = lm_table(rows, order=order)
    else:
        rows = best_over_lr(store.rows(preset.experiment(scale), run_ids=ids), select=sc.lr_select, criterion=sc.lr_criterion)
        text = table(rows, x=x, order=order)
    console.rule("results")
    console.print(text, markup=False, highlight=False)
    if preset.paper:
        console.print("[bold]paper[/bold]")
        console.print(preset.paper, markup=False, highlight=False)
    claims = evaluate_claims(preset, rows)
    if claims:
        console.rule("the paper's claims at this scale" + (f" (medians over {max(c['seeds'] for c in claims)} seeds)" if any(c["seeds"] for c in claims) else ""))
        for c in claims:
            style = {"agrees": "green", "does not agree": "red"}.get(c["verdict"], "yellow")
            seeds = f" ({c['seeds_agree']}/{c['seeds']} seeds)" if c["seeds"] else ""
            console.print(f"[{style}]{c['verdict']:>15}[/{style}]{seeds}  {c['text']}  [dim]({c['panel']}: {c['detail']})[/dim]")
            if c["caveat"]:
                console.print(f"{'':>17}[dim]why: {c['caveat']}[/dim]")
        agree = sum(c["verdict"] == "agrees" for c in claims)
        console.print(f"[bold]verdict: {agree} of {len(claims)} claims agree[/bold]")
    draw = lm_plot if lm else plot
    kw = {} if lm else {"x": x}
    path = draw(rows, out_dir / f"{preset.name}-{scale}.png", title=f"{preset.title} ({scale})", order=order, **kw) if rows else None
    if path:
        console.print(f"plot: {path}")
    (out_dir / f"{preset.name}-{scale}.md").write_text(text)
    # the cells as computed (each seed's accuracy and chosen rate): what the table and the claims read
    (out_dir / f"{preset.name}-{scale}.json").write_text(json.dumps(
        {"preset": preset.name, "scale": scale, "lr_select": sc.lr_select, "lr_criterion": sc.lr_criterion,
         "cells": rows, "claims": claims}, indent=1, default=str))
    failed = sum(o.result is None for o in outcomes)
    if failed:
        console.print(f"[red]{failed} run(s) failed[/red]")
    elapsed = time.perf_counter() - t0
    train_time = sum(r["wall_time"] for r in store.rows(preset.experiment(scale), run_ids=ids))
    console.print(f"time: {_minutes(elapsed)} this call; {_minutes(train_time)} of training summed over the {len(ids)} runs")
    return Reproduction(preset, scale, rows, text, path, claims, failed, configs, elapsed, train_time)


class TimeLeft:
    """A job's own estimate of the time it has left, from the runs it has finished so far.

    Each run finished in this call gives seconds per unit of its relative cost
    (:func:`seqmix.train.sweep.run_cost`); the runs still to go, at the mean of those rates, shared
    by ``workers`` processes, give the time left. With ``Scale.sweep_stop`` (a cell stops at the
    first learning rate that reaches the early-stop accuracy) the number of runs to go is a range:
    at least the rest of the current round (:func:`lr_waves`), at most that plus every later rate of
    each cell not yet solved. ``done``: run ids finished before this call (not run, not counted).
    :meth:`note` is the text that ends each run's line of the sweep (``run_sweep(note=...)``).
    """

    def __init__(self, waves: list[list], workers: int, done: set[str] = frozenset()):
        self.waves = [[c for c in w if c.run_id not in done] for w in waves]
        self.workers = max(1, workers)
        self.round, self.todo = 0, {}
        self.solved: set[tuple] = set()
        self.finished = 0
        self.seconds = self.cost = 0.0

    def start_round(self, i: int, todo: list) -> None:
        self.round, self.todo = i, {c.run_id: c for c in todo}

    def note(self, config, result) -> str:
        """Records ``config``'s run (``result`` None: it failed) and returns ``"  [N done, a-b to go: about x-y min left]"``."""
        from ..train.sweep import run_cost

        self.todo.pop(config.run_id, None)
        self.finished += 1
        if result is not None:
            self.seconds += result.wall_time
            self.cost += run_cost(config)
            stop = config.train.early_stop
            if stop is not None and result.accuracy is not None and result.accuracy >= stop:
                self.solved.add(cell_key(config))
        low = list(self.todo.values())
        high = low + [c for w in self.waves[self.round + 1:] for c in w if cell_key(c) not in self.solved]
        if not high:
            return f"  [{self.finished} done, none to go]"
        n = f"{len(low)}" if len(low) == len(high) else f"{len(low)}-{len(high)}"
        if not self.cost:
            return f"  [{self.finished} done, {n} to go]"
        per_cost = self.seconds / self.cost
        t = [sum(run_cost(c) for c in runs) * per_cost / min(self.workers, max(1, len(runs))) for runs in (low, high)]
        return f"  [{self.finished} done, {n} to go: about {_span(*t)} left]"


def _span(low: float, high: float) -> str:
    """``about`` text of a time range in seconds: "40 s", "3 min", "3-9 min"."""
    if high < 90:
        return f"{low:.0f} s" if round(low) == round(high) else f"{low:.0f}-{high:.0f} s"
    a, b = max(1, round(low / 60)), max(1, round(high / 60))
    return f"{b} min" if a == b else f"{a}-{b} min"


def reproduce_all(scale: str = "tiny", *, out_dir: str | Path = "runs", names: list[str] | None = None,
                  workers: int | None = None, threads: int | None = None, plugins: tuple[str, ...] = (),
                  progress: bool = True, console=None, dry_run: bool = False,
                  report_dir: str | Path | None = None) -> tuple[list[Reproduction], dict[str, str], Path | None]:
    """Every preset that has ``scale`` (or those named), one after the other, resumable
    (finished runs are skipped); then one report, ``out_dir/report/index.html`` and
    ``summary.md`` (seqmix.experiments.report). Presets whose mixers are partly missing run
    the models that are registered. Returns (reproductions, {preset: why not run}, report
    path; None with dry_run)."""
    from rich.console import Console

    from .report import report_markdown, write_report

    console = console or Console()
    _check_workers(workers, threads)
    names = names or list(PRESETS)
    for name in names:
        get_preset(name)
    scales = sorted({s for name in names for s in PRESETS[name].scales})
    if scale not in scales:
        raise ValueError(f"argument --scale: no preset has a scale {scale!r}; expected one of {', '.join(scales)}")
    if not dry_run:
        output_dir(out_dir, "--out")
        output_dir(report_dir or Path(out_dir) / "report", "--report")
    for mod in plugins:
        __import__(mod)
    done, skipped = [], {}
    for name in names:
        preset = get_preset(name)
        if scale not in preset.scales:
            skipped[name] = f"no {scale!r} scale"
            continue
        try:
            done.append(reproduce(name, scale, out_dir=out_dir, workers=workers, threads=threads, skip_missing=True,
                                  plugins=plugins, progress=progress, console=console, dry_run=dry_run))
        except ValueError as e:  # e.g. none of its mixers registered
            skipped[name] = str(e).splitlines()[0]
            console.print(f"[yellow]{name}: not run: {e}[/yellow]")
    if dry_run:
        console.print(f"{sum(len(r.runs) for r in done)} runs in {len(done)} presets" +
                      (f"; not run: {', '.join(skipped)}" if skipped else ""))
        return done, skipped, None
    page, _ = write_report(done, report_dir or Path(out_dir) / "report", skipped=skipped)
    console.rule("summary")
    console.print(report_markdown(done, skipped=skipped), markup=False, highlight=False)
    console.print(f"report: {page}")
    return done, skipped, page


def _check_workers(workers, threads) -> None:
    for arg, v in (("--workers", workers), ("--threads", threads)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"argument {arg}: expected an integer >= 1, got {v!r}")


def _minutes(s: float) -> str:
    return f"{int(s // 60)} min {int(s % 60):02d} s" if s >= 60 else f"{s:.1f} s"


__all__ = [
    "LR_DSF", "LR_METALA_512", "PRESETS", "Claim", "ModelSpec", "Preset", "Reproduction", "Scale", "TaskSpec",
    "TimeLeft", "evaluate_claims", "get_preset", "load_sweep", "plan_table", "reproduce", "reproduce_all",
]
