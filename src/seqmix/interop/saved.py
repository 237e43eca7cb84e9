"""The folders a converted model is saved to: a model type that transformers knows only through seqmix.

A converted model (``from_transformers``, ``place_mixer``, ``seqmix.linearize``) holds seqmix mixers whose
weights have seqmix's names (``<slot>.mixer.W_qk.weight``), where the family's own class expects
transformers' (``q_proj.weight``). Saved under the family's model type, such a folder would load in
transformers without its mixers: their weights dropped as unexpected, the slots' weights drawn at random,
a warning table and wrong logits. So a converted model's config saves itself under the model type
:data:`MODEL_TYPE` (``"seqmix_converted"``), the family's in ``seqmix_model_type``:

* without seqmix, transformers refuses the folder by that name (``AutoConfig``: an unknown model type);
* with ``seqmix.interop`` imported, ``AutoConfig.from_pretrained(folder)`` returns a
  :class:`SeqmixConvertedConfig` and ``AutoModelForCausalLM.from_pretrained(folder)`` returns
  ``seqmix.interop.load_converted(folder)`` (load.py's ``SeqmixConvertedForCausalLM``): the family's model
  class with its seqmix mixers, exactly.

How: the converter gives the converted model's config a subclass of its own class
(:func:`tag_config`: ``SeqmixConvertedLlamaConfig`` for a ``LlamaConfig``) that differs in one thing,
what ``to_dict`` writes (the model type above); the live model, its ``config.model_type`` and every
``isinstance`` check see the family's config as before.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PreTrainedConfig

#: the model type of a saved converted model (config.json's "model_type")
MODEL_TYPE = "seqmix_converted"
#: the config.json field holding the family's model type
FAMILY_FIELD = "seqmix_model_type"


class _SavesAsConverted:
    """Mixed into a family's config class by :func:`tag_config`: serializes under :data:`MODEL_TYPE`."""

    _seqmix_family_class: type

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d[FAMILY_FIELD] = d["model_type"]
        d["model_type"] = MODEL_TYPE
        return d

    def __reduce__(self):  # pickled by the family's class: the tagged class is rebuilt from it on load
        return (_rebuild, (self._seqmix_family_class, self.__dict__.copy()))


_TAGGED: dict[type, type] = {}


def _tagged_class(cls: type) -> type:
    if cls not in _TAGGED:
        _TAGGED[cls] = type(f"SeqmixConverted{cls.__name__}", (_SavesAsConverted, cls),
                            {"__module__": __name__, "_seqmix_family_class": cls})
    return _TAGGED[cls]


def _rebuild(cls: type, state: dict):
    config = object.__new__(_tagged_class(cls))
    config.__dict__.update(state)
    return config


def tag_config(model) -> None:
    """Makes ``model.config`` (a family's config, in place) save as :data:`MODEL_TYPE` (module docstring)."""
    config = getattr(model, "config", None)
    if isinstance(config, PreTrainedConfig) and not isinstance(config, _SavesAsConverted):
        config.__class__ = _tagged_class(type(config))


class SeqmixConvertedConfig(PreTrainedConfig):
    """What ``AutoConfig.from_pretrained`` returns for a saved converted model (model type
    :data:`MODEL_TYPE`): ``seqmix_model_type``, the family, and ``family``, the family's config fields as
    saved. :meth:`family_config` is the family's own config object."""

    model_type = MODEL_TYPE

    seqmix_model_type: str | None = None
    family: dict | None = None

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        d = dict(config_dict)
        d.pop("model_type", None)
        family = d.pop(FAMILY_FIELD, None)
        d.pop("transformers_version", None)
        return super().from_dict({FAMILY_FIELD: family, "family": d}, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The flat form saved in config.json (the family's fields, this model type and the family's)."""
        d = dict(self.family or {})
        d.update({"model_type": MODEL_TYPE, FAMILY_FIELD: self.seqmix_model_type})
        return d

    def family_config(self, argument: str = "config") -> PreTrainedConfig:
        """The family's config (its own class, e.g. ``LlamaConfig``) from the saved fields."""
        from transformers import CONFIG_MAPPING

        if self.seqmix_model_type not in CONFIG_MAPPING:
            raise ValueError(f"argument '{argument}': the saved converted model names the family "
                             f"{FAMILY_FIELD} = {self.seqmix_model_type!r}, which the installed transformers does not know")
        return CONFIG_MAPPING[self.seqmix_model_type].from_dict(dict(self.family or {}))


def register() -> None:
    """Registers :class:`SeqmixConvertedConfig` with AutoConfig under :data:`MODEL_TYPE` (done on ``import
    seqmix.interop``; its AutoModelForCausalLM entry is ``seqmix.interop.load.SeqmixConvertedForCausalLM``)."""
    try:
        AutoConfig.register(MODEL_TYPE, SeqmixConvertedConfig)
    except ValueError:  # already registered
        pass


register()

__all__ = ["FAMILY_FIELD", "MODEL_TYPE", "SeqmixConvertedConfig", "register", "tag_config"]
