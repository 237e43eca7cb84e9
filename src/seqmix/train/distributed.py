"""torch.distributed for the one trainer: torchrun, DDP and FSDP2 (docs/scale.md).

    torchrun --nproc_per_node 2 -m seqmix train --config run.json --parallel ddp

:class:`Parallel` is everything the trainer needs to know about the other processes. Outside
torchrun (``parallel = "none"``) it is a world of one and every method is the identity, so
the trainer has no branches for it.

* **Data.** Every rank draws the same global batch (the data order depends only on the
  seed, never on the world size) and trains on its own contiguous slice of
  ``batch_size / world`` rows: the ranks see disjoint examples / token windows. Each rank's
  loss is weighted by (its labelled positions) · world / (the batch's labelled positions),
  so that DDP's average of the gradients is the gradient of the global batch's mean loss
  exactly: 2 processes × batch b compute what 1 process × batch 2b computes.
* **Gradients.** ``ddp``: DistributedDataParallel all-reduces them in buckets during
  backward. ``fsdp``: FSDP2 (``fully_shard``) shards parameters, gradients and optimizer
  state over the ranks, one unit per block plus the root.
* **Rank 0 only** shows progress, writes checkpoints, result files, TensorBoard and maps.
  Evaluation runs on every rank (the same numbers everywhere, so early stopping agrees;
  FSDP's forward needs every rank anyway).
* **Checkpoints** hold full, unsharded state dicts (the single-process format): a DDP or
  FSDP checkpoint loads in one process, and a run may resume with another world size (the
  global batch, hence the numbers, do not depend on it; the batch must divide by it).
* **Faults.** Collectives time out after ``train.dist_timeout`` seconds, so a rank that
  died or hangs ends the others with :class:`DistributedError` instead of a hang; the
  configs of all ranks are compared at start; a precision the device cannot run is refused
  (:func:`check_precision`).
"""

from __future__ import annotations

import datetime
import json
import os

import torch
from torch import nn

PARALLEL = ("none", "ddp", "fsdp")


class DistributedError(RuntimeError):
    """A collective failed or timed out: another rank died, hangs, or disagrees."""


def check_precision(precision: str, device: torch.device) -> None:
    """Refuses (ValueError) an autocast precision that ``device`` cannot run: bf16 on a GPU
    without bfloat16 (compute capability < 8), or any dtype a probe matmul + backward under
    autocast fails on (an old GPU, a backend without it). fp16 on the CPU runs (the trainer
    scales its gradients) but this CPU emulates fp16 matmuls, about 40x slower than fp32
    (bench/scale.py): a warning says so."""
    if precision == "fp32":
        return
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(device)
        raise ValueError(f"train.precision 'bf16' is not supported by {name} (bfloat16 needs compute capability >= 8.0); use 'fp16' or 'fp32'")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    try:  # the device may still refuse the dtype
        a = torch.ones(8, 8, device=device, requires_grad=True)
        with torch.autocast(device.type, dtype=dtype):
            (a @ a).float().sum().backward()
    except RuntimeError as e:
        raise ValueError(f"train.precision {precision!r} cannot run on device {device}: {str(e).splitlines()[0]}") from None
    if device.type == "cpu" and precision == "fp16":
        import warnings

        warnings.warn("train.precision 'fp16' on the CPU: most CPUs emulate float16 matmuls (much slower than fp32); "
                      "'bf16' is the CPU's half precision", stacklevel=2)


class _Scored(nn.Module):
    """The module DDP/FSDP wrap: its forward is LanguageModel.scored_logits (the trainer's
    forward), so that the wrapper's hooks (gradient all-reduce, parameter all-gather) run."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs, labels):
        return self.model.scored_logits(inputs, labels)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one (each gathered for its own forward): ``model.fsdp_units()``
    where the model defines it (a converted transformers model: its decoder layers), else the blocks of a
    seqmix LanguageModel (``model.blocks``)."""
    units = model.fsdp_units() if hasattr(model, "fsdp_units") else list(getattr(model, "blocks", []))
    bad = [type(u).__name__ for u in units if not isinstance(u, nn.Module)]
    if bad:
        raise ValueError(f"parallel fsdp: the model's units to shard must be modules, got {', '.join(sorted(set(bad)))}")
    return units


class Parallel:
    """The process group of a run (a world of one outside torchrun).

    ``rank``, ``world``, ``is_main`` (rank 0), ``device`` (cuda:LOCAL_RANK on GPUs).
    """

    def __init__(self, mode: str = "none", device: str | torch.device = "cpu", *, timeout: float = 600.0):
        if mode not in PARALLEL:
            raise ValueError(f"train.parallel must be one of {PARALLEL}, got {mode!r}")
        env_world = int(os.environ.get("WORLD_SIZE", "1"))
        if mode == "none" and env_world > 1:
            raise ValueError(
                f"launched with WORLD_SIZE={env_world} (torchrun) but train.parallel is 'none': every process would train "
                f"the whole run alone and write the same files; pass --parallel ddp or --parallel fsdp"
            )
        self.mode, self.timeout = mode, float(timeout)
        self.device = torch.device(device)
        self.rank, self.world, self._owns_group = 0, 1, False
        self.wrapped: nn.Module | None = None
        if mode == "none":
            return
        import torch.distributed as dist

        if "RANK" not in os.environ and not dist.is_initialized():
            raise ValueError(
                f"train.parallel {mode!r} needs the torch.distributed environment (RANK, WORLD_SIZE, MASTER_ADDR, "
                f"MASTER_PORT): launch with torchrun --nproc_per_node N (or srun; docs/scale.md)"
            )
        if self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=self.timeout))
            self._owns_group = True
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    @classmethod
    def single(cls, device: str | torch.device = "cpu") -> "Parallel":
        """A world of one, whatever the environment says."""
        par = cls.__new__(cls)
        par.mode, par.timeout, par.device = "none", 0.0, torch.device(device)
        par.rank, par.world, par._owns_group, par.wrapped = 0, 1, False, None
        return par

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1 or self.mode != "none"

    # -- checks at start -----------------------------------------------------------------

    def check_same(self, config: dict, what: str = "config") -> None:
        """Every rank holds the same ``config`` (a JSON-able dict); else DistributedError
        naming the first fields that differ and the ranks."""
        if not self.active:
            return
        mine = json.dumps(config, sort_keys=True, default=str)
        every = self._collective(lambda: self._all_gather_object(mine), f"comparing the {what} of the ranks")
        for r, other in enumerate(every):
            if other != mine:
                a, b = json.loads(every[0]), json.loads(other)
                diff = sorted(_diff_keys(a, b))[:5]
                raise DistributedError(
                    f"the {what} of rank {r} differs from rank 0's in {', '.join(diff) or 'its contents'}: every rank must run "
                    f"the same config (same file, same command line)"
                )

    def check_batch(self, batch_size: int) -> int:
        """The rows per rank; ValueError unless ``batch_size`` divides by the world size."""
        if batch_size % self.world:
            raise ValueError(
                f"data.batch_size = {batch_size} (the global batch) must be divisible by the world size {self.world}: "
                f"each rank trains on batch_size / world rows"
            )
        return batch_size // self.world

    # -- the model -------------------------------------------------------------------------

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module to call for the forward pass: ``model`` itself (world of one), DDP, or
        FSDP2 units over :func:`fsdp_units` plus the root. ``model`` stays the trainer's handle."""
        if not self.active:
            self.wrapped = None
            return model
        scored = _Scored(model)
        if self.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = DistributedDataParallel(scored, device_ids=ids)
        else:
            from torch.distributed.fsdp import fully_shard

            for block in fsdp_units(model):
                fully_shard(block)
            self.wrapped = fully_shard(scored)
        return self.wrapped

    def forward(self, model: nn.Module, inputs, labels):
        """(logits, targets) at the labelled positions, through the wrapper when there is one."""
        if self.wrapped is None:
            return model.scored_logits(inputs, labels)
        return self.wrapped(inputs, labels)

    # -- the data --------------------------------------------------------------------------

    def shard(self, inputs: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100):
        """(inputs, labels, weight): this rank's rows of the global batch, and the factor
        that makes the mean over them, averaged by DDP/FSDP over the ranks, the global mean."""
        if not self.active:
            return inputs, labels, 1.0
        B = inputs.shape[0]
        rows = self.check_batch(B)
        sl = slice(self.rank * rows, (self.rank + 1) * rows)
        n_all = int((labels != ignore_index).sum())
        n_mine = int((labels[sl] != ignore_index).sum())
        return inputs[sl], labels[sl], (n_mine * self.world / n_all if n_all else 0.0)

    def mean(self, value: float) -> float:
        """The mean of a float over the ranks (the global loss of a step from the weighted local ones)."""
        if not self.active:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        self._collective(lambda: dist.all_reduce(t), "averaging the loss")
        return float(t) / self.world

    # -- checkpoints -------------------------------------------------------------------------

    def state_dicts(self, model: nn.Module, opt) -> tuple[dict, dict]:
        """Full (unsharded) model and optimizer state dicts, the single-process format; every
        rank must call this (FSDP gathers), rank 0 writes them."""
        if self.mode != "fsdp":
            return model.state_dict(), opt.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return self._collective(lambda: get_state_dict(model, opt, options=opts), "gathering the checkpoint")

    def load_state_dicts(self, model: nn.Module, opt, model_sd: dict, opt_sd: dict) -> None:
        """Loads full state dicts (from any world size) into this rank's model and optimizer."""
        if self.mode != "fsdp":
            model.load_state_dict(model_sd)
            opt.load_state_dict(opt_sd)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=opt_sd,
                       options=StateDictOptions(full_state_dict=True))

    def plain_model(self, model: nn.Module, build) -> nn.Module:
        """An unsharded copy of the model on rank 0 (FSDP; every rank must call this), or the
        model itself (DDP and one process: its parameters are whole)."""
        if self.mode != "fsdp":
            return model
        sd = self._full_model_sd(model)
        if not self.is_main:
            return model
        plain = build()
        plain.load_state_dict(sd)
        return plain

    def _full_model_sd(self, model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return self._collective(lambda: get_model_state_dict(model, options=opts), "gathering the model")

    # -- plumbing ----------------------------------------------------------------------------

    def barrier(self) -> None:
        if self.active:
            import torch.distributed as dist

            self._collective(dist.barrier, "waiting for the other ranks")

    def close(self) -> None:
        """Destroys the process group if this object created it."""
        if self._owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False

    def guard(self, what: str):
        """A context that turns a failed collective inside into a :class:`DistributedError`."""
        return _Guard(self, what)

    def _collective(self, fn, what: str):
        with self.guard(what):
            return fn()

    @staticmethod
    def _all_gather_object(obj):
        import torch.distributed as dist

        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out


class _Guard:
    def __init__(self, par: Parallel, what: str):
        self.par, self.what = par, what

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or not self.par.active or isinstance(exc, (DistributedError, ValueError, KeyboardInterrupt)):
            return False
        import torch.distributed as dist

        if isinstance(exc, (dist.DistError, RuntimeError)) and _looks_distributed(exc):
            raise DistributedError(
                f"rank {self.par.rank}/{self.par.world}: a collective failed while {self.what} — another rank died, hangs "
                f"or is out of step (collective timeout train.dist_timeout = {self.par.timeout:g} s): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
        return False


def _looks_distributed(exc: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    s = str(exc).lower()
    return any(w in s for w in ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket", "closed"))


def _diff_keys(a, b, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]
