"""Linearization bench: the gap closed by each student on the bench teacher (bench/linearize_teacher.py).

    python bench/linearize_teacher.py --out runs/lin_teacher --tokens 1200000 --threads 1
    python bench/linearize.py --teacher runs/lin_teacher --out runs/lin_bench --threads 1       # every student
    python bench/linearize.py --teacher runs/lin_teacher --out runs/lin_bench --table           # the table only

For each student: the teacher linearized (init from attention, stage 1 on ``--transfer-frac`` of the
budget, stage 2 on the rest: by default the recipe of the measured table, KD weight 1 to the teacher's
logits, LoRA rank 8 on the kept weights with the students trained in full, lr 3e-3;
``seqmix.linearize.run``, what `seqmix linearize` runs) and the same architecture trained from scratch on
the same number of tokens (a random model of the teacher's shape, next-token loss through the same
Trainer, every weight trained, the best of an lr × init sweep: ``scratch_loss``). On held-out
text (the validation windows, the same for all): G = (L_scratch − L_student) / (L_scratch − L_teacher).
The budget is ``--budget-frac`` of the teacher's training tokens. ``hybrid:NAME`` runs NAME with
``auto:1`` (one softmax layer kept, the largest stage-1 residual) and ``uniform1:NAME`` with the one
kept layer at the middle of the stack (uniform spacing at K = 1). Ablations of one student:
``transfer_only:NAME``, ``finetune_only:NAME`` (init random, no stage 1), ``phi:NAME`` (stage 1 on Φ).

Targets (the issue): best student G >= 0.8; the one-softmax-layer hybrid G >= 0.9; every student G > 0.
Each case's result is stored in OUT/results/<case>.json as it finishes (a re-run skips finished
cases; several processes can split the cases with --cases); the table prints every stored case.
Only measured numbers are printed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

#: the students of the issue: name -> (mixer, mixer config)
STUDENTS = {
    "linear_attention(hedgehog)": ("linear_attention", {"feature_map": "hedgehog"}),
    "retnet": ("retnet", {}),
    "gla": ("gla", {}),
    "mamba2": ("mamba2", {}),
    "gated_deltanet": ("gated_deltanet", {}),
    # B'MOJO-F's own Mamba at a small size (expand 1, d_state 4, chunked scan): its default recurrent scan is
    # ~50x slower on the CPU, too slow for this bench's budget
    "bmojo_f(window 32)": ("bmojo_f", {"window": 32, "ssm_mode": "chunk", "expand": 1, "d_state": 4}),
}
#: every case of docs/linearize.md's table: the students, the hybrids (auto:1) and the ablations on GLA
DEFAULT_CASES = list(STUDENTS) + ["hybrid:gla", "hybrid:gated_deltanet", "uniform1:gla", "transfer_only:gla",
                                  "finetune_only:gla", "phi:gla"]


def _teacher_info(folder: Path) -> dict:
    return json.loads((folder / "teacher.json").read_text())


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


def _case(case: str):
    """(kind, student label) of a case name."""
    kind, _, name = case.rpartition(":")
    if name not in STUDENTS:
        raise SystemExit(f"bench/linearize.py: unknown student {name!r} in case {case!r} (students: {', '.join(STUDENTS)})")
    return kind or "student", name


def _slug(case: str) -> str:
    """A file name for a case ("hybrid:gla" -> "hybrid_gla", "bmojo_f(window 32)" -> "bmojo_f_window_32")."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in case).strip("_").replace("__", "_")


def _uniform_layers(n: int, K: int) -> list[int]:
    """The layers kept as softmax by uniform spacing: the middle of each of K equal slices."""
    return sorted({int((i + 0.5) * n / K) for i in range(K)})


#: the stage-1 lr written into every from-scratch run's config (they have no stage 1: a constant, so that the
#: runs' settings keys do not depend on --transfer-lr; 3e-3, the value every stored scratch run was made with)
SCRATCH_TRANSFER_LR = 3e-3


def _scratch_lrs(spec: str) -> list[float]:
    try:
        lrs = sorted({float(v) for v in spec.split(",") if v.strip()})
    except ValueError:
        lrs = []
    if not lrs or lrs[0] <= 0:
        raise SystemExit(f"bench/linearize.py: argument --scratch-lrs: expected comma-separated learning rates > 0, got {spec!r}")
    return lrs


def scratch_loss(label: str, kept: list[int], n_layers: int, budget: int, common: dict, a, teacher_dir: Path, out: Path) -> dict:
    """L_scratch: the same architecture (softmax kept where the linearized one kept it) from a random init
    on the same tokens, next-token loss only, the best of a sweep — one rule for every scratch run: for
    each init of ``--scratch-inits`` ("random": the students' own init; "random_hf": their Linear weights
    drawn as transformers draws the host model's, normal(0, 0.02)), each lr of ``--scratch-lrs``, the lr grid
    grown by a factor 3 on the side of the best while the best is at its edge (at most twice).
    Returns {"loss", "lr", "init", "sweep": {"init lr": loss}}."""
    from seqmix.linearize.pipeline import LinearizeConfig, run

    scratch_layers = ",".join(str(i) for i in range(n_layers) if i not in kept) if kept else "all"
    scratch_dir = Path(a.scratch_dir) if a.scratch_dir else out / "runs"
    base = _scratch_base(teacher_dir, scratch_dir.parent)
    name = _slug(label) + (f"_softmax{'-'.join(map(str, kept))}" if kept else "") + "_scratch"
    sweep: dict[tuple[str, float], float] = {}

    def one(init: str, lr: float) -> None:
        if (init, lr) in sweep:
            return
        cfg = LinearizeConfig(hf=str(base), layers=scratch_layers, init=init, stages=("finetune",), transfer_tokens=0,
                              finetune_tokens=budget, out=str(scratch_dir / f"{name}{'_hfinit' if init == 'random_hf' else ''}_lr{lr:g}"),
                              **{**common, "finetune_lr": lr, "kd": 0.0, "lora_rank": 0, "transfer_trainable": "all",
                                 # no stage 1 here: its lr is pinned, so cases that differ only in stage 1 share the runs
                                 "transfer_lr": SCRATCH_TRANSFER_LR})
        stored = Path(cfg.out) / "metrics.json"  # a finished run of the same settings: its measured loss, not run again
        blob = json.loads(stored.read_text()) if stored.is_file() else None
        same = blob is not None and LinearizeConfig(**blob["config"]).stage_key("finetune") == cfg.stage_key("finetune")
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


def _common(a, label: str) -> dict:
    """The LinearizeConfig fields every run of a case shares."""
    mixer, mcfg = STUDENTS[label]
    return dict(mixer=mixer, mixer_config=mcfg, corpus="tinyshakespeare", tokenizer="byte", seq_len=a.seq_len,
                batch_size=a.batch_size, eval_batches=a.eval_batches, threads=a.threads, transfer_lr=a.transfer_lr,
                finetune_lr=a.finetune_lr, kd=a.kd, lora_rank=a.lora_rank, transfer_trainable=a.transfer_trainable)


SETTINGS = ("budget_frac", "transfer_frac", "seq_len", "batch_size", "eval_batches", "transfer_lr", "finetune_lr", "kd", "lora_rank",
            "transfer_trainable")


def rescore(r: dict, a, teacher_dir: Path, out: Path) -> dict:
    """A stored case's result with L_scratch (and G) measured again under this run's --scratch-lrs rule (the
    student's runs are not repeated)."""
    n_layers = json.loads((teacher_dir / "model" / "config.json").read_text())["num_hidden_layers"]
    scratch = scratch_loss(r["student"], r["kept_softmax"], n_layers, r["tokens"], _common(a, r["student"]), a, teacher_dir, out)
    return {**r, "L_scratch": scratch["loss"], "scratch_lr": scratch["lr"], "scratch_init": scratch["init"],
            "scratch_sweep": scratch["sweep"], "G": (scratch["loss"] - r["L_student"]) / (scratch["loss"] - r["L_teacher"]),
            "settings": {**r["settings"], "scratch_lrs": a.scratch_lrs, "scratch_inits": a.scratch_inits}}


def run_case(case: str, a, teacher_dir: Path, out: Path) -> dict:
    from seqmix.linearize.pipeline import LinearizeConfig, run

    kind, label = _case(case)
    mixer, mcfg = STUDENTS[label]
    budget = int(a.budget_frac * _teacher_info(teacher_dir)["tokens"])
    transfer = int(a.transfer_frac * budget)
    n_layers = json.loads((teacher_dir / "model" / "config.json").read_text())["num_hidden_layers"]
    common = _common(a, label)
    layers, stages, init, match = "all", ("transfer", "finetune"), "attention", "output"
    t_tok, f_tok = transfer, budget - transfer
    if kind == "hybrid":
        layers = "auto:1"
    elif kind == "uniform1":
        keep = _uniform_layers(n_layers, 1)
        layers = ",".join(str(i) for i in range(n_layers) if i not in keep)
    elif kind == "transfer_only":
        stages, f_tok = ("transfer",), 0
    elif kind == "finetune_only":
        stages, init, t_tok, f_tok = ("finetune",), "random", 0, budget
    elif kind == "phi":
        match = "phi"
    elif kind != "student":
        raise SystemExit(f"bench/linearize.py: unknown case kind {kind!r}")
    t0 = time.perf_counter()
    lin = run(LinearizeConfig(hf=str(teacher_dir / "model"), layers=layers, init=init, match=match, stages=stages,
                              transfer_tokens=t_tok, finetune_tokens=f_tok, out=str(out / "runs" / _slug(case)),
                              **common), progress=False)
    last = lin["stages"][lin["final_stage"]] if lin["final_stage"] in lin["stages"] else None
    L_student = last["eval"]["loss"]
    kept = lin["stages"].get("transfer", {}).get("kept_softmax", [])
    if kind == "uniform1":
        kept = _uniform_layers(n_layers, 1)
    scratch = scratch_loss(label, kept, n_layers, budget, common, a, teacher_dir, out)
    L_teacher = lin["teacher"]["loss"]
    res = {"case": case, "kind": kind, "student": label, "mixer": mixer, "mixer_config": mcfg, "layers": layers,
           "kept_softmax": kept, "tokens": budget, "transfer_tokens": t_tok, "finetune_tokens": f_tok,
           "L_teacher": L_teacher, "L_scratch": scratch["loss"], "scratch_lr": scratch["lr"], "scratch_init": scratch["init"],
           "scratch_sweep": scratch["sweep"], "L_student": L_student,
           "L_after_transfer": lin["stages"].get("transfer", {}).get("eval", {}).get("loss"),
           "G": (scratch["loss"] - L_student) / (scratch["loss"] - L_teacher), "bpb_student": last["eval"]["bpb"],
           "state_floats": last["state"], "teacher_state": lin["teacher"]["state"], "seconds": time.perf_counter() - t0,
           "settings": {k: getattr(a, k) for k in SETTINGS + ("scratch_lrs", "scratch_inits")}}
    return res


def table(out: Path, teacher_dir: Path) -> str:
    rows = [json.loads(f.read_text()) for f in sorted((out / "results").glob("*.json"))]
    if not rows:
        return "no finished case yet"
    t = _teacher_info(teacher_dir)
    lines = [f"teacher: {t['tokens']} tokens, val loss {rows[0]['L_teacher']:.4f} nats (this bench's eval windows); "
             f"student budget {rows[0]['tokens']} tokens ({rows[0]['settings']['budget_frac']:.0%} of the teacher's), "
             f"settings {rows[0]['settings']}", "",
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
        s = r["state_floats"]
        sweep = ", ".join(f"{k}: {v:.4f}" for k, v in r.get("scratch_sweep", {}).items())
        lines.append(f"| {r['case']} | {r['kept_softmax'] or '—'} | {r['L_teacher']:.4f} | {r['L_scratch']:.4f} "
                     f"({r.get('scratch_init', 'random')}, lr {r.get('scratch_lr', r['settings'].get('scratch_lr'))}; sweep {sweep or '—'}) | {la} | "
                     f"{r['L_student']:.4f} | {r['G']:.3f} | {s['recurrent_floats']} + {s['kv_floats_per_token']} | {target} |")
    if students:
        best = max(students, key=lambda r: r["G"])
        lines += ["", f"best student: {best['case']} G = {best['G']:.3f} -> target G >= 0.8: {'MET' if best['G'] >= 0.8 else 'NOT MET'}"
                  + ("" if best["G"] >= 0.8 else f" ({_short_of(best, 0.8)})"),
                  f"every student G > 0: {'MET' if all(r['G'] > 0 for r in students) else 'NOT MET'} "
                  f"({len(students)} of {len(STUDENTS)} students measured)"
                  + "".join(f"; {r['case']}: {_short_of(r, 0.0)}" for r in students if r["G"] <= 0)]
    for r in rows:
        if r["kind"] == "hybrid" and r["G"] < 0.9:
            lines.append(f"{r['case']}: {_short_of(r, 0.9)}")
    return "\n".join(lines)


def _short_of(r: dict, target: float) -> str:
    """The measured reason a case misses G >= target: what the student gained over its from-scratch baseline
    and what the target needs, in nats (computed from the stored losses)."""
    gain = r["L_scratch"] - r["L_student"]
    need = target * (r["L_scratch"] - r["L_teacher"])
    return (f"measured: the linearized model is {gain:.3f} nats below its from-scratch baseline, G = {target:g} needs "
            f"{need:.3f}: L_student <= {r['L_scratch'] - need:.4f}, it is {r['L_student']:.4f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", required=True, help="bench/linearize_teacher.py's --out folder")
    p.add_argument("--out", required=True)
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated cases (module docstring)")
    p.add_argument("--budget-frac", type=float, default=0.1, help="student tokens / teacher tokens (default 0.1)")
    p.add_argument("--transfer-frac", type=float, default=1 / 3, help="share of the budget for stage 1 (default 1/3)")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--transfer-lr", type=float, default=3e-3)
    p.add_argument("--finetune-lr", type=float, default=3e-3, help="stage 2's lr (default 3e-3: the recipe of the measured table)")
    p.add_argument("--scratch-lrs", default="1e-3,3e-3", help="the from-scratch runs' lr sweep: L_scratch is the best of "
                   "these, the grid grown by x3 on the side of the best while the best is at its edge (scratch_loss)")
    p.add_argument("--scratch-inits", default="random,random_hf", help="the from-scratch runs' student inits swept "
                   "(random: the students' own; random_hf: their Linear weights as transformers draws the model's)")
    p.add_argument("--kd", type=float, default=1.0, help="KD weight in stage 2 (default 1.0: the recipe of the measured table)")
    p.add_argument("--lora-rank", type=int, default=8, help="LoRA rank on the kept weights in stage 2 (default 8: the recipe "
                   "of the measured table); 0: full fine-tuning")
    p.add_argument("--transfer-trainable", choices=["all", "new"], default="all",
                   help="stage 1's trainable set: every student parameter, or only those not copied from the teacher")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--scratch-dir", default=None, help="where the from-scratch runs live (default OUT/runs): another "
                   "bench's folder reuses its finished scratch runs (same architecture, tokens and settings: skipped)")
    p.add_argument("--table", action="store_true", help="print the stored cases' table only")
    a = p.parse_args(argv)
    teacher_dir, out = Path(a.teacher), Path(a.out)
    if not a.table:
        (out / "results").mkdir(parents=True, exist_ok=True)
        for case in filter(None, a.cases.split(",")):
            _case(case)
            f = out / "results" / (_slug(case) + ".json")
            if f.is_file():
                prior = json.loads(f.read_text())
                same = all(prior["settings"].get(k, "all" if k == "transfer_trainable" else None) == getattr(a, k)
                           for k in SETTINGS)
                if not same:
                    raise SystemExit(f"bench/linearize.py: {f} was measured with other settings ({prior['settings']}): "
                                     "use another --out")
                if (prior["settings"].get("scratch_lrs"), prior["settings"].get("scratch_inits", "random")) == (
                        a.scratch_lrs, a.scratch_inits):
                    print(f"{case}: finished before, skipped", flush=True)
                    continue
                res = rescore(prior, a, teacher_dir, out)
            else:
                res = run_case(case, a, teacher_dir, out)
            f.write_text(json.dumps(res, indent=1))
            print(f"{case}: L_teacher {res['L_teacher']:.4f}, L_scratch {res['L_scratch']:.4f}, L_student {res['L_student']:.4f}, "
                  f"G = {res['G']:.3f} ({res['seconds']:.0f} s)", flush=True)
    print(table(out, teacher_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
