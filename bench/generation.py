"""Generation through LanguageModel's prefill + Cache decoding (issue 13, "Generation").

    python bench/generation.py            # contexts 1k, 4k, 16k (a few minutes on 2 cores)
    python bench/generation.py --quick    # contexts 256, 512, 1024 (seconds)

For a recurrent mixer (GLA; Mamba too) and for softmax attention, a whole LanguageModel
(4 layers, d = 256, vocab 256, batch 1) prefills one prompt per context L
(seqmix.models.generation.prefill: each mixer's parallel mode through a Cache), then decodes
tokens one at a time (generation.step: every mixer's step mode), round-robin over the
contexts so that a change in the machine's load hits every L alike. Reported per L: decode
tokens/s (from the median step), the prefill time, and the decoding state per sequence
(floats and bytes held by the Cache after the prefill: O(1) for recurrent mixers, the KV
cache for attention).

Targets (issue 13): the recurrent mixer's tokens/s flat within 20% from 1k to 16k; softmax's
cost per token grows with the context.
"""

from __future__ import annotations

import statistics
import time

import torch

from _common import add_decode_tokens, base_parser, print_table, setup, sync, target_line, write_json

from seqmix.models import ModelConfig, build_model
from seqmix.models.generation import prefill, step

D_MODEL, N_LAYERS, VOCAB = 256, 4, 256
MIXERS = {"gla": {"heads": 4}, "mamba": {}, "softmax_attention": {"heads": 4}}
RECURRENT = ("gla", "mamba")


def build(name: str, max_len: int, device: str):
    torch.manual_seed(0)
    cfg = ModelConfig(mixer=name, mixer_kwargs=MIXERS[name], d_model=D_MODEL, n_layers=N_LAYERS, vocab_size=VOCAB,
                      max_seq_len=max_len)
    return build_model(cfg).to(device).eval()


def model_decode_timings(model, contexts, *, tokens: int, device: str = "cpu", warmup: int = 3) -> dict:
    """{L: dict(prefill_s, state_floats, state_bytes, ms_per_token (median), min_ms, tokens_per_s)}."""
    states, out = {}, {}
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for L in contexts:
            ids = torch.randint(0, VOCAB, (1, L), generator=g).to(device)
            sync(device)
            t0 = time.perf_counter()
            logits, states[L] = prefill(model, ids, last_only=True)
            sync(device)
            out[L] = dict(prefill_s=time.perf_counter() - t0, state_floats=states[L].floats(), state_bytes=states[L].nbytes())
        times = {L: [] for L in contexts}
        toks = torch.randint(0, VOCAB, (warmup + tokens, 1), generator=g).to(device)
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
    names = args.mixers or list(MIXERS)
    rows, results, targets = [], {}, []
    for name in names:
        model = build(name, contexts[-1] + args.decode_tokens + 8, args.device)
        t = model_decode_timings(model, contexts, tokens=args.decode_tokens, device=args.device)
        results[name] = t
        base = t[contexts[0]]["tokens_per_s"]
        for L in contexts:
            r = t[L]
            rows.append([name, L, r["tokens_per_s"], r["tokens_per_s"] / base, r["ms_per_token"], r["prefill_s"],
                         r["state_floats"], r["state_bytes"] / 2**20])
    print_table(f"LanguageModel generation ({N_LAYERS} layers, d = {D_MODEL}, batch 1; median of {args.decode_tokens} steps)",
                ["case", "context", "tokens/s", "x first L", "ms/token", "prefill s", "state floats", "state MiB"], rows)
    print("targets (issue 13, generation):")
    for name, t in results.items():
        rates = [t[L]["tokens_per_s"] for L in contexts]
        if name in RECURRENT:
            spread = max(rates) / min(rates) - 1
            targets.append(target_line(f"{name}: tokens/s flat within 20% over L = {contexts}", spread <= 0.2,
                                       f"max/min - 1 = {spread:.1%} ({', '.join(f'{x:.0f}' for x in rates)} tokens/s)"))
        else:
            a, b = t[contexts[0]], t[contexts[-1]]
            targets.append(target_line(f"{name}: cost per token grows with L", b["ms_per_token"] > a["ms_per_token"],
                                       f"{a['ms_per_token']:.2f} -> {b['ms_per_token']:.2f} ms/token; "
                                       f"state {a['state_floats']} -> {b['state_floats']} floats per sequence"))
    return dict(contexts=list(contexts), results={k: {str(L): v for L, v in r.items()} for k, r in results.items()},
                targets=targets)


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    add_decode_tokens(p, quick=10, full=40)
    p.add_argument("--mixers", nargs="*", default=None, help=f"default: {' '.join(MIXERS)}")
    args = p.parse_args(argv)
    info = setup(args)
    payload = dict(machine=info, generation=bench_generation(args))
    write_json(args, "generation", payload)


if __name__ == "__main__":
    main()
