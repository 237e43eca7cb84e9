"""Tiny language models over the whole registry (every mixer, every layer pattern), for the
generation and HuggingFace tests: 2 layers, d_model 16, a 29-token vocabulary."""

import torch

import seqmix
from seqmix.models import ModelConfig, build_model, list_patterns

VOCAB = 29
MAX_LEN = 32


def _kwargs(mixer: str) -> dict:
    kw = dict(seqmix.mixers.base.mixer_entry(mixer).example_config())
    kw.pop("d_model", None)
    return kw


PATTERN_KWARGS = {"mamba_swa": {"window": 4, "d_state": 4, "chunk_size": 8}, "mamba_only": {"d_state": 4, "chunk_size": 8},
                  "attention_only": {"heads": 2}, "bmojo": _kwargs("bmojo"), "bmojo_f": _kwargs("bmojo_f")}

#: test ids: every registered mixer, then "pattern:<name>" for every registered layer pattern
CASES = [e.name for e in seqmix.list_mixers()] + [f"pattern:{p.name}" for p in list_patterns()]


def tiny_config(case: str, **overrides) -> ModelConfig:
    base = dict(d_model=16, n_layers=2, vocab_size=VOCAB, max_seq_len=MAX_LEN, init_std=0.3)
    if case.startswith("pattern:"):
        name = case.split(":", 1)[1]
        base.update(pattern=name, pattern_kwargs=PATTERN_KWARGS.get(name, {}))
    else:
        base.update(mixer=case, mixer_kwargs=_kwargs(case))
    base.update(overrides)
    return ModelConfig(**base)


def tiny_model(case: str, dtype=torch.float64, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(tiny_config(case, **overrides)).to(dtype).eval()
