"""``build_model``: a model config in, the model out — the :class:`~seqmix.models.lm.LanguageModel`,
or a :class:`~seqmix.models.classifier.SequenceClassifier` around it when the config has a
``classifier`` head (LRA). It sits above both (the classifier holds a LanguageModel), so
imports run one way: lm <- classifier <- build.
"""

from __future__ import annotations

import pydantic
from torch import nn

from ..mixers.base import config_error
from .classifier import SequenceClassifier
from .lm import LanguageModel, ModelConfig


def build_model(config: ModelConfig | dict, **overrides) -> nn.Module:
    """``build_model(ModelConfig(...))`` or ``build_model({"mixer": "s6", ...}, vocab_size=...)``:
    the LanguageModel, or a :class:`seqmix.models.classifier.SequenceClassifier` around it
    when ``classifier`` is set. Both give ``scored_logits(inputs, labels) -> (logits [M, C],
    targets [M])``, so the trainer computes loss and accuracy the same way for either."""
    try:
        if isinstance(config, dict):
            config = ModelConfig(**{**config, **overrides})
        elif overrides:
            config = config.model_copy(update=overrides)
            config = ModelConfig(**config.model_dump())
    except pydantic.ValidationError as e:
        raise config_error("model", e) from None
    if config.classifier is not None:
        return SequenceClassifier(config)
    return LanguageModel(config)
