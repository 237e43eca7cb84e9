"""The one converter: a transformers model in, the same model class out with every
sequence-mixing module replaced by an :class:`~seqmix.interop.adapter.InteropMixer` holding a
seqmix mixer with the original's weights (read from the family's tables)."""

from __future__ import annotations

import copy
import re

import torch
from torch import nn

from ..mixers.base import Mixer, build_mixer
from ..mixers.layers import group_rows, grouped_rows
from .adapter import InteropMixer
from .families import FAMILIES
from .saved import tag_config
from .table import Family, ModuleMap, State, Unsupported

_WHERE = "from_transformers"


def supported_families() -> dict[str, str]:
    """{config.model_type: description} of every family ``from_transformers`` converts."""
    return {k: f.description for k, f in FAMILIES.items()}


def from_transformers(model: nn.Module, *, inplace: bool = False, mode: str | None = None) -> nn.Module:
    """Converts a transformers model of a supported family (``supported_families()``).

    Returns a model of the same class in which every sequence-mixing module is an
    :class:`InteropMixer` holding a seqmix mixer with the original's weights; embeddings,
    norms, MLPs and heads are transformers' own (shared with the original when ``inplace``,
    copied otherwise). The original is unchanged unless ``inplace=True`` (which converts it in
    place and returns it: no copy of a large checkpoint). ``mode``: the mode the converted mixers
    run full sequences in ("auto" by default; e.g. "chunk" to train through the chunked form): set
    on every mixer of a class that has it; a mixer of a class with one mode only (RWKV's channel-mix,
    whose token shift runs one way) keeps it. Decoding with a cache always runs the mixers' own step mode.
    The converted model's config saves under the model type "seqmix_converted" (seqmix.interop.saved): a
    folder it is saved to loads back exactly with :func:`seqmix.interop.load_converted` (or, seqmix
    imported, ``AutoModelForCausalLM.from_pretrained``) and is refused by transformers alone.

    Raises ValueError (naming the module path and the option) for an unsupported family or
    module, a config option the seqmix mixer cannot express, a quantized model, or weights on
    the meta device; the model is left untouched then, even with ``inplace=True``.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"{_WHERE}: argument 'model' must be a transformers model (torch.nn.Module), got {type(model).__name__}")
    family = _family(model)
    _check_not_quantized(model)
    targets, kept = _targets(model, family)
    placed = placed_mixers(model)
    adapters = {}
    for path, module, mm in targets:
        if path in placed:  # a mixer placed in this slot (place_mixer): rebuilt from its record, weights as built
            rec = placed[path]
            adapter = _placed_adapter(path, module, mm, group_rows(build_mixer(rec["mixer"], **rec["config"]), rec.get("grouped")))
        else:
            adapter = _convert(path, module, mm, model.config)
        adapters[path] = (module, adapter)
    if mode is not None:
        _set_mode(adapters, mode)
    _share_tied(adapters)
    if inplace:
        out = model
        for path, (_, adapter) in adapters.items():
            parent, _, name = path.rpartition(".")
            setattr(out.get_submodule(parent) if parent else out, name, adapter)
    else:  # copy everything but the replaced modules (deepcopy's memo maps each to its adapter)
        out = copy.deepcopy(model, memo={id(module): adapter for module, adapter in adapters.values()})
    if kept or family.keeps:  # the mixers the family leaves as transformers' own (e.g. Kimi-Linear's MLA): `seqmix show --hf`
        out.seqmix_kept = dict(kept)
    tag_config(out)  # save_pretrained writes model type "seqmix_converted" (saved.py): load_converted reads it back
    return out


def _set_mode(adapters: dict, mode: str) -> None:
    """``from_transformers(mode=...)``: the mode on every converted mixer, except those whose class runs one
    mode only (which keep it); a mixer of several modes without this one is an error naming its module."""
    for path, (_, adapter) in adapters.items():
        if len(adapter.mixer.modes) == 1 and mode not in adapter.mixer.modes:
            continue
        try:
            adapter.mixer.mode = mode
        except ValueError as e:
            raise ValueError(f"{_WHERE}: argument 'mode' for module {path}: {e}") from None


def convert_module(module: nn.Module, hf_config, *, path: str = "module") -> InteropMixer:
    """One transformers module of a class some family converts (e.g. a ``LlamaAttention`` or a
    ``RecurrentGemmaRecurrentBlock`` built on its own) -> its :class:`InteropMixer`, by the same
    adapter config and weight table as :func:`from_transformers` (mixer-level comparisons and tests).
    ``adapter.mixer`` is the seqmix mixer."""
    for family in FAMILIES.values():
        mm = family.module_map(module)
        if mm is not None:
            return _convert(path, module, mm, hf_config)
    raise ValueError(f"convert_module: module {path} ({type(module).__module__}.{type(module).__qualname__}) is not a class any "
                     f"family converts ({', '.join(sorted(FAMILIES))})")


#: the config attribute recording the mixers placed in a model's slots ({module path: {"mixer", "config"}})
PLACED = "seqmix_placed"


def placed_mixers(model: nn.Module) -> dict[str, dict]:
    """{module path: {"mixer": registry name, "config": its config[, "grouped": {projection: segments}]}} of the
    mixers :func:`place_mixer` put in ``model`` (recorded in ``model.config``, so a saved folder keeps them; "grouped":
    the mixer's :class:`~seqmix.mixers.layers.GroupedRows`, rebuilt before its weights load); {} when none."""
    rec = getattr(getattr(model, "config", None), PLACED, None) or {}
    if not isinstance(rec, dict) or not all(isinstance(v, dict) and {"mixer", "config"} <= set(v) for v in rec.values()):
        raise ValueError(f"from_transformers: the config's {PLACED!r} must map module paths to {{'mixer', 'config'}}, got {rec!r}")
    return rec


def place_mixer(model: nn.Module, path: str, mixer: Mixer) -> InteropMixer:
    """Puts the seqmix ``mixer`` (any registered mixer, its weights as they are) in the place of the
    module at ``path`` of ``model`` (in place), behind the one adapter with the call options of the
    module class it replaces (a class the model's family converts). The decoding state: a softmax
    attention mixer in an attention slot keeps its KV cache there (the ``kv`` kind, as a converted
    attention); any other mixer in an attention slot keeps its whole recurrent state on that slot's
    cache layer (the ``layer`` kind: constant memory per token). The placement is recorded in
    ``model.config.seqmix_placed``, so that :func:`from_transformers` of a model saved with it (and
    :func:`seqmix.interop.load_converted` of its folder) rebuilds the same mixer there.
    Returns the adapter."""
    family = _family(model)
    try:
        module = model.get_submodule(path)
    except AttributeError:
        raise ValueError(f"place_mixer: argument 'path': {type(model).__name__} has no module {path!r}") from None
    source = module
    if isinstance(module, InteropMixer):
        mm = next((m for m in family.modules if m.class_name == module.source), None)
    else:
        mm = family.module_map(module)
    if mm is None:
        raise ValueError(f"place_mixer: argument 'path': module {path} ({type(source).__name__}) is not a class family "
                         f"{family.model_type!r} converts ({', '.join(m.class_name for m in family.modules)})")
    adapter = _placed_adapter(path, source, mm, mixer)
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, adapter)
    rec = dict(placed_mixers(model))
    rec[path] = {"mixer": mixer.registry_name, "config": mixer.config.model_dump(mode="json")}
    if grouped_rows(mixer):  # projections with rows tied per group (a student that keeps its teacher's kv heads)
        rec[path]["grouped"] = grouped_rows(mixer)
    setattr(model.config, PLACED, rec)
    tag_config(model)
    return adapter


def _placed_adapter(path: str, module: nn.Module, mm: ModuleMap, mixer: Mixer) -> InteropMixer:
    """The adapter of a placed mixer (module: the transformers module or the adapter it replaces)."""
    kinds = {row.kind for row in mm.state}
    if kinds != {"kv"}:
        raise ValueError(f"place_mixer: module {path} ({mm.class_name}) is not an attention slot: a mixer is placed in the "
                         "place of an attention module (whose decoding state is a KV cache)")
    attention = mixer.registry_name == mm.mixer
    state = mm.state if attention else (State("state", "layer"),)
    if isinstance(module, InteropMixer):
        layer_idx, training = module.layer_idx, module.training
    else:
        layer_idx, training = mm.layer_index(module), module.training
        ref = next((p for p in module.parameters() if p.is_floating_point()), None)
        if ref is not None:
            mixer.to(device=ref.device, dtype=ref.dtype)
    adapter = InteropMixer(mixer, layer_idx=layer_idx, state=state, where=path, source=mm.class_name,
                           returns_state=mm.returns_state, returns_pair=mm.returns_pair, mask=mm.mask,
                           positions=mm.positions, layer_arg=mm.layer_arg)
    adapter.train(training)
    return adapter


def seqmix_mixers(model: nn.Module) -> dict[str, Mixer]:
    """{module path: seqmix Mixer} of a converted model (paths of the replaced modules)."""
    out = {path: m.mixer for path, m in model.named_modules() if isinstance(m, InteropMixer)}
    if not out:
        raise ValueError(f"seqmix_mixers: {type(model).__name__} has no converted mixer: convert it with from_transformers(model)")
    return out


# ------------------------------------------------------------------------------------------
# checks
# ------------------------------------------------------------------------------------------


def _family(model) -> Family:
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"{_WHERE}: unsupported family {model_type!r} ({type(model).__name__}); seqmix converts: {known}")
    return FAMILIES[model_type]


def _check_not_quantized(model) -> None:
    qc = getattr(model.config, "quantization_config", None)
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False) is True or qc is not None:
        method = getattr(qc, "quant_method", None) or (qc.get("quant_method") if isinstance(qc, dict) else None)
        raise ValueError(f"{_WHERE}: {type(model).__name__} is quantized (option 'quantization_config', quant_method = "
                         f"{method!r}): seqmix converts floating-point weights only; load the model unquantized")


def _targets(model, family: Family) -> tuple[list[tuple[str, nn.Module, ModuleMap]], dict[str, str]]:
    slot = re.compile(family.slots)
    out, kept = [], {}
    for path, module in model.named_modules():
        mm = family.module_map(module)
        name = f"{type(module).__module__}.{type(module).__qualname__}"
        if mm is not None:
            out.append((path, module, mm))
        elif slot.search(path) and name in family.keeps:
            kept[path] = type(module).__name__
        elif slot.search(path) and name in family.not_mixers:
            continue
        elif slot.search(path):
            if isinstance(module, InteropMixer) and path in placed_mixers(model):
                continue  # a placed mixer already in place (place_mixer): kept as it is
            if isinstance(module, InteropMixer):
                raise ValueError(f"{_WHERE}: module {path} is already converted (an InteropMixer holding seqmix "
                                 f"{module.mixer.registry_name!r})")
            known = ", ".join(m.class_name for m in family.modules)
            raise ValueError(f"{_WHERE}: module {path} ({type(module).__module__}.{type(module).__qualname__}) is not a "
                             f"sequence mixer seqmix converts for family {family.model_type!r} (it converts: {known})")
    if not out:
        raise ValueError(f"{_WHERE}: {type(model).__name__} ({family.model_type}) has no sequence-mixing module to convert")
    return out, kept


def _share_tied(adapters: dict) -> None:
    """Modules that hold the same parameter objects (transformers ties them: Zamba2's shared attention
    block is one module per use, its weights tied across the uses) are converted once per use, and the
    mixers of the later uses are given the first one's parameters (the same nn.Parameter objects): the
    converted model keeps one copy of the shared weights, and training updates it once. Each use keeps
    its own decoding state (its own cache layer). Modules sharing some of their weights but not all are
    refused (each use's mixer would hold a copy of the shared ones)."""
    first, owner = {}, {}
    for path, (module, adapter) in adapters.items():
        key = tuple(id(p) for p in module.parameters())
        if not key:
            continue
        if key in first:
            src = first[key].mixer
            for name, _ in list(adapter.mixer.named_parameters()):
                parent, _, leaf = name.rpartition(".")
                setattr(adapter.mixer.get_submodule(parent) if parent else adapter.mixer, leaf, src.get_parameter(name))
            continue
        first[key] = adapter
        for i in key:
            if i in owner:
                raise ValueError(f"{_WHERE}: modules {owner[i]} and {path} share some of their weights but not all: "
                                 "seqmix converts a module once per use and shares whole mixers only")
            owner[i] = path


def _check_weights(path: str, module: nn.Module) -> None:
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if t.device.type == "meta":
            raise ValueError(f"{_WHERE}: module {path}: weight {name!r} is on the meta device (not loaded): load the model "
                             "with its weights (e.g. from_pretrained without device_map='meta' / init_empty_weights)")
        if not (t.is_floating_point() or t.is_complex()):
            raise ValueError(f"{_WHERE}: module {path}: weight {name!r} has dtype {t.dtype} (quantized?): seqmix converts "
                             "floating-point weights only")


# ------------------------------------------------------------------------------------------
# one module
# ------------------------------------------------------------------------------------------


def _convert(path: str, module: nn.Module, mm: ModuleMap, hf_config) -> InteropMixer:
    cls = type(module).__name__
    _check_weights(path, module)
    try:
        cfg = mm.config(hf_config, module)
    except Unsupported as e:
        raise ValueError(f"{_WHERE}: module {path} ({cls}): {e}") from None
    try:
        with torch.no_grad():
            mixer = build_mixer(mm.mixer, **cfg)
    except ValueError as e:
        raise ValueError(f"{_WHERE}: module {path} ({cls}) does not map to seqmix {mm.mixer!r}: {e}") from None
    ref = next((p for p in module.parameters() if p.is_floating_point()), None)
    if ref is not None:
        mixer.to(device=ref.device, dtype=ref.dtype)
    weights, grads = _mapped_weights(path, module, mm, mixer)
    mixer.load_state_dict(weights, strict=True)
    for name, p in mixer.named_parameters():
        p.requires_grad_(grads.get(name, True))
    layer_idx = mm.layer_index(module)
    if layer_idx is None:  # a module that does not know its index (RecurrentGemma's recurrent block): layers.N. in its path
        found = re.search(r"(?:^|\.)layers\.(\d+)\.", path + ".")
        layer_idx = int(found.group(1)) if found else None
    adapter = InteropMixer(mixer, layer_idx=layer_idx, state=mm.state, where=path, source=cls,
                           returns_state=mm.returns_state, aliases=mm.aliases, returns_pair=mm.returns_pair, mask=mm.mask,
                           positions=mm.positions, layer_arg=mm.layer_arg, residual=mm.residual, derived_args=mm.derived_args)
    adapter.train(module.training)
    return adapter


def _mapped_weights(path: str, module: nn.Module, mm: ModuleMap, mixer: Mixer):
    """The mixer's state dict from the module's, by the weight table (and each parameter's requires_grad)."""
    src = module.state_dict(keep_vars=True)  # parameters and persistent buffers
    dst = mixer.state_dict()
    out, grads, used = {}, {}, set()
    parts: dict[str, dict[int, torch.Tensor]] = {}  # rows with ``part``: row blocks stacked into one seqmix tensor
    for row in mm.weight_rows(module):
        if row.seqmix is None:  # derived: recomputed by the mixer from its config (checked by the adapter config)
            if row.hf in src:
                used.add(row.hf)
            continue
        has_src, has_dst = row.hf in src, row.seqmix in dst
        if not has_src and not has_dst:
            continue
        if has_src != has_dst:
            only = f"only the transformers module has {row.hf!r}" if has_src else f"only the seqmix mixer has {row.seqmix!r}"
            raise ValueError(f"{_WHERE}: module {path}: weight table row {row.hf!r} -> {row.seqmix!r}: {only} "
                             "(a config option, e.g. a bias, did not map)")
        t = src[row.hf]
        v = t.detach()
        v = row.transform(v) if row.transform is not None else v
        if row.part is not None:
            parts.setdefault(row.seqmix, {})[row.part] = v
            if isinstance(t, nn.Parameter):
                grads[row.seqmix] = grads.get(row.seqmix, True) and t.requires_grad
            used.add(row.hf)
            continue
        if tuple(v.shape) != tuple(dst[row.seqmix].shape):
            how = f" after {row.transform}" if row.transform is not None else ""
            raise ValueError(f"{_WHERE}: module {path}: weight {row.hf!r} has shape {list(v.shape)}{how}, seqmix's "
                             f"{row.seqmix!r} has {list(dst[row.seqmix].shape)}")
        out[row.seqmix] = v
        if isinstance(t, nn.Parameter):
            grads[row.seqmix] = t.requires_grad
        used.add(row.hf)
    for name, blocks in parts.items():
        if sorted(blocks) != list(range(len(blocks))):
            raise ValueError(f"{_WHERE}: module {path}: the weight table fills row blocks {sorted(blocks)} of seqmix's {name!r} "
                             f"(expected 0..{len(blocks) - 1})")
        v = torch.cat([blocks[i] for i in range(len(blocks))], dim=0)
        if tuple(v.shape) != tuple(dst[name].shape):
            raise ValueError(f"{_WHERE}: module {path}: the {len(blocks)} row blocks of seqmix's {name!r} stack to shape "
                             f"{list(v.shape)}, seqmix's has {list(dst[name].shape)}")
        out[name] = v
    unread = sorted(set(src) - used)
    if unread:
        raise ValueError(f"{_WHERE}: module {path}: weight(s) {', '.join(repr(n) for n in unread)} have no row in the weight "
                         f"table of {type(module).__name__}: the converted model would ignore them")
    unfilled = sorted(set(dst) - set(out))
    if unfilled:
        raise ValueError(f"{_WHERE}: module {path}: seqmix {mm.mixer!r} entries {', '.join(repr(n) for n in unfilled)} are "
                         "not filled by the weight table")
    return out, grads
