"""The maps of trained models: a harness run's mixers, seen where they sit in the model.

    from seqmix.analysis.trained import load_run, model_views, write_run_maps
    config, model = load_run("3f2a9c", runs="runs/main")      # a run id (or a unique prefix)
    views = model_views(model, tokens)                          # first and last layer
    write_run_maps(run_dir, config, model)                      # maps.png + maps.json

A mixer inside a trained model does not see embedded random tokens: it sees the residual
stream after the block's norm. :func:`layer_inputs` records exactly that input for every
block (a forward pre-hook on each mixer), and :func:`model_views` hands it to
:func:`seqmix.analysis.show.inspect_mixer`, so the map drawn is the map the trained layer
applies to that example. The reference map P of the numbers is, as in `seqmix show`, a
randomly initialized softmax attention (seed 0) on the same layer input.

The trainer calls :func:`write_run_maps` after a finished run when it is given it
(``Trainer(..., write_maps=write_run_maps)``, as the CLI and the presets' sweeps do: the first
test example of the run's data; the first and the last layer), and `seqmix results --maps` lists the files;
`seqmix show --run RUN_ID` draws them again (PNG or --html) with any show option.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .show import DEFAULT_MAX_MAP_BYTES, MixerView, figure_png, inspect_mixer, show_figure, softmax_reference

__all__ = ["MAPS_PNG", "MAPS_JSON", "find_run_dir", "load_run", "layer_inputs", "model_views", "write_run_maps", "run_example"]

MAPS_PNG = "maps.png"
MAPS_JSON = "maps.json"


def find_run_dir(run: str | Path, runs: str | Path = "runs") -> Path:
    """The folder of a harness run: ``run`` is a run folder, or a run id / unique id prefix
    under ``runs`` (a sweep's --out: its runs live in ``<runs>/runs/<run_id>``)."""
    p = Path(run)
    if (p / "config.json").exists() or (p / "checkpoint.pt").exists():
        return p
    base = Path(runs)
    base = base / "runs" if (base / "runs").is_dir() else base
    if not base.is_dir():
        raise ValueError(f"argument 'run': {str(run)!r} is not a run folder, and there is no runs folder at {str(base)!r} "
                         "(pass --runs, the --out of the sweep)")
    hits = sorted(d for d in base.iterdir() if d.is_dir() and d.name.startswith(str(run)))
    if not hits:
        raise ValueError(f"argument 'run': no run id starting with {str(run)!r} in {str(base)!r} ({len(list(base.iterdir()))} runs there)")
    if len(hits) > 1:
        raise ValueError(f"argument 'run': {str(run)!r} is the prefix of {len(hits)} run ids in {str(base)!r} "
                         f"({', '.join(h.name for h in hits[:5])}{', …' if len(hits) > 5 else ''}); give more characters")
    return hits[0]


def load_run(run: str | Path, runs: str | Path = "runs"):
    """(RunConfig, LanguageModel in eval mode with the run's last checkpoint) of a finished or
    stopped harness run (:func:`find_run_dir`)."""
    import pydantic

    from ..mixers.base import config_error
    from ..models import LanguageModel
    from ..train.checkpoint import CHECKPOINT, read_checkpoint
    from ..train.config import RunConfig, load_run_config

    d = find_run_dir(run, runs)
    ckpt = d / CHECKPOINT
    if not ckpt.exists():
        raise ValueError(f"argument 'run': {str(d)!r} has no {CHECKPOINT} (the run has not finished an epoch)")
    try:  # weights_only: a foreign run folder runs no code
        blob = read_checkpoint(ckpt, map_location="cpu", keys=("model",))
    except ValueError as e:
        raise ValueError(f"argument 'run': {e}") from None
    if (d / "config.json").exists():  # corrupt, or not a seqmix RunConfig: one line naming the run
        config = load_run_config(d / "config.json", "run")
    elif "config" in blob:
        try:
            config = RunConfig(**blob["config"])
        except pydantic.ValidationError as e:
            raise config_error(f"argument 'run': {str(ckpt)!r}", e) from None
        except TypeError:
            raise ValueError(f"argument 'run': {str(ckpt)!r} holds no RunConfig (not a seqmix run)") from None
    else:
        raise ValueError(f"argument 'run': {str(d)!r} has no config.json (the run has not finished; its config is in the "
                         "results store of its sweep)")
    if getattr(config, "init_from_hf", None):  # a converted transformers model, not a LanguageModel (seqmix.interop.train)
        raise ValueError(f"argument 'run': run {d.name} started from the transformers checkpoint {config.init_from_hf!r} "
                         "(--init-from-hf): lm eval, lm generate, lm export and show --run rebuild a seqmix LanguageModel "
                         "and do not support such runs")
    model = LanguageModel(config.model)  # RunConfig filled vocab_size and max_seq_len from the data
    from ..models.lm import load_state_checked

    load_state_checked(model, blob["model"], f"argument 'run': {str(ckpt)!r}")
    return config, model.eval()


def run_example(config, index: int = 0) -> torch.Tensor:
    """Token ids [T] of example ``index`` of the run's test split."""
    from ..data import build_data

    _, test = build_data(config.data)
    for b in test.batches(shuffle=False):
        if index < b.inputs.shape[0]:
            return b.inputs[index].long()
        index -= b.inputs.shape[0]
    raise ValueError(f"argument 'index': the test split has fewer than {index + 1} examples")


def layer_inputs(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The input x [1, T, d] of every block's mixer when ``model`` reads ``tokens`` [T]."""
    seen: list[torch.Tensor] = []
    hooks = [b.mixer.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(args[0].detach()), with_kwargs=True)
             for b in model.blocks]
    try:
        with torch.no_grad():
            model.hidden(tokens.reshape(1, -1))
    finally:
        for h in hooks:
            h.remove()
    return seen


def _layer_indices(layers, n: int) -> list[int]:
    out = []
    for i in layers:
        if not isinstance(i, int) or not -n <= i < n:
            raise ValueError(f"argument 'layers': {i!r} is not a layer of a {n}-layer model")
        out.append(i % n)
    return list(dict.fromkeys(out))


def model_views(model, tokens: torch.Tensor, *, layers=(0, -1), band: int = 16, label: str = "", source: str = "",
                max_bytes: int = DEFAULT_MAX_MAP_BYTES) -> list[MixerView]:
    """:func:`inspect_mixer` of the mixers of ``layers`` (default the first and the last) on their
    own inputs in the model (:func:`layer_inputs`)."""
    xs = layer_inputs(model, tokens)
    views = []
    for i in _layer_indices(layers, len(model.blocks)):
        mixer, x = model.blocks[i].mixer, xs[i]
        name = f"{label + ' ' if label else ''}layer {i}: {mixer.registry_name}"
        views.append(inspect_mixer(mixer, x, softmax_reference(x), label=name, band=band, source=source, max_bytes=max_bytes))
    return views


def write_run_maps(run_dir: str | Path, config, model, *, layers=(0, -1), dpi: int = 80) -> dict:
    """Writes ``maps.png`` (the maps, spectra and facts of the first and last layer on the
    first test example) and ``maps.json`` (the numbers) into ``run_dir``. A mixer whose maps
    cannot be drawn (too long a sequence for dense maps) gets ``maps.json`` with the reason
    instead of a picture, and so does any other failure to draw: the trainer calls it after
    a finished run (``Trainer(..., write_maps=write_run_maps)``), which a picture never costs.
    Returns what maps.json holds."""
    d = Path(run_dir)
    was_training = model.training
    model.eval()
    try:
        tokens = run_example(config)
        views = model_views(model, tokens, layers=layers, source=f"trained: run {config.run_id}")
        png = figure_png(show_figure(views, dpi=dpi))
    except ValueError as e:
        info = {"run_id": config.run_id, "error": str(e)}
    except Exception as e:  # noqa: BLE001  (a picture never costs the run)
        info = {"run_id": config.run_id, "error": f"{type(e).__name__}: {e}"}
    else:
        (d / MAPS_PNG).write_bytes(png)
        info = {"run_id": config.run_id, "png": MAPS_PNG, "T": int(tokens.shape[0]),
                "layers": [{"label": v.label, "facts": dict(v.facts()), "numbers": v.numbers} for v in views]}
    finally:
        model.train(was_training)
    (d / MAPS_JSON).write_text(json.dumps(info, indent=1))
    return info
