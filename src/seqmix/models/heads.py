"""Typed config of the sequence-classification heads (LRA): kept apart from the modules so
that :class:`seqmix.models.lm.ModelConfig` can hold it without importing the classifier."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ClassifierConfig(BaseModel):
    """A sequence classifier (or, with ``dual``, the Retrieval dual encoder) around the backbone.

    * ``pooling``: ``mean`` over each row's real tokens (the released DSF configs), ``last``
      (the last real token: the state of a causal model after the whole sequence), or
      ``cls``: a learned token appended after each row's last real token and read out there
      (a causal model's CLS must come last to see the whole sequence);
    * ``bidirectional``: ``none`` (causal, the DSF paper), or a forward pass plus a pass
      over each row reversed within its own length (padding stays on the right), combined
      by ``sum`` or ``concat`` (MetaLA's "bid-model" does not say which: both are offered);
      ``bidirectional_weights``: the reversed pass has its own backbone (``separate``, as a
      BiLSTM) or reuses the forward one (``shared``);
    * the head is LRA's: Linear(d_feat, head_hidden) → ReLU → Linear(head_hidden, classes);
      the dual encoder feeds it [u, v, u ⊙ v, u − v] of the two pooled documents (LRA's
      matching head; the towers share weights).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_classes: int | None = Field(None, gt=1, description="classes (default: the data's)")
    dual: bool | None = Field(None, description="two documents per example, matched (default: the data's)")
    pooling: Literal["mean", "last", "cls"] = Field("mean", description="how the sequence becomes one vector")
    bidirectional: Literal["none", "sum", "concat"] = Field("none", description="add a reversed pass, combined so")
    bidirectional_weights: Literal["separate", "shared"] = Field("separate", description="weights of the reversed pass")
    head_hidden: int | None = Field(None, gt=0, description="hidden width of the head (default: d_model)")
    head_dropout: float = Field(0.0, ge=0, lt=1, description="dropout before each head layer")
    pad_id: int = Field(0, ge=0, description="the padding token id (right padding)")
