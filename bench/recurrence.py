"""Every mode of seqmix.ops.linear_recurrence, side by side (issues: foundation, 18).

    python bench/recurrence.py                  # the targets' shapes (a few minutes on 2 cores)
    python bench/recurrence.py --quick          # small shapes, seconds
    python bench/recurrence.py --chunk-sweep    # also fwd+bwd of the chunk mode for C in 16..256 (the chunk-size rule)
    python bench/recurrence.py --subnormal      # only: strong decays, small factors taken as 0 vs every factor as it is
    python bench/recurrence.py --fixed-decay    # only: a per-head decay no token changes, its own chunk form vs the general one

The chunk mode is timed twice in the same run: ``chunk-autograd`` (autograd through the chunk
form, chunk_backward="autograd") and ``chunk`` (the hand-written backward,
chunk_backward="manual", the default), both at C = 64; ``chunk-C*`` is the manual backward at the
chunk size that chunk_size=None picks (recurrence.chunk_size_for), shown when it is not 64.
``scan`` is the reference loop in chunks of steps with its hand-written backward (the mode
``auto`` runs for small key-wise states, e.g. the S6-like shape), timed beside ``recurrent``.

Shapes: (B=2, H=4, T in {1024, 4096}, K=V=64) with key-wise decay and with one decay
per head, an S6-like shape (B=2, H=256 channels, K=16, V=1, T=2048) and a diagonal state
(B=1, H=1, K=1, V=512 value channels with value-wise decays, T=1024: RWKV-4's and the
LinRNNs' folded heads), with weak decays (log α in [-0.2, 0]: one tile per chunk) and strong ones
([-4, 0]: tiles of fewer than 16 tokens; RWKV-4's decays reach e^{-20} per step). For each mode:
forward and forward+backward time (min over --repeats), GFLOP/s and % of the float32
matmul peak measured in the same run, speedup over ``recurrent``, and the peak memory
of forward+backward (a forked process per measurement).

FLOPs counted (forward): chunk = the matmuls it performs, per chunk of C tokens
2C²K + 2C²V (intra) + 4CKV (state write and read); parallel = 2T²K + 2T²V;
recurrent/scan/step = 5KV per token (decay, outer product, add, readout). Elementwise
work of chunk/parallel (decay factors, masks) is not counted.
"""

from __future__ import annotations

import math

import torch

from _common import base_parser, fit_exponent, matmul_peak_gflops, peak_memory_mb, print_table, setup, target_line, timeit, write_json

from seqmix.ops import linear_recurrence, recurrence_step
from seqmix.ops.recurrence import auto_mode, chunk_size_for

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
    elif decay in ("value", "value-strong"):  # returned in gk's place, passed as gv (:func:`decays`); strong: log α in [-4, 0]
        gk = (-torch.rand(B, T, H, V, generator=g) * (4.0 if decay == "value-strong" else 0.2)).to(device).requires_grad_(requires_grad)
    else:
        gk = None
    return q, k, v, gk


def decays(decay, g) -> dict:
    """The decay of make_inputs as linear_recurrence's keyword: gk, or gv for value-wise decays."""
    return {"gv": g} if decay.startswith("value") else {"gk": g}


def impl_kwargs(impl, T, K, V, decay):
    """linear_recurrence keyword arguments of a row of the table."""
    if impl == "chunk-autograd":
        return dict(mode="chunk", chunk_size=CHUNK, chunk_backward="autograd")
    if impl.startswith("chunk-C"):
        return dict(mode="chunk", chunk_size=int(impl[7:]), chunk_backward="manual")
    return dict(mode=impl, chunk_size=CHUNK)


def fwd_bwd_fn(B, T, H, K, V, decay, dev, mode):
    """Forward+backward of one row on fresh inputs (module level: the memory probe runs it in another process)."""
    q, k, v, gk = make_inputs(B, T, H, K, V, decay, dev, requires_grad=True)
    kw = impl_kwargs(mode, T, K, V, decay)

    def fwd_bwd():
        o, _ = linear_recurrence(q, k, v, **decays(decay, gk), check_values=False, **kw)
        o.sum().backward()
        for t in (q, k, v, gk):
            if t is not None:
                t.grad = None

    return fwd_bwd


def flops(mode, B, T, H, K, V):
    if mode.startswith("chunk"):
        C = int(mode[7:]) if mode.startswith("chunk-C") else CHUNK
        n = math.ceil(T / C)
        return B * H * n * (2 * C**2 * K + 2 * C**2 * V + 4 * C * K * V)
    if mode == "parallel":
        return B * H * (2 * T * T * K + 2 * T * T * V)
    return B * H * T * 5 * K * V


def parallel_bytes(B, T, H, K, decay, V=1):
    per = B * H * T * T * (V if decay == "value" else 1)  # value-wise decays: one map per value channel
    return 4 * per * 3  # the map and two temporaries of its size


def run_case(name, B, T, H, K, V, decay, args, peak):
    dev = args.device
    rows = []
    C_rule = chunk_size_for(T, K, V, keywise=decay == "key", valuewise=decay.startswith("value"))
    modes = ["recurrent", "scan", "chunk-autograd", "chunk"] + ([f"chunk-C{C_rule}"] if C_rule != CHUNK else []) + ["parallel"]
    if args.modes:
        modes = [m for m in modes if m in args.modes or (m.startswith("chunk-C") and "chunk-C" in args.modes)]
    results = {}
    for mode in modes:
        if mode == "parallel" and parallel_bytes(B, T, H, K, decay, V) > MEM_BUDGET_GB * 2**30:
            rows.append([name, T, mode] + [None] * 7 + [f"skipped: needs ~{parallel_bytes(B, T, H, K, decay, V) / 2**30:.0f} GB"])
            continue
        q, k, v, gk = make_inputs(B, T, H, K, V, decay, dev)
        kw = impl_kwargs(mode, T, K, V, decay)

        def fwd(kw=kw):
            with torch.no_grad():
                linear_recurrence(q, k, v, **decays(decay, gk), check_values=False, **kw)

        fwd_bwd = fwd_bwd_fn(B, T, H, K, V, decay, dev, mode)
        reps = max(1, args.repeats - 1) if mode == "recurrent" else args.repeats
        t_f = timeit(fwd, repeats=reps, device=dev)["min_ms"]
        t_fb = timeit(fwd_bwd, repeats=reps, device=dev)["min_ms"]
        mem = None if args.no_memory else peak_memory_mb(fwd_bwd_fn, B, T, H, K, V, decay, dev, mode, device=dev)
        gflops = flops(mode, B, T, H, K, V) / (t_f * 1e-3) / 1e9
        results[mode] = dict(fwd_ms=t_f, fwd_bwd_ms=t_fb, bwd_over_fwd=t_fb / t_f, gflops=gflops, pct_peak=100 * gflops / peak, peak_mem_mb=mem)
        note = {"chunk-autograd": "autograd bwd", "chunk": "manual bwd", "scan": "the loop, manual bwd"}.get(mode, "manual bwd, rule's C" if mode.startswith("chunk-C") else "")
        rows.append([name, T, mode, t_f, t_fb, t_fb / t_f, gflops, 100 * gflops / peak, None, None, mem, note])
    ref = results.get("recurrent")
    for r in rows:
        res = results.get(r[2])
        if res and ref:
            r[8] = ref["fwd_ms"] / res["fwd_ms"]
            r[9] = ref["fwd_bwd_ms"] / res["fwd_bwd_ms"]
            res["speedup_fwd"], res["speedup_fwd_bwd"] = r[8], r[9]
    # decoding: one step with a carried state
    q, k, v, gk = make_inputs(B, 1, H, K, V, decay, dev)
    S = torch.zeros(B, H, K, V, device=dev)

    def step():
        with torch.no_grad():
            g = gk[:, 0] if gk is not None else None
            recurrence_step(q[:, 0], k[:, 0], v[:, 0], *((None, g) if decay.startswith("value") else (g, None)), S, check_values=False)

    t_s = timeit(step, repeats=20, device=dev)["min_ms"]
    results["step"] = dict(ms_per_token=t_s)
    rows.append([name, 1, "step", t_s, None, None, flops("step", B, 1, H, K, V) / (t_s * 1e-3) / 1e9, None, None, None, None, "per token"])
    results["auto"] = auto_mode(T, K, V, keywise=decay == "key", valuewise=decay.startswith("value"), complex_=False,
                                chunk_size=C_rule, strong_decays=decay == "value-strong")
    results["chunk_size_rule"] = C_rule
    if args.chunk_sweep:
        results["sweep"] = chunk_sweep(B, T, H, K, V, decay, args)
    return rows, results


SWEEP = (16, 32, 64, 128, 256)


def chunk_sweep(B, T, H, K, V, decay, args):
    """fwd+bwd of the chunk mode (manual backward) for each C, interleaved over the repeats so
    that a change in the machine's load hits every C alike; min per C."""
    q, k, v, gk = make_inputs(B, T, H, K, V, decay, args.device, requires_grad=True)
    fns = {}
    for C in SWEEP:
        def fb(C=C):
            o, _ = linear_recurrence(q, k, v, **decays(decay, gk), mode="chunk", chunk_size=C, check_values=False)
            o.sum().backward()
        fns[C] = fb
    times = {C: float("inf") for C in SWEEP}
    for f in fns.values():
        f()
    for _ in range(args.repeats):
        for C, f in fns.items():
            times[C] = min(times[C], timeit(f, repeats=1, warmup=0, device=args.device)["min_ms"])
    best = min(times, key=times.get)
    print(f"  chunk sweep B={B} T={T} H={H} K={K} V={V} {decay}: "
          + ", ".join(f"C={C}: {t:.0f} ms" for C, t in times.items()) + f"; best C={best}")
    return dict(times_ms=times, best=best)


def subnormal(args) -> dict:
    """The chunk mode's decay factors below e^-60 taken as 0 (``recurrence._decay_exp``, the default) against the same
    op with every factor computed as it is (``recurrence._FLUSH_BELOW`` emptied for the timing), on a Mamba-2-like
    shape (B 1, T 512 (256 --quick), 8 heads, K = N = 64, V = 64, one log-decay per head and token, Δ·a in
    [-8, 0]: strong decays, as Mamba-2's at its initialization, whose products fall below the smallest normal
    float32), in one run: forward and forward+backward (min over --repeats), the ratio, and the largest difference
    of the two outputs and of each against the reference (``recurrent``, every factor as it is) relative to the
    output's largest entry."""
    from seqmix.ops import recurrence as R

    T = 256 if args.quick else 512
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, 8, 64, generator=g) for _ in range(3))
    gk = -torch.rand(1, T, 8, generator=g) * 8.0

    def run(grad: bool):
        xs = [t.clone().requires_grad_(grad) for t in (q, k, v, gk)]
        o, _ = linear_recurrence(*xs, mode="chunk", chunk_size=CHUNK, check_values=False)
        if grad:
            o.sum().backward()
        return o.detach()

    saved = dict(R._FLUSH_BELOW)
    out, times = {}, {}
    for label, table in (("flushed (default)", saved), ("every factor", {})):
        R._FLUSH_BELOW.clear()
        R._FLUSH_BELOW.update(table)
        try:
            out[label] = run(False)
            times[label] = (timeit(lambda: run(False), repeats=args.repeats)["min_ms"],
                            timeit(lambda: run(True), repeats=args.repeats)["min_ms"])
        finally:
            R._FLUSH_BELOW.clear()
            R._FLUSH_BELOW.update(saved)
    ref, _ = linear_recurrence(q, k, v, gk, mode="recurrent", check_values=False)
    scale = ref.abs().max()
    a, b = out["flushed (default)"], out["every factor"]
    rows = [[label, f"{f:.2f}", f"{fb:.2f}", f"{float((o - ref).abs().max() / scale):.1e}"]
            for (label, (f, fb)), o in zip(times.items(), (a, b))]
    print_table(f"chunk mode, strong per-head decays (B 1, T {T}, H 8, K = V = 64, log-decay in [-8, 0], C {CHUNK})",
                ["decay factors", "fwd ms", "fwd+bwd ms", "max |o - recurrent| / max |o|"], rows)
    (f0, fb0), (f1, fb1) = times["flushed (default)"], times["every factor"]
    diff = float((a - b).abs().max() / scale)
    print(f"  flushed vs every factor: forward {f1 / f0:.2f}x, forward+backward {fb1 / fb0:.2f}x faster; "
          f"outputs differ by {diff:.1e} of the largest output")
    return dict(T=T, times_ms=times, speedup_fwd=f1 / f0, speedup_fwd_bwd=fb1 / fb0, max_rel_diff=diff)


def fixed_decay(args) -> dict:
    """The chunk mode's form for a per-head decay that no token changes (``recurrence._chunk_fixed``: lightning
    attention's and MiniMax's fixed γ_h, handed as a layer constant broadcast along time) against the general chunk
    form (the same decays materialized per token, ``.contiguous()``), forward without autograd (where the fixed form
    runs), interleaved in one loop, C 64, K = V = 64, four heads with lightning attention's decays: (B 1, T 512, the
    bench/interop.py MiniMax layer's shape) and (B 2, T 4096); min and median over the repeats, the ratio, and each
    output's largest difference from the reference (``recurrent``) relative to the output's largest entry."""
    import statistics
    import time

    gamma = torch.tensor([0.25, 0.0625, 0.015625, 0.00390625])  # lightning attention's e^{-8(h+1)/H}, H = 4
    shapes = [(1, 256 if args.quick else 512), (2, 1024 if args.quick else 4096)]
    rows, out = [], {}
    for B, T in shapes:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, T, 4, 64, generator=g) for _ in range(3))
        fixed = (-gamma).view(1, 1, 4).expand(B, T, 4)
        runs = {"fixed-decay form": fixed, "general chunk form": fixed.contiguous()}
        times = {name: [] for name in runs}
        with torch.no_grad():
            outs = {name: linear_recurrence(q, k, v, gk, mode="chunk", chunk_size=CHUNK, check_values=False)[0]
                    for name, gk in runs.items()}
            reps = max(args.repeats, 3) * (20 if T <= 512 else 4)
            for i in range(reps + 2):
                for name in (list(runs) if i % 2 else list(runs)[::-1]):
                    t0 = time.perf_counter()
                    linear_recurrence(q, k, v, runs[name], mode="chunk", chunk_size=CHUNK, check_values=False)
                    if i >= 2:
                        times[name].append((time.perf_counter() - t0) * 1e3)
            ref = linear_recurrence(q, k, v, fixed.contiguous(), mode="recurrent", check_values=False)[0]
        scale = ref.abs().max()
        res = {}
        for name in runs:
            res[name] = dict(min_ms=min(times[name]), median_ms=statistics.median(times[name]),
                             max_rel_err=float((outs[name] - ref).abs().max() / scale))
            rows.append([f"B {B}, T {T}", name, f"{res[name]['min_ms']:.3f}", f"{res[name]['median_ms']:.3f}",
                         f"{res[name]['max_rel_err']:.1e}"])
        a, b = res["fixed-decay form"], res["general chunk form"]
        res["ratio_median"] = b["median_ms"] / a["median_ms"]
        rows.append([f"B {B}, T {T}", "general / fixed (median)", "", f"{res['ratio_median']:.2f}x", ""])
        out[f"B{B}_T{T}"] = res
    print_table(f"chunk mode, one decay per head no token changes (H 4, K = V = 64, C {CHUNK}, forward, no autograd; "
                f"interleaved)", ["shape", "form", "min ms", "median ms", "max |o - recurrent| / max |o|"], rows)
    return out


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--subnormal", action="store_true", help="only the chunk mode with its small decay factors taken as 0 "
                   "against every factor as it is, on strong per-head decays (subnormal floats: seqmix.ops.recurrence._decay_exp)")
    p.add_argument("--chunk-sweep", action="store_true", help="also time the chunk mode's fwd+bwd for C in 16..256 per case")
    p.add_argument("--cases", type=lambda x: x.split(","), default=None, help="comma-separated subset of key,head,s6,diagonal "
                   "(default all)")
    p.add_argument("--modes", type=lambda x: x.split(","), default=None,
                   help="comma-separated rows to time (recurrent,chunk-autograd,chunk,chunk-C,parallel; default all): "
                        "the loop's rows take minutes at T = 4096 on a loaded machine; targets needing a missing row print n/a")
    p.add_argument("--fixed-decay", action="store_true", help="only the chunk mode's form for a per-head decay that no token "
                   "changes against the general chunk form (seqmix.ops.recurrence._chunk_fixed)")
    args = p.parse_args()
    info = setup(args)
    if args.fixed_decay:
        print(f"machine: {info}")
        write_json(args, "recurrence_fixed_decay", dict(machine=info, **fixed_decay(args)))
        return
    if args.subnormal:
        print(f"machine: {info}")
        write_json(args, "recurrence_subnormal", dict(machine=info, **subnormal(args)))
        return
    peak = matmul_peak_gflops(args.device, sizes=(512, 1024) if args.quick else (1024, 2048, 3072))
    print(f"machine: {info}\nfloat32 matmul peak measured now: {peak:.1f} GFLOP/s\n")

    Ts = [256, 512] if args.quick else [1024, 2048, 4096]
    cases = []
    for decay in ("key", "head"):
        for T in Ts:
            cases.append((f"{decay}-wise K=V=64", 2, T, 4, 64, 64, decay))
    cases.append(("S6-like H=256 K=16 V=1", 2, 512 if args.quick else 2048, 256, 16, 1, "key"))
    # a diagonal state: RWKV-4's / the LinRNNs' channels folded into one head of V value channels
    cases.append(("diagonal H=1 K=1 V=512", 1, 512 if args.quick else 1024, 1, 1, 512, "value"))
    cases.append(("diagonal strong H=1 K=1 V=512", 1, 512 if args.quick else 1024, 1, 1, 512, "value-strong"))
    if args.cases:
        kind = {"key": "key-wise", "head": "head-wise", "s6": "S6-like", "diagonal": "diagonal"}
        unknown = [x for x in args.cases if x not in kind]
        if unknown:
            raise SystemExit(f"--cases: unknown {unknown}; expected a subset of {', '.join(kind)}")
        cases = [c for c in cases if any(c[0].startswith(kind[x]) for x in args.cases)]

    all_rows, results = [], {}
    for name, B, T, H, K, V, decay in cases:
        rows, res = run_case(name, B, T, H, K, V, decay, args, peak)
        all_rows += rows
        results[f"{name} T={T}"] = dict(shape=dict(B=B, T=T, H=H, K=K, V=V, decay=decay), **res)
        print(f"done: {name} T={T}")

    print_table(
        f"linear_recurrence modes ({info['device']}, {info['threads']} threads, chunk {CHUNK}; times are the min of {args.repeats})",
        ["case", "T", "mode", "fwd ms", "fwd+bwd ms", "f+b / fwd", "GFLOP/s", "% peak", "x rec fwd", "x rec f+b", "peak MB f+b", "note"],
        all_rows,
    )

    print("\ntargets (2-core CPU, T=4096, K=V=64):")
    targets = []
    T_big = Ts[-1]

    def row(decay, T, mode):
        return results.get(f"{decay}-wise K=V=64 T={T}", {}).get(mode)

    for decay in ("key", "head"):
        r = row(decay, T_big, "chunk")
        rec = row(decay, T_big, "recurrent")
        if r and rec:
            sp = r["speedup_fwd_bwd"]
            targets.append(target_line(f"chunk fwd+bwd >= 10x recurrent ({decay}-wise, T={T_big})", sp >= 10, f"{sp:.1f}x"))
        else:
            targets.append(target_line(f"chunk fwd+bwd >= 10x recurrent ({decay}-wise, T={T_big})", None, "rows not timed (--modes)"))
        if r:
            targets.append(target_line(f"chunk fwd >= 25% of matmul peak ({decay}-wise, T={T_big})", r["pct_peak"] >= 25,
                                       f"{r['pct_peak']:.1f}% ({r['gflops']:.1f} of {peak:.1f} GFLOP/s)"))
    r, before = row("key", T_big, "chunk"), row("key", T_big, "chunk-autograd")
    if r and before:
        ratio = r["bwd_over_fwd"]
        targets.append(target_line(f"chunk fwd+bwd <= 3x fwd, manual backward (key-wise, T={T_big})", ratio <= 3,
                                   f"{ratio:.2f}x ({r['fwd_bwd_ms']:.0f} / {r['fwd_ms']:.0f} ms); autograd through the chunk form: "
                                   f"{before['bwd_over_fwd']:.2f}x ({before['fwd_bwd_ms']:.0f} / {before['fwd_ms']:.0f} ms); "
                                   f"fwd+bwd {before['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}x faster"))
    if not args.no_memory:
        for decay in ("key", "head"):
            if not all(row(decay, T, m) for T in Ts for m in ("chunk", "chunk-autograd")):
                continue
            mems = [row(decay, T, "chunk")["peak_mem_mb"] for T in Ts]
            befores = [row(decay, T, "chunk-autograd")["peak_mem_mb"] for T in Ts]
            e = fit_exponent(Ts, mems)
            targets.append(target_line(f"manual backward: memory linear in T and below autograd's ({decay}-wise)",
                                       e < 1.2 and mems[-1] < befores[-1],
                                       f"peak MB {', '.join(f'{m:.0f}' for m in mems)} (autograd {', '.join(f'{m:.0f}' for m in befores)}) "
                                       f"at T={Ts}: exponent {e:.2f}"))
    for key in [k for k in results if k.startswith("S6-like")]:
        s6 = results[key]
        times = ", ".join(f"{m} {s6[m]['fwd_bwd_ms']:.0f} ms" for m in s6 if isinstance(s6[m], dict) and "fwd_bwd_ms" in s6[m])
        print(f"\n{key}: auto runs '{s6['auto']}' (chunk size rule: C={s6['chunk_size_rule']}); fwd+bwd: {times}")
    if args.quick:
        print("  (--quick: small shapes; the targets are defined at T=4096)")
    write_json(args, "recurrence", dict(machine=info, matmul_peak_gflops=peak, chunk_size=CHUNK, results=results, targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
