"""``linearize(model, mixer, layers, init, **mixer_config)``: a transformers model whose chosen
attention layers are seqmix students, each inside interop's one adapter (``place_mixer``).

    lin = linearize(llama, mixer="gla", layers="all")          # every LlamaAttention -> gla
    lin = linearize(llama, mixer="linear_attention", feature_map="hedgehog", layers=[1, 2, 3])

``layers``: "all", a list of layer indices, or "auto:K" (every layer is linearized here; after
stage 1, :func:`keep_softmax` puts the teacher's attention back in the K layers with the largest
transfer residual: :func:`seqmix.linearize.pipeline.run` does both).
"""

from __future__ import annotations

import copy
import re

from torch import nn

from ..interop import InteropMixer, convert_module, place_mixer, placed_mixers
from ..interop.convert import PLACED
from ..interop.families import FAMILIES
from .init import build_student, teacher_weights
from .recipes import DEFAULT_RECIPE, RECIPES

__all__ = ["linearize", "attention_layers", "parse_layers", "uniform_layers", "keep_softmax", "students", "save"]


def attention_layers(model: nn.Module) -> dict[int, str]:
    """{layer index: module path} of the attention modules of ``model`` that seqmix converts to
    softmax attention (the teachers a student can replace)."""
    cfg = getattr(model, "config", None)
    family = FAMILIES.get(getattr(cfg, "model_type", None))
    if family is None or not isinstance(model, nn.Module):
        raise ValueError(f"linearize: argument 'model' must be a transformers model of a family seqmix converts "
                         f"({', '.join(sorted(FAMILIES))}), got {type(model).__name__} "
                         f"({getattr(cfg, 'model_type', None)!r})")
    attn = {m.module for m in family.modules if m.mixer == "softmax_attention"}
    out = {}
    for path, module in model.named_modules():
        name = f"{type(module).__module__}.{type(module).__qualname__}"
        adapter = isinstance(module, InteropMixer) and (path in placed_mixers(model) or module.mixer.registry_name == "softmax_attention")
        if name in attn or adapter:
            found = re.search(r"(?:^|\.)layers\.(\d+)\.", path + ".")
            if found:
                out[int(found.group(1))] = path
    if not out:
        raise ValueError(f"linearize: argument 'model' ({type(model).__name__}, {family.model_type}) has no attention layer "
                         "seqmix converts to softmax attention (no teacher for a student)")
    return dict(sorted(out.items()))


def uniform_layers(n_layers: int, K: int) -> list[int]:
    """The K layers of ``n_layers`` kept as softmax by even spacing: the last layer of each of K equal groups, as
    Mamba-in-the-Llama keeps its attention layers (n 32, K 16: the odd layers 1, 3, ..., 31; K 4: 7, 15, 23, 31;
    n 4, K 1: [3])."""
    return sorted({-(-(i + 1) * n_layers // K) - 1 for i in range(K)})


def parse_layers(layers, n_layers: int) -> tuple[list[int], int | None]:
    """(the layers to linearize, K of "auto:K" or None). ``layers``: "all"; "auto:K" (every layer here;
    the pipeline keeps K softmax layers after stage 1); "uniform:K" or "uniform:P%" (K, or P% of the
    layers rounded, kept as softmax, evenly spaced: :func:`uniform_layers`); a list of indices or a
    comma-separated string of them; every index in 0 .. n_layers - 1."""
    if isinstance(layers, str):
        s = layers.strip()
        if s == "all":
            return list(range(n_layers)), None
        for kind in ("auto:", "uniform:"):
            if not s.startswith(kind):
                continue
            spec = s[len(kind):]
            try:
                K = round(float(spec[:-1]) / 100 * n_layers) if kind == "uniform:" and spec.endswith("%") else int(spec)
            except ValueError:
                K = -1
            if not 0 <= K < n_layers:
                raise ValueError(f"linearize: argument 'layers' = {layers!r}: {kind}K keeps K softmax layers, "
                                 f"0 <= K < {n_layers} (the model's attention layers; uniform:P% takes P% of them)")
            if kind == "auto:":
                return list(range(n_layers)), K
            kept = uniform_layers(n_layers, K) if K else []
            return [i for i in range(n_layers) if i not in kept], None
        try:
            layers = [int(v) for v in s.replace(",", " ").split()]
        except ValueError:
            raise ValueError(f"linearize: argument 'layers' must be 'all', 'auto:K', 'uniform:K' or layer indices, "
                             f"got {layers!r}") from None
    try:
        idx = sorted({int(i) for i in layers})
    except (TypeError, ValueError):
        raise ValueError(f"linearize: argument 'layers' must be 'all', 'auto:K', 'uniform:K' or layer indices, got {layers!r}") from None
    if not idx or idx[0] < 0 or idx[-1] >= n_layers:
        raise ValueError(f"linearize: argument 'layers' = {layers!r} is out of range: the model has {n_layers} attention "
                         f"layers (indices 0 .. {n_layers - 1})")
    return idx, None


def linearize(model: nn.Module, mixer: str = "gla", layers="all", init: str = "attention", *, inplace: bool = False,
              group_kv: bool | None = None, **mixer_config) -> nn.Module:
    """The transformers ``model`` with the attention of ``layers`` replaced by the seqmix ``mixer``
    (module docstring), each student inside :class:`~seqmix.interop.InteropMixer`; the other layers
    stay transformers' own. ``init="attention"``: q/k/v/o copied by the init table
    (:mod:`seqmix.linearize.init`); ``"random"``: the student's own init; ``"random_hf"``: its own init
    with every Linear weight drawn as transformers draws the host model's (normal(0,
    ``config.initializer_range``): what a from-scratch run of the same architecture as one transformers
    model would start from). ``mixer_config``: the
    student's config fields (e.g. ``feature_map="hedgehog"``, ``window=64``). ``group_kv``: a teacher with
    grouped-query attention keeps its kv heads in the students (k and v rows tied per group:
    :func:`seqmix.linearize.init.build_student`); None: the default recipe's (``seqmix.linearize.recipes``, as
    ``seqmix linearize`` runs it: on). A copy unless ``inplace``. ``model.seqmix_linearize`` records the call (``auto`` holds K of "auto:K")."""
    if group_kv is None:
        group_kv = RECIPES[DEFAULT_RECIPE].settings["group_kv"]
    elif not isinstance(group_kv, bool):
        raise ValueError(f"linearize: argument 'group_kv' must be True, False or None (the default recipe's), got {group_kv!r}")
    paths = attention_layers(model)
    idx, auto = parse_layers(layers, len(paths))
    order = list(paths)  # layer indices of the attention modules, in order
    out = model if inplace else copy.deepcopy(model)
    for i in idx:
        layer = order[i]
        path = paths[layer]
        module = out.get_submodule(path)
        if isinstance(module, InteropMixer) and path in placed_mixers(out):
            raise ValueError(f"linearize: argument 'layers': layer {layer} ({path}) already holds a seqmix "
                             f"{module.mixer.registry_name!r} student")
        attention = module.mixer if isinstance(module, InteropMixer) else convert_module(module, out.config, path=path).mixer
        teacher = teacher_weights(attention)
        student = build_student(mixer, teacher, init=init, init_std=float(getattr(out.config, "initializer_range", 0.02)),
                                group_kv=group_kv, **mixer_config)
        place_mixer(out, path, student)
    out.seqmix_linearize = {"mixer": mixer, "layers": [order[i] for i in idx], "init": init, "auto": auto,
                            "mixer_config": dict(mixer_config),
                            "group_kv": bool(group_kv)}
    return out


def students(model: nn.Module) -> dict[int, InteropMixer]:
    """{layer index: adapter} of the students placed in ``model`` (placed mixers other than softmax
    attention: a teacher layer recorded by :func:`save` is not a student)."""
    out = {}
    for path, rec in placed_mixers(model).items():
        if rec["mixer"] == "softmax_attention":
            continue
        found = re.search(r"(?:^|\.)layers\.(\d+)\.", path + ".")
        out[int(found.group(1))] = model.get_submodule(path)
    return dict(sorted(out.items()))


def keep_softmax(model: nn.Module, teacher: nn.Module, layers) -> nn.Module:
    """Puts the teacher's own attention module back in ``layers`` of the linearized ``model`` (in
    place; a copy of the teacher's module), removing those students and their records."""
    rec = dict(placed_mixers(model))
    tpaths = attention_layers(teacher)
    for layer in layers:
        path = tpaths[layer]
        if path not in rec:
            raise ValueError(f"keep_softmax: argument 'layers': layer {layer} holds no student")
        module = copy.deepcopy(teacher.get_submodule(path))
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, name, module)
        del rec[path]
    setattr(model.config, PLACED, rec)
    return model


def save(model: nn.Module, folder) -> None:
    """``model.save_pretrained(folder)`` of a linearized model, loadable by
    :func:`seqmix.interop.load_converted`. A layer that holds a converted teacher attention (a model
    that came from ``load_converted``: its weights under seqmix's names) is recorded as placed first, so
    that loading reads those weights rather than the transformers names it no longer has."""
    from pathlib import Path

    placed = placed_mixers(model)
    for path, m in list(model.named_modules()):
        if isinstance(m, InteropMixer) and path not in placed:
            place_mixer(model, path, m.mixer)
    Path(folder).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
