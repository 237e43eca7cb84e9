"""Linearization bench: the gap each student and each recipe closes on the bench teacher (bench/linearize_teacher.py).

    python bench/linearize_teacher.py --out runs/lin_teacher --tokens 1200000 --threads 1
    python bench/linearize.py --teacher runs/lin_teacher --out runs/lin_bench --threads 1              # every student
    python bench/linearize.py --teacher runs/lin_teacher --out runs/lin_bench --recipes --threads 1    # every recipe
    python bench/linearize.py --teacher runs/lin_teacher --out runs/lin_bench --table                  # the tables only

Two kinds of case, each ``seqmix.linearize.run`` (what `seqmix linearize` runs) against the same architecture
trained from scratch on the same tokens:

* a student (``gla``, ``gated_deltanet``, ...: ``STUDENTS``) under a recipe (``--recipe``, default the command's
  default: seqmix.linearize.recipes.DEFAULT_RECIPE), the recipe's student replaced by it — the command's
  defaults with ``--mixer NAME``. Variants: ``hybrid:NAME`` (``auto:1``: one softmax layer kept, the largest
  stage-1 residual), ``uniform1:NAME`` (``uniform:1``: the last layer kept), ``transfer_only:NAME``,
  ``finetune_only:NAME`` (init random, no stage 1), ``phi:NAME`` (stage 1 on Φ). The method flags below
  (``--kd`` etc.) override the recipe for these cases; by default they are the recipe's (one source).
* a recipe (``recipe:lolcats``, or ``recipe:lolcats:no_transfer`` for one of its ablations), as the recipe
  sets it (its own student); ``--recipes`` runs every recipe and its ablations and checks the papers' claims
  (seqmix.experiments' Claim on validation bits per byte).

The budget is ``--budget-frac`` of the teacher's training tokens, split between the stages by the recipe's
``transfer_share`` (``--transfer-frac`` overrides it for the student cases). On held-out text (the validation
windows, the same for all): G = (L_scratch − L_student) / (L_scratch − L_teacher), L_scratch the best of an
lr × init sweep of the same architecture trained from scratch (``scratch_loss``; ablations of a recipe are
compared by their claims, without a baseline of their own unless ``--ablation-baselines``). Each run also
evaluates the teacher and the final model per band of positions on windows 16× the training window (the
length table).

Targets: every student G > 0; the best pure student (no softmax layer kept, a decoding state constant in the
context: a sliding window counts only when bounded) G >= 0.8 at a 10% budget, G >= 0.9 at 1% or less; the
one-softmax-layer hybrid G >= 0.9. Each case's result is stored in OUT/results/<case>.json as it finishes (a
re-run skips finished cases; several processes can split the cases with --cases); the tables print every
stored case. Only measured numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

#: the students: name -> (mixer, mixer config)
STUDENTS = {
    "linear_attention(hedgehog)": ("linear_attention", {"feature_map": "hedgehog"}),
    "retnet": ("retnet", {}),
    "gla": ("gla", {}),
    "mamba2": ("mamba2", {}),
    "gated_deltanet": ("gated_deltanet", {}),
    # the default recipe's student: LoLCATs attention started at its 64-token window
    "lolcats(window 64)": ("lolcats", {"window": 64, "window_factor": 0.99, "affine_window_factor": True}),
    # B'MOJO-F's own Mamba at a small size (expand 1, d_state 4, chunked scan): its default recurrent scan is
    # ~50x slower on the CPU, too slow for this bench's budget
    "bmojo_f(window 32)": ("bmojo_f", {"window": 32, "ssm_mode": "chunk", "expand": 1, "d_state": 4}),
}
#: the student cases of docs/linearize.md's table: the students, the hybrids (auto:1) and the ablations on GLA
DEFAULT_CASES = list(STUDENTS) + ["hybrid:lolcats(window 64)", "hybrid:gla", "hybrid:gated_deltanet", "uniform1:gla",
                                  "transfer_only:gla", "finetune_only:gla", "phi:gla"]
#: the student cases of a budget's targets alone (the default's student and its one-softmax hybrid; Gated DeltaNet's,
#: the best student without a window): --cases targets
TARGET_CASES = ["lolcats(window 64)", "hybrid:lolcats(window 64)", "gated_deltanet", "hybrid:gated_deltanet"]
#: the students that keep a sliding window of softmax attention (a bounded KV cache beside or inside their recurrence)
WINDOWED = {"lolcats", "liger_attention", "sliding_window_attention", "bmojo", "bmojo_f"}
#: the method flags of the student cases (None: the recipe's value) -> LinearizeConfig field
METHOD_FLAGS = {"transfer_lr": "transfer_lr", "finetune_lr": "finetune_lr", "kd": "kd", "lora_rank": "lora_rank",
                "transfer_trainable": "transfer_trainable", "transfer_frac": "transfer_share", "group_kv": "group_kv"}
#: method fields added after results were stored: a stored result without one was measured at this value
LATER_FIELDS = {"group_kv": False}
#: the stage-1 lr written into every from-scratch run's config (they have no stage 1: a constant, so that the
#: runs' settings keys do not depend on the recipe's)
SCRATCH_TRANSFER_LR = 3e-3


def _teacher_info(folder: Path) -> dict:
    return json.loads((folder / "teacher.json").read_text())


def _n_layers(teacher_dir: Path) -> int:
    return json.loads((teacher_dir / "model" / "config.json").read_text())["num_hidden_layers"]


def _scratch_base(teacher_dir: Path, out: Path) -> Path:
    """A random model of the teacher's architecture (the same config, seed 1), saved once."""
    base = out / "scratch_base"
    if not (base / "config.json").is_file():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(teacher_dir / "model"), local_files_only=True)
        torch.manual_seed(1)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(str(base))
    return base


def _slug(case: str) -> str:
    """A file name for a case ("hybrid:gla" -> "hybrid_gla", "bmojo_f(window 32)" -> "bmojo_f_window_32")."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in case).strip("_").replace("__", "_")


def parse_case(case: str) -> tuple[str, str, str | None]:
    """(kind, name, ablation): ("student", "gla", None), ("hybrid", "gla", None), ("recipe", "lolcats", "no_transfer")."""
    from seqmix.linearize.recipes import RECIPES

    if case.startswith("recipe:"):
        name, _, abl = case[len("recipe:"):].partition(":")
        if name not in RECIPES:
            raise SystemExit(f"bench/linearize.py: unknown recipe {name!r} in case {case!r} (recipes: {', '.join(RECIPES)})")
        if abl and abl not in RECIPES[name].ablations:
            raise SystemExit(f"bench/linearize.py: recipe {name!r} has no ablation {abl!r} (its ablations: "
                             f"{', '.join(RECIPES[name].ablations) or 'none'})")
        return "recipe", name, abl or None
    kind, _, name = case.rpartition(":")
    if name not in STUDENTS:
        raise SystemExit(f"bench/linearize.py: unknown student {name!r} in case {case!r} (students: {', '.join(STUDENTS)})")
    if kind not in ("", "hybrid", "uniform1", "transfer_only", "finetune_only", "phi"):
        raise SystemExit(f"bench/linearize.py: unknown case kind {kind!r} in {case!r}")
    return kind or "student", name, None


def recipe_cases(names: list[str]) -> list[str]:
    """Every recipe of ``names`` and each of its ablations, as case names."""
    from seqmix.linearize.recipes import RECIPES

    return [c for n in names for c in [f"recipe:{n}"] + [f"recipe:{n}:{a}" for a in RECIPES[n].ablations]]


def method(case: str, a) -> dict:
    """The LinearizeConfig method fields of a case (a recipe's, with the case's changes on top)."""
    from seqmix.linearize.recipes import recipe_settings

    kind, name, abl = parse_case(case)
    if kind == "recipe":
        from seqmix.linearize.recipes import RECIPES

        return {"recipe": name, **recipe_settings(name, RECIPES[name].ablations[abl] if abl else {})}
    mixer, mcfg = STUDENTS[name]
    flags = {field: getattr(a, flag) for flag, field in METHOD_FLAGS.items() if getattr(a, flag, None) is not None}
    change = {"hybrid": {"layers": "auto:1"}, "uniform1": {"layers": "uniform:1"}, "transfer_only": {"stages": ("transfer",)},
              "finetune_only": {"stages": ("finetune",), "init": "random"}, "phi": {"match": "phi"}}.get(kind, {})
    return {"recipe": a.recipe, **recipe_settings(a.recipe, {"mixer": mixer, "mixer_config": mcfg, **flags, **change})}


def _common(a) -> dict:
    """The LinearizeConfig fields every run shares (data, evaluation, threads)."""
    return dict(corpus="tinyshakespeare", tokenizer="byte", seq_len=a.seq_len, batch_size=a.batch_size,
                eval_batches=a.eval_batches, threads=a.threads)


def _scratch_lrs(spec: str) -> list[float]:
    try:
        lrs = sorted({float(v) for v in spec.split(",") if v.strip()})
    except ValueError:
        lrs = []
    if not lrs or lrs[0] <= 0:
        raise SystemExit(f"bench/linearize.py: argument --scratch-lrs: expected comma-separated learning rates > 0, got {spec!r}")
    return lrs


def arch_label(mixer: str, mixer_config: dict) -> str:
    """The from-scratch runs' name of an architecture: the bench's student label, or the mixer and its config."""
    for label, (m, c) in STUDENTS.items():
        if (m, c) == (mixer, mixer_config):
            return label
    return mixer + "".join(f"_{k}{v}" for k, v in sorted(mixer_config.items()))


def scratch_loss(mixer: str, mixer_config: dict, kept: list[int], n_layers: int, budget: int, a, teacher_dir: Path,
                 out: Path) -> dict:
    """L_scratch: the same architecture (softmax kept where the linearized one kept it; one k and v per head, as a
    model built from scratch has them: a student that keeps its teacher's kv heads has fewer weights, so its baseline
    is no weaker) from a random init
    on the same tokens, next-token loss only, every weight trained, the best of a sweep — one rule for every
    scratch run: for each init of ``--scratch-inits`` ("random": the students' own init; "random_hf": their
    Linear weights drawn as transformers draws the host model's, normal(0, 0.02)), each lr of ``--scratch-lrs``,
    the lr grid grown by a factor 3 on the side of the best while the best is at its edge (at most twice).
    Returns {"loss", "lr", "init", "sweep": {"init lr": loss}}."""
    from seqmix.linearize.pipeline import LinearizeConfig, run

    scratch_layers = ",".join(str(i) for i in range(n_layers) if i not in kept) if kept else "all"
    scratch_dir = Path(a.scratch_dir) if a.scratch_dir else out / "runs"
    base = _scratch_base(teacher_dir, scratch_dir.parent)
    name = _slug(arch_label(mixer, mixer_config)) + (f"_softmax{'-'.join(map(str, kept))}" if kept else "") + "_scratch"
    tag = "" if abs(budget - a.default_budget) < 1 else f"_tok{budget}"
    sweep: dict[tuple[str, float], float] = {}

    def one(init: str, lr: float) -> None:
        if (init, lr) in sweep:
            return
        cfg = LinearizeConfig(hf=str(base), mixer=mixer, mixer_config=mixer_config, layers=scratch_layers, init=init,
                              stages=("finetune",), tokens=budget, transfer_tokens=0, finetune_tokens=budget, match="output",
                              transfer_split=None, transfer_trainable="all", transfer_lr=SCRATCH_TRANSFER_LR, finetune_lr=lr,
                              kd=0.0, ce=1.0, lora_rank=0, lora_targets="kept", finetune_trainable="all", length_multiples=(),
                              group_kv=False,
                              out=str(scratch_dir / f"{name}{'_hfinit' if init == 'random_hf' else ''}{tag}_lr{lr:g}"),
                              **_common(a))
        stored = Path(cfg.out) / "metrics.json"  # a finished run of the same settings: its measured loss, not run again
        blob = json.loads(stored.read_text()) if stored.is_file() else None
        same = blob is not None and LinearizeConfig(**{**LATER_FIELDS, **blob["config"]}).stage_key("finetune") == cfg.stage_key("finetune")
        res = blob if same else run(cfg, progress=False)
        sweep[init, lr] = res["stages"]["finetune"]["eval"]["loss"]
        print(f"  scratch {name} init {init} lr {lr:g}: {sweep[init, lr]:.4f}", flush=True)

    for init in [v.strip() for v in a.scratch_inits.split(",") if v.strip()]:
        for lr in _scratch_lrs(a.scratch_lrs):
            one(init, lr)
        for _ in range(2):
            lrs = {lr: v for (i, lr), v in sweep.items() if i == init}
            best = min(lrs, key=lrs.get)
            if best == min(lrs):
                one(init, float(f"{best / 3:.3g}"))
            elif best == max(lrs):
                one(init, float(f"{best * 3:.3g}"))
            else:
                break
    init, lr = min(sweep, key=sweep.get)
    return {"loss": sweep[init, lr], "lr": lr, "init": init,
            "sweep": {f"{i} {l:g}": v for (i, l), v in sorted(sweep.items())}}


def _needs_baseline(case: str, a) -> bool:
    kind, _, abl = parse_case(case)
    return not (kind == "recipe" and abl and not a.ablation_baselines)


def with_baseline(r: dict, scratch: dict | None) -> dict:
    """A case's result with its from-scratch baseline and G (None without a baseline)."""
    if scratch is None:
        return {**r, "L_scratch": None, "G": None}
    return {**r, "L_scratch": scratch["loss"], "scratch_lr": scratch["lr"], "scratch_init": scratch["init"],
            "scratch_sweep": scratch["sweep"], "G": (scratch["loss"] - r["L_student"]) / (scratch["loss"] - r["L_teacher"])}


def run_case(case: str, a, teacher_dir: Path, out: Path) -> dict:
    from seqmix.linearize.pipeline import LinearizeConfig, run

    kind, name, abl = parse_case(case)
    fields = method(case, a)
    budget = int(a.budget_frac * _teacher_info(teacher_dir)["tokens"])
    cfg = LinearizeConfig(hf=str(teacher_dir / "model"), tokens=budget, out=str(out / "runs" / _slug(case)), **fields, **_common(a))
    t0 = time.perf_counter()
    lin = run(cfg, progress=False)
    last = lin["stages"][lin["final_stage"]]
    kept = lin["kept_softmax"]
    state = last["state"]
    res = {"case": case, "kind": kind, "student": name, "ablation": abl, "recipe": fields["recipe"], "mixer": cfg.mixer,
           "mixer_config": cfg.mixer_config, "method": {k: v for k, v in cfg.model_dump(mode="json").items() if k in fields},
           "kept_softmax": kept, "tokens": budget, "transfer_tokens": cfg.transfer_tokens, "finetune_tokens": cfg.finetune_tokens,
           "L_teacher": lin["teacher"]["loss"], "bpb_teacher": lin["teacher"]["bpb"], "L_student": last["eval"]["loss"],
           "bpb_student": last["eval"]["bpb"], "L_after_transfer": lin["stages"].get("transfer", {}).get("eval", {}).get("loss"),
           "state_floats": state, "teacher_state": lin["teacher"]["state"],
           "pure": not kept and state["kv_floats_per_token"] == 0, "length": lin.get("length", {}), "recall": lin.get("recall", {}),
           "seconds": time.perf_counter() - t0, "settings": settings_of(a)}
    scratch = None
    if _needs_baseline(case, a):
        scratch = scratch_loss(cfg.mixer, cfg.mixer_config, kept, _n_layers(teacher_dir), budget, a, teacher_dir, out)
    return with_baseline(res, scratch)


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d))


#: the bench settings a stored result must share with this run to be reused (and the case's method fields)
SETTINGS = ("budget_frac", "seq_len", "batch_size", "eval_batches", "recipe") + tuple(METHOD_FLAGS)


def settings_of(a) -> dict:
    return {k: getattr(a, k) for k in SETTINGS + ("scratch_lrs", "scratch_inits")}


# ------------------------------------------------------------------------------------------
# the tables
# ------------------------------------------------------------------------------------------


def _g(r: dict) -> str:
    return "—" if r.get("G") is None else f"{r['G']:.3f}"


def _scratch_cell(r: dict) -> str:
    if r.get("L_scratch") is None:
        return "—"
    sweep = ", ".join(f"{k}: {v:.4f}" for k, v in r.get("scratch_sweep", {}).items())
    return f"{r['L_scratch']:.4f} ({r.get('scratch_init', 'random')}, lr {r.get('scratch_lr')}; sweep {sweep or '—'})"


def _state(r: dict) -> str:
    s = r["state_floats"]
    return f"{s['recurrent_floats']} + {s['kv_floats_per_token']}"


def pure_target(budget_frac: float) -> float:
    """The best pure student's G target at a budget: 0.9 at 1% of the teacher's tokens or less, 0.8 above."""
    return 0.9 if budget_frac <= 0.01 + 1e-12 else 0.8


def _load(out: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((out / "results").glob("*.json"))]


def table(out: Path, teacher_dir: Path) -> str:
    rows = [r for r in _load(out) if r["kind"] != "recipe"]
    if not rows:
        return "no finished student case yet"
    t = _teacher_info(teacher_dir)
    frac = rows[0]["settings"]["budget_frac"]
    lines = [f"teacher: {t['tokens']} tokens, val loss {rows[0]['L_teacher']:.4f} nats (this bench's eval windows); "
             f"student budget {rows[0]['tokens']} tokens ({frac:.0%} of the teacher's), recipe "
             f"{rows[0].get('recipe', '?')}, settings {rows[0]['settings']}", "",
             "| case | softmax kept | L_teacher | L_scratch (best lr of the sweep) | L after stage 1 | L_student | G | "
             "state floats (recurrent + per token) | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    students = [r for r in rows if r["kind"] == "student"]
    for r in rows:
        if r["kind"] == "hybrid":
            target = "G >= 0.9: " + ("MET" if r["G"] >= 0.9 else "NOT MET")
        elif r["kind"] == "student":
            target = "G > 0: " + ("MET" if r["G"] > 0 else "NOT MET")
        else:
            target = "(ablation)"
        la = "—" if r["L_after_transfer"] is None else f"{r['L_after_transfer']:.4f}"
        lines.append(f"| {r['case']} | {r['kept_softmax'] or '—'} | {r['L_teacher']:.4f} | {_scratch_cell(r)} | {la} | "
                     f"{r['L_student']:.4f} | {_g(r)} | {_state(r)} | {target} |")
    lines.append("")
    lines += target_lines(rows, frac)
    return "\n".join(lines)


def target_lines(rows: list[dict], frac: float) -> list[str]:
    """The targets' MET / NOT MET lines over the student cases (and the recipes' pure students where given)."""
    lines = []
    students = [r for r in rows if r["kind"] == "student"]
    pure = [r for r in rows if r.get("pure", r["kind"] == "student" and not r["kept_softmax"]) and r.get("G") is not None
            and r["kind"] in ("student", "recipe")]
    need = pure_target(frac)
    if pure:
        best = max(pure, key=lambda r: r["G"])
        lines.append(f"best pure student: {best['case']} G = {best['G']:.3f} -> target G >= {need:g} at {frac:.0%} of the "
                     f"teacher's tokens: {'MET' if best['G'] >= need else 'NOT MET'}"
                     + ("" if best["G"] >= need else f" ({_short_of(best, need)})"))
        plain = [r for r in pure if r.get("mixer") not in WINDOWED]
        if plain and best.get("mixer") in WINDOWED:  # what a student does without any softmax window, for reference
            b = max(plain, key=lambda r: r["G"])
            lines.append(f"best pure student without a softmax window: {b['case']} G = {b['G']:.3f}"
                         + ("" if b["G"] >= need else f" ({_short_of(b, need)})"))
    if students:
        lines.append(f"every student G > 0: {'MET' if all(r['G'] > 0 for r in students) else 'NOT MET'} "
                     f"({len(students)} of {len(STUDENTS)} students measured)"
                     + "".join(f"; {r['case']}: {_short_of(r, 0.0)}" for r in students if r["G"] <= 0))
    for r in rows:
        if r["kind"] == "hybrid" and r["G"] < 0.9:
            lines.append(f"{r['case']}: {_short_of(r, 0.9)}")
    return lines


def _short_of(r: dict, target: float) -> str:
    """The measured reason a case misses G >= target: what the student gained over its from-scratch baseline
    and what the target needs, in nats (computed from the stored losses)."""
    gain = r["L_scratch"] - r["L_student"]
    need = target * (r["L_scratch"] - r["L_teacher"])
    return (f"measured: the linearized model is {gain:.3f} nats below its from-scratch baseline, G = {target:g} needs "
            f"{need:.3f}: L_student <= {r['L_scratch'] - need:.4f}, it is {r['L_student']:.4f}")


def recipe_speeds(speed_dir: Path | None) -> tuple[dict, str]:
    """Each recipe's decoding speed against the teacher from bench/linearize_speed.py's stored results in
    ``speed_dir`` (its longest prompt, at the largest size measured there): ({recipe: tokens/s ratio}, "size, P")."""
    if speed_dir is None or not Path(speed_dir).is_dir():
        return {}, ""
    import re

    from seqmix.linearize.recipes import RECIPES

    from linearize_speed import recipe_label, summarize

    groups = [((int(m[3]), int(m[1]), int(m[2])), f) for f in Path(speed_dir).glob("*x*_P*.json")
              if (m := re.fullmatch(r"(\d+)x(\d+)_P(\d+)\.json", f.name))]
    if not groups:
        return {}, ""
    (P, d, L), f = max(groups)  # the longest prompt measured, at the largest size measured there
    g = summarize(json.loads(f.read_text()))
    t = g.get("teacher")
    out = {}
    for name in RECIPES:
        r = g.get(recipe_label(name))
        if t and r and r["ms_per_token"]:
            out[name] = t["ms_per_token"] / r["ms_per_token"]
    return out, f"{d}x{L}, P {P}"


def recipe_table(out: Path, speed_dir: Path | None = None) -> str:
    """Every recipe case (ablations below their recipe), then each recipe's claims checked on bits per byte. With
    ``speed_dir`` (bench/linearize_speed.py's results): each recipe's decoding tokens/s against its teacher's."""
    from seqmix.experiments.base import check_lm_claim
    from seqmix.linearize.recipes import RECIPES

    rows = [r for r in _load(out) if r["kind"] == "recipe"]
    if not rows:
        return "no finished recipe case yet"
    speeds, where = recipe_speeds(speed_dir)
    frac = rows[0]["settings"]["budget_frac"]
    lines = [f"recipes at {frac:.0%} of the teacher's tokens ({rows[0]['tokens']} tokens); L in nats, bpb in bits per byte"
             + (f"; decode: tokens/s against the teacher's (bench/linearize_speed.py, random-init Llama {where})" if speeds else ""),
             "", "| case | student | softmax kept | L_scratch | L after stage 1 | L_student | bpb | G | state floats "
             "(recurrent + per token) | pure | decode |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    order = {n: i for i, n in enumerate(RECIPES)}
    rows.sort(key=lambda r: (order.get(r["student"], 99), r["ablation"] is not None, r["ablation"] or ""))
    for r in rows:
        la = "—" if r["L_after_transfer"] is None else f"{r['L_after_transfer']:.4f}"
        lines.append(f"| {r['case']} | {r['mixer']} | {r['kept_softmax'] or '—'} | "
                     f"{'—' if r.get('L_scratch') is None else format(r['L_scratch'], '.4f')} | {la} | {r['L_student']:.4f} | "
                     f"{r['bpb_student']:.4f} | {_g(r)} | {_state(r)} | {'yes' if r['pure'] else 'no'} | "
                     f"{format(speeds[r['student']], '.2f') + 'x' if r['ablation'] is None and r['student'] in speeds else '—'} |")
    lines += ["", "the papers' claims (validation bits per byte, lower is better):"]
    by_label = {r["case"][len("recipe:"):]: r for r in rows}
    for name in RECIPES:
        for claim in RECIPES[name].claims:
            have = [{"label": lab, "bpb": by_label[lab]["bpb_student"]} for lab in (claim.a, claim.b) if lab in by_label]
            verdict, detail = check_lm_claim(claim, have)
            mark = {"agrees": "MET", "does not agree": "NOT MET"}.get(verdict, "not measured")
            lines.append(f"- {name}: {claim.text}: {mark} ({detail})")
    return "\n".join(lines)


def length_table(out: Path) -> str:
    """Each case's final model and its teacher per band of positions (windows 16x the training window)."""
    rows = [r for r in _load(out) if r.get("length")]
    if not rows:
        return "no length evaluation stored"
    bands = rows[0]["length"]["bands"]
    lines = [f"loss (nats) per band of positions, windows of {rows[0]['length']['window']} tokens "
             f"({rows[0]['length']['windows']} of them); the training window is {bands[0].split('-')[1]}", "",
             "| case | " + " | ".join(f"teacher {b}" for b in bands) + " | " + " | ".join(f"student {b}" for b in bands) + " |",
             "|---|" + "---|" * (2 * len(bands))]
    for r in rows:
        L = r["length"]["loss"]
        lines.append(f"| {r['case']} | " + " | ".join(f"{v:.4f}" for v in L["teacher"]) + " | "
                     + " | ".join(f"{v:.4f}" for v in L["student"]) + " |")
    return "\n".join(lines)


def add_recall(out: Path, teacher_dir: Path, a) -> None:
    """Recall at a distance (``seqmix.linearize.pipeline.evaluate_recall``) for every stored case that has none:
    its saved model (OUT/runs/<case>) and its teacher on the bench's validation windows; stored in the case's
    results file. A case run since the pipeline records it (metrics["recall"]) is taken from its metrics."""
    from seqmix.interop import load_converted
    from seqmix.linearize.pipeline import LinearizeConfig, _corpus, evaluate_recall

    teacher = None
    for f in sorted((out / "results").glob("*.json")):
        r = json.loads(f.read_text())
        if r.get("recall"):
            continue
        folder = out / "runs" / _slug(r["case"])
        metrics = folder / "metrics.json"
        rec = json.loads(metrics.read_text()).get("recall") if metrics.is_file() else None
        if not rec:
            if not (folder / "config.json").is_file():
                print(f"{r['case']}: no saved model in {folder}: recall not measured", flush=True)
                continue
            from transformers import AutoModelForCausalLM

            if teacher is None:
                teacher = AutoModelForCausalLM.from_pretrained(teacher_dir / "model").eval()
            cfg = LinearizeConfig(hf=str(teacher_dir / "model"), out=str(folder), **_common(a))
            rec = evaluate_recall({"teacher": teacher, "student": load_converted(folder)},
                                  _corpus(cfg, int(teacher.config.vocab_size)))
        r["recall"] = rec
        f.write_text(json.dumps(r, indent=1))
        print(f"{r['case']}: recall gain at distance {rec['distance']}: student {rec['loss']['student']['gain']:.3f} nats, "
              f"teacher {rec['loss']['teacher']['gain']:.3f}", flush=True)


def recall_table(out: Path) -> str:
    """Each case's recall at a distance (a window's first tokens repeated ``distance`` tokens later): the loss on
    the first occurrence, on the repeat, and the gain, student beside teacher."""
    rows = [r for r in _load(out) if r.get("recall")]
    if not rows:
        return "no recall evaluation stored"
    d = rows[0]["recall"]["distance"]
    lines = [f"recall at a distance: each validation window's first tokens repeated {d} tokens later "
             f"({rows[0]['recall']['windows']} windows); gain = loss on the first occurrence − loss on the repeat "
             "(nats): what the model holds from that far back (positive: it uses the earlier text; a softmax window shorter "
             "than the distance cannot, and a negative gain is the cost of the repeat's later positions and of the "
             "splice to that model)", "",
             "| case | teacher first | teacher repeat | teacher gain | student first | student repeat | student gain |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        t, st = r["recall"]["loss"]["teacher"], r["recall"]["loss"]["student"]
        lines.append(f"| {r['case']} | {t['first']:.4f} | {t['repeat']:.4f} | {t['gain']:.3f} | {st['first']:.4f} | "
                     f"{st['repeat']:.4f} | {st['gain']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from seqmix.linearize.recipes import DEFAULT_RECIPE, RECIPES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", required=True, help="bench/linearize_teacher.py's --out folder")
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default=None, help="comma-separated cases (module docstring; default: every student case, "
                   "or with --recipes every recipe case)")
    p.add_argument("--recipes", nargs="?", const=",".join(RECIPES), default=None, metavar="NAMES",
                   help="run these recipes (default all) and their ablations, and check the papers' claims")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, choices=list(RECIPES),
                   help=f"the recipe of the student cases (default {DEFAULT_RECIPE}: the command's default)")
    p.add_argument("--budget-frac", type=float, default=0.1, help="student tokens / teacher tokens (default 0.1)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-batches", type=int, default=16)
    g = p.add_argument_group("the method of the student cases (default: the recipe's)")
    g.add_argument("--transfer-frac", type=float, default=None, help="share of the budget for stage 1")
    g.add_argument("--transfer-lr", type=float, default=None)
    g.add_argument("--finetune-lr", type=float, default=None)
    g.add_argument("--kd", type=float, default=None, help="KD weight in stage 2")
    g.add_argument("--lora-rank", type=int, default=None, help="LoRA rank in stage 2 (0: full fine-tuning)")
    g.add_argument("--group-kv", action=argparse.BooleanOptionalAction, default=None,
                   help="the students keep the teacher's kv heads (k, v rows tied per group) or not")
    g.add_argument("--transfer-trainable", choices=["all", "new", "block"], default=None)
    p.add_argument("--ablation-baselines", action="store_true", help="give every recipe ablation its own from-scratch "
                   "baseline (default: the ablations are compared by the claims, on their losses)")
    p.add_argument("--scratch-lrs", default="1e-3,3e-3", help="the from-scratch runs' lr sweep: L_scratch is the best of "
                   "these, the grid grown by x3 on the side of the best while the best is at its edge (scratch_loss)")
    p.add_argument("--scratch-inits", default="random,random_hf", help="the from-scratch runs' student inits swept "
                   "(random: the students' own; random_hf: their Linear weights as transformers draws the model's)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--scratch-dir", default=None, help="where the from-scratch runs live (default OUT/runs): another "
                   "bench's folder reuses its finished scratch runs (same architecture, tokens and settings: skipped)")
    p.add_argument("--table", action="store_true", help="print the stored cases' tables only")
    p.add_argument("--speed", type=Path, default=None, help="bench/linearize_speed.py's --out folder: the recipes "
                   "table's decode column (each recipe's tokens/s against its teacher's at the longest prompt there)")
    p.add_argument("--recall", action="store_true", help="also measure recall at a distance for every stored case that "
                   "has none, from its saved model (evaluate_recall; seconds per case), before the tables")
    p.add_argument("--write-docs", default=None, metavar="NAME", help="also write the tables into docs/linearize.md, "
                   "between the markers <!-- bench/linearize.py:NAME --> (added at the end when absent)")
    a = p.parse_args(argv)
    teacher_dir, out = Path(a.teacher), Path(a.out)
    a.default_budget = 0.1 * _teacher_info(teacher_dir)["tokens"]  # scratch runs at another budget get another folder
    if a.recipes is not None:
        names = [n.strip() for n in a.recipes.split(",") if n.strip()]
        bad = [n for n in names if n not in RECIPES]
        if bad:
            raise SystemExit(f"bench/linearize.py: argument --recipes: unknown recipe(s) {', '.join(bad)} (recipes: "
                             f"{', '.join(RECIPES)})")
    cases = (TARGET_CASES if a.cases == "targets" else a.cases.split(",") if a.cases
             else recipe_cases(names) if a.recipes is not None else DEFAULT_CASES)
    if not a.table:
        (out / "results").mkdir(parents=True, exist_ok=True)
        for case in filter(None, cases):
            parse_case(case)
            f = out / "results" / (_slug(case) + ".json")
            if f.is_file():
                prior = json.loads(f.read_text())
                now = {k: v for k, v in _jsonable(method(case, a)).items() if k != "recipe"}
                if any(prior["settings"].get(k) != getattr(a, k) for k in SETTINGS) or \
                        any(prior.get("method", {}).get(k, LATER_FIELDS.get(k)) != v for k, v in now.items()):
                    raise SystemExit(f"bench/linearize.py: {f} was measured with other settings or another method "
                                     f"({prior['settings']}, {prior.get('method')}): use another --out")
                if prior.get("G") is not None or not _needs_baseline(case, a):
                    print(f"{case}: finished before, skipped", flush=True)
                    continue
                res = with_baseline(prior, scratch_loss(prior["mixer"], prior["mixer_config"], prior["kept_softmax"],
                                                        _n_layers(teacher_dir), prior["tokens"], a, teacher_dir, out))
            else:
                res = run_case(case, a, teacher_dir, out)
            f.write_text(json.dumps(res, indent=1))
            print(f"{case}: L_teacher {res['L_teacher']:.4f}, L_scratch {res['L_scratch'] or float('nan'):.4f}, "
                  f"L_student {res['L_student']:.4f}, G = {_g(res)} ({res['seconds']:.0f} s)", flush=True)
    if a.recall:
        add_recall(out, teacher_dir, a)
    text = "\n\n".join(t for t in (table(out, teacher_dir), recipe_table(out, a.speed), length_table(out), recall_table(out))
                        if not t.startswith("no "))
    print(text)
    if a.write_docs:
        import sys

        from _common import ROOT, write_doc_section

        argv = [v for v in (sys.argv[1:] if argv is None else argv)]
        kept = [v for i, v in enumerate(argv) if v not in ("--write-docs", "--table") and (i == 0 or argv[i - 1] != "--write-docs")]
        cmd = "python bench/linearize.py " + " ".join(shlex.quote(v) for v in kept)
        from seqmix.linearize.recipes import recipes_markdown

        write_doc_section(ROOT / "docs" / "linearize.md", f"bench/linearize.py:{a.write_docs}",
                           f"Printed by `{cmd} --table` (2-core CPU, shared):\n\n{text}")
        write_doc_section(ROOT / "docs" / "linearize.md", "seqmix.linearize.recipes", recipes_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
