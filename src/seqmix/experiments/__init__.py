"""seqmix.experiments: named presets that reproduce the seeds' figures and tables.

    from seqmix.experiments import PRESETS, reproduce
    reproduce("dsf-fig2", "tiny")            # trains the grid, prints the table, writes the plot

Presets: dsf-fig1, dsf-fig2, dsf-fig3, dsf-table2, metala-table-a7, bmojo-table3,
dsf-table1-lm (language modelling), each with scales "paper" and "tiny". How to add one: docs/harness.md, "Presets".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .base import LR_DSF, LR_METALA_512, Claim, ModelSpec, Preset, Scale, TaskSpec, evaluate_claims
from .presets import PRESETS


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass
class Reproduction:
    preset: Preset
    scale: str
    rows: list  # best-over-LR rows of this reproduction's runs
    table: str
    plot: Path | None
    claims: list = field(default_factory=list)
    failed: int = 0


def reproduce(name: str, scale: str = "tiny", *, out_dir: str | Path = "runs", workers: int | None = None,
              threads: int | None = None, models: list[str] | None = None, skip_missing: bool = False,
              plugins: tuple[str, ...] = (), progress: bool = True, console=None, launcher=None) -> Reproduction:
    """Runs (or resumes) a preset's grid, then prints the best-over-LR table, the paper's
    numbers and the claims check, and writes the plot to ``out_dir/<preset>-<scale>.png``.
    Results go to ``out_dir/results.sqlite``; runs already there are not run again."""
    from rich.console import Console

    from ..train.results import best_lm_over_lr, best_over_lr, lm_plot, lm_table, plot, table
    from ..train.store import ResultsStore
    from ..train.sweep import run_sweep

    console = console or Console()
    preset = get_preset(name)
    sc = preset.scale(scale)
    for mod in plugins:
        __import__(mod)
    configs = preset.runs(scale, models, skip_missing=skip_missing)
    out_dir = Path(out_dir)
    console.rule(f"[bold]{preset.title}[/bold] — scale {scale}")
    console.print(f"{preset.source}\n{sc.description}\n{len(configs)} runs; {sc.budget}")
    store = ResultsStore(out_dir / "results.sqlite")
    outcomes = run_sweep(configs, out_dir=out_dir, store=store, workers=workers or sc.workers, threads=threads,
                         plugins=plugins, progress=progress, console=console, launcher=launcher)
    ids = [o.config.run_id for o in outcomes if o.result is not None]
    order = [m.label for m in preset.models]
    x = preset.x
    lm = preset.metric == "bpb"
    if lm:  # language modelling: validation bits per byte, lower is better
        rows = best_lm_over_lr(store.rows(preset.experiment(scale), run_ids=ids))
        text = lm_table(rows, order=order)
    else:
        rows = best_over_lr(store.rows(preset.experiment(scale), run_ids=ids))
        text = table(rows, x=x, order=order)
    console.rule("results")
    console.print(text, markup=False, highlight=False)
    if preset.paper:
        console.print("[bold]paper[/bold]")
        console.print(preset.paper, markup=False, highlight=False)
    claims = evaluate_claims(preset, rows)
    if claims:
        console.rule("the paper's claims at this scale")
        for c in claims:
            style = {"agrees": "green", "does not agree": "red"}.get(c["verdict"], "yellow")
            console.print(f"[{style}]{c['verdict']:>15}[/{style}]  {c['text']}  [dim]({c['panel']}: {c['detail']})[/dim]")
    draw = lm_plot if lm else plot
    kw = {} if lm else {"x": x}
    path = draw(rows, out_dir / f"{preset.name}-{scale}.png", title=f"{preset.title} ({scale})", order=order, **kw) if rows else None
    if path:
        console.print(f"plot: {path}")
    (out_dir / f"{preset.name}-{scale}.md").write_text(text)
    failed = sum(o.result is None for o in outcomes)
    if failed:
        console.print(f"[red]{failed} run(s) failed[/red]")
    return Reproduction(preset, scale, rows, text, path, claims, failed)


__all__ = [
    "LR_DSF", "LR_METALA_512", "PRESETS", "Claim", "ModelSpec", "Preset", "Reproduction", "Scale", "TaskSpec",
    "evaluate_claims", "get_preset", "reproduce",
]
