"""AdamW parameter groups and the learning-rate schedule.

Weight decay (0.1 in every protocol) is not applied to (docs/harness.md, "For mixer
developers"):

* biases: any parameter whose name ends in ``bias``;
* norms: every parameter of a module that is a LayerNorm / GroupNorm / RMSNorm or whose
  class name ends in ``Norm``;
* SSM dynamics by name: a parameter whose last name component is one of
  :data:`NO_DECAY_NAMES` (``A``, ``A_log``, ``D``, ``dt_bias``, ``A_real``, ``A_imag``, …);
* anything a mixer marks: a tensor attribute ``_no_weight_decay = True`` (mamba_ssm's
  convention) or a module attribute ``no_weight_decay``, an iterable of parameter names
  relative to that module (dotted names allowed).

Everything else, embeddings included (Zoology decays every parameter; the exemptions are
the DSF paper's and Mamba's practice), is decayed.
"""

from __future__ import annotations

import math

from torch import nn

#: last name components exempt from weight decay (SSM dynamics and skip terms)
NO_DECAY_NAMES = frozenset({"A", "A_log", "D", "dt_bias", "A_real", "A_imag", "A_re", "A_im", "log_A_real", "Lambda_log"})
_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.RMSNorm) if hasattr(nn, "RMSNorm") else (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d)


def no_decay_names(model: nn.Module) -> set[str]:
    """Full names of the parameters exempt from weight decay (module docstring)."""
    out: set[str] = set()
    for mname, m in model.named_modules():
        pre = f"{mname}." if mname else ""
        is_norm = isinstance(m, _NORMS) or type(m).__name__.endswith("Norm")
        for pname, p in m.named_parameters(recurse=False):
            if is_norm or pname.endswith("bias") or pname in NO_DECAY_NAMES or getattr(p, "_no_weight_decay", False):
                out.add(pre + pname)
        for rel in getattr(m, "no_weight_decay", ()) or ():
            out.add(pre + rel)
    return out


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: decayed and not decayed (each parameter once, tied ones once)."""
    skip = no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # named_parameters dedups tied parameters
        if not p.requires_grad:
            continue
        (no_decay if name in skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def lr_at(step: int, *, total: int, lr: float, warmup: float, min_lr: float = 0.0, schedule: str = "cosine") -> float:
    """Learning rate before optimizer step ``step`` (0-based) of ``total``: linear warmup over
    the first ``warmup``·total steps (from lr/warmup_steps up to lr), then cosine decay to
    ``min_lr``·lr at the last step (or constant)."""
    w = int(math.ceil(warmup * total))
    if step < w:
        return lr * (step + 1) / w
    if schedule == "constant":
        return lr
    span = max(1, total - w)
    t = min(1.0, (step - w) / span)
    return lr * (min_lr + (1 - min_lr) * 0.5 * (1 + math.cos(math.pi * t)))
