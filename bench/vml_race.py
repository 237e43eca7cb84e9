"""How often a fresh process's first MKL vector-math call is inexact, with and without ``import seqmix``.

    python bench/vml_race.py                   # 24 processes per arm, float64 exp of 13,440 values, 2 threads
    python bench/vml_race.py --quick           # 2 per arm

oneMKL 2024.2 (torch's wheels) chooses a VML function's kernel on its first call; a first call run on several
threads at once can leave one thread's chunk computed by a low-accuracy kernel (pytorch/pytorch#188792;
seqmix/ops/mkl.py). Each process here computes ``torch.exp`` of the same float64 tensor twice, in the order
the arms say, and reports whether the first result differs from the second (the second is exact) and by how
much (max relative difference). Arms, alternated process by process so that the machine's load hits both:
  * ``torch``: torch alone, the exp its first VML call;
  * ``seqmix``: ``import seqmix`` first (seqmix.ops.mkl.resolve_vml runs at import), then the same exp.
The race needs the threads to meet in MKL's first call, so its rate depends on the machine and its load;
what the seqmix arm must show is none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from _common import ROOT, base_parser, print_table, setup, target_line, write_json

_CHILD = r"""
import json, sys, torch
if {seqmix}:
    import seqmix
torch.set_num_threads({threads})
x = torch.rand({n}, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.9 + 0.05
first = torch.exp(x)
second = torch.exp(x)
print(json.dumps(dict(exact=bool(torch.equal(first, second)),
                      rel=float(((first - second).abs() / second.abs()).max()))))
"""


def one(seqmix_first: bool, threads: int, n: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    code = _CHILD.format(seqmix=seqmix_first, threads=threads, n=n)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"the child process failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=None, help="fresh processes per arm (default 24; 2 with --quick)")
    p.add_argument("--numel", type=int, default=13440, help="values of the float64 tensor (several parallel chunks)")
    p.add_argument("--child-threads", type=int, default=2, help="torch threads of each child process")
    args = p.parse_args(argv)
    info = setup(args)
    k = args.processes or (2 if args.quick else 24)
    print(f"machine: {info}; torch {torch.__version__}, MKL {torch.backends.mkl.is_available()}; {k} processes per arm, "
          f"{args.child_threads} threads, exp of {args.numel} float64 values")
    arms = {"torch": [], "seqmix": []}
    for _ in range(k):
        for name in arms:
            arms[name].append(one(name == "seqmix", args.child_threads, args.numel))
    rows, summary = [], {}
    for name, runs in arms.items():
        bad = [r for r in runs if not r["exact"]]
        worst = max((r["rel"] for r in runs), default=0.0)
        summary[name] = dict(processes=len(runs), inexact=len(bad), max_rel=worst)
        rows.append([name, len(runs), len(bad), worst])
    print_table("first float64 exp of a fresh process against its second", ["arm", "processes", "inexact", "max rel. diff."], rows)
    t = target_line("no inexact first call after import seqmix", summary["seqmix"]["inexact"] == 0,
                    f"{summary['seqmix']['inexact']} of {k} (torch alone: {summary['torch']['inexact']} of {k})")
    write_json(args, "vml_race", dict(machine=info, processes=k, numel=args.numel, child_threads=args.child_threads,
                                      arms=summary, runs=arms, target=t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
