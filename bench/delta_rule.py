"""seqmix.ops.delta_rule: chunk (UT transform) vs the recurrent loop, and vs flash-linear-attention's naive reference.

    python bench/delta_rule.py            # the targets' shapes (minutes on 2 cores)
    python bench/delta_rule.py --quick    # small shapes, seconds

Shapes: B=2, H=4, K=V=64, T in {1024, 4096}, unit keys, β ~ U(0, 1), with no decay
(DeltaNet) and one decay per head (Gated DeltaNet); a key-wise decay (KDA) at the smaller
T. For each mode: forward and forward+backward time (min over --repeats), speedup over
``recurrent``, and the chunk forward's GFLOP/s as a % of the float32 matmul peak measured in
the same run.

FLOPs counted (chunk forward, per chunk of C tokens): 4C²K (the q-k and k-k scores) + C³ (the
UT transform's unit lower-triangular solve, C right-hand sides: T = (I + A)⁻¹ Diag(β)) + 2C²(K + V)
(T [V, K̃]) + 2C²V (P U) + 6CKV (W S, Q̃ S, K_wᵀ U). Elementwise work (decay factors, masks) is not
counted. recurrent: 7KV per token.

flash-linear-attention's naive delta rule (``fla.ops.delta_rule.naive``) is timed and
compared on the same inputs when ``fla`` is importable; otherwise the table says it is absent.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from _common import base_parser, matmul_peak_gflops, print_table, setup, target_line, timeit, write_json

from seqmix.ops import delta_rule

CHUNK = 64


def make_inputs(B, T, H, K, V, decay, device, requires_grad=False):
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, T, H, K, generator=g)
    k = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1)
    v = torch.randn(B, T, H, V, generator=g)
    beta = torch.rand(B, T, H, generator=g)
    gg = {"none": None, "head": -0.2 * torch.rand(B, T, H, generator=g), "key": -0.2 * torch.rand(B, T, H, K, generator=g)}[decay]
    return [None if t is None else t.to(device).requires_grad_(requires_grad) for t in (q, k, v, beta, gg)]


def flops(mode, B, T, H, K, V):
    if mode == "chunk":
        C = CHUNK
        n = math.ceil(T / C)
        return B * H * n * (4 * C * C * K + C ** 3 + 2 * C * C * (K + V) + 2 * C * C * V + 6 * C * K * V)
    return B * H * T * 7 * K * V


def fla_naive():
    """flash-linear-attention's naive delta rule (None when fla is not importable)."""
    try:
        from fla.ops.delta_rule.naive import delta_rule_recurrence  # noqa: PLC0415
    except Exception:  # noqa: BLE001  (absent, or present without its GPU dependencies)
        return None
    return delta_rule_recurrence


def run_case(name, B, T, H, K, V, decay, args, peak):
    dev = args.device
    rows, results = [], {}
    for mode in ("recurrent", "chunk"):
        q, k, v, beta, g = make_inputs(B, T, H, K, V, decay, dev)

        def fwd():
            with torch.no_grad():
                delta_rule(q, k, v, beta, g, mode=mode, chunk_size=CHUNK, check_values=False)

        leaves = make_inputs(B, T, H, K, V, decay, dev, requires_grad=True)

        def fwd_bwd():
            o, _ = delta_rule(*leaves, mode=mode, chunk_size=CHUNK, check_values=False)
            o.sum().backward()
            for t in leaves:
                if t is not None:
                    t.grad = None

        reps = max(1, args.repeats - 1) if mode == "recurrent" else args.repeats
        t_f = timeit(fwd, repeats=reps, device=dev)["min_ms"]
        t_fb = timeit(fwd_bwd, repeats=reps, device=dev)["min_ms"]
        gf = flops(mode, B, T, H, K, V) / (t_f * 1e-3) / 1e9
        results[mode] = dict(fwd_ms=t_f, fwd_bwd_ms=t_fb, gflops=gf, pct_peak=100 * gf / peak)
        rows.append([name, T, mode, t_f, t_fb, gf, 100 * gf / peak, None, None, ""])
    ref = results["recurrent"]
    for r in rows:
        res = results[r[2]]
        r[7], r[8] = ref["fwd_ms"] / res["fwd_ms"], ref["fwd_bwd_ms"] / res["fwd_bwd_ms"]
        res["speedup_fwd"], res["speedup_fwd_bwd"] = r[7], r[8]
    # flash-linear-attention's naive reference (its layout [B, H, T, K]; no decay: DeltaNet only)
    naive = fla_naive()
    if decay == "none":
        if naive is None:
            rows.append([name, T, "fla naive", None, None, None, None, None, None, "absent: fla not importable here"])
            results["fla_naive"] = "absent"
        else:
            q, k, v, beta, _ = make_inputs(B, T, H, K, V, decay, dev)
            o_ours, _ = delta_rule(q, k, v, beta, mode="chunk", chunk_size=CHUNK)
            tr = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
            o_fla = naive(tr(q) * K**-0.5, tr(k), tr(v), tr(beta))
            o_fla = (o_fla[0] if isinstance(o_fla, tuple) else o_fla).transpose(1, 2)
            o_ours_s, _ = delta_rule(q, k, v, beta, mode="chunk", chunk_size=CHUNK, scale=K**-0.5)
            err = float((o_fla - o_ours_s).abs().max() / o_ours_s.abs().max())
            t_n = timeit(lambda: naive(tr(q) * K**-0.5, tr(k), tr(v), tr(beta)), repeats=max(1, args.repeats - 1), device=dev)["min_ms"]
            results["fla_naive"] = dict(fwd_ms=t_n, rel_err_vs_chunk=err, chunk_speedup=t_n / results["chunk"]["fwd_ms"])
            rows.append([name, T, "fla naive", t_n, None, None, None, ref["fwd_ms"] / t_n, None, f"rel. err vs ours {err:.1e}"])
    return rows, results


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--lengths", default=None, help="comma-separated T (default 1024,4096; 256,512 with --quick)")
    p.add_argument("--decays", default="none,head", help="comma-separated decays of the main cases (none, head, key)")
    args = p.parse_args()
    info = setup(args)
    peak = matmul_peak_gflops(args.device, sizes=(512, 1024) if args.quick else (1024, 2048))
    print(f"machine: {info}\nfloat32 matmul peak measured now: {peak:.1f} GFLOP/s\n")
    Ts = [int(t) for t in args.lengths.split(",")] if args.lengths else ([256, 512] if args.quick else [1024, 4096])
    decays = args.decays.split(",")
    cases = [(f"{decay} K=V=64", 2, T, 4, 64, 64, decay) for decay in decays if decay != "key" for T in Ts]
    cases.append(("key K=V=64", 2, Ts[0], 4, 64, 64, "key"))  # KDA-style: at the smallest T only
    all_rows, results = [], {}
    for name, B, T, H, K, V, decay in cases:
        rows, res = run_case(name, B, T, H, K, V, decay, args, peak)
        all_rows += rows
        results[f"{name} T={T}"] = dict(shape=dict(B=B, T=T, H=H, K=K, V=V, decay=decay), **res)
        print(f"done: {name} T={T}", flush=True)
    print_table(
        f"delta_rule modes ({info['device']}, {info['threads']} threads, chunk {CHUNK}; times are the min of {args.repeats})",
        ["case", "T", "mode", "fwd ms", "fwd+bwd ms", "GFLOP/s", "% peak", "x rec fwd", "x rec f+b", "note"],
        all_rows,
    )
    T_big = Ts[-1]
    print(f"\ntargets (T={T_big}, K=V=64):")
    targets = []
    for decay in (d for d in decays if d != "key"):
        r = results[f"{decay} K=V=64 T={T_big}"]["chunk"]
        targets.append(target_line(f"chunk fwd+bwd >= 8x recurrent ({decay} decay, T={T_big})", r["speedup_fwd_bwd"] >= 8, f"{r['speedup_fwd_bwd']:.1f}x"))
        targets.append(target_line(f"chunk fwd % of matmul peak ({decay} decay, T={T_big}; reported, no target)", None,
                                   f"{r['pct_peak']:.1f}% ({r['gflops']:.1f} of {peak:.1f} GFLOP/s)"))
    if args.quick:
        print("  (--quick: small shapes; the targets are defined at T=4096)")
    write_json(args, "delta_rule", dict(machine=info, matmul_peak_gflops=peak, chunk_size=CHUNK, results=results, targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
