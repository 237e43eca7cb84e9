"""``seqmix backends``: the kernel backends of the ops, installed or why not (docs/performance.md)."""

from __future__ import annotations


def _add_backends(sub):
    p = sub.add_parser("backends", help="list the ops' kernel backends: what each covers, installed or why not")
    p.add_argument("--format", choices=["table", "plain", "json"], default="table")


def _run_backends(args) -> int:
    import json

    from seqmix.ops import backends

    rows = backends.listing()
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    if args.format == "plain":
        for r in rows:
            print(f"{r['backend']:6s} {r['op']:18s} {'installed' if r['installed'] else 'missing':9s} {r['reason']}")
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="seqmix op backends (backend='auto' picks an installed one where it covers the call, else torch)")
    for col in ("backend", "op", "installed", "why", "what"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["backend"], r["op"], "yes" if r["installed"] else "no", escape(r["reason"]), escape(r["description"]))
    Console(width=max(120, Console().width)).print(table)
    return 0



COMMANDS = {"backends": (_add_backends, _run_backends)}
