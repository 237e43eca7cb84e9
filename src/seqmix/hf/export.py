"""A seqmix run folder -> a HuggingFace folder (``seqmix lm export --hf DIR``).

    run/checkpoint.pt, run/config.json   the trainer's (analysis.trained.load_run reads them)
    run/tokenizer.json                   the run's tokenizer (seqmix.data.text.load_tokenizer)
        ->
    DIR/config.json, DIR/model.safetensors, DIR/generation_config.json   (SeqmixForCausalLM)
    DIR/tokenizer.json, DIR/tokenizer_config.json                        (PreTrainedTokenizerFast)

after which ``AutoModelForCausalLM.from_pretrained(DIR)`` and ``pipeline("text-generation",
model=DIR)`` work (after ``import seqmix.hf``, which registers the model type "seqmix").
"""

from __future__ import annotations

from pathlib import Path

from .modeling import SeqmixForCausalLM

TOKENIZER = "tokenizer.json"


def export_hf(run, out_dir, *, runs="runs", tokenizer_path=None) -> Path:
    """Writes the HF folder (module docstring). ``run``: a run folder or run id under ``runs``;
    ``tokenizer_path`` defaults to the run's tokenizer.json; a run without one (a synthetic
    task) is exported without a tokenizer."""
    from .._checks import output_dir
    from ..analysis.trained import find_run_dir, load_run
    from .tokenizer import to_hf_tokenizer

    out = Path(out_dir).expanduser()
    if any(q.exists() and not q.is_dir() for q in (out, *out.parents)):
        output_dir(out, "--hf")  # a file in the way: one line before anything is read (nothing is created)
    run_dir = find_run_dir(run, runs)
    _, model = load_run(run_dir)
    tok_path = Path(tokenizer_path) if tokenizer_path is not None else run_dir / TOKENIZER
    if tokenizer_path is not None and not tok_path.is_file():
        raise ValueError(f"export: argument 'tokenizer_path' = {str(tok_path)!r} is not a file")
    tok = None
    if tok_path.is_file():
        from ..data.text import load_tokenizer

        tok = to_hf_tokenizer(load_tokenizer(tok_path))
        if len(tok) > model.config.vocab_size:
            raise ValueError(f"export: the tokenizer has {len(tok)} tokens, more than the model's vocab_size "
                             f"{model.config.vocab_size}")
    out = output_dir(out, "--hf")  # created once the run and its tokenizer are known good
    SeqmixForCausalLM.wrap(model).save_pretrained(out)
    if tok is not None:
        tok.save_pretrained(out)
    return out


__all__ = ["export_hf"]
