"""State space model kernels side by side: FFT vs direct long convolution, S6's
scan against the Mamba-reference-style loop and the unbind loop, the selective scan's modes at the
LM's Mamba shape, SSD chunked vs recurrent.

    python bench/ssm.py                     # the targets' shapes (several minutes on 2 cores)
    python bench/ssm.py --full-reference    # also the x[:, t] loop at L = 2048 (+ about 7 minutes)
    python bench/ssm.py --quick    # small shapes, seconds (no memory probes)
    python bench/ssm.py --modes-only [--chunk-sweep] [--candidates]   # part 4 alone
    python bench/ssm.py --cpp [--threads 1]   # part 5 alone: the C++ kernel vs the torch modes

1. Long causal convolution, one sequence of L = 4096 and 256 channels (S4/S4D's fft mode):
   ``fft_conv`` (rfft, n >= 2L) against ``direct_conv`` (conv1d, O(L²)), forward.
2. S6 forward+backward at (B=2, L=2048, d=256, d_state=16), the same computation by
   * "mamba-ref x[:, t]": Mamba's selective_scan_ref written as there (materialized
     deltaA and deltaB_u, a loop that indexes deltaA[:, :, i]: its backward is quadratic in L,
     so it runs once, no warm-up, and by default at L = 512, where the target is checked as a
     lower bound; --full-reference times it at L = 2048 too);
   * "linear_recurrence recurrent": the general op, one head per channel, K = 16, V = 1 (an
     unbind loop differentiated by autograd), and its "chunk" mode;
   * "selective_scan reference": the op's own unbind loop (autograd);
   * "selective_scan fused": the op S6 runs (hand-written reverse-time backward).
3. SSD forward+backward at (B=1, L=4096, 8 heads, head dim 64, d_state 64): the SSD mixer's
   op call, ``linear_recurrence`` with one log-decay per head, in "chunk" (the SSD algorithm,
   chunk 64) and "recurrent" modes.
4. The selective scan's modes at the LM backbone's Mamba shape (d_inner 512,
   d_state 16) with about 8k tokens per call, (B=16, T=512) and (B=1, T=8192 or --long T):
   reference / fused / chunked, forward (no gradient) and forward+backward, interleaved
   (each repeat runs every mode once), median of the repeats, ratios against fused.
   --chunk-sweep adds chunked at L = 16..256; --candidates times the within-chunk
   recurrences that chunked could use, forward only: the sequential in-place loop (kept),
   a Hillis-Steele parallel scan over the chunk (log2 L whole-chunk steps, mamba.py's idea),
   the log-space closed form h_t = e^(G_t) h_0 + Σ_s e^(G_t - G_s) b_s ([L, L, B, D, N]
   weights, the SSD trick with per-channel decays), and torch.compile of the chunk loop.
5. The "cpp" backend (seqmix.ops.cpp_scan, a fused C++ CPU kernel) beside the torch modes
   reference / chunked (backend="torch"), forward and forward+backward, interleaved, at the
   main job's S6 shape (B=16, T=32, D=64, N=8, and D=128: expand 2), (B=8, T=512, D=512,
   N=16) and (B=1, T=4096, D=512, N=16); ratios against chunked and against reference. The
   torch modes of parts 2 and 4 run with backend="torch"; part 4 adds "cpp" to its table.

Every competitor's output is compared with the first one's (max abs difference printed).
"""

from __future__ import annotations

import torch

import statistics
import time

from _common import base_parser, peak_memory_mb, print_table, setup, target_line, timeit, write_json

from seqmix.ops import linear_recurrence
from seqmix.ops.conv import direct_conv, fft_conv
from seqmix.ops.selective_scan import scan_chunk_size, selective_scan

SSD_CHUNK = 64


# ------------------------------------------------------------------------------------------
# 1. long convolution
# ------------------------------------------------------------------------------------------


def bench_conv(args):
    L, C = (1024, 64) if args.quick else (4096, 256)
    g = torch.Generator().manual_seed(0)
    u = torch.randn(1, L, C, generator=g).to(args.device)
    k = (torch.randn(L, C, generator=g) * torch.exp(-torch.arange(L).float() / 500).unsqueeze(1)).to(args.device)
    t_fft = timeit(lambda: fft_conv(u, k, check_values=False), repeats=args.repeats, device=args.device)["min_ms"]
    t_dir = timeit(lambda: direct_conv(u, k), repeats=args.repeats, device=args.device)["min_ms"]
    err = float((fft_conv(u, k) - direct_conv(u, k)).abs().max() / direct_conv(u, k).abs().max())
    rows = [[f"L={L} C={C}", "direct_conv", t_dir, 1.0, None], [f"L={L} C={C}", "fft_conv", t_fft, t_dir / t_fft, err]]
    print_table(f"long causal convolution, forward (min of {args.repeats})", ["case", "impl", "ms", "x direct", "rel err"], rows)
    return dict(L=L, C=C, direct_ms=t_dir, fft_ms=t_fft, speedup=t_dir / t_fft, rel_err=err)


# ------------------------------------------------------------------------------------------
# 2. S6
# ------------------------------------------------------------------------------------------


def s6_inputs(B, L, D, N, device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, L, D, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(B, L, D, generator=g) - 4)  # Δ ~ 0.02, Mamba's range
    A = -torch.arange(1, N + 1, dtype=torch.float32).repeat(D, 1)  # S4D-Real
    Bm, Cm = torch.randn(B, L, N, generator=g), torch.randn(B, L, N, generator=g)
    Dv = torch.ones(D)
    return [t.to(device).requires_grad_(True) for t in (x, delta, A, Bm, Cm, Dv)]


def mamba_reference_style(x, delta, A, Bm, Cm, Dv):
    """Mamba's selective_scan_ref, as written there (channel-first, x[:, t]-style indexing in the loop)."""
    u, delta, Bm, Cm = x.transpose(1, 2), delta.transpose(1, 2), Bm.transpose(1, 2), Cm.transpose(1, 2)  # (b, d, l), (b, n, l)
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, Bm, u)
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for i in range(u.shape[2]):
        h = deltaA[:, :, i] * h + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, :, i]))
    y = torch.stack(ys, dim=2) + u * Dv[:, None]
    return y.transpose(1, 2)


def via_linear_recurrence(mode):
    def run(x, delta, A, Bm, Cm, Dv):
        Bt, L, D = x.shape
        N = A.shape[1]
        o, _ = linear_recurrence(
            Cm.unsqueeze(2).expand(Bt, L, D, N), delta.unsqueeze(-1) * Bm.unsqueeze(2), x.unsqueeze(-1),
            delta.unsqueeze(-1) * A, mode=mode, check_values=False,
        )
        return o[..., 0] + Dv * x

    return run


def via_selective_scan(mode, backend="torch"):
    def run(x, delta, A, Bm, Cm, Dv):
        return selective_scan(x, delta, A, Bm, Cm, Dv, mode=mode, check_values=False, backend=backend)[0]

    return run


def cpp_available() -> bool:
    """Whether the "cpp" backend runs here (compiling it now if needed: its one-time cost is
    then outside the timings)."""
    from seqmix.ops import cpp_scan

    try:
        cpp_scan.load()
    except RuntimeError as e:
        print(f"  (the cpp backend is not available: {e})")
        return False
    return True


S6_IMPLS = {
    "mamba-ref x[:, t]": mamba_reference_style,
    "linear_recurrence recurrent": via_linear_recurrence("recurrent"),
    "linear_recurrence chunk": via_linear_recurrence("chunk"),
    "selective_scan reference": via_selective_scan("reference"),
    "selective_scan fused": via_selective_scan("fused"),
    "selective_scan chunked": via_selective_scan("chunked"),
    "selective_scan cpp": via_selective_scan("chunked", "cpp"),
}
SLOW = ("mamba-ref x[:, t]", "linear_recurrence chunk")  # run once, no warm-up


def s6_fwd_bwd(name, B, L, D, N, device):
    """Module-level builder (the memory probe runs it in another process)."""
    inputs = s6_inputs(B, L, D, N, device)
    impl = S6_IMPLS[name]

    def fwd_bwd():
        impl(*inputs).sum().backward()
        for t in inputs:
            t.grad = None

    return fwd_bwd


def bench_s6(args, B, L, D, N, names):
    dev = args.device
    inputs = s6_inputs(B, L, D, N, dev)
    with torch.no_grad():
        y_ref = S6_IMPLS["selective_scan reference"](*inputs)
    rows, res = [], {}
    for name in names:
        impl = S6_IMPLS[name]
        slow = name in SLOW
        reps = 1 if slow else args.repeats
        with torch.no_grad():
            err = float((impl(*inputs) - y_ref).abs().max())
        t_f = timeit(lambda: impl(*[t.detach() for t in inputs]), repeats=reps, warmup=0 if slow else 1, device=dev)["min_ms"]
        t_fb = timeit(s6_fwd_bwd(name, B, L, D, N, dev), repeats=reps, warmup=0 if slow else 1, device=dev)["min_ms"]
        mem = None
        if not (args.no_memory or args.quick or slow):
            mem = peak_memory_mb(s6_fwd_bwd, name, B, L, D, N, dev, device=dev)
        res[name] = dict(fwd_ms=t_f, fwd_bwd_ms=t_fb, repeats=reps, max_abs_diff=err, peak_mem_mb=mem)
        print(f"  done: S6 L={L} {name}")
    base = res.get("mamba-ref x[:, t]", {}).get("fwd_bwd_ms")
    unbind = res["linear_recurrence recurrent"]["fwd_bwd_ms"]
    for name, r in res.items():
        r["x_mamba_ref"] = base / r["fwd_bwd_ms"] if base else None
        r["x_unbind_loop"] = unbind / r["fwd_bwd_ms"]
        rows.append([name, r["fwd_ms"], r["fwd_bwd_ms"], r["x_mamba_ref"], r["x_unbind_loop"], r["peak_mem_mb"], r["max_abs_diff"], r["repeats"]])
    print_table(
        f"S6 scan (B={B}, L={L}, d={D}, d_state={N}); min of the repeats",
        ["impl", "fwd ms", "fwd+bwd ms", "x mamba-ref f+b", "x unbind f+b", "peak MB f+b", "max |Δy|", "repeats"],
        rows,
    )
    return dict(shape=dict(B=B, L=L, d=D, d_state=N), results=res)


# ------------------------------------------------------------------------------------------
# 3. SSD
# ------------------------------------------------------------------------------------------


def ssd_inputs(B, L, H, P, N, device):
    g = torch.Generator().manual_seed(0)
    delta = torch.nn.functional.softplus(torch.randn(B, L, H, generator=g) - 3)
    a = -torch.empty(H).uniform_(1, 16, generator=g)
    q = torch.randn(B, L, H, N, generator=g) * N**-0.5  # C
    k = delta.unsqueeze(-1) * torch.randn(B, L, H, N, generator=g)  # ΔB
    v = torch.randn(B, L, H, P, generator=g)  # x
    gk = delta * a  # Δ·a, one log-decay per head
    return [t.to(device).requires_grad_(True) for t in (q, k, v, gk)]


def ssd_fwd_bwd(mode, B, L, H, P, N, device):
    q, k, v, gk = ssd_inputs(B, L, H, P, N, device)

    def fwd_bwd():
        o, _ = linear_recurrence(q, k, v, gk, mode=mode, chunk_size=SSD_CHUNK, check_values=False)
        o.sum().backward()
        for t in (q, k, v, gk):
            t.grad = None

    return fwd_bwd


def bench_ssd(args):
    B, L, H, P, N = (1, 256, 8, 64, 64) if args.quick else (1, 4096, 8, 64, 64)
    dev = args.device
    q, k, v, gk = (t.detach() for t in ssd_inputs(B, L, H, P, N, dev))
    y_ref, _ = linear_recurrence(q, k, v, gk, mode="recurrent", check_values=False)
    res, rows = {}, []
    for mode in ("recurrent", "chunk"):
        reps = max(1, args.repeats - 1) if mode == "recurrent" else args.repeats
        y, _ = linear_recurrence(q, k, v, gk, mode=mode, chunk_size=SSD_CHUNK, check_values=False)
        t_f = timeit(lambda: linear_recurrence(q, k, v, gk, mode=mode, chunk_size=SSD_CHUNK, check_values=False), repeats=reps, device=dev)["min_ms"]
        t_fb = timeit(ssd_fwd_bwd(mode, B, L, H, P, N, dev), repeats=reps, device=dev)["min_ms"]
        mem = None if (args.no_memory or args.quick) else peak_memory_mb(ssd_fwd_bwd, mode, B, L, H, P, N, dev, device=dev)
        res[mode] = dict(fwd_ms=t_f, fwd_bwd_ms=t_fb, max_abs_diff=float((y - y_ref).abs().max()), peak_mem_mb=mem)
        print(f"  done: SSD {mode}")
    for mode, r in res.items():
        r["x_recurrent_fwd"] = res["recurrent"]["fwd_ms"] / r["fwd_ms"]
        r["x_recurrent_fwd_bwd"] = res["recurrent"]["fwd_bwd_ms"] / r["fwd_bwd_ms"]
        rows.append([mode, r["fwd_ms"], r["fwd_bwd_ms"], r["x_recurrent_fwd"], r["x_recurrent_fwd_bwd"], r["peak_mem_mb"], r["max_abs_diff"]])
    print_table(
        f"SSD (B={B}, L={L}, heads={H}, head dim={P}, d_state={N}, chunk {SSD_CHUNK}); min of the repeats",
        ["mode", "fwd ms", "fwd+bwd ms", "x rec fwd", "x rec f+b", "peak MB f+b", "max |Δy|"],
        rows,
    )
    return dict(shape=dict(B=B, L=L, heads=H, headdim=P, d_state=N, chunk=SSD_CHUNK), results=res)


# ------------------------------------------------------------------------------------------
# 4. the selective scan's modes at the LM's Mamba shape
# ------------------------------------------------------------------------------------------

SCAN_D, SCAN_N = 512, 16  # the LM backbone's Mamba: d_model 256, expand 2, d_state 16


def scan_fn(mode, L=None, backend="torch"):
    def run(x, delta, A, Bm, Cm, Dv):
        return selective_scan(x, delta, A, Bm, Cm, Dv, mode=mode, chunk_size=L, check_values=False, backend=backend)[0]

    return run


def interleaved(fns: dict, repeats: int, device: str, cpu: dict | None = None) -> dict:
    """{name: median wall ms}: one warm-up call each, then ``repeats`` rounds that call every
    function once (so that a change in the machine's load hits every competitor alike). ``cpu``,
    when given, receives {name: median CPU ms of this process} (all its threads: on a shared
    machine, the work done, less sensitive than the wall time to the time spent descheduled)."""
    from _common import sync

    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    cpu_times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            f()
            sync(device)
            times[k].append((time.perf_counter() - t0) * 1e3)
            cpu_times[k].append((time.process_time() - c0) * 1e3)
    if cpu is not None:
        cpu.update({k: statistics.median(v) for k, v in cpu_times.items()})
    return {k: statistics.median(v) for k, v in times.items()}


def _fwd(impl, inputs):
    detached = [t.detach() for t in inputs]

    def f():
        with torch.no_grad():
            impl(*detached)

    return f


def _fwd_bwd(impl, inputs):
    def f():
        impl(*inputs).sum().backward()
        for t in inputs:
            t.grad = None

    return f


def scan_shapes(args):
    if args.quick:
        return [(4, 128), (1, 1024)]
    return [(16, 512), (1, args.long)]


def bench_scan_modes(args) -> dict:
    """reference / fused / chunked (+ the chunk sweep), forward and forward+backward, interleaved."""
    out, rows = {}, []
    D, N = (64, 16) if args.quick else (SCAN_D, SCAN_N)
    for B, T in scan_shapes(args):
        inputs = s6_inputs(B, T, D, N, args.device)
        impls = {"fused": scan_fn("fused"), "chunked": scan_fn("chunked")}
        if cpp_available():
            impls["cpp"] = scan_fn("chunked", backend="cpp")
        if T <= 4096:  # the reference's autograd graph of T steps: slow, and GBs at long T
            impls = {"reference": scan_fn("reference"), **impls}
        if args.chunk_sweep:
            impls.update({f"chunked L={L}": scan_fn("chunked", L) for L in (16, 32, 64, 128, 256)})
        with torch.no_grad():
            y_ref = scan_fn("fused")(*inputs)
            errs = {k: float((f(*inputs) - y_ref).abs().max()) for k, f in impls.items()}
        c_f, c_fb = {}, {}
        t_f = interleaved({k: _fwd(f, inputs) for k, f in impls.items()}, args.repeats, args.device, c_f)
        t_fb = interleaved({k: _fwd_bwd(f, inputs) for k, f in impls.items()}, args.repeats, args.device, c_fb)
        res = {}
        for k in impls:
            res[k] = dict(fwd_ms=t_f[k], fwd_bwd_ms=t_fb[k], fwd_cpu_ms=c_f[k], fwd_bwd_cpu_ms=c_fb[k],
                          fwd_tokens_per_s=B * T / t_f[k] * 1e3, fwd_bwd_tokens_per_s=B * T / t_fb[k] * 1e3,
                          x_fused_fwd=t_f["fused"] / t_f[k], x_fused_fwd_bwd=t_fb["fused"] / t_fb[k],
                          x_fused_fwd_cpu=c_f["fused"] / c_f[k], x_fused_fwd_bwd_cpu=c_fb["fused"] / c_fb[k],
                          max_abs_diff_vs_fused=errs[k])
            r = res[k]
            rows.append([f"B={B} T={T}", k, r["fwd_ms"], r["x_fused_fwd"], r["x_fused_fwd_cpu"], r["fwd_bwd_ms"],
                         r["x_fused_fwd_bwd"], r["x_fused_fwd_bwd_cpu"], r["fwd_bwd_tokens_per_s"], r["max_abs_diff_vs_fused"]])
        out[f"B={B},T={T}"] = dict(B=B, T=T, d=D, d_state=N, chunk_auto=scan_chunk_size(B, D, N), results=res)
        print(f"  done: scan modes B={B} T={T} (auto chunk {scan_chunk_size(B, D, N)})", flush=True)
    print_table(f"selective scan modes (d={D}, d_state={N}); median of {args.repeats} interleaved repeats",
                ["case", "mode", "fwd ms", "x fused fwd", "(cpu)", "fwd+bwd ms", "x fused f+b", "(cpu)", "f+b tokens/s", "max |Δy|"],
                rows)
    print("  x fused: wall-time ratio; (cpu): the same ratio in CPU time of this process")
    return out


# ------------------------------------------------------------------------------------------
# 5. the C++ kernel (backend "cpp") beside the torch modes
# ------------------------------------------------------------------------------------------

CPP_SHAPES = [(16, 32, 64, 8), (16, 32, 128, 8), (8, 512, 512, 16), (1, 4096, 512, 16)]
CPP_SHAPES_QUICK = [(16, 32, 64, 8), (4, 256, 64, 16)]


def bench_cpp(args) -> dict:
    """reference / chunked (torch) / cpp, forward and forward+backward, interleaved repeats;
    ratios of cpp against chunked (the torch default) and against reference."""
    if not cpp_available():
        return {}
    out, rows = {}, []
    for B, T, D, N in (CPP_SHAPES_QUICK if args.quick else CPP_SHAPES):
        inputs = s6_inputs(B, T, D, N, args.device)
        impls = {"reference": scan_fn("reference"), "chunked": scan_fn("chunked"), "cpp": scan_fn("chunked", backend="cpp")}
        with torch.no_grad():
            y_ref = scan_fn("reference")(*inputs)
            errs = {k: float((f(*inputs) - y_ref).abs().max()) for k, f in impls.items()}
        reps = args.repeats if B * T * D * N <= 2**22 else max(3, args.repeats // 3)
        t_f = interleaved({k: _fwd(f, inputs) for k, f in impls.items()}, reps, args.device)
        t_fb = interleaved({k: _fwd_bwd(f, inputs) for k, f in impls.items()}, reps, args.device)
        res = {k: dict(fwd_ms=t_f[k], fwd_bwd_ms=t_fb[k], max_abs_diff_vs_reference=errs[k],
                       x_chunked_fwd=t_f["chunked"] / t_f[k], x_chunked_fwd_bwd=t_fb["chunked"] / t_fb[k],
                       x_reference_fwd=t_f["reference"] / t_f[k], x_reference_fwd_bwd=t_fb["reference"] / t_fb[k])
               for k in impls}
        for k, r in res.items():
            rows.append([f"B={B} T={T} D={D} N={N}", k, r["fwd_ms"], r["x_chunked_fwd"], r["x_reference_fwd"],
                         r["fwd_bwd_ms"], r["x_chunked_fwd_bwd"], r["x_reference_fwd_bwd"], r["max_abs_diff_vs_reference"]])
        out[f"B={B},T={T},D={D},N={N}"] = dict(B=B, T=T, d=D, d_state=N, repeats=reps, results=res)
        print(f"  done: cpp B={B} T={T} D={D} N={N}", flush=True)
    print_table(f"selective scan: cpp kernel vs torch modes (float32, {torch.get_num_threads()} threads); median of interleaved repeats",
                ["case", "impl", "fwd ms", "x chunked", "x reference", "fwd+bwd ms", "x chunked", "x reference", "max |Δy|"], rows)
    for case, m in out.items():
        r = m["results"]["cpp"]
        print(f"  cpp at {case}: forward {r['x_chunked_fwd']:.2f}x chunked, {r['x_reference_fwd']:.2f}x reference; "
              f"forward+backward {r['x_chunked_fwd_bwd']:.2f}x chunked, {r['x_reference_fwd_bwd']:.2f}x reference")
    return out


# within-chunk recurrences that the chunked mode could use (forward only, time-major [l, B, D, N])


def _within_sequential(dA, b, h0):
    """The chunked mode's: one in-place addcmul_ per step on the chunk's views."""
    a = dA.exp_()
    hv, av = b.unbind(0), a.unbind(0)
    hv[0].addcmul_(av[0], h0)
    for i in range(1, b.shape[0]):
        hv[i].addcmul_(av[i], hv[i - 1])
    return b


def _within_hillis_steele(dA, b, h0):
    """Hillis-Steele over the chunk: log2(l) rounds of whole-chunk ops on the pairs (a, b):
    (a, b)_t <- (a_t a_(t-k), a_t b_(t-k) + b_t); then h_t = b_t + a_t h_0 (a holds the products)."""
    a = dA.exp_()
    k, l = 1, b.shape[0]
    while k < l:
        b[k:] += a[k:] * b[:-k]  # the right side is formed before the update: no overlap
        a[k:] = a[k:] * a[:-k]
        k *= 2
    return b.addcmul_(a, h0)


def _within_logspace(dA, b, h0):
    """The closed form with cumulative log-decays G (the SSD trick, per channel and state):
    h_t = e^(G_t) h_0 + Σ_(s<=t) e^(G_t - G_s) b_s, through [l, l, B, D, N] weights."""
    G = dA.cumsum(0)
    l = G.shape[0]
    mask = torch.ones(l, l, dtype=torch.bool, device=G.device).tril()
    diff = (G.unsqueeze(1) - G.unsqueeze(0)).masked_fill_(~mask.view(l, l, 1, 1, 1), float("-inf"))
    return (diff.exp_() * b.unsqueeze(0)).sum(1).addcmul_(G.exp(), h0)


def chunk_driver(within, L):
    """A chunked forward (no gradient) around a within-chunk recurrence: y [B, T, D]."""
    def run(x, delta, A, Bm, Cm, Dv):
        tm = [t.transpose(0, 1).contiguous() for t in (x, delta, Bm, Cm)]
        x_, d_, B_, C_ = tm
        T, Bt, D = x_.shape
        h = x_.new_zeros(Bt, D, A.shape[1])
        ys = []
        for t0 in range(0, T, L):
            t1 = min(T, t0 + L)
            dA = d_[t0:t1].unsqueeze(-1) * A
            b = (d_[t0:t1] * x_[t0:t1]).unsqueeze(-1) * B_[t0:t1].unsqueeze(2)
            H = within(dA, b, h)
            ys.append(torch.linalg.vecdot(H, C_[t0:t1].unsqueeze(2)))
            h = H[-1].clone()
        return torch.cat(ys).transpose(0, 1) + Dv * x

    return run


def bench_candidates(args) -> dict:
    D, N = (64, 16) if args.quick else (SCAN_D, SCAN_N)
    out, rows = {}, []
    for B, T in scan_shapes(args):
        inputs = [t.detach() for t in s6_inputs(B, T, D, N, args.device)]
        L = scan_chunk_size(B, D, N)
        impls = {f"sequential L={L}": chunk_driver(_within_sequential, L),
                 f"hillis-steele L={L}": chunk_driver(_within_hillis_steele, L)}
        for Ll in (16, 32):
            if Ll * Ll * B * D * N <= 2**25:  # the [l, l, B, D, N] weights: at most 128 MiB
                impls[f"log-space closed form L={Ll}"] = chunk_driver(_within_logspace, Ll)
        comp_s = None
        if args.compile:
            compiled = torch.compile(_within_sequential_functional, dynamic=False)
            t0 = time.perf_counter()
            chunk_driver(compiled, 32)(*inputs)
            comp_s = time.perf_counter() - t0
            impls["torch.compile loop L=32"] = chunk_driver(compiled, 32)
        with torch.no_grad():
            y_ref = scan_fn("chunked")(*inputs)
            errs = {k: float((f(*inputs) - y_ref).abs().max()) for k, f in impls.items()}
        cpu = {}
        t = interleaved({k: (lambda f=f: f(*inputs)) for k, f in impls.items()}, args.repeats, args.device, cpu)
        base, cbase = t[f"sequential L={L}"], cpu[f"sequential L={L}"]
        res = {k: dict(fwd_ms=v, x_sequential=base / v, x_sequential_cpu=cbase / cpu[k], max_abs_diff=errs[k]) for k, v in t.items()}
        if comp_s is not None:
            res["torch.compile loop L=32"]["compile_s"] = comp_s
        for k, r in res.items():
            rows.append([f"B={B} T={T}", k, r["fwd_ms"], r["x_sequential"], r["x_sequential_cpu"], r["max_abs_diff"]])
        out[f"B={B},T={T}"] = res
        print(f"  done: candidates B={B} T={T}", flush=True)
    print_table(f"within-chunk recurrences, forward only (d={D}, d_state={N}); median of {args.repeats} interleaved",
                ["case", "candidate", "fwd ms", "x sequential", "(cpu)", "max |Δy|"], rows)
    return out


def _within_sequential_functional(dA, b, h0):
    """The sequential loop without in-place ops (what torch.compile traces)."""
    a = dA.exp()
    hs, h = [], h0
    for i in range(b.shape[0]):
        h = a[i] * h + b[i]
        hs.append(h)
    return torch.stack(hs)


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--full-reference", action="store_true",
        help="also time the x[:, t] loop at the target's L = 2048 (its backward is O(L²): about 7 minutes on 2 cores)",
    )
    p.add_argument("--modes-only", action="store_true", help="only part 4: the selective scan's modes")
    p.add_argument("--chunk-sweep", action="store_true", help="part 4 also times chunked at L = 16, 32, 64, 128, 256")
    p.add_argument("--candidates", action="store_true", help="part 4 also times the within-chunk recurrences, forward only")
    p.add_argument("--compile", action="store_true", help="with --candidates: also torch.compile of the chunk loop (minutes)")
    p.add_argument("--long", type=int, default=8192, help="T of part 4's long case (batch 1; default 8192)")
    p.add_argument("--cpp", action="store_true", help="only part 5: the C++ kernel (backend cpp) vs the torch modes")
    args = p.parse_args()
    info = setup(args)
    print(f"machine: {info}\n")
    if args.cpp:
        cpp = bench_cpp(args)
        write_json(args, "ssm-cpp", dict(machine=info, threads=torch.get_num_threads(), cpp=cpp, quick=args.quick))
        return
    if args.modes_only:
        modes = bench_scan_modes(args)
        cands = bench_candidates(args) if args.candidates else None
        write_json(args, "ssm-modes", dict(machine=info, scan_modes=modes, candidates=cands, quick=args.quick))
        return
    conv = bench_conv(args)
    B, L, D, N = (2, 128, 32, 16) if args.quick else (2, 2048, 256, 16)
    L_ref = 64 if args.quick else 512  # where the x[:, t] loop is timed by default
    every = [k for k in S6_IMPLS if k != "selective_scan cpp" or cpp_available()]
    s6 = bench_s6(args, B, L, D, N, every if args.full_reference else every[1:])
    s6_short = None if args.full_reference else bench_s6(args, B, L_ref, D, N, ["mamba-ref x[:, t]", "linear_recurrence recurrent", "selective_scan fused"])
    ssd = bench_ssd(args)
    modes = bench_scan_modes(args)
    cands = bench_candidates(args) if args.candidates else None
    cpp = bench_cpp(args)

    print("\ntargets (2-core CPU):")
    targets = [
        target_line(f"fft_conv >= 20x direct_conv (L={conv['L']}, {conv['C']} channels)", conv["speedup"] >= 20, f"{conv['speedup']:.1f}x"),
    ]
    r = s6["results"]
    fused = r["selective_scan fused"]
    ref_run = s6 if args.full_reference else s6_short
    rr = ref_run["results"]
    sp = rr["selective_scan fused"]["x_mamba_ref"]
    where = f"L={ref_run['shape']['L']}" + ("" if args.full_reference else f" (a lower bound for L={L}: the loop's backward is O(L²), the scan's O(L); --full-reference times L={L})")
    targets.append(target_line(
        f"S6 fwd+bwd >= 5x the Mamba-reference x[:, t] loop, {where}", sp >= 5,
        f"{sp:.1f}x ({rr['mamba-ref x[:, t]']['fwd_bwd_ms']:.0f} ms -> {rr['selective_scan fused']['fwd_bwd_ms']:.0f} ms)",
    ))
    targets.append(target_line(
        f"S6 fwd+bwd against the unbind loop (report), L={L}", None,
        f"{fused['x_unbind_loop']:.2f}x linear_recurrence recurrent ({r['linear_recurrence recurrent']['fwd_bwd_ms']:.0f} ms -> "
        f"{fused['fwd_bwd_ms']:.0f} ms), {r['selective_scan reference']['fwd_bwd_ms'] / fused['fwd_bwd_ms']:.2f}x the selective_scan reference loop",
    ))
    sp = ssd["results"]["chunk"]["x_recurrent_fwd_bwd"]
    targets.append(target_line(f"SSD chunked fwd+bwd >= 10x recurrent (L={ssd['shape']['L']})", sp >= 10, f"{sp:.1f}x"))
    if args.quick:
        print("  (--quick: small shapes; the targets are defined at the full shapes)")
    for case, m in modes.items():
        r = m["results"]["chunked"]
        targets.append(target_line(
            f"selective scan chunked (default) vs fused at {case} (report)", None,
            f"forward {r['x_fused_fwd']:.2f}x, forward+backward {r['x_fused_fwd_bwd']:.2f}x "
            f"({r['fwd_bwd_tokens_per_s']:,.0f} tokens/s fwd+bwd, auto chunk {m['chunk_auto']})",
        ))
    for case, m in cpp.items():
        r = m["results"]["cpp"]
        targets.append(target_line(
            f"selective scan cpp kernel vs chunked at {case} (report)", None,
            f"forward {r['x_chunked_fwd']:.2f}x, forward+backward {r['x_chunked_fwd_bwd']:.2f}x",
        ))
    write_json(args, "ssm", dict(machine=info, conv=conv, s6=s6, s6_reference_length=s6_short, ssd=ssd, scan_modes=modes,
                                 candidates=cands, cpp=cpp, targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
