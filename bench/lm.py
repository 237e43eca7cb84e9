"""Language modelling throughput, side by side in one run:

1. training tokens/s of every registered mixer (or --mixers) in the LM backbone at
   4 layers, d = 256, T = 512, batch 8 — one full optimizer step of the trainer (its own
   loss, backward, clipping, AdamW), batches from the Tiny Shakespeare memmap — with the
   model FLOPs per token (seqmix.train.flops) and the fraction of this machine's measured
   float32 matmul peak; ratios against softmax attention;
2. tokenizing Tiny Shakespeare with the trained byte-level BPE (1024 symbols) the way the
   corpus loader does it (pieces cut at safe line breaks, encode_batch), beside one
   encode() call over the whole text — target ≥ 1M tokens/s;
3. the memmap loader (random training windows, B = 8, T = 512) against the fastest
   trainer rate of part 1 — target ≥ 10×;
4. generation: decode tokens/s and state per sequence at context 1k, 4k, 16k for GLA and
   Mamba (targets: flat within 20%) and softmax attention (grows), through LanguageModel's
   prefill + Cache decoding (seqmix.models.generation) — `--generation-only` runs just this;
5. the SSM targets, interleaved and median of the rounds: Mamba training tokens/s
   (Mamba blocks without MLP, as in Mamba) against softmax attention's (blocks with SwiGLU) at
   T = 512 (batch 8) and T = 4096 (batch 1) (targets >= 0.8x and >= 1.5x; beside them, as
   context, an 8-layer Mamba of about attention's parameter count and both with one GELU MLP), and Mamba's prefill tokens/s at T = 16384 against T = 512 (target >= 0.8x)
   — `--ssm-only` runs just this.

    python bench/lm.py                 # every mixer (minutes on a CPU)
    python bench/lm.py --quick         # 3 mixers, T = 128: a smoke run, not the targets
    python bench/lm.py --mixers softmax_attention,s6,gla
    python bench/lm.py --generation-only --threads 1   # part 4 alone (a few minutes)
    python bench/lm.py --ssm-only      # part 5 alone (a few minutes)
"""

from __future__ import annotations

import os
import tempfile
import time

from _common import add_decode_tokens, base_parser, matmul_peak_gflops, print_table, setup, sync, target_line, timeit, write_json


def make_train_step(name: str, *, data, d: int, layers: int, device: str, model: dict | None = None):
    """(model, step): the LM backbone around ``name`` with the trainer's loss and an AdamW step,
    batches from the Tiny Shakespeare memmap (``data``: a CorpusConfig); ``model``: more ModelConfig
    fields (e.g. ``channel_mixer``). Raises ValueError where the mixer is not built at this size."""
    import torch

    from seqmix.data.text import build_corpus
    from seqmix.train import RunConfig, TrainConfig, Trainer
    from seqmix.train.optim import param_groups

    windows = build_corpus(data, "train")
    cfg = RunConfig(data=data, model={"mixer": name, "d_model": d, "n_layers": layers, **(model or {})}, train=TrainConfig(max_steps=1, device=device))
    tr = Trainer(cfg, progress=False)
    torch.manual_seed(0)
    model = tr.build_model()
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4)
    step_i = [0]

    def step():
        b = windows.batch(step_i[0])
        step_i[0] += 1
        opt.zero_grad(set_to_none=True)
        loss, _, _ = tr.loss(model, *tr.to_device(b))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return model, step


def train_rates(mixers, *, d: int, layers: int, T: int, B: int, repeats: int, device: str, peak: float) -> list[dict]:
    from seqmix.data.text import CorpusConfig
    from seqmix.train.flops import flops_per_token

    data = CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=T, batch_size=B)
    out = []
    for name in mixers:
        try:
            model, step = make_train_step(name, data=data, d=d, layers=layers, device=device)
        except ValueError as e:
            print(f"  {name}: not built at d = {d} ({str(e).splitlines()[0][:100]})")
            continue
        try:
            t = timeit(step, repeats=repeats, warmup=1, device=device)
        except Exception as e:  # noqa: BLE001  (a mixer that cannot train at this size is reported, not fatal)
            print(f"  {name}: failed ({type(e).__name__}: {str(e)[:100]})")
            continue
        tps = B * T / (t["min_ms"] / 1e3)
        fpt = flops_per_token(model, T)
        out.append({"mixer": name, "tokens_per_s": tps, "step_ms": t["min_ms"], "flops_per_token": fpt,
                    "gflops": tps * fpt / 1e9, "peak_frac": tps * fpt / (peak * 1e9), "params": model.num_params()})
        print(f"  {name}: {tps:,.0f} tokens/s", flush=True)
        del model, step
    return out


def tokenize_rate(repeats: int) -> dict:
    from seqmix.data.text import builtin_path, text_pieces, train_bpe

    text = builtin_path("tinyshakespeare").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    t0 = time.perf_counter()
    tok = train_bpe(iter(lines), 1024)
    train_s = time.perf_counter() - t0
    pieces = list(text_pieces(iter(lines)))
    n = sum(len(x) for x in tok.encode_batch(pieces))
    loader = timeit(lambda: tok.encode_batch(list(text_pieces(iter(lines)))), repeats=repeats)
    whole = timeit(lambda: tok.encode(text), repeats=repeats)
    return {"tokens": n, "bytes": len(text.encode()), "train_s": train_s, "pieces": len(pieces),
            "loader_tokens_per_s": n / (loader["min_ms"] / 1e3), "one_pass_tokens_per_s": n / (whole["min_ms"] / 1e3),
            "threads": os.environ.get("RAYON_NUM_THREADS", "tokenizers' default")}


def loader_rate(T: int, B: int, repeats: int) -> dict:
    from seqmix.data.text import CorpusConfig, build_corpus

    w = build_corpus(CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=T, batch_size=B), "train")
    n = 200
    counter = [0]

    def draw():
        for _ in range(n):
            w.batch(counter[0])
            counter[0] += 1

    t = timeit(draw, repeats=repeats)
    return {"batches": n, "tokens_per_s": n * B * T / (t["min_ms"] / 1e3)}


# ------------------------------------------------------------------------------------------
# 4. generation (LanguageModel.generate's prefill + Cache decoding)
# ------------------------------------------------------------------------------------------
#
# For a recurrent mixer (GLA; Mamba too) and for softmax attention, a whole LanguageModel
# (4 layers, d = 256, vocab 256, batch 1) prefills one prompt per context L
# (seqmix.models.generation.prefill: each mixer's parallel mode through a Cache), then decodes
# tokens one at a time (generation.step: every mixer's step mode), round-robin over the
# contexts so that a change in the machine's load hits every L alike. Reported per L: decode
# tokens/s (from the median step), the prefill time, and the decoding state per sequence
# (floats and bytes the Cache holds after the prefill: O(1) for recurrent mixers, the KV cache
# for attention). Targets: the recurrent mixers' tokens/s flat within 20% from 1k to 16k;
# softmax's cost per token grows with the context.

GEN_D_MODEL, GEN_LAYERS, GEN_VOCAB = 256, 4, 256
GEN_MIXERS = {"gla": {"heads": 4}, "mamba": {}, "softmax_attention": {"heads": 4}}
GEN_RECURRENT = ("gla", "mamba")


def gen_model(name: str, max_len: int, device: str):
    import torch

    from seqmix.models import ModelConfig, build_model

    torch.manual_seed(0)
    cfg = ModelConfig(mixer=name, mixer_kwargs=GEN_MIXERS[name], d_model=GEN_D_MODEL, n_layers=GEN_LAYERS, vocab_size=GEN_VOCAB,
                      max_seq_len=max_len)
    return build_model(cfg).to(device).eval()


def model_decode_timings(model, contexts, *, tokens: int, device: str = "cpu", warmup: int = 3) -> dict:
    """{L: dict(prefill_s, state_floats, state_bytes, ms_per_token (median), min_ms, tokens_per_s)}."""
    import statistics

    import torch

    from seqmix.models.generation import prefill, step

    states, out = {}, {}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for L in contexts:
            ids = torch.randint(0, GEN_VOCAB, (1, L), generator=g).to(device)
            sync(device)
            t0 = time.perf_counter()
            logits, states[L] = prefill(model, ids, last_only=True)
            sync(device)
            out[L] = dict(prefill_s=time.perf_counter() - t0, state_floats=states[L].floats(), state_bytes=states[L].nbytes())
        times = {L: [] for L in contexts}
        toks = torch.randint(0, GEN_VOCAB, (warmup + tokens, 1), generator=g).to(device)
        for i, tok in enumerate(toks):
            for L in contexts:
                sync(device)
                t0 = time.perf_counter()
                step(model, tok, states[L])
                sync(device)
                if i >= warmup:
                    times[L].append((time.perf_counter() - t0) * 1e3)
    for L in contexts:
        med = statistics.median(times[L])
        out[L].update(ms_per_token=med, min_ms=min(times[L]), tokens_per_s=1e3 / med)
    return out


def bench_generation(args) -> dict:
    contexts = (256, 512, 1024) if args.quick else (1024, 4096, 16384)
    names = list(GEN_MIXERS)
    rows, results, targets = [], {}, []
    for name in names:
        model = gen_model(name, contexts[-1] + args.decode_tokens + 8, args.device)
        t = model_decode_timings(model, contexts, tokens=args.decode_tokens, device=args.device)
        results[name] = t
        base = t[contexts[0]]["tokens_per_s"]
        for L in contexts:
            r = t[L]
            rows.append([name, L, r["tokens_per_s"], r["tokens_per_s"] / base, r["ms_per_token"], r["prefill_s"],
                         r["state_floats"], r["state_bytes"] / 2**20])
    print_table(f"LanguageModel generation ({GEN_LAYERS} layers, d = {GEN_D_MODEL}, batch 1; median of {args.decode_tokens} steps)",
                ["case", "context", "tokens/s", "x first L", "ms/token", "prefill s", "state floats", "state MiB"], rows)
    for name, t in results.items():
        rates = [t[L]["tokens_per_s"] for L in contexts]
        if name in GEN_RECURRENT:
            spread = max(rates) / min(rates) - 1
            targets.append(target_line(f"{name}: tokens/s flat within 20% over L = {contexts}", None if args.quick else spread <= 0.2,
                                       f"max/min - 1 = {spread:.1%} ({', '.join(f'{x:.0f}' for x in rates)} tokens/s)"))
        else:
            a, b = t[contexts[0]], t[contexts[-1]]
            grows = b["ms_per_token"] > a["ms_per_token"]
            targets.append(target_line(f"{name}: cost per token grows with L", None if args.quick else grows,
                                       f"{a['ms_per_token']:.2f} -> {b['ms_per_token']:.2f} ms/token; "
                                       f"state {a['state_floats']} -> {b['state_floats']} floats per sequence"))
    return dict(contexts=list(contexts), results={k: {str(L): v for L, v in r.items()} for k, r in results.items()},
                targets=targets)




# ------------------------------------------------------------------------------------------
# 5. the SSM targets: Mamba against softmax attention, Mamba's prefill against T
# ------------------------------------------------------------------------------------------
#
# Training: the same backbone (d = 256, 4 layers, byte vocabulary) around Mamba and softmax
# attention as the target pairs them: Mamba blocks without a channel mixer (as in Mamba),
# attention blocks with SwiGLU (ratio 4: hidden 2/3·4·d). 4096 tokens per step (T = 512 × batch 8,
# T = 4096 × batch 1), steps interleaved (each round runs one step of every model), median of the
# rounds. Targets: Mamba's tokens/s >= 0.8× softmax's at T = 512 and >= 1.5× at T = 4096. Beside
# them, the same Mamba model with the scan's fused mode, with the pure-PyTorch chunked
# scan, and with the scan replaced by one elementwise op (the bound that a free scan would reach:
# what the rest of the Mamba block costs); and two context rows that are not the target: Mamba with
# 8 layers (about attention's parameter count: Mamba's own recipe, two blocks per Transformer layer)
# and both models with the same GELU MLP (ratio 4) in every block.
# Forward: a LanguageModel around Mamba (generation part's model, batch 1) prefills T = 512 and
# T = 16384 tokens, interleaved, median; target: tokens/s at 16384 >= 0.8× at 512.

SSM_TRAIN = ((512, 8), (4096, 1))
#: the target's pair: (mixer, extra ModelConfig fields)
SSM_PAIR = {"softmax_attention": ("softmax_attention", {"channel_mixer": "swiglu"}),
            "mamba": ("mamba", {"channel_mixer": "none"})}
#: context rows (not targets): name -> (mixer, extra ModelConfig fields, layers factor, the row its ratio is taken to)
SSM_CONTEXT = {"mamba (8 layers: params ≈ attention's)": ("mamba", {"channel_mixer": "none"}, 2, "softmax_attention"),
               "softmax_attention (GELU MLP)": ("softmax_attention", {"channel_mixer": "mlp"}, 1, "softmax_attention (GELU MLP)"),
               "mamba (GELU MLP)": ("mamba", {"channel_mixer": "mlp"}, 1, "softmax_attention (GELU MLP)")}
SSM_PREFILL = (512, 16384)
BEFORE = "fused"  # the selective scan's pure-PyTorch fused mode, timed beside the default as "mamba (fused scan)"


def _no_scan(x, delta, A, B, C, D=None, *, initial_state=None, output_final_state=False, **_):
    """A stand-in for the selective scan that costs one elementwise op (y = delta·x; delta is Δ's
    pre-activation when the mixer passes delta_bias / delta_softplus, swallowed here): what a Mamba
    step costs besides its scan (a bound, not a model)."""
    return delta * x, (x.new_zeros(x.shape[0], x.shape[2], A.shape[1]) if output_final_state else None)


def with_scan_mode(fn, mode: str):
    """fn run with the Mamba mixers' selective scan forced to the torch ``mode`` ("none":
    :func:`_no_scan`); the default ("mamba") is backend "auto", the C++ kernel on CPU where it
    builds (bench only: patches the name seqmix.mixers.ssm imported, for the duration of each call)."""
    import functools

    import seqmix.mixers.ssm as ssm_mixers

    def run():
        orig = ssm_mixers.selective_scan
        ssm_mixers.selective_scan = _no_scan if mode == "none" else functools.partial(orig, mode=mode, backend="torch")
        try:
            return fn()
        finally:
            ssm_mixers.selective_scan = orig

    return run


def interleaved_ms(fns: dict, repeats: int, device: str, warmup: int = 1) -> dict:
    """{name: median ms} of ``repeats`` rounds that each call every function once."""
    import statistics

    for f in fns.values():
        for _ in range(warmup):
            f()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            sync(device)
            t0 = time.perf_counter()
            f()
            sync(device)
            times[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_ssm_targets(args, *, d: int, layers: int) -> dict:
    import torch

    from seqmix.data.text import CorpusConfig
    from seqmix.models.generation import prefill

    train_shapes = ((128, 4), (512, 1)) if args.quick else SSM_TRAIN
    out, rows, targets = {"train": {}, "prefill": {}}, [], []
    for T, B in train_shapes:
        data = CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=T, batch_size=B)
        built = {}
        for name, (mixer, extra) in SSM_PAIR.items():
            built[name] = make_train_step(mixer, data=data, d=d, layers=layers, device=args.device, model=extra)
        mamba, mamba_extra = SSM_PAIR["mamba"]
        for name, mode in (("mamba (torch chunked scan)", "chunked"), (f"mamba ({BEFORE} scan)", BEFORE), ("mamba (no scan: bound)", "none")):
            model, step = make_train_step(mamba, data=data, d=d, layers=layers, device=args.device, model=mamba_extra)
            built[name] = (model, with_scan_mode(step, mode))
        for name, (mixer, extra, factor, _ref) in SSM_CONTEXT.items():
            built[name] = make_train_step(mixer, data=data, d=d, layers=factor * layers, device=args.device, model=extra)
        params = {k: sum(p.numel() for p in m.parameters()) for k, (m, _) in built.items()}
        steps = {k: f for k, (_, f) in built.items()}
        ms = interleaved_ms(steps, args.repeats, args.device)
        tps = {k: B * T / v * 1e3 for k, v in ms.items()}
        ratio = tps["mamba"] / tps["softmax_attention"]
        ref_of = {k: SSM_CONTEXT[k][3] if k in SSM_CONTEXT else "softmax_attention" for k in steps}
        out["train"][str(T)] = dict(B=B, step_ms=ms, tokens_per_s=tps, ratio=ratio, params=params, ratio_to=ref_of)
        for k in steps:
            rows.append([f"train T={T} B={B}", k, params[k], ms[k], tps[k], tps[k] / tps[ref_of[k]]])
        print(f"  done: training T={T}", flush=True)
        del steps, built
    lengths = (128, 1024) if args.quick else SSM_PREFILL
    model = gen_model("mamba", lengths[-1] + 8, args.device)
    g = torch.Generator().manual_seed(0)
    ids = {T: torch.randint(0, GEN_VOCAB, (1, T), generator=g).to(args.device) for T in lengths}

    def pre(T):
        def f():
            with torch.inference_mode():
                prefill(model, ids[T], last_only=True)
        return f

    fns = {T: pre(T) for T in lengths}
    fns.update({(T, BEFORE): with_scan_mode(pre(T), BEFORE) for T in lengths})
    ms_all = interleaved_ms(fns, args.repeats, args.device)
    ms = {T: ms_all[T] for T in lengths}
    tps = {T: T / v * 1e3 for T, v in ms.items()}
    tps_before = {T: T / ms_all[(T, BEFORE)] * 1e3 for T in lengths}
    out["prefill"] = {str(T): dict(ms=ms[T], tokens_per_s=tps[T], before_ms=ms_all[(T, BEFORE)]) for T in lengths}
    for T in lengths:
        rows.append([f"prefill T={T} B=1", "mamba", None, ms[T], tps[T], tps[T] / tps[lengths[0]]])
        rows.append([f"prefill T={T} B=1", f"mamba ({BEFORE} scan)", None, ms_all[(T, BEFORE)], tps_before[T], tps_before[T] / tps_before[lengths[0]]])
    print_table(f"Mamba vs softmax attention ({layers} layers, d = {d}, byte vocab); median of {args.repeats} "
                f"interleaved rounds (ratio: x softmax attention with SwiGLU for training — the GELU-MLP Mamba row: x the GELU-MLP "
                f"softmax row —, x the shortest T for prefill); mamba: no channel mixer, as in Mamba; mamba ({BEFORE} scan): "
                f"the scan's {BEFORE} mode (its forward without gradients is the reference loop); "
                f"mamba: backend auto (the C++ kernel on CPU where it builds); torch chunked scan: the pure-PyTorch default",
                ["case", "mixer", "params", "ms", "tokens/s", "ratio"], rows)
    q = args.quick

    def ctx(tr, prefix):  # a context row's tokens/s ratio to its own reference row
        k = next(k for k in SSM_CONTEXT if k.startswith(prefix))
        return tr["tokens_per_s"][k] / tr["tokens_per_s"][SSM_CONTEXT[k][3]]

    for (T, B), need in zip(train_shapes, (0.8, 1.5)):
        tr = out["train"][str(T)]
        r = tr["ratio"]
        bound = tr["tokens_per_s"]["mamba (no scan: bound)"] / tr["tokens_per_s"]["softmax_attention"]
        scan_share = 1 - tr["step_ms"]["mamba (no scan: bound)"] / tr["step_ms"]["mamba"]
        targets.append(target_line(f"Mamba training tokens/s >= {need}x softmax attention's at T={T} (batch {B})",
                                   None if q else r >= need, f"{r:.2f}x ({tr['tokens_per_s']['mamba']:,.0f} "
                                   f"vs {tr['tokens_per_s']['softmax_attention']:,.0f} tokens/s; {BEFORE} scan "
                                   f"{tr['tokens_per_s'][f'mamba ({BEFORE} scan)'] / tr['tokens_per_s']['softmax_attention']:.2f}x, "
                                   f"torch chunked scan {tr['tokens_per_s']['mamba (torch chunked scan)'] / tr['tokens_per_s']['softmax_attention']:.2f}x); "
                                   f"the scan is {scan_share:.0%} of the Mamba step; without it: {bound:.2f}x; context, not the "
                                   f"target: 8-layer Mamba (params ≈ attention's) {ctx(tr, 'mamba (8 layers'):.2f}x, "
                                   f"both with the GELU MLP {ctx(tr, 'mamba (GELU'):.2f}x"))
    r = tps[lengths[-1]] / tps[lengths[0]]
    targets.append(target_line(f"Mamba forward (prefill) tokens/s at T={lengths[-1]} >= 0.8x at T={lengths[0]}",
                               None if q else r >= 0.8, f"{r:.2f}x ({tps[lengths[-1]]:,.0f} vs {tps[lengths[0]]:,.0f} tokens/s)"))
    out["targets"] = targets
    return out


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", default=None, help="comma-separated mixers (default: every registered mixer)")
    p.add_argument("--generation-only", action="store_true", help="only part 4, generation tokens/s against the context")
    p.add_argument("--ssm-only", action="store_true", help="only part 5, the Mamba targets (training vs softmax, prefill vs T)")
    add_decode_tokens(p, quick=10, full=40)
    args = p.parse_args()
    info = setup(args)
    if args.generation_only:
        print("4. generation (LanguageModel prefill + Cache decoding)")
        gen = bench_generation(args)
        write_json(args, "lm-generation", {"machine": info, "generation": gen})
        return
    if args.ssm_only:
        os.environ.setdefault("SEQMIX_CACHE", os.path.join(tempfile.gettempdir(), "seqmix-bench-cache"))
        print("5. Mamba against softmax attention, Mamba's prefill against T")
        ssm = bench_ssm_targets(args, d=64 if args.quick else 256, layers=2 if args.quick else 4)
        write_json(args, "lm-ssm", {"machine": info, "ssm": ssm})
        return
    os.environ.setdefault("SEQMIX_CACHE", os.path.join(tempfile.gettempdir(), "seqmix-bench-cache"))
    import seqmix

    d, layers, T, B = (64, 2, 128, 8) if args.quick else (256, 4, 512, 8)
    if args.mixers:
        mixers = args.mixers.split(",")
    elif args.quick:
        mixers = ["softmax_attention", "linear_attention", "s6"]
    else:
        mixers = [e.name for e in seqmix.list_mixers()]
    peak = matmul_peak_gflops(args.device)
    print(f"machine: {info}; float32 matmul peak {peak:.1f} GFLOP/s")

    print(f"\n1. training throughput ({layers} layers, d = {d}, T = {T}, batch {B}; one optimizer step, min of {args.repeats})")
    rates = train_rates(mixers, d=d, layers=layers, T=T, B=B, repeats=args.repeats, device=args.device, peak=peak)
    ref = next((r["tokens_per_s"] for r in rates if r["mixer"] == "softmax_attention"), None)
    rows = [[r["mixer"], r["tokens_per_s"], r["step_ms"], r["flops_per_token"] / 1e6, r["gflops"], 100 * r["peak_frac"],
             (r["tokens_per_s"] / ref) if ref else None, r["params"]] for r in sorted(rates, key=lambda r: -r["tokens_per_s"])]
    print_table("training tokens/s", ["case", "tokens/s", "step ms", "MFLOP/token", "GFLOP/s", "% of peak", "× softmax", "params"], rows)

    print("\n2. BPE tokenizing (Tiny Shakespeare, 1024 symbols)")
    tk = tokenize_rate(args.repeats)
    print_table("tokenizing", ["case", "tokens/s", "tokens"], [
        ["loader path (pieces, encode_batch)", tk["loader_tokens_per_s"], tk["tokens"]],
        ["one encode() of the whole text", tk["one_pass_tokens_per_s"], tk["tokens"]]])
    print(f"  BPE training: {tk['train_s']:.1f}s; {tk['pieces']} pieces")

    print(f"\n3. memmap loader (random windows, B = {B}, T = {T})")
    ld = loader_rate(T, B, args.repeats)
    fastest = max((r["tokens_per_s"] for r in rates), default=None)
    print(f"  loader {ld['tokens_per_s']:,.0f} tokens/s; fastest trainer {fastest or 0:,.0f} tokens/s"
          + (f"; ratio {ld['tokens_per_s'] / fastest:,.0f}×" if fastest else ""))

    print("\n4. generation (LanguageModel prefill + Cache decoding)")
    gen = bench_generation(args)

    print("\n5. Mamba against softmax attention, Mamba's prefill against T")
    ssm = bench_ssm_targets(args, d=d, layers=layers)

    print("\ntargets")
    targets = [
        target_line("BPE tokenizing >= 1M tokens/s", None if args.quick else tk["loader_tokens_per_s"] >= 1e6,
                    f"{tk['loader_tokens_per_s']:,.0f} tokens/s (loader path)"),
        target_line("memmap loader >= 10x the trainer", None if (args.quick or not fastest) else ld["tokens_per_s"] >= 10 * fastest,
                    f"{ld['tokens_per_s'] / fastest:,.0f}×" if fastest else "no trainer rate"),
    ]
    targets += gen["targets"]
    for t in ssm["targets"]:  # printed with part 5; repeated here with the others
        targets.append(target_line(t["target"], t["met"], t["detail"]))
    write_json(args, "lm", {"machine": info, "peak_gflops": peak, "shape": {"d": d, "layers": layers, "T": T, "B": B},
                            "train": rates, "tokenize": tk, "loader": ld, "generation": gen, "ssm": ssm, "targets": targets})


if __name__ == "__main__":
    main()
