"""Sweeps across machines: each run of ``seqmix sweep`` / ``seqmix reproduce`` as one cluster
job, through submitit (Slurm; its local executor runs the same jobs as local processes).

    seqmix sweep dsf-fig2 --launcher submitit --slurm-partition gpu --timeout-min 120 --gpus-per-node 1

An adapter at the top of the library (DESIGN.md): it imports seqmix, nothing in seqmix
imports it; :func:`seqmix.train.sweep.run_sweep` takes the launcher as an argument. The
jobs write only their own run folders; the sweep's process updates the results store from
their result files (docs/scale.md). Needs the ``cluster`` extra (``pip install seqmix[cluster]``).

Why submitit rather than Ray: a sweep is a list of independent runs, which is exactly a
Slurm job array; submitit submits plain sbatch jobs (no cluster service to start or keep
alive), pickles the call and its result through the shared filesystem that the run folders
use anyway, and its ``local`` executor lets the tests run the very same path on one machine.
"""

from __future__ import annotations

from pathlib import Path

CLUSTERS = ("auto", "slurm", "local")


class SubmititLauncher:
    """Submits each run as a submitit job.

    Args:
        folder: where submitit keeps job scripts, pickles and logs (``<out>/jobs`` by default
            in the CLI); must be on a filesystem the nodes share.
        cluster: "auto" (Slurm when ``sbatch`` is available, else local processes), "slurm",
            or "local" (local processes: one machine, the tests).
        timeout_min, cpus_per_task, gpus_per_node, mem_gb: resources of every job.
        partition: Slurm partition; ``slurm``: further ``slurm_*`` parameters of submitit
            (e.g. {"account": "proj", "constraint": "a100"}).
        poll_interval: seconds between checks of the running jobs.
    """

    name = "submitit"

    def __init__(self, folder: str | Path, *, cluster: str = "auto", timeout_min: int = 60, cpus_per_task: int | None = None,
                 gpus_per_node: int = 0, mem_gb: float | None = None, partition: str | None = None,
                 slurm: dict | None = None, poll_interval: float = 2.0):
        if cluster not in CLUSTERS:
            raise ValueError(f"SubmititLauncher: argument 'cluster' must be one of {CLUSTERS}, got {cluster!r}")
        try:
            import submitit
        except ImportError:
            raise ValueError(
                "the submitit launcher needs the 'submitit' package: pip install 'seqmix[cluster]' (or pip install submitit)"
            ) from None
        self.folder = Path(folder)
        self.poll_interval = float(poll_interval)
        self.executor = submitit.AutoExecutor(folder=str(self.folder), cluster=None if cluster == "auto" else cluster)
        params: dict = {"timeout_min": int(timeout_min), "gpus_per_node": int(gpus_per_node), "nodes": 1, "tasks_per_node": 1}
        if cpus_per_task:
            params["cpus_per_task"] = int(cpus_per_task)
        if mem_gb:
            params["mem_gb"] = mem_gb
        if partition:
            params["slurm_partition"] = partition
        for k, v in (slurm or {}).items():
            params[k if k.startswith("slurm_") else f"slurm_{k}"] = v
        self.executor.update_parameters(**params)

    @property
    def cluster(self) -> str:
        """The executor submitit chose ("slurm", "local", ...)."""
        return self.executor.cluster

    def submit(self, fn, *args):
        """One job running fn(*args); returns submitit's Job (done(), result(), job_id)."""
        return self.executor.submit(fn, *args)

    def cancel(self, jobs) -> None:
        for job in jobs:
            try:
                job.cancel(check=False)
            except Exception:  # noqa: BLE001  (already finished or gone)
                pass


def make_launcher(name: str | None, out_dir: str | Path, **kwargs):
    """None for the local process pool ("local" or None), else the cluster launcher."""
    if name in (None, "local"):
        return None
    if name == "submitit":
        return SubmititLauncher(Path(out_dir) / "jobs", **kwargs)
    raise ValueError(f"argument --launcher must be 'local' or 'submitit', got {name!r}")
