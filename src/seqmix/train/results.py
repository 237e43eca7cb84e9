"""Tables and plots of the results store, as the papers report them.

* :func:`best_over_lr`: for each (experiment, label, task, d_model, n) the best over the
  learning rates — each seed at its own best rate (``select="per_seed"``, the papers'
  protocol) or one rate for all seeds (``"median"``) — and the median over seeds with its
  spread (the lowest and highest seed; mean and std too): "only the best LR is reported"
  (dsf note §5.1; Zoology's max over LRs). Each row keeps every seed's accuracy and chosen
  rate (``per_seed``, ``per_seed_lr``), so a claim can be checked seed by seed (:func:`seed_rows`);
* :func:`table`: one table per task (and per n when several), rows = models, columns =
  the x axis (d_model, n or state size), as markdown or CSV; a cell is the median and, with
  several seeds, the range over seeds: ``98.1 (97.3–99.0)``;
* :func:`plot`: one panel per task, the median accuracy against the x axis, one line per
  model, error bars from the lowest to the highest seed (matplotlib PNG).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from .._plotting import save_figure

X_AXES = ("d_model", "n", "state_size", "task")
_X_LABEL = {"d_model": "model dimension d", "n": "state expansion n", "state_size": "state size (floats per sequence)", "task": "task"}


#: how a cell's learning rate is chosen (:func:`best_over_lr`)
LR_SELECTIONS = ("per_seed", "median")
#: which accuracy of a run chooses the rate (the DSF note's ambiguity A22)
LR_CRITERIA = ("best", "final")


def _summary(accs: list[float]) -> dict:
    return {"accuracy": statistics.median(accs), "lo": min(accs), "hi": max(accs), "mean": statistics.fmean(accs),
            "std": statistics.pstdev(accs) if len(accs) > 1 else 0.0, "seeds": len(accs)}


def best_over_lr(rows: Iterable[dict], *, all_lrs: bool = False, select: str = "median", criterion: str = "best") -> list[dict]:
    """The best-over-learning-rate accuracy of each cell (experiment, label, task, d_model, n),
    as the papers report it: "only the best LR is reported" (dsf note §5.1; Zoology).

    ``select``: ``"per_seed"`` — each seed takes the rate that was best for it (DSF Fig. 2 and
    Zoology sweep the rate for every run they report: a model at a phase transition gets every
    rate of the grid, in every seed); ``"median"`` — one rate for the cell, the one whose
    median over seeds is best (ties: the best mean). ``criterion``: which accuracy of a run
    chooses its rate — ``"best"`` (the best validation accuracy seen during training, what
    early stopping keeps) or ``"final"`` (the last evaluation). The DSF paper says only "best
    performing learning rate" (its note's ambiguity A22); with early stopping at 99% the two
    differ only for runs that rose and fell again. Rate ties go to the smaller rate.

    Each output row has accuracy (the median over seeds of each seed's accuracy at its chosen
    rate, measured by ``criterion``), lo and hi (lowest and highest seed), mean, std, seeds,
    per_seed ({seed: accuracy}), lr (with ``per_seed``: the rate chosen by most seeds, ties to
    the smaller), per_seed_lr ({seed: chosen rate}), lrs (the rates tried), state_size,
    wall_time (summed over every run of the cell: the whole sweep's cost), epochs (mean over
    the chosen runs). ``all_lrs``: one row per rate instead (the rate joins the label)."""
    if select not in LR_SELECTIONS:
        raise ValueError(f"best_over_lr: unknown select {select!r}; expected one of {', '.join(LR_SELECTIONS)}")
    if criterion not in LR_CRITERIA:
        raise ValueError(f"best_over_lr: unknown criterion {criterion!r}; expected one of {', '.join(LR_CRITERIA)}")
    key_acc = "accuracy" if criterion == "best" else "final_accuracy"

    def acc(x: dict) -> float:
        v = x.get(key_acc)
        return x["accuracy"] if v is None else v

    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("status") != "finished" or is_lm_row(r):  # LM runs: best_lm_over_lr
            continue
        groups[(r["experiment"], r["label"], r["task"], r["d_model"], r["n"], r["lr"])].append(r)

    def base(rs: list[dict], exp, label, task, d, n) -> dict:
        return {"experiment": exp, "label": label, "task": task, "d_model": d, "n": n, "state_size": rs[0]["state_size"],
                "params": rs[0]["params"], "mixer": rs[0]["mixer"]}

    per_lr = []
    for (exp, label, task, d, n, lr), rs in groups.items():
        per_lr.append({
            **base(rs, exp, label, task, d, n), "lr": lr, **_summary([acc(x) for x in rs]),
            "per_seed": {x.get("seed", i): acc(x) for i, x in enumerate(rs)},
            "per_seed_lr": {x.get("seed", i): lr for i, x in enumerate(rs)}, "lrs": [lr],
            "epochs": statistics.fmean(x["epochs"] for x in rs), "wall_time": sum(x["wall_time"] for x in rs),
        })
    if all_lrs:  # one row per learning rate: the lr joins the model's name
        for r in per_lr:
            r["label"] = f"{r['label']} lr={r['lr']:.2g}"
        return sorted(per_lr, key=_order)
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in per_lr:
        cells[(r["experiment"], r["label"], r["task"], r["d_model"], r["n"])].append(r)
    best = []
    for key, rs in cells.items():
        rs.sort(key=lambda r: r["lr"])
        lrs = [r["lr"] for r in rs]
        wall = sum(r["wall_time"] for r in rs)
        if select == "median":
            top = max(rs, key=lambda r: (r["accuracy"], r["mean"], -r["lr"]))
            best.append({**top, "lrs": lrs, "wall_time": wall})
            continue
        runs = [x for x in _cell_runs(groups, key, lrs)]
        chosen: dict = {}
        for x in runs:  # by rate, ascending: a later rate replaces only a strictly better one
            s = x.get("seed", 0)
            if s not in chosen or acc(x) > acc(chosen[s]):
                chosen[s] = x
        seeds = sorted(chosen)
        votes = [chosen[s]["lr"] for s in seeds]
        lr = max(sorted(set(votes)), key=votes.count)
        best.append({
            **base(runs, *key), "lr": lr, **_summary([acc(chosen[s]) for s in seeds]),
            "per_seed": {s: acc(chosen[s]) for s in seeds}, "per_seed_lr": {s: chosen[s]["lr"] for s in seeds},
            "lrs": lrs, "epochs": statistics.fmean(chosen[s]["epochs"] for s in seeds), "wall_time": wall,
        })
    return sorted(best, key=_order)


def _cell_runs(groups: dict, key: tuple, lrs: list[float]) -> list[dict]:
    """The runs of one cell, rate by rate (ascending)."""
    return [x for lr in lrs for x in groups[(*key, lr)]]


def _order(r):
    return (r["experiment"], r["task"], r["label"], r["d_model"], r["n"] if r["n"] is not None else -1, r["lr"])


def _fmt_x(v) -> str:
    return "-" if v is None else f"{v:,}" if isinstance(v, int) and v >= 10_000 else str(v)


def _cell(r: dict) -> str:
    """The median (%), and with several seeds the range over them: '98.1 (97.3–99.0)'."""
    s = f"{100 * r['accuracy']:.1f}"
    if r.get("seeds", 1) > 1 and "lo" in r:
        s += f" ({100 * r['lo']:.1f}–{100 * r['hi']:.1f})"
    return s


def _lr_note(r: dict) -> str:
    """The chosen learning rate of a cell: '2.2e-03', or one per seed where they differ: '0.01 · 0.0022 · 0.01'."""
    per = r.get("per_seed_lr") or {}
    lrs = [per[s] for s in sorted(per)]
    return f"{r['lr']:.2g}" if len(set(lrs)) <= 1 else " · ".join(f"{v:.2g}" for v in lrs)


def seed_rows(rows: list[dict]) -> dict[int, list[dict]]:
    """The best-over-LR rows seen one seed at a time: {seed: rows with that seed's accuracy}
    (each at the rate :func:`best_over_lr` chose for that seed). Only seeds every row has."""
    seeds = None
    for r in rows:
        have = set(r.get("per_seed", {}))
        seeds = have if seeds is None else seeds & have
    return {s: [{**r, "accuracy": r["per_seed"][s], "lr": r.get("per_seed_lr", {}).get(s, r["lr"]), "seeds": 1} for r in rows]
            for s in sorted(seeds or ())}


def panels(rows: list[dict], x: str) -> dict[str, list[dict]]:
    """Rows split into panels: one per task (and per n when x is not n and several n exist)."""
    out: dict[str, list[dict]] = defaultdict(list)
    ns = sorted({r["n"] for r in rows if r["n"] is not None})
    split_n = x != "n" and len(ns) > 1
    ds = {q["d_model"] for q in rows}
    for r in rows:
        # a model without a state expansion (n = None) belongs to every n panel
        for n in (ns if split_n and r["n"] is None else [r["n"]]):
            if x == "task":  # one panel per (d, n): the tasks are the columns
                key = f"d={r['d_model']}" + (f", n={n}" if split_n else "")
            else:
                key = r["task"] + (f", n={n}" if split_n else "")
                if x != "d_model" and len(ds) > 1:
                    key += f", d={r['d_model']}"
            out[key].append(r)
    return dict(out)


def table(rows: list[dict], *, x: str = "d_model", fmt: str = "markdown", order: list[str] | None = None) -> str:
    """Accuracy (%) tables, one per panel: rows = models, columns = values of ``x``."""
    if x not in X_AXES:
        raise ValueError(f"results: unknown x axis {x!r}; expected one of {', '.join(X_AXES)}")
    if fmt == "csv":
        cols = ["experiment", "task", "label", "mixer", "d_model", "n", "lr", "accuracy", "lo", "hi", "mean", "std", "seeds", "state_size", "params", "epochs", "wall_time"]
        lines = [",".join(cols)]
        for r in rows:
            lines.append(",".join("" if r.get(c) is None else f"{r[c]:.6g}" if isinstance(r.get(c), float) else str(r[c]) for c in cols))
        return "\n".join(lines)
    if fmt != "markdown":
        raise ValueError(f"results: unknown format {fmt!r}; expected 'markdown' or 'csv'")
    out = []
    for title, rs in panels(rows, x).items():
        xs = sorted({r[x] for r in rs if r[x] is not None})
        labels = _labels(rs, order)
        lrs_shown = len({r["lr"] for r in rs}) > 1 or any(len(r.get("lrs", ())) > 1 for r in rs)
        spread = any(r.get("seeds", 1) > 1 for r in rs)
        seeds = max((r.get("seeds", 1) for r in rs), default=1)
        out.append(f"**{title}** — accuracy (%), best over learning rates" + (" (the chosen lr in brackets: one per seed where they differ)" if lrs_shown else "")
                   + (f"; median over {seeds} seeds (lowest–highest)" if spread else ""))
        out.append("")
        out.append(f"| model | " + " | ".join(f"{x}={_fmt_x(v)}" for v in xs) + " |")
        out.append("|---|" + "---|" * len(xs))
        for lab in labels:
            by_x = {r[x]: r for r in rs if r["label"] == lab}
            cells = []
            for v in xs:
                r = by_x.get(v)
                cells.append("" if r is None else _cell(r) + (f" [{_lr_note(r)}]" if lrs_shown else ""))
            out.append(f"| {lab} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _labels(rows, order):
    seen = []
    for r in rows:
        if r["label"] not in seen:
            seen.append(r["label"])
    if order:
        seen.sort(key=lambda lab: order.index(lab) if lab in order else len(order))
    return seen


def plot(rows: list[dict], path: str | Path, *, x: str = "d_model", title: str = "", order: list[str] | None = None) -> Path:
    """One panel per task: the median accuracy against ``x`` (log2 axis), a line per model,
    error bars from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    if x not in X_AXES:
        raise ValueError(f"results: unknown x axis {x!r}; expected one of {', '.join(X_AXES)}")
    groups = panels(rows, x)
    k = max(1, len(groups))
    fig, axes = plt.subplots(1, k, figsize=(max(6.0, 4.2 * k) if x != "task" else 7 * k, 4.0), squeeze=False)
    for ax, (ptitle, rs) in zip(axes[0], groups.items()):
        if x == "task":  # grouped bars: tasks on the x axis, one bar per model
            tasks = sorted({r["task"] for r in rs})
            labs = _labels(rs, order)
            w = 0.8 / max(1, len(labs))
            for j, lab in enumerate(labs):
                by = {r["task"]: r for r in rs if r["label"] == lab}
                med = [100 * by[t]["accuracy"] if t in by else 0 for t in tasks]
                err = [[100 * (by[t]["accuracy"] - by[t].get("lo", by[t]["accuracy"])) if t in by else 0 for t in tasks],
                       [100 * (by[t].get("hi", by[t]["accuracy"]) - by[t]["accuracy"]) if t in by else 0 for t in tasks]]
                ax.bar([i + j * w for i in range(len(tasks))], med, w, yerr=err, capsize=2, label=lab)
            ax.set_xticks([i + 0.4 - w / 2 for i in range(len(tasks))])
            ax.set_xticklabels(tasks, fontsize=7, rotation=15)
            ax.set_ylim(0, 102)
            ax.set_title(ptitle, fontsize=10)
            ax.set_ylabel("accuracy (%)")
            ax.grid(alpha=0.3, axis="y")
            continue
        labs = _labels(rs, order)
        for j, lab in enumerate(labs):
            pts = sorted((r[x], r["accuracy"], r.get("lo", r["accuracy"]), r.get("hi", r["accuracy"]))
                         for r in rs if r["label"] == lab and r[x] is not None)
            if not pts:
                continue
            xs, ys, los, his = zip(*pts)
            # each model shifted a few points sideways so that error bars at the same x stay apart
            shift = offset_copy(ax.transData, fig=fig, x=4.0 * (j - (len(labs) - 1) / 2), y=0.0, units="points")
            ax.errorbar(xs, [100 * y for y in ys], yerr=[[100 * (y - lo) for y, lo in zip(ys, los)],
                                                         [100 * (hi - y) for y, hi in zip(ys, his)]],
                        marker="o", capsize=3, label=lab, transform=shift)
        xs_all = sorted({r[x] for r in rs if r[x] is not None})
        log = bool(xs_all) and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 4
        if log:
            ax.set_xscale("log", base=2)
        if xs_all:  # limits from the data with room for the sideways shifts (autoscaling ignores them)
            lo, hi = xs_all[0], xs_all[-1]
            if log:
                pad = (hi / lo) ** 0.08
                ax.set_xlim(lo / pad, hi * pad)
            else:
                pad = 0.08 * (hi - lo) or max(0.1 * abs(lo), 1.0)
                ax.set_xlim(lo - pad, hi + pad)
        if xs_all and x != "state_size":
            ax.set_xticks(xs_all)
            ax.set_xticklabels([str(v) for v in xs_all])
        ax.set_ylim(-2, 102)
        ax.set_title(ptitle, fontsize=10)
        ax.set_xlabel(_X_LABEL[x])
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, path, title=title, argument="--plot")


def is_lm_row(r: dict) -> bool:
    """A language-modelling run (it has a validation bits-per-byte)."""
    return r.get("bpb") is not None


def best_lm_over_lr(rows: Iterable[dict], *, all_lrs: bool = False) -> list[dict]:
    """Language-modelling rows grouped by (experiment, label, task, d_model[, lr]): the lr with
    the lowest mean validation bits per byte over seeds, with ppl, bpb (means), std of bpb,
    seeds, tokens/s and tokens."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("status") == "finished" and is_lm_row(r):
            groups[(r["experiment"], r["label"], r["task"], r["d_model"], r["lr"])].append(r)
    per_lr = []
    for (exp, label, task, d, lr), rs in groups.items():
        bpbs = [x["bpb"] for x in rs]
        per_lr.append({
            "experiment": exp, "label": label, "task": task, "d_model": d, "lr": lr, "mixer": rs[0]["mixer"],
            "bpb": statistics.fmean(bpbs), "bpb_std": statistics.pstdev(bpbs) if len(bpbs) > 1 else 0.0,
            "ppl": statistics.fmean(x["ppl"] for x in rs), "seeds": len(rs), "params": rs[0]["params"],
            "tokens": rs[0]["tokens"], "tokens_per_s": statistics.fmean(x["tokens_per_s"] for x in rs),
            "wall_time": sum(x["wall_time"] for x in rs), "state_size": rs[0]["state_size"],
        })
    if all_lrs:
        return sorted(per_lr, key=lambda r: (r["experiment"], r["task"], r["label"], r["d_model"], r["lr"]))
    best: dict[tuple, dict] = {}
    for r in per_lr:
        k = (r["experiment"], r["label"], r["task"], r["d_model"])
        if k not in best or r["bpb"] < best[k]["bpb"]:
            best[k] = r
    return sorted(best.values(), key=lambda r: (r["experiment"], r["task"], r["d_model"], r["bpb"]))


def lm_table(rows: list[dict], *, fmt: str = "markdown", order: list[str] | None = None) -> str:
    """Language-modelling runs (rows of :func:`best_lm_over_lr`): validation perplexity, bits
    per byte, tokens trained, tokens/s, one table per task (corpus and tokenizer)."""
    cols = ["label", "d_model", "lr", "ppl", "bpb", "bpb_std", "seeds", "tokens", "tokens_per_s", "params", "wall_time"]
    if fmt == "csv":
        lines = [",".join(["experiment", "task", "mixer", *cols])]
        for r in rows:
            lines.append(",".join(f"{r[c]:.6g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in ["experiment", "task", "mixer", *cols]))
        return "\n".join(lines)
    if fmt != "markdown":
        raise ValueError(f"results: unknown format {fmt!r}; expected 'markdown' or 'csv'")
    out = []
    for task in sorted({r["task"] for r in rows}):
        rs = [r for r in rows if r["task"] == task]
        if order:
            rs.sort(key=lambda r: order.index(r["label"]) if r["label"] in order else len(order))
        out += [f"**{task}** — validation, best over learning rates", "",
                "| model | d | lr | ppl | bits/byte | tokens | tokens/s | params | time |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            bpb = f"{r['bpb']:.4f}" + (f" ± {r['bpb_std']:.4f}" if r["seeds"] > 1 else "")
            out.append(f"| {r['label']} | {r['d_model']} | {r['lr']:.2g} | {r['ppl']:.3f} | {bpb} | {r['tokens']:,} | "
                       f"{r['tokens_per_s']:,.0f} | {r['params']:,} | {r['wall_time']:.0f}s |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def lm_plot(rows: list[dict], path: str | Path, *, title: str = "", order: list[str] | None = None) -> Path:
    """Validation bits per byte, one bar per model (and task), seed std as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(5.0, 0.9 * len(rows) + 2), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rs = [r for r in rows if r["task"] == task]
        if order:
            rs.sort(key=lambda r: order.index(r["label"]) if r["label"] in order else len(order))
        ax.bar(range(len(rs)), [r["bpb"] for r in rs], yerr=[r["bpb_std"] for r in rs], color=[f"C{i}" for i in range(len(rs))])
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels([r["label"] for r in rs], fontsize=8, rotation=20)
        lo = min(r["bpb"] for r in rs)
        ax.set_ylim(lo * 0.9, max(r["bpb"] for r in rs) * 1.03)
        ax.set_ylabel("validation bits per byte (lower is better)")
        ax.set_title(task, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path, title=title, argument="--plot")


__all__ = ["X_AXES", "best_lm_over_lr", "best_over_lr", "is_lm_row", "lm_plot", "lm_table", "panels", "plot", "seed_rows", "table"]
