"""The ``seqmix`` command.

    seqmix list                      the registered mixers: family, modes, state size
    seqmix info NAME                 one mixer: its config fields, defaults and docstring
    seqmix table2 [NAME ...]         MetaLA's Table 2: parameter groups and conditions C0-C3 per preset

Each subcommand is a pair of functions ``_add_<name>(subparsers)`` and
``_run_<name>(args) -> int``, listed in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys


def _add_list(sub):
    p = sub.add_parser("list", help="list the registered mixers")
    p.add_argument("--family", help="only this family")
    p.add_argument("--format", choices=["table", "markdown", "names"], default="table")


def _run_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    import seqmix

    entries = [e for e in seqmix.list_mixers() if not args.family or e.family == args.family]
    if args.format == "names":
        print("\n".join(e.name for e in entries))
        return 0
    if args.format == "markdown":
        print("| mixer | family | modes | state size (floats per sequence) | description |")
        print("|---|---|---|---|---|")
        for e in entries:
            print(f"| {e.name} | {e.family} | {', '.join(e.modes)} | {e.state_formula} | {e.description} |")
        return 0
    table = Table(title=f"seqmix: {len(entries)} registered mixers")
    for col in ("mixer", "family", "modes", "state size (floats / sequence)", "description"):
        table.add_column(col)
    for e in entries:
        table.add_row(e.name, e.family, ", ".join(e.modes), e.state_formula, e.description)
    Console(width=max(120, Console().width)).print(table)
    return 0


def _add_info(sub):
    p = sub.add_parser("info", help="show one mixer's config fields and documentation")
    p.add_argument("name")


def _run_info(args) -> int:
    import seqmix

    e = seqmix.mixer_entry(args.name)
    print(f"{e.name} ({e.family}): {e.description}")
    print(f"  class: {e.cls.__module__}.{e.cls.__name__}")
    print(f"  modes: {', '.join(e.modes)} (reference: {e.cls.reference_mode})")
    print(f"  state size: {e.state_formula}")
    print("  config:")
    for fname, f in e.cls.Config.model_fields.items():
        default = e.defaults.get(fname, f.default)
        print(f"    {fname} = {default!r}   {f.description or ''}")
    doc = (e.cls.__doc__ or "").strip()
    if doc:
        print("\n" + doc)
    return 0


def _add_table2(sub):
    p = sub.add_parser("table2", help="MetaLA's Table 2: parameter groups and conditions C0-C3 of the general-form presets")
    p.add_argument("names", nargs="*", help="presets (default: every general-form preset)")


def _run_table2(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from seqmix.analysis import table2

    rows = [c.row() for c in table2(args.names or None)]
    table = Table(title="MetaLA Table 2 (marks reconstructed from Props. A2.1-A2.3: * = inferred)")
    for col in ("name", "group", "C0", "C1", "C2", "C3", "group_source", "table2_models"):
        table.add_column(col)
    for r in rows:
        table.add_row(*(r[c] for c in ("name", "group", "C0", "C1", "C2", "C3", "group_source", "table2_models")))
    Console(width=max(120, Console().width)).print(table)
    return 0


COMMANDS = {
    "list": (_add_list, _run_list),
    "info": (_add_info, _run_info),
    "table2": (_add_table2, _run_table2),
}


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
    try:
        return COMMANDS[args.command][1](args)
    except ValueError as e:  # bad input: one clear line, no traceback
        print(f"seqmix {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
