"""Cost per token against the sequence length T for every recurrent mixer: a scan's
forward and backward must not grow faster than linear in T at a fixed state.

For every registered mixer with a recurrent or chunk mode (seqmix.list_mixers()), built at
d_model 128 (or its example config at d_model 128 where the defaults do not build; one built for a
kernel length, S4's l_max, is built at each T for that T), batch 1,
in its default mode ("auto": what training runs), times forward (no gradient) and
forward+backward at T = 512, 2048, 8192, 16384, interleaved (each round runs every T once, so a
change in the machine's load hits every length alike), median of the rounds, and prints the
cost per token at each T and the ratio 16k/512 of the per-token costs. Target: <= 1.25 (no
faster than linear, with slack for cache effects). The default includes each mixer's
``segment_len`` (finite-state mixers run a forward over more than 1024 tokens in segments that
carry the state); ``--segment-len 0`` times one whole-sequence pass instead (the "before"). Where a
target is not met the line gives the forward+backward's user and system CPU per token and the
page faults per token (the kernel mapping and zeroing fresh memory), the measured reason, and the
per-token ratio 16k/2048; where the computation (user CPU) is flat, the mixer is timed again in a
fresh process started with glibc's tunables that keep freed memory
(seqmix.runtime.keep_freed_memory_env(): with its defaults glibc maps a large block fresh on every
step and the kernel faults its pages in; jemalloc/tcmalloc keep it alike), and a second line gives
that ratio. ``--keep-freed-memory`` starts every mixer's process so.

A length is skipped, and the table says why, where its rounds would not fit in what is left
of the mixer's --max-seconds budget (--max-seconds-growing for a state that grows with T;
projected from the two shortest lengths, growth exponent fitted and clamped to [1, 2]) or its backward would keep more than --max-gb (projected from the
bytes autograd saves at 512 and 2048: saved_tensors_hooks). The ratio is then over the longest
length kept, and the target line says so. The target is at a fixed state: the size of the cache
after a prefill of 512 and of 2048 tokens is compared, and a mixer whose state grows with T
(log-linear attention's Fenwick levels, a KV cache) is timed but its target line says n/a and why.
The cache after 256 tokens is compared too: a state that still fills between 256 and 512 (B'MOJO's
window of 512 tokens) runs at its fixed size only past its window, so its ratio is taken from the
second length (16k/2048), and its line says so with the ratio 2048/512.

Last, the peak resident memory of a Mamba training step (the LM's Mamba: d_model 256, expand
2, d_state 16, batch 1, forward+backward) at T = 512 and 16384, each in a fresh process
(bench/_common.peak_memory_mb: VmHWM), beside the selective scan alone in its fused and
chunked modes at 16384: the target is that the step's memory at 16k is bounded by the
chunk, not by T × d_inner × d_state (printed: the peak against one [T, d_inner, d_state]
float32 tensor, which the fused mode kept several of).

    python bench/scaling.py                  # every recurrent mixer (about 10 minutes on 2 cores)
    python bench/scaling.py --quick          # 4 mixers, T = 256..2048, no memory probes: a smoke run
    python bench/scaling.py --mixers mamba,gla,s6
    python bench/scaling.py --segment-len 0  # one whole-sequence pass per call (before segment_len)
    python bench/scaling.py --keep-freed-memory  # every mixer with GLIBC_TUNABLES=$(python -m seqmix.runtime)
"""

from __future__ import annotations

import math
import resource
import statistics
import time

import torch

from _common import base_parser, fit_exponent, in_fresh_process, peak_memory_mb, print_table, setup, sync, target_line, write_json

D_MODEL = 128
LENGTHS = (512, 2048, 8192, 16384)
QUICK_LENGTHS = (256, 512, 1024, 2048)
QUICK_MIXERS = ("mamba", "s6", "gla", "ssd")
RATIO_TARGET = 1.25


def recurrent_mixers() -> list[str]:
    import seqmix

    return [e.name for e in seqmix.list_mixers() if {"recurrent", "chunk"} & set(e.cls.modes)]


def build(name: str, d_model: int, max_len: int, segment_len: int | None = None):
    """The mixer at d_model (its defaults, else its example config with d_model replaced); a
    mixer built for a kernel length (S4's l_max) is built for max_len; ``segment_len`` (None: the
    mixer's default) as the config field."""
    import seqmix
    from seqmix.mixers.base import mixer_entry

    extra = {"l_max": max_len} if "l_max" in mixer_entry(name).cls.Config.model_fields else {}
    if segment_len is not None:
        extra["segment_len"] = segment_len
    try:
        return seqmix.build_mixer(name, d_model=d_model, **extra)
    except (ValueError, TypeError) as first:
        ex = dict(mixer_entry(name).cls.example_config())
        ex.update(mixer_entry(name).example or {})
        ex.update(d_model=d_model, **extra)
        try:
            return seqmix.build_mixer(name, **ex)
        except (ValueError, TypeError):
            raise first from None


def saved_bytes(m, x) -> int:
    """Bytes autograd keeps for the backward of m(x) (distinct storages)."""
    seen = {}

    def pack(t):
        try:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):
            seen[id(t)] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = m(x)
    del y
    return sum(seen.values())


def bench_mixer(name, lengths, args) -> dict:
    from seqmix import Cache, mixer_entry
    from seqmix.runtime import freed_memory_is_kept

    # a mixer built for a kernel length (S4's l_max) is built for each T, as a user training at T would
    per_length = "l_max" in mixer_entry(name).cls.Config.model_fields
    ms = {}
    try:
        for T in lengths:
            if per_length or not ms:
                torch.manual_seed(0)
                m = build(name, D_MODEL, T if per_length else max(lengths), args.segment_len).to(args.device)
            ms[T] = m
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"not built at d_model {D_MODEL}: {str(e).splitlines()[0][:90]}"}
    xs = {T: torch.randn(1, T, D_MODEL, generator=torch.Generator().manual_seed(T)).to(args.device) for T in lengths}
    params = {T: [p for p in m.parameters() if p.requires_grad] for T, m in ms.items()}
    # the target is at a fixed state: the state's size after a prefill of the two shortest lengths, and
    # of half the shortest (a state still filling there, e.g. a window, is not fixed at the shortest T)
    T_half = lengths[0] // 2
    try:
        state_floats = {}
        for T in (T_half, *lengths[:2]):
            x = xs[T] if T in xs else torch.randn(1, T, D_MODEL, generator=torch.Generator().manual_seed(T)).to(args.device)
            cache = Cache()
            with torch.no_grad():
                ms[T if T in ms else lengths[0]](x, cache=cache)
            state_floats[T] = cache.floats()
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"failed to prefill a cache: {type(e).__name__}: {str(e)[:90]}"}

    def fwd(T):
        with torch.no_grad():
            ms[T](xs[T])

    def fwd_bwd(T):
        x = xs[T].requires_grad_(True)
        ms[T](x).sum().backward()
        x.grad = None
        for p in params[T]:
            p.grad = None

    # projections from the two shortest lengths (min of two timed calls each): time and the
    # backward's kept memory, growth exponent fitted and clamped to [1, 2]
    skipped, keep = {}, []
    try:
        t_small = {}
        for T in lengths[:2]:
            fwd_bwd(T)  # warm-up
            runs = []
            for _ in range(2):
                sync(args.device)
                t0 = time.perf_counter()
                fwd_bwd(T)
                sync(args.device)
                runs.append(time.perf_counter() - t0)
            t_small[T] = min(runs)
        mem_small = {T: saved_bytes(ms[T], xs[T].requires_grad_(True)) for T in lengths[:2]}
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"failed: {type(e).__name__}: {str(e)[:90]}"}
    T0, T1 = lengths[:2]
    e_t = min(2.0, max(1.0, fit_exponent([T0, T1], [t_small[T0], t_small[T1]])))
    e_m = min(2.0, max(1.0, fit_exponent([T0, T1], [mem_small[T0], mem_small[T1]])))
    fixed = state_floats[T0] == state_floats[T1]
    # a state that fills over the first tokens (a window) runs at its fixed size from there: the ratio is
    # then taken from the second length, where most tokens run at the full state
    filling = fixed and state_floats[T_half] < state_floats[T0]
    budget = args.max_seconds if fixed else min(args.max_seconds, args.max_seconds_growing)
    for T in lengths:
        proj_s = t_small[T1] * (T / T1) ** e_t * 1.5  # forward + forward+backward
        proj_gb = mem_small[T1] * (T / T1) ** e_m / 2**30
        if T > T1 and proj_gb > args.max_gb:
            skipped[T] = f"backward would keep ~{proj_gb:.1f} GB (> {args.max_gb} GB)"
        elif T > T1 and proj_s * (args.repeats + 1) > budget:
            skipped[T] = f"projected {proj_s * (args.repeats + 1):.0f} s for its rounds, over the {max(0.0, budget):.0f} s left of --max-seconds"
        else:
            keep.append(T)
            budget -= proj_s * (args.repeats + 1)
    times_f = {T: [] for T in keep}
    times_fb = {T: [] for T in keep}
    cpu_f = {T: [] for T in keep}
    cpu_fb = {T: [] for T in keep}
    os_fb = {T: [] for T in keep}  # forward+backward: (user s, system s, minor page faults) of each call
    try:
        for T in keep:  # warm-up at every length
            fwd(T)
        for _ in range(args.repeats):
            for T in keep:
                for store, cpu, fn in ((times_f, cpu_f, fwd), (times_fb, cpu_fb, fwd_bwd)):
                    sync(args.device)
                    t0, c0, r0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
                    fn(T)
                    sync(args.device)
                    store[T].append(time.perf_counter() - t0)
                    cpu[T].append(time.process_time() - c0)
                    if fn is fwd_bwd:
                        r1 = resource.getrusage(resource.RUSAGE_SELF)
                        os_fb[T].append((r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt))
    except Exception as e:  # noqa: BLE001
        return {"skipped": f"failed: {type(e).__name__}: {str(e)[:90]}"}
    per_tok_f = {T: statistics.median(v) / T * 1e6 for T, v in times_f.items()}  # µs per token
    per_tok_fb = {T: statistics.median(v) / T * 1e6 for T, v in times_fb.items()}
    first, last = (T1 if filling and T1 in keep else keep[0]), keep[-1]
    cpu_ratio_f = statistics.median(cpu_f[last]) / last / (statistics.median(cpu_f[first]) / first)
    cpu_ratio_fb = statistics.median(cpu_fb[last]) / last / (statistics.median(cpu_fb[first]) / first)
    # forward+backward split (getrusage): user CPU (the computation) and system CPU with the minor page
    # faults (the kernel mapping and zeroing memory the allocator takes fresh from the OS), per token
    # (summed over the rounds: the kernel's user/system split is sampled at its clock tick, too coarse for one short call)
    split = {T: {"user_us": sum(u for u, _, _ in v) / (len(v) * T) * 1e6, "sys_us": sum(s for _, s, _ in v) / (len(v) * T) * 1e6,
                 "faults": sum(f for _, _, f in v) / (len(v) * T)} for T, v in os_fb.items()}
    return dict(kept_freed_memory=freed_memory_is_kept(), state_floats={str(k): v for k, v in state_floats.items()}, cpu_ratio_fwd=cpu_ratio_f, cpu_ratio_fwd_bwd=cpu_ratio_fb,
                user_ratio_fwd_bwd=split[last]["user_us"] / max(split[first]["user_us"], 1e-9),
                fwd_bwd_os_per_token={str(k): v for k, v in split.items()}, mode=ms[first].mode, lengths=keep, skipped_lengths={str(k): v for k, v in skipped.items()},
                fwd_us_per_token={str(k): v for k, v in per_tok_f.items()},
                fwd_bwd_us_per_token={str(k): v for k, v in per_tok_fb.items()},
                ratio_fwd=per_tok_f[last] / per_tok_f[first], ratio_fwd_bwd=per_tok_fb[last] / per_tok_fb[first],
                ratio_over=f"{last}/{first}", base=first, fixed=fixed, filling=filling, saved_bytes={str(k): v for k, v in mem_small.items()})


# ------------------------------------------------------------------------------------------
# peak memory of a Mamba training step (fresh process per measurement)
# ------------------------------------------------------------------------------------------

MAMBA_D = 256


def mamba_step(T: int, device: str):
    """Module-level builder (run in a spawned process): one forward+backward of the LM's Mamba block."""
    import seqmix

    torch.manual_seed(0)
    m = seqmix.build_mixer("mamba", d_model=MAMBA_D).to(device)
    x = torch.randn(1, T, MAMBA_D, device=device, requires_grad=True)

    def step():
        m(x).sum().backward()
        x.grad = None
        m.zero_grad(set_to_none=True)

    return step


def scan_step(T: int, mode: str, device: str):
    """Module-level builder: the selective scan alone at the Mamba block's shape, forward+backward."""
    from seqmix.ops.selective_scan import selective_scan

    g = torch.Generator().manual_seed(0)
    D, N = 2 * MAMBA_D, 16
    x = torch.randn(1, T, D, generator=g).to(device).requires_grad_(True)
    delta = torch.nn.functional.softplus(torch.randn(1, T, D, generator=g) - 4).to(device).requires_grad_(True)
    A = (-torch.arange(1, N + 1, dtype=torch.float32).repeat(D, 1)).to(device).requires_grad_(True)
    Bm, Cm = (torch.randn(1, T, N, generator=g).to(device).requires_grad_(True) for _ in range(2))

    def step():
        selective_scan(x, delta, A, Bm, Cm, mode=mode, check_values=False)[0].sum().backward()
        for t in (x, delta, A, Bm, Cm):
            t.grad = None

    return step


def bench_memory(args) -> dict:
    T_short, T_long = 512, 16384
    full = T_long * 2 * MAMBA_D * 16 * 4 / 2**20  # one [T, d_inner, d_state] float32 tensor, MiB
    res = {}
    for key, builder, a in (
        (f"mamba step T={T_short}", mamba_step, (T_short, args.device)),
        (f"mamba step T={T_long}", mamba_step, (T_long, args.device)),
        (f"scan chunked T={T_long}", scan_step, (T_long, "chunked", args.device)),
        (f"scan fused T={T_long}", scan_step, (T_long, "fused", args.device)),
    ):
        res[key] = peak_memory_mb(builder, *a, device=args.device)
        print(f"  done: peak memory {key}: {res[key]} MB", flush=True)
    rows = [[k, v, (v / full) if v is not None else None] for k, v in res.items()]
    print_table(f"peak memory of one forward+backward (MB added by the call; fresh process each); "
                f"one [T={T_long}, d_inner={2 * MAMBA_D}, d_state=16] float32 tensor = {full:.0f} MB",
                ["case", "peak MB", "x one [T, D, N] tensor"], rows)
    return dict(results_mb=res, one_TDN_tensor_mb=full, T_short=T_short, T_long=T_long)


def meets(r: dict, lengths) -> bool | None:
    """Whether a result meets the per-token target (None: not measured to the longest length)."""
    if r["lengths"][-1] != lengths[-1] or r["base"] != lengths[1 if r["filling"] else 0]:
        return None
    return max(r["ratio_fwd"], r["ratio_fwd_bwd"]) <= RATIO_TARGET


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", default=None, help="comma-separated mixers (default: every recurrent mixer)")
    p.add_argument("--max-seconds", type=float, default=150.0,
                   help="time budget per mixer: the longest lengths whose projected rounds do not fit are skipped (and said)")
    p.add_argument("--max-seconds-growing", type=float, default=15.0,
                   help="the budget of a mixer whose state grows with T (its target line is n/a; it is timed for reference)")
    p.add_argument("--max-gb", type=float, default=4.0, help="skip a length whose backward would keep more")
    p.add_argument("--segment-len", type=int, default=None,
                   help="every mixer's segment_len (default: its own, 1024 for finite-state mixers; 0: one whole-sequence pass)")
    p.add_argument("--same-process", dest="fresh", action="store_false",
                   help="time every mixer in this process (default: each in a fresh one, so no mixer's figures depend on "
                        "what ran before it: the allocator's mmap threshold does)")
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="start every mixer's process with seqmix.runtime.keep_freed_memory_env() (glibc keeps freed memory: "
                        "no page faults per step); default: glibc's defaults, and a miss whose computation is flat is re-timed so")
    args = p.parse_args()
    from seqmix.runtime import glibc_malloc, keep_freed_memory_env

    if args.keep_freed_memory and not args.fresh:
        p.error("--keep-freed-memory needs each mixer in a fresh process (glibc reads it when a process starts): drop --same-process")
    if args.keep_freed_memory and not glibc_malloc():
        p.error("--keep-freed-memory: this process's C library is not glibc (its allocator has no such setting)")
    info = setup(args)
    freed_env = keep_freed_memory_env() if glibc_malloc() else None
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    names = args.mixers.split(",") if args.mixers else (list(QUICK_MIXERS) if args.quick else recurrent_mixers())
    print(f"machine: {info}; d_model {D_MODEL}, batch 1, T = {lengths}, median of {args.repeats} interleaved rounds, "
          f"{'each mixer in a fresh process' if args.fresh else 'every mixer in this process'}"
          f"{' started with GLIBC_TUNABLES=' + freed_env['GLIBC_TUNABLES'] if args.keep_freed_memory else ''}; segment_len: {'each mixer default' if args.segment_len is None else args.segment_len}\n")
    t_start = time.perf_counter()
    results = {}
    for name in names:
        t0 = time.perf_counter()
        results[name] = r = (in_fresh_process(bench_mixer, name, lengths, args, env=freed_env if args.keep_freed_memory else None)
                             if args.fresh else bench_mixer(name, lengths, args))
        print(f"  done: {name} ({time.perf_counter() - t0:.0f} s)" + (f": skipped, {r['skipped']}" if "skipped" in r else ""), flush=True)
    rows = []
    for name, r in results.items():
        if "skipped" in r:
            rows.append([name, "-", *["-"] * (2 * len(lengths)), None, None, None, None, r["skipped"]])
            continue
        f = [r["fwd_us_per_token"].get(str(T)) for T in lengths]
        fb = [r["fwd_bwd_us_per_token"].get(str(T)) for T in lengths]
        note = "; ".join(f"T={k}: {v}" for k, v in r["skipped_lengths"].items())
        rows.append([name, r["mode"], *f, *fb, r["ratio_fwd"], r["ratio_fwd_bwd"], r["cpu_ratio_fwd"], r["cpu_ratio_fwd_bwd"],
                     note or f"ratio over {r['ratio_over']}"])
    print_table(
        f"cost per token (µs) against T, batch 1, d_model {D_MODEL}; ratio = per-token cost at the longest T / at {lengths[0]}",
        ["case", "mode", *[f"fwd {T}" for T in lengths], *[f"f+b {T}" for T in lengths], "ratio fwd", "ratio f+b",
         "cpu ratio fwd", "cpu ratio f+b", "note"], rows,
    )
    print("  ratio: of the wall-time costs per token; cpu ratio: the same in CPU time of this process (all its threads), "
          "less sensitive to a shared machine's load")
    memory = None if (args.quick or args.no_memory) else bench_memory(args)

    print("\ntargets")
    targets, kept = [], {}
    for name, r in results.items():
        if "skipped" in r:
            continue
        full = meets(r, lengths) is not None
        (Th, sh), (T0, s0), (T1, s1) = ((int(k), v) for k, v in r["state_floats"].items())
        met = None if (args.quick or not r["fixed"]) else meets(r, lengths)
        why = "" if r["fixed"] else (f"; the target does not apply: the state grows with T ({s0:,} floats after {T0} tokens, "
                                f"{s1:,} after {T1})")
        if r["filling"]:
            why += (f"; the state fills over the first tokens ({sh:,} floats after {Th}, {s0:,} after {T0} and {T1}), so "
                    f"from {T1} (per-token {T1}/{T0}: fwd {r['fwd_us_per_token'][str(T1)] / r['fwd_us_per_token'][str(T0)]:.2f}, "
                    f"fwd+bwd {r['fwd_bwd_us_per_token'][str(T1)] / r['fwd_bwd_us_per_token'][str(T0)]:.2f})")
        if met is False:  # the measured reason: the computation (user CPU) against the kernel's page faults (system CPU)
            osf = r["fwd_bwd_os_per_token"]
            a, b = osf[str(r["base"])], osf[str(r["lengths"][-1])]
            mid = str(r["lengths"][1])
            past = (f"; per-token {r['lengths'][-1]}/{mid}: fwd {r['fwd_us_per_token'][str(r['lengths'][-1])] / r['fwd_us_per_token'][mid]:.2f}, "
                    f"fwd+bwd {r['fwd_bwd_us_per_token'][str(r['lengths'][-1])] / r['fwd_bwd_us_per_token'][mid]:.2f}")
            why = past + (f"; fwd+bwd split: user CPU {a['user_us']:.1f} -> {b['user_us']:.1f} µs/token (ratio {r['user_ratio_fwd_bwd']:.2f}: "
                   f"the computation{' flat within the target' if r['user_ratio_fwd_bwd'] <= RATIO_TARGET else ' grows'}), "
                   f"system CPU {a['sys_us']:.1f} -> {b['sys_us']:.1f} µs/token with {a['faults']:.2f} -> {b['faults']:.2f} "
                   f"page faults/token (memory the allocator maps fresh and the kernel zeroes at long T)")
        targets.append(target_line(f"{name}: per-token cost {r['ratio_over']} <= {RATIO_TARGET}"
                                   + (" (default allocator)" if met is False else ""), met,
                                   f"fwd {r['ratio_fwd']:.2f}, fwd+bwd {r['ratio_fwd_bwd']:.2f} (CPU time: "
                                   f"{r['cpu_ratio_fwd']:.2f}, {r['cpu_ratio_fwd_bwd']:.2f})"
                                   + ("" if full else f" (longer T skipped: {'; '.join(r['skipped_lengths'].values())})") + why))
        if met is False and args.fresh and not args.keep_freed_memory and r["user_ratio_fwd_bwd"] <= RATIO_TARGET and freed_env:
            # the computation is flat: the same mixer in a fresh process that keeps freed memory (no page faults)
            k = kept[name] = in_fresh_process(bench_mixer, name, lengths, args, env=freed_env)
            if "skipped" not in k:
                osk = k["fwd_bwd_os_per_token"][str(k["lengths"][-1])]
                target_line(f"{name}: the same in a process started with GLIBC_TUNABLES=$(python -m seqmix.runtime)", meets(k, lengths),
                            f"per-token {k['ratio_over']}: fwd {k['ratio_fwd']:.2f}, fwd+bwd {k['ratio_fwd_bwd']:.2f} (CPU time: "
                            f"{k['cpu_ratio_fwd']:.2f}, {k['cpu_ratio_fwd_bwd']:.2f}); {osk['faults']:.2f} page faults/token at "
                            f"{k['lengths'][-1]}")
    counted = [t for t in targets if t["met"] is not None]
    if kept:
        ok = [n for n, k in kept.items() if "skipped" not in k and meets(k, lengths)]
        print(f"  of the {sum(t['met'] is False for t in targets)} NOT MET, {len(ok)} with a flat computation are MET when the "
              f"process keeps freed memory (GLIBC_TUNABLES=$(python -m seqmix.runtime)): {', '.join(ok) or 'none'}")
    if not args.quick:
        print(f"  per-token targets: {sum(t['met'] for t in counted)} MET, {sum(not t['met'] for t in counted)} NOT MET of "
              f"{len(counted)} measured to {lengths[-1]} at a fixed state; {len(results) - len(counted)} n/a (skipped, "
              f"cut by the budget, or a state that grows with T)")
    if memory:
        mm = memory["results_mb"]
        TL = memory["T_long"]
        long_key, short_key = f"mamba step T={TL}", f"mamba step T={memory['T_short']}"
        if mm.get(long_key) is not None:
            ratio = mm[long_key] / memory["one_TDN_tensor_mb"]
            targets.append(target_line(
                f"Mamba training step memory at T={memory['T_long']} bounded by the chunk (< one [T, d_inner, d_state] tensor)",
                ratio < 1.0,
                f"{mm[long_key]:.0f} MB at T={memory['T_long']} vs {mm.get(short_key) or 0:.0f} MB at T={memory['T_short']}; "
                f"one [T, D, N] float32 tensor = {memory['one_TDN_tensor_mb']:.0f} MB ({ratio:.2f}x); the scan alone: "
                f"chunked {mm.get(f'scan chunked T={TL}') or 0:.0f} MB, fused {mm.get(f'scan fused T={TL}') or 0:.0f} MB",
            ))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    write_json(args, "scaling", dict(machine=info, d_model=D_MODEL, lengths=list(lengths), results=results, kept_freed_memory=kept, memory=memory,
                                     targets=targets, quick=args.quick))


if __name__ == "__main__":
    main()
