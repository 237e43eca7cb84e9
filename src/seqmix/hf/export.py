"""A seqmix run directory -> a HuggingFace folder (``seqmix lm export --hf DIR``).

    run_dir/checkpoint.pt   {"config": RunConfig JSON, "model": state dict, ...}  (the trainer's)
    run_dir/tokenizer.json  the run's tokenizer (seqmix.data.text.load_tokenizer reads it)
        ->
    DIR/config.json, DIR/model.safetensors, DIR/generation_config.json   (SeqmixForCausalLM)
    DIR/tokenizer.json, DIR/tokenizer_config.json                        (PreTrainedTokenizerFast)

after which ``AutoModelForCausalLM.from_pretrained(DIR)`` and ``pipeline("text-generation",
model=DIR)`` work (with ``import seqmix.hf`` first, which registers the model type).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..models import LanguageModel
from .modeling import SeqmixForCausalLM, model_config_from_dict

CHECKPOINT = "checkpoint.pt"
TOKENIZER = "tokenizer.json"


def load_run(run_dir) -> tuple[LanguageModel, dict]:
    """(the trained LanguageModel, the run's config dict) from a run directory's checkpoint."""
    run_dir = Path(run_dir)
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"export: argument 'run_dir' = {str(run_dir)!r} holds no {CHECKPOINT} (expected the directory "
                         "of a `seqmix lm train` run)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001  an older checkpoint with Python objects in it
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or "config" not in ckpt or "model" not in ckpt:
        raise ValueError(f"export: {str(path)!r} is not a seqmix checkpoint (expected the keys 'config' and 'model')")
    run = ckpt["config"]
    run = json.loads(run) if isinstance(run, str) else dict(run)
    if "model" not in run:
        raise ValueError(f"export: the config in {str(path)!r} has no 'model' field (a RunConfig was expected)")
    model = LanguageModel(model_config_from_dict(run["model"], where=f"export ({path})"))
    load_state(model, ckpt["model"], str(path))
    return model.eval(), run


def load_state(model: torch.nn.Module, state: dict, where: str) -> None:
    """load_state_dict with a ValueError naming missing / unexpected keys and bad shapes."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{where}: the state dict does not match the model of its config: missing keys {missing[:8]}, "
                         f"unexpected keys {unexpected[:8]}")
    bad = [k for k in own if tuple(own[k].shape) != tuple(state[k].shape)]
    if bad:
        raise ValueError(f"{where}: shape mismatch for {bad[:8]}")
    model.load_state_dict(state, strict=True)


def export_hf(run_dir, out_dir, *, tokenizer_path=None) -> Path:
    """Writes the HF folder (module docstring). ``tokenizer_path`` defaults to the run's
    tokenizer.json; without one the folder has no tokenizer (a note says so)."""
    from .tokenizer import to_hf_tokenizer

    model, run = load_run(run_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = SeqmixForCausalLM.wrap(model)
    tok_path = Path(tokenizer_path) if tokenizer_path is not None else Path(run_dir) / TOKENIZER
    if tokenizer_path is not None and not tok_path.is_file():
        raise ValueError(f"export: argument 'tokenizer_path' = {str(tok_path)!r} is not a file")
    if tok_path.is_file():
        from ..data.text import load_tokenizer

        tok = to_hf_tokenizer(load_tokenizer(tok_path))
        if tok.vocab_size > model.config.vocab_size:
            raise ValueError(f"export: the tokenizer has {tok.vocab_size} tokens, the model's vocab_size is "
                             f"{model.config.vocab_size}")
        tok.save_pretrained(out)
    hf.save_pretrained(out)
    return out


__all__ = ["export_hf", "load_run", "load_state"]
