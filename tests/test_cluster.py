"""Sweeps as cluster jobs (docs/scale.md): seqmix.cluster.SubmititLauncher with
submitit's local executor (the same job path as on Slurm, as local processes)."""

import sqlite3

import pytest

from seqmix.train.store import ResultsStore
from seqmix.train.sweep import run_sweep
from test_sweep import _cfg

submitit = pytest.importorskip("submitit", reason="the 'cluster' extra (pip install 'seqmix[cluster]') is not installed")
from seqmix.cluster import SubmititLauncher, make_launcher  # noqa: E402


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def test_submitit_jobs_write_result_files_and_the_sweep_fills_the_store(tmp_path):
    cfgs = [_cfg(lr=1e-3), _cfg(lr=3e-3)]
    launcher = SubmititLauncher(tmp_path / "jobs", cluster="local", timeout_min=10, poll_interval=0.5)
    assert launcher.cluster == "local"
    out = run_sweep(cfgs, out_dir=tmp_path, launcher=launcher, threads=1, progress=False)
    assert all(o.result is not None and not o.skipped for o in out), [o.error for o in out]
    for c in cfgs:  # each job wrote its own run folder; the sweep process wrote the store
        assert (tmp_path / "runs" / c.run_id / "result.json").exists()
    assert {r["run_id"] for r in ResultsStore(tmp_path / "results.sqlite").rows()} == {c.run_id for c in cfgs}
    assert any((tmp_path / "jobs").iterdir())  # submitit's job files and logs
    # same numbers as the local pool
    serial = run_sweep([cfgs[0]], out_dir=tmp_path / "serial", workers=1, progress=False)
    assert serial[0].result.history == out[0].result.history

    # the sweep "crashed" before the store saw the runs: a restart submits nothing and the
    # store is filled from the result files
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        con.execute("DELETE FROM runs")

    class NoJobs:
        name, poll_interval = "none", 0.1

        def submit(self, *a):
            raise AssertionError("a finished run was submitted again")

        def cancel(self, jobs):
            pass

    again = run_sweep(cfgs, out_dir=tmp_path, launcher=NoJobs(), progress=False)
    assert all(o.skipped for o in again) and len(ResultsStore(tmp_path / "results.sqlite").rows()) == 2


def test_failed_job_is_reported(tmp_path):
    class Failing:
        name, poll_interval = "failing", 0.1

        class Job:
            job_id = "42"

            def done(self):
                return True

            def result(self):
                raise RuntimeError("job 42 was killed: TIMEOUT")

        def submit(self, *a):
            return self.Job()

        def cancel(self, jobs):
            pass

    out = run_sweep([_cfg()], out_dir=tmp_path, launcher=Failing(), progress=False)
    assert out[0].result is None and "TIMEOUT" in out[0].error
    assert ResultsStore(tmp_path / "results.sqlite").rows() == []


def test_launcher_arguments_are_checked(tmp_path):
    assert make_launcher("local", tmp_path) is None and make_launcher(None, tmp_path) is None
    with pytest.raises(ValueError, match="--launcher"):
        make_launcher("ray", tmp_path)
    with pytest.raises(ValueError, match="cluster"):
        SubmititLauncher(tmp_path, cluster="pbs")
