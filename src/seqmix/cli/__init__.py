"""The ``seqmix`` command.

    seqmix list                      the registered mixers: family, modes, state size
    seqmix show MIXER [MIXER ...]    maps Φ, decay spectra and DSF facts side by side (PNG, or --html)
    seqmix info NAME                 one mixer: its config fields, defaults and docstring
    seqmix table2 [NAME ...]         MetaLA's Table 2: parameter groups and conditions C0-C3 per preset
    seqmix train --task mqar --mixer s6 --d-model 64 ...    train one model (docs/harness.md)
    seqmix lm train|eval|generate|export     language modelling on text (docs/lm.md)
    seqmix reproduce NAME --scale tiny|paper   run a preset, print its table and claims, plot
    seqmix reproduce all --scale tiny        every preset, then runs/report/index.html (--dry-run: list the runs)
    seqmix sweep PRESET|FILE.json    run a preset's grid (or a JSON list of runs / a JSON preset)
    seqmix results                   tables (markdown/CSV) and plots from the results store
    seqmix linearize --hf DIR --mixer NAME --out DIR   a checkpoint's attention -> a seqmix mixer (docs/linearize.md)
    seqmix backends                  the kernel backends of the ops: installed or why not (docs/performance.md)

One module per command group: :mod:`.mixers` (list, info, table2, show), :mod:`.harness`
(train, sweep, reproduce, results), :mod:`.lm` (lm ...), :mod:`.linearize`, :mod:`.backends`; what they share
is in :mod:`._common`. Each subcommand is a pair of functions ``_add_<name>(subparsers)``
and ``_run_<name>(args) -> int``, listed in its module's ``COMMANDS``; :data:`COMMANDS` here
joins them in the order of ``seqmix --help`` (:data:`HELP_ORDER`). A ValueError (or a pydantic ValidationError)
of a command is bad input: ``seqmix CMD: error: ...`` in at most 3 lines on stderr, no
traceback, and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from . import backends, harness, linearize, lm, mixers

#: the order of ``seqmix --help``: the order of the README's table "What you can do" (compare the
#: mixers, train on a task, a language model, reproduce the papers, linearize), then the rest
HELP_ORDER = ("list", "show", "info", "table2", "train", "lm", "reproduce", "sweep", "results", "linearize", "backends")
_ALL = {**mixers.COMMANDS, **harness.COMMANDS, **lm.COMMANDS, **linearize.COMMANDS, **backends.COMMANDS}
assert set(HELP_ORDER) == set(_ALL), "every command has its place in HELP_ORDER"
#: name -> (add parser, run), in the order of ``seqmix --help``
COMMANDS = {name: _ALL[name] for name in HELP_ORDER}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seqmix", description="Sequence mixers as dynamical systems.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        import seqmix

        print(seqmix.__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 0
    import pydantic

    from ..mixers.base import config_error

    cmd = " ".join(filter(None, (args.command, getattr(args, "lm_command", None))))  # "lm eval", not "lm"
    try:
        from ._common import _import_plugins

        _import_plugins(args)  # --import MODULE: mixers registered outside seqmix, before the command reads the registry
        return COMMANDS[args.command][1](args)
    except pydantic.ValidationError as e:  # a config built outside config_error: its one-line summary, not pydantic's dump
        print(f"seqmix {cmd}: error: {_short(config_error('config', e))}", file=sys.stderr)
        return 2
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"seqmix {cmd}: error: {_short(e)}", file=sys.stderr)
        return 2


#: the most lines an error message of the command may take, and the most characters
#: of the last line when the lines past it are folded into it
MAX_ERROR_LINES = 3
MAX_FOLDED_CHARS = 800


def _short(e: Exception) -> str:
    """The message of ``e`` in at most :data:`MAX_ERROR_LINES` non-empty lines: the lines past
    the limit are folded into the last one (a list of problems stays whole, up to
    :data:`MAX_FOLDED_CHARS` characters)."""
    lines = [ln.rstrip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    if len(lines) > MAX_ERROR_LINES:
        last = " ".join(ln.strip() for ln in lines[MAX_ERROR_LINES - 1:])
        if len(last) > MAX_FOLDED_CHARS:
            last = last[: MAX_FOLDED_CHARS - 1] + "…"
        lines = lines[: MAX_ERROR_LINES - 1] + [last]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
