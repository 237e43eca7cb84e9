"""Real checkpoints in, offline: a local folder or a hub id already in the local Hugging Face
cache, loaded, checked and converted; and the text it reads, tokenized as it was trained.

    model, what = load_converted("path/to/mamba-130m")      # or "state-spaces/mamba-130m-hf" when cached
    ids, note = tokenize("path/to/mamba-130m", "To be, or not to be", vocab_size=model.config.vocab_size)

Nothing is ever downloaded (``local_files_only=True`` everywhere): a hub id that is not in the
cache is a ValueError that says how to download it. Used by `seqmix show --hf` and
`seqmix lm train --init-from-hf` (docs/interop.md).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .convert import PLACED, from_transformers, placed_mixers
from .families import FAMILIES

__all__ = ["resolve_source", "load_config", "load_transformers", "load_converted", "tokenize", "parse_ids", "has_tokenizer"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _download_hint(source: str) -> str:
    return (f"download it first with `hf download {source}` (or `huggingface-cli download {source}`), "
            "or pass a local folder")


def resolve_source(source: str, argument: str = "--hf") -> tuple[str, bool]:
    """(source, is_local_folder): a local folder (it must hold config.json) or a hub id."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"argument '{argument}' must be a local folder or a hub id, got {source!r}")
    p = Path(source).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"argument '{argument}': {str(p)!r} is a folder without config.json (not a transformers "
                             "checkpoint: save one with model.save_pretrained(folder))")
        return str(p), True
    if p.exists():
        raise ValueError(f"argument '{argument}': {str(p)!r} is a file; give the checkpoint's folder")
    if source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ValueError(f"argument '{argument}': no such folder {source!r}")
    return source, False


def load_config(source: str, argument: str = "--hf"):
    """transformers' config of ``source`` (offline), checked to be a family seqmix converts."""
    from transformers import AutoConfig

    src, local = resolve_source(source, argument)
    try:
        cfg = AutoConfig.from_pretrained(src, local_files_only=True)
    except (OSError, ValueError) as e:
        if local:
            raise ValueError(f"argument '{argument}': {src!r}: transformers cannot read its config.json "
                             f"({str(e).splitlines()[0][:160]})") from None
        raise ValueError(f"argument '{argument}': {src!r} is not a local folder and is not in the local Hugging Face "
                         f"cache (nothing is downloaded): {_download_hint(src)}") from None
    if cfg.model_type not in FAMILIES:
        raise ValueError(f"argument '{argument}': {src!r} is a {cfg.model_type!r} model "
                         f"({', '.join(getattr(cfg, 'architectures', None) or ['?'])}): an unsupported family; seqmix "
                         f"converts: {', '.join(sorted(FAMILIES))}")
    return cfg


def load_transformers(source: str, *, dtype: torch.dtype = torch.float32, argument: str = "--hf"):
    """The transformers causal LM of ``source`` (offline, ``dtype``, eval mode)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per command, not a bar per checkpoint shard

    cfg = load_config(source, argument)
    src, local = resolve_source(source, argument)
    quiet = bool(getattr(cfg, PLACED, None))  # placed mixers' slots: their weights are read by load_converted, not here
    level = hf_logging.get_verbosity()
    try:
        if quiet:
            hf_logging.set_verbosity_error()
        model = AutoModelForCausalLM.from_pretrained(src, config=cfg, local_files_only=True, dtype=dtype)
    except (OSError, ValueError) as e:
        where = "" if local else f"; {_download_hint(src)}"
        raise ValueError(f"argument '{argument}': {src!r}: the weights cannot be loaded offline "
                         f"({str(e).splitlines()[0][:160]}){where}") from None
    finally:
        hf_logging.set_verbosity(level)
    return model.eval()


def load_converted(source: str, *, dtype: torch.dtype = torch.float32, mode: str | None = None, argument: str = "--hf"):
    """(the converted model — converted in place, nothing copied —, a one-line description)."""
    model = load_transformers(source, dtype=dtype, argument=argument)
    try:
        conv = from_transformers(model, inplace=True, mode=mode)
    except ValueError as e:
        raise ValueError(f"argument '{argument}': {source!r}: {e}") from None
    if placed_mixers(conv):
        _load_placed(conv, resolve_source(source, argument)[0], argument)
    n = sum(p.numel() for p in conv.parameters())
    return conv, f"{type(conv).__name__}, {n / 1e6:.1f}M parameters, converted"


def has_tokenizer(source: str) -> bool:
    """Whether a local folder holds tokenizer files (a hub id: whether AutoTokenizer finds them cached)."""
    src, local = resolve_source(source)
    if local:
        return any((Path(src) / f).is_file() for f in _TOKENIZER_FILES)
    return True


def parse_ids(spec: str, argument: str = "--ids") -> torch.Tensor:
    """"1,2,3" (or spaces) -> LongTensor [T]."""
    try:
        ids = [int(v) for v in str(spec).replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"argument '{argument}': expected token ids separated by commas, such as 1,17,42; got {spec!r}") from None
    if not ids or min(ids) < 0:
        raise ValueError(f"argument '{argument}': expected non-negative token ids, got {spec!r}")
    return torch.tensor(ids, dtype=torch.long)


def tokenize(source: str, text: str | None = None, *, ids: str | None = None, vocab_size: int, seq_len: int | None = None,
             argument: str = "--hf") -> tuple[torch.Tensor, str]:
    """(token ids [T], how they were made) for the model of ``source``: ``ids`` when given, else
    ``text`` through the checkpoint's own tokenizer (AutoTokenizer, offline), else — no tokenizer
    there — its UTF-8 bytes (ids 0-255), said in the note. Cut to ``seq_len``; every id must be
    below ``vocab_size``."""
    if ids is not None:
        toks, how = parse_ids(ids), "token ids given"
    else:
        if not isinstance(text, str) or not text:
            raise ValueError("argument '--text': give a non-empty text (or --ids)")
        tok = None
        if has_tokenizer(source):
            from transformers import AutoTokenizer

            src, _ = resolve_source(source, argument)
            try:
                tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
            except (OSError, ValueError, TypeError):
                tok = None
        if tok is not None:
            toks = torch.tensor(tok.encode(text), dtype=torch.long)
            how = f"{type(tok).__name__} of the checkpoint"
        else:
            toks = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
            how = "UTF-8 bytes (the checkpoint has no tokenizer: ids 0-255 are the bytes)"
    if seq_len is not None:
        toks = toks[:seq_len]
    if toks.numel() == 0:
        raise ValueError(f"argument '--text': the text gives no tokens for {source!r}")
    if int(toks.max()) >= vocab_size:
        raise ValueError(f"argument '{'--ids' if ids is not None else '--text'}': token id {int(toks.max())} is outside the "
                         f"vocabulary of {source!r} (vocab_size = {vocab_size}) ({how})")
    return toks, f"{int(toks.numel())} tokens, {how}"


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a saved checkpoint (one file, or the shards its index names)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        import json

        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    return [folder / "model.safetensors"] if (folder / "model.safetensors").is_file() else []


def _load_placed(model, source: str, argument: str) -> None:
    """The weights of the mixers placed in ``model`` (``config.seqmix_placed``), read from the folder's
    safetensors under ``<module path>.mixer.<name>`` (what ``save_pretrained`` of the model with them wrote)."""
    from safetensors import safe_open

    folder = Path(source)
    files = _weight_files(folder) if folder.is_dir() else []
    placed = placed_mixers(model)
    want = {f"{path}.mixer.": model.get_submodule(path).mixer for path in placed}
    found: dict[str, dict[str, torch.Tensor]] = {p: {} for p in want}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                pre = next((p for p in want if key.startswith(p)), None)
                if pre is not None:
                    found[pre][key[len(pre):]] = fh.get_tensor(key)
    for pre, mixer in want.items():
        missing = sorted(set(mixer.state_dict()) - set(found[pre]))
        if missing:
            raise ValueError(f"argument '{argument}': {source!r} records a seqmix {mixer.registry_name!r} at {pre[:-7]} "
                             f"({PLACED}) but its weight files lack {', '.join(repr(pre + m) for m in missing[:3])}"
                             f"{' ...' if len(missing) > 3 else ''} (save it with model.save_pretrained(folder))")
        ref = next(iter(mixer.state_dict().values()), None)
        mixer.load_state_dict({k: v.to(ref.dtype if ref is not None and v.is_floating_point() else v.dtype)
                               for k, v in found[pre].items()}, strict=True)
