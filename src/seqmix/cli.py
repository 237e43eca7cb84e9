"""The ``seqmix`` command.

    seqmix list                      the registered mixers: family, modes, state size
    seqmix info NAME                 one mixer: its config fields, defaults and docstring
    seqmix table2 [NAME ...]         MetaLA's Table 2: parameter groups and conditions C0-C3 per preset
    seqmix show MIXER [MIXER ...]    maps Φ, decay spectra and DSF facts side by side (PNG, or --html)

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


def _add_show(sub):
    from seqmix.analysis.show import INPUT_KINDS
    from seqmix.analysis.theory_figures import THEORY_FIGURES

    p = sub.add_parser("show", help="draw the maps Φ, decay spectra and DSF facts of mixers side by side (PNG, or --html)",
                       description="Maps, decay spectra and DSF facts of mixers on one input (docs/show.md).")
    p.add_argument("mixers", nargs="*", metavar="MIXER", help="registered mixer names (`seqmix list`); repeats allowed")
    p.add_argument("--input", choices=INPUT_KINDS, default="random", help="random tokens, an MQAR example, or a text (default random)")
    p.add_argument("--text", help="the text of --input text")
    p.add_argument("--text-file", help="read the text of --input text from this file")
    p.add_argument("-T", "--seq-len", type=int, default=256, help="sequence length T (default 256; a text is cut to it)")
    p.add_argument("--d-model", type=int, default=None, help="width of the randomly initialized mixers (default: each mixer's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config field of every random-init mixer that has it (repeatable)")
    p.add_argument("--checkpoint", action="append", default=[], metavar="[MIXER=]PATH",
                   help="trained weights for a shown mixer (a seqmix mixer checkpoint or a state dict; repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the input, the embedding and the random init (default 0)")
    p.add_argument("--band", type=int, default=16, help="width w of the diagonal band for the band mass (default 16)")
    p.add_argument("--reference", help="label of a shown mixer whose map is the reference P (default: softmax attention, same seed)")
    p.add_argument("--log", action="store_true", help="logarithmic colour scale for the maps")
    p.add_argument("--maps", type=int, default=4, help="heads or channels drawn per mixer (default 4)")
    p.add_argument("--theory", action="append", default=[], choices=[*THEORY_FIGURES, "all"], help="add a theory figure (repeatable)")
    p.add_argument("--html", action="store_true", help="write one self-contained HTML report instead of PNG files")
    p.add_argument("--out", default="seqmix_show", help="output folder (default ./seqmix_show)")
    p.add_argument("--dpi", type=int, default=100, help="pixels per inch of the pictures (default 100)")
    p.add_argument("--max-memory", type=float, default=1.0, help="GiB the dense maps of one mixer may take (default 1)")


def _run_show(args) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from seqmix.analysis import show
    from seqmix.analysis.theory_figures import THEORY_FIGURES

    if not args.mixers and not args.theory:
        raise ValueError("argument 'MIXER': give at least one mixer name (`seqmix list`) or a --theory figure")
    for name, value, low in (("maps", args.maps, 1), ("dpi", args.dpi, 10), ("band", args.band, 1)):
        if value < low:
            raise ValueError(f"argument '--{name}' must be >= {low}, got {value}")
    if not args.max_memory > 0:
        raise ValueError(f"argument '--max-memory' must be > 0 GiB, got {args.max_memory}")
    text = args.text
    if args.text_file:
        if text is not None:
            raise ValueError("argument '--text-file': give --text or --text-file, not both")
        try:
            text = Path(args.text_file).read_text(encoding="utf-8")
        except OSError as e:
            raise ValueError(f"argument '--text-file': cannot read {args.text_file!r} ({e.strerror})") from None
    out = Path(args.out)
    views, inp = [], None
    if args.mixers:
        inp = show.make_input(args.input, args.seq_len, text=text, seed=args.seed)
        mixers, sources = show.mixers_for_show(args.mixers, checkpoints=args.checkpoint, seed=args.seed,
                                               overrides=show.parse_overrides(args.set), d_model=args.d_model)
        views = show.inspect_mixers(mixers, inp, seed=args.seed, band=args.band, reference=args.reference, sources=sources,
                                    max_bytes=int(args.max_memory * 2**30))
    names = list(THEORY_FIGURES) if "all" in args.theory else list(dict.fromkeys(args.theory))
    theory = {n: THEORY_FIGURES[n](dpi=args.dpi)[0] for n in names}
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if args.html:
        desc = inp.description if inp is not None else ""
        written.append(show.write_html(out / "report.html", views, theory=theory, input_description=desc, log=args.log,
                                       max_maps=args.maps, dpi=args.dpi, title="seqmix show: " + " ".join(args.mixers or names)))
    else:
        if views:
            (out / "maps.png").write_bytes(show.figure_png(show.show_figure(views, log=args.log, max_maps=args.maps, dpi=args.dpi)))
            written.append(out / "maps.png")
        for n, fig in theory.items():
            (out / f"{n}.png").write_bytes(show.figure_png(fig))
            written.append(out / f"{n}.png")
    if views:
        table = Table(title=f"seqmix show: {inp.description}; P = the reference softmax map")
        facts = [v.facts() for v in views]
        table.add_column("")
        for v in views:
            table.add_column(v.label)
        for i, (key, _) in enumerate(facts[0]):
            table.add_row(key, *(f[i][1] for f in facts))
        Console(width=max(120, Console().width)).print(table)
    for p in written:
        print(f"wrote {p}")
    return 0


COMMANDS = {
    "list": (_add_list, _run_list),
    "info": (_add_info, _run_info),
    "table2": (_add_table2, _run_table2),
    "show": (_add_show, _run_show),
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
