"""Every mode of seqmix.ops.linear_recurrence, side by side (issue: foundation).

    python bench/recurrence.py            # the issue's shapes and targets (a few minutes on 2 cores)
    python bench/recurrence.py --quick    # small shapes, seconds

Shapes: (B=2, H=4, T in {1024, 4096}, K=V=64) with key-wise decay and with one decay
per head, and an S6-like shape (B=2, H=256 channels, K=16, V=1, T=2048). For each mode:
forward and forward+backward time (min over --repeats), GFLOP/s and % of the float32
matmul peak measured in the same run, speedup over ``recurrent``, and the peak memory
of forward+backward (a forked process per measurement).

FLOPs counted (forward): chunk = the matmuls it performs, per chunk of C tokens
2C²K + 2C²V (intra) + 4CKV (state write and read); parallel = 2T²K + 2T²V;
recurrent/step = 5KV per token (decay, outer product, add, readout). Elementwise
work of chunk/parallel (decay factors, masks) is not counted.
"""

from __future__ import annotations

import math

import torch

from _common import base_parser, fit_exponent, matmul_peak_gflops, peak_memory_mb, print_table, setup, target_line, timeit, write_json

from seqmix.ops import linear_recurrence, recurrence_step
from seqmix.ops.recurrence import auto_mode

CHUNK = 64
MEM_BUDGET_GB = 6.0  # skip a mode whose dense tensors would exceed this


def make_inputs(B, T, H, K, V, decay, device, requires_grad=False):
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(device).requires_grad_(requires_grad)

    q, k, v = r(B, T, H, K), r(B, T, H, K, scale=K**-0.5), r(B, T, H, V)
    if decay == "key":
        gk = (-torch.rand(B, T, H, K, generator=g) * 0.2).to(device).requires_grad_(requires_grad)
    elif decay == "head":
        gk = (-torch.rand(B, T, H, generator=g) * 0.2).to(device).requires_grad_(requires_grad)
    else:
        gk = None
    return q, k, v, gk


def fwd_bwd_fn(B, T, H, K, V, decay, dev, mode):
    """Forward+backward of one mode on fresh inputs (module level: the memory probe runs it in another process)."""
    q, k, v, gk = make_inputs(B, T, H, K, V, decay, dev, requires_grad=True)

    def fwd_bwd():
        o, _ = linear_recurrence(q, k, v, gk, mode=mode, chunk_size=CHUNK, check_values=False)
        o.sum().backward()
        for t in (q, k, v, gk):
            if t is not None:
                t.grad = None

    return fwd_bwd


def flops(mode, B, T, H, K, V):
    if mode == "chunk":
        n = math.ceil(T / CHUNK)
        return B * H * n * (2 * CHUNK**2 * K + 2 * CHUNK**2 * V + 4 * CHUNK * K * V)
    if mode == "parallel":
        return B * H * (2 * T * T * K + 2 * T * T * V)
    return B * H * T * 5 * K * V


def parallel_bytes(B, T, H, K, decay):
    per = B * H * T * T
    return 4 * per * 3  # the map and two temporaries of its size


def run_case(name, B, T, H, K, V, decay, args, peak):
    dev = args.device
    rows = []
    modes = ["recurrent", "chunk", "parallel"]
    results = {}
    for mode in modes:
        if mode == "parallel" and parallel_bytes(B, T, H, K, decay) > MEM_BUDGET_GB * 2**30:
            rows.append([name, T, mode] + [None] * 7 + [f"skipped: needs ~{parallel_bytes(B, T, H, K, decay) / 2**30:.0f} GB"])
            continue
        q, k, v, gk = make_inputs(B, T, H, K, V, decay, dev)

        def fwd():
            with torch.no_grad():
                linear_recurrence(q, k, v, gk, mode=mode, chunk_size=CHUNK, check_values=False)

        fwd_bwd = fwd_bwd_fn(B, T, H, K, V, decay, dev, mode)
        reps = max(1, args.repeats - 1) if mode == "recurrent" else args.repeats
        t_f = timeit(fwd, repeats=reps, device=dev)["min_ms"]
        t_fb = timeit(fwd_bwd, repeats=reps, device=dev)["min_ms"]
        mem = None if args.no_memory else peak_memory_mb(fwd_bwd_fn, B, T, H, K, V, decay, dev, mode, device=dev)
        gflops = flops(mode, B, T, H, K, V) / (t_f * 1e-3) / 1e9
        results[mode] = dict(fwd_ms=t_f, fwd_bwd_ms=t_fb, gflops=gflops, pct_peak=100 * gflops / peak, peak_mem_mb=mem)
        rows.append([name, T, mode, t_f, t_fb, gflops, 100 * gflops / peak, None, None, mem, ""])
    ref = results.get("recurrent")
    for r in rows:
        res = results.get(r[2])
        if res and ref:
            r[7] = ref["fwd_ms"] / res["fwd_ms"]
            r[8] = ref["fwd_bwd_ms"] / res["fwd_bwd_ms"]
            res["speedup_fwd"], res["speedup_fwd_bwd"] = r[7], r[8]
    # decoding: one step with a carried state
    q, k, v, gk = make_inputs(B, 1, H, K, V, decay, dev)
    S = torch.zeros(B, H, K, V, device=dev)

    def step():
        with torch.no_grad():
            recurrence_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0] if gk is not None else None, None, S, check_values=False)

    t_s = timeit(step, repeats=20, device=dev)["min_ms"]
    results["step"] = dict(ms_per_token=t_s)
    rows.append([name, 1, "step", t_s, None, flops("step", B, 1, H, K, V) / (t_s * 1e-3) / 1e9, None, None, None, None, "per token"])
    results["auto"] = auto_mode(T, K, V, keywise=decay == "key", valuewise=False, complex_=False, chunk_size=CHUNK)
    return rows, results


def main():
    p = base_parser(__doc__.splitlines()[0])
    args = p.parse_args()
    info = setup(args)
    peak = matmul_peak_gflops(args.device, sizes=(512, 1024) if args.quick else (1024, 2048, 3072))
    print(f"machine: {info}\nfloat32 matmul peak measured now: {peak:.1f} GFLOP/s\n")

    Ts = [256, 512] if args.quick else [1024, 2048, 4096]
    cases = []
    for decay in ("key", "head"):
        for T in Ts:
            cases.append((f"{decay}-wise K=V=64", 2, T, 4, 64, 64, decay))
    cases.append(("S6-like H=256 K=16 V=1", 2, 512 if args.quick else 2048, 256, 16, 1, "key"))

    all_rows, results = [], {}
    for name, B, T, H, K, V, decay in cases:
        rows, res = run_case(name, B, T, H, K, V, decay, args, peak)
        all_rows += rows
        results[f"{name} T={T}"] = dict(shape=dict(B=B, T=T, H=H, K=K, V=V, decay=decay), **res)
        print(f"done: {name} T={T}")

    print_table(
        f"linear_recurrence modes ({info['device']}, {info['threads']} threads, chunk {CHUNK}; times are the min of {args.repeats})",
        ["case", "T", "mode", "fwd ms", "fwd+bwd ms", "GFLOP/s", "% peak", "x rec fwd", "x rec f+b", "peak MB f+b", "note"],
        all_rows,
    )

    print("\ntargets (2-core CPU, T=4096, K=V=64):")
    targets = []
    T_big = Ts[-1]
    for decay in ("key", "head"):
        r = results[f"{decay}-wise K=V=64 T={T_big}"]
        sp = r["chunk"]["speedup_fwd_bwd"]
        targets.append(target_line(f"chunk fwd+bwd >= 10x recurrent ({decay}-wise, T={T_big})", sp >= 10, f"{sp:.1f}x"))
        pct = r["chunk"]["pct_peak"]
        targets.append(target_line(f"chunk fwd >= 25% of matmul peak ({decay}-wise, T={T_big})", pct >= 25, f"{pct:.1f}% ({r['chunk']['gflops']:.1f} of {peak:.1f} GFLOP/s)"))
        if not args.no_memory:
            mems = [results[f"{decay}-wise K=V=64 T={T}"]["chunk"]["peak_mem_mb"] for T in Ts]
            e = fit_exponent(Ts, mems)
            targets.append(target_line(f"chunk memory linear in T ({decay}-wise)", e < 1.2, f"peak MB {', '.join(f'{m:.0f}' for m in mems)} at T={Ts}: exponent {e:.2f}"))
    if args.quick:
        print("  (--quick: small shapes; the targets are defined at T=4096)")
    write_json(args, "recurrence", dict(machine=info, matmul_peak_gflops=peak, chunk_size=CHUNK, results=results, targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
