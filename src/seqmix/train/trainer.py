"""The trainer: one :class:`RunConfig` in, one :class:`RunResult` out — a loop over
optimizer steps, for every task.

A run's budget is counted in steps. A finite task set (MQAR and the synthetic tasks)
counts its steps in epochs (``epochs`` × batches per epoch); a token stream (a text corpus,
:class:`seqmix.data.text.CorpusConfig`) in tokens or steps (``max_tokens``/``max_steps``).
``max_steps`` caps both. The pieces, each one method, in the order a step uses them:

* :meth:`Trainer.build_model` — the model from ``config.model``;
* :meth:`Trainer.micro_batches` — the training batches from micro-batch index m on: the
  epoch order of (seed, epoch) for a task set, the random windows of (seed, m) for a stream,
  so a resumed run draws the very batches an uninterrupted one would;
* :meth:`Trainer.to_device` — moving (splitting, under DDP) a batch;
* :meth:`Trainer.loss` — cross-entropy over the labelled positions only (logits are computed
  only there), under autocast when ``precision`` is bf16/fp16;
* :meth:`Trainer.evaluate` — loss and accuracy over the labelled positions, per slice; for
  a text split also perplexity exp(loss) and bits per byte (loss / ln 2 / bytes per token);
* :meth:`Trainer.save_checkpoint` / :meth:`Trainer.write_result` — atomic checkpoints and
  the run folder.

Every optimizer step: AdamW with the parameter groups of :mod:`seqmix.train.optim`, the
learning rate set before the step (linear warmup, then cosine, over the run's steps or
``schedule_steps``), ``grad_accum`` micro-batches,
global gradient-norm clipping. Evaluation every ``eval_every`` epochs (task sets) or every
``eval_every_steps`` steps (either; a stream defaults to 10 evaluations), and after the last
step. Early stopping once the validation accuracy reaches ``early_stop``.

Checkpoints (``run_dir/checkpoint.pt``: config, model, optimizer, step, history, RNG
states; tensors, containers and JSON only, read back with ``weights_only=True``:
:mod:`seqmix.train.checkpoint`) are written atomically after every evaluation, every epoch, and every
``checkpoint_every`` steps: a run killed and started again with the same ``run_dir``
resumes after its last checkpoint and ends with the same numbers as an uninterrupted run.
Throughput (tokens/s), model FLOPs per token and — when a peak is given — the model FLOPs
utilisation go into the result; a rich progress bar shows the run; TensorBoard event files
are written to ``run_dir/tb`` for stream runs when ``tensorboard`` is installed.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from .._checks import output_dir
from ..data import build_data
from ..models import LanguageModel, build_model
from .checkpoint import CHECKPOINT, read_checkpoint, rng_state, set_rng_state, write_checkpoint
from .config import RunConfig
from .distributed import Parallel, check_precision
from .optim import lr_at, param_groups

RESULT = "result.json"
TOKENIZER = "tokenizer.json"
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class RunResult:
    """What a run reports (one row of the results store)."""

    run_id: str
    status: str  # "finished" (whole budget or early stop) or "interrupted"
    accuracy: float  # best validation accuracy over the evaluations (a stream: at the best loss)
    final_accuracy: float
    best_epoch: int  # 1-based epoch of the best evaluation (a stream: 0)
    epochs: int  # epochs run (started); a stream: 0
    steps: int
    loss: float  # validation loss at the best evaluation
    wall_time: float  # seconds of training + evaluation (summed over resumed sessions)
    tokens_per_s: float  # training throughput
    state_size: int
    params: int
    early_stopped: bool = False
    slices: dict = field(default_factory=dict)  # per-slice accuracy at the best evaluation
    history: list = field(default_factory=list)  # one dict per evaluation
    # language modelling (None for the synthetic tasks)
    ppl: float | None = None  # validation perplexity at the best evaluation
    bpb: float | None = None  # validation bits per byte at the best evaluation
    tokens: int = 0  # training tokens seen
    best_step: int = 0
    flops_per_token: float | None = None  # model FLOPs per training token (seqmix.train.flops)
    mfu: float | None = None  # model FLOPs utilisation against the given peak

    def to_json(self) -> dict:
        return asdict(self)


def _read_result(path: Path) -> dict:
    """A run's result.json as a dict; a torn or foreign file reads as {} (not finished: the run
    is trained again, and the Trainer resumes from its checkpoint)."""
    try:
        blob = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return blob if isinstance(blob, dict) else {}


def _finished_result(path: Path, run_id: str) -> RunResult | None:
    """The result in a run folder's result.json when it says this run finished, else None."""
    blob = _read_result(path)
    if blob.get("status") != "finished" or blob.get("run_id", run_id) != run_id:
        return None
    try:
        return RunResult(**blob)
    except TypeError:  # written by another version, or not by seqmix
        return None

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


def autocast(precision: str, device: torch.device):
    """The autocast context of ``precision`` (fp32: none)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST[precision])


class Interrupted(Exception):
    """Raised by a callback to stop a run after a checkpoint (used to test resuming)."""


class Trainer:
    """Trains one run. ``run_dir`` (optional) holds the checkpoint and result.json;
    ``progress``: show a rich progress bar; ``on_epoch(epoch, record)`` is called after each
    epoch's checkpoint and ``on_checkpoint(step, record)`` after every checkpoint (raise
    :class:`Interrupted` in either to stop the run); ``write_maps(run_dir, config, model)``:
    draws the maps of a finished run's first and last layer into ``run_dir`` — pass
    :func:`seqmix.analysis.trained.write_run_maps` (the trainer sits below analysis and does not
    import it; the CLI and :func:`seqmix.experiments.reproduce` pass it); ``maps``: whether to
    call it (default: for task sets, not for corpus runs, whose T×T maps are large);
    ``peak_flops``: the machine's FLOP/s, for the MFU estimate (:func:`seqmix.train.flops.matmul_peak_flops`);
    ``tensorboard``: write event files to run_dir/tb (default: for stream runs, when installed)."""

    def __init__(self, config: RunConfig, *, run_dir: str | Path | None = None, progress: bool = True,
                 on_epoch: Callable[[int, dict], None] | None = None, console=None, maps: bool | None = None,
                 on_checkpoint: Callable[[int, dict], None] | None = None, peak_flops: float | None = None,
                 tensorboard: bool | None = None, write_maps: Callable[[Path, RunConfig, torch.nn.Module], object] | None = None,
                 model_builder: Callable[[RunConfig], torch.nn.Module] | None = None):
        self.config = config
        self.model_builder = model_builder  # config -> model (a run with init_from_hf: seqmix.interop.train.hf_model_builder)
        self.maps = maps
        self.write_maps = write_maps
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.progress = progress
        self.on_epoch = on_epoch
        self.on_checkpoint = on_checkpoint
        self.console = console
        self.peak_flops = peak_flops
        self.tensorboard = tensorboard
        self.device = torch.device(config.train.device)
        self.parallel = Parallel.single(self.device)  # fit() sets the run's (torchrun: DDP / FSDP2)

    # -- pieces ------------------------------------------------------------------------

    def build_model(self) -> LanguageModel:
        """The model of ``config.model`` on the run's device (seeded before: the init is the seed's);
        ``model_builder(config)`` when given (a run from a transformers checkpoint, ``init_from_hf``,
        needs one: the trainer sits below seqmix.interop and does not import it)."""
        if self.model_builder is not None:
            return self.model_builder(self.config).to(self.device)
        if self.config.init_from_hf is not None:
            raise ValueError(f"run {self.config.run_id}: init_from_hf = {self.config.init_from_hf!r} needs "
                             "Trainer(config, model_builder=seqmix.interop.train.hf_model_builder) (or `seqmix lm train "
                             "--init-from-hf`): a seqmix LanguageModel built from 'model' would be another model")
        return build_model(self.config.model).to(self.device)  # a LanguageModel, or a classifier (LRA)

    def micro_batches(self, train, start: int) -> Iterator:
        """Training micro-batches number ``start``, ``start + 1``, … A task set (a
        :class:`seqmix.data.Split`) walks its epochs in the order fixed by (seed, epoch),
        skipping into the epoch of ``start``; a stream draws window batch m from (seed, m)."""
        c = self.config
        per_epoch = train.steps_per_epoch
        if per_epoch is None:
            m = start
            while True:
                yield train.batch(m, seed=c.train.seed)
                m += 1
        epoch, skip = divmod(start, per_epoch)
        while True:
            for i, b in enumerate(train.batches(shuffle=c.data.shuffle, seed=c.train.seed, epoch=epoch)):
                if i >= skip:
                    yield b
            epoch, skip = epoch + 1, 0

    def to_device(self, batch):
        """(inputs, labels) of a batch on the run's device."""
        return batch.inputs.to(self.device, non_blocking=True), batch.labels.to(self.device, non_blocking=True)

    def loss(self, model: LanguageModel, inputs: torch.Tensor, labels: torch.Tensor, reduction: str = "mean"):
        """(cross-entropy over the labelled positions, logits [M, V], targets [M])."""
        with autocast(self.config.train.precision, self.device):
            logits, target = self.parallel.forward(model, inputs, labels)
        return F.cross_entropy(logits.float(), target, reduction=reduction), logits, target

    @staticmethod
    def ce_weight(model) -> float:
        """The weight of the next-token cross-entropy in the training loss: the model's ``ce_weight``
        attribute when it has one (e.g. 0 for a distillation stage that trains on the KL term alone), else 1."""
        return float(getattr(model, "ce_weight", 1.0))

    @staticmethod
    def auxiliary_loss(model) -> torch.Tensor | float:
        """A training-only term the model adds to the step's loss: ``model.auxiliary_loss()`` when the
        model has one (the term its last training forward computed, e.g. linearization's KL to the
        teacher's logits; None for none), else 0. Evaluation reports the next-token loss alone."""
        fn = getattr(model, "auxiliary_loss", None)
        aux = fn() if callable(fn) else None
        return 0.0 if aux is None else aux

    def evaluate(self, model: LanguageModel, test, *, max_batches: int | None = None) -> dict:
        """Loss and accuracy over the labelled positions (per slice); on a text split also
        ``ppl`` = exp(loss) and ``bpb`` = loss / ln 2 / (UTF-8 bytes per token of the split)."""
        was_training = model.training
        model.eval()
        n_seg = len(test.names)
        correct = torch.zeros(n_seg, dtype=torch.float64)
        count = torch.zeros(n_seg, dtype=torch.float64)
        loss_sum = 0.0
        with torch.no_grad():
            for i, b in enumerate(test.batches()):
                if max_batches is not None and i >= max_batches:
                    break
                loss, logits, target = self.loss(model, *self.to_device(b), reduction="sum")
                loss_sum += float(loss)
                correct[b.segment] += float((logits.argmax(-1) == target).sum())
                count[b.segment] += target.numel()
        model.train(was_training)
        total = float(count.sum())
        out = {
            "accuracy": float(correct.sum()) / max(total, 1.0),
            "loss": loss_sum / max(total, 1.0),
            "slices": {name: float(correct[i] / max(float(count[i]), 1.0)) for i, name in enumerate(test.names)},
        }
        bytes_per_token = getattr(test, "bytes_per_token", None)
        if bytes_per_token:
            out["ppl"] = math.exp(min(out["loss"], 700.0))
            out["bpb"] = out["loss"] / math.log(2) / bytes_per_token
        return out

    def save_checkpoint(self, model, opt, state, scaler=None) -> None:
        """run_dir/checkpoint.pt, atomically ("config" = the RunConfig JSON, "model" = the state dict)."""
        if self.run_dir is None:
            return
        model_sd, opt_sd = self.parallel.state_dicts(model, opt)  # every rank (FSDP gathers), rank 0 writes
        if not self.parallel.is_main:
            return
        write_checkpoint({
            "run_id": self.config.run_id, "config": self.config.model_dump(mode="json"),
            "model": model_sd, "optimizer": opt_sd, "state": state, "world_size": self.parallel.world,
            "scaler": scaler.state_dict() if scaler is not None else None, "rng": rng_state(),
        }, self.run_dir / CHECKPOINT)

    def load_checkpoint(self, model, opt, scaler=None) -> dict | None:
        """The saved loop state (and model, optimizer, RNG restored), or None. A checkpoint
        that is not a safe seqmix checkpoint is a ValueError (:func:`seqmix.train.checkpoint.read_checkpoint`)."""
        ckpt = self.run_dir / CHECKPOINT if self.run_dir is not None else None
        if ckpt is None or not ckpt.exists():
            return None
        blob = read_checkpoint(ckpt, map_location=self.device, keys=("run_id", "model", "optimizer", "state", "rng"))
        if blob["run_id"] != self.config.run_id:
            return None
        self.parallel.load_state_dicts(model, opt, blob["model"], blob["optimizer"])  # full state dicts: any world size
        if scaler is not None and blob.get("scaler"):
            scaler.load_state_dict(blob["scaler"])
        set_rng_state(blob["rng"])
        return blob["state"]

    def write_result(self, result: "RunResult", model: LanguageModel) -> None:
        """result.json, config.json (and the maps) in run_dir."""
        if self.run_dir is None:
            return
        (self.run_dir / RESULT).write_text(json.dumps(result.to_json(), indent=1))
        (self.run_dir / "config.json").write_text(json.dumps(self.config.model_dump(mode="json"), indent=1))
        if self.write_maps is not None and (
                self.maps or (self.maps is None and not self.config.is_lm and self.config.model.classifier is None)):
            self._write_maps(model)

    # -- the budget --------------------------------------------------------------------

    def plan(self, train) -> tuple[int, int | None]:
        """(optimizer steps of the run, steps per epoch or None for a stream)."""
        tc = self.config.train
        acc = tc.grad_accum
        caps = [tc.max_steps or 1 << 62]
        per_epoch_micro = train.steps_per_epoch
        if per_epoch_micro is not None:
            per_epoch = max(1, per_epoch_micro // acc) if acc > 1 else per_epoch_micro
            caps.append(tc.epochs * per_epoch)
        else:
            per_epoch = None
        if tc.max_tokens:
            caps.append(max(1, -(-tc.max_tokens // (acc * train.tokens_per_batch))))
        total = min(caps)
        if total >= 1 << 62:
            raise ValueError("train: a token stream needs a budget: set train.max_steps or train.max_tokens")
        return total, per_epoch

    def schedule_horizon(self, total: int) -> int:
        """The steps the learning-rate schedule spans: ``train.schedule_steps``, or the run's ``total``."""
        horizon = self.config.train.schedule_steps
        if horizon is None:
            return total
        if horizon < total:
            raise ValueError(f"train: schedule_steps = {horizon} is shorter than the run's {total} optimizer steps; "
                             f"expected at least {total} (the run is the first steps of the schedule), or none")
        return horizon

    def _eval_due(self, state, total, per_epoch) -> bool:
        tc = self.config.train
        step = state["step"]
        if step >= total:
            return True
        every = tc.eval_every_steps
        if every is None and per_epoch is None:
            every = max(1, total // 10)
        if every is not None and step % every == 0:
            return True
        return per_epoch is not None and step % per_epoch == 0 and (step // per_epoch) % tc.eval_every == 0

    # -- the loop ----------------------------------------------------------------------

    def fit(self) -> RunResult:
        c = self.config
        tc = c.train
        if tc.threads:
            torch.set_num_threads(tc.threads)
        self.parallel = par = Parallel(tc.parallel, tc.device, timeout=tc.dist_timeout)  # torch.distributed (a world of one outside torchrun)
        try:
            with par.guard("training"):  # a failed or timed-out collective (a dead or hung rank) -> DistributedError
                return self._fit(par)
        finally:
            par.close()

    def _fit(self, par: Parallel) -> RunResult:
        c = self.config
        tc = c.train
        self.device = device = par.device
        check_precision(tc.precision, device)
        par.check_same(c.model_dump(mode="json"))
        par.check_batch(c.data.batch_size)
        if self.run_dir is not None:  # a finished run: its result (a torn or foreign result.json: trained again)
            finished = _finished_result(self.run_dir / RESULT, c.run_id)
            if finished is not None:
                return finished

        train, test = build_data(c.data)  # a data error (seq_len too long for the corpus, ...) leaves no run folder
        total, per_epoch = self.plan(train)  # so does a budget error (a stream without one, a short schedule_steps)
        horizon = self.schedule_horizon(total)
        if self.run_dir is not None:
            self.run_dir = output_dir(self.run_dir, "--out")
        tokenizer = getattr(train, "tokenizer", None)
        if tokenizer is not None and self.run_dir is not None and par.is_main:
            tokenizer.save(self.run_dir / TOKENIZER)  # the run folder is self-contained
        seed_everything(tc.seed)
        model = self.build_model()
        par.wrap(model)  # DDP / FSDP2 (before the optimizer: FSDP replaces the parameters)
        opt = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.lr, betas=tc.betas)
        scaler = torch.amp.GradScaler(device.type) if tc.precision == "fp16" else None  # fp16 gradients need scaling
        epochs = -(-total // per_epoch) if per_epoch else 0

        state = {"epoch": 0, "step": 0, "history": [], "wall": 0.0, "train_time": 0.0, "tokens": 0, "best": None,
                 "loss_sum": 0.0, "loss_n": 0}
        state = self.load_checkpoint(model, opt, scaler) or state
        state.setdefault("loss_sum", 0.0)
        state.setdefault("loss_n", 0)

        stream = per_epoch is None
        state_size = model.state_size(c.data.max_seq_len)
        params = model.num_params()
        from .flops import flops_per_token

        fpt = flops_per_token(model, c.data.max_seq_len)
        stopped_early = bool(state["best"] and tc.early_stop and state["best"]["accuracy"] >= tc.early_stop)
        writer = self._tensorboard(stream) if par.is_main else None

        bar = task = None
        if self.progress and par.is_main:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=False)
            bar.start()
            task = bar.add_task(f"{c.name} d={c.model.d_model}", total=total, completed=state["step"], info="")

        model.train()
        batches = self.micro_batches(train, state["step"] * tc.grad_accum)
        t_session = time.perf_counter()
        try:
            while state["step"] < total and not stopped_early:
                # -- one optimizer step -----------------------------------------------------
                t0 = time.perf_counter()
                step = state["step"]
                lr = lr_at(step, total=horizon, lr=tc.lr, warmup=tc.warmup, min_lr=tc.min_lr, schedule=tc.schedule)
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.zero_grad(set_to_none=True)
                loss_v = 0.0
                for _ in range(tc.grad_accum):
                    b = next(batches)
                    inputs, labels, weight = par.shard(*self.to_device(b))  # this rank's rows of the global batch
                    loss, _, _ = self.loss(model, inputs, labels)
                    loss = self.ce_weight(model) * loss + self.auxiliary_loss(model)
                    loss = loss * weight / tc.grad_accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                    loss_v += float(loss.detach())
                    state["tokens"] += b.inputs.numel()
                loss_v = par.mean(loss_v)  # the global batch's loss
                if scaler is not None:
                    scaler.unscale_(opt)
                if tc.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                state["step"] = step + 1
                state["loss_sum"] += loss_v
                state["loss_n"] += 1
                state["train_time"] += time.perf_counter() - t0
                if per_epoch:
                    state["epoch"] = -(-state["step"] // per_epoch)
                tps = state["tokens"] / max(state["train_time"], 1e-9)
                if writer is not None:
                    writer.add_scalar("train/loss", loss_v, state["step"])
                    writer.add_scalar("train/lr", lr, state["step"])
                    writer.add_scalar("train/tokens_per_s", tps, state["step"])
                if bar is not None:
                    bar.update(task, advance=1, info=self._info(state, epochs, loss_v, tps))

                # -- evaluation, checkpoints ------------------------------------------------
                end_of_epoch = per_epoch is not None and (state["step"] % per_epoch == 0 or state["step"] >= total)
                if self._eval_due(state, total, per_epoch):
                    ev = self.evaluate(model, test, max_batches=tc.eval_batches)
                    rec = {"epoch": state["epoch"], "step": state["step"], "train_loss": state["loss_sum"] / max(state["loss_n"], 1),
                           "lr": lr, **ev}
                    if stream:
                        rec["tokens"] = state["tokens"]
                    state["loss_sum"], state["loss_n"] = 0.0, 0
                    state["history"].append(rec)
                    if state["best"] is None or self._better(ev, state["best"], stream):
                        state["best"] = rec
                    if tc.early_stop is not None and ev["accuracy"] >= tc.early_stop:
                        stopped_early = True
                    if writer is not None:
                        for k in ("loss", "accuracy", "ppl", "bpb"):
                            if k in ev:
                                writer.add_scalar(f"val/{k}", ev[k], state["step"])
                    due = True
                else:
                    due = end_of_epoch or bool(tc.checkpoint_every and state["step"] % tc.checkpoint_every == 0)
                if due:
                    now = time.perf_counter()
                    state["wall"] += now - t_session
                    t_session = now
                    self.save_checkpoint(model, opt, state, scaler)
                    last = state["history"][-1] if state["history"] else {}
                    if self.on_checkpoint is not None:
                        self.on_checkpoint(state["step"], last)
                    if end_of_epoch and self.on_epoch is not None:
                        self.on_epoch(state["epoch"], last)
        except Interrupted:
            return self._result(state, "interrupted", state_size, params, stopped_early, fpt)
        finally:
            if bar is not None:
                bar.stop()
            if writer is not None:
                writer.close()
        state["wall"] += time.perf_counter() - t_session
        result = self._result(state, "finished", state_size, params, stopped_early, fpt)
        model = par.plain_model(model, self.build_model)  # FSDP: the whole model on rank 0 for the maps
        if par.is_main:
            self.write_result(result, model)
        return result

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _better(ev: dict, best: dict, stream: bool) -> bool:
        return ev["loss"] < best["loss"] if stream else ev["accuracy"] > best["accuracy"]

    @staticmethod
    def _info(state: dict, epochs: int, loss_v: float, tps: float) -> str:
        best = state["best"]
        where = f"ep {state['epoch']}/{epochs} " if epochs else f"{state['tokens']:,} tok "
        if best is not None and "ppl" in best:
            last = state["history"][-1]
            score = f"val ppl {last['ppl']:.2f} bpb {last['bpb']:.3f}"
        else:
            score = f"best acc {best['accuracy']:.3f}" if best else "best acc nan"
        return f"{where}loss {loss_v:.3f} {score} {tps:,.0f} tok/s"

    def _tensorboard(self, stream: bool):
        want = self.tensorboard if self.tensorboard is not None else stream
        if not want or self.run_dir is None:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard not installed: no event files
            return None
        return SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def _write_maps(self, model: LanguageModel) -> None:
        """``write_maps`` on the finished model; a failure to draw never costs the run (the
        writer records its reason beside the result; anything it lets through is reported here)."""
        try:
            self.write_maps(self.run_dir, self.config, model.cpu())
        except Exception as e:  # noqa: BLE001  (the trained run is already saved)
            if self.console is not None:
                self.console.print(f"maps of run {self.config.run_id} not written: {type(e).__name__}: {e}",
                                   markup=False, highlight=False, style="yellow")

    def _result(self, state, status, state_size, params, stopped_early, fpt) -> RunResult:
        best = state["best"] or {"accuracy": 0.0, "epoch": 0, "loss": float("nan"), "slices": {}, "step": 0}
        last = state["history"][-1] if state["history"] else best
        tps = state["tokens"] / max(state["train_time"], 1e-9)
        return RunResult(
            run_id=self.config.run_id, status=status, accuracy=best["accuracy"], final_accuracy=last["accuracy"],
            best_epoch=best["epoch"], epochs=state["epoch"], steps=state["step"], loss=best["loss"],
            wall_time=state["wall"], tokens_per_s=tps,
            state_size=state_size, params=params, early_stopped=stopped_early, slices=best.get("slices", {}),
            history=state["history"], ppl=best.get("ppl"), bpb=best.get("bpb"), tokens=state["tokens"],
            best_step=best.get("step", 0), flops_per_token=fpt,
            mfu=(tps * fpt / self.peak_flops) if self.peak_flops else None,
        )


def train(config: RunConfig, **kwargs) -> RunResult:
    """Trains ``config`` (see :class:`Trainer` for the keyword arguments)."""
    return Trainer(config, **kwargs).fit()
