"""Softmax attention (SDPA) vs linear attention (chunk), training and decoding.

    python bench/attention.py            # the targets' sizes (a few minutes on 2 cores)
    python bench/attention.py --quick    # small sizes, seconds

Both mixers are built by name with the DSF paper's parametrization (W_qk: d -> 2n, W_v,
W_o; n = d_model = 256, 4 heads, float32, batch 1), so the projections cost the same
and the difference is the mixing: softmax_attention in mode "sdpa" (torch
scaled_dot_product_attention, causal) against linear_attention in mode "chunk"
(chunk 64).

1. Training: forward (no grad) and forward+backward (grads of every parameter and of x)
   for T in {512, ..., 16384}; times are the min over the repeats (at least 5 up to
   T = 2048, --repeats at 4096, 2 above), the two mixers run alternately so that load
   from other processes hits both alike; the ratio softmax / linear, and the crossover
   length: the smallest T from which linear attention is faster at every larger T
   measured.
2. Decoding: time per generated token (a T == 1 call with a Cache, min over
   --decode-tokens tokens, decoded round-robin over the three contexts so that load
   bursts hit them alike) after a context of 1k, 4k and 16k tokens, for softmax with its KV cache and
   linear attention with its recurrent state; and the state each keeps per sequence
   (Cache.floats() and Cache.nbytes()). Targets: linear attention's time per token flat
   within 20% from 1k to 16k, and its memory independent of the context. The softmax
   step writes into its KV cache's preallocated buffers (seqmix.ops.KVCache; bench/kv_cache.py
   compares it with the torch.cat cache it replaced), so its time per token is its read of
   the cache: O(L) bytes per token.
"""

from __future__ import annotations


import torch

from _common import add_decode_tokens, base_parser, decode_timings, print_table, setup, target_line, timeit, write_json

import seqmix

D_MODEL, HEADS, CHUNK = 256, 4, 64


def build(name: str, device: str):
    torch.manual_seed(0)
    cfg = dict(d_model=D_MODEL, heads=HEADS)
    if name == "linear_attention":
        cfg["chunk_size"] = CHUNK
    m = seqmix.build_mixer(name, **cfg).to(device)
    m.mode = "sdpa" if name == "softmax_attention" else "chunk"
    return m


def interleaved_min(fns: dict, repeats: int, device: str) -> dict:
    """Min wall time (ms) of each function, the functions run alternately (one warm-up each)
    so that a burst of load from other processes hits every competitor alike."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit(fn, repeats=1, warmup=0, device=device)["min_ms"])
    return best


def repeats_for(T: int, args) -> int:
    """More repeats where a run is cheap: at least 5 up to T = 2048, 2 above T = 4096."""
    if T <= 2048:
        return max(args.repeats, 5)
    return args.repeats if T <= 4096 else max(2, args.repeats - 1)


def training(args, Ts):
    dev = args.device
    mixers = {name: build(name, dev) for name in ("softmax_attention", "linear_attention")}
    rows, res = [], {}
    for T in Ts:
        x = torch.randn(1, T, D_MODEL, device=dev)
        xg = x.clone().requires_grad_(True)
        fwd, fwd_bwd = {}, {}
        for name, m in mixers.items():

            def f(m=m):
                with torch.no_grad():
                    m(x)

            def fb(m=m):
                m(xg).sum().backward()
                m.zero_grad(set_to_none=True)
                xg.grad = None

            fwd[name], fwd_bwd[name] = f, fb
        reps = repeats_for(T, args)
        t_f = interleaved_min(fwd, reps, dev)
        t_fb = interleaved_min(fwd_bwd, reps, dev)
        r = {name: dict(fwd_ms=t_f[name], fwd_bwd_ms=t_fb[name], repeats=reps) for name in mixers}
        sm, la = r["softmax_attention"], r["linear_attention"]
        r["ratio_fwd"] = sm["fwd_ms"] / la["fwd_ms"]
        r["ratio_fwd_bwd"] = sm["fwd_bwd_ms"] / la["fwd_bwd_ms"]
        res[T] = r
        rows.append([T, reps, sm["fwd_ms"], la["fwd_ms"], r["ratio_fwd"], sm["fwd_bwd_ms"], la["fwd_bwd_ms"], r["ratio_fwd_bwd"]])
        print(f"done: training T={T}")
    return rows, res


def crossover(res, key):
    """Smallest T from which linear attention is faster (ratio > 1) at every larger T; None if never."""
    Ts = sorted(res)
    for i, T in enumerate(Ts):
        if all(res[t][key] > 1 for t in Ts[i:]):
            return T
    return None


def decoding(args, contexts):
    """For each mixer: one Cache per context length, prefilled; then tokens are decoded round-robin
    over the contexts (_common.decode_timings); the min and median per context are reported."""
    rows, res = [], {}
    for name in ("softmax_attention", "linear_attention"):
        t = decode_timings(build(name, args.device), contexts, d_model=D_MODEL, tokens=args.decode_tokens, device=args.device)
        res[name] = {}
        for L in contexts:
            r = t[L]
            res[name][L] = dict(ms_per_token=r["ms_per_token"], median_ms=r["median_ms"], state_floats=r["state_floats"],
                                state_bytes=r["state_bytes"])
            rows.append([name, L, r["ms_per_token"], r["median_ms"], r["state_floats"], r["state_bytes"] / 2**20])
        print(f"done: decoding {name}")
    for L in contexts:
        res[f"ratio_{L}"] = res["softmax_attention"][L]["ms_per_token"] / res["linear_attention"][L]["ms_per_token"]
    return rows, res


def main():
    p = base_parser(__doc__.splitlines()[0])
    add_decode_tokens(p, quick=20, full=60)
    args = p.parse_args()
    info = setup(args)
    Ts = [128, 256, 512] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    contexts = [128, 512, 2048] if args.quick else [1024, 4096, 16384]
    print(f"machine: {info}\n")

    t_rows, t_res = training(args, Ts)
    print_table(
        f"training, d_model {D_MODEL}, {HEADS} heads, batch 1, float32 ({info['device']}, {info['threads']} threads; "
        f"min over the repeats, the two mixers run alternately)",
        ["T", "repeats", "softmax fwd ms", "linear fwd ms", "softmax/linear fwd", "softmax f+b ms", "linear f+b ms", "softmax/linear f+b"],
        t_rows,
    )
    x_fwd, x_fb = crossover(t_res, "ratio_fwd"), crossover(t_res, "ratio_fwd_bwd")
    print(f"crossover (linear attention faster from this length on): forward T = {x_fwd}, forward+backward T = {x_fb}")

    d_rows, d_res = decoding(args, contexts)
    print_table(
        f"decoding one token after a context of L tokens (min / median over {args.decode_tokens} tokens)",
        ["impl", "L", "ms/token", "median ms", "state floats/seq", "state MiB/seq"],
        d_rows,
    )

    print("\ntargets:")
    targets = []
    lin = d_res["linear_attention"]
    lo, hi = contexts[0], contexts[-1]
    flat = lin[hi]["ms_per_token"] / lin[lo]["ms_per_token"]
    targets.append(target_line(
        f"linear attention time per token flat within 20% from L={lo} to L={hi}", 0.8 <= flat <= 1.2,
        f"{lin[lo]['ms_per_token']:.3f} -> {lin[hi]['ms_per_token']:.3f} ms ({flat:.2f}x)",
    ))
    mem_const = len({lin[L]["state_floats"] for L in contexts}) == 1
    targets.append(target_line(
        "linear attention memory per sequence independent of the context", mem_const,
        ", ".join(f"L={L}: {lin[L]['state_floats']} floats" for L in contexts),
    ))
    sm = d_res["softmax_attention"]
    targets.append(target_line(
        "(for reference) softmax KV cache per sequence grows with L", None,
        ", ".join(f"L={L}: {sm[L]['state_floats']} floats" for L in contexts)
        + f"; time per token {sm[lo]['ms_per_token']:.3f} -> {sm[hi]['ms_per_token']:.3f} ms",
    ))
    targets.append(target_line(
        "crossover length reported", x_fwd is not None or x_fb is not None,
        f"forward {x_fwd}, forward+backward {x_fb} (softmax/linear at T={Ts[-1]}: fwd {t_res[Ts[-1]]['ratio_fwd']:.2f}x, f+b {t_res[Ts[-1]]['ratio_fwd_bwd']:.2f}x)",
    ))
    if args.quick:
        print("  (--quick: small sizes; the targets are defined at contexts 1k-16k)")
    write_json(args, "attention", dict(
        machine=info, d_model=D_MODEL, heads=HEADS, chunk_size=CHUNK, training={str(k): v for k, v in t_res.items()},
        crossover=dict(fwd=x_fwd, fwd_bwd=x_fb), decoding={k: ({str(L): r for L, r in v.items()} if isinstance(v, dict) else v) for k, v in d_res.items()},
        targets=targets, quick=args.quick,
    ))


if __name__ == "__main__":
    main()
