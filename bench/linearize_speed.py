"""The linearized students against their teacher: prefill time, time per new token and decoding-state bytes
of a transformers Llama and of each of its linearized copies, at prompts of 256 to 16k tokens, on CPU.

    python bench/linearize_speed.py --out runs/lin_speed                      # 512x8 and 1024x16, P 256 .. 16k
    python bench/linearize_speed.py --out runs/lin_speed --sizes 512x8 --prompts 256,8192
    python bench/linearize_speed.py --out runs/lin_speed --table --write-docs  # the stored results only
    python bench/linearize_speed.py --quick --out /tmp/ls                      # a smoke run (seconds)
    python bench/linearize_speed.py --out runs/lsg --sizes 512x8 --prompts 256 --general-step  # fused steps on / off

The teacher is a random-init ``LlamaForCausalLM`` (bench/linearize_teacher.py's architecture: GQA 8/4 heads,
SwiGLU of 3·d, tied embeddings, vocabulary 256, SDPA attention; speed does not depend on the weights) of d
× layers for each ``--sizes`` entry (default 512x8 and 1024x16). The models: the teacher; each pure student of
bench/linearize.py's ``STUDENTS`` (``seqmix.linearize.linearize(teacher, mixer, layers="all", **config)``: every
attention layer a student in interop's adapter); the one-softmax hybrid ``--hybrid`` (its student in every
layer but ``--kept``, which keeps the teacher's attention). The students share the teacher's embeddings, MLPs
and norms (the same tensors: the memory of one model plus the attention-layer weights of each).

For each prompt length P of ``--prompts``, the models run interleaved (each repeat runs every model in turn,
so that a change in the machine's load hits them alike): greedy ``generate`` of ``--new-tokens`` tokens after
a P-token prompt (batch 1), timing the call's start and every token (a stopping criterion that stops
nothing). Prefill: the time to the first token, min over the repeats. Time per new token: each decoding
interval's min over the repeats, their mean. Cache bytes: the storage of every tensor in the decoding state
after the call (transformers' keys and values; a student's seqmix state; each storage once). Ratios against
the teacher of the same run: tokens/s student / teacher (= the teacher's time per token / the student's) and
prefill teacher / student.

Targets for every pure student, on the 2-core CPU: tokens/s >= 0.9x the teacher's at P 256, >= 3x at
8k, >= 5x at 16k; prefill >= 2x at 8k; cache bytes constant in P. Each prints MET or NOT MET with the measured
reason: the bytes of weights each decoding step reads (every parameter once) and the counted work per step
(aten ops by torch.profiler, Python calls by cProfile: bench/interop.py's ``call_counts``), teacher against
student; at long prompts the teacher's cache bytes (its step reads them all).

Resumable: each (size, P) group is stored in OUT/<d>x<layers>_P<P>.json with every model's measurement per
repeat as it finishes; a re-run skips what is stored. ``--table`` prints the stored results; ``--write-docs``
writes the results section of docs/linearize.md (between the markers ``<!-- bench/linearize_speed.py:results
-->`` and ``<!-- /bench/linearize_speed.py:results -->``) and the plot docs/img/linearize_speed.png (time per
token against P, log axes, one panel per size). The load average (``os.getloadavg``) is stored with each
measurement and printed beside the figures.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import time
from pathlib import Path

import torch

from _common import ROOT, machine_info, print_table, write_doc_section

MARKER = "bench/linearize_speed.py:results"
DOCS, PLOT = ROOT / "docs" / "linearize.md", ROOT / "docs" / "img" / "linearize_speed.png"
HEADS, KV_HEADS, VOCAB = 8, 4, 256


def _default_group_kv() -> bool:
    from seqmix.linearize.recipes import DEFAULT_RECIPE, RECIPES

    return RECIPES[DEFAULT_RECIPE].settings["group_kv"]


#: the students keep the teacher's kv heads as the default recipe does (read from the recipe: one place)
GROUP_KV = _default_group_kv()
#: the prompt of the counted work: longer than every student's window (64 tokens), so the counted step is the one
#: that a long prompt runs (a window not yet full takes the general path)
COUNT_PROMPT = 128
#: (P, what) -> the target on a pure student's ratio to the teacher
DECODE_TARGETS = {256: 0.9, 8192: 3.0, 16384: 5.0}
PREFILL_TARGETS = {8192: 2.0}
QUICK = dict(sizes="64x2", prompts="32,64", new_tokens=4, repeats=1)


def _students() -> dict:
    """bench/linearize.py's students: label -> (mixer, config)."""
    from linearize import STUDENTS

    return dict(STUDENTS)


def recipe_students() -> dict:
    """``recipe:<name>`` -> (mixer, config, layers) of each recipe of ``seqmix.linearize.RECIPES`` whose model
    is not already one of the students (the same mixer, config and ``layers="all"``): its speed is its model's."""
    from seqmix.linearize.recipes import RECIPES

    have = {(m, json.dumps(c, sort_keys=True)) for m, c in _students().values()}
    out = {}
    for name, r in RECIPES.items():
        s = r.settings
        mixer, cfg, layers = s["mixer"], dict(s.get("mixer_config") or {}), s.get("layers", "all")
        if layers == "all" and s["group_kv"] == GROUP_KV and (mixer, json.dumps(cfg, sort_keys=True)) in have:
            continue
        out[f"recipe:{name}"] = (mixer, cfg, layers, s["group_kv"])
    return out


def teacher(d: int, layers: int, max_len: int, seed: int = 0):
    from linearize_teacher import teacher_config
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = teacher_config(d, layers, HEADS, KV_HEADS, vocab=VOCAB, max_len=max_len)
    return LlamaForCausalLM(cfg).eval()


def _sharing_copy(model):
    """A copy of ``model`` whose parameters and buffers are the original's tensors (nothing copied but the modules)."""
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def models_for(d: int, layers: int, max_len: int, hybrid: str, kept: int, compiled: bool = False, general: bool = False) -> dict:
    """name -> model: the teacher, each pure student, the hybrid (``hybrid:<mixer label>``), each recipe's model
    that is not one of those (``recipe:<name>``: :func:`recipe_students`); with ``compiled``,
    also each pure student with its decoding step compiled (``<label> compiled``: a copy sharing its weights,
    ``seqmix.compile_decode`` applied when it first runs: :func:`ensure_compiled`); with ``general``, each student and
    recipe model whose mixer has a fused decoding step (the general form's, the delta rule's, RWKV-7's) also with it off
    (``<label> general step``: a copy sharing its weights whose steps take the general path: :func:`general_step_copy`)."""
    from seqmix.linearize import linearize

    t = teacher(d, layers, max_len)
    out = {"teacher": t}
    students = _students()
    for label, (mixer, cfg) in students.items():
        torch.manual_seed(1)
        out[label] = linearize(_sharing_copy(t), mixer=mixer, layers="all", inplace=True, group_kv=GROUP_KV, **cfg).eval()
    if hybrid:
        mixer, cfg = students[hybrid]
        torch.manual_seed(1)
        rest = [i for i in range(layers) if i != kept]
        out[f"hybrid:{hybrid}"] = linearize(_sharing_copy(t), mixer=mixer, layers=rest, inplace=True, group_kv=GROUP_KV,
                                            **cfg).eval()
    for label, (mixer, cfg, layers, group_kv) in recipe_students().items():  # pure or partial, as the recipe runs it
        torch.manual_seed(1)
        out[label] = linearize(_sharing_copy(t), mixer=mixer, layers=layers, inplace=True, group_kv=group_kv, **cfg).eval()
    if compiled:
        for label in students:
            out[f"{label} compiled"] = _sharing_copy(out[label])
    if general:
        for label in [*students, *(r for r in out if r.startswith("recipe:"))]:
            copy_ = general_step_copy(out[label])
            if copy_ is not None:
                out[f"{label} general step"] = copy_
    return out


#: the suffixes of the variants of a pure student (``--compile``, ``--general-step``)
VARIANTS = (" compiled", " general step")


def general_step_copy(model):
    """A copy of ``model`` sharing its weights whose mixers' decoding steps take the general path (their ``_step_fusable``
    flag off: the fused step's A/B), or None where no mixer of it has a fused step."""
    copy_ = _sharing_copy(model)
    fused = [m for m in copy_.modules() if m.__dict__.get("_step_fusable")]
    for m in fused:
        m.__dict__["_step_fusable"] = False
    return copy_ if fused else None


def recipe_label(name: str) -> str:
    """The model of ``seqmix.linearize.RECIPES[name]`` among this bench's: ``recipe:<name>``, or the student of
    bench/linearize.py's ``STUDENTS`` that it is (the same mixer and config in every layer)."""
    own = recipe_students()
    if f"recipe:{name}" in own:
        return f"recipe:{name}"
    from seqmix.linearize.recipes import RECIPES

    s = RECIPES[name].settings
    want = (s["mixer"], json.dumps(dict(s.get("mixer_config") or {}), sort_keys=True))
    return next(label for label, (m, c) in _students().items() if (m, json.dumps(c, sort_keys=True)) == want)


def is_pure(name: str) -> bool:
    """A model with no softmax attention layer left: not the teacher, a hybrid or a recipe that keeps some."""
    if name == "teacher" or name.startswith("hybrid:"):
        return False
    return not name.startswith("recipe:") or recipe_students().get(name, (None, None, "all"))[2] == "all"


def ensure_compiled(name: str, model, costs: dict) -> None:
    """``seqmix.compile_decode`` on a ``<label> compiled`` model the first time it runs (its first call, which
    compiles every layer's decoding step, timed into ``costs[name]``)."""
    from seqmix.interop import InteropMixer

    if not name.endswith(" compiled") or any(isinstance(m, InteropMixer) and m.__dict__.get("_step_fn") for m in model.modules()):
        return
    import seqmix

    info = seqmix.compile_decode(model, prompt=torch.randint(2, VOCAB, (1, 16), generator=torch.Generator().manual_seed(0)))
    costs[name] = info["first_call_s"]
    print(f"    {name}: compile_decode's first call (compiling {info['compiled']} layers) took {info['first_call_s']:.1f} s",
          flush=True)


def _tensors(obj, seen: set, depth: int = 0):
    """Every tensor reachable from a decoding state (a cache object's layers, dicts, lists, seqmix KV caches)."""
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        for v in vars(obj).values():
            yield from _tensors(v, seen, depth + 1)


def cache_bytes(cache) -> int:
    """Bytes of the storages of every tensor in ``cache`` (each storage once: a stride-0 view counts its base)."""
    storages = {}
    for t in _tensors(cache, set()):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def weight_bytes(model) -> int:
    """Bytes of the parameters a forward pass reads (each tensor once: tied embeddings count once)."""
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())


def run_once(model, P: int, new: int) -> dict:
    """One greedy generate of ``new`` tokens after a P-token prompt: prefill seconds (to the first token),
    the decoding intervals (seconds), the cache bytes after it, the load average."""
    from interop import _step_clock
    from transformers import StoppingCriteriaList

    from seqmix.hf.modeling import output_cache

    ids = torch.randint(2, VOCAB, (1, P), generator=torch.Generator().manual_seed(P))
    clock = _step_clock()
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]), return_dict_in_generate=True)
    steps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return {"prefill_s": clock.times[0] - t0, "steps_s": steps, "cache_bytes": cache_bytes(output_cache(out)),
            "load": os.getloadavg()[0], "threads": torch.get_num_threads()}


def measure_group(path: Path, models: dict, P: int, new: int, repeats: int, compile_costs: dict) -> dict:
    """Every model of ``models`` at prompt P, interleaved over ``repeats`` (after one warm-up run each at a short
    prompt), each measurement stored in ``path`` as it finishes; a stored one is not run again."""
    data = json.loads(path.read_text()) if path.exists() else {"P": P, "new_tokens": new, "runs": {}}
    runs = data["runs"]
    todo = [(r, name) for r in range(repeats) for name in models if len(runs.get(name, [])) <= r]
    if not todo:
        return data
    for name, m in models.items():  # warm-up: first-call costs (allocator, lazy tables, compiling) out of the timed runs
        ensure_compiled(name, m, compile_costs)
        run_once(m, min(P, 64), 2)
    for r, name in todo:
        runs.setdefault(name, []).append(run_once(models[name], P, new))
        path.write_text(json.dumps(data, indent=1))
        print(f"    P {P}: {name} repeat {r + 1}/{repeats}: prefill {runs[name][-1]['prefill_s']:.3f} s, "
              f"{1e3 * sum(runs[name][-1]['steps_s']) / max(len(runs[name][-1]['steps_s']), 1):.2f} ms/token "
              f"(load {runs[name][-1]['load']:.2f})", flush=True)
    return data


def summarize(data: dict) -> dict:
    """name -> {prefill_s, ms_per_token, cache_bytes, repeats, load}: the min over the repeats of the prefill and
    of each decoding interval (their mean: the time per token)."""
    out = {}
    for name, runs in data["runs"].items():
        steps = [min(r["steps_s"][i] for r in runs) for i in range(min(len(r["steps_s"]) for r in runs))]
        out[name] = {"prefill_s": min(r["prefill_s"] for r in runs), "ms_per_token": 1e3 * sum(steps) / max(len(steps), 1),
                     "cache_bytes": runs[-1]["cache_bytes"], "repeats": len(runs), "load": max(r["load"] for r in runs),
                     "threads": "/".join(sorted({str(r.get("threads", "?")) for r in runs}))}
    return out


def counted(models: dict) -> dict:
    """name -> {aten ops, Python calls per decoding step (bench/interop.py's call_counts at a COUNT_PROMPT-token prompt),
    weight bytes}."""
    from interop import call_counts

    out = {}
    for name, m in models.items():
        ops, calls = call_counts(m, COUNT_PROMPT)["decode"]
        out[name] = {"aten_ops": ops, "python_calls": calls, "weight_bytes": weight_bytes(m)}
    return out


def _mb(b: float) -> str:
    return f"{b / 2**20:.1f} MB" if b >= 2**20 else f"{b / 2**10:.1f} kB"


def status_rows(size: str, groups: dict, counts: dict | None) -> tuple[list[list], list[str]]:
    """The table rows of one size (every model at every P) and the target lines (MET / NOT MET with the measured
    reason). ``groups``: P -> summarize(...)."""
    rows, lines = [], []
    Ps = sorted(groups)
    for P in Ps:
        g = groups[P]
        t = g.get("teacher")
        for name, r in g.items():
            dec = t["ms_per_token"] / r["ms_per_token"] if t and r["ms_per_token"] else None
            pre = t["prefill_s"] / r["prefill_s"] if t and r["prefill_s"] else None
            rows.append([size, P, name, r["prefill_s"], r["ms_per_token"], 1e3 / r["ms_per_token"] if r["ms_per_token"] else None,
                         dec if name != "teacher" else None, pre if name != "teacher" else None, _mb(r["cache_bytes"]),
                         r["repeats"], r["threads"], r["load"]])
            pure = is_pure(name)
            if not pure or t is None:
                continue
            for kind, targets, ratio in (("tokens/s", DECODE_TARGETS, dec), ("prefill", PREFILL_TARGETS, pre)):
                if P not in targets or ratio is None:
                    continue
                goal = targets[P]
                if ratio >= goal:
                    lines.append(f"{size} P {P} {name}: {kind} {ratio:.2f}x the teacher's (target >= {goal}x): MET")
                    continue
                why = [f"teacher {t['ms_per_token']:.2f} ms/token, student {r['ms_per_token']:.2f}" if kind == "tokens/s"
                       else f"teacher {t['prefill_s']:.2f} s, student {r['prefill_s']:.2f} s"]
                base = groups[Ps[0]]
                if kind == "tokens/s" and P != Ps[0] and "teacher" in base and name in base:
                    # a recurrent step costs the same at every P: the target needs the student's step at the shortest
                    # prompt within (the teacher's growth from there to P) / goal of the teacher's step there
                    grow = t["ms_per_token"] / base["teacher"]["ms_per_token"]
                    why.append(f"the teacher's step grows {grow:.2f}x from P {Ps[0]} to P {P}, so {goal}x needs a student step "
                               f"<= {grow / goal:.2f}x the teacher's at P {Ps[0]}; this student's there: "
                               f"{base[name]['ms_per_token'] / base['teacher']['ms_per_token']:.2f}x")
                if kind == "prefill" and P != Ps[0] and "teacher" in base and name in base:
                    # the work linear in P (embeddings, projections, MLPs) at the teacher's rate at the shortest prompt
                    lin = base["teacher"]["prefill_s"] * P / Ps[0]
                    why.append(f"the teacher's prefill at P {Ps[0]} scaled to P {P} (the work linear in P): {lin:.2f} s, so "
                               f"{goal}x needs the student within {t['prefill_s'] / goal / lin:.2f}x of it; this student: "
                               f"{r['prefill_s'] / lin:.2f}x")
                if kind == "tokens/s" and counts and name in counts:
                    c, ct = counts[name], counts["teacher"]
                    why.append(f"each step reads {_mb(c['weight_bytes'])} of weights (teacher {_mb(ct['weight_bytes'])}, "
                               f"{c['weight_bytes'] / ct['weight_bytes']:.2f}x) and the teacher's cache of {_mb(t['cache_bytes'])}; "
                               f"{c['aten_ops']} aten ops (teacher {ct['aten_ops']}), {c['python_calls']} Python calls "
                               f"(teacher {ct['python_calls']}) per step")
                lines.append(f"{size} P {P} {name}: {kind} {ratio:.2f}x the teacher's (target >= {goal}x): NOT MET; "
                             + "; ".join(why))
    names = sorted({n for g in groups.values() for n in g if is_pure(n)})
    for name in names:
        sizes = {P: groups[P][name]["cache_bytes"] for P in Ps if name in groups[P]}
        if len(sizes) < 2:
            continue
        const = len(set(sizes.values())) == 1
        lines.append(f"{size} {name}: cache bytes constant in P ({', '.join(f'P {P}: {_mb(b)}' for P, b in sizes.items())}): "
                     + ("MET" if const else "NOT MET; it grows with P"))
    return rows, lines


def plot(results: dict, path: Path) -> None:
    """Time per token against P (log axes), one panel per size, the teacher and every student."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seqmix._plotting import save_figure

    sizes = sorted(results, key=lambda s: [int(v) for v in s.split("x")])
    names = list(dict.fromkeys(n for size in sizes for P in sorted(results[size]) for n in results[size][P]))
    students = [n for n in names if n != "teacher"]
    colors = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(students)}  # one colour per model in every panel
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.6), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        groups = results[size]
        for name in names:
            pts = [(P, groups[P][name]["ms_per_token"]) for P in sorted(groups) if name in groups[P]]
            if not pts:
                continue
            style = dict(color="black", lw=2.4, zorder=3) if name == "teacher" else \
                dict(color=colors[name], ls="--" if not is_pure(name) else "-", lw=1.3)
            ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", ms=4, label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(fmt)  # a panel spanning less than a decade has only minor ticks
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xticks(sorted(groups), [str(P) for P in sorted(groups)])
        ax.set_xlabel("prompt P (tokens)")
        ax.set_ylabel("time per new token (ms)")
        ax.set_title(f"Llama d {size.split('x')[0]} x {size.split('x')[1]} layers")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(loc="upper left", ncol=2, fontsize=6.5, framealpha=0.9, title="dashed: softmax layers kept",
                      title_fontsize=6.5)  # the corner a slower teacher at long prompts leaves empty
    save_figure(fig, path, title="linearized students against their teacher: time per new token (greedy, batch 1, CPU)",
                argument="--plot")


def section(results: dict, status: list[str], meta: dict, plot_rel: str | None) -> str:
    """The Markdown results section of docs/linearize.md."""
    other = f"; repeats {meta['repeats_other']}" if meta.get("repeats_other") else ""
    out = [f"Measured by `python bench/linearize_speed.py {meta['argv']}` ({meta['when']}{other}; torch threads "
           f"{meta['threads']} on {meta['cpus']} cores; load average over the runs {meta['load_min']:.2f} to "
           f"{meta['load_max']:.2f}: the machine is shared, so these are figures under that load). Batch 1, float32, "
           f"greedy, {meta['new_tokens']} new tokens; each cell: time per new token in ms (tokens/s ratio to the teacher), "
           "then the prefill in s (ratio), then the decoding state's bytes.", ""]
    if plot_rel:
        out += [f"![time per token against the prompt length]({plot_rel})", ""]
    for size in sorted(results, key=lambda s: [int(v) for v in s.split("x")]):
        groups = results[size]
        Ps = sorted(groups)
        names = list(dict.fromkeys(n for P in Ps for n in groups[P]))
        out += [f"**Llama d {size.split('x')[0]} x {size.split('x')[1]} layers**", "",
                "| model | " + " | ".join(f"P {P}" for P in Ps) + " |", "|---|" + "---|" * len(Ps)]
        for name in names:
            cells = []
            for P in Ps:
                r, t = groups[P].get(name), groups[P].get("teacher")
                if r is None:
                    cells.append("—")
                    continue
                dec = "" if name == "teacher" or not t else f" ({t['ms_per_token'] / r['ms_per_token']:.2f}x)"
                pre = "" if name == "teacher" or not t else f" ({t['prefill_s'] / r['prefill_s']:.2f}x)"
                cells.append(f"{r['ms_per_token']:.2f} ms{dec}; {r['prefill_s']:.2f} s{pre}; {_mb(r['cache_bytes'])}")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["Targets (every pure student; a student with its decoding step compiled is another row) and the compile costs:",
            ""] + [f"* {line}" for line in status]
    return "\n".join(out)


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder of the stored results (resumable)")
    p.add_argument("--sizes", default="512x8,1024x16", help="d_model x layers, comma-separated (default 512x8,1024x16)")
    p.add_argument("--prompts", default="256,2048,8192,16384", help="prompt lengths P (default 256,2048,8192,16384)")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens generated per run (default 64)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved repeats per model (default 2; the min is reported)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2: the 2-core CPU)")
    p.add_argument("--hybrid", default="lolcats(window 64)", help="the one-softmax hybrid's student (a label of STUDENTS; '' for none)")
    p.add_argument("--kept", type=int, default=0, help="the hybrid's layer that keeps the teacher's attention (default 0)")
    p.add_argument("--models", default=None, help="comma-separated model names to run (default every one)")
    p.add_argument("--table", action="store_true", help="print the stored results only (run nothing)")
    p.add_argument("--no-counts", action="store_true", help="skip the counted work per step (the NOT MET rows' reason)")
    p.add_argument("--write-docs", action="store_true", help="write the results section of --docs and the plot --plot")
    p.add_argument("--docs", type=Path, default=DOCS, help="the Markdown page of the results section (default docs/linearize.md)")
    p.add_argument("--plot", type=Path, default=PLOT, help="the plot's file (default docs/img/linearize_speed.png)")
    p.add_argument("--compile", action="store_true", help="also each pure student with seqmix.compile_decode (opt-in "
                   "torch.compile of the decoding step), as '<label> compiled'; its first call's cost is printed")
    p.add_argument("--general-step", action="store_true", help="also each student and recipe model whose mixer has a fused "
                   "decoding step with that step off, as '<label> general step' (the fused step's A/B)")
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK}")
    a = p.parse_args()
    if a.quick:
        a.sizes, a.prompts, a.new_tokens, a.repeats = QUICK["sizes"], QUICK["prompts"], QUICK["new_tokens"], QUICK["repeats"]
    torch.set_num_threads(a.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        sizes = [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")]
        prompts = sorted({int(v) for v in a.prompts.split(",")})
    except ValueError:
        raise SystemExit(f"bench/linearize_speed.py: --sizes must be DxL[,DxL] and --prompts integers, got {a.sizes!r}, {a.prompts!r}")
    if a.hybrid and a.hybrid not in _students():
        raise SystemExit(f"bench/linearize_speed.py: argument --hybrid: unknown student {a.hybrid!r} ({', '.join(_students())})")
    a.out.mkdir(parents=True, exist_ok=True)
    info = machine_info("cpu")
    print(f"load average at the start {os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()} on {os.cpu_count()} cores "
          "(the stored runs' own in the table)")
    results, counts, compile_costs = {}, {}, {}
    for d, L in sizes:
        size = f"{d}x{L}"
        count_path = a.out / f"{size}_counts.json"
        models = None
        if not a.table:
            models = models_for(d, L, max(prompts) + a.new_tokens + 16, a.hybrid, a.kept, compiled=a.compile, general=a.general_step)
            if a.models:
                keep = {"teacher", *a.models.split(",")}
                models = {k: v for k, v in models.items() if k in keep or any(k.removesuffix(v) in keep for v in VARIANTS)}
            print(f"{size}: {', '.join(models)}", flush=True)
            cost_path = a.out / f"{size}_compile.json"
            costs = json.loads(cost_path.read_text()) if cost_path.exists() else {}
            stored = dict(costs)
            for P in prompts:
                measure_group(a.out / f"{size}_P{P}.json", models, P, a.new_tokens, a.repeats, costs)
                if costs != stored:
                    cost_path.write_text(json.dumps(costs, indent=1))
                    stored = dict(costs)
            if not a.no_counts and not count_path.exists():
                count_path.write_text(json.dumps(counted(models), indent=1))
        results[size] = {P: summarize(json.loads((a.out / f"{size}_P{P}.json").read_text()))
                         for P in prompts if (a.out / f"{size}_P{P}.json").exists()}
        cost_path = a.out / f"{size}_compile.json"
        compile_costs[size] = json.loads(cost_path.read_text()) if cost_path.exists() else {}
        counts[size] = json.loads(count_path.read_text()) if count_path.exists() else None
        del models
    rows, status = [], []
    for size, groups in results.items():
        r, s = status_rows(size, groups, counts[size])
        rows += r
        status += s
    print_table("linearized students vs their teacher (CPU, batch 1, greedy)",
                ["size", "P", "model", "prefill (s)", "ms / token", "tokens/s", "tok/s ratio", "prefill ratio", "cache",
                 "repeats", "threads", "load"], rows)
    for line in status:
        print(" ", line)
    compiled_lines = [f"{size} {name}: compile_decode's first call {t:.1f} s" for size, c in compile_costs.items() for name, t in c.items()]
    for line in compiled_lines:
        print(" ", line)
    loads = [r[-1] for r in rows] or [os.getloadavg()[0]]
    print(f"load average: {min(loads):.2f} to {max(loads):.2f} over the stored runs (the machine is shared); now {os.getloadavg()[0]:.2f}")
    if a.write_docs:
        plot_rel = None
        if any(results.values()):
            plot(results, a.plot)
            try:
                plot_rel = os.path.relpath(a.plot, a.docs.parent)
            except ValueError:
                plot_rel = str(a.plot)
        stored_threads = sorted({str(r[-2]) for r in rows}) or [str(torch.get_num_threads())]
        threads = stored_threads[0] if len(stored_threads) == 1 and stored_threads[0].isdigit() else a.threads  # the runs' own
        groups_of = {}  # the stored runs' own repeats -> the (size, P) groups run with them
        for r in rows:
            groups_of.setdefault(r[-3], set()).add((r[0], r[1]))
        repeats = max(groups_of, key=lambda k: len(groups_of[k])) if groups_of else a.repeats
        other = "; ".join(f"{k} at " + ", ".join(f"{s} P {P}" for s, P in sorted(groups_of[k])) for k in sorted(groups_of)
                          if k != repeats)
        argv = f"--sizes {a.sizes} --prompts {a.prompts} --new-tokens {a.new_tokens} --repeats {repeats} --threads {threads}" \
            + (f" --hybrid {shlex.quote(a.hybrid)} --kept {a.kept}" if a.hybrid else " --hybrid ''") + (" --compile" if a.compile else "") \
            + (" --general-step" if a.general_step else "") + " --out OUT"
        meta = {"argv": argv, "when": time.strftime("%Y-%m-%d"), "threads": "/".join(stored_threads),
                "cpus": os.cpu_count(), "load_min": min(loads), "load_max": max(loads), "new_tokens": a.new_tokens,
                "repeats_other": other}
        write_doc_section(a.docs, MARKER, section(results, status + compiled_lines, meta, plot_rel))
    (a.out / "summary.json").write_text(json.dumps({"machine": info, "results": {s: {str(P): g for P, g in gs.items()}
                                                                                 for s, gs in results.items()},
                                                    "counts": counts, "status": status}, indent=1))


if __name__ == "__main__":
    main()
