"""Stage 2, fine-tuning a linearized model through seqmix's one Trainer.

The model is the linearized transformers model behind the trainer's model interface
(:class:`~seqmix.interop.train.HFCausalLM`), trained on the LM data (token windows of a corpus,
any seqmix tokenizer or the teacher's own tokenizer.json) by :class:`seqmix.train.Trainer`, so
precision, checkpoints, resume, evaluation and the results store are the trainer's. Two options:

* ``kd`` > 0: the loss adds kd · KL(teacher ‖ student) over the labelled positions (the teacher's
  next-token distribution, Hinton et al.'s distillation at temperature 1), through the trainer's
  ``auxiliary_loss`` hook; evaluation reports the next-token loss alone.
* ``lora_rank`` = r > 0: LoRA (Hu et al. 2022, the ``peft`` library) of rank r on every Linear the
  model keeps from its teacher (the MLPs, the softmax layers kept), those weights frozen; the
  students train in full. ``lora_rank=0``: full fine-tuning of every weight.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..interop.load import load_converted
from ..interop.train import HFCausalLM
from .api import students

__all__ = ["LinearizedLM", "lora", "finetune_builder", "merged"]


class LinearizedLM(HFCausalLM):
    """A linearized model for the trainer (:class:`HFCausalLM`) with the KD term.

    teacher: the frozen teacher model (kept outside the module tree: not trained, not in checkpoints);
    kd: the weight of KL(teacher ‖ student) in the training loss (0: none)."""

    def __init__(self, hf: nn.Module, config, *, teacher: nn.Module | None = None, kd: float = 0.0):
        super().__init__(hf, config)
        if kd < 0:
            raise ValueError(f"linearize: argument 'kd' must be >= 0, got {kd}")
        if kd > 0 and teacher is None:
            raise ValueError("linearize: argument 'kd' > 0 needs the teacher model")
        self._teacher = [teacher.eval().requires_grad_(False)] if teacher is not None else []
        self.kd = float(kd)
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
    """Paths of the nn.Linear modules outside the students (what LoRA adapts): the MLPs and the
    attention layers kept as softmax; the LM head is left as it is (tied to the embedding in small models)."""
    inside = tuple(adapter.where + "." for adapter in students(model).values())
    head = model.get_output_embeddings()
    return [path for path, m in model.named_modules()
            if isinstance(m, nn.Linear) and not path.startswith(inside) and m is not head]


def lora(model: nn.Module, rank: int, *, alpha: float | None = None, dropout: float = 0.0) -> nn.Module:
    """``model`` (a linearized transformers model) with peft's LoRA of rank ``rank`` on every Linear it
    keeps from its teacher, those weights frozen, the students' parameters trainable. Returns peft's
    model (``merged`` folds it back)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ValueError("linearize: argument 'lora_rank' needs the peft library: pip install 'seqmix[linearize]' "
                         "(or pass lora_rank=0 / --full for full fine-tuning)") from None
    if rank < 1:
        raise ValueError(f"linearize: argument 'lora_rank' must be >= 1, got {rank}")
    targets = _kept_linears(model)
    if not targets:
        raise ValueError("linearize: argument 'lora_rank': the model keeps no Linear layer from its teacher to adapt")
    cfg = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else 2 * rank, lora_dropout=dropout,
                     target_modules="^(" + "|".join(re.escape(t) for t in targets) + ")$", bias="none")
    peft_model = get_peft_model(model, cfg)
    for adapter in students(model).values():
        for p in adapter.mixer.parameters():
            p.requires_grad_(True)
    return peft_model


def merged(model: nn.Module) -> nn.Module:
    """The transformers model of a peft model with its LoRA folded into the weights (itself otherwise)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def finetune_builder(source: str | Path, *, teacher: nn.Module | None, kd: float, lora_rank: int):
    """The trainer's ``model_builder``: the stage-1 folder ``source`` loaded (``load_converted``),
    LoRA applied (``lora_rank`` > 0) and wrapped in :class:`LinearizedLM`."""

    def build(run_config) -> LinearizedLM:
        model = load_converted(source, argument="--hf")
        model.train()
        if lora_rank:
            model = lora(model, lora_rank)
        return LinearizedLM(model, run_config.model, teacher=teacher, kd=kd)

    return build
