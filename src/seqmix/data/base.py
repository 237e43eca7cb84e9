"""What every task generator shares: the typed task config, the generated arrays, the
disk cache, the train/test seed streams and the batching (docs/harness.md, "Data").

A task is a pydantic config (``extra="forbid"``: a mistyped field is an error, not a
silently ignored keyword as in Zoology, peer-zoology note §1.4) with a ``task`` name and
a ``generate(rng) -> TaskArrays`` method. Labels are ``IGNORE`` (-100) wherever nothing
is scored, and inputs/labels are already shifted: the model predicts ``labels[t]`` from
``inputs[:t+1]`` (next-token style, peer-zoology note §1.2 item 5).

Seeds. A :class:`DataConfig` has one integer ``seed``; segment i of split s draws from
``np.random.SeedSequence([seed, s, i])`` (s = 0 train, 1 test), so the train and test
streams are never the same stream (unlike the Task-Level-Insights repo, peer-zoology
note §1.2 item 9) and adding a test segment does not change the training data.

Cache. Generated arrays are saved to ``<cache dir>/data/<task>-<hash>.pt``, the hash
covering the segment config, the seed entropy and :data:`GENERATOR_VERSION`. The cache
dir is ``$SEQMIX_CACHE`` if set, else ``$XDG_CACHE_HOME/seqmix``, else ``~/.cache/seqmix``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterator

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

#: the label of unscored positions (torch's cross-entropy ignore_index)
IGNORE = -100
#: bump when a generator changes its output for the same config and seed (invalidates caches)
GENERATOR_VERSION = 1


def cache_dir() -> Path:
    """$SEQMIX_CACHE, else $XDG_CACHE_HOME/seqmix, else ~/.cache/seqmix (never inside the repo)."""
    env = os.environ.get("SEQMIX_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "seqmix"


class TaskConfig(BaseModel):
    """Fields every task has. Subclasses set ``task`` (a Literal) and implement ``generate``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(gt=1, description="number of token ids the model sees")
    seq_len: int = Field(gt=1, description="input length L (after the next-token shift)")
    num_examples: int = Field(gt=0, description="examples in this segment")

    #: tasks whose labels are sparse (a few per sequence): the model computes logits only there
    sparse_labels: ClassVar[bool] = True

    @property
    def slice_name(self) -> str:
        """Short name of the segment, used to report per-slice accuracy."""
        return f"{self.task}(L={self.seq_len})"

    def generate(self, rng: np.random.Generator) -> "TaskArrays":
        raise NotImplementedError


@dataclass
class TaskArrays:
    """Generated examples of one segment: inputs and labels, int arrays [N, L]; or, for a
    sequence-classification task (LRA), inputs [N, L] or pairs [N, 2, L] and labels [N]."""

    inputs: np.ndarray
    labels: np.ndarray

    def __post_init__(self):
        per_token = self.inputs.shape == self.labels.shape and self.inputs.ndim == 2
        per_example = self.labels.ndim == 1 and self.inputs.ndim in (2, 3) and self.labels.shape[0] == self.inputs.shape[0] \
            and (self.inputs.ndim == 2 or self.inputs.shape[1] == 2)
        if not (per_token or per_example):
            raise ValueError(f"TaskArrays: inputs {self.inputs.shape} and labels {self.labels.shape} must be equal [N, L], "
                             "or [N, L] / [N, 2, L] with labels [N]")


def _storage_dtype(vocab_size: int) -> torch.dtype:
    return torch.int16 if vocab_size <= 32767 else torch.int32


def config_hash(obj: dict) -> str:
    """A stable short hash of a JSON-able dict (sorted keys)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


@dataclass
class Segment:
    """One generated segment held in memory as compact int tensors (int16 when the vocab fits)."""

    config: TaskConfig
    inputs: torch.Tensor
    labels: torch.Tensor
    name: str = ""

    def __len__(self) -> int:
        return self.inputs.shape[0]


def build_segment(config: TaskConfig, entropy: tuple[int, ...], *, use_cache: bool = True, cache: Path | None = None) -> Segment:
    """Generates (or loads from the disk cache) one segment from the seed stream ``entropy``."""
    key = config_hash({"config": config.model_dump(), "entropy": list(entropy), "version": GENERATOR_VERSION})
    path = (cache or cache_dir()) / "data" / f"{config.task}-{key}.pt"
    if use_cache and path.exists():
        try:
            blob = torch.load(path, weights_only=True)
            return Segment(config, blob["inputs"], blob["labels"], config.slice_name)
        except Exception:  # a torn or stale file: regenerate it
            pass
    rng = np.random.default_rng(np.random.SeedSequence(list(entropy)))
    arr = config.generate(rng)
    dt = _storage_dtype(config.vocab_size)
    inputs = torch.from_numpy(np.ascontiguousarray(arr.inputs)).to(dt)
    labels = torch.from_numpy(np.ascontiguousarray(arr.labels)).to(dt)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"inputs": inputs, "labels": labels, "config": config.model_dump()}, tmp)
        os.replace(tmp, path)  # atomic: parallel workers may write the same file
    return Segment(config, inputs, labels, config.slice_name)


@dataclass
class Batch:
    inputs: torch.Tensor  # [B, L] int64
    labels: torch.Tensor  # [B, L] int64, IGNORE where unscored
    segment: int  # index of the segment it came from
    name: str = ""


@dataclass
class Split:
    """The segments of one split (train or test), batched one segment at a time
    (batches never mix segments, whose lengths may differ: peer-zoology note §1.2 item 10)."""

    segments: list[Segment]
    batch_size: int
    names: list[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.names:
            raw = [s.name for s in self.segments]
            seen: dict[str, int] = {}
            for n in raw:  # disambiguate equal slice names: a, a -> a#1, a#2
                seen[n] = seen.get(n, 0) + 1
                self.names.append(f"{n}#{seen[n]}" if raw.count(n) > 1 else n)

    def num_examples(self) -> int:
        return sum(len(s) for s in self.segments)

    def num_batches(self) -> int:
        return sum(-(-len(s) // self.batch_size) for s in self.segments)

    @property
    def steps_per_epoch(self) -> int:
        """Batches per pass (the trainer's epoch; a token stream has None)."""
        return self.num_batches()

    @property
    def tokens_per_batch(self) -> int:
        """Input tokens of a full batch of the longest segment (for a token budget)."""
        return self.batch_size * max(s.inputs.shape[1] for s in self.segments)

    def batches(self, *, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> Iterator[Batch]:
        """Batches in segment order. With ``shuffle`` the examples of each segment and the
        order of all batches are permuted by a generator seeded from (seed, epoch) only, so
        a resumed run sees the very batches an uninterrupted one would."""
        order = []
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 7, epoch]).generate_state(1)[0]))
        for si, s in enumerate(self.segments):
            idx = torch.randperm(len(s), generator=g) if shuffle else torch.arange(len(s))
            for start in range(0, len(s), self.batch_size):
                order.append((si, idx[start:start + self.batch_size]))
        if shuffle:
            order = [order[i] for i in torch.randperm(len(order), generator=g).tolist()]
        for si, idx in order:
            s = self.segments[si]
            yield Batch(s.inputs[idx].long(), s.labels[idx].long(), si, self.names[si])
