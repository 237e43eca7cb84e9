"""``seqmix train | sweep | reproduce | results``: the experiment harness (seqmix.data /
models / train / experiments; docs/harness.md)."""

from __future__ import annotations

from ._common import _add_harness_common, _add_parallel, _check_out_dir, _import_plugins, _is_rank0, _parse_kv, _with_parallel


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
    g.add_argument("--positions", default="auto", help="auto, learned, rope (rotary, for the attention mixers) or none")
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


def _train_config(args):
    from ..data import TASKS
    from ..train import load_run_config, make_run_config

    if args.config:
        return load_run_config(args.config, "--config")
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

    from ..analysis.trained import write_run_maps
    from ..train import Trainer, git_commit
    from ..train.store import ResultsStore

    _import_plugins(args)
    config = _with_parallel(_train_config(args), args)  # every field checked before anything is generated or trained
    _check_out_dir(args.out, "--out")  # a file there: one line, before anything is generated or trained
    run_dir = Path(args.out) / "runs" / config.run_id
    console = Console(quiet=not _is_rank0())  # under torchrun only rank 0 prints
    console.print(f"run {config.run_id}: {config.name} d={config.model.d_model} on {config.data.describe()} -> {run_dir}",
                  markup=False, highlight=False)
    trainer = Trainer(config, run_dir=run_dir, progress=not args.no_progress, console=console, write_maps=write_run_maps)
    result = trainer.fit()
    if not trainer.parallel.is_main:
        return 0
    store = ResultsStore(Path(args.out) / "results.sqlite", argument="--out")
    store.put(config, result, version=seqmix.__version__, git_commit=git_commit())
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
    """--launcher and the job resources (docs/scale.md; seqmix.cluster)."""
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
    from ..cluster import make_launcher

    if args.launcher == "local":
        return None
    return make_launcher(args.launcher, args.out, cluster=args.cluster, partition=args.slurm_partition,
                         timeout_min=args.timeout_min, cpus_per_task=args.cpus_per_task, gpus_per_node=args.gpus_per_node)


def _sweep_configs(args):
    from ..experiments import get_preset, load_sweep

    models = args.models.split(",") if getattr(args, "models", None) else None
    if args.preset.endswith(".json"):
        configs, preset = load_sweep(args.preset)
        if configs is not None:
            return configs, None, 1
    else:
        preset = get_preset(args.preset)
    return preset.runs(args.scale, models, skip_missing=args.skip_missing), preset, preset.scale(args.scale).workers


def _run_sweep(args) -> int:
    from ..analysis.trained import write_run_maps
    from ..train.sweep import run_sweep

    _import_plugins(args)
    configs, _, workers = _sweep_configs(args)
    outcomes = run_sweep(configs, out_dir=args.out, workers=args.workers or workers, threads=args.threads, plugins=tuple(args.plugins),
                         launcher=_launcher(args), write_maps=write_run_maps)
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
    from ..experiments import PRESETS, reproduce

    _import_plugins(args)
    if not args.name:
        for p in PRESETS.values():
            missing = p.missing_mixers()
            state = "ready" if not missing else "needs " + ", ".join(missing)
            print(f"{p.name:<16} {p.title}\n{'':<16} scales: {', '.join(p.scales)}; {state}")
        return 0
    models = args.models.split(",") if args.models else None
    if args.name == "all":
        from ..experiments import reproduce_all

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
    p.add_argument("--lr-select", choices=["per_seed", "median"], default="per_seed",
                   help="best over learning rates: each seed at its own best rate (per_seed, the papers' protocol; default) "
                        "or one rate per cell, best on the median over seeds (median)")
    p.add_argument("--lr-criterion", choices=["best", "final"], default="best",
                   help="the accuracy that chooses a run's rate: the best validation accuracy seen (default) or the last")
    p.add_argument("--plot", help="write the accuracy plot: FILE.png, or a folder (it gets EXPERIMENT.png)")
    p.add_argument("--maps", action="store_true",
                   help="list each run's maps of its trained first and last layer (maps.png beside the run; `seqmix show --run ID`)")


def _run_results(args) -> int:
    import re
    from pathlib import Path

    from .._checks import picture_paths
    from ..train.results import best_lm_over_lr, best_over_lr, lm_table, plot, table
    from ..train.store import ResultsStore

    if not Path(args.db).exists():
        raise ValueError(f"argument --db: no results store at {args.db}")
    plot_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", args.experiment or "results")
    if args.plot:  # a file or folder in the way: said before the store is read
        picture_paths(args.plot, [plot_name], "--plot", create=False)
    store = ResultsStore(args.db, argument="--db")
    if args.list:
        for e in store.experiments():
            print(f"{e}: {len(store.rows(e))} runs")
        return 0
    raw = store.rows(args.experiment)
    rows = best_over_lr(raw, all_lrs=args.all_lrs, select=args.lr_select, criterion=args.lr_criterion)
    lm_rows = best_lm_over_lr(raw, all_lrs=args.all_lrs)  # language-modelling runs: ppl, bits/byte, tokens/s
    if not rows and not lm_rows:
        raise ValueError(f"argument --experiment: no finished runs{' in ' + repr(args.experiment) if args.experiment else ''}")
    if args.plot and not rows:  # only language-modelling runs: the plot is of task accuracy against --x
        raise ValueError("argument --plot: nothing to plot (the plot shows the accuracy of synthetic-task runs; "
                         f"{'experiment ' + repr(args.experiment) if args.experiment else 'the store'} has only "
                         "language-modelling runs)")
    for exp in sorted({r["experiment"] for r in rows + lm_rows}):
        rs = [r for r in rows if r["experiment"] == exp]
        ls = [r for r in lm_rows if r["experiment"] == exp]
        if args.format == "markdown":
            print(f"## {exp or '(no experiment)'}\n")
        if rs:
            print(table(rs, x=args.x, fmt=args.format))
        if ls:
            print(lm_table(ls, fmt=args.format))
    if args.plot:
        path = picture_paths(args.plot, [plot_name], "--plot")[plot_name]
        print(f"plot: {plot(rows, path, x=args.x, title=args.experiment or '')}")
    if args.maps:
        _print_maps(store, args)
    return 0


def _print_maps(store, args) -> None:
    """One line per finished run: its labels, accuracy and the maps of its trained layers."""
    import json
    from pathlib import Path

    from ..analysis.trained import MAPS_JSON, MAPS_PNG

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
    "train": (_add_train, _run_train),
    "sweep": (_add_sweep, _run_sweep),
    "reproduce": (_add_reproduce, _run_reproduce),
    "results": (_add_results, _run_results),
}
