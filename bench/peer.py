"""seqmix against transformers' own CPU paths at the same model size, side by side in one
run: training, prefill and decoding tokens/s of three pairs, and the ratio seqmix / transformers.

    python bench/peer.py               # d = 256, 4 layers, byte vocab 256; train / prefill at T = 512 and 4096,
                                       #   256 greedy tokens decoded after a 512-token prompt (minutes)
    python bench/peer.py --quick       # d = 128, 2 layers, T = 128 and 512, 32 tokens after 64: a smoke run
    python bench/peer.py --pairs mamba,llama --train 512x8 --prefill 512
    python bench/peer.py --pairs mamba2 --modes decode --threads 1   # the Mamba-2 decoding cell alone

The pairs (same d_model, layers, vocabulary, d_state / expand / heads on both sides):

* mamba:  seqmix's LanguageModel with the ``mamba`` mixer (no channel mixer, RMSNorm, tied head)
          vs transformers' MambaForCausalLM (d_state 16, expand 2, conv 4);
* mamba2: seqmix ``mamba2`` vs Mamba2ForCausalLM (d_state 64, head dim 64, expand 2, one group, chunk 64);
* llama:  seqmix ``softmax_attention`` with positions = "rope", channel_mixer = "swiglu", RMSNorm (the
          Llama-like config) vs LlamaForCausalLM with attn_implementation = "sdpa" (head dim 64, no GQA).

Both sides compute the same function: a random transformers model (its config class, nothing downloaded)
is built first, its mixers are converted by seqmix's interop (``seqmix.interop.from_transformers``: the
seqmix mixer configs and weights), and a seqmix ``LanguageModel`` of the same shape gets those mixers'
weights and transformers' embedding, norms, MLPs (Llama's gate/up/down become SwiGLU's fc1/fc2) and final
norm (transformers' configs are set to what seqmix's backbone does: tied head, RMSNorm eps 1e-5, Llama's
intermediate size = SwiGLU's 8·ceil(2/3·4·d/8)). Their logits on one prompt are compared (max abs
difference, printed) before anything is timed, and the greedy tokens of the decoding cells are compared.

Each side on its own user-facing path, float32, batch as stated, ``--threads`` torch threads (2 by default):

* train:   one step = forward (logits), next-token cross entropy, backward, AdamW step (lr 1e-4, plain
           parameter list on both sides); tokens/s = B·T / median step;
* prefill: batch 1, no grad, eval: transformers ``model(input_ids, use_cache=True)``, seqmix
           ``model.head(model.hidden(ids, cache=Cache()))`` (a fresh cache per call, logits at every position);
* decode:  batch 1, greedy: after a prefill (not timed), ``--decode-tokens`` one-token steps with the cache
           (transformers: ``model(input_ids=tok, cache=cache, use_cache=True)``; seqmix:
           ``model.hidden(tok, cache=cache, start=pos)`` + head), argmax included; tokens/s = steps / time.

transformers on CPU runs its torch fallbacks (no mamba_ssm / causal_conv1d kernels; ``use_mambapy`` off:
Mamba's scan is its sequential loop over T). The script forces those torch paths (it replaces the
kernel-dispatching wrappers of the modeling modules by the torch functions they wrap) whether or not a
kernel package is installed, and prints which were installed. The two sides of a cell run interleaved
(one run of each per round) after one warm-up run each, median of ``--repeats`` rounds. A side whose
warm-up run alone took longer than ``--cell-budget`` seconds is not repeated: its one (warm-up) run is
reported, marked "capped" with the reason. The load average is printed beside the figures (the machine
may be shared).
"""

from __future__ import annotations

import inspect
import importlib.util
import math
import os
import signal
import statistics
import time

import torch
import torch.nn.functional as F

from _common import base_parser, print_table, setup, write_json

PAIRS = ("mamba", "mamba2", "llama")
MODES = ("train", "prefill", "decode")
KERNEL_PACKAGES = ("mamba_ssm", "causal_conv1d", "mambapy", "kernels", "fla")
#: the modeling modules whose kernel-dispatching functions are replaced by their torch fallbacks
_TF_MODULES = {"mamba": "transformers.models.mamba.modeling_mamba", "mamba2": "transformers.models.mamba2.modeling_mamba2"}


def swiglu_hidden(d: int, ratio: float = 4.0) -> int:
    """The hidden width of seqmix's SwiGLU (models/lm.py): 8·ceil(2·ratio·d / 3 / 8)."""
    return 8 * math.ceil(2 * ratio * d / 3 / 8)


def force_torch_paths() -> list[str]:
    """Replaces every kernel-dispatching function of transformers' Mamba / Mamba-2 modeling modules
    (``use_kernel_func_from_hub_with_fallback``) by the torch function it wraps; returns their names."""
    import importlib

    done = []
    for mod_name in _TF_MODULES.values():
        mod = importlib.import_module(mod_name)
        for name, f in list(vars(mod).items()):
            if callable(f) and not inspect.isclass(f) and hasattr(f, "__wrapped__") and getattr(f, "__module__", None) == mod_name:
                setattr(mod, name, inspect.unwrap(f))
                done.append(f"{mod_name.rsplit('.', 1)[-1]}.{name}")
    return done


def build_pair(pair: str, *, d: int, layers: int, vocab: int, max_len: int):
    """(transformers model, seqmix LanguageModel with the same weights, a description of the sizes)."""
    import transformers as tf

    from seqmix.interop import from_transformers, seqmix_mixers
    from seqmix.models.lm import LanguageModel, ModelConfig

    common = dict(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, tie_word_embeddings=True,
                  pad_token_id=0, bos_token_id=1, eos_token_id=1)
    if pair == "mamba":
        hf = tf.MambaForCausalLM(tf.MambaConfig(**common, state_size=16, expand=2, conv_kernel=4, layer_norm_epsilon=1e-5,
                                                use_mambapy=False))
        mixer, lm_kw, prefix = "mamba", dict(positions="none", channel_mixer="none"), "backbone"
        sizes = "d_state 16, expand 2 (d_inner {}), conv 4, dt_rank {}".format(2 * d, hf.config.time_step_rank)
    elif pair == "mamba2":
        hd = min(64, 2 * d)
        hf = tf.Mamba2ForCausalLM(tf.Mamba2Config(**common, state_size=64, expand=2, head_dim=hd, num_heads=2 * d // hd,
                                                  n_groups=1, chunk_size=64, conv_kernel=4, layer_norm_epsilon=1e-5))
        mixer, lm_kw, prefix = "mamba2", dict(positions="none", channel_mixer="none"), "backbone"
        sizes = f"d_state 64, expand 2, {2 * d // hd} heads of {hd}, 1 group, chunk 64, conv 4"
    elif pair == "llama":
        hd = min(64, d)
        hf = tf.LlamaForCausalLM(tf.LlamaConfig(**common, intermediate_size=swiglu_hidden(d), num_attention_heads=d // hd,
                                                num_key_value_heads=d // hd, rms_norm_eps=1e-5, max_position_embeddings=max_len,
                                                attn_implementation="sdpa"))
        mixer, lm_kw, prefix = "softmax_attention", dict(positions="rope", channel_mixer="swiglu", mlp_ratio=4.0), "model"
        sizes = f"{d // hd} heads of {hd} (no GQA), RoPE theta 10000, SwiGLU hidden {swiglu_hidden(d)}, SDPA"
    else:
        raise ValueError(f"argument --pairs: unknown pair {pair!r}; choose from {', '.join(PAIRS)}")
    hf = hf.eval()
    mixers = seqmix_mixers(from_transformers(hf))  # a converted copy: its seqmix mixers' configs and weights
    paths = sorted(mixers, key=lambda p: int(p.split(".")[2]))
    kwargs = mixers[paths[0]].config.model_dump()
    kwargs.pop("d_model")
    cfg = ModelConfig(mixer=mixer, mixer_kwargs=kwargs, d_model=d, n_layers=layers, vocab_size=vocab, norm="rmsnorm",
                      mixer_init="own", **lm_kw)
    lm = LanguageModel(cfg)
    hs = hf.state_dict()
    sd = {}
    if pair == "llama":
        sd["embed.weight"] = hs["model.embed_tokens.weight"]
        sd["norm_f.weight"] = hs["model.norm.weight"]
        for i in range(layers):
            p = f"model.layers.{i}."
            sd[f"blocks.{i}.norm1.weight"] = hs[p + "input_layernorm.weight"]
            sd[f"blocks.{i}.norm2.weight"] = hs[p + "post_attention_layernorm.weight"]
            sd[f"blocks.{i}.channel.fc1.weight"] = torch.cat([hs[p + "mlp.gate_proj.weight"], hs[p + "mlp.up_proj.weight"]])
            sd[f"blocks.{i}.channel.fc2.weight"] = hs[p + "mlp.down_proj.weight"]
    else:
        sd["embed.weight"] = hs["backbone.embeddings.weight"]
        sd["norm_f.weight"] = hs["backbone.norm_f.weight"]
        for i in range(layers):
            sd[f"blocks.{i}.norm1.weight"] = hs[f"backbone.layers.{i}.norm.weight"]
    for i, path in enumerate(paths):
        if mixers[path].config.model_dump() != mixers[paths[0]].config.model_dump():
            raise RuntimeError(f"{pair}: layer {i}'s converted mixer config differs from layer 0's")
        for k, v in mixers[path].state_dict().items():
            sd[f"blocks.{i}.mixer.{k}"] = v
    lm.load_state_dict({k: v.clone() for k, v in sd.items()}, strict=True)  # every seqmix parameter set, none left over
    n_hf = sum(p.numel() for p in hf.parameters())
    n_sm = sum(p.numel() for p in lm.parameters())
    if n_hf != n_sm:
        raise RuntimeError(f"{pair}: {n_hf} transformers parameters against {n_sm} seqmix parameters")
    return hf, lm.eval(), f"{sizes}; {n_sm / 1e6:.2f}M parameters (tied head)"


# -- the three measurements, per side ---------------------------------------------------------


def hf_logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def _same(t):
    return t


def train_step_fn(model, logits_fn, ids: torch.Tensor):
    """One training step of ``model`` on ``ids``: logits, next-token cross entropy, backward, AdamW. The
    forward runs under identity saved-tensor hooks (both sides alike; one Python call per saved tensor)
    so that the backward calls Python now and then: a run past --max-run-s can be stopped there too."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(_same, _same):
            logits = logits_fn(model, ids)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()

    return step


def prefill_fn(side: str, model, ids: torch.Tensor):
    from seqmix import Cache

    if side == "transformers":
        def run():
            with torch.no_grad():
                model(input_ids=ids, use_cache=True)
    else:
        def run():
            with torch.no_grad():
                model.head(model.hidden(ids, cache=Cache()))
    return run


def decode_fn(side: str, model, prompt: torch.Tensor, steps: int, tokens_out: list):
    """A function that prefills ``prompt`` (not timed), decodes ``steps`` greedy one-token steps through
    the cache and returns the median seconds of one step (a step = the model call and the argmax; the
    median over the steps, so that a moment of load on a shared machine does not count); the generated
    tokens go to ``tokens_out`` (the last run's)."""
    from seqmix import Cache

    def run() -> float:
        toks, ts = [], []
        with torch.no_grad():
            if side == "transformers":
                out = model(input_ids=prompt, use_cache=True)
                cache, tok = out.cache, out.logits[:, -1:].argmax(-1)
                for _ in range(steps):
                    toks.append(tok)
                    t0 = time.perf_counter()
                    out = model(input_ids=tok, cache=cache, use_cache=True)
                    cache, tok = out.cache, out.logits[:, -1:].argmax(-1)
                    ts.append(time.perf_counter() - t0)
            else:
                cache, pos = Cache(), prompt.shape[1]
                tok = model.head(model.hidden(prompt, cache=cache)[:, -1:]).argmax(-1)
                for _ in range(steps):
                    toks.append(tok)
                    t0 = time.perf_counter()
                    tok = model.head(model.hidden(tok, cache=cache, start=pos)).argmax(-1)
                    ts.append(time.perf_counter() - t0)
                    pos += 1
        tokens_out[:] = torch.cat(toks, 1)[0].tolist()
        return statistics.median(ts)

    return run


class _Overrun(Exception):
    pass


_OVERRUN = [False]


def _alarm(signum, frame):
    _OVERRUN[0] = True
    raise _Overrun


def paired(fns: dict, repeats: int, budget: float, max_run: float) -> dict:
    """{side: fn} (fn returns its own seconds, or None: then its wall time counts): one warm-up run each,
    then ``repeats`` interleaved rounds. A side whose warm-up took longer than ``budget`` s keeps that
    one run (capped); a run still going after ``max_run`` s is stopped (SIGALRM, raised between two
    Python operations, in a training step's backward too: see train_step_fn) and the side is reported as
    slower than that time (``over_s``). Returns {side: dict(median_s, runs, capped, over_s)}."""
    def once(fn) -> float:
        t0 = time.perf_counter()
        r = fn()
        return r if isinstance(r, float) else time.perf_counter() - t0

    runs, capped, over = {}, {}, {}
    for side, fn in fns.items():
        runs[side] = []
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, max_run)
        t0 = time.perf_counter()
        _OVERRUN[0] = False
        try:
            w = once(fn)
        except Exception:  # noqa: BLE001  (_Overrun, or what the autograd engine made of it: re-raised otherwise)
            if not _OVERRUN[0]:
                raise
            over[side] = time.perf_counter() - t0
            capped[side] = (f"stopped after {over[side]:.0f} s of its first run (--max-run-s {max_run:g}): slower than "
                            f"that, the figure is an upper bound of its tokens/s")
            continue
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        if w > budget:
            runs[side] = [w]
            capped[side] = f"one run only (the warm-up): it took {w:.1f} s > --cell-budget {budget:g} s"
    for _ in range(repeats):
        for side, fn in fns.items():
            if side not in capped:
                runs[side].append(once(fn))
    return {s: {"median_s": statistics.median(r) if r else over[s], "runs": len(r), "capped": capped.get(s),
                "over_s": over.get(s)} for s, r in runs.items()}


def parse_train(spec: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        T, _, B = part.partition("x")
        out.append((int(T), int(B or 1)))
    return out


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.set_defaults(threads=2, device="cpu")
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated pairs of {', '.join(PAIRS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated cells to run of {', '.join(MODES)} (default all)")
    p.add_argument("--d-model", type=int, default=None, help="width d (default 256; 128 with --quick)")
    p.add_argument("--layers", type=int, default=None, help="layers (default 4; 2 with --quick)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary (default 256: bytes)")
    p.add_argument("--train", default=None, help="training cells TxB, comma-separated (default 512x8,4096x1; 128x4,512x1 with --quick)")
    p.add_argument("--prefill", default=None, help="prefill lengths, batch 1 (default 512,4096; 128,512 with --quick)")
    p.add_argument("--prompt", type=int, default=None, help="decoding prompt length (default 512; 64 with --quick)")
    p.add_argument("--decode-tokens", type=int, default=None, help="greedy steps timed (default 256; 32 with --quick)")
    p.add_argument("--cell-budget", type=float, default=60.0,
                   help="seconds: a side whose warm-up run of a cell took longer is not repeated (default 60)")
    p.add_argument("--max-run-s", type=float, default=120.0,
                   help="seconds: a run still going after this is stopped, the side reported as slower (default 120)")
    args = p.parse_args()
    if args.device != "cpu":
        p.error("argument --device: this benchmark compares CPU paths; run it with --device cpu")
    info = setup(args)
    q = args.quick
    d = args.d_model or (128 if q else 256)
    layers = args.layers or (2 if q else 4)
    V = args.vocab
    train = parse_train(args.train or ("128x4,512x1" if q else "512x8,4096x1"))
    prefill = [int(t) for t in (args.prefill or ("128,512" if q else "512,4096")).split(",")]
    prompt_len = args.prompt or (64 if q else 512)
    steps = args.decode_tokens or (32 if q else 256)
    repeats = 1 if q and args.repeats == 3 else args.repeats
    pairs = [s.strip() for s in args.pairs.split(",") if s.strip()]
    for s in pairs:
        if s not in PAIRS:
            p.error(f"argument --pairs: unknown pair {s!r}; choose from {', '.join(PAIRS)}")
    modes = [s.strip() for s in args.modes.split(",") if s.strip()]
    for s in modes:
        if s not in MODES:
            p.error(f"argument --modes: unknown mode {s!r}; choose from {', '.join(MODES)}")
    train = train if "train" in modes else []
    prefill = prefill if "prefill" in modes else []
    max_len = max([T for T, _ in train] + prefill + [prompt_len + steps + 1])

    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    installed = [m for m in KERNEL_PACKAGES if importlib.util.find_spec(m) is not None]
    forced = force_torch_paths()
    path_note = (f"transformers {transformers.__version__} on its torch paths: {len(forced)} kernel-dispatching functions of "
                 f"modeling_mamba / modeling_mamba2 replaced by their torch fallbacks (use_mambapy=False: Mamba's scan is "
                 f"its sequential loop over T); kernel packages installed here: {', '.join(installed) or 'none'}"
                 + (" (fla serves none of these three models)" if "fla" in installed else ""))
    print(path_note)
    load_before = os.getloadavg()
    gen = torch.Generator().manual_seed(0)
    results, rows = {}, []
    for pair in pairs:
        torch.manual_seed(0)
        hf, sm, sizes = build_pair(pair, d=d, layers=layers, vocab=V, max_len=max_len)
        ids = torch.randint(2, V, (1, prompt_len), generator=gen)
        with torch.no_grad():
            lh, ls = hf_logits(hf, ids), sm(ids)
        diff, scale = (lh - ls).abs().max().item(), lh.abs().max().item()
        print(f"\n{pair}: {sizes}\n  logits on {prompt_len} tokens: max |seqmix - transformers| = {diff:.2e} "
              f"(max |logit| {scale:.2f})", flush=True)
        res = {"sizes": sizes, "logit_max_abs_diff": diff, "logit_max_abs": scale, "cells": {}}
        cells = res["cells"]

        def record(name, mode, tokens, t, extra=None):
            """tokens: per timed run (decode: 1, its runs time one step)."""
            r_s, r_t = t["seqmix"], t["transformers"]
            tps_s, tps_t = tokens / r_s["median_s"], tokens / r_t["median_s"]
            ratio = tps_s / tps_t
            cells[name] = {"mode": mode, "tokens_per_run": tokens, "seqmix": {**r_s, "tokens_per_s": tps_s},
                           "transformers": {**r_t, "tokens_per_s": tps_t}, "ratio": ratio, **(extra or {})}
            note = "; ".join(f"{s}: {r['capped']}" for s, r in t.items() if r["capped"])
            # a stopped side's tokens/s is an upper bound (seqmix's: the ratio is one too; transformers': a lower one)
            shown = [f"< {v:,.1f}" if t[s]["over_s"] else v for s, v in (("seqmix", tps_s), ("transformers", tps_t))]
            bound = "< " if r_s["over_s"] else "> " if r_t["over_s"] else ""
            rows.append([pair, name, *shown, f"{bound}{ratio:.3g}" if bound else ratio, note or None])
            print(f"  {name}: seqmix {shown[0] if r_s['over_s'] else f'{tps_s:,.0f}'} tokens/s, transformers "
                  f"{shown[1] if r_t['over_s'] else f'{tps_t:,.0f}'} tokens/s, ratio {bound}{ratio:.2f}"
                  + (f" ({note})" if note else ""), flush=True)

        # prefill and decode first (eval weights as converted), training last (it changes the weights)
        for T in prefill:
            x = torch.randint(2, V, (1, T), generator=gen)
            t = paired({"seqmix": prefill_fn("seqmix", sm, x), "transformers": prefill_fn("transformers", hf, x)},
                       repeats, args.cell_budget, args.max_run_s)
            record(f"prefill T={T}", "prefill", T, t)
        if "decode" in modes:
            toks = {"seqmix": [], "transformers": []}
            t = paired({s: decode_fn(s, m, ids, steps, toks[s]) for s, m in (("seqmix", sm), ("transformers", hf))},
                       repeats, args.cell_budget, args.max_run_s)
            agree = next((i for i, (a, b) in enumerate(zip(toks["seqmix"], toks["transformers"])) if a != b), steps)
            record(f"decode {steps} after {prompt_len}", "decode", 1, t, {"steps": steps, "greedy_tokens_agree": agree})
            print(f"    greedy tokens identical for the first {agree} of {steps}")
        for T, B in train:
            x = torch.randint(2, V, (B, T), generator=gen)
            t = paired({"seqmix": train_step_fn(sm, lambda m, i: m(i), x), "transformers": train_step_fn(hf, hf_logits, x)},
                       repeats, args.cell_budget, args.max_run_s)
            record(f"train T={T} B={B}", "train", B * T, t)
        sm.eval(), hf.eval()
        results[pair] = res
        print(f"  (load average now {os.getloadavg()[0]:.2f})", flush=True)
        del hf, sm
    load_after = os.getloadavg()
    print(f"\nd_model {d}, {layers} layers, vocab {V}, float32, CPU, torch threads {torch.get_num_threads()} on "
          f"{os.cpu_count()} cores; median of {repeats} interleaved rounds after a warm-up; train: forward + cross entropy + "
          f"backward + AdamW; prefill batch 1 (no grad); decode batch 1, greedy, {steps} steps after a {prompt_len}-token prompt")
    for pair in pairs:
        r = results[pair]
        print(f"  {pair}: {r['sizes']}; max |logit diff| {r['logit_max_abs_diff']:.1e} of max |logit| {r['logit_max_abs']:.2f}")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, after "
          f"{load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} (the machine may be shared: figures under load)")
    print_table("seqmix vs transformers, CPU tokens/s (ratio = seqmix / transformers)",
                ["pair", "mode", "seqmix tok/s", "transformers tok/s", "ratio", "note"], rows)
    write_json(args, "peer", {"machine": info, "transformers": transformers.__version__, "paths": path_note,
                              "forced_torch_functions": forced, "d_model": d, "layers": layers, "vocab": V,
                              "modes": modes, "train": train, "prefill": prefill, "prompt": prompt_len, "decode_tokens": steps,
                              "repeats": repeats, "cell_budget_s": args.cell_budget, "load_before": load_before,
                              "load_after": load_after, "results": results})


if __name__ == "__main__":
    main()
