"""The ``seqmix`` command.

    seqmix list                      the registered mixers: family, modes, state size
    seqmix info NAME                 one mixer: its config fields, defaults and docstring
    seqmix table2 [NAME ...]         MetaLA's Table 2: parameter groups and conditions C0-C3 per preset
    seqmix show MIXER [MIXER ...]    maps Φ, decay spectra and DSF facts side by side (PNG, or --html)
    seqmix train --task mqar --mixer s6 --d-model 64 ...    train one model (docs/harness.md)
    seqmix sweep PRESET|FILE.json    run a preset's grid (or a JSON list of runs / a JSON preset)
    seqmix results                   tables (markdown/CSV) and plots from the results store
    seqmix reproduce NAME --scale tiny|paper   run a preset, print its table and claims, plot
    seqmix reproduce all --scale tiny        every preset, then runs/report/index.html (--dry-run: list the runs)

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
    p.add_argument("--out", default="seqmix_show", help="output folder (default ./seqmix_show)")
    p.add_argument("--dpi", type=int, default=100, help="pixels per inch of the pictures (default 100)")
    p.add_argument("--max-memory", type=float, default=1.0, help="GiB the dense maps of one mixer may take (default 1)")


def _run_show(args) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from seqmix.analysis import show
    from seqmix.analysis.theory_figures import THEORY_FIGURES

    if not args.mixers and not args.theory and not args.run:
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
    out = Path(args.out)
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
        table = Table(title=escape(f"seqmix show: {inp.description}; P = the reference softmax map"))
        facts = [v.facts() for v in views]
        table.add_column("")
        for v in views:
            table.add_column(escape(v.label))
        for i, (key, _) in enumerate(facts[0]):
            table.add_row(key, *(f[i][1] for f in facts))
        Console(width=max(120, Console().width)).print(table)
    for p in written:
        print(f"wrote {p}")
    return 0


# -- the experiment harness (seqmix.data / models / train / experiments) ---------------------


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
    p.add_argument("--import", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="import this module first (mixers registered outside seqmix); repeatable")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: cores / workers)")


def _import_plugins(args):
    import importlib

    for m in args.plugins:
        importlib.import_module(m)


def _add_train(sub):
    p = sub.add_parser("train", help="train one model on a synthetic task")
    p.add_argument("--config", help="a RunConfig as JSON (file); the other options override nothing when given")
    g = p.add_argument_group("task")
    g.add_argument("--task", default="mqar", help="mqar, selective_copying, induction_heads, noisy_mqar, fuzzy_mqar")
    g.add_argument("--seq-len", type=int, help="sequence length L")
    g.add_argument("--kv", type=int, help="MQAR key-value pairs")
    g.add_argument("--vocab", type=int, help="vocabulary size")
    g.add_argument("--train-examples", type=int, default=10_000)
    g.add_argument("--test-examples", type=int, default=1_000)
    g.add_argument("--task-kw", action="append", default=[], metavar="KEY=VALUE", help="other task fields (e.g. power_a=1)")
    g.add_argument("--batch-size", type=int, default=64)
    g.add_argument("--data-seed", type=int, default=0)
    g = p.add_argument_group("model")
    g.add_argument("--mixer", default="linear_attention", help="registered mixer (seqmix list)")
    g.add_argument("--mixer-kw", action="append", default=[], metavar="KEY=VALUE", help="mixer config fields (e.g. n=32)")
    g.add_argument("--d-model", type=int, default=64)
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--channel-mixer", default="mlp", help="mlp, swiglu or none")
    g.add_argument("--positions", default="auto", help="auto, learned or none")
    g = p.add_argument_group("training")
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--epochs", type=int, default=10)
    g.add_argument("--max-steps", type=int, default=None)
    g.add_argument("--warmup", type=float, default=0.1)
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping (0: off)")
    g.add_argument("--early-stop", type=float, default=0.99, help="stop at this validation accuracy (0: never)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu")
    _add_harness_common(p)
    p.add_argument("--no-progress", action="store_true")


def _train_config(args):
    import json

    from .data import TASKS
    from .train import make_run_config

    if args.config:
        return make_run_config(**json.loads(open(args.config).read()))
    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; tasks: {', '.join(TASKS)}")
    task = {"task": args.task, **_parse_kv(args.task_kw, "--task-kw")}
    for opt, fname in (("seq_len", "seq_len"), ("kv", "num_kv_pairs"), ("vocab", "vocab_size")):
        if getattr(args, opt) is not None:
            task[fname] = getattr(args, opt)
    data = {"train": [{**task, "num_examples": args.train_examples}], "test": [{**task, "num_examples": args.test_examples}],
            "batch_size": args.batch_size, "seed": args.data_seed}
    model = {"mixer": args.mixer, "mixer_kwargs": _parse_kv(args.mixer_kw, "--mixer-kw"), "d_model": args.d_model,
             "n_layers": args.layers, "channel_mixer": args.channel_mixer, "positions": args.positions}
    train = {"lr": args.lr, "epochs": args.epochs, "max_steps": args.max_steps, "warmup": args.warmup,
             "weight_decay": args.weight_decay, "grad_clip": args.clip or None, "early_stop": args.early_stop or None,
             "seed": args.seed, "device": args.device, "threads": args.threads}
    return make_run_config(experiment="train", data=data, model=model, train=train)


def _run_train(args) -> int:
    from pathlib import Path

    from rich.console import Console

    import seqmix

    from .train import Trainer, git_commit
    from .train.store import ResultsStore

    _import_plugins(args)
    config = _train_config(args)  # every field checked before anything is generated or trained
    run_dir = Path(args.out) / "runs" / config.run_id
    console = Console()
    console.print(f"run {config.run_id}: {config.name} d={config.model.d_model} on {config.data.describe()} -> {run_dir}",
                  markup=False, highlight=False)
    result = Trainer(config, run_dir=run_dir, progress=not args.no_progress, console=console).fit()
    ResultsStore(Path(args.out) / "results.sqlite").put(config, result, version=seqmix.__version__, git_commit=git_commit())
    console.print(f"accuracy {result.accuracy:.4f} (best epoch {result.best_epoch} of {result.epochs}), "
                  f"{result.tokens_per_s:,.0f} tokens/s, {result.wall_time:.1f}s, state {result.state_size:,} floats, "
                  f"{result.params:,} parameters")
    return 0


def _add_sweep(sub):
    p = sub.add_parser("sweep", help="run a preset's grid (or a JSON file of runs / a JSON preset)")
    p.add_argument("preset", help="preset name (seqmix reproduce) or a .json file")
    p.add_argument("--scale", default="tiny", help="tiny or paper (presets)")
    p.add_argument("--workers", type=int, default=None, help="parallel worker processes (default: the scale's)")
    p.add_argument("--models", help="comma-separated model labels of the preset to run")
    p.add_argument("--skip-missing", action="store_true", help="run the models whose mixers are registered, skip the others")
    _add_harness_common(p)


def _sweep_configs(args):
    import json
    from pathlib import Path

    from .experiments import Preset, get_preset
    from .train import make_run_config

    models = args.models.split(",") if getattr(args, "models", None) else None
    if args.preset.endswith(".json"):
        blob = json.loads(Path(args.preset).read_text())
        if isinstance(blob, list):
            return [make_run_config(**c) for c in blob], None, 1
        preset = Preset(**blob)
    else:
        preset = get_preset(args.preset)
    return preset.runs(args.scale, models, skip_missing=args.skip_missing), preset, preset.scale(args.scale).workers


def _run_sweep(args) -> int:
    from .train.sweep import run_sweep

    _import_plugins(args)
    configs, _, workers = _sweep_configs(args)
    outcomes = run_sweep(configs, out_dir=args.out, workers=args.workers or workers, threads=args.threads, plugins=tuple(args.plugins))
    return 1 if any(o.result is None for o in outcomes) else 0


def _add_reproduce(sub):
    p = sub.add_parser("reproduce", help="reproduce a figure or table: run, print the table and the claims, plot")
    p.add_argument("name", nargs="?", help="preset, or 'all' (every preset, then one HTML report; omit to list them)")
    p.add_argument("--scale", default="tiny", help="tiny (CPU) or paper (the full protocol)")
    p.add_argument("--dry-run", action="store_true", help="list the runs (model, size, lr, seed) without training")
    p.add_argument("--report", default=None, help="with 'all': the report's folder (default OUT/report)")
    p.add_argument("--workers", type=int, default=None, help="parallel worker processes (default: the scale's)")
    p.add_argument("--models", help="comma-separated model labels to run (default: all)")
    p.add_argument("--skip-missing", action="store_true", help="run the models whose mixers are registered, skip the others")
    _add_harness_common(p)


def _run_reproduce(args) -> int:
    from .experiments import PRESETS, reproduce

    _import_plugins(args)
    if not args.name:
        for p in PRESETS.values():
            missing = p.missing_mixers()
            state = "ready" if not missing else "needs " + ", ".join(missing)
            print(f"{p.name:<16} {p.title}\n{'':<16} scales: {', '.join(p.scales)}; {state}")
        return 0
    models = args.models.split(",") if args.models else None
    if args.name == "all":
        from .experiments import reproduce_all

        if models:
            raise ValueError("argument --models: not with 'all' (each preset has its own models)")
        done, _, _ = reproduce_all(args.scale, out_dir=args.out, workers=args.workers, threads=args.threads,
                                   plugins=tuple(args.plugins), dry_run=args.dry_run, report_dir=args.report)
        return 1 if any(r.failed for r in done) else 0
    r = reproduce(args.name, args.scale, out_dir=args.out, workers=args.workers, threads=args.threads, models=models,
                  skip_missing=args.skip_missing, plugins=tuple(args.plugins), dry_run=args.dry_run)
    return 1 if r.failed else 0


def _add_results(sub):
    p = sub.add_parser("results", help="tables and plots of the results store")
    p.add_argument("--db", default="runs/results.sqlite", help="the results store (default runs/results.sqlite)")
    p.add_argument("--experiment", help="only this experiment (e.g. dsf-fig2/tiny); see --list")
    p.add_argument("--list", action="store_true", help="list the experiments in the store")
    p.add_argument("--format", choices=["markdown", "csv"], default="markdown")
    p.add_argument("--x", default="d_model", help="columns / plot axis: d_model, n, state_size or task")
    p.add_argument("--all-lrs", action="store_true", help="one row per learning rate instead of the best")
    p.add_argument("--plot", help="write a PNG plot here")
    p.add_argument("--maps", action="store_true",
                   help="list each run's maps of its trained first and last layer (maps.png beside the run; `seqmix show --run ID`)")


def _run_results(args) -> int:
    from pathlib import Path

    from .train.results import best_over_lr, plot, table
    from .train.store import ResultsStore

    if not Path(args.db).exists():
        raise ValueError(f"argument --db: no results store at {args.db}")
    store = ResultsStore(args.db)
    if args.list:
        for e in store.experiments():
            print(f"{e}: {len(store.rows(e))} runs")
        return 0
    rows = best_over_lr(store.rows(args.experiment), all_lrs=args.all_lrs)
    if not rows:
        raise ValueError(f"argument --experiment: no finished runs{' in ' + repr(args.experiment) if args.experiment else ''}")
    for exp in sorted({r["experiment"] for r in rows}):
        rs = [r for r in rows if r["experiment"] == exp]
        if args.format == "markdown":
            print(f"## {exp or '(no experiment)'}\n")
        print(table(rs, x=args.x, fmt=args.format))
    if args.plot:
        print(f"plot: {plot(rows, args.plot, x=args.x, title=args.experiment or '')}")
    if args.maps:
        _print_maps(store, args)
    return 0


def _print_maps(store, args) -> None:
    """One line per finished run: its labels, accuracy and the maps of its trained layers."""
    import json
    from pathlib import Path

    from .analysis.trained import MAPS_JSON, MAPS_PNG

    base = Path(args.db).parent / "runs"
    print("\n## maps of the trained models (first and last layer; `seqmix show --run ID --runs "
          f"{Path(args.db).parent}` redraws them)\n")
    print("| run | model | task | d | n | lr | acc | maps |\n|---|---|---|---|---|---|---|---|")
    for r in store.rows(args.experiment):
        if r.get("status") != "finished":
            continue
        d = base / r["run_id"]
        if (d / MAPS_PNG).exists():
            where = str(d / MAPS_PNG)
        elif (d / MAPS_JSON).exists():
            where = "not drawn: " + json.loads((d / MAPS_JSON).read_text()).get("error", "?")
        else:
            where = "none (trained before maps were written; `seqmix show --run` draws them)"
        n = "-" if r["n"] is None else r["n"]
        print(f"| {r['run_id'][:8]} | {r['label']} | {r['task']} | {r['d_model']} | {n} | {r['lr']:.2g} | "
              f"{100 * r['accuracy']:.1f} | {where} |")


COMMANDS = {
    "list": (_add_list, _run_list),
    "info": (_add_info, _run_info),
    "table2": (_add_table2, _run_table2),
    "show": (_add_show, _run_show),
    "train": (_add_train, _run_train),
    "sweep": (_add_sweep, _run_sweep),
    "reproduce": (_add_reproduce, _run_reproduce),
    "results": (_add_results, _run_results),
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
