"""The results store: one SQLite file, one row per run.

Columns: run_id (primary key: the hash of the run's config), experiment, label, mixer,
task (the first test slice), d_model, n (the state expansion tag, if any), lr, seed,
accuracy (best validation accuracy), final_accuracy, loss, best_epoch, epochs, steps,
wall_time, tokens_per_s, state_size, params, status, version, git_commit, created, the
full config / result (with the history) as JSON, and for language-modelling runs ppl, bpb
(validation perplexity and bits per byte at the best evaluation) and tokens (trained on).

Rows are written by the parent process of a sweep (workers return their results), so
there is one writer; the store still opens with a busy timeout so that two sweeps
sharing a file wait rather than fail.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable

from .._checks import output_dir
from .config import RunConfig
from .trainer import RunResult

COLUMNS = (
    "run_id", "experiment", "label", "mixer", "task", "d_model", "n", "lr", "seed", "accuracy", "final_accuracy",
    "loss", "best_epoch", "epochs", "steps", "wall_time", "tokens_per_s", "state_size", "params", "status",
    "version", "git_commit", "created", "config_json", "result_json", "ppl", "bpb", "tokens",
)
#: columns added after the first schema (language modelling): added to older stores on open
_ADDED = {"ppl": "REAL", "bpb": "REAL", "tokens": "INTEGER"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, experiment TEXT, label TEXT, mixer TEXT, task TEXT,
    d_model INTEGER, n INTEGER, lr REAL, seed INTEGER,
    accuracy REAL, final_accuracy REAL, loss REAL, best_epoch INTEGER, epochs INTEGER, steps INTEGER,
    wall_time REAL, tokens_per_s REAL, state_size INTEGER, params INTEGER, status TEXT,
    version TEXT, git_commit TEXT, created REAL, config_json TEXT, result_json TEXT,
    ppl REAL, bpb REAL, tokens INTEGER
);
CREATE INDEX IF NOT EXISTS runs_experiment ON runs (experiment);
"""


#: the first bytes of every SQLite 3 database file
_SQLITE_MAGIC = b"SQLite format 3\x00"


def task_name(config: RunConfig) -> str:
    if config.tags.get("task"):
        return config.tags["task"]
    return config.data.slice_name if config.is_lm else config.data.test[0].slice_name


class ResultsStore:
    """``ResultsStore(path)``: rows of finished runs (``put``, ``has``, ``rows``)."""

    def __init__(self, path: str | Path, *, argument: str = "--db"):
        """Opens (or creates) the store at ``path``. A folder there, a file that is not an
        SQLite database (left as it is), a folder that cannot be written: ValueError naming
        ``argument`` (the option the path came from)."""
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"argument {argument}: {str(path)!r} is a folder, expected a results store (an SQLite file "
                             "such as runs/results.sqlite)")
        if self.path.is_file() and self.path.stat().st_size:
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
            if head != _SQLITE_MAGIC:
                raise ValueError(f"argument {argument}: {str(path)!r} is not a results store (not an SQLite file; "
                                 "it is left as it is)")
        output_dir(self.path.parent, argument)
        with self._connect() as con:
            con.executescript(_SCHEMA)
            have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
            for col, typ in _ADDED.items():
                if col not in have:
                    con.execute(f"ALTER TABLE runs ADD COLUMN {col} {typ}")

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=60)
        con.row_factory = sqlite3.Row
        return con

    def put(self, config: RunConfig, result: RunResult, *, version: str = "", git_commit: str = "") -> None:
        row = {
            "run_id": config.run_id, "experiment": config.experiment, "label": config.name, "mixer": config.model.mixer,
            "task": task_name(config), "d_model": config.model.d_model, "n": config.tags.get("n"),
            "lr": config.train.lr, "seed": config.train.seed, "accuracy": result.accuracy,
            "final_accuracy": result.final_accuracy, "loss": result.loss, "best_epoch": result.best_epoch,
            "epochs": result.epochs, "steps": result.steps, "wall_time": result.wall_time,
            "tokens_per_s": result.tokens_per_s, "state_size": result.state_size, "params": result.params,
            "status": result.status, "version": version, "git_commit": git_commit, "created": time.time(),
            "config_json": json.dumps(config.model_dump(mode="json"), sort_keys=True),
            "result_json": json.dumps(result.to_json()),
            "ppl": result.ppl, "bpb": result.bpb, "tokens": result.tokens,
        }
        cols = ", ".join(COLUMNS)
        marks = ", ".join("?" for _ in COLUMNS)
        with self._connect() as con:
            con.execute(f"INSERT OR REPLACE INTO runs ({cols}) VALUES ({marks})", [row[c] for c in COLUMNS])

    def has(self, run_id: str) -> bool:
        with self._connect() as con:
            r = con.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return r is not None and r["status"] == "finished"

    def finished_ids(self) -> set[str]:
        with self._connect() as con:
            return {r[0] for r in con.execute("SELECT run_id FROM runs WHERE status = 'finished'")}

    def rows(self, experiment: str | None = None, *, run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Rows as dicts (without the JSON blobs), optionally of one experiment / given runs."""
        q = "SELECT * FROM runs"
        args: list = []
        if experiment:
            q += " WHERE experiment = ?"
            args.append(experiment)
        with self._connect() as con:
            rows = [dict(r) for r in con.execute(q + " ORDER BY experiment, label, task, d_model, n, lr, seed", args)]
        if run_ids is not None:
            keep = set(run_ids)
            rows = [r for r in rows if r["run_id"] in keep]
        for r in rows:
            r.pop("config_json", None)
            r.pop("result_json", None)
        return rows

    def result(self, run_id: str) -> dict | None:
        with self._connect() as con:
            r = con.execute("SELECT config_json, result_json FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if r is None else {"config": json.loads(r["config_json"]), "result": json.loads(r["result_json"])}

    def experiments(self) -> list[str]:
        with self._connect() as con:
            return [r[0] for r in con.execute("SELECT DISTINCT experiment FROM runs ORDER BY experiment")]
