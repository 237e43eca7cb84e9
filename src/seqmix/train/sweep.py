"""Sweeps: many runs, in parallel worker processes on one machine, restartable.

    results = run_sweep(configs, out_dir="runs/dsf-fig2", workers=2)

* every run has its own directory ``out_dir/runs/<run_id>`` (checkpoint, result.json);
* runs already finished — in the results store or with a finished result.json — are
  skipped, so a stopped sweep started again does only what is left (an interrupted run
  resumes from its last epoch checkpoint);
* the data of every distinct data config is generated once, by the parent, before the
  workers start (they then read the disk cache);
* workers are ``spawn``ed processes with ``threads`` torch threads each (default: the
  CPU count divided by the workers); runs are handed out longest first;
* the parent writes every result to the SQLite store as it arrives and prints one line
  per run; ``plugins`` are modules each worker imports first (mixers registered outside
  seqmix);
* stopping the sweep stops its workers: Ctrl-C terminates them, and a worker whose parent
  is killed (SIGTERM, SIGKILL) exits within half a second; what they were training resumes
  from its last epoch checkpoint next time.
* ``launcher``: instead of the local pool, each run becomes one job of a cluster launcher
  (:class:`seqmix.cluster.SubmititLauncher`: Slurm through submitit, docs/scale.md). A job
  writes only its own run folder (checkpoint, result.json); the sweep's process reads each
  finished job's result.json and is the only writer of the SQLite store (no concurrent
  SQLite writes over a network filesystem). A sweep restarted after a crash skips the runs
  whose result.json says finished.
* ``note``: a function ``(config, result or None) -> str`` whose text ends each run's line
  (the time estimate of :func:`seqmix.experiments.reproduce`).
* ``write_maps``: given to every run's :class:`~seqmix.train.trainer.Trainer` (the maps of a
  finished task-set run, :func:`seqmix.analysis.trained.write_run_maps`; a module-level
  function, so workers and jobs get it by name).
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from .._checks import output_dir
from .config import RunConfig
from .store import ResultsStore, task_name
from .trainer import RESULT, RunResult, Trainer, _finished_result, _read_result, git_commit


@dataclass
class SweepOutcome:
    config: RunConfig
    result: RunResult | None  # None when the run failed
    skipped: bool = False  # finished before this sweep started
    error: str = ""


def _import_plugins(plugins) -> None:
    for name in plugins or ():
        importlib.import_module(name)


def run_cost(c: RunConfig) -> float:
    """A rough relative cost of a run: tokens × width × layers, for scheduling (longest first) and time estimates."""
    L = c.data.max_seq_len
    if c.is_lm:
        tokens = c.train.max_tokens or (c.train.max_steps or 1) * c.train.grad_accum * c.data.batch_size * L
        return tokens * c.model.d_model * c.model.n_layers * (1 + L / 256)
    n = sum(t.num_examples for t in c.data.train)
    return c.train.epochs * n * L * c.model.d_model * c.model.n_layers * (1 + L / 256)


def _exit_with_parent(parent_pid: int, every: float = 0.5) -> None:
    """Worker initializer: a daemon thread ends this worker once the sweep's process is gone
    (killed, say), so no orphan goes on training; the run resumes from its last epoch
    checkpoint when the sweep is started again."""
    import threading

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(every)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="seqmix-parent-watch").start()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancels what has not started and terminates the running workers (taken before the
    shutdown, which forgets them)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()


def _worker(config_json: str, run_dir: str, threads: int | None, plugins: tuple[str, ...], write_maps=None) -> dict:
    """Runs one config in a worker process; returns the result as a dict (or the error)."""
    import torch

    _import_plugins(plugins)
    if threads:
        torch.set_num_threads(threads)
    try:
        config = RunConfig.model_validate_json(config_json)
        result = Trainer(config, run_dir=run_dir, progress=False, write_maps=write_maps).fit()
        return {"result": result.to_json()}
    except Exception:  # reported by the parent; the other runs go on
        return {"error": traceback.format_exc(limit=6)}


def _line(c: RunConfig, r: RunResult | None, err: str = "", note: str = "") -> str:
    n = f" n={c.tags['n']}" if c.tags.get("n") is not None else ""
    head = f"{c.name:<22} {task_name(c):<20} d={c.model.d_model:<4}{n} lr={c.train.lr:.2g} seed={c.train.seed}"
    if r is None:
        return f"{head}  FAILED: {err.strip().splitlines()[-1] if err else '?'}"
    if r.bpb is not None:  # a language-modelling run
        return (f"{head}  val bpb {r.bpb:.4f} ppl {r.ppl:.3f} @step {r.best_step}/{r.steps}  {r.wall_time:.0f}s  "
                f"{r.tokens_per_s:,.0f} tok/s{note}")
    stop = " (early stop)" if r.early_stopped else ""
    return f"{head}  acc {r.accuracy:.3f} @ep {r.best_epoch}/{r.epochs}{stop}  {r.wall_time:.0f}s  {r.tokens_per_s:,.0f} tok/s{note}"


def run_sweep(
    configs: list[RunConfig],
    *,
    out_dir: str | Path = "runs",
    store: ResultsStore | str | Path | None = None,
    workers: int = 1,
    threads: int | None = None,
    plugins: tuple[str, ...] | list[str] = (),
    progress: bool = True,
    console=None,
    launcher=None,
    write_maps=None,
    note=None,
) -> list[SweepOutcome]:
    """Runs every config (module docstring); returns one outcome per distinct run, in input order."""
    from rich.console import Console

    import seqmix

    console = console or Console()
    out_dir = output_dir(out_dir, "--out")
    if store is None or isinstance(store, (str, Path)):
        store = ResultsStore(store or out_dir / "results.sqlite", argument="--out")
    plugins = tuple(plugins)
    _import_plugins(plugins)
    version, commit = seqmix.__version__, git_commit()

    unique: dict[str, RunConfig] = {}
    for c in configs:
        unique.setdefault(c.run_id, c)
    outcomes: dict[str, SweepOutcome] = {}
    todo: list[RunConfig] = []
    done_ids = store.finished_ids()
    for rid, c in unique.items():
        res_file = out_dir / "runs" / rid / RESULT
        if rid in done_ids:
            row = store.result(rid)
            outcomes[rid] = SweepOutcome(c, RunResult(**row["result"]), skipped=True)
        elif res_file.exists():
            r = _finished_result(res_file, rid)
            if r is not None:
                store.put(c, r, version=version, git_commit=commit)
                outcomes[rid] = SweepOutcome(c, r, skipped=True)
            else:
                todo.append(c)
        else:
            todo.append(c)
    if len(unique) - len(todo):
        console.print(f"[dim]{len(unique) - len(todo)} of {len(unique)} runs already finished: skipped[/dim]")
    todo.sort(key=run_cost, reverse=True)

    # generate (or load) each distinct dataset once, before the workers need it
    from ..data import build_data

    seen = set()
    for c in todo:
        key = c.data.model_dump_json()
        if key not in seen:
            seen.add(key)
            t0 = time.perf_counter()
            build_data(c.data)
            dt = time.perf_counter() - t0
            if dt > 1:
                console.print(f"data {c.data.describe()}: {dt:.1f}s", markup=False, highlight=False, style="dim")

    workers = max(1, min(workers, len(todo))) if todo else 1
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // workers)

    def record(c: RunConfig, payload: dict):
        if "result" in payload:
            r = RunResult(**payload["result"])
            store.put(c, r, version=version, git_commit=commit)
            outcomes[c.run_id] = SweepOutcome(c, r)
            console.print(_line(c, r, note=note(c, r) if note else ""), markup=False, highlight=False)
        else:
            outcomes[c.run_id] = SweepOutcome(c, None, error=payload["error"])
            console.print(_line(c, None, payload["error"]) + (note(c, None) if note else ""), style="red", markup=False,
                          highlight=False)

    t_start = time.perf_counter()
    if todo and launcher is not None:
        _run_jobs(todo, launcher, out_dir, threads, plugins, record, console, write_maps)
    elif todo and workers == 1:
        import torch

        torch.set_num_threads(threads)
        for i, c in enumerate(todo):
            if progress:
                console.print(f"[dim]run {i + 1}/{len(todo)}[/dim]")
            try:
                r = Trainer(c, run_dir=out_dir / "runs" / c.run_id, progress=progress, console=console,
                            write_maps=write_maps).fit()
                record(c, {"result": r.to_json()})
            except Exception:
                record(c, {"error": traceback.format_exc(limit=6)})
    elif todo:
        console.print(f"[dim]{len(todo)} runs on {workers} workers × {threads} threads[/dim]")
        ctx = get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_exit_with_parent,
                                 initargs=(os.getpid(),)) as pool:
            pending = {
                pool.submit(_worker, c.model_dump_json(), str(out_dir / "runs" / c.run_id), threads, plugins, write_maps): c
                for c in todo
            }
            try:
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for f in finished:
                        c = pending.pop(f)
                        try:
                            payload = f.result()
                        except Exception:
                            payload = {"error": traceback.format_exc(limit=6)}
                        record(c, payload)
            except BaseException:  # Ctrl-C, SystemExit: no worker outlives the sweep
                _stop_workers(pool)
                raise
    if todo:
        console.print(f"[dim]sweep: {len(todo)} runs in {time.perf_counter() - t_start:.0f}s[/dim]")
    return [outcomes[rid] for rid in unique]


def _run_jobs(todo, launcher, out_dir: Path, threads, plugins, record, console, write_maps=None) -> None:
    """One launcher job per run; each finished run's result.json goes to the store (through
    ``record``, in this process only). ``launcher``: ``submit(fn, *args) -> job`` (job.done(),
    job.result()), ``cancel(jobs)``, ``name``, ``poll_interval``."""
    console.print(f"[dim]{len(todo)} runs as {launcher.name} jobs[/dim]")
    pending = {}
    try:
        for c in todo:
            job = launcher.submit(_worker, c.model_dump_json(), str(out_dir / "runs" / c.run_id), threads, plugins, write_maps)
            pending[job] = c
        while pending:
            for job in [j for j in pending if j.done()]:
                c = pending.pop(job)
                record(c, _job_payload(job, out_dir / "runs" / c.run_id / RESULT))
            if pending:
                time.sleep(launcher.poll_interval)
    except BaseException:  # Ctrl-C: cancel what is queued or running
        launcher.cancel(list(pending))
        raise


def _job_payload(job, result_file: Path) -> dict:
    """{"result": ...} from the run's own result file, else {"error": ...} from the job."""
    if result_file.exists():
        blob = _read_result(result_file)
        if blob.get("status") == "finished":
            return {"result": blob}
    try:
        payload = job.result()
    except Exception:  # the job itself failed (killed, out of time, import error)
        return {"error": traceback.format_exc(limit=3)}
    if isinstance(payload, dict) and "error" in payload:
        return payload
    return {"error": f"job {getattr(job, 'job_id', '?')} ended without a finished {result_file}"}


__all__ = ["SweepOutcome", "run_cost", "run_sweep"]
