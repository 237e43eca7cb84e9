"""Fine-tuning a converted transformers model with seqmix's one trainer.

The trainer (:class:`seqmix.train.Trainer`) trains a model with the LanguageModel's training
interface: ``scored_logits(input_ids, labels) -> (logits [M, V], targets [M])``,
``state_size(T)``, ``num_params(embeddings=...)``, ``config`` (vocab_size, d_model) and
``blocks[i].mixer`` (the FLOP estimate reads the mixers' state sizes). :class:`HFCausalLM` is
that interface around a converted transformers causal LM: its sequence mixers are seqmix
mixers (trained through their fast modes: S6's selective scan with its hand-written
backward, SSD's chunked form), its embeddings, norms, MLPs and head are transformers' own.

    seqmix lm train --init-from-hf path/to/checkpoint --max-steps 200     # the CLI
    Trainer(config, model_builder=hf_model_builder).fit()                 # config.init_from_hf set

A run that starts from a checkpoint records it in ``RunConfig.init_from_hf`` (part of the run
id); its ``model`` config describes the sizes (mixer, d_model, layers, vocabulary) for the
results tables and the FLOP estimate, and is not what is built. Checkpoints hold the converted
model's state dict (seqmix names inside the mixers); resuming rebuilds the model from the
transformers checkpoint, converts it and loads the run's checkpoint over it. Under torchrun,
``parallel="ddp"`` and ``"fsdp"`` (FSDP2: one unit per transformers decoder layer,
:meth:`HFCausalLM.fsdp_units`, plus the root) apply as to a seqmix model. Not supported (refused with
a ValueError): the LM commands that rebuild a seqmix LanguageModel from the run (lm eval / generate /
export).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from .convert import seqmix_mixers
from .families import FAMILIES
from .load import load_config, load_converted, resolve_source

__all__ = ["HFCausalLM", "hf_model_builder", "hf_model_config", "hf_tokenizer"]


class HFCausalLM(nn.Module):
    """A converted transformers causal LM behind the trainer's model interface (module docstring).

    hf: the converted model (``from_transformers``); config: the run's ModelConfig (sizes)."""

    def __init__(self, hf: nn.Module, config):
        super().__init__()
        self.hf = hf
        self.config = config

    @property
    def blocks(self) -> list:
        """One entry per converted layer with its seqmix ``mixer`` (not registered submodules)."""
        return [SimpleNamespace(mixer=m) for m in seqmix_mixers(self.hf).values()]

    def fsdp_units(self) -> list[nn.Module]:
        """The modules FSDP2 shards one by one (``parallel="fsdp"``): the transformers model's decoder
        layers — every module whose class its ``_no_split_modules`` names (transformers' and accelerate's
        FSDP wrapping rule), found through a peft wrapper too; the converted seqmix mixers live inside them."""
        names: set[str] = set()
        for m in self.hf.modules():
            names.update(getattr(m, "_no_split_modules", None) or ())
        units = [m for m in self.hf.modules() if type(m).__name__ in names]
        if not units:
            raise ValueError(f"parallel fsdp: {type(self.hf).__name__} names no decoder layer class in _no_split_modules "
                             "(transformers' FSDP units): train it with --parallel none or ddp")
        return units

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] (transformers' forward: its head, tying and logit processing)."""
        return self.hf(input_ids=input_ids, use_cache=False).logits

    def scored_logits(self, input_ids: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100):
        """(logits [M, vocab], targets [M]) at the M labelled positions."""
        if labels.shape != input_ids.shape:
            raise ValueError(f"HFCausalLM: 'labels' {list(labels.shape)} must have the shape of 'input_ids' {list(input_ids.shape)}")
        logits = self.forward(input_ids)
        mask = labels != ignore_index
        return logits[mask], labels[mask]

    def state_size(self, seq_len: int | None = None) -> int:
        return int(sum(b.mixer.state_size(seq_len) for b in self.blocks))

    def num_params(self, *, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            emb = self.hf.get_input_embeddings()
            n -= emb.weight.numel() if emb is not None else 0
        return n


def _sizes(cfg) -> tuple[int, int]:
    return int(cfg.hidden_size), int(cfg.num_hidden_layers)


def hf_model_config(source: str) -> dict:
    """The ModelConfig fields that describe the checkpoint ``source`` (its family's seqmix mixer,
    width, layers, vocabulary): what a run that starts from it records as ``model``."""
    cfg = load_config(source, "--init-from-hf")
    d, layers = _sizes(cfg)
    return {"mixer": FAMILIES[cfg.model_type].modules[0].mixer, "d_model": d, "n_layers": layers,
            "vocab_size": int(cfg.vocab_size), "positions": "none"}


def hf_tokenizer(source: str) -> str:
    """The tokenizer a run from ``source`` reads its corpus with: the checkpoint's tokenizer.json
    (a local folder that has one), else "byte" (UTF-8 bytes, ids 0-255)."""
    from pathlib import Path

    src, local = resolve_source(source, "--init-from-hf")
    if local and (Path(src) / "tokenizer.json").is_file():
        return str(Path(src, "tokenizer.json").resolve())
    return "byte"


def hf_model_builder(run_config) -> HFCausalLM:
    """The trainer's model for a run with ``init_from_hf`` set: the checkpoint loaded offline,
    converted (in place) and wrapped (pass as ``Trainer(config, model_builder=hf_model_builder)``)."""
    source = getattr(run_config, "init_from_hf", None)
    if not source:
        raise ValueError("hf_model_builder: the run config has no 'init_from_hf' (a transformers checkpoint folder)")
    conv = load_converted(source, argument="--init-from-hf")
    cfg = conv.config
    d, layers = _sizes(cfg)
    m = run_config.model
    if (m.d_model, m.n_layers, m.vocab_size) != (d, layers, int(cfg.vocab_size)):
        raise ValueError(f"argument --init-from-hf: {source!r} has hidden_size {d}, {layers} layers, vocab_size "
                         f"{cfg.vocab_size}, but the run's model config says d_model {m.d_model}, n_layers {m.n_layers}, "
                         f"vocab_size {m.vocab_size} (the checkpoint changed since the run began?)")
    return HFCausalLM(conv.train(), m)
