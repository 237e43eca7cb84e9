"""Stage 2, fine-tuning a linearized model through seqmix's one Trainer.

The model is the linearized transformers model behind the trainer's model interface
(:class:`~seqmix.interop.train.HFCausalLM`), trained on the LM data (token windows of a corpus,
any seqmix tokenizer or the teacher's own tokenizer.json) by :class:`seqmix.train.Trainer`, so
precision, checkpoints, resume, evaluation and the results store are the trainer's. The loss is

    ce · CE(next token) + kd · KL(teacher ‖ student)

(Hinton et al.'s distillation at temperature 1, over the labelled positions; the KD term through the
trainer's ``auxiliary_loss`` hook, the CE weight through its ``ce_weight``; evaluation reports the
next-token loss alone). What trains:

* ``lora_rank`` = r > 0: LoRA (Hu et al. 2022, the ``peft`` library) of rank r on ``lora_targets``:
  "kept" — every Linear the model keeps from its teacher (the MLPs, the softmax layers kept);
  "students" — the students' projections the init table filled from q/k/v/o (LoLCATs' and Liger's
  LoRA on the attention projections); "all" — both. The wrapped weights are frozen.
* ``trainable``, the weights trained besides the adapters: "all" (every weight LoRA does not wrap:
  without LoRA, full fine-tuning), "students" (the students' weights), "lora" (none).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..mixers.layers import GroupedRows
from ..interop.load import load_converted
from ..interop.train import HFCausalLM
from .api import students

__all__ = ["LinearizedLM", "lora", "set_trainable", "finetune_builder", "merged", "LORA_TARGETS", "TRAINABLE"]


class LinearizedLM(HFCausalLM):
    """A linearized model for the trainer (:class:`HFCausalLM`) with the KD term.

    teacher: the frozen teacher model (kept outside the module tree: not trained, not in checkpoints);
    kd: the weight of KL(teacher ‖ student) in the training loss (0: none); ce: the weight of the
    next-token cross-entropy (the trainer reads it as ``ce_weight``)."""

    def __init__(self, hf: nn.Module, config, *, teacher: nn.Module | None = None, kd: float = 0.0, ce: float = 1.0):
        super().__init__(hf, config)
        if kd < 0:
            raise ValueError(f"linearize: argument 'kd' must be >= 0, got {kd}")
        if ce < 0:
            raise ValueError(f"linearize: argument 'ce' must be >= 0, got {ce}")
        if kd > 0 and teacher is None:
            raise ValueError("linearize: argument 'kd' > 0 needs the teacher model")
        self._teacher = [teacher.eval().requires_grad_(False)] if teacher is not None else []
        self.kd = float(kd)
        self.ce_weight = float(ce)
        self._aux = None

    def scored_logits(self, input_ids: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100):
        logits, target = super().scored_logits(input_ids, labels, ignore_index)
        self._aux = None
        if self.training and self.kd > 0:
            teacher = self._teacher[0]
            if next(teacher.parameters()).device != input_ids.device:
                teacher.to(input_ids.device)
            with torch.no_grad():
                t_logits = teacher(input_ids=input_ids, use_cache=False).logits[labels != ignore_index]
            self._aux = self.kd * F.kl_div(F.log_softmax(logits.float(), -1), F.log_softmax(t_logits.float(), -1),
                                           log_target=True, reduction="batchmean")
        return logits, target

    def auxiliary_loss(self):
        """The KD term of the last training forward (the trainer adds it to the loss), or None."""
        aux, self._aux = self._aux, None
        return aux


def _kept_linears(model: nn.Module) -> list[str]:
    """Paths of the nn.Linear modules outside the students: the MLPs and the attention layers kept as
    softmax; the LM head is left as it is (tied to the embedding in small models)."""
    inside = tuple(adapter.where + "." for adapter in students(model).values())
    head = model.get_output_embeddings()
    return [path for path, m in model.named_modules()
            if isinstance(m, nn.Linear) and not path.startswith(inside) and m is not head]


def _student_projections(model: nn.Module) -> list[str]:
    """Paths of the students' nn.Linear projections that the init table fills from the teacher's q/k/v/o
    (W_q, W_k, W_v, W_o; W_qk; Mamba-2's in_proj and out_proj): the attention projections a LoRA on
    "students" adapts."""
    from .init import student_init

    out = []
    for adapter in students(model).values():
        entry = student_init(adapter.mixer.registry_name)
        names = dict.fromkeys(r.student.rsplit(".", 1)[0] for r in entry.rows if r.teacher in ("q", "k", "v", "o"))
        for name in names:
            m = adapter.mixer.get_submodule(name)
            if isinstance(m, GroupedRows):  # k, v kept at the kv heads: the LoRA adapts the stored rows (tied per group)
                out.append(f"{adapter.where}.mixer.{name}.proj")
            elif isinstance(m, nn.Linear):
                out.append(f"{adapter.where}.mixer.{name}")
    return out


LORA_TARGETS = ("kept", "students", "all")
TRAINABLE = ("all", "students", "lora")


def lora(model: nn.Module, rank: int, *, targets: str = "kept", trainable: str = "students", alpha: float | None = None,
         dropout: float = 0.0) -> nn.Module:
    """``model`` (a linearized transformers model) with peft's LoRA of rank ``rank`` on ``targets``
    ("kept": every Linear it keeps from its teacher; "students": the students' q/k/v/o projections;
    "all": both), those weights frozen, and the ``trainable`` set (module docstring: "all",
    "students", "lora") trained beside the adapters. Returns peft's model (``merged`` folds it back)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("linearize: argument 'lora_rank' needs the peft library: pip install 'seqmix[linearize]' "
                         "(or pass lora_rank=0 / --full for full fine-tuning)") from None
    if rank < 1:
        raise ValueError(f"linearize: argument 'lora_rank' must be >= 1, got {rank}")
    if targets not in LORA_TARGETS:
        raise ValueError(f"linearize: argument 'lora_targets' must be one of {', '.join(LORA_TARGETS)}, got {targets!r}")
    if trainable not in TRAINABLE:
        raise ValueError(f"linearize: argument 'trainable' must be one of {', '.join(TRAINABLE)}, got {trainable!r}")
    paths = (_kept_linears(model) if targets in ("kept", "all") else []) + \
        (_student_projections(model) if targets in ("students", "all") else [])
    if not paths:
        raise ValueError(f"linearize: argument 'lora_targets' = {targets!r}: the model has no such Linear layer to adapt")
    cfg = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, lora_dropout=dropout,
                     target_modules="^(" + "|".join(re.escape(t) for t in paths) + ")$", bias="none")
    with warnings.catch_warnings():  # peft (0.21) reads transformers' deprecated alias is_gradient_checkpointing, whose
        # FutureWarning would reach every user of linearize; only that warning is silenced, for this call
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        peft_model = get_peft_model(model, cfg)  # freezes every weight but the adapters
    if trainable != "lora":
        scope = [a.mixer for a in students(model).values()] if trainable == "students" else [model]
        for module in scope:
            for name, p in module.named_parameters():
                if "lora_" not in name and "base_layer." not in name:  # (the wrapped weights stay frozen)
                    p.requires_grad_(True)
    return peft_model


def set_trainable(model: nn.Module, trainable: str) -> nn.Module:
    """Full fine-tuning's trainable set (no LoRA): every weight ("all") or the students' alone ("students")."""
    if trainable == "lora":
        raise ValueError("linearize: argument 'trainable' = 'lora' needs lora_rank > 0")
    if trainable not in TRAINABLE:
        raise ValueError(f"linearize: argument 'trainable' must be one of {', '.join(TRAINABLE)}, got {trainable!r}")
    model.requires_grad_(trainable == "all")
    for adapter in students(model).values():
        adapter.mixer.requires_grad_(True)
    return model


def merged(model: nn.Module) -> nn.Module:
    """The transformers model of a peft model with its LoRA folded into the weights (itself otherwise)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def finetune_builder(source: str | Path, *, teacher: nn.Module | None, kd: float, lora_rank: int, ce: float = 1.0,
                     lora_targets: str = "kept", trainable: str | None = None):
    """The trainer's ``model_builder``: the stage-1 folder ``source`` loaded (``load_converted``),
    LoRA applied (``lora_rank`` > 0) or the trainable set chosen, and wrapped in :class:`LinearizedLM`.
    ``trainable`` None: "students" with LoRA, "all" without."""
    trainable = trainable or ("students" if lora_rank else "all")

    def build(run_config) -> LinearizedLM:
        model = load_converted(source, argument="--hf")
        model.train()
        model = lora(model, lora_rank, targets=lora_targets, trainable=trainable) if lora_rank else set_trainable(model, trainable)
        return LinearizedLM(model, run_config.model, teacher=teacher, kd=kd, ce=ce)

    return build
