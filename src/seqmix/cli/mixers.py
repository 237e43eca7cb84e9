"""``seqmix list | info | table2 | show``: the registered mixers, their configs, MetaLA's
Table 2, and their maps Φ side by side."""

from __future__ import annotations

from ._common import _add_import, print_facts_table


def _add_list(sub):
    p = sub.add_parser("list", help="list the registered mixers")
    _add_import(p)
    p.add_argument("--family", help="only this family")
    p.add_argument("--format", choices=["table", "markdown", "names"], default="table")
    p.add_argument("--dsf", action="store_true", help="the DSF table of docs/mixers.md instead: structure of Λ, state, "
                   "normalization, gating, modes (markdown)")


def _run_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    import seqmix

    every = seqmix.list_mixers()
    families = sorted({e.family for e in every})
    if args.family and args.family not in families:
        raise ValueError(f"argument --family: unknown family {args.family!r}; families: {', '.join(families)}")
    entries = [e for e in every if not args.family or e.family == args.family]
    if getattr(args, "dsf", False):  # docs/mixers.md: seqmix.analysis.mixer_table
        from seqmix.analysis.mixer_table import mixer_table, mixer_table_markdown

        rows = mixer_table()
        print(mixer_table_markdown([r for r in rows if not args.family or r["family"] == args.family]), end="")
        return 0
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
    _add_import(p)
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
    _add_import(p)
    p.add_argument("mixers", nargs="*", metavar="MIXER", help="registered mixer names (`seqmix list`); repeats allowed")
    p.add_argument("--input", choices=INPUT_KINDS, default="random", help="random tokens, an MQAR example, or a text (default random)")
    p.add_argument("--text", help="the text of --input text")
    p.add_argument("--text-file", help="read the text of --input text from this file")
    p.add_argument("-T", "--seq-len", type=int, default=256, help="sequence length T (default 256; a text is cut to it)")
    p.add_argument("--d-model", type=int, default=None, help="width of the randomly initialized mixers (default: each mixer's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config field of every random-init mixer that has it (repeatable)")
    p.add_argument("--checkpoint", action="append", default=[], metavar="[MIXER=]PATH",
                   help="trained weights for a shown mixer (a seqmix mixer checkpoint or a state dict; repeatable)")
    p.add_argument("--run", action="append", default=[], metavar="RUN_ID",
                   help="a trained harness run (id, unique id prefix or folder): its first and last layer on its first test "
                        "example, inside the model (repeatable; not with MIXER names)")
    p.add_argument("--runs", default="runs", help="where --run looks: the --out of the sweep (default runs)")
    p.add_argument("--layers", default="0,-1", help="layers of --run to show, comma-separated (default 0,-1: first and last)")
    p.add_argument("--seed", type=int, default=0, help="seed of the input, the embedding and the random init (default 0)")
    p.add_argument("--band", type=int, default=16, help="width w of the diagonal band for the band mass (default 16)")
    p.add_argument("--reference", help="label of a shown mixer whose map is the reference P (default: softmax attention, same seed)")
    p.add_argument("--log", action="store_true", help="logarithmic colour scale for the maps")
    p.add_argument("--maps", type=int, default=4, help="heads or channels drawn per mixer (default 4)")
    p.add_argument("--theory", action="append", default=[], choices=[*THEORY_FIGURES, "all"], help="add a theory figure (repeatable)")
    p.add_argument("--html", action="store_true", help="write one self-contained HTML report instead of PNG files")
    p.add_argument("--out", default="seqmix_show",
                   help="a folder (default ./seqmix_show: maps.png, one PNG per theory figure, or report.html), or a file "
                        "FILE.png (FILE.html with --html) that gets the first picture, the others beside it as FILE-NAME.png")
    p.add_argument("--dpi", type=int, default=100, help="pixels per inch of the pictures (default 100)")
    p.add_argument("--max-memory", type=float, default=1.0, help="GiB the dense maps of one mixer may take (default 1)")
    g = p.add_argument_group("real models (docs/interop.md)")
    g.add_argument("--hf", action="append", default=[], metavar="PATH_OR_HUB_ID",
                   help="a transformers checkpoint (local folder, or a hub id in the local HF cache; never downloaded), converted "
                        "and drawn on --text: each layer's mean map and --heads, its decay spectrum, state size across layers "
                        "(repeatable: side by side; --layers: which layers get a column, 'all' for every one)")
    g.add_argument("--heads", default=None, help="--hf: heads or channels drawn beside the mean map, comma-separated "
                                                 "(default: --maps - 1 evenly spaced)")
    g.add_argument("--ids", default=None, help="--hf: token ids to read instead of a text, comma-separated")
    g.add_argument("--report", action="store_true", help="--hf: write one page per model (report.md and report.html) listing "
                   "every layer: its transformers class, seqmix mixer, state size, structure of Λ, normalization and gating, "
                   "decay range and the 90%% mass lag of Φ on the text (docs/interop.md), instead of the maps")


def _run_show(args) -> int:
    from pathlib import Path

    from seqmix._checks import picture_paths
    from seqmix.analysis import show
    from seqmix.analysis.theory_figures import THEORY_FIGURES

    if not args.mixers and not args.theory and not args.run and not args.hf:
        raise ValueError("argument 'MIXER': give at least one mixer name (`seqmix list`), a --run or a --theory figure")
    if args.run and args.mixers:
        raise ValueError("argument '--run': a trained run is shown on its own data; show MIXER names in a separate call")
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
        except UnicodeDecodeError:
            raise ValueError(f"argument '--text-file': {args.text_file!r} is not UTF-8 text") from None
    if getattr(args, "report", False) and not args.hf:
        raise ValueError("argument '--report': the layer report is of real models: pass --hf PATH_OR_HUB_ID")
    if args.hf:  # real models: seqmix.interop + seqmix.analysis.model_maps (docs/interop.md)
        from ._show_hf import run_show_hf

        return run_show_hf(args, text)
    names = list(THEORY_FIGURES) if "all" in args.theory else list(dict.fromkeys(args.theory))
    pictures, suffix = (["report"], ".html") if args.html else ((["maps"] if args.mixers or args.run else []) + names, ".png")
    picture_paths(args.out, pictures, "--out", suffix, create=False)  # a file or folder in the way: one line at once
    views, inp = [], None
    if args.mixers:
        inp = show.make_input(args.input, args.seq_len, text=text, seed=args.seed)
        mixers, sources = show.mixers_for_show(args.mixers, checkpoints=args.checkpoint, seed=args.seed,
                                               overrides=show.parse_overrides(args.set), d_model=args.d_model)
        views = show.inspect_mixers(mixers, inp, seed=args.seed, band=args.band, reference=args.reference, sources=sources,
                                    max_bytes=int(args.max_memory * 2**30))
    if args.run:
        from seqmix.analysis import trained

        try:
            layers = [int(v) for v in args.layers.split(",")]
        except ValueError:
            raise ValueError(f"argument '--layers': expected comma-separated layer indices, got {args.layers!r}") from None
        descs = []
        for r in args.run:
            config, model = trained.load_run(r, args.runs)
            tokens = trained.run_example(config)
            views += trained.model_views(model, tokens, layers=layers, band=args.band, label=config.run_id[:8],
                                         source=f"trained: {config.name}", max_bytes=int(args.max_memory * 2**30))
            descs.append(f"run {config.run_id[:8]} ({config.name}): test example 0, {config.data.describe()}")
        inp = show.ShowInput("run", tokens, config.data.vocab_size, "; ".join(descs))
    paths = picture_paths(args.out, pictures, "--out", suffix)  # made only now that the input is known good
    theory = {n: THEORY_FIGURES[n](dpi=args.dpi)[0] for n in names}
    written = []
    if args.html:
        desc = inp.description if inp is not None else ""
        written.append(show.write_html(paths["report"], views, theory=theory, input_description=desc, log=args.log,
                                       max_maps=args.maps, dpi=args.dpi, title="seqmix show: " + " ".join(args.mixers or names)))
    else:
        if views:
            paths["maps"].write_bytes(show.figure_png(show.show_figure(views, log=args.log, max_maps=args.maps, dpi=args.dpi)))
            written.append(paths["maps"])
        for n, fig in theory.items():
            paths[n].write_bytes(show.figure_png(fig))
            written.append(paths[n])
    if views:
        print_facts_table(views, f"seqmix show: {inp.description}; P = the reference softmax map")
    for p in written:
        print(f"wrote {p}")
    return 0



COMMANDS = {
    "list": (_add_list, _run_list),
    "info": (_add_info, _run_info),
    "table2": (_add_table2, _run_table2),
    "show": (_add_show, _run_show),
}
