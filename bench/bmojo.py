"""B'MOJO vs full causal attention vs Mamba: training cost against L, decoding memory.

    python bench/bmojo.py            # L in {1024, 4096, 16384} (a few minutes on 2 cores)
    python bench/bmojo.py --quick    # L in {256, 512, 1024}, seconds

Every mixer is built by name at d_model 64, float32, batch 1:

* bmojo: window w = 128, m_f = 4 fading and m_e = 16 eidetic tokens, 4 heads, a Mamba block
  (expand 2, d_state 16) inside; mode "chunk" (the interleaved chunks, one batched SDPA);
* bmojo_f: the same with m_e = 0;
* softmax_attention: full causal attention, 4 heads, mode "sdpa" (torch's fused kernel);
* mamba: the Mamba block alone (expand 2, d_state 16; the fused selective scan).

1. Training: forward+backward (gradients of every parameter and of x) for each L; the
   competitors run alternately (min over the repeats) so that load bursts hit them alike; the
   exponent p of time ~ L^p fitted over the Ls, ratios to attention and to Mamba. Also timed
   alone: "memory attention", the op B'MOJO adds to its Mamba block
   (``chunked_memory_attention`` mode "chunk" on B'MOJO's shapes: 4 heads of 16, w = 128,
   m = 20). Targets: the memory attention linear (p <= 1.15), and B'MOJO scaling as the
   Mamba block inside it (p within 0.1 of Mamba's).
2. Decoding: a context of L tokens is prefilled into a Cache (the chunked forward with state),
   then tokens are decoded round-robin over the contexts (min over --decode-tokens); the floats each cache holds
   per sequence (Cache.floats()) against L. Target: B'MOJO's memory is the same for every L and
   equals the bound w - 1 raw tokens + m_f + m_e memory tokens (keys and values) + the SSM state
   + its bookkeeping (Bmojo.state_breakdown), while attention's KV cache grows with L.
"""

from __future__ import annotations


import torch

from _common import add_decode_tokens, base_parser, decode_timings, fit_exponent, print_table, setup, target_line, timeit, write_json

import seqmix
from seqmix.ops.memory_attention import chunked_memory_attention, n_chunks

D_MODEL, HEADS, WINDOW, M_F, M_E, D_STATE = 64, 4, 128, 4, 16, 16
NAMES = ("bmojo", "bmojo_f", "softmax_attention", "mamba")
OP = "memory attention"


def build(name: str, device: str):
    torch.manual_seed(0)
    if name in ("bmojo", "bmojo_f"):
        cfg = dict(d_model=D_MODEL, heads=HEADS, window=WINDOW, m_f=M_F, d_state=D_STATE, mode="chunk")
        if name == "bmojo":
            cfg["m_e"] = M_E
    elif name == "softmax_attention":
        cfg = dict(d_model=D_MODEL, heads=HEADS, mode="sdpa")
    else:
        cfg = dict(d_model=D_MODEL, d_state=D_STATE)
    return seqmix.build_mixer(name, **cfg).to(device)


def interleaved_min(fns: dict, repeats: int, device: str) -> dict:
    """Min wall time (ms) of each function, run alternately after one warm-up each."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], timeit(fn, repeats=1, warmup=0, device=device)["min_ms"])
    return best


def memory_attention_step(L: int, device: str):
    """forward+backward of the chunked interleaved attention alone, on B'MOJO's shapes."""
    H, K = HEADS, D_MODEL // HEADS
    G = n_chunks(0, L, WINDOW)
    g = torch.Generator(device=device).manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g, device=device).requires_grad_(True)

    q, k, v = leaf(1, L, H, K), leaf(1, L, H, K), leaf(1, L, H, K)
    k_mem, v_mem = leaf(1, G, M_F + M_E, H, K), leaf(1, G, M_F + M_E, H, K)
    valid = torch.ones(1, G, M_F + M_E, dtype=torch.bool, device=device)
    valid[:, 0] = False  # chunk 0 has no memory

    def fb():
        o = chunked_memory_attention(q, k, v, k_mem, v_mem, window=WINDOW, mem_valid=valid, mode="chunk", check_values=False)
        o.sum().backward()
        for t in (q, k, v, k_mem, v_mem):
            t.grad = None

    return fb


def training(args, Ls):
    dev = args.device
    mixers = {name: build(name, dev) for name in NAMES}
    rows, res = [], {}
    for L in Ls:
        xg = torch.randn(1, L, D_MODEL, device=dev, requires_grad=True)
        fns = {OP: memory_attention_step(L, dev)}
        for name, m in mixers.items():

            def fb(m=m):
                m(xg).sum().backward()
                m.zero_grad(set_to_none=True)
                xg.grad = None

            fns[name] = fb
        reps = max(args.repeats, 5) if L <= 1024 else args.repeats
        t = interleaved_min(fns, reps, dev)
        res[L] = {name: t[name] for name in (*NAMES, OP)}
        rows.append([L, reps, *(t[n] for n in NAMES), t[OP], t["softmax_attention"] / t["bmojo"], t["bmojo"] / t["mamba"]])
        print(f"done: training L={L}")
    return rows, res


def decoding(args, contexts):
    """Per mixer: prefill a Cache per context, decode tokens round-robin (_common.decode_timings)."""
    rows, res = [], {}
    for name in NAMES:
        t = decode_timings(build(name, args.device), contexts, d_model=D_MODEL, tokens=args.decode_tokens, device=args.device)
        res[name] = {}
        for L in contexts:
            r = t[L]
            res[name][L] = dict(state_floats=r["state_floats"], state_floats_after_decoding=r["state_floats_after"],
                                ms_per_token=r["ms_per_token"], median_ms=r["median_ms"])
            rows.append([name, L, r["state_floats"], r["state_floats_after"], r["ms_per_token"], r["median_ms"]])
        print(f"done: decoding {name}")
    return rows, res


def main():
    p = base_parser(__doc__.splitlines()[0])
    add_decode_tokens(p, quick=10, full=40)
    args = p.parse_args()
    info = setup(args)
    Ls = [256, 512, 1024] if args.quick else [1024, 4096, 16384]
    print(f"machine: {info}\n")

    t_rows, t_res = training(args, Ls)
    print_table(
        f"forward+backward ms, d_model {D_MODEL}, batch 1, float32 ({info['device']}, {info['threads']} threads; min over the repeats, "
        f"competitors alternate); bmojo: w={WINDOW}, m_f={M_F}, m_e={M_E}, mode chunk",
        ["L", "repeats", *NAMES, OP, "attention/bmojo", "bmojo/mamba"],
        t_rows,
    )
    exps = {n: fit_exponent(Ls, [t_res[L][n] for L in Ls]) for n in (*NAMES, OP)}
    print("fitted exponent p of time ~ L^p: " + ", ".join(f"{n} {exps[n]:.2f}" for n in exps))

    d_rows, d_res = decoding(args, Ls)
    print_table(
        f"decoding after a context of L tokens (min / median over {args.decode_tokens} tokens)",
        ["impl", "L", "cache floats/seq", "after decoding", "ms/token", "median ms"],
        d_rows,
    )
    bm = build("bmojo", "cpu")
    br = bm.state_breakdown()
    print(
        "bmojo memory bound per sequence (floats): "
        + ", ".join(f"{k} {v}" for k, v in br.items())
        + f"  [= (w-1 + m_f + m_e) = {WINDOW - 1 + M_F + M_E} tokens × (n + d) = {bm.n + D_MODEL}, + SSM {br['ssm']}, + bookkeeping {br['bookkeeping']}]"
    )

    print("\ntargets:")
    targets = [
        target_line("B'MOJO's memory attention (chunked, interleaved) linear in L (fitted exponent <= 1.15)", exps[OP] <= 1.15,
                    f"p = {exps[OP]:.2f}"),
        target_line("B'MOJO forward+backward scales as its Mamba block (no quadratic term: exponent within 0.1 of Mamba's)",
                    exps["bmojo"] <= exps["mamba"] + 0.1,
                    f"p = {exps['bmojo']:.2f} (bmojo_f {exps['bmojo_f']:.2f}, mamba {exps['mamba']:.2f}, full attention {exps['softmax_attention']:.2f})"),
    ]
    mem = [d_res["bmojo"][L]["state_floats"] for L in Ls] + [d_res["bmojo"][L]["state_floats_after_decoding"] for L in Ls]
    targets.append(target_line(
        "B'MOJO decoding memory bounded: the same for every L and = w-1 + m_f + m_e tokens' KV + SSM state + bookkeeping",
        len(set(mem)) == 1 and mem[0] == br["total"],
        f"{mem[0]} floats per sequence at every L (bound {br['total']}; the paper's axis (w + m_f + m_e)·(n+d) + d_inner·N = {br['memory_axis']})",
    ))
    sm = d_res["softmax_attention"]
    targets.append(target_line(
        "(for reference) attention's KV cache grows with L", None,
        ", ".join(f"L={L}: {sm[L]['state_floats']}" for L in Ls),
    ))
    last = Ls[-1]
    targets.append(target_line(
        f"(for reference) ratios at L={last}", None,
        f"attention/bmojo {t_res[last]['softmax_attention'] / t_res[last]['bmojo']:.2f}x, bmojo/mamba {t_res[last]['bmojo'] / t_res[last]['mamba']:.2f}x",
    ))
    if args.quick:
        print("  (--quick: small sizes; the targets are defined at L = 1k-16k)")
    write_json(args, "bmojo", dict(
        machine=info, config=dict(d_model=D_MODEL, heads=HEADS, window=WINDOW, m_f=M_F, m_e=M_E, d_state=D_STATE),
        training={str(k): v for k, v in t_res.items()}, exponents=exps,
        decoding={n: {str(L): r for L, r in v.items()} for n, v in d_res.items()}, memory_bound=br, targets=targets, quick=args.quick,
    ))


if __name__ == "__main__":
    main()
