"""GPU benchmark of the op backends: run on a CUDA machine.

    python bench/gpu.py              # every op, then LM training throughput (~125M params, T = 2048, bf16)
    python bench/gpu.py --quick      # smaller shapes, two LM families
    python bench/gpu.py --smoke      # tiny shapes on CPU: checks this script's code paths, times nothing useful

Without CUDA (and without --smoke) it prints why and exits with status 0.

Per op (bf16 inputs, forward and forward+backward, min of --repeats after warm-up):
  * ``torch``:   seqmix's op with backend="torch" (the pure-PyTorch path);
  * ``backend``: seqmix's op with backend="<name>" (fla / mamba / sdpa), through the dispatch;
  * ``direct``:  the library's function called directly with the same tensors.
Printed: the dispatch overhead (backend / direct - 1; target <= 10%), and the torch path's
time over the kernel's. A library that is not installed is reported, its rows skipped.
Also the cost of the chunk mode's tile choice with and without its host read (seqmix.debug) on CUDA.

LM throughput: LanguageModel (models/lm.py) at d_model 768, 12 layers, vocab 50304, T = 2048,
bf16 autocast, AdamW; tokens/s over timed optimizer steps and model FLOPs utilisation
MFU = 6 · N_params · tokens/s / peak, with the bf16 matmul peak measured in the same run
(6N counts the matmuls of the parameters only, not attention's T² term). Each family is timed
with backend="auto" (installed kernels) and with every op forced to torch.
"""

from __future__ import annotations

import math
import sys
import time

import torch
from rich.markup import escape

from _common import base_parser, print_table, setup, target_line, timeit, write_json

from seqmix.ops import backends, causal_conv1d, linear_recurrence, selective_scan, softmax_attention

LM_FAMILIES = ["softmax_attention", "gla", "retnet", "mamba", "mamba2"]


def bf16_peak_tflops(device, n=8192):
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t = timeit(lambda: a @ a, repeats=5, device=device)["min_ms"]
    return 2 * n**3 / (t * 1e-3) / 1e12


def fwd_bwd(fn, leaves):
    def run():
        out = fn(*leaves)
        o = out[0] if isinstance(out, tuple) else out
        o.float().sum().backward()
        for t in leaves:
            t.grad = None
    return run


def fwd_only(fn, leaves):
    def run():
        with torch.no_grad():
            fn(*leaves)
    return run


SIZES = {  # B, T, H, K (= V), D (scan and conv channels), N (scan state)
    "full": (4, 2048, 16, 64, 1536, 16),
    "quick": (2, 1024, 8, 64, 768, 16),
    "smoke": (1, 32, 2, 8, 16, 4),
}


def op_cases(dev, size, dtype):
    """(case, backend name, call, leaves, torch fn, backend fn, direct fn): ``call`` is what the op's dispatch
    knows of it (backends.Call), so the backend and direct rows run only where the backend covers it."""
    g = torch.Generator().manual_seed(0)
    B, T, H, K, Dc, N = SIZES[size]
    V = K

    def r(*s, sc=1.0):
        return (torch.randn(*s, generator=g) * sc).to(dev, dtype).requires_grad_(True)

    q, k, v = r(B, T, H, K), r(B, T, H, K, sc=K**-0.5), r(B, T, H, V)
    gkk = (-torch.rand(B, T, H, K, generator=g) * 0.1).to(dev, dtype).requires_grad_(True)
    gkh = (-torch.rand(B, T, H, generator=g) * 0.1).to(dev, dtype).requires_grad_(True)
    cases = []
    for name, gk in (("key-wise", gkk), ("per-head", gkh), ("no decay", None)):
        leaves = [q, k, v] + ([gk] if gk is not None else [])

        def ours(backend):
            return lambda q, k, v, *g_: linear_recurrence(q, k, v, g_[0] if g_ else None, scale=K**-0.5,
                                                          mode="chunk", check_values=False, backend=backend)[0]

        def direct(q, k, v, *g_, name=name):
            if name == "key-wise":
                from fla.ops.gla import chunk_gla
                return chunk_gla(q=q, k=k, v=v, g=g_[0], scale=K**-0.5)[0]
            from fla.ops.simple_gla import chunk_simple_gla
            return chunk_simple_gla(q=q, k=k, v=v, g=g_[0] if g_ else None, scale=K**-0.5)[0]

        call = backends.Call("linear_recurrence", q.device.type, dtype, "chunk", dict(K=K, V=V, valuewise=False, complex=False))
        cases.append((f"linear_recurrence {name} B={B} T={T} H={H} K=V={K}", "fla", call, leaves, ours("torch"), ours("fla"),
                      direct))

    x, delta = r(B, T, Dc), torch.nn.functional.softplus(r(B, T, Dc)).detach().requires_grad_(True)
    A = (-torch.rand(Dc, N, generator=g)).to(dev, torch.float32).requires_grad_(True)
    Bm, Cm, D = r(B, T, N), r(B, T, N), torch.randn(Dc, generator=g).to(dev, torch.float32).requires_grad_(True)

    def scan(backend):
        return lambda x, d, A, Bm, Cm, D: selective_scan(x, d, A, Bm, Cm, D, check_values=False, backend=backend)[0]

    def scan_direct(x, d, A, Bm, Cm, D):
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
        return selective_scan_fn(x.transpose(1, 2), d.transpose(1, 2), A, Bm.transpose(1, 2), Cm.transpose(1, 2), D=D).transpose(1, 2)

    call = backends.Call("selective_scan", x.device.type, dtype, "auto", dict(initial_state=False, per_channel_BC=False))
    cases.append((f"selective_scan B={B} T={T} D={Dc} N={N}", "mamba", call, [x, delta, A, Bm, Cm, D], scan("torch"), scan("mamba"),
                  scan_direct))

    w, bias = r(Dc, 4), r(Dc)

    def conv(backend):
        return lambda x, w, b: causal_conv1d(x, w, b, activation="silu", backend=backend)[0]

    def conv_direct(x, w, b):
        from causal_conv1d import causal_conv1d_fn
        return causal_conv1d_fn(x.transpose(1, 2), w, b, activation="silu").transpose(1, 2)

    call = backends.Call("short_conv", x.device.type, dtype, None, dict(W=4, state=False, output_final_state=False))
    cases.append((f"short conv B={B} T={T} C={Dc} W=4", "mamba", call, [x, w, bias], conv("torch"), conv("mamba"), conv_direct))

    def attn(backend, mode="auto"):
        return lambda q, k, v: softmax_attention(q, k, v, mode=mode, check_values=False, backend=backend)

    def attn_direct(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                                is_causal=True).transpose(1, 2)

    call = backends.Call("softmax_attention", q.device.type, dtype, "auto", dict(plain_causal=True))
    cases.append((f"softmax_attention B={B} T={T} H={H} K={K}", "sdpa", call, [q, k, v], attn("torch", "parallel"), attn("sdpa"),
                  attn_direct))
    return cases


def refusal(bname: str, call: backends.Call) -> str | None:
    """None where the dispatch would run ``call`` on backend ``bname`` (installed, covering the call's device,
    dtype and options, ready), else its reason: the rule of ``backend="auto"`` and of ``seqmix backends``."""
    try:
        backends.resolve(call.op, bname, call)
    except ValueError as e:
        return str(e)
    return None


def bench_ops(args, dev):
    rows, out, targets = [], {}, []
    size = "smoke" if args.smoke else "quick" if args.quick else "full"
    for name, bname, call, leaves, f_torch, f_backend, f_direct in op_cases(dev, size, torch.float32 if args.smoke else torch.bfloat16):
        why = refusal(bname, call)
        res = {"skipped": why}
        for impl, fn in (("torch", f_torch), ("backend", f_backend), ("direct", f_direct)):
            if impl != "torch" and why is not None:  # the kernel is not called: it cannot run these tensors
                res[impl] = None
                continue
            res[impl] = dict(fwd_ms=timeit(fwd_only(fn, leaves), repeats=args.repeats, device=dev)["min_ms"],
                             fwd_bwd_ms=timeit(fwd_bwd(fn, leaves), repeats=args.repeats, device=dev)["min_ms"])
        for impl in ("torch", "backend", "direct"):
            rr = res[impl]
            rows.append([name, f"{impl} ({bname})" if impl != "torch" else "torch", rr and rr["fwd_ms"], rr and rr["fwd_bwd_ms"],
                         "" if rr else escape(why)])
        if res.get("backend") and res.get("direct"):
            over = res["backend"]["fwd_bwd_ms"] / res["direct"]["fwd_bwd_ms"] - 1
            ratio = res["torch"]["fwd_bwd_ms"] / res["direct"]["fwd_bwd_ms"]
            res["dispatch_overhead"], res["torch_over_kernel"] = over, ratio
            targets.append(target_line(f"dispatch overhead <= 10% ({name})", over <= 0.10, f"{100 * over:+.1f}%; torch path {ratio:.1f}x the kernel"))
        out[name] = res
    print_table(f"ops on {dev} (min of {args.repeats})", ["case", "impl", "fwd ms", "fwd+bwd ms", "note"], rows)
    return out, targets


def tile_choice_cost(dev):
    """The chunk mode's tile choice: with host reads (policy "always") it reads the decays' span back
    once (a host sync on CUDA); by default ("auto") an accelerator reads nothing and takes fixed tiles."""
    from seqmix.debug import host_reads
    from seqmix.ops.recurrence import _tile_size

    G = (-torch.rand(4, 16, 32, 64, 64, device=dev) * 0.1).cumsum(-2)
    out = {}
    for policy in ("always", "auto"):
        with host_reads(policy):
            out[policy] = timeit(lambda: _tile_size(64, None, G, None), repeats=20, device=dev)["min_ms"]
    print(f"\nchunk mode tile choice at [4, 16, 32, 64, 64]: {out['always']:.3f} ms per call reading the span (host reads "
          f"'always'), {out['auto']:.3f} ms without (the default off the CPU)")
    return out


def bench_lm(args, dev, peak_tflops):
    from seqmix.models import build_model

    d, L, vocab, T, B = (768, 12, 50304, 2048, 8) if not args.smoke else (64, 2, 256, 64, 2)
    if args.quick and not args.smoke:
        B = 4
    fams = LM_FAMILIES[:2] if args.quick else LM_FAMILIES
    rows, out = [], {}
    for fam in fams:
        try:
            model = build_model({"mixer": fam, "d_model": d, "n_layers": L, "vocab_size": vocab, "max_seq_len": T}).to(dev)
        except ValueError as e:
            rows.append([fam, None, None, None, None, f"not built: {e}"])
            continue
        n_params = sum(p.numel() for p in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
        ids = torch.randint(0, vocab, (B, T + 1), device=dev)

        def step():
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                logits = model(ids[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        res = {}
        for label, ctx in (("auto", None), ("torch", backends.auto_uses_torch)):
            try:
                if ctx:
                    with ctx():
                        ms = timeit(step, repeats=args.repeats, warmup=2, device=dev)["min_ms"]
                else:
                    ms = timeit(step, repeats=args.repeats, warmup=2, device=dev)["min_ms"]
            except torch.cuda.OutOfMemoryError:
                res[label] = None
                torch.cuda.empty_cache()
                continue
            tps = B * T / (ms * 1e-3)
            mfu = 6 * n_params * tps / (peak_tflops * 1e12) if peak_tflops else None
            res[label] = dict(step_ms=ms, tokens_per_s=tps, mfu=mfu)
            rows.append([fam, f"{n_params / 1e6:.0f}M", label, ms, tps, None if mfu is None else 100 * mfu])
        out[fam] = dict(params=n_params, **res)
        del model, opt
        if dev == "cuda":
            torch.cuda.empty_cache()
    print_table(f"LM training steps, T={T}, batch {B}, bf16 autocast (min of {args.repeats})",
                ["case", "params", "mode", "step ms", "tokens/s", "MFU %"], rows)
    return out


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: exercise the code paths, no meaningful times")
    p.add_argument("--skip-lm", action="store_true", help="only the ops")
    args = p.parse_args()
    if not torch.cuda.is_available() and not args.smoke:
        print("bench/gpu.py: no CUDA device here (torch.cuda.is_available() is False); nothing timed. "
              "Run it on a GPU machine (optionally with `pip install seqmix[gpu]` for the kernels), "
              "or with --smoke to check its code paths on CPU.")
        return 0
    dev = "cpu" if args.smoke else "cuda"
    args.device = dev
    if args.smoke:
        args.quick, args.repeats = True, 1
    info = setup(args)
    print(f"machine: {info}")
    for b in backends.listing():
        print(f"  backend {b['backend']:6s} {b['op']:18s} {'installed' if b['installed'] else 'missing: ' + b['reason']}")
    peak = None if args.smoke else bf16_peak_tflops(dev)
    if peak:
        print(f"bf16 matmul peak measured now: {peak:.0f} TFLOP/s")
    ops, targets = bench_ops(args, dev)
    tile = tile_choice_cost(dev)
    lm = None if args.skip_lm else bench_lm(args, dev, peak)
    write_json(args, "gpu" if not args.smoke else "gpu-smoke", dict(machine=info, bf16_peak_tflops=peak, ops=ops, targets=targets,
                                                                 tile_choice_ms=tile, lm=lm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
