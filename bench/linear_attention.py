"""MetaLA and GLA (the general form, seqmix.mixers.linear_attention): chunk vs recurrent mode, and decoding.

    python bench/linear_attention.py            # the targets' shapes (a few minutes on 2 cores)
    python bench/linear_attention.py --quick    # small shapes, seconds

1. Training: forward+backward at (B=2, T=4096, d=512, 4 heads), in ``chunk`` and in
   ``recurrent`` mode, side by side, of (a) the core, the recurrence (Eqs. 13-14) on the
   mixer's own q, k, v, log α, which is what the mode changes, and (b) the whole token mixer
   (projections, short conv, recurrence, self-augmentation, norm, gate); the ratio
   recurrent / chunk (target >= 10x on a 2-core CPU, evaluated on the core; the whole
   mixer's ratio is printed beside it: its projections, about 25 GFLOP of fwd+bwd matmuls,
   cost the same in both modes and bound it). After warm-ups, two rounds of (--repeats chunk runs, one recurrent run) alternate the
   modes, so that the machine's load hits both alike; the minimum per mode is reported.
2. Decoding: prefill a context of L tokens (chunk mode, no grad) for L = 1k, 4k, 16k, then
   time one-token steps with each cache, round-robin over the lengths (the minimum over
   --steps tokens per length, --decode-threads threads; target: flat, the slowest within 1.5x
   of the fastest). Also the floats of state each sequence holds.
"""

from __future__ import annotations


import torch

from _common import base_parser, decode_timings, fit_exponent, mixer_fwd_bwd, print_table, setup, target_line, timeit, write_json

import seqmix

MIXERS = ("metala", "gla")


def build(name, d, heads, mode, device):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, d_model=d, heads=heads, mode=mode).to(device)


def core_fwd_bwd(m, x):
    """The core operator alone (what the mode changes): the recurrence of Eq. 13-14 on the
    mixer's own q, k, v, log α for x, as leaves, forward and backward."""
    with torch.no_grad():
        P = m._params(x, None, False)
    leaves = [t.detach().clone().requires_grad_(True) for t in (P.q, P.k, P.v, P.gk)]

    def run():
        for t in leaves:
            t.grad = None
        P.q, P.k, P.v, P.gk = leaves
        o, _ = m._core(P, None, m.mode, False)
        o.sum().backward()

    return run


def time_training(name, B, T, d, H, args):
    """{"mixer": (chunk ms, recurrent ms), "core": (...)}: forward+backward of the whole token
    mixer and of its core, the two modes timed in alternation (rounds of --repeats chunk runs and
    one recurrent run), so that a change in the machine's load hits both alike; the minimum per mode."""
    dev = args.device
    x = torch.randn(B, T, d, generator=torch.Generator().manual_seed(1)).to(dev).requires_grad_(True)
    m = build(name, d, H, "chunk", dev)
    out = {}
    for part, make in (("mixer", mixer_fwd_bwd), ("core", core_fwd_bwd)):
        run = make(m, x)
        m.mode = "chunk"
        run()  # warm-up (the first backward of a depthwise conv at a new shape pays oneDNN's kernel generation)
        m.mode = "recurrent"
        make(m, torch.randn(B, 64, d, device=dev, requires_grad=True))()  # warm-up at a short length
        chunk, rec = [], []
        for _ in range(2):
            m.mode = "chunk"
            chunk.append(timeit(run, repeats=args.repeats, warmup=0, device=dev)["min_ms"])
            m.mode = "recurrent"
            rec.append(timeit(run, repeats=1, warmup=0, device=dev)["min_ms"])
        out[part] = (min(chunk), min(rec))
    return out


def time_decoding(name, B, d, H, contexts, steps, args):
    """Prefill one cache per context length, then time one-token steps round-robin over the
    caches with --decode-threads threads (_common.decode_timings); min per length."""
    m = build(name, d, H, "chunk", args.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.decode_threads)
    try:
        t = decode_timings(m, contexts, d_model=d, tokens=steps, device=args.device, batch=B, warmup=8)
    finally:
        torch.set_num_threads(threads)
    return {L: dict(prefill_ms=r["prefill_ms"], state_floats=r["state_floats"], ms_per_token=r["ms_per_token"],
                    median_ms_per_token=r["median_ms"]) for L, r in t.items()}


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=64, help="decoding steps timed per context length")
    p.add_argument("--decode-threads", type=int, default=1,
                   help="torch threads while timing decoding steps (default 1: a one-token step's ops are too small to split, "
                        "and on a shared machine a parallel region waits for a descheduled thread)")
    args = p.parse_args()
    info = setup(args)
    print(f"machine: {info}\n")
    if args.quick:
        B, T, d, H, contexts = 2, 512, 128, 4, [256, 1024, 4096]
    else:
        B, T, d, H, contexts = 2, 4096, 512, 4, [1024, 4096, 16384]

    results, rows, targets = {}, [], []
    for name in MIXERS:
        tr = time_training(name, B, T, d, H, args)
        tokens = B * T
        results[name] = dict(shape=dict(B=B, T=T, d=d, heads=H))
        for part, (chunk, rec) in tr.items():
            results[name][part] = dict(chunk_fwd_bwd_ms=chunk, recurrent_fwd_bwd_ms=rec, speedup=rec / chunk,
                                       chunk_tokens_per_s=tokens / (chunk * 1e-3))
            rows.append([f"{name} {part}", T, "chunk", chunk, tokens / (chunk * 1e-3), rec / chunk])
            rows.append([f"{name} {part}", T, "recurrent", rec, tokens / (rec * 1e-3), 1.0])
        print(f"done: {name} training", flush=True)
    print_table(
        f"forward+backward, B={B} T={T} d={d} heads={H} ({info['threads']} threads; min over 2 rounds of {args.repeats} chunk runs and 1 recurrent run). "
        "mixer: the whole token mixer; core: the recurrence on the mixer's q, k, v, α",
        ["case", "T", "mode", "fwd+bwd ms", "tokens/s", "x recurrent"], rows,
    )
    r_m, r_g = results["metala"]["mixer"], results["gla"]["mixer"]
    print(f"MetaLA / GLA chunk time (whole mixer): {r_m['chunk_fwd_bwd_ms'] / r_g['chunk_fwd_bwd_ms']:.2f}")

    drows = []
    for name in MIXERS:
        dec = time_decoding(name, 1, d, H, contexts, args.steps, args)
        results[name]["decoding"] = dec
        for L, r in dec.items():
            drows.append([name, L, r["ms_per_token"], r["median_ms_per_token"], r["prefill_ms"], r["state_floats"]])
        print(f"done: {name} decoding", flush=True)
    print_table(
        f"decoding one token with the cache after a context of L tokens (B=1, d={d}; {args.decode_threads} thread(s); min over {args.steps} steps)",
        ["case", "T", "ms/token", "median ms/token", "prefill ms", "state floats"], drows,
    )

    print(f"\ntargets (2-core CPU, B={B} T={T} d={d} heads={H}):")
    for name in MIXERS:
        r = results[name]
        c, mx = r["core"], r["mixer"]
        targets.append(target_line(f"{name}: chunk fwd+bwd >= 10x recurrent (the core, which the mode changes)", c["speedup"] >= 10,
                                   f"{c['speedup']:.1f}x ({c['recurrent_fwd_bwd_ms']:.0f} ms vs {c['chunk_fwd_bwd_ms']:.0f} ms)"))
        targets.append(target_line(f"{name}: the same for the whole mixer (projections are the same work in both modes)", mx["speedup"] >= 10,
                                   f"{mx['speedup']:.1f}x ({mx['recurrent_fwd_bwd_ms']:.0f} ms vs {mx['chunk_fwd_bwd_ms']:.0f} ms)"))
        per = [r["decoding"][L]["ms_per_token"] for L in contexts]
        flat = max(per) / min(per)
        slope = fit_exponent(contexts, per)
        targets.append(target_line(f"{name}: decoding time per token flat from {contexts[0]} to {contexts[-1]}", flat <= 1.5,
                                   f"{', '.join(f'{t:.3f}' for t in per)} ms/token; max/min {flat:.2f}, exponent {slope:.3f}"))
    if args.quick:
        print("  (--quick: small shapes; the targets are defined at B=2, T=4096, d=512, contexts 1k-16k)")
    write_json(args, "linear_attention", dict(machine=info, results=results, targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
