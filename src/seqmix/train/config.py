"""Typed configs of one training run: :class:`TrainConfig` (optimizer, schedule, stopping)
and :class:`RunConfig` (data + model + training + where it belongs in an experiment).

Every config forbids unknown fields, so a typo fails before anything runs, with a message
that names the field (``make_run_config`` turns pydantic's errors into one ValueError).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..data import CorpusConfig, DataConfig, RunData
from .._checks import check_device, read_json
from ..mixers.base import config_error
from ..models import ModelConfig

_FIELD_MSG = re.compile(r"^[A-Za-z_]\w*: ")

#: TrainConfig fields that change how a run is executed, not what it computes (left out of the run id)
EXECUTION_FIELDS = ("device", "threads", "checkpoint_every", "parallel", "dist_timeout")


class TrainConfig(BaseModel):
    """AdamW + warmup/cosine, clipping, early stopping (defaults: the DSF paper's MQAR protocol)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay (not on norms, biases, SSM A/D)")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    epochs: int = Field(64, gt=0, description="passes over the training set (a finite task set; a corpus counts steps/tokens)")
    max_steps: int | None = Field(None, gt=0, description="cap on optimizer steps (the run spans min(epochs·batches, max_steps, max_tokens/step), and so does the schedule unless schedule_steps is set)")
    max_tokens: int | None = Field(None, gt=0, description="token budget: steps = ceil(max_tokens / tokens per optimizer step)")
    grad_accum: int = Field(1, gt=0, description="micro-batches per optimizer step (gradient accumulation)")
    warmup: float = Field(0.1, ge=0, lt=1, description="fraction of the schedule's steps (the run's, or schedule_steps) with a linear warmup")
    schedule: Literal["cosine", "constant"] = Field("cosine", description="after the warmup")
    min_lr: float = Field(0.0, ge=0, le=1, description="final learning rate as a fraction of lr")
    schedule_steps: int | None = Field(
        None, gt=0, description="length in optimizer steps of the warmup + cosine schedule (default: the run's steps); "
        "longer than the run: the run trains the first steps of that schedule, a budget cut of a longer run "
        "(the DSF runs stop early at 99% while their 64-epoch cosine is still near its peak)")
    grad_clip: float | None = Field(1.0, gt=0, description="max global gradient norm (None: no clipping)")
    early_stop: float | None = Field(0.99, gt=0, le=1, description="stop once the validation accuracy reaches this (None: never)")
    eval_every: int = Field(1, gt=0, description="evaluate every this many epochs (and after the last)")
    eval_every_steps: int | None = Field(
        None, gt=0, description="evaluate every this many optimizer steps (and after the last); a corpus run defaults to "
        "10 evaluations over the budget")
    eval_batches: int | None = Field(None, gt=0, description="evaluate on at most this many batches (None: the whole split)")
    checkpoint_every: int | None = Field(None, gt=0, description="also checkpoint every this many steps (always at evaluations)")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="autocast dtype of the forward pass (weights stay fp32)")
    seed: int = Field(0, ge=0, description="seed of the init, dropout and shuffling")
    device: str = Field("cpu", description="torch device")
    threads: int | None = Field(None, gt=0, description="torch CPU threads (default: torch's choice)")
    parallel: Literal["none", "ddp", "fsdp"] = Field(
        "none", description="under torchrun: DDP or FSDP2 over the ranks, each training on its slice of the global batch (docs/scale.md)")
    dist_timeout: float = Field(600.0, gt=0, description="seconds a collective may wait before the run fails (a dead or hung rank)")

    @model_validator(mode="after")
    def _schedule_covers_the_cap(self):
        """A schedule shorter than max_steps is refused here; against the epochs, which need the data,
        the trainer checks it (Trainer.schedule_horizon)."""
        if self.schedule_steps is not None and self.max_steps is not None and self.schedule_steps < self.max_steps:
            raise ValueError(f"schedule_steps = {self.schedule_steps} is shorter than max_steps = {self.max_steps}; "
                             "expected at least the run's steps (the run is the first steps of the schedule)")
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v)


class RunConfig(BaseModel):
    """One training run. ``experiment``/``label``/``tags`` place it in a sweep's results
    (``tags`` holds grid coordinates such as {"n": 32}); they are part of the run id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment: str = Field("", description="experiment (preset) name the run belongs to")
    label: str = Field("", description="the model's name in tables and legends (default: the mixer)")
    tags: dict[str, Any] = Field(default_factory=dict, description="grid coordinates (n, task, ...)")
    data: RunData = Field(description="a synthetic task set, or a text corpus (kind='corpus')")
    model: ModelConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    init_from_hf: str | None = Field(
        None, description="a transformers checkpoint (folder, or hub id in the local cache) the run fine-tunes, converted "
        "by seqmix.interop; 'model' then records its sizes and is not what is built (docs/interop.md)")

    @model_validator(mode="before")
    @classmethod
    def _fill_model_sizes(cls, values):
        """model.vocab_size and max_seq_len default to the data's."""
        if not isinstance(values, dict):
            return values
        data, model = values.get("data"), values.get("model")
        try:
            if isinstance(data, dict):
                data = CorpusConfig(**data) if data.get("kind") == "corpus" else DataConfig(**data)
            elif not isinstance(data, (DataConfig, CorpusConfig)):
                data = None
        except (pydantic.ValidationError, ValueError):
            return values  # reported by field validation
        if data is None:
            return values
        m = model.model_dump() if isinstance(model, ModelConfig) else dict(model) if isinstance(model, dict) else None
        if m is None:
            return values
        m.setdefault("vocab_size", None)
        m.setdefault("max_seq_len", None)
        if m["vocab_size"] is None:
            try:  # a corpus' vocabulary: its tokenizer is built (the corpus read) here
                m["vocab_size"] = data.vocab_size
            except ValueError as e:
                raise ValueError(f"data.{e}" if _FIELD_MSG.match(str(e)) else f"data: {e}") from None
        if m["max_seq_len"] is None:
            m["max_seq_len"] = data.max_seq_len
        if getattr(data, "num_classes", None) is not None:  # an LRA task: a classifier, sized from the data
            cls = m.get("classifier") or {}
            cls = cls.model_dump() if hasattr(cls, "model_dump") else dict(cls)
            if cls.get("num_classes") is None:
                cls["num_classes"] = data.num_classes
            if cls.get("dual") is None:
                cls["dual"] = data.pairs
            m["classifier"] = cls
        return {**values, "data": data, "model": m}

    @model_validator(mode="after")
    def _fits(self):
        if self.model.vocab_size < self.data.vocab_size:
            raise ValueError(f"model.vocab_size = {self.model.vocab_size} is smaller than the data's vocab_size = {self.data.vocab_size}")
        if self.model.use_positions and self.model.max_seq_len < self.data.max_seq_len:
            raise ValueError(f"model.max_seq_len = {self.model.max_seq_len} is shorter than the data's seq_len = {self.data.max_seq_len}")
        n_cls = getattr(self.data, "num_classes", None)
        if (n_cls is None) != (self.model.classifier is None):
            raise ValueError("model.classifier is set for a token-level task" if n_cls is None else
                             "model.classifier must be set for a classification (LRA) task")
        if n_cls is not None and self.model.classifier.dual != self.data.pairs:
            raise ValueError(f"model.classifier.dual = {self.model.classifier.dual} but the data's inputs are "
                             f"{'pairs' if self.data.pairs else 'single sequences'}")
        if n_cls is not None and self.model.classifier.num_classes < n_cls:
            raise ValueError(f"model.classifier.num_classes = {self.model.classifier.num_classes} < the data's {n_cls}")
        if isinstance(self.data, CorpusConfig) and not (self.train.max_steps or self.train.max_tokens):
            raise ValueError("train: a corpus run counts tokens: set train.max_tokens or train.max_steps")
        return self

    @property
    def is_lm(self) -> bool:
        """A language-modelling run (a text corpus)."""
        return isinstance(self.data, CorpusConfig)

    @property
    def name(self) -> str:
        return self.label or self.model.mixer

    def semantic_dict(self) -> dict:
        """The fields that determine the result, defaults left out: a field added later with a
        default keeps the ids of the runs made before it (changing a default's value does not
        change ids either: use a new --out folder then)."""
        d = self.model_dump(mode="json", exclude_defaults=True)
        d.setdefault("train", {})
        for f in EXECUTION_FIELDS:
            d["train"].pop(f, None)
        return d

    @property
    def run_id(self) -> str:
        """Hash of everything that determines the result (not the device or thread count)."""
        blob = json.dumps(self.semantic_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


def make_run_config(**fields) -> RunConfig:
    """RunConfig(**fields) with pydantic's errors turned into one ValueError naming each bad field."""
    try:
        return RunConfig(**fields)
    except pydantic.ValidationError as e:
        raise config_error("run", e) from None


def load_run_config(path, argument: str = "--config") -> RunConfig:
    """The RunConfig in the JSON file ``path`` (a run folder's config.json, or one written by
    hand); a missing, unreadable, non-JSON or invalid file: one ValueError naming ``argument``."""
    from pathlib import Path

    blob = read_json(path, argument, "a RunConfig as JSON")
    if not isinstance(blob, dict):
        raise ValueError(f"argument {argument}: {str(path)!r} holds a JSON {type(blob).__name__}, expected an object "
                         "(a RunConfig: data, model, train)")
    try:
        return RunConfig(**blob)
    except pydantic.ValidationError as e:
        raise config_error(f"argument {argument}: {Path(path).name}", e) from None

