"""`seqmix show --hf` on a Mamba of the 130M sizes at T = 1024: target under
4 GB of memory (peak RSS of the command's process).

    python bench/show_hf.py              # hidden 768, 24 layers, state 16, expand 2, vocab 50280; T = 1024
    python bench/show_hf.py --quick      # 4 layers, T = 256 (a smoke run, not the target)

A random MambaForCausalLM is built from MambaConfig with the 130M sizes (``from_config``,
nothing downloaded), saved with ``save_pretrained`` to a temporary folder (no tokenizer: the
text is read as bytes), and ``python -m seqmix show --hf FOLDER --text-file … -T 1024`` runs
in a child process; its peak resident memory (``ru_maxrss`` of the child) and wall time are
printed, PNG and --html, with the default layers (first and last drawn, every layer
summarized) and with ``--layers all``. One layer's per-channel Φ at T = 1024 would be 1536 ×
1024² floats = 6 GiB: the command reduces over channels as it computes them.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

from _common import ROOT, base_parser, print_table, target_line, write_json

TARGET_GB = 4.0
SIZES = dict(hidden_size=768, num_hidden_layers=24, state_size=16, expand=2, vocab_size=50280)


def run_show(folder: str, text_file: str, T: int, extra: list[str], threads: int | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "seqmix", "show", "--hf", folder, "--text-file", text_file, "-T", str(T), "--out", out,
               *extra]
        # each measurement in its own grandchild so that ru_maxrss of RUSAGE_CHILDREN is its own
        code = ("import resource, subprocess, sys, json, time; t0 = time.perf_counter(); "
                f"r = subprocess.run({cmd!r}, capture_output=True, text=True); "
                "print(json.dumps({'rc': r.returncode, 'err': r.stderr[-1500:], 'out': r.stdout[-600:], "
                "'wall': time.perf_counter() - t0, 'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    import json

    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res["rc"] != 0:
        raise RuntimeError(f"seqmix show --hf failed: {res['err']}")
    return {"peak_gb": res["maxrss_kb"] / 2**20, "wall_s": res["wall"], "stdout_tail": res["out"]}


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--cases", default="png,html,all", help="which cases: png, html (layers 0,-1), all (--layers all)")
    args = p.parse_args()
    import torch
    from transformers import MambaConfig, MambaForCausalLM

    sizes = dict(SIZES)
    T = 1024
    if args.quick:
        sizes["num_hidden_layers"], T = 4, 256
    text = (ROOT / "src/seqmix/data/corpora/tinyshakespeare/input.txt").read_text(encoding="utf-8")[: 4 * T]
    load = os.getloadavg()
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        model = MambaForCausalLM._from_config(MambaConfig(**sizes))
        n = sum(p.numel() for p in model.parameters())
        folder = os.path.join(tmp, "mamba-130m-random")
        model.save_pretrained(folder)
        del model
        build_s = time.perf_counter() - t0
        text_file = os.path.join(tmp, "text.txt")
        with open(text_file, "w", encoding="utf-8") as f:
            f.write(text)
        cases = [c for key, c in (("png", ("png, layers 0,-1", [])), ("html", ("--html, layers 0,-1", ["--html"])),
                                  ("all", ("png, --layers all", ["--layers", "all"])))
                 if key in args.cases.split(",") and not (args.quick and key == "all")]
        for name, extra in cases:
            r = run_show(folder, text_file, T, extra, args.threads)
            print(f"  {name}: peak RSS {r['peak_gb']:.2f} GB, {r['wall_s']:.1f} s (load average {os.getloadavg()[0]:.2f})", flush=True)
            rows.append([name, f"{r['peak_gb']:.2f}", f"{r['wall_s']:.1f}"])
            results.append({"case": name, **r})
    print(f"MambaForCausalLM from MambaConfig({', '.join(f'{k}={v}' for k, v in sizes.items())}): {n / 1e6:.1f}M parameters "
          f"(built and saved in {build_s:.1f}s); T = {T}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} cores")
    print_table(f"seqmix show --hf, T = {T}: peak RSS of the command's process", ["case", "peak RSS (GB)", "wall (s)"], rows)
    worst = max(r["peak_gb"] for r in results)
    targets = [target_line(f"show --hf under {TARGET_GB:g} GB at T = {T} (130M sizes)", None if args.quick else worst < TARGET_GB,
                           f"worst case {worst:.2f} GB")]
    write_json(args, "show_hf", {"sizes": sizes, "T": T, "params": n, "load": load, "results": results, "targets": targets})


if __name__ == "__main__":
    main()
