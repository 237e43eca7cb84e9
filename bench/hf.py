"""HuggingFace generate() against seqmix's own LanguageModel.generate.

    python bench/hf.py            # context 2048, 64 new tokens (a few minutes on 2 cores)
    python bench/hf.py --quick    # context 256, 16 new tokens

For softmax attention, GLA and Mamba, one LanguageModel (4 layers, d = 256, vocab 256) is
wrapped by ``SeqmixForCausalLM`` (the same module: same weights, same Cache), and one prompt
of the context length is decoded greedily by both paths:

    native:  model.generate(ids, N, temperature=0)
    HF:      SeqmixForCausalLM.generate(ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)

Decoding speed is isolated from the prefill: the model's ``hidden`` is wrapped to stamp the
time of every one-token call, and the time per token is the median gap between successive
stamps (the model's step plus each path's own loop work: sampling, HF's logits processors
and stopping criteria), over ``--repeats`` generations per path, alternating the paths.
A median over many steps resists a loaded machine better than a difference of totals. The
table also splits the step: "step ms" is the model call itself (the same code on both
paths), "loop ms" the path's work between two model calls (median of each).
Both paths must give the same tokens (checked). Target: HF within 1.3x of native (ratio of
the decode time per token).
"""

from __future__ import annotations

import statistics
import time

import torch

from _common import base_parser, print_table, setup, sync, target_line, write_json

from seqmix.models import ModelConfig, build_model

D_MODEL, N_LAYERS, VOCAB = 256, 4, 256
MIXERS = {"softmax_attention": {"heads": 4}, "gla": {"heads": 4}, "mamba": {}}
TARGET = 1.3


def bench_hf(args) -> dict:
    import seqmix.hf as H

    L, N = (256, 16) if args.quick else (2048, 64)
    rows, results, targets = [], {}, []
    for name, kw in MIXERS.items():
        torch.manual_seed(0)
        lm = build_model(ModelConfig(mixer=name, mixer_kwargs=kw, d_model=D_MODEL, n_layers=N_LAYERS, vocab_size=VOCAB,
                                     max_seq_len=L + N)).to(args.device).eval()
        hf = H.SeqmixForCausalLM.wrap(lm)
        ids = torch.randint(0, VOCAB, (1, L), generator=torch.Generator().manual_seed(1)).to(args.device)
        mask = torch.ones_like(ids)  # else generate() infers a mask from the pad id's positions in the prompt

        def native(n):
            return lm.generate(ids, n, temperature=0)

        def via_hf(n):
            return hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                               pad_token_id=0)

        same = torch.equal(native(N), via_hf(N))
        # the loop time per token: the wall time between successive one-token model calls
        # (model step + the path's own work: sampling, logits processors, stopping criteria)
        stamps: list[float] = []
        hidden = lm.hidden

        ends: list[float] = []

        def timed_hidden(input_ids, cache=None, start=0):
            if input_ids.shape[1] != 1:
                return hidden(input_ids, cache, start)
            sync(args.device)
            stamps.append(time.perf_counter())
            h = hidden(input_ids, cache, start)
            sync(args.device)
            ends.append(time.perf_counter())
            return h

        lm.hidden = timed_hidden
        cycles = {"native": [], "hf": []}
        prefill = {"native": [], "hf": []}
        inside = {"native": [], "hf": []}  # the model's step
        outside = {"native": [], "hf": []}  # the path's own work between two steps
        with torch.inference_mode():
            for _ in range(args.repeats):
                for p, fn in (("native", native), ("hf", via_hf)):
                    stamps.clear()
                    ends.clear()
                    t0 = time.perf_counter()
                    fn(N)
                    prefill[p].append(stamps[0] - t0)
                    cycles[p] += [b - a for a, b in zip(stamps, stamps[1:])]
                    inside[p] += [e - a for a, e in zip(stamps, ends)]
                    outside[p] += [b - e for e, b in zip(ends, stamps[1:])]
        del lm.hidden  # back to the class method
        res = {}
        for p in ("native", "hf"):
            ms = statistics.median(cycles[p]) * 1e3
            res[p] = dict(prefill_s=min(prefill[p]), decode_ms_per_token=ms, tokens_per_s=1e3 / ms,
                          steps_timed=len(cycles[p]), model_step_ms=statistics.median(inside[p]) * 1e3,
                          loop_ms=statistics.median(outside[p]) * 1e3)
        ratio = res["hf"]["decode_ms_per_token"] / res["native"]["decode_ms_per_token"]
        results[name] = dict(res, ratio=ratio, same_tokens=same)
        rows.append([name, res["native"]["tokens_per_s"], res["hf"]["tokens_per_s"], ratio, res["native"]["model_step_ms"],
                     res["hf"]["model_step_ms"], res["native"]["loop_ms"], res["hf"]["loop_ms"], res["native"]["prefill_s"],
                     res["hf"]["prefill_s"], str(same)])
    print_table(f"greedy decoding after a {L}-token prompt, {N} new tokens ({N_LAYERS} layers, d = {D_MODEL}, batch 1; "
                f"median step of {args.repeats} x {N - 1} steps)", ["case", "native tok/s", "HF tok/s", "HF/native time", "native step ms",
                                            "HF step ms", "native loop ms", "HF loop ms", "native prefill s",
                                            "HF prefill s", "same tokens"], rows)
    print("targets:")
    for name, r in results.items():
        targets.append(target_line(f"{name}: HF generate() within {TARGET}x of LanguageModel.generate at context {L}",
                                   r["ratio"] <= TARGET and r["same_tokens"],
                                   f"time per token ratio {r['ratio']:.2f}; same tokens: {r['same_tokens']}"))
    return dict(context=L, new_tokens=N, results=results, targets=targets)


def main(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    args = p.parse_args(argv)
    info = setup(args)
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed (pip install 'seqmix[hf]'): nothing to compare")
        return
    write_json(args, "hf", dict(machine=info, hf=bench_hf(args)))


if __name__ == "__main__":
    main()
