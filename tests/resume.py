"""Kill a run mid-way and start it again: the shared steps of the exact-resume tests."""

import torch

from seqmix.train import Interrupted, Trainer


def kill_and_resume(cfg, tmp_path, *, hook: str, at: int, reseed: int):
    """Train ``cfg`` uninterrupted in ``tmp_path/a``; then in ``tmp_path/b`` raise Interrupted when
    the trainer's ``hook`` ("on_epoch" or "on_checkpoint") reports ``at``, reseed the global RNG
    with ``reseed`` (whatever the process did meanwhile: the checkpoint must restore the RNG)
    and start the same run again. Returns (full, part, resumed) results."""
    full = Trainer(cfg, run_dir=tmp_path / "a", progress=False).fit()

    def kill(n, _):
        if n == at:
            raise Interrupted

    part = Trainer(cfg, run_dir=tmp_path / "b", progress=False, **{hook: kill}).fit()
    torch.manual_seed(reseed)
    resumed = Trainer(cfg, run_dir=tmp_path / "b", progress=False).fit()
    return full, part, resumed
