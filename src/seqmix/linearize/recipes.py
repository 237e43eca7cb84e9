"""Linearization recipes: the field's linearizers as typed presets of the one pipeline.

A recipe is what makes a linearization method — the student (a registered mixer, its config, the
layers that keep softmax), stage 1 (what each of its steps matches, what it trains, its learning
rate, its share of the token budget) and stage 2 (its losses, LoRA and what it trains, its learning
rate) — written as the :class:`~seqmix.linearize.pipeline.LinearizeConfig` fields that set them:

    run(LinearizeConfig(recipe="lolcats", hf="path/to/llama", tokens=400_000, out="runs/lol"))
    seqmix linearize --recipe lolcats --hf path/to/llama --tokens 400000 --out runs/lol

Every field given explicitly overrides the recipe's value (a student ``mixer`` given without a
``mixer_config`` drops the recipe's config, which belongs to the recipe's student). A recipe holds
shares of the budget, not token counts, so it scales to the budget given: ``tokens`` is split
``transfer_share`` : 1 − ``transfer_share`` between the stages, and stage 1's steps in the ratio
``transfer_split``. Learning rates are this scale's (a 4-layer, d = 128 model), not the papers'
(1B-8B models with LoRA at 1e-4): each recipe's docstring line ``scaled`` says what changed.

:data:`DEFAULT_RECIPE` is what ``seqmix linearize`` and :class:`LinearizeConfig` do by default: the
recipe bench/linearize.py measured best (docs/linearize.md, "Recipes"); the bench reads its
defaults from here too.

Each recipe also lists the ablations its paper reports (``ablations``: label -> field overrides) and
the paper's claims on them (``claims``, :class:`seqmix.experiments.Claim` with ``check="below"``
on validation bits per byte: a < b), which ``bench/linearize.py --recipes`` runs and checks.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..experiments.base import Claim

__all__ = ["Recipe", "RECIPES", "DEFAULT_RECIPE", "recipe", "recipe_settings", "METHOD_FIELDS", "MATCHES"]

#: stage 1's losses: the student's layer output, its attention map Φ, both, or the whole decoder layer's output
MATCHES = ("output", "phi", "both", "block")
#: the LinearizeConfig fields a recipe sets (the method); the rest (data, budget, device, output) are the run's
METHOD_FIELDS = ("mixer", "mixer_config", "layers", "init", "match", "transfer_split", "transfer_trainable", "transfer_share",
                 "transfer_lr", "finetune_lr", "lora_rank", "lora_targets", "finetune_trainable", "kd", "ce", "stages")


class Recipe(BaseModel):
    """One linearization method as LinearizeConfig fields (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    title: str = Field(description="the method, in one line")
    source: str = Field(description="the paper (and the sections / tables the settings come from)")
    settings: dict[str, Any] = Field(description="LinearizeConfig fields: every field of METHOD_FIELDS")
    paper: str = Field(description="the paper's own setting: tokens per stage, learning rates, what trains")
    scaled: str = Field(description="what this preset changes to run at the budget given and at this scale")
    ablations: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="label -> field overrides: the paper's ablations, run by bench/linearize.py --recipes")
    claims: list[Claim] = Field(default_factory=list, description="the paper's claims on the ablations (labels: the recipe's "
                                "name, or NAME:ABLATION), checked on validation bits per byte")


def _claim(text: str, a: str, b: str, caveat: str = "") -> Claim:
    return Claim(text=text, check="below", a=a, b=b, caveat=caveat)


_SEQMIX = Recipe(
    name="seqmix",
    title="Gated DeltaNet from the attention weights; output matching; KD + LoRA on the kept weights",
    source="seqmix's own, measured by bench/linearize.py (docs/linearize.md, 'Recipes')",
    settings=dict(mixer="gated_deltanet", mixer_config={}, layers="all", init="attention", stages=("transfer", "finetune"),
                  match="output", transfer_split=None, transfer_trainable="all", transfer_share=1 / 3, transfer_lr=3e-3,
                  finetune_lr=3e-3, lora_rank=8, lora_targets="kept", finetune_trainable="students", kd=1.0, ce=1.0),
    paper="—",
    scaled="—",
    ablations={"no_kd": {"kd": 0.0}, "full": {"lora_rank": 0, "finetune_trainable": "all"}},
    claims=[_claim("KD to the teacher's logits lowers the final loss", "seqmix", "seqmix:no_kd"),
            _claim("LoRA on the kept weights beats full fine-tuning at this budget", "seqmix", "seqmix:full")],
)

#: name -> recipe
RECIPES: dict[str, Recipe] = {r.name: r for r in (_SEQMIX,)}

#: the recipe of ``seqmix linearize`` and LinearizeConfig by default
DEFAULT_RECIPE = "seqmix"


def recipe(name: str) -> Recipe:
    """The recipe ``name`` (ValueError naming 'recipe' if there is none)."""
    if name not in RECIPES:
        raise ValueError(f"linearize: argument 'recipe' must be one of {', '.join(RECIPES)}, got {name!r}")
    return RECIPES[name]


def recipe_settings(name: str, overrides: dict | None = None) -> dict[str, Any]:
    """The LinearizeConfig method fields of recipe ``name`` with ``overrides`` on top (a student
    ``mixer`` overridden without a ``mixer_config`` drops the recipe's config)."""
    settings = dict(recipe(name).settings)
    overrides = dict(overrides or {})
    if "mixer" in overrides and overrides["mixer"] != settings["mixer"] and "mixer_config" not in overrides:
        settings["mixer_config"] = {}
    settings.update(overrides)
    return settings
