"""Sweeps (skip finished runs, parallel workers), the results store, tables and plots."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seqmix.data import DataConfig, MQARConfig
from seqmix.train import RunConfig, TrainConfig
from seqmix.train.results import best_over_lr, plot, table
from seqmix.train.store import ResultsStore
from seqmix.train.sweep import run_sweep


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _cfg(lr=3e-3, d=16, seed=0, experiment="exp", label="lin"):
    t = dict(seq_len=16, num_kv_pairs=2, vocab_size=32)
    data = DataConfig(train=[MQARConfig(num_examples=128, **t)], test=[MQARConfig(num_examples=64, **t)], batch_size=32)
    return RunConfig(experiment=experiment, label=label, tags={"n": 8}, data=data,
                     model=dict(mixer="linear_attention", d_model=d, mixer_kwargs={"n": 8}),
                     train=TrainConfig(lr=lr, epochs=1, seed=seed, threads=1))


def test_sweep_runs_stores_and_skips_finished(tmp_path):
    cfgs = [_cfg(lr=1e-3), _cfg(lr=3e-3), _cfg(lr=1e-3)]  # the duplicate runs once
    out = run_sweep(cfgs, out_dir=tmp_path, workers=1, progress=False)
    assert len(out) == 2 and all(o.result is not None and not o.skipped for o in out)
    store = ResultsStore(tmp_path / "results.sqlite")
    rows = store.rows("exp")
    assert {r["lr"] for r in rows} == {1e-3, 3e-3} and all(r["status"] == "finished" for r in rows)
    assert all(r["state_size"] == 8 * 17 * 2 and r["params"] > 0 and r["version"] for r in rows)
    full = store.result(rows[0]["run_id"])
    assert full["config"]["model"]["mixer"] == "linear_attention" and len(full["result"]["history"]) == 1
    again = run_sweep(cfgs + [_cfg(lr=1e-2)], out_dir=tmp_path, workers=1, progress=False)
    assert [o.skipped for o in again] == [True, True, False]
    assert again[0].result.accuracy == out[0].result.accuracy


def test_restart_uses_result_files_of_runs_that_finished(tmp_path):
    """A run whose result.json exists but whose row never reached the store (the sweep was
    killed in between) is not trained again."""
    c = _cfg()
    run_sweep([c], out_dir=tmp_path, workers=1, progress=False)
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        con.execute("DELETE FROM runs")
    again = run_sweep([c], out_dir=tmp_path, workers=1, progress=False)
    assert again[0].skipped and ResultsStore(tmp_path / "results.sqlite").has(c.run_id)


def test_parallel_workers(tmp_path):
    cfgs = [_cfg(lr=1e-3), _cfg(lr=3e-3, d=32)]
    out = run_sweep(cfgs, out_dir=tmp_path, workers=2, threads=1, progress=False)
    assert all(o.result is not None for o in out)
    assert len(ResultsStore(tmp_path / "results.sqlite").rows()) == 2
    serial = run_sweep([_cfg(lr=1e-3)], out_dir=tmp_path / "serial", workers=1, progress=False)
    assert serial[0].result.history == out[0].result.history  # same numbers in a worker process


def test_failed_run_is_reported_and_others_go_on(tmp_path, monkeypatch):
    from seqmix.train import sweep

    real = sweep.Trainer.fit

    def fit(self):
        if self.config.train.lr == 1e-2:
            raise RuntimeError("boom")
        return real(self)

    monkeypatch.setattr(sweep.Trainer, "fit", fit)
    out = run_sweep([_cfg(lr=1e-2), _cfg(lr=1e-3)], out_dir=tmp_path, workers=1, progress=False)
    assert out[0].result is None and "boom" in out[0].error and out[1].result is not None
    assert len(ResultsStore(tmp_path / "results.sqlite").rows()) == 1


def _row(label, d, lr, acc, seed=0, n=8, task="t", state=100):
    return {"experiment": "e", "label": label, "task": task, "d_model": d, "n": n, "lr": lr, "seed": seed,
            "accuracy": acc, "status": "finished", "state_size": state, "params": 1, "epochs": 1, "wall_time": 1.0,
            "mixer": "m"}


def test_best_over_lr_uses_the_median_over_seeds():  # two seeds: the median is the mean
    rows = [_row("a", 16, 1e-3, 0.9, 0), _row("a", 16, 1e-3, 0.1, 1),  # mean 0.5
            _row("a", 16, 3e-3, 0.6, 0), _row("a", 16, 3e-3, 0.6, 1),  # mean 0.6: best
            _row("a", 32, 1e-3, 0.8), _row("b", 16, 1e-3, 0.3)]
    best = {(r["label"], r["d_model"]): r for r in best_over_lr(rows)}
    assert best[("a", 16)]["lr"] == 3e-3 and best[("a", 16)]["accuracy"] == pytest.approx(0.6)
    assert best[("a", 16)]["seeds"] == 2 and best[("a", 16)]["std"] == 0.0
    assert best[("a", 32)]["accuracy"] == 0.8 and len(best) == 3
    every = best_over_lr(rows, all_lrs=True)
    assert len(every) == 4 and {r["label"] for r in every} == {"a lr=0.001", "a lr=0.003", "b lr=0.001"}


def test_table_and_plot(tmp_path):
    rows = best_over_lr([_row("a", 16, 1e-3, 0.5), _row("a", 32, 1e-3, 0.75), _row("b", 16, 1e-3, 1.0),
                         _row("a", 16, 1e-3, 0.25, task="u")])
    md = table(rows, x="d_model", order=["b", "a"])
    assert "| a | 50.0 | 75.0 |" in md and "| b | 100.0 |  |" in md and md.index("| b |") < md.index("| a |")
    assert "**t**" in md and "**u**" in md
    csv = table(rows, fmt="csv").splitlines()
    assert csv[0].startswith("experiment,task,label") and len(csv) == 5
    by_task = table(rows, x="task")
    assert "task=t" in by_task and "task=u" in by_task
    for x in ("d_model", "state_size", "task"):
        p = plot(rows, tmp_path / f"p-{x}.png", x=x, title="t")
        assert p.exists() and p.stat().st_size > 5000
    with pytest.raises(ValueError, match="x axis"):
        table(rows, x="depth")


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may linger unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads worker processes from /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_killing_a_sweep_stops_its_workers(tmp_path, sig):
    """Signal the sweep's process alone (not its process group) while its workers train:
    after SIGKILL the workers notice their parent is gone and exit; after SIGINT the sweep
    terminates them and exits itself. (Resuming from the checkpoints is tested in test_train.)"""
    long = _cfg().model_copy(update={"train": TrainConfig(lr=1e-3, epochs=10_000, threads=1, early_stop=None)})
    long2 = long.model_copy(update={"train": long.train.model_copy(update={"seed": 1})})
    (tmp_path / "cfgs.json").write_text(json.dumps([c.model_dump(mode="json") for c in (long, long2)]))
    # SIGINT as a terminal's Ctrl-C delivers it: a process started in the background by a non-interactive shell
    # (`make test &`) inherits SIGINT ignored, which would make the test hang, not the sweep
    script = ("import json, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "from seqmix.train import RunConfig; from seqmix.train.sweep import run_sweep; "
              f"cfgs = [RunConfig(**c) for c in json.load(open({str(tmp_path / 'cfgs.json')!r}))]; "
              f"run_sweep(cfgs, out_dir={str(tmp_path / 'out')!r}, workers=2, threads=1, progress=False)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    ckpts = [tmp_path / "out" / "runs" / c.run_id / "checkpoint.pt" for c in (long, long2)]
    deadline = time.time() + 120
    while not all(p.exists() for p in ckpts) and time.time() < deadline:  # both workers are training
        time.sleep(0.2)
    assert all(p.exists() for p in ckpts), "the workers never checkpointed"
    children = [int(p) for t in Path(f"/proc/{parent.pid}/task").iterdir()
                for p in (t / "children").read_text().split()]
    workers = [pid for pid in children if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(workers) >= 2
    os.kill(parent.pid, sig)
    try:
        parent.wait(timeout=30)
    except subprocess.TimeoutExpired:
        parent.kill()
        pytest.fail(f"the sweep did not exit after {sig.name}")
    deadline = time.time() + 10
    while any(_alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers), "a worker outlived its sweep"


def test_best_over_lr_per_seed_and_by_final_accuracy():
    """select='per_seed': each seed at its own best rate; criterion='final': the last evaluation chooses."""
    rows = [_row("a", 16, 1e-3, 0.9, 0), _row("a", 16, 1e-3, 0.1, 1), _row("a", 16, 1e-3, 0.5, 2),
            _row("a", 16, 3e-3, 0.6, 0), _row("a", 16, 3e-3, 0.6, 1), _row("a", 16, 3e-3, 0.5, 2)]
    rows[0]["final_accuracy"] = 0.2  # seed 0 at 1e-3 peaked at 0.9 and ended at 0.2
    (med,) = best_over_lr(rows)  # one rate for the cell: 3e-3 (median 0.6 against 0.5)
    assert med["lr"] == 3e-3 and med["accuracy"] == pytest.approx(0.6)
    (per,) = best_over_lr(rows, select="per_seed")
    # seed 0 takes 1e-3 (0.9), seed 1 3e-3 (0.6), seed 2 a tie (0.5): the smaller rate
    assert per["per_seed_lr"] == {0: 1e-3, 1: 3e-3, 2: 1e-3} and per["per_seed"] == {0: 0.9, 1: 0.6, 2: 0.5}
    assert per["accuracy"] == pytest.approx(0.6) and per["lo"] == 0.5 and per["hi"] == 0.9
    assert per["lr"] == 1e-3 and per["lrs"] == [1e-3, 3e-3] and per["wall_time"] == 6.0
    (fin,) = best_over_lr(rows, select="per_seed", criterion="final")
    assert fin["per_seed_lr"][0] == 3e-3 and fin["per_seed"][0] == pytest.approx(0.6)
    md = table([per])
    assert "0.001 · 0.003 · 0.001" in md and "one per seed" in md
    from seqmix.train.results import seed_rows
    assert {s: rs[0]["lr"] for s, rs in seed_rows([per]).items()} == {0: 1e-3, 1: 3e-3, 2: 1e-3}
    with pytest.raises(ValueError, match="unknown select 'mean'"):
        best_over_lr(rows, select="mean")
    with pytest.raises(ValueError, match="unknown criterion 'last'"):
        best_over_lr(rows, criterion="last")
