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

__all__ = ["Recipe", "RECIPES", "DEFAULT_RECIPE", "recipe", "recipe_settings", "recipes_markdown", "METHOD_FIELDS", "MATCHES"]

#: stage 1's losses: the student's layer output, its attention map Φ, both, or the whole decoder layer's output
MATCHES = ("output", "phi", "both", "block")
#: the LinearizeConfig fields a recipe sets (the method); the rest (data, budget, device, output) are the run's
METHOD_FIELDS = ("mixer", "mixer_config", "layers", "init", "match", "transfer_split", "transfer_trainable", "transfer_share",
                 "transfer_lr", "finetune_lr", "lora_rank", "lora_targets", "finetune_trainable", "kd", "ce", "stages", "group_kv")


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
    title="LoLCATs attention started at its window (softmax over the last 64 tokens with the teacher's q/k/v/o; the "
          "Hedgehog linear attention before the window weighted 1 − γ, γ from 0.99; a GQA teacher's kv heads kept); output "
          "matching of every student weight; KD + LoRA on the kept weights, the students in full",
    source="seqmix's own, measured by bench/linearize.py (docs/linearize.md, 'Measured')",
    settings=dict(mixer="lolcats", mixer_config={"window": 64, "window_factor": 0.99, "affine_window_factor": True},
                  layers="all", init="attention", stages=("transfer", "finetune"), match="output", transfer_split=None,
                  transfer_trainable="all", transfer_share=1 / 3, transfer_lr=1e-3, finetune_lr=1e-3, lora_rank=8,
                  lora_targets="kept", finetune_trainable=None, kd=1.0, ce=1.0, group_kv=True),
    paper="—",
    scaled="—",
    ablations={"no_kd": {"kd": 0.0}, "full": {"lora_rank": 0}, "expand_kv": {"group_kv": False},
               "gamma_0.1": {"mixer_config": {"window": 64, "window_factor": 0.1, "affine_window_factor": False}},
               "gated_deltanet": {"mixer": "gated_deltanet"},
               "window_only": {"mixer": "sliding_window_attention", "mixer_config": {"window": 64}}},
    claims=[_claim("KD to the teacher's logits lowers the final loss", "seqmix", "seqmix:no_kd"),
            _claim("LoRA on the kept weights beats full fine-tuning at this budget", "seqmix", "seqmix:full"),
            _claim("starting at the window (γ 0.99, linear terms weighted 1 − γ) beats LoLCATs' start (γ 0.1)", "seqmix",
                   "seqmix:gamma_0.1"),
            _claim("the window student beats the best student without a window (Gated DeltaNet)", "seqmix",
                   "seqmix:gated_deltanet"),
            Claim(text="the linear attention before the window adds to the window alone (sliding-window softmax, 64 "
                       "tokens): no worse by more than 0.01 bits/byte", check="not_above", a="seqmix", b="seqmix:window_only",
                  value=0.01),
            Claim(text="keeping the teacher's kv heads (k, v tied per group: fewer weights to read per token) costs no "
                       "quality: no worse by more than 0.01 bits/byte than one k and v per head", check="not_above", a="seqmix",
                  b="seqmix:expand_kv", value=0.01)],
)

_LOLCATS = Recipe(
    name="lolcats",
    title="LoLCATs attention (sliding-window softmax + Hedgehog linear attention, one normalization); stage 1 trains the "
          "feature maps and window factors on the layer output; stage 2 LoRA on q/k/v/o, next-token loss",
    source="Zhang et al. 2025, LoLCATs (ICLR): §3.2-3.3, eq. 7, Table 8; ablations Tables 1, 6",
    settings=dict(mixer="lolcats", mixer_config={"window": 64}, layers="all", init="attention", stages=("transfer", "finetune"),
                  match="output", transfer_split=None, transfer_trainable="new", transfer_share=0.5, transfer_lr=1e-2,
                  finetune_lr=3e-3, lora_rank=8, lora_targets="students", finetune_trainable="lora", kd=0.0, ce=1.0,
                  group_kv=False),
    paper="w = 64; stage 1: 1000 × MSE of each layer's attention output, feature maps and γ only, lr 1e-2, ≈20M tokens of "
          "Alpaca at 1024; stage 2: LoRA r 8, α 16 on q, k, v, o (feature maps, γ, MLPs frozen), next-token CE, lr 1e-4, "
          "≈20M tokens (40M in all)",
    scaled="the budget split 1:1 as the paper's 20M:20M; stage 2's lr 3e-3 (1e-4 moves a d = 128 model little in the steps "
           "a 10% budget gives); the MSE is on the output after W_o (frozen in stage 1, so the same minimiser up to that map); "
           "one k and v per query head (the paper keeps a GQA teacher's kv heads: group_kv=True)",
    ablations={"no_transfer": {"stages": ("finetune",)}, "linear_only": {"mixer_config": {"window": 0}},
               "transfer_all": {"transfer_trainable": "all"},
               "window_only": {"mixer": "sliding_window_attention", "mixer_config": {"window": 64}, "transfer_trainable": "all",
                               "stages": ("finetune",)}},
    claims=[_claim("attention transfer + LoRA beats LoRA alone (Table 1)", "lolcats", "lolcats:no_transfer"),
            _claim("the sliding window + linear attention beats linear attention alone (Table 6)", "lolcats", "lolcats:linear_only"),
            Claim(text="training only the feature maps and window factors in stage 1 suffices: within 0.02 bits/byte of "
                       "training every student weight", check="not_above", a="lolcats", b="lolcats:transfer_all", value=0.02),
            _claim("the linear attention part matters: LoLCATs attention beats its window alone (the same LoRA stage)",
                   "lolcats", "lolcats:window_only")],
)

_MOHAWK = Recipe(
    name="mohawk",
    title="Phi-Mamba (Mamba-2 with a discrete per-head decay, one B/C head per attention head); stage 1 matrix orientation "
          "(Φ), stage 2 hidden-state alignment (each decoder layer's output), stage 3 end-to-end KD",
    source="Bick et al. 2024, Transformers to SSMs: Distilling Quadratic Knowledge to Subquadratic Models (MOHAWK), §3-4; "
           "goombalab/phi-mamba",
    settings=dict(mixer="phi_mamba", mixer_config={}, layers="all", init="attention", stages=("transfer", "finetune"),
                  match="phi,block", transfer_split=(1.0, 2.0), transfer_trainable="all", transfer_share=0.08, transfer_lr=3e-3,
                  finetune_lr=3e-3, lora_rank=0, lora_targets="kept", finetune_trainable="all", kd=1.0, ce=0.0, group_kv=False),
    paper="stage 1: Frobenius norm of Φ_student − Φ_teacher per layer, 80M tokens; stage 2: each block's output on the "
          "teacher's block input, 160M tokens; stage 3: KD of the logits, the whole model, 2.76B tokens (C4, context 2048)",
    scaled="the shares 80:160:2760 of the budget; Φ matching as the squared error per query row (seqmix's Φ loss) rather "
           "than the norm; lrs 3e-3 (this scale's)",
    ablations={"stages_2_3": {"match": "block", "transfer_split": None},
               "stage_3": {"stages": ("finetune",)}},
    claims=[_claim("stage 1 (matrix orientation) lowers the final loss", "mohawk", "mohawk:stages_2_3"),
            _claim("stage 2 (hidden-state alignment) lowers the final loss", "mohawk:stages_2_3", "mohawk:stage_3")],
)

_MIL = Recipe(
    name="mamba_in_llama",
    title="Mamba-2 from the attention weights (q→C, k→B, v→x, o→out) in half the layers, the other half kept as attention; "
          "distilled end to end (0.1·KL + CE), the Mamba layers trained",
    source="Wang et al. 2024, The Mamba in the Llama: Distilling and Accelerating Hybrid Models (NeurIPS), §2-3; "
           "jxiw/MambaInLlama",
    settings=dict(mixer="mamba2", mixer_config={}, layers="uniform:50%", init="attention", stages=("finetune",), match="output",
                  transfer_split=None, transfer_trainable="all", transfer_share=0.0, transfer_lr=3e-3, finetune_lr=3e-3,
                  lora_rank=0, lora_targets="kept", finetune_trainable="students", kd=0.1, ce=1.0, group_kv=False),
    paper="attention kept in the odd layers (50%), every 4th (25%), every 8th (12.5%); distillation 0.1·KL + 1·CE on "
          "the teacher's pseudo-labels, only the Mamba layers trained (lr 8e-5); then SFT and DPO on chat data",
    scaled="the distillation stage on the corpus itself (no pseudo-labels: the teacher's distribution enters through the "
           "KL term); SFT and DPO left out (they need chat data); lr 3e-3; seqmix's init sets the short convolution to "
           "the identity (the paper keeps Mamba-2's random init); one x and B per head (the paper keeps a GQA teacher's kv "
           "heads: group_kv=True)",
    ablations={"random_init": {"init": "random"}, "attention_25": {"layers": "uniform:25%"}, "attention_0": {"layers": "all"}},
    claims=[_claim("the attention init beats a random init", "mamba_in_llama", "mamba_in_llama:random_init"),
            _claim("more attention layers kept lower the loss (50% vs 25%)", "mamba_in_llama", "mamba_in_llama:attention_25"),
            _claim("more attention layers kept lower the loss (25% vs 0%)", "mamba_in_llama:attention_25",
                   "mamba_in_llama:attention_0")],
)

_LIGER = Recipe(
    name="liger",
    title="Liger attention: 0.5 · sliding-window softmax + 0.5 · GLA whose gates are the key projection pooled (no new "
          "parameters); one stage of LoRA fine-tuning",
    source="Lan et al. 2025, Liger: Linearizing Large Language Models to Gated Recurrent Structures (ICML); "
           "OpenSparseLLMs/Linearization",
    settings=dict(mixer="liger_attention", mixer_config={}, layers="all", init="attention", stages=("finetune",),
                  match="output", transfer_split=None, transfer_trainable="all", transfer_share=0.0, transfer_lr=3e-3,
                  finetune_lr=3e-3, lora_rank=8, lora_targets="students", finetune_trainable="lora", kd=0.0, ce=1.0,
                  group_kv=False),
    paper="one stage: next-token CE, LoRA r 8 on q, k, v, lr 1e-3, ≈20M tokens (Alpaca at 1024); window 64",
    scaled="LoRA on the students' q/k/v/o (the paper: q/k/v); lr 3e-3; one k and v per query head (the paper keeps a GQA "
           "teacher's kv heads: group_kv=True)",
    ablations={"gla_only": {"mixer": "liger_gla"}},
    claims=[_claim("Liger attention beats its gated recurrence alone", "liger", "liger:gla_only")],
)

_RADLADS = Recipe(
    name="radlads",
    title="RAD-RWKV7 (RWKV-7 without token shift and bonus, the teacher's RoPE on r and k) from q/k/v/o; step 1 each "
          "attention output matched, step 2 KD of the logits, every weight trained",
    source="Goldstein et al. 2025, RADLADS: Rapid Attention Distillation to Linear Attention Decoders at Scale, §3-4; "
           "recursal/RADLADS-paper",
    settings=dict(mixer="rad_rwkv7", mixer_config={}, layers="all", init="attention", stages=("transfer", "finetune"),
                  match="output", transfer_split=None, transfer_trainable="all", transfer_share=100 / 350, transfer_lr=3e-3,
                  finetune_lr=1e-3, lora_rank=0, lora_targets="kept", finetune_trainable="all", kd=1.0, ce=0.0, group_kv=False),
    paper="step 1: L2 of each attention output (after o_proj) on the teacher's inputs, the attention modules trained, "
          "100M tokens at 512, lr 1e-3 → 1e-5; step 2: KL only, every weight, 250-500M tokens, lr 1e-5; step 3 (optional): "
          "next-token CE at 16k context, 100M tokens",
    scaled="the shares 100:250 (step 3 left out: run `seqmix lm train --init-from-hf OUT` at a longer seq_len after); "
           "squared error instead of the norm; lrs 3e-3 and 1e-3 (the paper's 1e-5 moves a d = 128 model little)",
    ablations={"no_step_1": {"stages": ("finetune",)}, "random_init": {"init": "random"}},
    claims=[_claim("skipping step 1 (attention alignment) is worse", "radlads", "radlads:no_step_1"),
            _claim("a random init of q/k/v/o is worse than the transferred one", "radlads", "radlads:random_init")],
)

#: name -> recipe
RECIPES: dict[str, Recipe] = {r.name: r for r in (_SEQMIX, _LOLCATS, _MOHAWK, _MIL, _LIGER, _RADLADS)}

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


def recipes_markdown() -> str:
    """The recipes as docs/linearize.md's reference: per recipe its title, source, the paper's setting, what
    seqmix scales, its method fields, its ablations and claims (the page's section is this text: a test keeps it so)."""
    def show(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else repr(v)

    out = []
    for r in RECIPES.values():
        fields = ", ".join(f"`{k}={show(v)}`" for k, v in r.settings.items())
        out += [f"### `{r.name}`{' (the default)' if r.name == DEFAULT_RECIPE else ''}", "", f"{r.title}.", "",
                f"* **source**: {r.source}", f"* **the paper**: {r.paper}", f"* **scaled here**: {r.scaled}",
                f"* **fields**: {fields}"]
        if r.ablations:
            out.append("* **ablations**: " + "; ".join(f"`{k}`: " + ", ".join(f"`{f}={show(v)}`" for f, v in a.items())
                                                      for k, a in r.ablations.items()))
        if r.claims:
            out.append("* **claims checked**: " + "; ".join(f"{c.text} (`{c.a}` {'<' if c.check == 'below' else '≤'} `{c.b}`"
                                                           + (f" + {c.value:g}" if c.value else "") + ")" for c in r.claims))
        out.append("")
    return "\n".join(out).rstrip()
