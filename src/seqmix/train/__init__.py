"""seqmix.train: the trainer, sweeps and the results store.

    from seqmix.train import RunConfig, TrainConfig, train
    result = train(RunConfig(data=..., model=..., train=TrainConfig(lr=1e-3, epochs=8)), run_dir="runs/x")
"""

from .config import RunConfig, TrainConfig, load_run_config, make_run_config
from .optim import lr_at, no_decay_names, param_groups
from .trainer import Interrupted, RunResult, Trainer, git_commit, train

__all__ = [
    "Interrupted", "RunConfig", "RunResult", "TrainConfig", "Trainer", "git_commit", "load_run_config", "lr_at", "make_run_config",
    "no_decay_names", "param_groups", "train",
]
