"""Forward+backward time of every mode of the newer mixers, side by side, at T = 4096
(chunk vs recurrent fwd+bwd for each op, and every mode of each mixer).

For each of rwkv6, rwkv7, hgrn2, gsa, mamba3, log_linear_mamba2, log_linear_gdn,
gated_deltaproduct, comba, mesanet, fox, stickbreaking and path_attention (group breadth1) and based,
rebased, abc, raven, lightnet, rodimus, mom, gated_deltanet2, momentum_deltanet, precond_gated_deltanet and
precond_kda, moba, nsa, deltaformer, parallax, wall_attention and cyclic_flow_attention (group breadth2), built at d_model 128
(bench/scaling.build: its defaults, else its example config with d_model 128), batch 1, float32,
every mode of ``mixer.modes`` is timed on the same input: forward + backward of y.sum() into the
parameters and the input (min of --repeats after a warm-up), and the table prints each mode's
time and its ratio to the recurrent mode (to the reference mode where there is no recurrent
mode, fox and stickbreaking, or where the recurrent mode was skipped; the status column names
the base). Same input, same weights: the modes' outputs are compared too (max
relative difference to the ratio's base mode), so a fast mode that is wrong shows.

A mode is skipped, and the table says why, where at T it would take more than --max-seconds
(default 60) or keep more than --max-gb (default 2) for its backward: both projected from the
two longest probe lengths of T/64 … T/4 (time and autograd's saved bytes, growth
exponent fitted and clamped to [1, 2]: a materialized T×T map grows as T²); the probes climb
from the shortest and stop before a length whose projected cost passes a cap (PaTH's parallel
reference ran the machine out of memory at its T/8 probe before).

The per-token cost over T = 512..16k of every recurrent mixer (flat for each: linear in T) is
bench/scaling.py's; this script does not repeat it.

    python bench/new_mixers.py              # T = 4096, both groups (minutes on 2 cores)
    python bench/new_mixers.py --group breadth2   # the second group only (--group breadth1: the first thirteen)
    python bench/new_mixers.py --quick      # T = 512: a smoke run
    python bench/new_mixers.py --mixers rwkv7,comba -T 2048
"""

from __future__ import annotations

import math
import time

import torch

from _common import base_parser, fmt, mixer_fwd_bwd, print_table, setup, timeit, write_json
from scaling import build, saved_bytes

D_MODEL = 128
#: the mixers of each group (--group), in the order of the table
GROUPS = {
    "breadth1": ("rwkv6", "rwkv7", "hgrn2", "gsa", "mamba3", "log_linear_mamba2", "log_linear_gdn", "gated_deltaproduct",
                "comba", "mesanet", "fox", "stickbreaking", "path_attention"),
    "breadth2": ("based", "rebased", "abc", "raven", "lightnet", "rodimus", "mom", "gated_deltanet2", "momentum_deltanet",
                 "precond_gated_deltanet", "precond_kda", "moba", "nsa", "deltaformer", "parallax",
                 "wall_attention", "cyclic_flow_attention"),
}
NEW_MIXERS = GROUPS["breadth1"] + GROUPS["breadth2"]


def _project(ts: dict[int, float], T: int) -> float:
    (t1, a), (t2, b) = sorted(ts.items())
    e = min(2.0, max(1.0, math.log(max(b, 1e-9) / max(a, 1e-9)) / math.log(t2 / t1)))
    return b * (T / t2) ** e


def probe(m, T: int, device: str, max_seconds: float = math.inf, max_bytes: float = math.inf) -> tuple[float, float]:
    """(projected seconds, projected saved bytes) of fwd+bwd of m at T, from the two longest of
    the probe lengths T/64, T/32, T/16, T/8, T/4 it measured. It climbs from the shortest and does not
    run a length whose cost, projected from the two before, passes a cap: a mode whose map grows
    as T² (or worse) is skipped on a short probe instead of filling the machine's memory."""
    secs, nbytes = {}, {}
    for t in sorted({max(16, T // 64), max(16, T // 32), max(16, T // 16), max(16, T // 8), max(32, T // 4)}):
        if len(secs) >= 2:
            last = dict(sorted(secs.items())[-2:]), dict(sorted(nbytes.items())[-2:])
            if _project(last[0], t) > max_seconds or _project(last[1], t) > max_bytes:
                break
        x = torch.randn(1, t, D_MODEL, device=device, requires_grad=True)
        secs[t] = timeit(mixer_fwd_bwd(m, x), repeats=1, warmup=1, device=device)["min_ms"] / 1e3
        nbytes[t] = saved_bytes(m, x)
    return _project(dict(sorted(secs.items())[-2:]), T), _project(dict(sorted(nbytes.items())[-2:]), T)


def bench_mixer(name: str, T: int, args) -> list[list]:
    torch.manual_seed(0)
    try:
        m = build(name, D_MODEL, T).to(args.device)
    except Exception as e:  # noqa: BLE001
        return [[name, "-", None, None, None, f"not built: {str(e).splitlines()[0][:80]}"]]
    modes = list(type(m).modes)
    base = "recurrent" if "recurrent" in modes else type(m).reference_mode
    x = torch.randn(1, T, D_MODEL, generator=torch.Generator().manual_seed(T)).to(args.device).requires_grad_(True)
    res = {}
    for mode in modes:
        m.mode = mode
        p_s, p_b = probe(m, T, args.device, args.max_seconds, args.max_gb * 2**30)
        if p_s > args.max_seconds or p_b > args.max_gb * 2**30:
            res[mode] = {"skipped": f"skipped: projected {p_s:.0f} s, {p_b / 2**30:.1f} GB saved"}
            continue
        ms = timeit(mixer_fwd_bwd(m, x), repeats=args.repeats, warmup=1, device=args.device)
        with torch.no_grad():
            y = m(x)
        res[mode] = {"ms": ms["min_ms"], "median_ms": ms["median_ms"], "y": y, "proj_gb": p_b / 2**30}
    m.mode = "auto"
    if "ms" not in res.get(base, {}):  # the recurrent mode skipped: ratios to the first mode that ran
        base = next((md for md in [type(m).reference_mode, *modes] if "ms" in res.get(md, {})), base)
    rows = []
    ref = res.get(base, {})
    for mode in modes:
        r = res[mode]
        if "skipped" in r:
            rows.append([name, mode, None, None, None, r["skipped"]])
            continue
        ratio = r["ms"] / ref["ms"] if "ms" in ref else None
        diff = None
        if "y" in ref:
            diff = float((r["y"] - ref["y"]).abs().max() / ref["y"].abs().max().clamp_min(1e-30))
        note = f"base ({base})" if mode == base else ""
        rows.append([name, mode, r["ms"], ratio, diff, note])
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("-T", "--seq-len", type=int, default=None, help="sequence length (default 4096; 512 with --quick)")
    p.add_argument("--group", choices=[*GROUPS, "all"], default="all", help="which mixers (default all; --mixers overrides)")
    p.add_argument("--mixers", default=None, help="comma-separated registry names (default: those of --group)")
    p.add_argument("--max-seconds", type=float, default=60.0, help="skip a mode projected to take longer (default 60)")
    p.add_argument("--max-gb", type=float, default=2.0, help="skip a mode projected to save more for backward (default 2)")
    args = p.parse_args()
    info = setup(args)
    T = args.seq_len or (512 if args.quick else 4096)
    print(f"machine: {info}")
    rows = []
    names = args.mixers.split(",") if args.mixers else (NEW_MIXERS if args.group == "all" else GROUPS[args.group])
    for name in names:
        t0 = time.perf_counter()
        got = bench_mixer(name.strip(), T, args)
        rows += got
        for r in got:  # progress: each row as it comes (the table follows)
            print("  " + "  ".join(fmt(v) for v in r), flush=True)
        print(f"  ({name.strip()}: {time.perf_counter() - t0:.0f} s)", flush=True)
    cols = ["case", "mode", "fwd+bwd ms", "ratio to base", "max rel diff", "status"]
    print_table(f"new mixers: fwd+bwd at T = {T}, batch 1, d_model {D_MODEL}, {args.device} (min of {args.repeats})",
                cols, rows)
    write_json(args, "new_mixers", {"machine": info, "T": T, "d_model": D_MODEL, "columns": cols, "rows": rows})


if __name__ == "__main__":
    main()
