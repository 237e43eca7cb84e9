"""seqmix.data: the synthetic tasks, generated locally and deterministically by seed.

    from seqmix.data import DataConfig, MQARConfig, build_data
    cfg = DataConfig(train=[MQARConfig(seq_len=64, num_kv_pairs=4, num_examples=10_000)],
                     test=[MQARConfig(seq_len=64, num_kv_pairs=4, num_examples=1_000)],
                     batch_size=64, seed=0)
    train, test = build_data(cfg)          # Split objects; cached on disk by config hash
    for batch in train.batches():          # Batch(inputs [B, L], labels [B, L], segment, name)
        ...

Text corpora (language modelling): :class:`CorpusConfig` in :mod:`seqmix.data.text`, the
other kind of data config; ``build_data`` takes either.

Tasks: ``mqar`` (Zoology-compatible), ``selective_copying``, ``induction_heads``,
``noisy_mqar``, ``fuzzy_mqar``; the Long Range Arena tasks ``listops``, ``pathfinder``,
``lra_text``, ``lra_retrieval``, ``lra_image`` (:mod:`seqmix.data.lra`: labels [B], one class
per example; Retrieval inputs [B, 2, L]). Protocol presets (Zoology ICLR'24, the Based mixture, the
DSF paper, MetaLA's Table A7, the B'MOJO/MAD tasks) are in :mod:`seqmix.data.presets`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from .base import IGNORE, Batch, Segment, Split, TaskArrays, TaskConfig, build_segment, cache_dir, config_hash
from .mqar import MQARConfig, multiquery_ar
from .lra import LRAImageConfig, ListOpsConfig, PathfinderConfig, RetrievalConfig, LRATextConfig
from .synthetic import FuzzyMQARConfig, InductionHeadsConfig, NoisyMQARConfig, SelectiveCopyingConfig
from .text import CorpusConfig, TokenWindows, load_tokenizer

#: task name -> config class (for the CLI and error messages)
TASKS: dict[str, type[TaskConfig]] = {
    c.model_fields["task"].default: c
    for c in (MQARConfig, SelectiveCopyingConfig, InductionHeadsConfig, NoisyMQARConfig, FuzzyMQARConfig,
              ListOpsConfig, PathfinderConfig, LRATextConfig, RetrievalConfig, LRAImageConfig)
}


def _task_tag(v) -> str | None:
    name = v.get("task") if isinstance(v, dict) else getattr(v, "task", None)
    return f"task={name}" if isinstance(name, str) and name in TASKS else None


#: one segment's task config, chosen by its ``task`` field; an error names the fields of that
#: task only (tags are written ``field=value``: seqmix.mixers.base.config_location leaves them out)
Task = Annotated[
    Union[tuple(Annotated[cls, Tag(f"task={name}")] for name, cls in TASKS.items())],
    Discriminator(_task_tag, custom_error_type="unknown_task",
                  custom_error_message=f"task: expected one of {', '.join(TASKS)}", custom_error_context={"field": "task"}),
]


class DataConfig(BaseModel):
    """Train and test segments, batch sizes and the data seed.

    Batches never mix segments. ``shuffle=False`` keeps Zoology's fixed order (every
    epoch the same batches in the same order; the DSF paper: "the data and its order are
    constant for all runs"); ``shuffle=True`` permutes per epoch, seeded by (seed, epoch).
    ``train_targets="all_tokens"`` trains on the next token at every position (MAD's
    training loss); the test split always scores the task's labels only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    train: list[Task] = Field(min_length=1, description="training segments")
    test: list[Task] = Field(min_length=1, description="evaluation segments")
    batch_size: int = Field(64, gt=0, description="training batch size")
    test_batch_size: int | None = Field(None, gt=0, description="evaluation batch size (default: batch_size)")
    seed: int = Field(0, ge=0, description="data seed: train segment i uses stream (seed, 0, i), test (seed, 1, i)")
    shuffle: bool = Field(False, description="reshuffle the training examples every epoch")
    train_targets: Literal["task", "all_tokens"] = Field("task", description="training labels: the task's, or every next token")

    @model_validator(mode="after")
    def _consistent(self):
        vocabs = {t.vocab_size for t in self.train + self.test}
        if len(vocabs) > 1:
            raise ValueError(f"train/test: every segment must have the same vocab_size, got {sorted(vocabs)}")
        return self

    @model_validator(mode="after")
    def _one_kind(self):
        kinds = {getattr(t, "num_classes", None) is None for t in self.train + self.test}
        pairs = {bool(getattr(t, "pairs", False)) for t in self.train + self.test}
        if len(kinds) > 1 or len(pairs) > 1:
            raise ValueError("train/test: segments must be all token-level tasks or all LRA tasks of one input kind")
        return self

    @property
    def vocab_size(self) -> int:
        return self.train[0].vocab_size

    @property
    def max_seq_len(self) -> int:
        return max(t.seq_len for t in self.train + self.test)

    @property
    def sparse_labels(self) -> bool:
        return self.train_targets == "task" and all(t.sparse_labels for t in self.train + self.test)

    @property
    def num_classes(self) -> int | None:
        """Classes of a sequence-classification (LRA) task; None for the token-level tasks."""
        ks = {getattr(t, "num_classes", None) for t in self.train + self.test}
        return max(ks) if None not in ks else None

    @property
    def pairs(self) -> bool:
        """Inputs are document pairs [B, 2, L] (LRA Retrieval)."""
        return any(getattr(t, "pairs", False) for t in self.train + self.test)

    def describe(self) -> str:
        tr = ", ".join(f"{t.slice_name}×{t.num_examples}" for t in self.train)
        te = ", ".join(f"{t.slice_name}×{t.num_examples}" for t in self.test)
        return f"train [{tr}] test [{te}]"


def _all_tokens(seg: Segment) -> Segment:
    """Labels = the next input token everywhere (the last position keeps the task's label)."""
    labels = seg.labels.clone()
    labels[:, :-1] = seg.inputs[:, 1:]
    return Segment(seg.config, seg.inputs, labels, seg.name)


#: the data configs a run can hold: a synthetic task set, or a text corpus
AnyDataConfig = Union[DataConfig, CorpusConfig]


def _data_tag(v) -> str | None:
    if isinstance(v, (DataConfig, CorpusConfig)):
        return "kind=corpus" if isinstance(v, CorpusConfig) else "kind=tasks"
    if not isinstance(v, dict):
        return "kind=tasks"  # reported by DataConfig: expected a dict
    kind = v.get("kind")
    return "kind=corpus" if kind == "corpus" else "kind=tasks" if kind is None else None


#: the data field of a run or a preset's task: a text corpus when ``kind`` is "corpus", else a
#: synthetic task set. Tagged, so that an error speaks of the kind the user chose only.
RunData = Annotated[
    Union[Annotated[DataConfig, Tag("kind=tasks")], Annotated[CorpusConfig, Tag("kind=corpus")]],
    Discriminator(_data_tag, custom_error_type="unknown_data_kind",
                  custom_error_message="kind: expected 'corpus' (a text corpus) or no kind (a synthetic task set: train and test segments)",
                  custom_error_context={"field": "kind"}),
]


def build_data(config: DataConfig | CorpusConfig, *, use_cache: bool = True) -> tuple[Split, Split] | tuple[TokenWindows, TokenWindows]:
    """The training source and the evaluation split of ``config``: for a task set, the
    train and test :class:`Split` (generated, or loaded from the cache); for a
    :class:`CorpusConfig`, the training and evaluation :class:`TokenWindows` (tokenized
    once into the cache). The trainer reads both the same way (``steps_per_epoch`` is None
    for a token stream, which it counts in tokens)."""
    if isinstance(config, CorpusConfig):
        from .text import build_text_data

        return build_text_data(config)
    train = [build_segment(t, (config.seed, 0, i), use_cache=use_cache) for i, t in enumerate(config.train)]
    test = [build_segment(t, (config.seed, 1, i), use_cache=use_cache) for i, t in enumerate(config.test)]
    if config.train_targets == "all_tokens":
        train = [_all_tokens(s) for s in train]
    return Split(train, config.batch_size), Split(test, config.test_batch_size or config.batch_size)


__all__ = [
    "IGNORE", "AnyDataConfig", "RunData", "Batch", "CorpusConfig", "DataConfig", "TokenWindows", "load_tokenizer", "FuzzyMQARConfig", "InductionHeadsConfig", "MQARConfig", "NoisyMQARConfig",
    "Segment", "SelectiveCopyingConfig", "ListOpsConfig", "PathfinderConfig", "LRATextConfig", "RetrievalConfig", "LRAImageConfig",
    "Split", "TASKS", "Task", "TaskArrays", "TaskConfig", "build_data",
    "build_segment", "cache_dir", "config_hash", "multiquery_ar",
]
