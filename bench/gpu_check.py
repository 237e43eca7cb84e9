"""The prepared device check: everything seqmix wants to know from a GPU, in one call of at most 9 minutes.

    python bench/gpu_check.py --out "$OUT"                 # on a CUDA machine (the device tool's $OUT)
    python bench/gpu_check.py --out "$OUT" --wheels DIR    # first: pip install the wheels in DIR (fla, ...)
    python bench/gpu_check.py --smoke --out /tmp/check     # on a CPU: every step at its smallest, nothing timed

Steps, each in its own process with its own time limit, its output in ``OUT/<step>.log`` (a step that
fails or runs out of time is recorded and the next one runs):
  0. ``setup``: the versions (torch, CUDA, triton, fla, peft) and, with ``--wheels``, their install.
  1. ``contract-fp32`` / ``contract-bf16``: the contract suite (tests/test_contract.py) and the meta/host-read
     suite (tests/test_device_clean.py; not under --smoke, where CI runs it anyway) on the device (pytest ``--device cuda``), in float32, then the
     mixed-precision tests (bf16 autocast and bf16 parameters).
  2. ``fla``: flash-linear-attention's Triton kernels against seqmix's torch path through
     ``backend="auto"`` (tests/test_backends.py on the device, then :func:`fla_vs_torch`'s errors).
  3. ``gpu-bench``: bench/gpu.py --quick (ops per backend, the LM's tokens/s and MFU).
  4. ``dsf-fig2``: the GPU slice of DSF Fig. 2 (``seqmix reproduce dsf-fig2 --scale gpu``: MQAR (256, 16),
     d ∈ {64, 128}, the paper's 4 rates; its ``--dry-run`` prints the run count and the time estimate). Its runs
     go to ``OUT/dsf-fig2-gpu/results.sqlite`` as they finish: a run cut by the step's limit is lost, the
     finished ones are kept, and the same command on a later call continues from them.
``OUT/gpu_check.json`` holds each step's command, exit status, seconds and the last lines of its log.
``--smoke`` runs the same steps on the CPU at their smallest (one mixer, --smoke benches, the dry run
only): tests/test_bench_scripts.py runs it, so the script cannot rot between GPU loans.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

#: seconds per step on a GPU (the sum stays under 9 minutes); --smoke uses its own short limits
BUDGET = {"setup": 30, "contract-fp32": 170, "contract-bf16": 60, "fla": 50, "gpu-bench": 60, "dsf-fig2": 160}
#: the mixers of the contract steps under --smoke (a quick sample; a GPU runs them all)
SMOKE_MIXERS = "gla"


def fla_vs_torch(device: str) -> dict:
    """linear_recurrence through backend="auto" (fla's chunk kernels where installed) against backend="torch":
    the relative error of the output and of each input's gradient, key-wise and per-head decays, bf16 and fp32."""
    import torch

    from seqmix.ops import backends, linear_recurrence

    out = {"fla_installed": backends.get("fla").status("linear_recurrence")[0]}
    g = torch.Generator(device="cpu").manual_seed(0)
    B, T, H, K, V = 2, 256, 4, 64, 64
    for kind in ("key", "head"):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = (torch.randn(B, T, H, n, generator=g) for n in (K, K, V))
            k = k / K ** 0.5
            gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, *((K,) if kind == "key" else ()), generator=g)) / 8

            def run(backend):
                ins = [t.to(device, dtype).requires_grad_(True) for t in (q, k, v, gk)]
                o, _ = linear_recurrence(*ins, mode="chunk", backend=backend)
                o.float().pow(2).sum().backward()
                return o.float(), [t.grad.float() for t in ins]

            o_t, g_t = run("torch")
            o_a, g_a = run("auto")
            rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))  # noqa: E731
            out[f"{kind}/{str(dtype).split('.')[-1]}"] = dict(out=rel(o_a, o_t), grads=[rel(a, b) for a, b in zip(g_a, g_t)])
    return out


def steps(args, out: Path) -> list[tuple[str, list[str], int]]:
    dev = "cpu" if args.smoke else "cuda"
    k = ["-k", SMOKE_MIXERS] if args.smoke else []
    suites = ["tests/test_contract.py"] + ([] if args.smoke else ["tests/test_device_clean.py"])
    pytest = [PY, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--device={dev}"]
    limit = (lambda s: 600) if args.smoke else BUDGET.get
    fig2 = [PY, "-m", "seqmix", "reproduce", "dsf-fig2", "--scale", "gpu", "--out", str(out / "dsf-fig2-gpu")]
    setup = [PY, str(Path(__file__).resolve()), "--versions"] + (["--wheels", str(args.wheels)] if args.wheels else [])
    return [
        ("setup", setup, limit("setup")),
        ("contract-fp32", pytest + suites + k + (["-m", "not slow"] if not args.smoke else []), limit("contract-fp32")),
        ("contract-bf16", pytest + ["tests/test_contract.py", "-k", "mixed_precision" + (f" and ({SMOKE_MIXERS})" if args.smoke else "")],
         limit("contract-bf16")),
        ("fla", [PY, str(Path(__file__).resolve()), "--fla", f"--device={dev}", "--json", str(out / "fla.json")], limit("fla")),
        ("gpu-bench", [PY, "bench/gpu.py", "--smoke" if args.smoke else "--quick", "--json", str(out / "gpu.json")]
         + (["--skip-lm"] if args.smoke else []), limit("gpu-bench")),
        ("dsf-fig2", fig2 + (["--dry-run"] if args.smoke else []), limit("dsf-fig2")),
    ]


def versions(wheels: Path | None) -> int:
    if wheels is not None:
        found = sorted(str(p) for p in Path(wheels).glob("*.whl"))
        if not found:
            print(f"argument --wheels: no .whl file in {str(wheels)!r}")
            return 2
        rc = subprocess.call([PY, "-m", "pip", "install", "-q", "--no-deps", *found])
        if rc:
            return rc
    import importlib

    import torch

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device: "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
    for mod in ("triton", "fla", "peft", "transformers", "seqmix"):
        try:
            m = importlib.import_module(mod)
            print(f"{mod} {getattr(m, '__version__', '?')}")
        except Exception as e:  # a missing optional library is a fact to record, not a failure
            print(f"{mod}: not importable ({type(e).__name__}: {e})")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "bench" / "out" / "gpu_check")),
                   help="folder for the logs and JSON (default: $OUT, else bench/out/gpu_check)")
    p.add_argument("--smoke", action="store_true", help="every step at its smallest on the CPU (nothing timed)")
    p.add_argument("--wheels", type=Path, default=None, help="a folder of wheels to pip install first (--no-deps)")
    p.add_argument("--only", nargs="+", default=None, help="run only these steps")
    p.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fla", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.versions:
        return versions(args.wheels)
    if args.fla:
        sys.path.insert(0, str(ROOT / "src"))
        res = fla_vs_torch(args.device)
        print(json.dumps(res, indent=2))
        if args.json:
            args.json.write_text(json.dumps(res, indent=2))
        return 0
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine, or --smoke on a CPU")
        return 0
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    todo = steps(args, out)
    if args.only:
        unknown = sorted(set(args.only) - {s[0] for s in todo})
        if unknown:
            print(f"argument --only: unknown step(s) {', '.join(unknown)}; expected some of {', '.join(s[0] for s in todo)}")
            return 2
        todo = [s for s in todo if s[0] in args.only]
    report, failed = {}, 0
    for name, cmd, limit in todo:
        log = out / f"{name}.log"
        t0 = time.perf_counter()
        with open(log, "w") as f:
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        secs = time.perf_counter() - t0
        tail = log.read_text(errors="replace").splitlines()[-8:]
        report[name] = dict(cmd=" ".join(map(str, cmd)), rc=rc, seconds=round(secs, 1), limit_s=limit, tail=tail)
        failed += rc != 0
        print(f"{name:14s} rc {rc:3d}  {secs:6.1f} s  {tail[-1] if tail else ''}", flush=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"\n{len(todo) - failed} of {len(todo)} steps passed; logs and JSON in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
