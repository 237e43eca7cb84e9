"""Language modelling throughput (issue 13), side by side in one run:

1. training tokens/s of every registered mixer (or --mixers) in the LM backbone at
   4 layers, d = 256, T = 512, batch 8 — one full optimizer step of the trainer (its own
   loss, backward, clipping, AdamW), batches from the Tiny Shakespeare memmap — with the
   model FLOPs per token (seqmix.train.flops) and the fraction of this machine's measured
   float32 matmul peak; ratios against softmax attention;
2. tokenizing Tiny Shakespeare with the trained byte-level BPE (1024 symbols) the way the
   corpus loader does it (pieces cut at safe line breaks, encode_batch), beside one
   encode() call over the whole text — target ≥ 1M tokens/s;
3. the memmap loader (random training windows, B = 8, T = 512) against the fastest
   trainer rate of part 1 — target ≥ 10×.

    python bench/lm.py                 # every mixer (minutes on a CPU)
    python bench/lm.py --quick         # 3 mixers, T = 128: a smoke run, not the targets
    python bench/lm.py --mixers softmax_attention,s6,gla
"""

from __future__ import annotations

import os
import tempfile
import time

from _common import base_parser, matmul_peak_gflops, print_table, setup, target_line, timeit, write_json


def train_rates(mixers, *, d: int, layers: int, T: int, B: int, repeats: int, device: str, peak: float) -> list[dict]:
    import torch

    from seqmix.data.text import CorpusConfig, build_corpus
    from seqmix.train import RunConfig, TrainConfig, Trainer
    from seqmix.train.flops import flops_per_token
    from seqmix.train.optim import param_groups

    data = CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=T, batch_size=B)
    windows = build_corpus(data, "train")
    out = []
    for name in mixers:
        try:
            cfg = RunConfig(data=data, model={"mixer": name, "d_model": d, "n_layers": layers},
                            train=TrainConfig(max_steps=1, device=device))
        except ValueError as e:
            print(f"  {name}: not built at d = {d} ({str(e).splitlines()[0][:100]})")
            continue
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
        del model, opt
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


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", default=None, help="comma-separated mixers (default: every registered mixer)")
    args = p.parse_args()
    info = setup(args)
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

    # ---- 4. generation timing: the `gen` branch (LanguageModel.generate) adds its section here ----

    print("\ntargets")
    targets = [
        target_line("BPE tokenizing >= 1M tokens/s", None if args.quick else tk["loader_tokens_per_s"] >= 1e6,
                    f"{tk['loader_tokens_per_s']:,.0f} tokens/s (loader path)"),
        target_line("memmap loader >= 10x the trainer", None if (args.quick or not fastest) else ld["tokens_per_s"] >= 10 * fastest,
                    f"{ld['tokens_per_s'] / fastest:,.0f}×" if fastest else "no trainer rate"),
    ]
    write_json(args, "lm", {"machine": info, "peak_gflops": peak, "shape": {"d": d, "layers": layers, "T": T, "B": B},
                            "train": rates, "tokenize": tk, "loader": ld, "targets": targets})


if __name__ == "__main__":
    main()
