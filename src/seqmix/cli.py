"""The ``seqmix`` command.

    seqmix list                      the registered mixers: family, modes, state size
    seqmix info NAME                 one mixer: its config fields, defaults and docstring
    seqmix table2 [NAME ...]         MetaLA's Table 2: parameter groups and conditions C0-C3 per preset
    seqmix show MIXER [MIXER ...]    maps Φ, decay spectra and DSF facts side by side (PNG, or --html)
    seqmix train --task mqar --mixer s6 --d-model 64 ...    train one model (docs/harness.md)
    seqmix sweep PRESET|FILE.json    run a preset's grid (or a JSON list of runs / a JSON preset)
    seqmix results                   tables (markdown/CSV) and plots from the results store
    seqmix reproduce NAME --scale tiny|paper   run a preset, print its table and claims, plot
    seqmix backends                  the kernel backends of the ops: installed or why not (docs/performance.md)
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
    _add_parallel(p)
    _add_harness_common(p)
    p.add_argument("--no-progress", action="store_true")


def _add_parallel(p):
    """--parallel / --dist-timeout (issue 15, docs/scale.md): for a run launched by torchrun or srun."""
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
    config = _with_parallel(_train_config(args), args)  # every field checked before anything is generated or trained
    run_dir = Path(args.out) / "runs" / config.run_id
    console = Console(quiet=not _is_rank0())  # under torchrun only rank 0 prints
    console.print(f"run {config.run_id}: {config.name} d={config.model.d_model} on {config.data.describe()} -> {run_dir}",
                  markup=False, highlight=False)
    trainer = Trainer(config, run_dir=run_dir, progress=not args.no_progress, console=console)
    result = trainer.fit()
    if not trainer.parallel.is_main:
        return 0
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
    _add_launcher(p)


def _add_launcher(p):
    """--launcher and the job resources (issue 15, docs/scale.md; seqmix.cluster)."""
    g = p.add_argument_group("cluster (each run as one job; needs the 'cluster' extra)")
    g.add_argument("--launcher", choices=["local", "submitit"], default="local",
                   help="local: worker processes on this machine (default); submitit: one Slurm job per run")
    g.add_argument("--cluster", choices=["auto", "slurm", "local"], default="auto",
                   help="submitit's executor: auto (Slurm when sbatch exists, else local processes), slurm, local")
    g.add_argument("--slurm-partition", default=None)
    g.add_argument("--timeout-min", type=int, default=60, help="wall-clock limit of each job in minutes (default 60)")
    g.add_argument("--cpus-per-task", type=int, default=None)
    g.add_argument("--gpus-per-node", type=int, default=0)


def _launcher(args):
    from .cluster import make_launcher

    if args.launcher == "local":
        return None
    return make_launcher(args.launcher, args.out, cluster=args.cluster, partition=args.slurm_partition,
                         timeout_min=args.timeout_min, cpus_per_task=args.cpus_per_task, gpus_per_node=args.gpus_per_node)


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
    outcomes = run_sweep(configs, out_dir=args.out, workers=args.workers or workers, threads=args.threads, plugins=tuple(args.plugins),
                         launcher=_launcher(args))
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
    _add_launcher(p)


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
                  skip_missing=args.skip_missing, plugins=tuple(args.plugins), launcher=_launcher(args),
                  dry_run=args.dry_run)
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

    from .train.results import best_lm_over_lr, best_over_lr, lm_table, plot, table
    from .train.store import ResultsStore

    if not Path(args.db).exists():
        raise ValueError(f"argument --db: no results store at {args.db}")
    store = ResultsStore(args.db)
    if args.list:
        for e in store.experiments():
            print(f"{e}: {len(store.rows(e))} runs")
        return 0
    raw = store.rows(args.experiment)
    rows = best_over_lr(raw, all_lrs=args.all_lrs)
    lm_rows = best_lm_over_lr(raw, all_lrs=args.all_lrs)  # language-modelling runs: ppl, bits/byte, tokens/s
    if not rows and not lm_rows:
        raise ValueError(f"argument --experiment: no finished runs{' in ' + repr(args.experiment) if args.experiment else ''}")
    for exp in sorted({r["experiment"] for r in rows + lm_rows}):
        rs = [r for r in rows if r["experiment"] == exp]
        ls = [r for r in lm_rows if r["experiment"] == exp]
        if args.format == "markdown":
            print(f"## {exp or '(no experiment)'}\n")
        if rs:
            print(table(rs, x=args.x, fmt=args.format))
        if ls:
            print(lm_table(ls, fmt=args.format))
    if args.plot and rows:
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


# ------------------------------------------------------------------------------------------
# seqmix lm: language modelling on text (train, eval; the generation helper adds generate/export)
# ------------------------------------------------------------------------------------------


def _add_lm_train(sub):
    p = sub.add_parser("train", help="train a language model on a text corpus (Tiny Shakespeare by default)")
    p.add_argument("--config", help="a RunConfig as JSON (file) with a corpus data config; the other options are ignored")
    g = p.add_argument_group("data")
    g.add_argument("--corpus", default="tinyshakespeare", help="tinyshakespeare, a text file or folder, or hf:<name>[/<config>]")
    g.add_argument("--tokenizer", default="char", help="byte, char, bpe, or a path to a tokenizer.json")
    g.add_argument("--bpe-vocab", type=int, default=1024, help="BPE vocabulary size (--tokenizer bpe)")
    g.add_argument("--text-field", default="text", help="text column of a HuggingFace dataset")
    g.add_argument("--seq-len", type=int, default=128, help="training context T")
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--eval-batch-size", type=int, default=None)
    g.add_argument("--data-seed", type=int, default=0)
    g = p.add_argument_group("model")
    g.add_argument("--mixer", default="softmax_attention", help="registered mixer (seqmix list)")
    g.add_argument("--mixer-kw", action="append", default=[], metavar="KEY=VALUE", help="mixer config fields (e.g. heads=4)")
    g.add_argument("--pattern", default=None, help="a layer pattern instead of one mixer (mamba_swa, bmojo, ...)")
    g.add_argument("--d-model", type=int, default=128)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--channel-mixer", default="mlp", help="mlp, swiglu or none")
    g.add_argument("--positions", default="auto", help="auto, learned or none")
    g = p.add_argument_group("training")
    g.add_argument("--max-tokens", type=int, default=None, help="token budget (default 2M when --max-steps is not given)")
    g.add_argument("--max-steps", type=int, default=None)
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup", type=float, default=0.1)
    g.add_argument("--min-lr", type=float, default=0.1, help="final learning rate as a fraction of --lr")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--betas", default="0.9,0.95")
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping (0: off)")
    g.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (default: 10 evaluations)")
    g.add_argument("--eval-batches", type=int, default=None, help="evaluate on at most N batches (default: the whole split)")
    g.add_argument("--checkpoint-every", type=int, default=None, help="also checkpoint every N steps")
    g.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu")
    _add_parallel(p)
    _add_harness_common(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-mfu", action="store_true", help="do not measure the matmul peak for the MFU estimate")


def _lm_config(args):
    import json

    from .train import make_run_config

    if args.config:
        return make_run_config(**json.loads(open(args.config).read()))
    data = {"kind": "corpus", "corpus": args.corpus, "tokenizer": args.tokenizer, "bpe_vocab_size": args.bpe_vocab,
            "text_field": args.text_field, "seq_len": args.seq_len, "batch_size": args.batch_size,
            "eval_batch_size": args.eval_batch_size, "seed": args.data_seed}
    model = {"d_model": args.d_model, "n_layers": args.layers, "channel_mixer": args.channel_mixer, "positions": args.positions}
    if args.pattern:
        model["pattern"] = args.pattern
    else:
        model.update(mixer=args.mixer, mixer_kwargs=_parse_kv(args.mixer_kw, "--mixer-kw"))
    try:
        betas = tuple(float(b) for b in args.betas.split(","))
    except ValueError:
        raise ValueError(f"argument --betas: expected two numbers such as 0.9,0.95, got {args.betas!r}") from None
    train = {"lr": args.lr, "max_tokens": args.max_tokens if (args.max_tokens or args.max_steps) else 2_000_000,
             "max_steps": args.max_steps, "grad_accum": args.grad_accum, "warmup": args.warmup, "min_lr": args.min_lr,
             "weight_decay": args.weight_decay, "betas": betas, "grad_clip": args.clip or None, "early_stop": None,
             "eval_every_steps": args.eval_every, "eval_batches": args.eval_batches, "checkpoint_every": args.checkpoint_every,
             "precision": args.precision, "seed": args.seed, "device": args.device, "threads": args.threads}
    return make_run_config(experiment="lm", data=data, model=model, train=train)


def _run_lm_train(args) -> int:
    from pathlib import Path

    from rich.console import Console

    import seqmix

    from .train import Trainer, git_commit
    from .train.flops import matmul_peak_flops
    from .train.store import ResultsStore

    _import_plugins(args)
    config = _with_parallel(_lm_config(args), args)  # every field checked (and the tokenizer built) before training
    if not config.is_lm:
        raise ValueError("argument --config: the run's data is not a corpus (use `seqmix train` for synthetic tasks)")
    run_dir = Path(args.out) / "runs" / config.run_id
    console = Console(quiet=not _is_rank0())  # under torchrun only rank 0 prints
    console.print(f"run {config.run_id}: {config.name} d={config.model.d_model} x{config.model.n_layers} on "
                  f"{config.data.describe()}, vocab {config.data.vocab_size} -> {run_dir}", markup=False, highlight=False)
    if config.train.threads:
        import torch

        torch.set_num_threads(config.train.threads)
    peak = None if args.no_mfu else matmul_peak_flops(config.train.device)
    trainer = Trainer(config, run_dir=run_dir, progress=not args.no_progress, console=console, peak_flops=peak)
    result = trainer.fit()
    if not trainer.parallel.is_main:
        return 0
    ResultsStore(Path(args.out) / "results.sqlite").put(config, result, version=seqmix.__version__, git_commit=git_commit())
    mfu = f", MFU {100 * result.mfu:.1f}% of {peak / 1e9:.0f} GFLOP/s" if result.mfu is not None else ""
    console.print(f"val ppl {result.ppl:.3f}, {result.bpb:.4f} bits/byte (best at step {result.best_step} of {result.steps}), "
                  f"{result.tokens:,} tokens, {result.tokens_per_s:,.0f} tokens/s{mfu}, {result.wall_time:.1f}s, "
                  f"{result.params:,} parameters", markup=False, highlight=False)
    console.print(f"run folder: {run_dir} (checkpoint.pt, tokenizer.json, result.json, tb/)", markup=False, highlight=False)
    return 0


def _add_lm_eval(sub):
    p = sub.add_parser("eval", help="perplexity, bits per byte and length generalization of a trained LM run")
    p.add_argument("run", help="a run folder, or a run id (prefix) under --runs")
    p.add_argument("--runs", default="runs", help="where runs live (the --out of lm train; default runs/)")
    p.add_argument("--split", default="val", choices=["val", "test"])
    p.add_argument("--lengths", default="1,2,4", help="context multiples of the training length (empty: skip)")
    p.add_argument("--max-tokens", type=int, default=65_536, help="tokens evaluated at each length (default 65536)")
    p.add_argument("--plot", default=None, help="loss-by-position PNG (default: <run>/length.png)")
    p.add_argument("--threads", type=int, default=None)


def _run_lm_eval(args) -> int:
    import json
    from pathlib import Path

    from .analysis.lm import evaluate_lm, length_generalization, plot_length_generalization
    from .analysis.trained import find_run_dir, load_run

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run_dir = find_run_dir(args.run, args.runs)
    config, model = load_run(run_dir)
    ev = evaluate_lm(config, model, split=args.split)
    print(f"{config.name} ({config.run_id}) on {config.data.describe()}, {args.split} split: loss {ev['loss']:.4f}, "
          f"ppl {ev['ppl']:.3f}, {ev['bpb']:.4f} bits/byte, next-token accuracy {ev['accuracy']:.3f} ({ev['tokens']:,} tokens)")
    out = {"eval": ev}
    if args.lengths:
        try:
            ks = [int(k) for k in args.lengths.split(",")]
        except ValueError:
            raise ValueError(f"argument --lengths: expected comma-separated integers such as 1,2,4, got {args.lengths!r}") from None
        lg = length_generalization(config, model, split=args.split, multiples=ks, max_tokens=args.max_tokens)
        print(f"\nlength generalization (training context T = {lg['seq_len']}; same tokens at each length)\n")
        print("| context | ppl | bits/byte | windows |\n|---|---|---|---|")
        for r in lg["results"]:
            if "error" in r:
                print(f"| {r['k']}×T = {r['seq_len']} | not evaluated: {r['error']} | | |")
            else:
                print(f"| {r['k']}×T = {r['seq_len']} | {r['ppl']:.3f} | {r['bpb']:.4f} | {r['windows']} |")
        path = plot_length_generalization(lg, args.plot or Path(run_dir) / "length.png")
        print(f"\nplot: {path}")
        out["length_generalization"] = lg
    (Path(run_dir) / f"eval_{args.split}.json").write_text(json.dumps(out, indent=1))
    return 0


def _add_lm_generate(sub):
    p = sub.add_parser("generate", help="generate text from a trained LM run, streaming tokens as they are made")
    p.add_argument("run", help="a run folder, or a run id (prefix) under --runs")
    p.add_argument("--runs", default="runs", help="where runs live (the --out of lm train; default runs/)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="the prompt text (default: a newline)")
    src.add_argument("--prompt-file", default=None, help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default 200, fewer when a learned position table ends sooner (an explicit value past it is an error)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1, help="samples of the same prompt (drawn one after the other)")
    p.add_argument("--no-stream", action="store_true", help="print each sample when it is complete")
    p.add_argument("--threads", type=int, default=None)


def _run_lm_generate(args) -> int:
    from pathlib import Path

    import torch

    from .analysis.trained import find_run_dir, load_run
    from .data.text import load_tokenizer
    from .train.trainer import TOKENIZER

    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir = find_run_dir(args.run, args.runs)
    if not (run_dir / TOKENIZER).is_file():
        raise ValueError(f"argument 'run': {str(run_dir)!r} has no {TOKENIZER} (generate needs an `seqmix lm train` run)")
    tok = load_tokenizer(run_dir / TOKENIZER)
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise ValueError(f"argument --prompt-file: {str(path)!r} is not a file")
        try:
            prompt = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"argument --prompt-file: {str(path)!r} is not UTF-8 text") from None
    else:
        prompt = "\n" if args.prompt is None else args.prompt
    if not prompt:
        raise ValueError("argument --prompt: the prompt is empty (give at least one character)")
    ids = tok.encode(prompt)
    _, model = load_run(run_dir)
    n_new = args.max_new_tokens
    if n_new is None:
        n_new = 200
        if model.pos is not None:  # learned positions: prompt + new - 1 <= max_seq_len
            n_new = min(n_new, model.pos.num_embeddings - len(ids) + 1)
            if n_new < 200:
                print(f"(at most {n_new} new tokens: the model's learned position table ends at max_seq_len = "
                      f"{model.pos.num_embeddings})", file=sys.stderr)
    from .models.generation import check_positions

    check_positions(model, len(ids) + max(n_new, 1) - 1, "seqmix lm generate", "--max-new-tokens")
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        sys.stdout.write(prompt)
        new: list[int] = []
        shown = [0]  # characters of the decoded continuation already printed

        def show(tokens, final=False):
            new.extend(int(t) for t in tokens.reshape(-1))
            text = tok.decode(new)
            if not final:  # a byte or BPE token may end inside a UTF-8 character: wait for the rest
                text = text.rstrip("\ufffd")
            if len(text) > shown[0]:
                sys.stdout.write(text[shown[0]:])
                sys.stdout.flush()
                shown[0] = len(text)

        out = model.generate(torch.tensor([ids]), n_new, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, seed=args.seed + i, callback=None if args.no_stream else show)
        if args.no_stream:
            sys.stdout.write(tok.decode(out[0, len(ids):].tolist()))
        else:
            show(torch.tensor([], dtype=torch.long), final=True)
        sys.stdout.write("\n")
    return 0


def _add_lm_export(sub):
    p = sub.add_parser("export", help="export a trained LM run (docs/hf.md): --hf DIR writes a HuggingFace folder")
    p.add_argument("run", help="a run folder, or a run id (prefix) under --runs")
    p.add_argument("--runs", default="runs", help="where runs live (the --out of lm train; default runs/)")
    p.add_argument("--hf", required=True, metavar="DIR",
                   help="write config.json, model.safetensors and the tokenizer (PreTrainedTokenizerFast) into DIR")


def _run_lm_export(args) -> int:
    try:
        from .hf.export import export_hf
    except ImportError as e:
        raise ValueError(f"seqmix lm export --hf needs the optional extra 'hf': pip install 'seqmix[hf]' ({e})") from None
    out = export_hf(args.run, args.hf, runs=args.runs)
    print(f"wrote {out} (load it with: import seqmix.hf; AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


#: `seqmix lm <command>`: name -> (add parser, run)
LM_COMMANDS = {
    "train": (_add_lm_train, _run_lm_train),
    "eval": (_add_lm_eval, _run_lm_eval),
    "generate": (_add_lm_generate, _run_lm_generate),
    "export": (_add_lm_export, _run_lm_export),
}


def _add_lm(sub):
    p = sub.add_parser("lm", help="language modelling on text: train, eval, generate, export (see docs/lm.md)")
    lsub = p.add_subparsers(dest="lm_command")
    for add, _ in LM_COMMANDS.values():
        add(lsub)
    p.set_defaults(_lm_parser=p)


def _run_lm(args) -> int:
    if not getattr(args, "lm_command", None):
        args._lm_parser.print_help()
        return 0
    return LM_COMMANDS[args.lm_command][1](args)


COMMANDS = {
    "list": (_add_list, _run_list),
    "info": (_add_info, _run_info),
    "table2": (_add_table2, _run_table2),
    "show": (_add_show, _run_show),
    "train": (_add_train, _run_train),
    "sweep": (_add_sweep, _run_sweep),
    "reproduce": (_add_reproduce, _run_reproduce),
    "results": (_add_results, _run_results),
    "lm": (_add_lm, _run_lm),
}


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


COMMANDS["backends"] = (_add_backends, _run_backends)


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
