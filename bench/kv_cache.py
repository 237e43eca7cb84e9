"""Softmax decoding: the KV cache in preallocated buffers vs a torch.cat cache (a new tensor per step).

    python bench/kv_cache.py             # contexts 1k, 4k, 16k (about a minute on 2 cores)
    python bench/kv_cache.py --quick     # contexts 128, 512, 2048 (seconds)

One softmax_attention layer (d_model 256, 4 heads, float32, batch 1), mixer level: the time of
one decoding step (a T == 1 call) after a context of L tokens, two implementations measured in
the same run, round-robin over the contexts and the implementations (so load from other
processes hits all alike), min and median over --decode-tokens steps:

* ``cat (a7daefb)``: the layer's projections, then ``seqmix.ops.attention.attention_step`` of
  commit a7daefb (``--old-rev``; loaded from ``git show a7daefb:src/seqmix/ops/attention.py``), which
  appends to the cache with torch.cat: every token copies the whole cache;
* ``buffers``: the mixer's own step, ``SoftmaxAttention`` with a ``Cache``: its
  ``KVCache`` writes the token into a preallocated slot (the capacity doubles when full).

Both start from the same prefilled cache and must give the same outputs (checked).

What attention's arithmetic predicts. A step costs the projections, 8·d² flops (W_qk: d -> 2d,
W_v, W_o), and the read of the cache, 4·L·d flops (scores and the weighted sum over L keys of
width d), streaming L·2d cached floats: cost(L) ∝ 8d² + 4Ld (flops and bytes give the same
ratio here). For d = 256 that is a ratio cost(16k)/cost(1k) = 11.0, tending to 16 where the read
dominates; the read alone (``attention_decode`` over the cache, also timed) should follow 16×.
On a CPU a step also pays a fixed per-call cost (Python, dispatch: a few hundred µs, far more
than the projections' 0.5 Mflop), measured as step − read; the script prints the ratio the
arithmetic predicts with it, (c0 + 16·read(1k)) / (c0 + read(1k)), and checks that step − read
does not grow with L (no O(L) copy left: the torch.cat cache's does).
"""

from __future__ import annotations

import statistics
import subprocess
import time
import types

import torch

from _common import ROOT, add_decode_tokens, base_parser, print_table, setup, sync, target_line, write_json

import seqmix
from seqmix import Cache
from seqmix.ops import attention_decode

D_MODEL, HEADS = 256, 4
#: the last commit whose softmax mixer appended its KV cache with torch.cat per token
OLD_REV = "a7daefb"


def load_old_ops(rev: str = OLD_REV) -> types.ModuleType:
    """seqmix/ops/attention.py as of ``rev``, as a module of the installed seqmix.ops package
    (its relative imports resolve to today's helpers: checks, backends, precision)."""
    src = subprocess.run(["git", "show", f"{rev}:src/seqmix/ops/attention.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType("seqmix.ops._attention_at_" + rev)
    mod.__package__ = "seqmix.ops"
    exec(compile(src, f"{rev}:src/seqmix/ops/attention.py", "exec"), mod.__dict__)
    return mod


def predicted_ratio(L_hi: int, L_lo: int, d: int = D_MODEL) -> float:
    return (8 * d * d + 4 * L_hi * d) / (8 * d * d + 4 * L_lo * d)


def main():
    p = base_parser(__doc__.splitlines()[0])
    add_decode_tokens(p, quick=20, full=40)
    p.add_argument("--old-rev", default=OLD_REV, help=f"the commit whose attention_step is the torch.cat baseline (default {OLD_REV})")
    args = p.parse_args()
    info = setup(args)
    dev = args.device
    contexts = [128, 512, 2048] if args.quick else [1024, 4096, 16384]
    print(f"machine: {info}\n")
    old = load_old_ops(args.old_rev)

    torch.manual_seed(0)
    m = seqmix.build_mixer("softmax_attention", d_model=D_MODEL, heads=HEADS).to(dev).eval()
    m.mode = "sdpa"

    def old_step(x, st):
        """The mixer's step at --old-rev: projections, torch.cat attention_step, readout."""
        q, k, v = m._qkv(x)
        o, st["k"], st["v"] = old.attention_step(q[:, 0], k[:, 0], v[:, 0], st["k"], st["v"], scale=1.0, window=None)
        return m._readout(o.unsqueeze(1))

    new_caches, old_states = {}, {}
    with torch.no_grad():
        for L in contexts:
            x = torch.randn(1, L, D_MODEL, generator=torch.Generator().manual_seed(L)).to(dev)
            new_caches[L] = Cache()
            m(x, cache=new_caches[L])
            kv = new_caches[L].get(m)["kv"]
            old_states[L] = {"k": kv.keys.contiguous().clone(), "v": kv.values.contiguous().clone()}
        toks = torch.randn(3 + args.decode_tokens, 1, 1, D_MODEL, generator=torch.Generator().manual_seed(0)).to(dev)
        times = {(impl, L): [] for impl in ("cat", "buffers", "read") for L in contexts}
        for i, tok in enumerate(toks):
            for L in contexts:
                sync(dev)
                t0 = time.perf_counter()
                y_old = old_step(tok, old_states[L])
                sync(dev)
                t1 = time.perf_counter()
                y_new = m(tok, cache=new_caches[L])
                sync(dev)
                t2 = time.perf_counter()
                kv = new_caches[L].get(m)["kv"]
                q = torch.randn(1, HEADS, D_MODEL // HEADS, device=dev)
                sync(dev)
                t3 = time.perf_counter()
                attention_decode(q, kv.keys, kv.values)
                sync(dev)
                t4 = time.perf_counter()
                assert float((y_old - y_new).abs().max()) < 1e-4 * float(y_old.abs().max()), "the two caches disagree"
                if i >= 3:  # the first steps at a new shape pay one-time costs
                    times[("cat", L)].append((t1 - t0) * 1e3)
                    times[("buffers", L)].append((t2 - t1) * 1e3)
                    times[("read", L)].append((t4 - t3) * 1e3)
    best = {key: min(ts) for key, ts in times.items()}
    med = {key: statistics.median(ts) for key, ts in times.items()}
    rows = []
    for L in contexts:
        kv = new_caches[L].get(m)["kv"]
        rows.append([L, best[("cat", L)], best[("buffers", L)], 1e3 / best[("cat", L)], 1e3 / best[("buffers", L)],
                     best[("cat", L)] / best[("buffers", L)], best[("read", L)], med[("cat", L)], med[("buffers", L)],
                     kv.capacity, new_caches[L].floats()])
    print_table(
        f"decoding one token after L tokens: softmax_attention d_model {D_MODEL}, {HEADS} heads, batch 1, float32 "
        f"({info['device']}, {info['threads']} threads; min over {args.decode_tokens} steps, round-robin)",
        ["L", f"cat ({args.old_rev}) ms", "buffers ms", "cat tok/s", "buffers tok/s", "cat/buffers", "read only ms",
         "cat median", "buffers median", "capacity", "floats used"],
        rows,
    )
    lo, hi = contexts[0], contexts[-1]
    pred = predicted_ratio(hi, lo)
    ratio = {impl: best[(impl, hi)] / best[(impl, lo)] for impl in ("cat", "buffers", "read")}
    rest = {impl: {L: best[(impl, L)] - best[("read", L)] for L in contexts} for impl in ("cat", "buffers")}
    c0 = rest["buffers"][lo]  # the step's cost besides the read: projections and per-call overhead
    pred_c0 = (c0 + hi / lo * best[("read", lo)]) / (c0 + best[("read", lo)])
    print(f"\nper-token cost ratio L={hi} / L={lo}:")
    print(f"  predicted by the arithmetic: the read of the cache ∝ L: {hi / lo:.0f}x; the whole step, flops 8d² + 4Ld "
          f"(d = {D_MODEL}): {pred:.1f}x")
    print(f"  measured: read alone {ratio['read']:.1f}x, step with buffers {ratio['buffers']:.1f}x, step with torch.cat {ratio['cat']:.1f}x")
    print(f"  the step's cost besides the read (step - read, ms): buffers "
          + ", ".join(f"L={L}: {rest['buffers'][L]:.3f}" for L in contexts) + "; torch.cat "
          + ", ".join(f"L={L}: {rest['cat'][L]:.3f}" for L in contexts))
    print(f"  with that fixed cost c0 = {c0:.3f} ms (projections: 8d² = {8 * D_MODEL**2 / 1e6:.2f} Mflop, the rest Python and dispatch) "
          f"the arithmetic predicts (c0 + {hi // lo}·read({lo})) / (c0 + read({lo})) = {pred_c0:.1f}x for the step")
    print("\ntargets:")
    targets = [
        target_line("decoding appends without torch.cat: buffers faster than the torch.cat cache at every context",
                    all(best[("buffers", L)] < best[("cat", L)] for L in contexts),
                    ", ".join(f"L={L}: {best[('cat', L)] / best[('buffers', L)]:.2f}x" for L in contexts)),
        target_line(f"the read follows attention's arithmetic: read({hi})/read({lo}) within 0.5x..1.5x of {hi // lo}x",
                    None if args.quick else 0.5 * hi / lo <= ratio["read"] <= 1.5 * hi / lo, f"{ratio['read']:.1f}x"),
        target_line(f"no O(L) cost besides the read: the step - read at L={hi} within 1.5x of L={lo}'s",
                    rest["buffers"][hi] <= 1.5 * rest["buffers"][lo],
                    f"buffers {rest['buffers'][lo]:.3f} -> {rest['buffers'][hi]:.3f} ms; torch.cat {rest['cat'][lo]:.3f} -> {rest['cat'][hi]:.3f} ms"),
        target_line(f"the step's 16k/1k ratio as the arithmetic with the fixed cost predicts ({pred_c0:.1f}x, within 0.67x..1.5x)",
                    None if args.quick else pred_c0 / 1.5 <= ratio["buffers"] <= 1.5 * pred_c0,
                    f"measured {ratio['buffers']:.1f}x (flops alone: {pred:.1f}x; torch.cat: {ratio['cat']:.1f}x)"),
    ]
    if args.quick:
        print("  (--quick: small contexts; the targets are defined at 1k-16k)")
    write_json(args, "kv_cache", dict(
        machine=info, d_model=D_MODEL, heads=HEADS, old_rev=args.old_rev, contexts=contexts, decode_tokens=args.decode_tokens,
        ms_min={f"{impl}_{L}": v for (impl, L), v in best.items()}, ms_median={f"{impl}_{L}": v for (impl, L), v in med.items()},
        ratio_hi_lo=ratio, predicted_ratio_flops=pred, fixed_cost_ms=c0, predicted_ratio_with_fixed_cost=pred_c0,
        step_minus_read_ms={impl: {str(L): v for L, v in r.items()} for impl, r in rest.items()}, targets=targets, quick=args.quick,
    ))


if __name__ == "__main__":
    main()
