"""Converted vs original transformers models on CPU: conversion time, and
forward, prefill and decode tokens/s per family, side by side in one run, with the ratio.

    python bench/interop.py            # d = 256, 4 layers, vocab 256; T = 512 forward / prefill, 64 decode steps
    python bench/interop.py --quick    # T = 64, 8 decode steps, one repeat (a smoke run)
    python bench/interop.py --families mamba,mamba2
    python bench/interop.py --report-table   # docs/interop.md's table: every family's layer report, one Markdown table
    python bench/interop.py --write-docs     # and the results section of docs/interop.md

Every family of ``seqmix.interop.FAMILIES`` is run (a family without an entry in ``CONFIGS``, the one dict of
tiny per-family configs, is listed as not measured). Per family a random model from transformers' config
class (nothing downloaded), float32,
eval mode, batch 1, transformers on its torch paths (no mamba_ssm / causal_conv1d kernels):

* conversion: ``from_transformers(model)`` (a copy; the original is kept for the comparison);
* forward: ``model(ids, use_cache=False)`` on T tokens;
* prefill: ``model(ids, use_cache=True)`` (the cache filled);
* decode: ``generate`` of ``--decode-tokens`` greedy tokens after a T-token prompt, timed per token
  (the interval between two tokens: one decoding step through the cache, with generate's own work;
  the converted model: the seqmix mixers' step mode), each step's min over the repeats.

Counted work (deterministic, whatever the load): for every family the aten ops and Python calls per decoding
step of the converted model against the original's (``call_counts``), each row MET where both are no more
than the original's, else NOT MET with the entries counted most above the original (the measured reason).

``--write-docs`` writes the results (the command, the load, both tables, the reasons) into docs/interop.md
between the markers ``<!-- bench/interop.py:results -->`` and ``<!-- /bench/interop.py:results -->`` (appended
at the end of the page where they are absent); the rest of the page is written by hand.

The models run interleaved (each repeat times the original, the converted model and the A/A control, a
second copy of the original, each repeat starting at the next of them), min over ``--repeats`` runs; each row prints MET where the
converted model is at least as fast (ratio >= 1.0) and NOT MET otherwise, with the measured reason: "within the
run's noise" where the ratio is no further below 1 than two copies of one model fall apart in this run
(``noise_band``: the 95th percentile of the run's A/A gaps |log A/A| in that mode, over every family; ``status_of``),
else the work counted per call, converted against original, with the entries counted most above the original
(``counted_reason``). Why the run's A/A gaps and not the row's own: one A/A ratio is one draw of the noise, and a
converted model exactly as fast as its original falls below its own row's A/A gap a quarter of the time (both
ratios drawn alike: half the time further from 1, half of that below it), so that criterion flags a quarter of
the rows of a perfect conversion; against the 95th percentile of the run's gaps a row of equal speed is flagged
2.5% of the time. The load average (``os.getloadavg``) is printed beside the
figures: the machine may be shared. A family whose tiny model transformers cannot build
here, or that seqmix refuses, is listed with the reason.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import sys
import time
from pathlib import Path

import torch

from _common import ROOT, base_parser, machine_info, print_table, setup, write_doc_section, write_json

D, LAYERS, VOCAB = 256, 4, 256
MARKER = "bench/interop.py:results"
DOCS = ROOT / "docs" / "interop.md"


H, KV, HD = 4, 2, 64  # attention heads, key-value heads, head width (d = H·HD)
MOE = dict(num_experts_per_tok=2)
#: the attention-only families: GQA 4/2 heads of 64, an MLP of 4·d
ATT = dict(intermediate_size=4 * D, num_attention_heads=H, num_key_value_heads=KV)
#: Mamba-2 layers of the hybrids: 8 heads of 64 over the inner width 2·d, one group, N = 64
HYB = dict(mamba_n_heads=8, mamba_n_groups=1, mamba_d_state=64, mamba_chunk_size=64)

#: model_type -> (transformers config class, causal-LM class, the config's fields at d = 256, 4 layers): one tiny
#: representative per family of seqmix.interop.FAMILIES; every layer kind of the family present (hybrids alternate)
CONFIGS: dict[str, tuple[str, str, dict]] = {
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(state_size=16)),
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", dict(state_size=16)),
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(state_size=64, num_heads=8, head_dim=64, n_groups=1, chunk_size=64)),
    "rwkv": ("RwkvConfig", "RwkvForCausalLM", dict(context_length=1024)),
    "xlstm": ("xLSTMConfig", "xLSTMForCausalLM", dict(num_heads=4, chunk_size=64)),
    "recurrent_gemma": ("RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", dict(
        lru_width=D, num_attention_heads=H, num_key_value_heads=1, head_dim=HD, attention_window_size=128, intermediate_size=3 * D)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=4 * D, num_attention_heads=H, num_key_value_heads=KV)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, head_dim=HD, moe_intermediate_size=D,
        shared_expert_intermediate_size=D, num_experts=4, **MOE, linear_key_head_dim=HD, linear_value_head_dim=HD,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "full_attention"] * 2)),
    "kimi_linear": ("KimiLinearConfig", "KimiLinearForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=64, q_lora_rank=None,
        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=HD, moe_intermediate_size=D, num_local_experts=4, **MOE,
        linear_head_dim=HD, linear_num_heads=H, layer_types=["linear_attention", "full_attention"] * 2)),
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, head_dim=HD, num_local_experts=4, **MOE,
        block_size=64, layer_types=["linear_attention", "full_attention"] * 2)),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, conv_L_cache=3, layer_types=["conv", "full_attention"] * 2)),
    "bamba": ("BambaConfig", "BambaForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, **HYB, attn_layer_indices=[1, 3])),
    "granitemoehybrid": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, **HYB, layer_types=["mamba", "attention"] * 2,
        num_local_experts=4, **MOE, shared_intermediate_size=D)),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, layers_block_type=["mamba", "attention", "mamba", "mlp"],
        mamba_num_heads=8, mamba_head_dim=64, n_groups=1, ssm_state_size=64, chunk_size=64)),
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, mamba_d_ssm=2 * D, **HYB)),
    "jamba": ("JambaConfig", "JambaForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=KV, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=4, **MOE, mamba_d_state=16, mamba_dt_rank=16)),
    "zamba2": ("Zamba2Config", "Zamba2ForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=H, layers_block_type=["mamba", "hybrid"] * 2,
        mamba_d_state=64, n_mamba_heads=8, mamba_ngroups=1, chunk_size=64)),
    # the transformers (tests/test_interop_transformers.py): every attention layer -> softmax_attention
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(ATT, use_sliding_window=True, sliding_window=128, max_window_layers=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(ATT, head_dim=HD)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(ATT, head_dim=HD, num_experts=4, **MOE, moe_intermediate_size=D)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(ATT, sliding_window=128)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(ATT, sliding_window=128, num_local_experts=4, **MOE)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(ATT, head_dim=HD)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(ATT, head_dim=HD, sliding_window=128, attn_implementation="eager")),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(ATT, head_dim=HD, sliding_window=128)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(ATT)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(ATT)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(intermediate_size=4 * D, num_attention_heads=H)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(ATT)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(ATT)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(ATT, attention_multiplier=HD ** -0.5)),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(ATT, head_dim=HD, sliding_window=128, num_local_experts=4, **MOE,
                                                            attn_implementation="eager")),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(num_attention_heads=H, n_positions=2048, attn_pdrop=0.0, resid_pdrop=0.0,
                                                   embd_pdrop=0.0)),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(num_attention_heads=H, attn_implementation="eager")),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        intermediate_size=2 * D, num_attention_heads=H, num_key_value_heads=H, kv_lora_rank=64, q_lora_rank=128,
        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=HD, n_routed_experts=4, **MOE, moe_intermediate_size=D,
        first_k_dense_replace=1, n_group=1, topk_group=1)),
}


#: the target of every row: the converted model at least as fast as the original
TARGET = 1.0
def build(family: str):
    """The random transformers model of ``family`` (d = 256, 4 layers, vocab 256; nothing downloaded)."""
    import transformers as tf

    cfg_cls, model_cls, extra = CONFIGS[family]
    common = dict(vocab_size=VOCAB, hidden_size=D, num_hidden_layers=LAYERS, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return getattr(tf, model_cls)(getattr(tf, cfg_cls)(**{**common, **extra}))


def _step_clock():
    """A StoppingCriteria that stops nothing and records the time after each generated token."""
    from transformers import StoppingCriteria

    class StepClock(StoppingCriteria):
        def __init__(self):
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StepClock()


def measure(models: dict, T: int, steps: int, repeats: int) -> dict:
    """forward, prefill and decode tokens/s of each of ``models`` (name -> model: the original, the
    converted model and, as the A/A control, a copy of the original), interleaved: every repeat times each
    model in turn for each of forward, prefill and generate, so that a change in the machine's load hits all
    alike, each repeat starting at the next model (so that no model always runs after the same one). Forward and
    prefill: the min over ``repeats`` (after a warm-up call each). Decode: ``generate``
    records the time after every token (a stopping criterion that stops nothing); decoding step i (i >= 1:
    the first token comes from the prefill) takes the min over the repeats of its interval, and the decode
    rate is (steps - 1) / the sum of those minima. Returns name -> {forward_tok_s, prefill_tok_s, decode_tok_s}."""
    from transformers import StoppingCriteriaList

    ids = torch.randint(2, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
    best = {(who, k): float("inf") for who in models for k in ("forward", "prefill")}
    step_min = {who: [float("inf")] * (steps - 1) for who in models}
    names = list(models)
    with torch.no_grad():
        for rep in range(repeats + 1):  # the first round warms up
            # each repeat starts at the next model (original, converted, A/A; then converted, A/A, original; ...): a
            # model's place in the loop (what ran just before it) biases none of them over the repeats
            order = names[rep % len(names):] + names[:rep % len(names)]
            for k, kw in (("forward", dict(use_cache=False)), ("prefill", dict(use_cache=True))):
                for who in order:
                    m = models[who]
                    t0 = time.perf_counter()
                    m(input_ids=ids, **kw)
                    if rep:
                        best[who, k] = min(best[who, k], time.perf_counter() - t0)
            for who in order:
                m = models[who]
                clock = _step_clock()
                m.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0,
                           stopping_criteria=StoppingCriteriaList([clock]))
                if rep:
                    for i, (a, b) in enumerate(zip(clock.times, clock.times[1:])):
                        step_min[who][i] = min(step_min[who][i], b - a)
    out = {}
    for who in models:
        dec = sum(step_min[who])
        out[who] = {"forward_tok_s": T / best[who, "forward"], "prefill_tok_s": T / best[who, "prefill"],
                    "decode_tok_s": (steps - 1) / dec if steps > 1 else None}
    return out


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to the null device for the block (the C++ profiler's log lines)."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


def call_counts(model, T: int, *, detail: bool = False) -> dict:
    """What one call costs the interpreter, counted (deterministic, unlike a time on a shared machine): aten
    ops (torch.profiler) and Python function calls (cProfile) of one forward on T tokens ("forward", and
    "prefill" with the cache) and of one decoding step ("decode": generate of 7 tokens minus generate of 2,
    over 5). Returns mode -> (aten ops, Python calls); with ``detail``, mode -> (aten ops, Python calls, {op:
    count}, {function: count}) (functions as file:name, per call or step)."""
    import cProfile
    import collections
    import pstats

    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(2, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))

    def count(fn):
        fn()  # warm
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as p:  # (the profiler logs each start to fd 2)
            fn()
        pr = cProfile.Profile()
        pr.enable()
        fn()
        pr.disable()
        ops = collections.Counter({e.key: e.count for e in p.key_averages()})
        st = pstats.Stats(pr)
        calls = collections.Counter()
        for (file, _, name), v in st.stats.items():
            calls[f"{os.path.basename(file)}:{name}" if file != "~" else _builtin_name(name)] += v[1]
        return sum(ops.values()), st.total_calls, ops, calls

    def gen(n):
        return lambda: model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

    with torch.no_grad():
        out = {"forward": count(lambda: model(input_ids=ids, use_cache=False)),
               "prefill": count(lambda: model(input_ids=ids, use_cache=True))}
        # (steps 2 to 6: the first step, in both, moves a prefill's keys and values into buffers with room once)
        seven, two = count(gen(7)), count(gen(2))
    per = [{k: (seven[i][k] - two[i].get(k, 0)) / 5 for k in seven[i]} for i in (2, 3)]
    out["decode"] = (round((seven[0] - two[0]) / 5), round((seven[1] - two[1]) / 5), *per)
    return out if detail else {mode: c[:2] for mode, c in out.items()}


def _builtin_name(name: str) -> str:
    """cProfile's name of a built-in ("<built-in method builtins.len>", "<method 'view' of 'torch._C.TensorBase'
    objects>") as code writes it ("len", "Tensor.view")."""
    m = re.fullmatch(r"<built-in method (?:builtins\.)?(.+)>", name)
    if m:
        return m.group(1)
    m = re.fullmatch(r"<method '(.+)' of '(?:.*\.)?(\w+)' objects>", name)
    if m:
        return f"{m.group(2).replace('TensorBase', 'Tensor')}.{m.group(1)}"
    return name


def excess(orig: dict, conv: dict, k: int = 4) -> str:
    """The ``k`` entries (aten ops or Python functions) the converted model counts most above the original
    (:func:`call_counts` with ``detail``), as "name +n" (n per call or step)."""
    more = sorted(((conv.get(key, 0) - orig.get(key, 0), key) for key in conv), reverse=True)
    return ", ".join(f"{key} +{n:.3g}" for n, key in more[:k] if n > 0) or "none"


def counted_reason(mode: str, orig: tuple, conv: tuple, known: str = "") -> str:
    """The measured reason of a NOT MET row outside the A/A noise: the counts of :func:`call_counts` side
    by side (with ``detail`` counts: the entries counted most above the original), then ``known``."""
    unit = "decoding step" if mode == "decode" else f"{mode} call"
    text = (f"per {unit}: {conv[0]} aten ops (original {orig[0]}), {conv[1]} Python calls (original {orig[1]})")
    if len(orig) > 2 and len(conv) > 2:
        text += f"; most above the original: {excess(orig[2], conv[2])}; {excess(orig[3], conv[3])}"
    return f"{text}; {known}" if known else text


#: the quantile of the run's A/A gaps that bounds its noise (:func:`noise_band`)
NOISE_QUANTILE = 0.95


def noise_band(aa_ratios) -> float | None:
    """The run's noise in one mode, as the lowest ratio two copies of one model reach in it: exp(−g) with g the
    ``NOISE_QUANTILE`` quantile of the gaps |log A/A| of the run's A/A controls in that mode (the ceil(q·n)-th
    smallest of n; the largest where n < 20). None without a control. A converted model exactly as fast as its
    original falls below it (1 − q)/2 of the time."""
    gaps = sorted(abs(math.log(a)) for a in aa_ratios if a)
    if not gaps:
        return None
    return math.exp(-gaps[max(0, math.ceil(NOISE_QUANTILE * len(gaps)) - 1)])


def status_of(ratio: float | None, band: float | None, reason: str) -> tuple[str, str]:
    """(status, reason) of a row: MET where ratio >= TARGET; NOT MET otherwise, with the measured reason:
    the run's noise where ratio >= ``band`` (:func:`noise_band` of the row's mode: the run cannot tell the
    two models apart), else ``reason`` (the counted work: :func:`counted_reason`)."""
    if ratio is None:
        return "not measured", ""
    if ratio >= TARGET:
        return "MET", ""
    if band is not None and ratio >= band:
        noise = (f"within this run's noise: two copies of one model differ by up to {1 / band:.3f}x in this mode "
                 f"(the {NOISE_QUANTILE:.0%} quantile of the run's A/A gaps)")
        return "NOT MET", f"{noise}; {reason}" if reason else noise
    return "NOT MET", reason


def report_table(fams: list[str], *, T: int) -> None:
    """One Markdown table across the families (docs/interop.md): for each family's representative model
    (CONFIGS, random weights) the rows of ``seqmix.analysis.model_maps.layer_report`` on T random token ids,
    one row per (transformers class, seqmix mixer): its layers, state, Λ structure, norms, gates, decay range
    (over those layers) and 90% mass lag (their mean)."""
    from seqmix.analysis.model_maps import layer_report
    from seqmix.interop import from_transformers

    ids = torch.randint(2, VOCAB, (T,), generator=torch.Generator().manual_seed(0))
    print(f"| family | transformers class | seqmix mixer | layers | state floats / layer (T = {T}) | +floats / token | Λ structure "
          "| normalization | gating | decay range | 90% mass lag |")
    print("|" + "---|" * 11)
    for fam in fams:
        if fam not in CONFIGS:
            print(f"| {fam} | (no model in bench/interop.py's CONFIGS) |" + " |" * 9)
            continue
        torch.manual_seed(0)
        try:
            conv = from_transformers(build(fam).eval(), inplace=True)
            with torch.no_grad():
                rows = layer_report(conv, ids)
        except Exception as e:  # noqa: BLE001  (reported in the table)
            print(f"| {fam} | not run: {type(e).__name__}: {str(e).splitlines()[0][:120]} |" + " |" * 9)
            continue
        groups: dict = {}
        for r in rows:
            groups.setdefault((r["family"], r["mixer"]), []).append(r)
        for (cls, mixer), rs in groups.items():
            r0 = rs[0]
            if r0["state"] is None:
                print(f"| {fam} | {cls} | {mixer} | {len(rs)} | — | — | — | — | — | — | — |")
                continue
            dec = [r["decay"] for r in rs if r["decay"] is not None]
            decay = f"{min(d[0] for d in dec):.2g} – {max(d[1] for d in dec):.3g}" if dec else "none"
            lag = sum(r["lag"] for r in rs) / len(rs)
            print(f"| {fam} | {cls} | {mixer} | {len(rs)} | {r0['state']:,} | {r0['per_token']:,} | {r0['lambda']} | {r0['norm']} "
                  f"| {r0['gate']} | {decay} | {lag:.1f} |", flush=True)
        del conv


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--families", default=None, help="comma-separated families (default: every one seqmix converts)")
    p.add_argument("--decode-tokens", type=int, default=None, help="decoding steps (default 64; 8 with --quick)")
    p.add_argument("--seq-len", type=int, default=None, help="T of forward and prefill (default 512; 64 with --quick)")
    p.add_argument("--no-control", action="store_true", help="skip the A/A control (a copy of the original timed beside "
                   "the two models: the run's noise; a third of the time)")
    p.add_argument("--report-table", action="store_true", help="print the layer report of every family's model as one "
                   "Markdown table (docs/interop.md) instead of timing")
    p.add_argument("--write-docs", action="store_true", help="write the results section of --docs (between its markers)")
    p.add_argument("--docs", type=Path, default=DOCS, help="the page of the results section (default docs/interop.md)")
    p.add_argument("--keep-freed-memory", action="store_true", help="run in a process started with "
                   "seqmix.runtime.keep_freed_memory_env() (glibc keeps freed memory: no page faults of a block mapped "
                   "afresh, which otherwise fall on one model or the other by chance; docs/performance.md, the allocator)")
    args = p.parse_args()
    if args.keep_freed_memory:
        _restart_keeping_freed_memory()
    info = setup(args)
    from transformers.utils import logging as hf_logging

    from seqmix.interop import from_transformers, supported_families

    hf_logging.set_verbosity_error()
    T = args.seq_len or (64 if args.quick else 512)
    steps = args.decode_tokens or (8 if args.quick else 64)
    repeats = 1 if args.quick else args.repeats
    fams = args.families.split(",") if args.families else list(supported_families())
    if args.report_table:
        return report_table(fams, T=args.seq_len or 64)
    load_before = os.getloadavg()
    rows, count_rows, results, details = [], [], {}, {}
    for fam in fams:
        if fam not in CONFIGS:
            results[fam] = {"skipped": "no benchmark model for this family in bench/interop.py's CONFIGS"}
            continue
        try:
            torch.manual_seed(0)
            orig = build(fam).eval()
            t0 = time.perf_counter()
            conv = from_transformers(orig)
            conv_s = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001  (a family transformers or seqmix cannot run here: reported)
            results[fam] = {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            continue
        models = {"original": orig, "converted": conv}
        if not args.no_control:
            models["control"] = copy.deepcopy(orig)  # the A/A control: a second copy of the original
        r = measure(models, T, steps, repeats)
        r_o, r_c, r_a = r["original"], r["converted"], r.get("control")
        counts = {who: call_counts(m, T, detail=True) for who, m in (("original", orig), ("converted", conv))}
        results[fam] = {"convert_s": conv_s, "original": r_o, "converted": r_c, "control": r_a,
                        "counts": {who: {mode: c[:2] for mode, c in cs.items()} for who, cs in counts.items()}}
        details[fam] = counts
        for k, name in (("forward_tok_s", "forward"), ("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")):
            ratio = r_c[k] / r_o[k] if r_c[k] and r_o[k] else None
            aa = r_a[k] / r_o[k] if r_a and r_a[k] and r_o[k] else None
            results[fam][f"{name}_ratio"], results[fam][f"{name}_aa"] = ratio, aa
            rows.append([fam, name, r_o[k], r_c[k], ratio, aa, None, "", conv_s if name == "forward" else None])
        co, cc = counts["original"]["decode"], counts["converted"]["decode"]
        ok = cc[0] <= co[0] and cc[1] <= co[1]
        count_rows.append([fam, cc[0], co[0], cc[1], co[1], "MET" if ok else "NOT MET",
                           "" if ok else f"most above the original: {excess(co[2], cc[2])}; {excess(co[3], cc[3])}"])
        results[fam]["decode_counts_status"], results[fam]["decode_counts_reason"] = count_rows[-1][5], count_rows[-1][6]
        print(f"  {fam}: done (load average now {os.getloadavg()[0]:.2f})", flush=True)
    bands = {mode: noise_band([r[5] for r in rows if r[1] == mode]) for mode in ("forward", "prefill", "decode")}
    for row in rows:  # the statuses, against the run's noise in the row's mode
        fam, name, ratio = row[0], row[1], row[4]
        status, reason = status_of(ratio, bands[name], "")
        if status == "NOT MET" and not reason:
            reason = counted_reason(name, details[fam]["original"][name], details[fam]["converted"][name])
        row[6], row[7] = status, reason
        results[fam][f"{name}_status"], results[fam][f"{name}_reason"] = status, reason
    load_after = os.getloadavg()
    setting = (f"d = {D}, {LAYERS} layers, vocab {VOCAB}, batch 1, float32, T = {T} (forward, prefill), {steps} decode steps, "
               f"min of {repeats}; torch threads {torch.get_num_threads()} on {os.cpu_count()} cores; "
               + ("glibc keeping freed memory (`GLIBC_TUNABLES` of `seqmix.runtime.keep_freed_memory_env()`)"
                  if args.keep_freed_memory else "the C library's default allocator settings"))
    loads = (f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
             f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} (the machine is shared: figures under load)")
    print(f"\n{setting}\n{loads}")
    print_table(f"converted (seqmix mixers) vs original (transformers), CPU tokens/s; target: ratio >= {TARGET}",
                ["family", "mode", "original tok/s", "converted tok/s", "ratio conv/orig", "A/A copy/orig", "status",
                 "reason (measured)", "convert (s)"], rows)
    n_met = sum(r[6] == "MET" for r in rows)
    n_noise = sum(r[6] == "NOT MET" and r[7].startswith("within this run's noise") for r in rows)
    band_text = ", ".join(f"{mode} {b:.3f}x" for mode, b in bands.items() if b is not None) or "no A/A control"
    summary = (f"{n_met} of {len(rows)} rows MET (converted >= {TARGET}x the original); {n_noise} NOT MET within the run's "
               f"A/A noise (at or above the lowest ratio two copies of one model reach in the mode: {band_text}, the "
               f"{NOISE_QUANTILE:.0%} quantile of the run's A/A gaps); {len(rows) - n_met - n_noise} NOT MET "
               "beyond it")
    print(f"  {summary}")
    print_table("counted work per decoding step (call_counts: aten ops by torch.profiler, Python calls by cProfile); "
                "target: converted <= original", ["family", "aten ops conv", "aten ops orig", "Python calls conv",
                                                   "Python calls orig", "status", "reason (measured)"], count_rows)
    n_counts = sum(r[5] == "MET" for r in count_rows)
    print(f"  {n_counts} of {len(count_rows)} families MET (aten ops and Python calls per decoding step <= the original's)")
    skipped = [f"{fam}: not measured: {r['skipped']}" for fam, r in results.items() if "skipped" in r]
    for line in skipped:
        print(f"  {line}")
    from seqmix.runtime import freed_memory_is_kept

    write_json(args, "interop", {"machine": info, "freed_memory_kept": freed_memory_is_kept(), "T": T, "decode_tokens": steps, "d_model": D, "layers": LAYERS,
                                 "vocab": VOCAB, "noise_bands": bands, "noise_quantile": NOISE_QUANTILE, "load_before": load_before, "load_after": load_after, "results": results})
    if args.write_docs:
        write_doc_section(args.docs, MARKER, docs_section(args, setting, loads, rows, summary, count_rows, n_counts, skipped))


def _restart_keeping_freed_memory() -> None:
    """--keep-freed-memory: this process started anew (the same arguments) with the allocator settings of
    ``keep_freed_memory_env()`` where it did not start with them (glibc reads them at start only); nothing where the
    C library is not glibc (said on stderr)."""
    from seqmix.runtime import freed_memory_is_kept, glibc_malloc, keep_freed_memory_env

    if not glibc_malloc():
        print("--keep-freed-memory: the C library is not glibc; running with its defaults", file=sys.stderr)
        return
    if not freed_memory_is_kept():
        env = {**os.environ, **keep_freed_memory_env()}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def _rate(v) -> str:
    return "—" if v is None else f"{v:,.0f}" if v >= 1000 else f"{v:.1f}"


def docs_section(args, setting: str, loads: str, rows: list, summary: str, count_rows: list, n_counts: int,
                 skipped: list) -> str:
    """The results section of docs/interop.md: the command, the setting and load, one row per family (forward,
    prefill, decode: original -> converted tokens/s, the ratio, the A/A ratio, the status), the counted work per
    decoding step, and the measured reason of every row NOT MET beyond the noise."""
    cmd = " ".join(a for a in ("python bench/interop.py", f"--repeats {args.repeats}" if args.repeats != 3 else "",
                               f"--threads {args.threads}" if args.threads else "", "--quick" if args.quick else "",
                               f"--families {args.families}" if args.families else "",
                               "--keep-freed-memory" if args.keep_freed_memory else "", "--write-docs") if a)
    out = [f"`{cmd}` ({time.strftime('%Y-%m-%d')}): {setting}; {loads}. Each cell: original → converted tokens/s (the "
           "ratio, the A/A control's ratio: a second copy of the original timed in the same loop; the status: MET, "
           "\"noise\" where NOT MET but no further below 1 than two copies of one model fall apart in this run — the "
           f"{NOISE_QUANTILE:.0%} quantile of the run's A/A gaps in that mode, over every family —, **NOT MET** beyond it).", "",
           "| family | convert (s) | forward tok/s orig → conv | prefill tok/s orig → conv | decode tok/s orig → conv |",
           "|---|---|---|---|---|"]
    by_fam: dict = {}
    for fam, mode, o, c, ratio, aa, status, reason, conv_s in rows:
        by_fam.setdefault(fam, {"convert": conv_s})[mode] = (o, c, ratio, aa, status, reason)
    notes = []
    for fam, m in by_fam.items():
        cells = []
        for mode in ("forward", "prefill", "decode"):
            o, c, ratio, aa, status, reason = m[mode]
            tag = "MET" if status == "MET" else "noise" if reason.startswith("within this run's noise") else "**NOT MET**"
            cells.append(f"{_rate(o)} → {_rate(c)} ({ratio:.2f}×, A/A {aa:.2f}; {tag})" if ratio is not None and aa is not None
                         else f"{_rate(o)} → {_rate(c)} ({ratio:.2f}×; {tag})" if ratio is not None else "—")
            if tag == "**NOT MET**":
                notes.append(f"* {fam} {mode}: {reason}")
        out.append(f"| {fam} | {m['convert']:.2f} | " + " | ".join(cells) + " |")
    out += ["", f"**{summary}.**", ""]
    if notes:
        out += ["The rows NOT MET beyond the noise, with the work counted per call (converted against original) and the "
                "entries counted most above the original:", ""] + notes + [""]
    out += ["Counted work per decoding step (`call_counts`: aten ops by torch.profiler and Python calls by cProfile, "
            "generate of 7 tokens minus generate of 2, over 5: steps 2 to 6; counts, so the load does not move them): "
            f"**{n_counts} of {len(count_rows)} families at or below the original on both.**", "",
            "| family | aten ops conv / orig | Python calls conv / orig | status |", "|---|---|---|---|"]
    for fam, oc, oo, pc, po, status, reason in count_rows:
        out.append(f"| {fam} | {oc} / {oo} | {pc} / {po} | {status}{': ' + reason if reason else ''} |")
    if skipped:
        out += [""] + [f"* {line}" for line in skipped]
    return "\n".join(out)


if __name__ == "__main__":
    main()
