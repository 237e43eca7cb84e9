"""What seqmix's host reads cost per mixer call (seqmix.debug): the value checks and the chunk form's tile choice.

    python bench/host_reads.py            # d_model 128, T in (64, 512), batch 2; CPU (or --device cuda)
    python bench/host_reads.py --quick    # d_model 64, T 64

Each mixer's training call (forward + backward) is timed, alternating, under the two host-read
policies of ``seqmix.debug.host_reads``:
  * ``always``: every value check reads its tensor (NaN/Inf in the input, the decays' sign, β's
    range, ...) and the chunk form reads the decays to choose one tile per chunk: what a CPU runs
    by default ("auto" reads on CPU tensors), and what an accelerator runs only on request;
  * ``never``: nothing is read: what an accelerator (and ``meta``, and torch.compile) runs by
    default; the chunk form takes tiles of a fixed size, exact at any decay.
Printed per mixer and length: both times, the difference per call (the reads' cost) and the ratio
always / never. On a CPU a read costs its reduction only (no queue to wait for); the tile choice
also changes the chunk form's path, so a ratio below 1 is the one-tile path's gain, not a cost.
"""

from __future__ import annotations

import sys

import torch

from _common import base_parser, mixer_fwd_bwd, print_table, setup, timeit, write_json

import seqmix
from seqmix.debug import host_reads

MIXERS = ["softmax_attention", "gla", "retnet", "mamba", "mamba2", "gated_deltanet"]


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", nargs="+", default=MIXERS)
    p.add_argument("--lengths", nargs="+", type=int, default=None)
    args = p.parse_args(argv)
    info = setup(args)
    print(f"machine: {info}")
    d = 64 if args.quick else 128
    lengths = args.lengths or ([64] if args.quick else [64, 512])
    rows, out = [], {}
    for name in args.mixers:
        torch.manual_seed(0)
        m = seqmix.build_mixer(name, d_model=d).to(args.device).train()
        for T in lengths:
            x = torch.randn(2, T, d, device=args.device, requires_grad=True)
            res = {}
            for _ in range(2):  # alternate the policies, twice, and keep each one's minimum
                for policy in ("always", "never"):
                    with host_reads(policy):
                        t = timeit(mixer_fwd_bwd(m, x), repeats=args.repeats, device=args.device)["min_ms"]
                    res[policy] = min(res.get(policy, t), t)
            diff = res["always"] - res["never"]
            rows.append([name, str(T), f"{res['always']:.3f}", f"{res['never']:.3f}", f"{diff * 1e3:+.0f}",
                         f"{res['always'] / res['never']:.2f}"])
            out[f"{name}/T{T}"] = dict(always_ms=res["always"], never_ms=res["never"], diff_us=diff * 1e3)
    print_table(f"a training call (fwd+bwd, batch 2, d_model {d}) on {args.device}, min of {args.repeats} x 2",
                ["mixer", "T", "always ms", "never ms", "reads µs/call", "always / never"], rows)
    write_json(args, "host_reads", dict(machine=info, d_model=d, results=out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
