"""torch.distributed in the trainer (docs/scale.md), on CPU with gloo.

Two processes × batch b train what one process × batch 2b trains: the loss of every step
and of every evaluation agree within DIST_RTOL (float32; the all-reduce sums in another
order). A checkpoint written under DDP (or FSDP2) resumes in a single process — a world size
change — and the run ends as the uninterrupted single-process run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from seqmix.train import Trainer, make_run_config
from seqmix.train.distributed import DistributedError, Parallel, check_precision
from ports import free_port
from tolerances import DIST_RTOL

SRC = str(Path(__file__).resolve().parents[1] / "src")
STEPS, STOP = 24, 20  # DDP trains steps 1..20, one process resumes 21..24

CONFIG = {
    "experiment": "dist-test",
    "data": {"train": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 256}],
             "test": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 16}],
             "batch_size": 8},  # global: 2 ranks × 4 rows
    "model": {"mixer": "linear_attention", "d_model": 16, "n_layers": 2},
    "train": {"max_steps": STEPS, "eval_every_steps": 1, "early_stop": None, "threads": 1, "lr": 3e-3},
}

# one rank of a run: Trainer with train.parallel, stopped (Interrupted) after the checkpoint
# of step STOP; fault injection for the fault tests ("hang" sleeps on rank 1 at step 3, "die"
# ends rank 1 there, "mismatch" gives rank 1 another learning rate)
WORKER = textwrap.dedent("""
    import json, os, sys, time
    from seqmix.train import Trainer, make_run_config
    from seqmix.train.trainer import Interrupted
    cfg, run_dir, parallel, stop, fault = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    blob = json.loads(open(cfg).read())
    blob["train"].update(parallel=parallel, dist_timeout=float(os.environ.get("DIST_TIMEOUT", "60")))
    rank = int(os.environ["RANK"])
    if fault == "mismatch" and rank == 1:
        blob["train"]["lr"] *= 2
    config = make_run_config(**blob)
    def on_checkpoint(step, record):
        if fault == "hang" and rank == 1 and step == 3:
            time.sleep(600)
        if fault == "die" and rank == 1 and step == 3:
            os._exit(17)
        if step == stop:
            raise Interrupted
    Trainer(config, run_dir=run_dir, progress=False, on_checkpoint=on_checkpoint).fit()
""")


def _launch(tmp: Path, parallel: str, *, fault: str = "none", stop: int = STOP, timeout: float = 60, run_dir=None):
    """Two ranks as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), without torchrun's
    agent, so that a failing rank is seen by the other one, not killed by the agent."""
    cfg, script = tmp / "config.json", tmp / "worker.py"
    cfg.write_text(json.dumps(CONFIG))
    script.write_text(WORKER)
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": SRC, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "DIST_TIMEOUT": str(timeout)}
        procs.append(subprocess.Popen([sys.executable, str(script), str(cfg), str(run_dir or tmp / "run"), parallel, str(stop), fault],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _wait(procs, limit: float = 240):
    out = []
    try:
        for p in procs:
            out.append(p.communicate(timeout=limit)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], out


def _single(run_dir=None):
    return Trainer(make_run_config(**CONFIG), run_dir=run_dir, progress=False, maps=False).fit()


@pytest.fixture(scope="module")
def reference():
    """One process, the global batch of 8: the history of all STEPS steps."""
    return _single().history


def _agree(records, reference, what):
    assert len(records) == len(reference)
    for r, ref in zip(records, reference):
        assert r["step"] == ref["step"]
        for key in ("train_loss", "loss"):
            assert abs(r[key] - ref[key]) <= DIST_RTOL * abs(ref[key]), f"{what}: {key} at step {r['step']}: {r[key]} vs {ref[key]}"


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_equal_one_process_and_resume_in_one(parallel, reference, tmp_path):
    codes, out = _wait(_launch(tmp_path, parallel))
    assert codes == [0, 0], "\n".join(out)
    blob = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert blob["world_size"] == 2 and blob["state"]["step"] == STOP
    # steps 1..20 under 2 ranks × 4 rows == 1 process × 8 rows
    _agree(blob["state"]["history"], reference[:STOP], f"{parallel}, 2 ranks")
    # the checkpoint is the single-process format (full tensors) ...
    from seqmix.models import LanguageModel

    model = LanguageModel(make_run_config(**CONFIG).model)
    model.load_state_dict(blob["model"])
    # ... and the run resumes in one process (world size 2 -> 1) to the same end
    result = _single(tmp_path / "run")
    assert result.status == "finished" and result.steps == STEPS
    _agree(result.history, reference, f"{parallel} resumed in one process")


@pytest.mark.slow
def test_hung_rank_ends_the_other_with_a_clear_error(tmp_path):
    """Rank 1 hangs at step 3: rank 0's next all-reduce times out after dist_timeout and it
    exits with DistributedError instead of waiting forever."""
    t0 = time.time()
    procs = _launch(tmp_path, "ddp", fault="hang", timeout=10)
    try:
        out0 = procs[0].communicate(timeout=180)[0]
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0
    assert "DistributedError" in out0 and "collective" in out0 and "dist_timeout" in out0, out0[-2000:]
    assert time.time() - t0 < 170


@pytest.mark.slow
def test_dead_rank_ends_the_other_with_a_clear_error(tmp_path):
    codes, out = _wait(_launch(tmp_path, "ddp", fault="die", timeout=30), limit=170)
    assert codes[1] == 17 and codes[0] not in (0, None)
    assert "DistributedError" in out[0] and "collective" in out[0], out[0][-2000:]


@pytest.mark.slow
def test_config_mismatch_across_ranks_is_detected_at_start(tmp_path):
    codes, out = _wait(_launch(tmp_path, "ddp", fault="mismatch"))
    assert codes[0] != 0 and codes[1] != 0
    text = "\n".join(out)
    assert "DistributedError" in text and "train.lr" in text, text[-2000:]
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_bad_setups_are_refused(monkeypatch):
    check_precision("bf16", torch.device("cpu"))
    with pytest.warns(UserWarning, match="emulate"):
        check_precision("fp16", torch.device("cpu"))
    with monkeypatch.context() as mp:  # a device whose autocast refuses the dtype
        def refuse(*a, **k):
            raise RuntimeError("CPU autocast: unsupported dtype bfloat16")

        mp.setattr(torch, "autocast", refuse)
        with pytest.raises(ValueError, match="precision 'bf16' cannot run on device cpu"):
            check_precision("bf16", torch.device("cpu"))
    with pytest.raises(ValueError, match="train.parallel"):
        Parallel("mpi")
    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE") if k in os.environ}
    try:
        with pytest.raises(ValueError, match="torchrun"):
            Parallel("ddp")
        os.environ["WORLD_SIZE"] = "2"
        with pytest.raises(ValueError, match="--parallel ddp"):
            Parallel("none")
    finally:
        os.environ.pop("WORLD_SIZE", None)
        os.environ.update(env)
    blob = {**CONFIG, "train": {**CONFIG["train"], "parallel": "ddp"}}
    with pytest.raises(ValueError, match="torchrun"):  # the trainer refuses it before anything runs
        Trainer(make_run_config(**blob), progress=False).fit()


def test_one_process_is_a_world_of_one():
    par = Parallel("none")
    x, y = torch.ones(6, 3), torch.full((6, 3), -100)
    assert par.shard(x, y) == (x, y, 1.0) and par.mean(2.5) == 2.5 and par.is_main
    assert DistributedError.__mro__[1] is RuntimeError


def test_each_rank_takes_its_own_rows():
    """The slicing itself (the equivalence test above cannot see it: identical full batches on
    both ranks would give the same averaged gradient)."""
    x = torch.arange(8).view(4, 2)
    y = torch.tensor([[-100, 1], [2, 3], [-100, -100], [4, -100]])
    for rank, rows, weight in ((0, [0, 1], 3 * 2 / 4), (1, [2, 3], 1 * 2 / 4)):  # 3 and 1 of the 4 labels
        par = Parallel.single()
        par.mode, par.rank, par.world = "ddp", rank, 2
        xs, ys, w = par.shard(x, y)
        assert torch.equal(xs, x[rows]) and torch.equal(ys, y[rows]) and w == pytest.approx(weight)
    with pytest.raises(ValueError, match="divisible by the world size 2"):
        par.shard(x[:3], y[:3])
