"""Reproduction presets as typed configs (DESIGN.md: "experiments are data").

A :class:`Preset` names the models of a figure or table (:class:`ModelSpec`: a label, a
registered mixer, its fixed config fields and the field that receives the swept state
expansion n), its scales (:class:`Scale`: the tasks, the grid over d_model × n × learning
rate × seed, the training settings) and the paper's claims (:class:`Claim`), which
:func:`evaluate_claims` checks against the results table.

Nothing here touches the mixer registry at import time: :meth:`Preset.check` (called by
:meth:`Preset.runs`) reports, at run time, every mixer of the preset that is not registered
and every config field a registered one does not have, in one ValueError.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from .._checks import read_json
from ..data import CorpusConfig, DataConfig, RunData
from ..mixers.base import config_error
from ..models import ModelConfig
from ..train import RunConfig, TrainConfig

#: np.logspace(-4, -2, 4): the LR grid of Zoology ICLR'24 and the DSF paper
LR_DSF = (1e-4, 4.6415888336127794e-4, 2.154434690031882e-3, 1e-2)
#: np.logspace(-5, -3, 4): MetaLA's extra grid at L = 512
LR_METALA_512 = (1e-5, 4.6415888336127795e-5, 2.1544346900318823e-4, 1e-3)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Frozen):
    """One model of a preset (a line of a figure, a row of a table)."""

    label: str = Field(description="name in tables and legends")
    mixer: str = Field(description="registered mixer name")
    mixer_kwargs: dict[str, Any] = Field(default_factory=dict, description="fixed mixer config fields")
    state_field: str | None = Field(None, description="the mixer config field that receives the swept n (None: n not used)")
    model: dict[str, Any] = Field(default_factory=dict, description="ModelConfig fields for this model (channel_mixer, hybrid, ...)")
    note: str = ""

    def layer_mixers(self) -> list[str]:
        """The mixer names this model uses: its mixer and those of its hybrid or pattern."""
        cycle = list(self.model.get("hybrid", []))
        if self.model.get("pattern"):
            from ..models.patterns import layer_pattern

            cycle = layer_pattern(self.model["pattern"], **self.model.get("pattern_kwargs", {}))
        return list(dict.fromkeys([self.mixer] + [h["mixer"] for h in cycle]))


class TaskModel(_Frozen):
    """One model's settings on one task (the per-task, per-model hyperparameters of the LRA
    papers: dsf note §5.2, MetaLA Table A4); each replaces the scale's value when set."""

    d_model: int | None = Field(None, gt=0, description="d for this model on this task (instead of the scale's d_models)")
    lr: float | None = Field(None, gt=0, description="learning rate (instead of the scale's lrs)")
    batch_size: int | None = Field(None, gt=0, description="training batch size (instead of the data's)")
    model: dict[str, Any] = Field(default_factory=dict, description="ModelConfig fields (n_layers, classifier, ...)")
    mixer_kwargs: dict[str, Any] = Field(default_factory=dict, description="mixer config fields")
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig fields")


class TaskSpec(_Frozen):
    name: str = Field(description="panel name, e.g. 'mqar(512,64)' or 'tinyshakespeare(char)'")
    data: RunData = Field(description="a synthetic task set or a text corpus (kind='corpus')")
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig fields for this task (epochs, ...)")
    lrs: list[float] | None = Field(None, min_length=1, description="learning rates of every model on this task, instead "
                                    "of the scale's lrs and lrs_by_model (a model's own lr in per_model still wins)")
    per_model: dict[str, TaskModel] = Field(default_factory=dict, description="model label -> its settings on this task")


class Scale(_Frozen):
    """One size of a preset: the grid and the training settings."""

    description: str = ""
    tasks: list[TaskSpec] = Field(min_length=1)
    d_models: list[int] = Field(min_length=1)
    ns: list[int | None] = Field(default_factory=lambda: [None], min_length=1)
    lrs: list[float] = Field(min_length=1)
    lrs_by_model: dict[str, list[float]] = Field(
        default_factory=dict, description="learning rates of particular models (by label) instead of lrs: a budget-sized "
        "stand-in for best-over-LR, each model at the rate that was best for it in a calibration sweep")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    lr_select: Literal["per_seed", "median"] = Field(
        "per_seed", description="best over the learning rates: each seed at its own best rate (per_seed: DSF Fig. 2 and "
        "Zoology sweep the rate of every run they report) or one rate per cell, best on the median over seeds (median)")
    lr_criterion: Literal["best", "final"] = Field(
        "best", description="which accuracy of a run chooses its rate: the best validation accuracy seen (best) or the "
        "last (final); the DSF paper says only 'best performing learning rate' (dsf note, ambiguity A22)")
    sweep_stop: bool = Field(
        False, description="run each cell's (model, task, d, n, seed) rates one after the other, in the order of lrs, and "
        "stop at the first whose run reaches the early-stop accuracy: the rates left could raise that seed's best by at "
        "most 1 − early_stop, and the budget goes to the cells still on a plateau")
    train: dict[str, Any] = Field(default_factory=dict, description="TrainConfig fields")
    model: dict[str, Any] = Field(default_factory=dict, description="ModelConfig fields shared by every model")
    workers: int = Field(1, gt=0, description="default number of worker processes")
    models: list[ModelSpec] | None = Field(
        None, description="this scale's versions of some of the preset's models (same labels), e.g. a longer window")
    budget: str = Field("", description="expected cost, e.g. '≈ 6 min on 2 CPU cores'")
    labels: list[str] | None = Field(None, description="the preset's models this scale runs (default: all)")


class Claim(_Frozen):
    """A claim of the paper, checked on the best-over-LR accuracies of each task panel.

    checks: ``at_least`` (a >= value), ``above`` (a > b + value), ``not_below``
    (a >= b − value), ``close`` (|a − b| <= value), ``increasing`` (a never drops by more
    than value along x), ``gap_shrinks`` (b − a at the largest x < b − a at the smallest x),
    ``not_dominated`` (a memory-budget claim: at each of a's points, no point of b with at most
    a's state size is more accurate by more than value);
    ``where``: at every x (all), at the largest x (max) or on the mean over x (mean).
    Language-modelling presets (``metric="bpb"``, lower is better) check validation bits
    per byte: ``below`` (a < b − value), ``not_above`` (a <= b + value: a is no worse than b
    by more than value) and ``closes_gap`` (a lies below b: it closes part of the gap from b
    down to c; the fraction closed, (b − a)/(b − c), is reported).

    With several seeds the claim is checked on the medians over seeds and on each seed's
    own table: it agrees when it holds on the medians and for a majority of the seeds.
    ``caveat`` says why it may not hold at this (CPU) size; it is shown beside a "does not
    agree" verdict.
    """

    text: str
    check: Literal["at_least", "above", "not_below", "close", "increasing", "gap_shrinks", "not_dominated", "below", "not_above",
                   "closes_gap"]
    a: str
    b: str | None = None
    c: str | None = Field(None, description="closes_gap: the better end of the gap (a closes part of the gap from b to c)")
    value: float = 0.0
    where: Literal["all", "max", "mean"] = "all"
    panel: str | None = Field(None, description="check only the task panels whose name starts with this (None: every panel)")
    caveat: str = Field("", description="why the claim may not hold at CPU size (shown when it does not agree)")


class Preset(_Frozen):
    name: str
    title: str
    source: str = Field(description="where in which paper")
    x: Literal["d_model", "n", "state_size", "task"] = "d_model"
    models: list[ModelSpec] = Field(min_length=1)
    extra_models: list[ModelSpec] = Field(
        default_factory=list, description="models beyond the paper's set (e.g. DeltaNet on MQAR): run only when named with --models")
    scales: dict[str, Scale]
    claims: list[Claim] = Field(default_factory=list)
    paper: str = Field("", description="the paper's numbers, as a markdown table, printed beside ours")
    metric: Literal["accuracy", "bpb"] = Field("accuracy", description="what the table and claims compare (bpb: language modelling)")
    notes: list[str] = Field(default_factory=list, description="choices where the paper is silent or ambiguous")

    # -- lookup ------------------------------------------------------------------------

    def scale(self, name: str) -> Scale:
        if name not in self.scales:
            raise ValueError(f"preset {self.name!r}: unknown scale {name!r}; expected one of {', '.join(self.scales)}")
        return self.scales[name]

    def select(self, labels: list[str] | None, scale: str | None = None) -> list[ModelSpec]:
        """The models (the paper's set, or those labelled, extras included), in the scale's version when it has its own."""
        models = {m.label: m for m in self.models}
        if scale is not None:
            models.update({m.label: m for m in self.scale(scale).models or []})
            if not labels and self.scale(scale).labels:
                labels = self.scale(scale).labels
        if not labels:
            return list(models.values())
        models.update({m.label: m for m in self.extra_models if m.label not in models})
        bad = [lab for lab in labels if lab not in models]
        if bad:
            raise ValueError(f"preset {self.name!r}: unknown model(s) {', '.join(bad)}; its models are {', '.join(models)}")
        return [m for m in models.values() if m.label in labels]

    def mixers(self) -> list[str]:
        """Every mixer name the preset uses, in its models and in its scales' versions of them."""
        names = []
        for m in [*self.models, *self.extra_models, *(m for sc in self.scales.values() for m in sc.models or [])]:
            for n in m.layer_mixers():
                if n not in names:
                    names.append(n)
        return names

    def missing_mixers(self, labels: list[str] | None = None, scale: str | None = None) -> list[str]:
        """Mixers of the (selected) models that are not registered now."""
        from ..mixers.base import _REGISTRY

        out = []
        for m in self.select(labels, scale):
            for n in m.layer_mixers():
                if n not in _REGISTRY and n not in out:
                    out.append(n)
        return out

    def check(self, scale: str, labels: list[str] | None = None) -> None:
        """Raises one ValueError listing every unregistered mixer and every mixer config field
        the preset sets that the registered mixer does not accept."""
        from ..mixers import mixer_entry

        sc = self.scale(scale)
        problems = []
        known = {m.label for m in [*self.models, *self.extra_models]}
        for lab in sc.lrs_by_model:
            if lab not in known:
                problems.append(f"lrs_by_model names {lab!r}, which is not a model of the preset ({', '.join(sorted(known))})")
        for m in sc.models or []:
            if m.label not in known:
                problems.append(f"scale {scale!r} has a model {m.label!r}, which is not a model of the preset")
        missing = self.missing_mixers(labels, scale)
        if missing:
            from ..mixers import list_mixers

            have = ", ".join(e.name for e in list_mixers())
            problems.append(
                f"{len(missing)} mixer(s) not registered: {', '.join(missing)} (registered: {have}); "
                "they come with their own issues, or run the others with --models / --skip-missing"
            )
        for m in self.select(labels, scale):
            if m.mixer in missing:
                continue
            entry = mixer_entry(m.mixer)
            fields = entry.cls.Config.model_fields
            if m.state_field is not None and (m.model.get("pattern") or m.model.get("hybrid")):
                problems.append(f"model {m.label!r}: state_field {m.state_field!r} sweeps mixer_kwargs, which a model "
                                "with a pattern or hybrid does not use")
                continue
            if m.state_field is not None and m.state_field not in fields:
                problems.append(f"model {m.label!r}: state_field {m.state_field!r} is not a config field of {m.mixer!r} "
                                f"(fields: {', '.join(fields)})")
                continue
            for n in sc.ns:
                kw = dict(m.mixer_kwargs)
                if n is not None and m.state_field:
                    kw[m.state_field] = n
                try:
                    entry.config(d_model=sc.d_models[0], **kw)
                except ValueError as e:
                    problems.append(f"model {m.label!r}: {e}")
                    break
        if problems:
            raise ValueError(f"preset {self.name!r} (scale {scale!r}) cannot run:\n  - " + "\n  - ".join(problems))

    # -- the grid ----------------------------------------------------------------------

    def experiment(self, scale: str) -> str:
        return f"{self.name}/{scale}"

    def runs(self, scale: str, labels: list[str] | None = None, *, skip_missing: bool = False) -> list[RunConfig]:
        """Every run of the grid (models × tasks × d × n × lr × seed), validated."""
        sc = self.scale(scale)
        if skip_missing:
            missing = set(self.missing_mixers(labels, scale))
            labels = [m.label for m in self.select(labels, scale)
                      if not set(m.layer_mixers()) & missing]
            if not labels:
                raise ValueError(f"preset {self.name!r}: none of its mixers is registered ({', '.join(sorted(missing))})")
        self.check(scale, labels)
        out = []
        for task in sc.tasks:
            for m in self.select(labels, scale):
                tm = task.per_model.get(m.label, TaskModel())
                data = task.data.model_copy(update={"batch_size": tm.batch_size}) if tm.batch_size else task.data
                for d in [tm.d_model] if tm.d_model else sc.d_models:
                    for n in sc.ns:
                        kw = {**m.mixer_kwargs, **tm.mixer_kwargs}
                        if n is not None and m.state_field:
                            kw[m.state_field] = n
                        for lr in [tm.lr] if tm.lr else (task.lrs or sc.lrs_by_model.get(m.label, sc.lrs)):
                            for seed in sc.seeds:
                                try:
                                    model = ModelConfig(**{**sc.model, **m.model, **tm.model, "mixer": m.mixer, "mixer_kwargs": kw,
                                                           "d_model": d})
                                    train = TrainConfig(**{**sc.train, **task.train, **tm.train, "lr": lr, "seed": seed})
                                    out.append(RunConfig(
                                        experiment=self.experiment(scale), label=m.label,
                                        tags={"task": task.name, "n": n if m.state_field else None},
                                        data=data, model=model, train=train))
                                except pydantic.ValidationError as e:
                                    raise config_error(f"preset {self.name!r} model {m.label!r}", e) from None
        seen, unique = set(), []
        for r in out:  # a model without a state field appears once, not once per n
            if r.run_id not in seen:
                seen.add(r.run_id)
                unique.append(r)
        return unique


def cell_key(c: RunConfig) -> tuple:
    """The cell of a run in a learning-rate sweep: (label, task, d_model, n, seed) — every rate of it shares the key."""
    return (c.label, c.tags.get("task"), c.model.d_model, c.tags.get("n"), c.train.seed)


def lr_waves(configs: list[RunConfig]) -> list[list[RunConfig]]:
    """The runs in waves for ``Scale.sweep_stop``: wave k holds the k-th rate (in the grid's
    order) of every cell (:func:`cell_key`); a cell with one rate is all in wave 0."""
    rank: dict[tuple, int] = defaultdict(int)
    waves: list[list[RunConfig]] = []
    for c in configs:
        k = rank[cell_key(c)]
        rank[cell_key(c)] += 1
        if k == len(waves):
            waves.append([])
        waves[k].append(c)
    return waves


def load_sweep(path, argument: str = "preset") -> tuple[list[RunConfig] | None, Preset | None]:
    """A sweep file (JSON): a list of RunConfigs -> (configs, None), or one Preset -> (None,
    preset). A missing, binary or malformed file, or an invalid entry: one ValueError naming
    ``argument`` (and the entry: ``[2].model.d_model``)."""
    from pathlib import Path

    from ..train.config import make_run_config

    what = "a JSON list of RunConfigs or a JSON preset"
    blob = read_json(path, argument, what)
    name = Path(path).name
    if isinstance(blob, list):
        if not blob:
            raise ValueError(f"argument {argument}: {name!r} is an empty list (expected at least one RunConfig)")
        configs = []
        for i, c in enumerate(blob):
            if not isinstance(c, dict):
                raise ValueError(f"argument {argument}: {name}[{i}] is a JSON {type(c).__name__}, expected an object "
                                 "(a RunConfig: data, model, train)")
            try:
                configs.append(make_run_config(**c))
            except ValueError as e:
                raise ValueError(f"argument {argument}: {name}[{i}]: {e}") from None
        return configs, None
    if not isinstance(blob, dict):
        raise ValueError(f"argument {argument}: {name!r} holds a JSON {type(blob).__name__}, expected {what}")
    try:
        return None, Preset(**blob)
    except pydantic.ValidationError as e:
        raise config_error(f"argument {argument}: {name} (a preset)", e) from None


# ------------------------------------------------------------------------------------------
# claims
# ------------------------------------------------------------------------------------------


def _series(rows: list[dict], label: str, x: str) -> dict:
    return {r[x]: r["accuracy"] for r in rows if r["label"] == label and r[x] is not None}


def _check_one(claim: Claim, rows: list[dict], x: str) -> tuple[str, str]:
    a = _series(rows, claim.a, x)
    b = _series(rows, claim.b, x) if claim.b else {}
    if not a or (claim.b and not b):
        return "n/a", "no results for " + (claim.a if not a else claim.b)
    pct = lambda v: f"{100 * v:.1f}"  # noqa: E731
    if claim.check == "increasing":
        xs = sorted(a)
        if len(xs) < 2:
            return "n/a", "needs two x values"
        drops = [(x0, x1) for x0, x1 in zip(xs, xs[1:]) if a[x1] < a[x0] - claim.value]
        detail = " → ".join(pct(a[v]) for v in xs)
        return ("agrees" if not drops else "does not agree"), f"{claim.a}: {detail}"
    if claim.check == "not_dominated":
        return _not_dominated(claim, rows)
    if claim.check == "gap_shrinks":
        xs = sorted(set(a) & set(b))
        if len(xs) < 2:
            return "n/a", "needs two x values"
        g0, g1 = b[xs[0]] - a[xs[0]], b[xs[-1]] - a[xs[-1]]
        return ("agrees" if g1 < g0 else "does not agree"), f"gap {pct(g0)} at {xs[0]} → {pct(g1)} at {xs[-1]}"
    xs = sorted(set(a) & set(b)) if claim.b else sorted(a)
    if claim.where == "max":
        xs = xs[-1:]
    if claim.where == "mean":
        va = {"mean": statistics.fmean(a[v] for v in xs)}
        vb = {"mean": statistics.fmean(b[v] for v in xs)} if claim.b else {}
        keys = ["mean"]
    else:
        va, vb, keys = a, b, xs
    ok = []
    for k in keys:
        if claim.check == "at_least":
            ok.append(va[k] >= claim.value)
        elif claim.check == "above":
            ok.append(va[k] > vb[k] + claim.value)
        elif claim.check == "not_below":
            ok.append(va[k] >= vb[k] - claim.value)
        elif claim.check == "close":
            ok.append(abs(va[k] - vb[k]) <= claim.value)
    if claim.b:
        detail = ", ".join(f"{k}: {pct(va[k])} vs {pct(vb[k])}" for k in keys)
    else:
        detail = ", ".join(f"{k}: {pct(va[k])}" for k in keys)
    return ("agrees" if all(ok) else "does not agree"), detail


def _not_dominated(claim: Claim, rows: list[dict]) -> tuple[str, str]:
    """a is never beaten (by more than claim.value) by a b configuration that uses no more state."""
    pa = [(r["state_size"], r["accuracy"]) for r in rows if r["label"] == claim.a and r.get("state_size") is not None]
    pb = [(r["state_size"], r["accuracy"]) for r in rows if r["label"] == claim.b and r.get("state_size") is not None]
    if not pa or not pb:
        return "n/a", "no results for " + (claim.a if not pa else claim.b)
    compared, beaten = 0, []
    for s_a, acc_a in sorted(pa):
        rivals = [acc for s_b, acc in pb if s_b <= s_a]
        if not rivals:
            continue
        compared += 1
        if max(rivals) > acc_a + claim.value:
            beaten.append(f"{claim.a} {100 * acc_a:.1f} at {s_a:,} floats < {claim.b} {100 * max(rivals):.1f}")
    if not compared:
        return "n/a", f"every {claim.b} point uses more state than every {claim.a} point"
    if beaten:
        return "does not agree", "; ".join(beaten)
    return "agrees", f"{compared} budget(s) compared, {claim.a} never below {claim.b} by more than {100 * claim.value:.1f}"


def check_lm_claim(claim: Claim, rows: list[dict]) -> tuple[str, str]:
    """(verdict, detail) of a bits-per-byte claim (lower is better) on ``rows`` ({"label", "bpb"} each): the check
    of a language-modelling preset's claims (one task's best-over-LR rows), and of seqmix.linearize's recipes."""
    bpb = {r["label"]: r["bpb"] for r in rows}
    need = [x for x in (claim.a, claim.b, claim.c) if x]
    if any(x not in bpb for x in need):
        return "n/a", "no results for " + ", ".join(x for x in need if x not in bpb)
    a, b = bpb[claim.a], bpb[claim.b]
    if claim.check == "below":
        return ("agrees" if a < b - claim.value else "does not agree"), f"{claim.a} {a:.4f} vs {claim.b} {b:.4f} bits/byte"
    if claim.check == "not_above":
        return (("agrees" if a <= b + claim.value else "does not agree"),
                f"{claim.a} {a:.4f} vs {claim.b} {b:.4f} bits/byte (tolerance {claim.value:g})")
    if claim.check == "closes_gap":
        c = bpb[claim.c]
        frac = (b - a) / (b - c) if b != c else float("nan")
        detail = (f"{claim.b} {b:.4f}, {claim.a} {a:.4f}, {claim.c} {c:.4f} bits/byte: {100 * frac:.0f}% of the gap closed"
                  if b > c else f"{claim.b} {b:.4f} is not above {claim.c} {c:.4f}: no gap; {claim.a} {a:.4f}")
        return ("agrees" if b > c and a < b else "does not agree"), detail
    return "n/a", f"check {claim.check!r} is not defined for bits per byte"


def evaluate_claims(preset: Preset, rows: list[dict]) -> list[dict]:
    """Each claim checked on each task panel of the best-over-LR rows: dicts with text, panel,
    verdict ("agrees", "does not agree", "n/a"), the numbers behind it (detail, on the medians
    over seeds), seeds_agree and seeds (in how many of the seeds' own tables it holds; 0 and 0
    with a single seed) and caveat (the claim's, when it does not agree).

    With several seeds a claim agrees when it holds on the medians and for a majority of the
    seeds (each seed's table at the learning rate chosen on the medians)."""
    from ..train.results import panels, seed_rows

    if preset.metric == "bpb":
        out = []
        for claim in preset.claims:
            for task in sorted({r["task"] for r in rows}):
                verdict, detail = check_lm_claim(claim, [r for r in rows if r["task"] == task])
                out.append({"text": claim.text, "panel": task, "verdict": verdict, "detail": detail, "seeds_agree": 0,
                            "seeds": 0, "caveat": claim.caveat if verdict == "does not agree" else ""})
        return out

    # state sizes differ between models: claims pair the models at the same d (not_dominated
    # compares state sizes itself)
    x = "d_model" if preset.x in ("task", "state_size") else preset.x
    by_seed = {s: panels(rs, x) for s, rs in seed_rows(rows).items()} if any(r.get("seeds", 1) > 1 for r in rows) else {}
    out = []
    for claim in preset.claims:
        for pname, prow in panels(rows, x).items():
            if claim.panel is not None and not pname.startswith(claim.panel):
                continue
            verdict, detail = _check_one(claim, prow, x)
            k = sum(_check_one(claim, p[pname], x)[0] == "agrees" for p in by_seed.values() if pname in p)
            if by_seed and verdict == "agrees" and 2 * k <= len(by_seed):
                verdict = "does not agree"
                detail += f"; holds on the medians but only for {k} of {len(by_seed)} seeds"
            checked = verdict != "n/a"
            out.append({"text": claim.text, "panel": pname, "verdict": verdict, "detail": detail,
                        "seeds_agree": k if checked else 0, "seeds": len(by_seed) if checked else 0,
                        "caveat": claim.caveat if verdict == "does not agree" else ""})
    return out
