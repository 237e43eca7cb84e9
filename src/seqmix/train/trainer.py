"""The trainer: one :class:`RunConfig` in, one :class:`RunResult` out.

* AdamW with the parameter groups of :mod:`seqmix.train.optim`, the learning rate set
  before every step (linear warmup, then cosine), global gradient-norm clipping;
* loss: cross-entropy over the labelled positions only (logits are computed only there);
* evaluation every ``eval_every`` epochs on the whole test split: accuracy over the
  labelled positions, overall and per slice (segment). For MQAR every example has the
  same number of labels, so this equals Zoology's per-example mean;
* early stopping once the validation accuracy reaches ``early_stop``;
* a checkpoint after every epoch in ``run_dir`` (model, optimizer, step, history, RNG
  states), written atomically: a run that is stopped — killed — and started again with the
  same ``run_dir`` resumes after its last finished epoch and ends with the same numbers
  as an uninterrupted run (the data order depends only on (seed, epoch));
* deterministic: the seed fixes the init, dropout and shuffling;
* a rich progress bar (loss, accuracy, tokens/s) and the training throughput in the result.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data import build_data
from ..models import LanguageModel
from .config import RunConfig
from .optim import lr_at, param_groups

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"


@dataclass
class RunResult:
    """What a run reports (one row of the results store)."""

    run_id: str
    status: str  # "finished" (all epochs or early stop) or "interrupted"
    accuracy: float  # best validation accuracy over the evaluations
    final_accuracy: float
    best_epoch: int  # 1-based epoch of the best accuracy
    epochs: int  # epochs run
    steps: int
    loss: float  # validation loss at the best epoch
    wall_time: float  # seconds of training + evaluation (summed over resumed sessions)
    tokens_per_s: float  # training throughput
    state_size: int
    params: int
    early_stopped: bool = False
    slices: dict = field(default_factory=dict)  # per-slice accuracy at the best epoch
    history: list = field(default_factory=list)  # one dict per evaluation

    def to_json(self) -> dict:
        return asdict(self)


def git_commit(path: Path | None = None) -> str:
    """The checkout's commit (with "+dirty" if modified), or "" outside git."""
    cwd = str(path or Path(__file__).resolve().parent)
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if sha.returncode:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Interrupted(Exception):
    """Raised by a callback to stop a run after a checkpoint (used to test resuming)."""


class Trainer:
    """Trains one run. ``run_dir`` (optional) holds the checkpoint and result.json;
    ``progress``: show a rich progress bar; ``on_epoch(epoch, record)`` is called after
    each checkpoint (raise :class:`Interrupted` there to stop the run); ``maps``: after a
    finished run, write the maps of its first and last layer into ``run_dir``
    (:func:`seqmix.analysis.trained.write_run_maps`: maps.png, maps.json)."""

    def __init__(self, config: RunConfig, *, run_dir: str | Path | None = None, progress: bool = True,
                 on_epoch: Callable[[int, dict], None] | None = None, console=None, maps: bool = True):
        self.config = config
        self.maps = maps
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.progress = progress
        self.on_epoch = on_epoch
        self.console = console

    # -- pieces ------------------------------------------------------------------------

    def _evaluate(self, model: LanguageModel, test, device) -> dict:
        model.eval()
        n_seg = len(test.segments)
        correct = torch.zeros(n_seg, dtype=torch.float64)
        count = torch.zeros(n_seg, dtype=torch.float64)
        loss_sum = 0.0
        with torch.no_grad():
            for b in test.batches():
                logits, target = model.scored_logits(b.inputs.to(device), b.labels.to(device))
                loss_sum += float(F.cross_entropy(logits.float(), target, reduction="sum"))
                correct[b.segment] += float((logits.argmax(-1) == target).sum())
                count[b.segment] += target.numel()
        model.train()
        total = float(count.sum())
        return {
            "accuracy": float(correct.sum()) / max(total, 1.0),
            "loss": loss_sum / max(total, 1.0),
            "slices": {name: float(correct[i] / max(float(count[i]), 1.0)) for i, name in enumerate(test.names)},
        }

    # -- the loop ----------------------------------------------------------------------

    def fit(self) -> RunResult:
        c = self.config
        tc = c.train
        if tc.threads:
            torch.set_num_threads(tc.threads)
        device = torch.device(tc.device)
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            done = self.run_dir / RESULT
            if done.exists():
                blob = json.loads(done.read_text())
                if blob.get("status") == "finished" and blob.get("run_id") == c.run_id:
                    return RunResult(**blob)

        train, test = build_data(c.data)
        seed_everything(tc.seed)
        model = LanguageModel(c.model).to(device)
        opt = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr, betas=tc.betas)
        per_epoch = train.num_batches()
        total = min(tc.epochs * per_epoch, tc.max_steps or 1 << 62)
        epochs = min(tc.epochs, -(-total // per_epoch))

        state = {"epoch": 0, "step": 0, "history": [], "wall": 0.0, "train_time": 0.0, "tokens": 0, "best": None}
        ckpt = self.run_dir / CHECKPOINT if self.run_dir is not None else None
        if ckpt is not None and ckpt.exists():
            blob = torch.load(ckpt, weights_only=False, map_location=device)
            if blob.get("run_id") == c.run_id:
                model.load_state_dict(blob["model"])
                opt.load_state_dict(blob["optimizer"])
                state = blob["state"]
                torch.set_rng_state(blob["rng"]["torch"])
                np.random.set_state(blob["rng"]["numpy"])
                random.setstate(blob["rng"]["python"])

        state_size = model.state_size(c.data.max_seq_len)
        params = model.num_params()
        stopped_early = bool(state["best"] and tc.early_stop and state["best"]["accuracy"] >= tc.early_stop)

        bar = None
        if self.progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console, transient=False)
            bar.start()
            task = bar.add_task(f"{c.name} d={c.model.d_model}", total=total, completed=state["step"], info="")

        model.train()
        try:
            while state["epoch"] < epochs and state["step"] < total and not stopped_early:
                epoch = state["epoch"]
                t_epoch = time.perf_counter()
                t_train = 0.0
                ep_loss, ep_n = 0.0, 0
                for b in train.batches(shuffle=c.data.shuffle, seed=tc.seed, epoch=epoch):
                    if state["step"] >= total:
                        break
                    t0 = time.perf_counter()
                    lr = lr_at(state["step"], total=total, lr=tc.lr, warmup=tc.warmup, min_lr=tc.min_lr, schedule=tc.schedule)
                    for g in opt.param_groups:
                        g["lr"] = lr
                    logits, target = model.scored_logits(b.inputs.to(device), b.labels.to(device))
                    loss = F.cross_entropy(logits.float(), target)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if tc.grad_clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                    opt.step()
                    state["step"] += 1
                    state["tokens"] += b.inputs.numel()
                    dt = time.perf_counter() - t0
                    t_train += dt
                    loss_v = float(loss.detach())
                    ep_loss += loss_v
                    ep_n += 1
                    if bar is not None:
                        tps = state["tokens"] / max(state["train_time"] + t_train, 1e-9)
                        best = state["best"]["accuracy"] if state["best"] else float("nan")
                        bar.update(task, advance=1, info=f"ep {epoch + 1}/{epochs} loss {loss_v:.3f} best acc {best:.3f} {tps:,.0f} tok/s")
                state["train_time"] += t_train
                state["epoch"] = epoch + 1
                if state["epoch"] % tc.eval_every == 0 or state["epoch"] >= epochs or state["step"] >= total:
                    ev = self._evaluate(model, test, device)
                    rec = {"epoch": state["epoch"], "step": state["step"], "train_loss": ep_loss / max(ep_n, 1),
                           "lr": lr_at(max(state["step"] - 1, 0), total=total, lr=tc.lr, warmup=tc.warmup, min_lr=tc.min_lr, schedule=tc.schedule),
                           **ev}
                    state["history"].append(rec)
                    if state["best"] is None or ev["accuracy"] > state["best"]["accuracy"]:
                        state["best"] = rec
                    if tc.early_stop is not None and ev["accuracy"] >= tc.early_stop:
                        stopped_early = True
                state["wall"] += time.perf_counter() - t_epoch
                if ckpt is not None:
                    _atomic_save({
                        "run_id": c.run_id, "config": c.model_dump(mode="json"),
                        "model": model.state_dict(), "optimizer": opt.state_dict(), "state": state,
                        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
                    }, ckpt)
                if self.on_epoch is not None:
                    self.on_epoch(state["epoch"], state["history"][-1] if state["history"] else {})
        except Interrupted:
            return self._result(state, "interrupted", state_size, params, stopped_early)
        finally:
            if bar is not None:
                bar.stop()
        result = self._result(state, "finished", state_size, params, stopped_early)
        if self.run_dir is not None:
            (self.run_dir / RESULT).write_text(json.dumps(result.to_json(), indent=1))
            (self.run_dir / "config.json").write_text(json.dumps(c.model_dump(mode="json"), indent=1))
            if self.maps:
                self._write_maps(model)
        return result

    def _write_maps(self, model: LanguageModel) -> None:
        """maps.png / maps.json beside the result; a failure to draw never costs the run: its
        reason goes into maps.json."""
        from ..analysis.trained import MAPS_JSON, write_run_maps

        try:
            write_run_maps(self.run_dir, self.config, model.cpu())
        except Exception as e:  # noqa: BLE001  (the trained run is already saved)
            (self.run_dir / MAPS_JSON).write_text(json.dumps({"run_id": self.config.run_id, "error": f"{type(e).__name__}: {e}"}))

    def _result(self, state, status, state_size, params, stopped_early) -> RunResult:
        best = state["best"] or {"accuracy": 0.0, "epoch": 0, "loss": float("nan"), "slices": {}}
        last = state["history"][-1] if state["history"] else best
        return RunResult(
            run_id=self.config.run_id, status=status, accuracy=best["accuracy"], final_accuracy=last["accuracy"],
            best_epoch=best["epoch"], epochs=state["epoch"], steps=state["step"], loss=best["loss"],
            wall_time=state["wall"], tokens_per_s=state["tokens"] / max(state["train_time"], 1e-9),
            state_size=state_size, params=params, early_stopped=stopped_early, slices=best.get("slices", {}),
            history=state["history"],
        )


def train(config: RunConfig, **kwargs) -> RunResult:
    """Trains ``config`` (see :class:`Trainer` for the keyword arguments)."""
    return Trainer(config, **kwargs).fit()
