"""torch.compile against eager: training tokens/s of the LM backbone around five mixers.

    python bench/compile.py            # d_model 128, 2 layers, T 256, batch 4; CPU (or --device cuda)
    python bench/compile.py --quick    # d_model 64, T 64, batch 2

For each mixer, one LanguageModel (models/lm.py) is trained with AdamW for a few steps in eager
mode and as ``torch.compile(model)`` (inductor, the default backend), from the same weights on the
same batch. The compiled model's first steps compile it (the time is printed as ``compile s``, not
counted in its tokens/s); then both are timed, alternating, and the minimum step time of each gives
tokens/s. Before timing, ``torch._dynamo.explain`` counts the graph breaks of the training forward
(tests/test_compile.py holds every mixer to none). The losses of the first compiled and eager steps
are printed side by side: the compiled model computes the same function.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from _common import base_parser, print_table, setup, sync, write_json

from seqmix.models import ModelConfig, build_model

MIXERS = ["softmax_attention", "gla", "mamba", "mamba2", "gated_deltanet"]


def step_fn(model, opt, ids):
    def step():
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def timed(step, device, repeats):
    ts = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--mixers", nargs="+", default=MIXERS)
    args = p.parse_args(argv)
    info = setup(args)
    print(f"machine: {info}")
    import torch._dynamo as dynamo

    d, T, B = (64, 64, 2) if args.quick else (128, 256, 4)
    rows, out = [], {}
    for name in args.mixers:
        cfg = ModelConfig(d_model=d, n_layers=2, vocab_size=256, mixer=name, max_seq_len=T + 1)
        torch.manual_seed(0)
        ids = torch.randint(0, 256, (B, T + 1), device=args.device)
        models = {}
        for kind in ("eager", "compiled"):
            torch.manual_seed(0)
            model = build_model(cfg).to(args.device).train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            runner = model if kind == "eager" else torch.compile(model)
            models[kind] = (runner, step_fn(runner, opt, ids))
        dynamo.reset()
        breaks = dynamo.explain(models["eager"][0])(ids[:, :-1]).graph_break_count
        dynamo.reset()
        loss0 = {k: float(s()) for k, (_, s) in (("eager", models["eager"]), )}
        t0 = time.perf_counter()
        loss0["compiled"] = float(models["compiled"][1]())  # compiles the forward and the backward
        models["compiled"][1]()
        compile_s = time.perf_counter() - t0
        models["eager"][1]()
        best = {"eager": float("inf"), "compiled": float("inf")}
        for _ in range(2):
            for kind in ("eager", "compiled"):
                best[kind] = min(best[kind], timed(models[kind][1], args.device, args.repeats))
        tok = {k: B * T / v for k, v in best.items()}
        ratio = tok["compiled"] / tok["eager"]
        rows.append([name, str(breaks), f"{compile_s:.1f}", f"{tok['eager']:.0f}", f"{tok['compiled']:.0f}", f"{ratio:.2f}",
                     f"{loss0['eager']:.5f} / {loss0['compiled']:.5f}"])
        out[name] = dict(graph_breaks=breaks, compile_s=compile_s, eager_tok_s=tok["eager"], compiled_tok_s=tok["compiled"],
                         ratio=ratio, first_loss=loss0)
    print_table(f"LM training step (d_model {d}, 2 layers, T {T}, batch {B}, AdamW) on {args.device}, min of {args.repeats} x 2",
                ["mixer", "breaks", "compile s", "eager tok/s", "compiled tok/s", "compiled / eager", "first loss eager / compiled"],
                rows)
    write_json(args, "compile", dict(machine=info, d_model=d, seq_len=T, batch=B, results=out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
