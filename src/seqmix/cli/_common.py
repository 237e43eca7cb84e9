"""What the command groups share: KEY=VALUE options, plugin imports, the output and
torch.distributed options of the training commands."""

from __future__ import annotations


def _parse_kv(items, where: str) -> dict:
    """["a=1", "b=x"] -> {"a": 1, "b": "x"} (values parsed as JSON when they parse)."""
    import json

    out = {}
    for it in items or ():
        if "=" not in it:
            raise ValueError(f"argument {where}: expected KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _add_harness_common(p, *, out_default: str = "runs"):
    p.add_argument("--out", default=out_default, help=f"output directory (runs, checkpoints, results.sqlite; default {out_default}/)")
    _add_import(p)
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / workers)")


def _add_import(p):
    """--import MODULE: a module that registers mixers outside seqmix (docs/new_mixer.md), imported
    before the command runs (:func:`seqmix.cli.main` does it for every command that has the option)."""
    p.add_argument("--import", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="import this module first (mixers registered outside seqmix); repeatable")


def _import_plugins(args):
    import importlib

    for m in getattr(args, "plugins", None) or ():
        try:
            importlib.import_module(m)
        except ImportError as e:
            raise ValueError(f"argument '--import': cannot import {m!r} ({e})") from None


def _add_parallel(p):
    """--parallel / --dist-timeout (docs/scale.md): for a run launched by torchrun or srun."""
    g = p.add_argument_group("torch.distributed (launch with torchrun --nproc_per_node N)")
    g.add_argument("--parallel", choices=["none", "ddp", "fsdp"], default=None,
                   help="DDP or FSDP2 over the ranks of torchrun, each on its slice of the global batch (default: the config's, none)")
    g.add_argument("--dist-timeout", type=float, default=None, help="seconds a collective may wait before the run fails (default 600)")


def _with_parallel(config, args):
    """config with --parallel / --dist-timeout applied (execution fields: the run id does not change)."""
    upd = {k: v for k, v in (("parallel", args.parallel), ("dist_timeout", args.dist_timeout)) if v is not None}
    return config.model_copy(update={"train": config.train.model_copy(update=upd)}) if upd else config


def _is_rank0() -> bool:
    import os

    return int(os.environ.get("RANK", "0")) == 0



def _check_out_dir(path, argument: str = "--out"):
    """The output folder ``path`` as a Path, checked without creating it: a file in its place
    (or in place of a parent) is the one-line error of :func:`seqmix._checks.output_dir` now,
    before anything is built or trained; the folder itself is made only when something is
    written, so a call that fails later leaves no empty folder behind."""
    from pathlib import Path

    from .._checks import output_dir

    p = Path(path).expanduser()
    if any(q.exists() and not q.is_dir() for q in (p, *p.parents)):
        output_dir(p, argument)  # raises, creating nothing
    return p


def print_facts_table(views, title: str) -> None:
    """The numbers beside the maps (``MixerView.facts()``), one column per view, as a rich table."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title))
    facts = [v.facts() for v in views]
    table.add_column("")
    for v in views:
        table.add_column(escape(v.label))
    for i, (key, _) in enumerate(facts[0]):
        table.add_row(key, *(f[i][1] for f in facts))
    Console(width=max(120, Console().width)).print(table)
