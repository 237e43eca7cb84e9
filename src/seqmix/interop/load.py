"""Real checkpoints in, offline: a local folder or a hub id already in the local Hugging Face
cache, loaded, checked and converted; and the text it reads, tokenized as it was trained.

    model = load_converted("path/to/mamba-130m")      # or "state-spaces/mamba-130m-hf" when cached
    ids, note = tokenize("path/to/mamba-130m", "To be, or not to be", vocab_size=model.config.vocab_size)

``load_converted`` reads a transformers checkpoint of a family seqmix converts and converts it, and
reads back every folder a converted model is saved to (``save_pretrained`` of a ``from_transformers``,
``place_mixer`` or ``seqmix.linearize`` model: model type ``seqmix_converted``, saved.py; and folders
that carry the family's model type with a ``seqmix_placed`` record), its mixers' weights included:
every weight the folder holds is read, and every weight the model needs comes from the folder, or it
is a ValueError. Nothing is ever downloaded (``local_files_only=True`` everywhere): a hub id that is
not in the cache is a ValueError that says how to download it. Used by `seqmix show --hf`,
`seqmix generate`, `seqmix lm train --init-from-hf` and seqmix.linearize (docs/interop.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .adapter import InteropMixer
from .convert import PLACED, from_transformers, placed_mixers
from .families import FAMILIES
from .saved import MODEL_TYPE, SeqmixConvertedConfig

__all__ = ["resolve_source", "load_config", "load_transformers", "load_converted", "describe", "tokenize", "parse_ids",
           "has_tokenizer", "SeqmixConvertedForCausalLM"]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _download_hint(source: str) -> str:
    return (f"download it first with `hf download {source}` (or `huggingface-cli download {source}`), "
            "or pass a local folder")


def resolve_source(source, argument: str = "--hf") -> tuple[str, bool]:
    """(source, is_local_folder): a local folder (it must hold config.json) or a hub id. ``source``: a str or
    an os.PathLike (pathlib.Path)."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
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


def _saved_config(source, argument: str):
    """transformers' config of ``source`` as saved (offline): a family's config, or a :class:`SeqmixConvertedConfig`."""
    from transformers import AutoConfig

    src, local = resolve_source(source, argument)
    try:
        return AutoConfig.from_pretrained(src, local_files_only=True)
    except (OSError, ValueError) as e:
        if local:
            raise ValueError(f"argument '{argument}': {src!r}: transformers cannot read its config.json "
                             f"({str(e).splitlines()[0][:160]})") from None
        raise ValueError(f"argument '{argument}': {src!r} is not a local folder and is not in the local Hugging Face "
                         f"cache (nothing is downloaded): {_download_hint(src)}") from None


def load_config(source, argument: str = "--hf"):
    """transformers' config of ``source`` (offline), checked to be a family seqmix converts: the family's
    own config object also for a saved converted model (model type ``seqmix_converted``)."""
    cfg = _saved_config(source, argument)
    src, _ = resolve_source(source, argument)
    if isinstance(cfg, SeqmixConvertedConfig):
        cfg = cfg.family_config(argument)
    if cfg.model_type not in FAMILIES:
        raise ValueError(f"argument '{argument}': {src!r} is a {cfg.model_type!r} model "
                         f"({', '.join(getattr(cfg, 'architectures', None) or ['?'])}): an unsupported family; seqmix "
                         f"converts: {', '.join(sorted(FAMILIES))}")
    return cfg


def _from_pretrained(source, cfg, dtype: torch.dtype, argument: str, quiet: bool):
    """(the transformers model of ``source`` with config ``cfg``, transformers' loading info), offline, eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per command, not a bar per checkpoint shard
    src, local = resolve_source(source, argument)
    level = hf_logging.get_verbosity()
    try:
        if quiet:  # the slots' missing / unexpected weights are checked by load_converted, not reported here
            hf_logging.set_verbosity_error()
        model, info = AutoModelForCausalLM.from_pretrained(src, config=cfg, local_files_only=True, dtype=dtype,
                                                           output_loading_info=True)
    except (OSError, ValueError) as e:
        where = "" if local else f"; {_download_hint(src)}"
        raise ValueError(f"argument '{argument}': {src!r}: the weights cannot be loaded offline "
                         f"({str(e).splitlines()[0][:160]}){where}") from None
    finally:
        hf_logging.set_verbosity(level)
    return model.eval(), info


def load_transformers(source, *, dtype: torch.dtype = torch.float32, argument: str = "--hf"):
    """The transformers causal LM of ``source`` (offline, ``dtype``, eval mode), before conversion."""
    cfg = load_config(source, argument)
    return _from_pretrained(source, cfg, dtype, argument, quiet=bool(getattr(cfg, PLACED, None)))[0]


def load_converted(path, *, dtype: torch.dtype = torch.float32, mode: str | None = None, argument: str = "path"):
    """The converted model of ``path`` (a str or pathlib.Path: a local folder, or a hub id in the local Hugging
    Face cache): a transformers checkpoint of a supported family, converted in place (nothing copied), or a
    folder a converted model was saved to, read back exactly (its seqmix mixers and their weights). ``dtype``:
    the weights' dtype; ``mode``: as ``from_transformers(mode=...)``. A ValueError names ``argument`` for a
    folder that is not such a model, or whose weights do not fill it."""
    saved = _saved_config(path, argument)
    cfg = load_config(path, argument)
    seqmix_folder = isinstance(saved, SeqmixConvertedConfig) or bool(getattr(cfg, PLACED, None))
    model, info = _from_pretrained(path, cfg, dtype, argument, quiet=seqmix_folder)
    src = resolve_source(path, argument)[0]
    try:
        conv = from_transformers(model, inplace=True, mode=mode)
    except ValueError as e:
        raise ValueError(f"argument '{argument}': {src!r}: {e}") from None
    _load_mixers(conv, src, info, argument, strict=seqmix_folder)
    return conv


def describe(model) -> str:
    """One line: the converted model's class and size, and for a model with placed mixers (a linearized model) which
    mixers sit in how many of its layers: "LlamaForCausalLM, 25.2M parameters, linearized: lolcats in 8 layers"
    (the teacher's attention kept in a layer is not counted)."""
    n = sum(p.numel() for p in model.parameters())
    head = f"{type(model).__name__}, {n / 1e6:.1f}M parameters"
    counts: dict[str, int] = {}
    for rec in placed_mixers(model).values():
        if rec["mixer"] != "softmax_attention":
            counts[rec["mixer"]] = counts.get(rec["mixer"], 0) + 1
    if not counts:
        return f"{head}, converted"
    return f"{head}, linearized: " + ", ".join(f"{m} in {c} layer{'s' if c > 1 else ''}" for m, c in counts.items())


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


def _load_mixers(model, source: str, info: dict, argument: str, *, strict: bool) -> None:
    """The weights of the converted mixers of ``model`` saved under seqmix's names (``<slot>.mixer.<name>``:
    what ``save_pretrained`` of a converted model writes), read from the folder's safetensors into each mixer
    whose slot has them, and required for each placed mixer (``config.seqmix_placed``) and each slot whose
    transformers weights the folder lacks. ``strict`` (a folder seqmix wrote): every weight transformers
    found missing or unexpected must be such a slot's, so nothing in the folder is dropped and nothing in
    the model is left at its random init."""
    from safetensors import safe_open

    folder = Path(source)
    files = _weight_files(folder) if folder.is_dir() else []
    slots = {path: m.mixer for path, m in model.named_modules() if isinstance(m, InteropMixer)}
    placed = placed_mixers(model)

    def slot_of(key: str) -> str | None:
        return next((p for p in slots if key.startswith(p + ".")), None)

    missing = set(info.get("missing_keys") or ()) if info else set()
    unexpected = set(info.get("unexpected_keys") or ()) if info else set()
    if strict:
        stray = sorted(k for k in missing if slot_of(k) is None)
        stray += sorted(k for k in unexpected if slot_of(k) is None or not k.startswith(slot_of(k) + ".mixer."))
        if stray:
            raise ValueError(f"argument '{argument}': {source!r}: weight(s) {', '.join(repr(k) for k in stray[:3])}"
                             f"{' ...' if len(stray) > 3 else ''} of the folder do not match the converted "
                             f"{type(model).__name__} (missing from the folder or not read by the model)")
    found: dict[str, dict[str, torch.Tensor]] = {p: {} for p in slots}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                p = slot_of(key)
                if p is not None and key.startswith(p + ".mixer."):
                    found[p][key[len(p) + 7:]] = fh.get_tensor(key)
    for path, mixer in slots.items():
        need = path in placed or bool(found[path]) or any(slot_of(k) == path for k in missing)
        if not need:
            continue  # converted from the transformers weights the folder holds
        absent = sorted(set(mixer.state_dict()) - set(found[path]))
        extra = sorted(set(found[path]) - set(mixer.state_dict()))
        if extra:
            raise ValueError(f"argument '{argument}': {source!r} holds weight(s) "
                             f"{', '.join(repr(f'{path}.mixer.{m}') for m in extra[:3])} that the seqmix "
                             f"{mixer.registry_name!r} at {path} does not have (saved by another mixer config?)")
        if absent:
            pre = f"{path}.mixer."
            why = f"records a seqmix {mixer.registry_name!r} at {path} ({PLACED})" if path in placed else \
                f"lacks transformers' weights of {path} (a saved {MODEL_TYPE} model)"
            raise ValueError(f"argument '{argument}': {source!r} {why} but its weight files lack "
                             f"{', '.join(repr(pre + m) for m in absent[:3])}{' ...' if len(absent) > 3 else ''} "
                             "(save it with model.save_pretrained(folder))")
        ref = next(iter(mixer.state_dict().values()), None)
        mixer.load_state_dict({k: v.to(ref.dtype if ref is not None and v.is_floating_point() else v.dtype)
                               for k, v in found[path].items()}, strict=True)


# ------------------------------------------------------------------------------------------
# AutoModelForCausalLM of a saved converted model (model type "seqmix_converted", saved.py)
# ------------------------------------------------------------------------------------------


class SeqmixConvertedForCausalLM:
    """The entry ``AutoModelForCausalLM`` dispatches a :data:`MODEL_TYPE` folder to. It is never built:
    :meth:`from_pretrained` returns ``seqmix.interop.load_converted(folder)``, a model of the family's own
    class holding the seqmix mixers."""

    config_class = SeqmixConvertedConfig

    #: keywords AutoModelForCausalLM adds to every call (read by it, not by a loader)
    _AUTO_KWARGS = frozenset({"_from_auto", "trust_remote_code", "adapter_kwargs", "config", "local_files_only", "revision",
                              "cache_dir", "force_download", "token", "subfolder", "proxies", "code_revision"})

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, dtype: Any = None, torch_dtype: Any = None,
                        device_map: Any = None, **kwargs):
        """``load_converted(folder, dtype=dtype)``, moved to ``device_map`` (a device) when given. dtype: a torch
        dtype, its name, or "auto" / None (float32, as ``load_converted``)."""
        where = "AutoModelForCausalLM.from_pretrained"
        other = sorted(k for k, v in kwargs.items() if k not in cls._AUTO_KWARGS and v is not None)
        if model_args or other:
            raise ValueError(f"{where}: a seqmix converted model ({MODEL_TYPE}) is loaded by seqmix.interop.load_converted, "
                             f"which takes no argument(s) {', '.join(repr(k) for k in other) or 'positional'}")
        dtype = dtype if dtype is not None else torch_dtype
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        model = load_converted(os.fspath(pretrained_model_name_or_path),
                               dtype=dtype if isinstance(dtype, torch.dtype) else torch.float32)
        if isinstance(device_map, (str, torch.device)) and str(device_map) != "auto":
            model = model.to(device_map)
        return model


def _register() -> None:
    """AutoModelForCausalLM dispatches a :data:`MODEL_TYPE` folder to :class:`SeqmixConvertedForCausalLM` (done on
    ``import seqmix.interop``)."""
    from transformers import AutoModelForCausalLM

    try:
        AutoModelForCausalLM.register(SeqmixConvertedConfig, SeqmixConvertedForCausalLM)
    except ValueError:  # already registered
        pass


_register()
