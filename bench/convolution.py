"""Long convolutions (H3, Hyena) vs softmax attention (SDPA) and linear attention (chunk):
forward+backward time against the sequence length.

    python bench/convolution.py            # L in {1024, 4096, 16384}, d = 256 (a few minutes on 2 cores)
    python bench/convolution.py --quick    # small sizes, seconds

Every mixer is built by name at d_model = 256, batch 1, float32, and timed forward+backward
(gradients of x and of every parameter) in its fast training mode:

* hyena: order 2 (the reference code's convention, the Hyena paper's main setting), implicit
  filters (FFN width 64, emb_dim 33), l_max = the longest L, mode "fft" (FFT of size >= 2L);
* h3: head_dim 1, d_state 64, shift_size 64 (the H3 code's defaults), mode "fft";
* softmax_attention: 4 heads, mode "sdpa" (torch scaled_dot_product_attention, causal);
* linear_attention: 4 heads, mode "chunk" (chunk 64).

The four run alternately (one round each, the min over the rounds is reported) so that load
from other processes hits them alike. Fewer rounds at larger L (5 / 3 / 2). Softmax at the
largest L runs once, and only if its peak memory, extrapolated from two smaller lengths
(measured in a fresh process), fits in --memory-budget-gb; otherwise it is skipped with the
reason printed. The fitted exponent p of time ~ L^p is printed per mixer; an L log L cost
gives p = 1 + log(log L_max / log L_min)/log(L_max / L_min) (1.12 over 1024..16384) and an
L² cost p = 2. Targets: Hyena's and H3's 0.8 < p < 1.4 (L log L, not L²).

Also: the short causal convolution of Mamba, Mamba-2, Gated DeltaNet and the other conv mixers,
``causal_conv1d`` (W = 4, 1536 channels: Mamba-2's at d 512) forward and forward+backward against
torch's own depthwise ``F.conv1d`` (groups = C, the input padded by W − 1 on the left), the fair
competitor; and the S4D kernel that H3 (and S4D, GSS) computes each call, ``vandermonde_kernel`` forward
+backward for 256 systems of 32 complex modes, in two levels (z^l = z^(jb)·z^r, one matmul: the
op) against the one-level form it replaced (exp(l·log z) for every l, an [N, L] tensor).

Threads: 1 by default (--threads N to change). On a 2-core machine shared with other
processes, two OpenMP threads wait on each other at every barrier while the other process
holds a core, and single calls then take 10-50x their time (measured: 212 ms against 3.6 ms
for the same Hyena call); one thread gives stable, comparable figures.
"""

from __future__ import annotations

import math

import torch

from _common import base_parser, fit_exponent, peak_memory_mb, print_table, setup, target_line, timeit, write_json

import seqmix
from seqmix.ops.conv import causal_conv1d
from seqmix.ops.ssm import vandermonde_kernel

D_MODEL = 256
NAMES = ("hyena", "h3", "softmax_attention", "linear_attention")
CONFIGS = {
    "hyena": dict(order=2, order_convention="code", filter_order=64, emb_dim=33, mode="fft"),
    "h3": dict(head_dim=1, d_state=64, shift_size=64, mode="fft"),
    "softmax_attention": dict(heads=4, mode="sdpa"),
    "linear_attention": dict(heads=4, chunk_size=64, mode="chunk"),
}


def build(name: str, d: int, l_max: int, device: str):
    torch.manual_seed(0)
    cfg = dict(CONFIGS[name], d_model=d)
    if name == "hyena":
        cfg["l_max"] = l_max
    return seqmix.build_mixer(name, **cfg).to(device)


def fwd_bwd_fn(m, x):
    """One forward+backward: gradients of x and of every parameter."""
    xg = x.clone().requires_grad_(True)
    params = [p for p in m.parameters() if p.requires_grad]

    def fn():
        y = m(xg)
        torch.autograd.grad(y.sum(), [xg, *params])

    return fn


def _softmax_builder(d, T, device):  # module level: sent to a fresh process by peak_memory_mb
    m = build("softmax_attention", d, T, device)
    return fwd_bwd_fn(m, torch.randn(1, T, d, device=device))


def softmax_memory_ok(args, d, T_big, Ts):
    """(run?, reason): softmax's fwd+bwd peak memory at T_big, extrapolated from the two largest
    smaller lengths by a fitted power law, against the budget."""
    if args.no_memory:
        return True, "memory not checked (--no-memory)"
    small = [T for T in Ts if T < T_big][-2:]
    if len(small) < 2:
        return True, "no smaller lengths to extrapolate from"
    mem = [peak_memory_mb(_softmax_builder, d, T, args.device, device=args.device) for T in small]
    if any(v is None or v <= 0 for v in mem):
        return True, f"memory not measurable here ({mem})"
    p = fit_exponent(small, mem)
    pred_gb = mem[-1] * (T_big / small[-1]) ** p / 1024
    reason = (
        f"fwd+bwd peak {mem[0]:.0f} MB at L={small[0]}, {mem[1]:.0f} MB at L={small[1]} (~L^{p:.2f}) -> "
        f"predicted {pred_gb:.2f} GB at L={T_big}, budget {args.memory_budget_gb:g} GB"
    )
    return pred_gb <= args.memory_budget_gb, reason


def vandermonde_one_level(log_z, c, L):
    """The one-level form: K_l = 2·Re Σ_n c_n exp(l·log z_n), all N·L exponentials (the competitor)."""
    powers = torch.exp(log_z.unsqueeze(-1) * torch.arange(L, device=log_z.device, dtype=log_z.real.dtype))
    return 2 * (c.unsqueeze(-2) @ powers).squeeze(-2).real


def kernel_bench(args, Ts, H=256, M=32):
    """vandermonde_kernel (two levels) against the one-level form, forward+backward, per L."""
    g = torch.Generator().manual_seed(0)
    log_z = torch.complex(-torch.rand(H, M, generator=g) * 0.05, torch.randn(H, M, generator=g)).to(args.device).requires_grad_(True)
    c = torch.randn(H, M, generator=g, dtype=torch.complex64).to(args.device).requires_grad_(True)
    rows, res = [], {}
    for T in Ts:
        fns = {
            "two_level": lambda T=T: torch.autograd.grad(vandermonde_kernel(log_z, c, torch.ones_like(c), T).sum(), [log_z, c]),
            "one_level": lambda T=T: torch.autograd.grad(vandermonde_one_level(log_z, c, T).sum(), [log_z, c]),
        }
        t = {name: timeit(fn, repeats=2, warmup=0, device=args.device)["min_ms"] for name, fn in fns.items()}
        res[T] = dict(t, speedup=t["one_level"] / t["two_level"])
        rows.append([T, t["two_level"], t["one_level"], res[T]["speedup"]])
    return rows, res


def conv1d_depthwise(x, weight, bias):
    """torch's depthwise conv1d as a causal short convolution: x [B, T, C], weight [C, W] -> [B, T, C] (the competitor)."""
    W = weight.shape[1]
    xt = torch.nn.functional.pad(x.transpose(1, 2), (W - 1, 0))
    return torch.nn.functional.conv1d(xt, weight.unsqueeze(1), bias, groups=weight.shape[0]).transpose(1, 2)


def short_conv_bench(args, Ts, C=1536, W=4):
    """causal_conv1d against F.conv1d (depthwise), forward and forward+backward, per T: rows and results."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(C, W, generator=g).to(args.device).requires_grad_(True)
    b = torch.randn(C, generator=g).to(args.device).requires_grad_(True)
    impls = {"causal_conv1d": lambda x: causal_conv1d(x, w, b)[0], "F.conv1d": lambda x: conv1d_depthwise(x, w, b)}
    rows, res = [], {}
    for T in Ts:
        x = torch.randn(1, T, C, generator=g).to(args.device).requires_grad_(True)
        err = (impls["causal_conv1d"](x) - impls["F.conv1d"](x)).abs().max().item()
        t = {}
        for name, f in impls.items():
            with torch.no_grad():
                t[name, "fwd"] = timeit(lambda f=f: f(x), repeats=max(args.repeats, 5), device=args.device)["min_ms"]
            t[name, "fwd_bwd"] = timeit(lambda f=f: torch.autograd.grad(f(x).sum(), [x, w, b]), repeats=max(args.repeats, 5),
                                        device=args.device)["min_ms"]
        res[T] = {f"{n} {k}": v for (n, k), v in t.items()} | {"max_abs_diff": err}
        rows.append([T, t["causal_conv1d", "fwd"], t["F.conv1d", "fwd"], t["F.conv1d", "fwd"] / t["causal_conv1d", "fwd"],
                     t["causal_conv1d", "fwd_bwd"], t["F.conv1d", "fwd_bwd"], t["F.conv1d", "fwd_bwd"] / t["causal_conv1d", "fwd_bwd"], err])
    return rows, res


def rounds_for(T: int, Ts, args) -> int:
    i = Ts.index(T)
    return max(args.repeats, 5) if i == 0 else (args.repeats if i < len(Ts) - 1 else max(2, args.repeats - 1))


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(threads=1)
    p.add_argument("--memory-budget-gb", type=float, default=6.0, help="skip softmax at the largest L if its predicted peak exceeds this")
    args = p.parse_args()
    info = setup(args)
    dev = args.device
    d = 64 if args.quick else D_MODEL
    Ts = [256, 512, 1024] if args.quick else [1024, 4096, 16384]
    print(f"machine: {info}\n")
    mixers = {name: build(name, d, Ts[-1], dev) for name in NAMES}
    run_softmax_big, softmax_reason = softmax_memory_ok(args, d, Ts[-1], Ts)
    print(f"softmax at L={Ts[-1]}: {'run once' if run_softmax_big else 'SKIPPED'} ({softmax_reason})\n")

    res = {name: {} for name in NAMES}
    for T in Ts:
        x = torch.randn(1, T, d, device=dev)
        fns = {name: fwd_bwd_fn(m, x) for name, m in mixers.items()}
        rounds = rounds_for(T, Ts, args)
        if T == Ts[-1]:
            big_softmax = fns.pop("softmax_attention")
        for fn in fns.values():
            fn()  # warm-up
        best = {name: math.inf for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                best[name] = min(best[name], timeit(fn, repeats=1, warmup=0, device=dev)["min_ms"])
        for name, t in best.items():
            res[name][T] = dict(fwd_bwd_ms=t, rounds=rounds)
        if T == Ts[-1]:
            if run_softmax_big:
                res["softmax_attention"][T] = dict(fwd_bwd_ms=timeit(big_softmax, repeats=1, warmup=0, device=dev)["min_ms"], rounds=1)
            else:
                res["softmax_attention"][T] = dict(fwd_bwd_ms=None, rounds=0, skipped=softmax_reason)
        print(f"done: L={T} ({rounds} rounds)")

    rows = []
    for T in Ts:
        t = {name: res[name][T]["fwd_bwd_ms"] for name in NAMES}
        sm, la = t["softmax_attention"], t["linear_attention"]
        rows.append([
            T, t["hyena"], t["h3"], sm, la,
            sm / t["hyena"] if sm else None, sm / t["h3"] if sm else None,
            t["hyena"] / la, t["h3"] / la,
        ])
    print_table(
        f"forward+backward ms, d_model {d}, batch 1, float32 ({info['device']}, {info['threads']} threads; min over the rounds, "
        "the mixers run alternately)",
        ["L", "hyena", "h3", "softmax (sdpa)", "linear (chunk)", "softmax/hyena", "softmax/h3", "hyena/linear", "h3/linear"],
        rows,
    )

    k_rows, k_res = kernel_bench(args, Ts[-2:])
    print_table(
        "S4D kernel (H3's diagonal SSM), vandermonde_kernel forward+backward, 256 systems × 32 complex modes, ms",
        ["L", "two levels (op)", "one level (before)", "one / two"],
        k_rows,
    )

    c_rows, c_res = short_conv_bench(args, [256, 1024] if args.quick else [1024, 8192])
    print_table(
        "short causal convolution (W 4, 1536 channels, batch 1, float32), ms: causal_conv1d (the op) against torch's "
        "depthwise F.conv1d",
        ["T", "op fwd", "conv1d fwd", "conv1d / op", "op fwd+bwd", "conv1d fwd+bwd", "conv1d / op", "max |diff|"],
        c_rows,
    )

    lo, hi = Ts[0], Ts[-1]
    nlogn = 1 + math.log(math.log(hi) / math.log(lo)) / math.log(hi / lo)
    exps = {}
    for name in NAMES:
        pts = [(T, res[name][T]["fwd_bwd_ms"]) for T in Ts if res[name][T]["fwd_bwd_ms"]]
        exps[name] = fit_exponent(*zip(*pts)) if len(pts) >= 2 else None
    print_table(
        f"fitted exponent p of time ~ L^p over L = {lo}..{hi} (L log L gives {nlogn:.2f}, L² gives 2)",
        ["impl", "exponent", "points"],
        [[name, exps[name], len([T for T in Ts if res[name][T]['fwd_bwd_ms']])] for name in NAMES],
    )

    print("\ntargets:")
    targets = []
    for name in ("hyena", "h3"):
        targets.append(target_line(
            f"{name} forward+backward time grows as L log L (fitted exponent in (0.8, 1.4); L log L = {nlogn:.2f})",
            exps[name] is not None and 0.8 < exps[name] < 1.4,
            f"exponent {exps[name]:.2f}; " + ", ".join(f"L={T}: {res[name][T]['fwd_bwd_ms']:.0f} ms" for T in Ts),
        ))
    sm_hi = res["softmax_attention"][hi]["fwd_bwd_ms"]
    targets.append(target_line(
        "(for reference) softmax attention (SDPA) at the same sizes", None,
        f"exponent {exps['softmax_attention']:.2f}; " + (
            f"at L={hi}: {sm_hi / res['hyena'][hi]['fwd_bwd_ms']:.2f}x hyena, {sm_hi / res['h3'][hi]['fwd_bwd_ms']:.2f}x h3"
            if sm_hi else f"L={hi} skipped: {softmax_reason}"
        ),
    ))
    targets.append(target_line(
        "(for reference) linear attention (chunk) at the same sizes", None,
        f"exponent {exps['linear_attention']:.2f}; at L={hi}: hyena {res['hyena'][hi]['fwd_bwd_ms'] / res['linear_attention'][hi]['fwd_bwd_ms']:.2f}x, "
        f"h3 {res['h3'][hi]['fwd_bwd_ms'] / res['linear_attention'][hi]['fwd_bwd_ms']:.2f}x its time",
    ))
    T_c = max(c_res)
    targets.append(target_line(
        f"causal_conv1d at least as fast as torch's depthwise F.conv1d (T {T_c}, forward and forward+backward)",
        c_res[T_c]["causal_conv1d fwd"] <= c_res[T_c]["F.conv1d fwd"] and c_res[T_c]["causal_conv1d fwd_bwd"] <= c_res[T_c]["F.conv1d fwd_bwd"],
        f"forward {c_res[T_c]['F.conv1d fwd'] / c_res[T_c]['causal_conv1d fwd']:.2f}x, forward+backward "
        f"{c_res[T_c]['F.conv1d fwd_bwd'] / c_res[T_c]['causal_conv1d fwd_bwd']:.2f}x conv1d's speed",
    ))
    if args.quick:
        print("  (--quick: small sizes and d_model 64; the targets are defined at L = 1k..16k, d = 256)")
    write_json(args, "convolution", dict(
        machine=info, d_model=d, lengths=Ts, configs=CONFIGS,
        fwd_bwd_ms={name: {str(T): r for T, r in v.items()} for name, v in res.items()},
        exponents=exps, nlogn_exponent=nlogn, vandermonde_kernel_ms={str(T): r for T, r in k_res.items()},
        short_conv_ms={str(T): r for T, r in c_res.items()}, softmax_largest=dict(run=run_softmax_big, reason=softmax_reason),
        targets=targets, quick=args.quick,
    ))


if __name__ == "__main__":
    main()
