"""Smoke tests of the benchmark scripts: each runs at its smallest configuration in a subprocess
(as `python bench/<script>.py` is run) and writes its JSON. They check that the script runs and
what it reports is well-formed, never the figures (those depend on the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_peer_smallest(tmp_path):
    """bench/peer.py: seqmix vs transformers (Mamba, Mamba-2, Llama) at d = 32, one layer, T = 32."""
    pytest.importorskip("transformers", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")
    out = tmp_path / "peer.json"
    r = _run("peer.py", "--d-model", "32", "--layers", "1", "--train", "32x2", "--prefill", "32", "--prompt", "16",
             "--decode-tokens", "4", "--repeats", "1", "--threads", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "seqmix vs transformers" in r.stdout
    res = json.loads(out.read_text())
    assert res["d_model"] == 32 and res["layers"] == 1
    assert set(res["results"]) == {"mamba", "mamba2", "llama"}
    for pair, p in res["results"].items():
        # both sides compute the same function: the converted weights give transformers' logits
        assert p["logit_max_abs_diff"] <= 1e-4 * max(1.0, p["logit_max_abs"]), pair
        assert set(p["cells"]) == {"prefill T=32", "decode 4 after 16", "train T=32 B=2"}, pair
        for name, c in p["cells"].items():
            assert c["seqmix"]["tokens_per_s"] > 0 and c["transformers"]["tokens_per_s"] > 0, (pair, name)
            assert c["ratio"] == pytest.approx(c["seqmix"]["tokens_per_s"] / c["transformers"]["tokens_per_s"])
        assert p["cells"]["decode 4 after 16"]["greedy_tokens_agree"] == 4, pair


def test_peer_refuses_unknown_pair():
    pytest.importorskip("transformers")
    r = _run("peer.py", "--pairs", "rwkv", timeout=120)
    assert r.returncode == 2 and "unknown pair 'rwkv'" in r.stderr


def test_peer_one_cell(tmp_path):
    """--pairs mamba2 --modes decode: the Mamba-2 decoding cell alone (seqmix vs transformers); an unknown mode is refused."""
    pytest.importorskip("transformers")
    out = tmp_path / "peer.json"
    r = _run("peer.py", "--pairs", "mamba2", "--modes", "decode", "--d-model", "32", "--layers", "1", "--prompt", "8",
             "--decode-tokens", "3", "--repeats", "1", "--threads", "1", "--no-memory", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["modes"] == ["decode"] and res["train"] == [] and res["prefill"] == []
    assert set(res["results"]) == {"mamba2"} and set(res["results"]["mamba2"]["cells"]) == {"decode 3 after 8"}
    r = _run("peer.py", "--modes", "generate", timeout=120)
    assert r.returncode == 2 and "unknown mode 'generate'" in r.stderr


def test_recurrence_subnormal_quick(tmp_path):
    """bench/recurrence.py --subnormal --quick: the chunk mode with its small decay factors taken as 0 beside every
    factor as it is, one run; both timed, the outputs compared (the flush leaves no visible difference)."""
    out = tmp_path / "sub.json"
    r = _run("recurrence.py", "--subnormal", "--quick", "--repeats", "1", "--threads", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "flushed vs every factor" in r.stdout
    res = json.loads(out.read_text())
    assert res["T"] == 256 and set(res["times_ms"]) == {"flushed (default)", "every factor"}
    assert all(f > 0 and fb > 0 for f, fb in res["times_ms"].values())
    assert res["max_rel_diff"] < 1e-5  # (the terms it drops lie far below float32's resolution)


def test_recurrence_fixed_decay_quick(tmp_path):
    """bench/recurrence.py --fixed-decay --quick: the fixed-decay chunk form beside the general one, both timed on both
    shapes, both outputs at the reference's."""
    out = tmp_path / "fixed.json"
    r = _run("recurrence.py", "--fixed-decay", "--quick", "--repeats", "1", "--threads", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert set(res) >= {"B1_T256", "B2_T1024"}
    for shape in ("B1_T256", "B2_T1024"):
        forms = res[shape]
        assert forms["ratio_median"] > 0
        for form in ("fixed-decay form", "general chunk form"):
            assert forms[form]["min_ms"] > 0 and forms[form]["max_rel_err"] < 1e-5


def test_lra_pathfinder_probe(tmp_path):
    """bench/lra.py --part pathfinder-probe --quick: the shortcut threshold and the CNN control, well-formed."""
    out = tmp_path / "lra.json"
    r = _run("lra.py", "--part", "pathfinder-probe", "--quick", "--threads", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rows = json.loads(out.read_text())["pathfinder_probe"]
    names = [w for w, _ in rows]
    assert names[:2] == ["markers' distance < t (best t)", "majority class"]
    assert any(w.startswith("3-layer CNN after 100 steps") for w in names)
    assert all(0.0 <= a <= 100.0 for _, a in rows)
    # the best threshold is at least the majority class (t = 2 or 40 predicts one class)
    assert rows[0][1] >= rows[1][1] - 1e-9


def test_calibrate_ratio_prints_the_main_job_targets():
    """bench/calibrate.py ratio: every point of the main job's grid side by side, ratios to softmax, and the
    step-time target lines for S6 and SSD at both d."""
    r = _run("calibrate.py", "ratio", "dsf-fig2", "--rounds", "1", "--steps", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "mqar" in line]
    assert len(rows) == 10  # 5 models x 2 d
    assert all(line.rstrip().endswith("x |") for line in rows)
    targets = [line for line in r.stdout.splitlines() if "training step at d =" in line]
    assert len(targets) == 4 and all(("[MET" in t) or ("[NOT MET]" in t) for t in targets)


def test_lm_ssm_quick(tmp_path):
    """bench/lm.py --ssm-only --quick: the target's pair (Mamba without MLP, attention with SwiGLU), the
    context rows, the prefill rows; targets n/a at the quick size."""
    out = tmp_path / "lm.json"
    r = _run("lm.py", "--ssm-only", "--quick", "--threads", "1", "--repeats", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    res = json.loads(out.read_text())["ssm"]
    for tr in res["train"].values():
        assert tr["params"]["mamba"] < tr["params"]["softmax_attention"]  # no MLP in Mamba's blocks
        assert tr["params"]["mamba (8 layers: params ≈ attention's)"] > tr["params"]["mamba"]
        assert tr["ratio"] == pytest.approx(tr["tokens_per_s"]["mamba"] / tr["tokens_per_s"]["softmax_attention"])
    assert [t["met"] for t in res["targets"]] == [None, None, None]


def test_scaling_quick_reports_the_cpu_split(tmp_path):
    """bench/scaling.py --quick: per-token costs, the user / system CPU split with page faults per token, each
    mixer timed in a fresh process, and the state's size measured (the target is at a fixed state)."""
    out = tmp_path / "scaling.json"
    r = _run("scaling.py", "--quick", "--mixers", "s6,softmax_attention", "--threads", "1", "--repeats", "1", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "each mixer in a fresh process" in r.stdout
    res = json.loads(out.read_text())["results"]
    s6, softmax = res["s6"], res["softmax_attention"]
    assert len(set(s6["state_floats"].values())) == 1  # S6's state: d_inner · d_state (+ the conv's), whatever T
    f0, f1 = (softmax["state_floats"][str(T)] for T in (256, 512))
    assert f1 == 2 * f0 > 0  # a KV cache: twice the tokens, twice the floats
    split = s6["fwd_bwd_os_per_token"]
    assert set(split) == {str(T) for T in s6["lengths"]}
    assert all(v["user_us"] >= 0 and v["sys_us"] >= 0 and v["faults"] >= 0 for v in split.values())
    assert s6["filling"] is False and s6["ratio_over"] == "2048/256" and s6["kept_freed_memory"] is False


@pytest.mark.skipif(not __import__("seqmix.runtime").runtime.glibc_malloc(), reason="glibc's tunables only")
def test_scaling_keep_freed_memory_starts_each_process_with_the_tunables(tmp_path):
    out = tmp_path / "scaling.json"
    r = _run("scaling.py", "--quick", "--mixers", "s6", "--threads", "1", "--repeats", "1", "--keep-freed-memory",
             "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "started with GLIBC_TUNABLES=" in r.stdout
    assert json.loads(out.read_text())["results"]["s6"]["kept_freed_memory"] is True


def test_calibrate_run_keeps_fresh_data_at_a_changed_batch_size(monkeypatch):
    """bench/calibrate.py run --set data.batch_size=64: the training set is sized from the final batch size
    (steps × 64 fresh examples), not from the preset's 16 (which would repeat the data 4 times)."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import calibrate

    args = argparse.Namespace(preset="dsf-fig2", label="S6", d=64, task=None, seed=0, steps=300, eval_every=100, seq_len=None,
                              kv=None, repeat=False, set=["data.batch_size=64", "train.lr=0.01"], segment=[])
    cfg = calibrate.calibration_run(args)
    assert cfg.data.batch_size == 64 and cfg.train.lr == 0.01
    assert cfg.data.train[0].num_examples == 300 * 64


def test_calibrate_left_at(monkeypatch):
    """bench/calibrate.py's plateau exit: the first evaluation at or above the threshold, None if none; a
    threshold outside (0, 1] is refused by name."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import calibrate

    history = [(250, 0.25), (500, 0.27), (750, 0.56), (1000, 0.31), (1250, 0.92)]
    assert calibrate.left_at(history, 0.4) == 750
    assert calibrate.left_at(history, 0.9) == 1250
    assert calibrate.left_at(history, 0.95) is None
    assert calibrate.left_at([], 0.4) is None
    with pytest.raises(ValueError, match="'left'"):
        calibrate.left_at(history, 40)


def test_calibrate_escape_summary_counts_seeds_not_runs(monkeypatch):
    """The summary of the escape grid: a seed counts once if it left the plateau at any of its rates;
    the runs are counted apart. Hand-made rows: seed 0 leaves at one of its two rates, seed 1 at
    neither; at d = 64 every run leaves."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import calibrate

    def row(d, seed, lr, accs):
        return {"model": "S6", "d": d, "seed": seed, "lr": lr, "best": max(accs), "cpu": 1.0,
                "history": [(250 * (i + 1), a) for i, a in enumerate(accs)]}

    rows = [row(32, 0, 0.01, [0.25, 0.26]), row(32, 0, 0.0021544, [0.25, 0.61]), row(32, 1, 0.01, [0.25, 0.27]),
            row(32, 1, 0.0021544, [0.26, 0.39]), row(64, 0, 0.01, [0.9, 0.99]), row(64, 1, 0.01, [0.3, 0.5])]
    assert calibrate.escape_summary(rows, 0.4) == ["| S6 | 32 | 1 of 2 (0) | 1 of 4 |", "| S6 | 64 | 2 of 2 (0, 1) | 2 of 2 |"]
    assert calibrate.escape_summary(rows, 0.95) == ["| S6 | 32 | 0 of 2 | 0 of 4 |", "| S6 | 64 | 1 of 2 (0) | 1 of 2 |"]
    assert calibrate.escape_row(rows[1], 0.4) == "| S6 | 32 | 0 | 0.0021544 | 61.0 | 500 | 1 | 25 61 |"
    assert calibrate.escape_row(rows[0], 0.4).split(" | ")[5] == "never"


def test_calibrate_escape_jobs_build_every_config_first(monkeypatch):
    """escape_jobs: one job per (model, d, seed, rate), repeated values once, each with its rate; a bad rate,
    a --set of the rate itself or a schedule shorter than the run stops the grid with a message naming it."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import calibrate

    def grid(**kw):
        base = dict(preset="dsf-fig2", models=["S6", "SSD"], d=[32], seeds=[0, 1, 1], lrs=[0.01, 0.0021544], task=None,
                    steps=40, eval_every=20, seq_len=None, kv=None, repeat=False, set=[], segment=[], left=0.4, workers=1)
        return argparse.Namespace(**{**base, **kw})

    jobs = calibrate.escape_jobs(grid())
    assert [(j["model"], j["seed"], j["lr"]) for j in jobs] == [
        (m, s, lr) for m in ("S6", "SSD") for s in (0, 1) for lr in (0.01, 0.0021544)]
    cfg = calibrate.calibration_run(argparse.Namespace(**jobs[1]["args"]))
    assert cfg.train.lr == 0.0021544 and cfg.train.seed == 0 and cfg.label == "S6" and cfg.model.d_model == 32
    for kw, message in [(dict(lrs=[0.01, 0.0]), "--lrs must be positive"), (dict(set=["train.lr=0.1"]), "drop --set train.lr"),
                        (dict(set=["train.schedule_steps=10"]), "schedule_steps = 10 is shorter than max_steps = 40"),
                        (dict(set=["train.weight_decay=-1"]), "'train.weight_decay'")]:
        with pytest.raises(SystemExit, match=message):
            calibrate.escape_jobs(grid(**kw))


def test_calibrate_escape_grid_on_two_workers():
    """bench/calibrate.py escape end to end on two worker processes: a row per run in the grid's order,
    a summary line per (model, d), the total."""
    r = _run("calibrate.py", "escape", "dsf-fig2", "--models", "S6", "--d", "32", "--seeds", "0", "1", "--lrs", "0.01",
             "--steps", "20", "--eval-every", "10", "--workers", "2")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    rows = [line.split(" | ") for line in r.stdout.splitlines() if line.startswith("| S6 | 32 | ")]
    assert [row[2] for row in rows[:2]] == ["0", "1"] and len(rows) == 3  # two runs, one summary line
    assert all(len(row[-1].rstrip("| ").split()) == 2 for row in rows[:2])  # evaluations at steps 10 and 20
    assert rows[2][2].endswith("of 2") or " of 2 (" in rows[2][2]
    assert "2 runs" in r.stdout


def test_calibrate_escape_refuses_an_unknown_model():
    r = _run("calibrate.py", "escape", "dsf-fig2", "--models", "S7", "--d", "32", "--lrs", "0.01", "--steps", "10")
    assert r.returncode != 0 and "no tiny run of model 'S7'" in r.stderr and "Traceback" not in r.stderr


#: a Triton whose driver finds no device (as on a CPU machine with triton installed): a kernel launch raises
_TRITON = """
__version__ = "0.0+driverless"


class _Driver:
    @property
    def active(self):
        raise RuntimeError("0 active drivers ([]). There should only be one.")


class runtime:
    driver = _Driver()


def launch():
    return runtime.driver.active
"""
#: kernel libraries (fla, mamba_ssm, causal_conv1d) that import on any machine and launch through that Triton
_KERNEL = "import triton\n\n\ndef {}(*args, **kwargs):\n    triton.launch()\n"
_STANDINS = {"triton/__init__.py": _TRITON, "fla/__init__.py": "__version__ = '0.0+standin'\n", "fla/ops/__init__.py": "",
             "fla/ops/gla/__init__.py": _KERNEL.format("chunk_gla"), "fla/ops/simple_gla/__init__.py": _KERNEL.format("chunk_simple_gla"),
             "mamba_ssm/__init__.py": "", "mamba_ssm/ops/__init__.py": "",
             "mamba_ssm/ops/selective_scan_interface.py": _KERNEL.format("selective_scan_fn"),
             "causal_conv1d/__init__.py": _KERNEL.format("causal_conv1d_fn")}


@pytest.mark.slow
def test_gpu_check_smoke_with_kernel_libraries_installed_on_a_cpu(tmp_path):
    """bench/gpu_check.py --smoke: every step of the prepared device script at its smallest on the CPU
    (the contract suite on one mixer, the fla comparison, bench/gpu.py --smoke, the GPU slice's dry run),
    with Triton kernel libraries installed (fla, mamba_ssm, causal_conv1d stand-ins whose Triton driver
    finds no device, as `pip install flash-linear-attention` gives on a CPU machine): every kernel row of
    bench/gpu.py is skipped with the dispatch's reason, none is called on the CPU tensors."""
    lib = tmp_path / "site"
    for rel, text in _STANDINS.items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lib), str(ROOT / "src")])}
    live = subprocess.run([sys.executable, "-c", "from fla.ops.gla import chunk_gla; chunk_gla()"], env=env,
                          capture_output=True, text=True)
    assert "0 active drivers" in live.stderr  # the stand-in imports, and fails as Triton does at a launch on a CPU
    out = tmp_path / "out"
    r = _run("gpu_check.py", "--smoke", "--out", str(out), timeout=900, env=env)
    logs = "".join(p.read_text()[-2000:] for p in sorted(out.glob("*.log")))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + logs
    report = json.loads((out / "gpu_check.json").read_text())
    assert list(report) == ["setup", "contract-fp32", "contract-bf16", "fla", "gpu-bench", "dsf-fig2"]
    assert all(step["rc"] == 0 for step in report.values())
    assert "passed" in report["contract-fp32"]["tail"][-1]
    assert "fla 0.0+standin" in (out / "setup.log").read_text()
    fla = json.loads((out / "fla.json").read_text())
    assert {"key/float32", "key/bfloat16", "head/float32", "head/bfloat16"} <= set(fla)
    assert fla["fla_installed"] and all(v["out"] == 0.0 for k, v in fla.items() if k != "fla_installed")  # auto: torch's path
    ops = json.loads((out / "gpu.json").read_text())["ops"]
    assert len(ops) == 6
    for case, res in ops.items():
        assert res["torch"] is not None, case
        if case.startswith("softmax_attention"):  # sdpa is torch's own: it runs on the CPU
            assert res["backend"] is not None and res["direct"] is not None and res["skipped"] is None
        else:
            assert res["backend"] is None and res["direct"] is None, case
            assert "run on CUDA, the inputs are on cpu" in res["skipped"], case
    assert "40 runs" in (out / "dsf-fig2.log").read_text().replace("\n", " ")


def test_gpu_check_refuses_an_unknown_step(tmp_path):
    r = _run("gpu_check.py", "--smoke", "--out", str(tmp_path), "--only", "contract", timeout=120)
    assert r.returncode == 2 and "argument --only: unknown step(s) contract" in r.stdout


@pytest.mark.slow
def test_host_reads_and_compile_benches_run(tmp_path):
    """bench/host_reads.py and bench/compile.py at their smallest: both policies / both runners timed, and the
    compiled model's first loss equal to eager's (the same function)."""
    r = _run("host_reads.py", "--quick", "--mixers", "gla", "--repeats", "1", "--json", str(tmp_path / "h.json"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "h.json").read_text())["results"]["gla/T64"]
    assert res["always_ms"] > 0 and res["never_ms"] > 0
    r = _run("compile.py", "--quick", "--mixers", "gla", "--repeats", "1", "--json", str(tmp_path / "c.json"), timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "c.json").read_text())["results"]["gla"]
    assert res["graph_breaks"] == 0
    assert res["first_loss"]["compiled"] == pytest.approx(res["first_loss"]["eager"], rel=1e-4)


def test_interop_rows_and_counts(tmp_path):
    """bench/interop.py --quick on one family: three models timed (original, converted, the A/A copy), every
    row's ratio and A/A ratio from the stored rates; the row logic (status_of) and the counted reason
    (call_counts: aten ops and Python calls per call, counted, deterministic)."""
    pytest.importorskip("transformers", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")
    out = tmp_path / "interop.json"
    r = _run("interop.py", "--quick", "--families", "mamba", "--threads", "1", "--keep-freed-memory", "--json", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    from seqmix.runtime import glibc_malloc

    stored = json.loads(out.read_text())
    assert stored["freed_memory_kept"] == glibc_malloc()  # (the process started anew with the settings, on glibc)
    assert ("glibc keeping freed memory" in r.stdout) == glibc_malloc()
    res = stored["results"]["mamba"]
    for mode in ("forward", "prefill", "decode"):
        k = f"{mode}_tok_s"
        assert res[f"{mode}_ratio"] == pytest.approx(res["converted"][k] / res["original"][k])
        assert res[f"{mode}_aa"] == pytest.approx(res["control"][k] / res["original"][k])
        assert res[f"{mode}_status"] in ("MET", "NOT MET")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import interop
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert interop.status_of(1.02, 0.9, "x") == ("MET", "")
    assert interop.status_of(0.95, 0.93, "x")[1].startswith("within this run's noise")  # at or above the run's band
    assert interop.status_of(0.95, 0.95, "")[1].startswith("within this run's noise")
    assert interop.status_of(0.80, 0.97, "where: y") == ("NOT MET", "where: y")  # below the band: the known reason
    assert interop.status_of(0.90, None, "where: y") == ("NOT MET", "where: y")  # no control: no band
    # the band: the 95% quantile of the gaps |log A/A| (the 19th smallest of 20; the largest of fewer than 20),
    # each gap alike above and below 1 (which copy is the "original" is chance)
    assert interop.noise_band([1.0] * 18 + [0.97, 1 / 0.95]) == pytest.approx(0.97)
    assert interop.noise_band([1.0] * 18 + [1 / 0.97, 0.95]) == pytest.approx(0.97)
    assert interop.noise_band([1.02, 0.99, 1.0]) == pytest.approx(1 / 1.02)
    assert interop.noise_band([]) is None and interop.noise_band([None]) is None
    assert interop.status_of(None, None, "") == ("not measured", "")
    import torch
    torch.manual_seed(0)
    orig = interop.build("mamba").eval()
    counts = interop.call_counts(orig, 16)
    assert set(counts) == {"forward", "prefill", "decode"}
    assert all(ops > 0 and calls > 0 for ops, calls in counts.values())
    assert counts == interop.call_counts(orig, 16)  # counts, not times: the same on a second count
    assert interop.counted_reason("decode", (10, 20), (12, 30), "where: z") == \
        "per decoding step: 12 aten ops (original 10), 30 Python calls (original 20); where: z"


def test_linearize_tables_print_targets_shortfalls_claims_and_length(tmp_path):
    """bench/linearize.py's tables from stored case results (written here): the targets' MET / NOT MET lines,
    and for a target not met the shortfall computed from the stored losses; each recipe's claims checked on
    the stored bits per byte; the length rows."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import linearize as bench_lin
    finally:
        sys.path.remove(str(ROOT / "bench"))
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "teacher.json").write_text(json.dumps({"tokens": 1000}))
    (tmp_path / "out" / "results").mkdir(parents=True)

    def case(name, kind, L_student, L_scratch, L_teacher=1.0, frac=0.1, ablation=None, student=None, bpb=None, kv=0):
        r = {"case": name, "kind": kind, "student": student or name, "ablation": ablation, "mixer": "m", "kept_softmax":
             [0] if kind == "hybrid" else [], "L_teacher": L_teacher, "L_scratch": L_scratch, "L_student": L_student,
             "L_after_transfer": None, "tokens": 100, "bpb_student": bpb if bpb is not None else L_student / 0.69,
             "G": None if L_scratch is None else (L_scratch - L_student) / (L_scratch - L_teacher),
             "settings": {"budget_frac": frac}, "state_floats": {"recurrent_floats": 1, "kv_floats_per_token": kv},
             "pure": kind in ("student", "recipe") and kv == 0,
             "length": {"window": 64, "windows": 2, "bands": ["0-16", "16-64"], "loss": {"teacher": [1.0, 2.0], "student": [1.5, 1.25]}}}
        (tmp_path / "out" / "results" / f"{bench_lin._slug(name)}.json").write_text(json.dumps(r))

    case("gla", "student", 1.5, 2.0)  # G = 0.5
    case("mamba2", "student", 2.1, 2.0)  # G < 0
    case("hybrid:gla", "hybrid", 1.05, 2.0)  # G = 0.947
    text = bench_lin.table(tmp_path / "out", teacher)
    assert "best pure student: gla G = 0.500 -> target G >= 0.8 at 10% of the teacher's tokens: NOT MET" in text
    # G = 0.8 needs 0.8 nats below the baseline: L_student <= 1.2000; it is 1.5000
    assert "G = 0.8 needs 0.800: L_student <= 1.2000, it is 1.5000" in text
    assert "every student G > 0: NOT MET" in text and "mamba2: measured: the linearized model is -0.100 nats" in text
    assert "G >= 0.9: MET" in text and "hybrid:gla: measured" not in text
    assert bench_lin.pure_target(0.01) == 0.9 and bench_lin.pure_target(0.1) == 0.8
    # the recipes: a claim "a below b" on the stored bits per byte, MET or NOT MET with the numbers
    case("recipe:lolcats", "recipe", 1.2, 2.0, student="lolcats", bpb=1.70)
    case("recipe:lolcats:no_transfer", "recipe", 1.4, None, student="lolcats", ablation="no_transfer", bpb=2.00)
    case("recipe:lolcats:linear_only", "recipe", 1.1, None, student="lolcats", ablation="linear_only", bpb=1.60)
    rt = bench_lin.recipe_table(tmp_path / "out")
    assert "attention transfer + LoRA beats LoRA alone (Table 1): MET (lolcats 1.7000 vs lolcats:no_transfer 2.0000" in rt
    assert "beats linear attention alone (Table 6): NOT MET (lolcats 1.7000 vs lolcats:linear_only 1.6000" in rt
    assert "suffices: within 0.02 bits/byte of training every student weight: not measured" in rt
    assert "| recipe:lolcats | m | — | 2.0000 | — | 1.2000 | 1.7000 | 0.800 | 1 + 0 | yes | — |" in rt  # G = (2 - 1.2) / (2 - 1)
    # the decode column: bench/linearize_speed.py's stored group at its largest size and prompt
    speed = tmp_path / "speed"
    speed.mkdir()
    run = lambda step: [{"prefill_s": 1.0, "steps_s": [step, step], "cache_bytes": 8, "load": 1.0}]  # noqa: E731
    (speed / "64x2_P32.json").write_text(json.dumps({"P": 32, "runs": {"teacher": run(0.02), "recipe:lolcats": run(0.01)}}))
    (speed / "64x2_P64.json").write_text(json.dumps({"P": 64, "runs": {"teacher": run(0.03), "recipe:lolcats": run(0.01)}}))
    # a larger size measured at a shorter prompt only: the column reads the longest prompt
    (speed / "128x4_P32.json").write_text(json.dumps({"P": 32, "runs": {"teacher": run(0.02), "recipe:lolcats": run(0.02)}}))
    sys.path.insert(0, str(ROOT / "bench"))  # the script reads bench/linearize_speed.py's stored results through it
    try:
        rt = bench_lin.recipe_table(tmp_path / "out", speed)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert "| recipe:lolcats | m | — | 2.0000 | — | 1.2000 | 1.7000 | 0.800 | 1 + 0 | yes | 3.00x |" in rt
    assert "| recipe:lolcats:no_transfer |" in rt and "random-init Llama 64x2, P 64" in rt
    lt = bench_lin.length_table(tmp_path / "out")
    assert "| gla | 1.0000 | 2.0000 | 1.5000 | 1.2500 |" in lt and "windows of 64 tokens" in lt


def test_linearize_speed_quick_resumes_and_writes_its_section(tmp_path):
    """bench/linearize_speed.py --quick: the teacher, every student of bench/linearize.py and the hybrid at two
    prompt lengths, stored per (size, P) group (a re-run measures nothing again), each student's cache bytes
    the same at both lengths, the results section written between its markers of a page (the page's other
    text kept) and the plot."""
    pytest.importorskip("transformers", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")
    out, page, png = tmp_path / "runs", tmp_path / "page.md", tmp_path / "img" / "speed.png"
    page.write_text("# A page\n\nbefore\n\n<!-- bench/linearize_speed.py:results -->\nold\n<!-- /bench/linearize_speed.py:results -->\n\nafter\n")
    args = ("--quick", "--out", str(out), "--threads", "1", "--no-counts", "--write-docs", "--docs", str(page), "--plot", str(png))
    r = _run("linearize_speed.py", *args, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import linearize as bench_lin
        import linearize_speed
    finally:
        sys.path.remove(str(ROOT / "bench"))
    names = {"teacher", *bench_lin.STUDENTS, "hybrid:lolcats(window 64)", *linearize_speed.recipe_students()}
    assert {"recipe:mohawk", "recipe:radlads", "recipe:liger", "recipe:mamba_in_llama"} <= names
    groups = {P: json.loads((out / f"64x2_P{P}.json").read_text()) for P in (32, 64)}
    for P, g in groups.items():
        assert set(g["runs"]) == names and all(len(v) == 1 for v in g["runs"].values())
        for runs in g["runs"].values():
            assert runs[0]["prefill_s"] > 0 and len(runs[0]["steps_s"]) == 3 and runs[0]["cache_bytes"] > 0
    for name in [*bench_lin.STUDENTS, "recipe:mohawk", "recipe:radlads"]:  # a pure student's state does not grow with the prompt; the teacher's does
        assert groups[32]["runs"][name][0]["cache_bytes"] == groups[64]["runs"][name][0]["cache_bytes"], name
    assert groups[64]["runs"]["teacher"][0]["cache_bytes"] > groups[32]["runs"]["teacher"][0]["cache_bytes"]
    assert "cache bytes constant in P" in r.stdout
    text = page.read_text()
    assert text.startswith("# A page\n\nbefore\n\n") and text.rstrip().endswith("after") and "\nold\n" not in text
    assert text.count("<!-- bench/linearize_speed.py:results -->") == 1 and "| teacher |" in text and png.is_file()
    mtimes = {p: p.stat().st_mtime for p in out.glob("64x2_P*.json")}
    r = _run("linearize_speed.py", *args, timeout=600)  # resumed: every measurement is stored, nothing runs again
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert {p: p.stat().st_mtime for p in out.glob("64x2_P*.json")} == mtimes and "repeat 1/1" not in r.stdout


def test_linearize_speed_general_step_copy_is_the_fused_steps_ab():
    """bench/linearize_speed.py --general-step: a copy of a student sharing its weights whose mixers take the general
    decoding path (the original's keep their fused step), decoding the same tokens; None for a student with no fused step."""
    pytest.importorskip("transformers", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import linearize_speed

        teacher = linearize_speed.teacher(32, 2, 64)  # (it imports bench/linearize_teacher.py)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import torch

    from seqmix.linearize import linearize

    for mixer, cfg, fused in (("gated_deltanet", {}, True), ("gla", {}, True), ("lolcats", {"window": 4}, False)):
        student = linearize(linearize_speed._sharing_copy(teacher), mixer=mixer, layers="all", inplace=True, **cfg).eval()
        general = linearize_speed.general_step_copy(student)
        if not fused:
            assert general is None
            continue
        flags = lambda m: [x.__dict__["_step_fusable"] for x in m.modules() if "_step_fusable" in x.__dict__]  # noqa: E731
        assert flags(student) == [True, True] and flags(general) == [False, False]
        assert {p.data_ptr() for p in general.parameters()} == {p.data_ptr() for p in student.parameters()}
        prompt = torch.randint(2, 256, (1, 9), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            a, b = (m.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0) for m in (student, general))
        assert torch.equal(a, b), mixer


def test_vml_race_bench_runs(tmp_path):
    """bench/vml_race.py with one process per arm: both arms reported (processes, inexact count, max relative
    difference), the seqmix arm's first exp exact (seqmix.ops.mkl resolves MKL's functions at import)."""
    r = _run("vml_race.py", "--processes", "1", "--json", str(tmp_path / "v.json"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "v.json").read_text())
    assert set(res["arms"]) == {"torch", "seqmix"}
    for arm in res["arms"].values():
        assert arm["processes"] == 1 and arm["inexact"] in (0, 1) and arm["max_rel"] >= 0
    assert res["arms"]["seqmix"]["inexact"] == 0 and res["target"]["met"] is True
