"""report.md of a linearization run, from its metrics.json content (the numbers measured by the run)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_report", "report_markdown"]


def _f(v, fmt=".4f") -> str:
    return "—" if v is None else format(v, fmt)


def report_markdown(metrics: dict) -> str:
    cfg = metrics["config"]
    lines = [f"# Linearization of {cfg['hf']} into {cfg['mixer']}", "",
             f"layers `{cfg['layers']}`, init `{cfg['init']}`, stage 1 match `{cfg['match']}`, stages "
             f"`{','.join(cfg['stages'])}`, corpus `{cfg['corpus']}` ({cfg['tokenizer']}), windows {cfg['batch_size']} × "
             f"{cfg['seq_len']}, LoRA rank {cfg['lora_rank'] or 'none (full fine-tuning)'}, KD weight {cfg['kd']}.", "",
             "## Validation loss", "", "| model | loss (nats/token) | bits per byte | state floats at T = seq_len | decode tokens/s |",
             "|---|---|---|---|---|"]
    t = metrics["teacher"]
    lines.append(f"| teacher | {_f(t['loss'])} | {_f(t['bpb'])} | {t['state']['floats_at_seq_len']} "
                 f"({t['state']['kv_floats_per_token']} per token) | {_f(t.get('decode_tokens_per_s'), '.0f')} |")
    lines.append(f"| student at init | {_f(metrics['init']['loss'])} | {_f(metrics['init']['bpb'])} | | |")
    for name, st in metrics["stages"].items():
        s = st["state"]
        lines.append(f"| student after {name} | {_f(st['eval']['loss'])} | {_f(st['eval']['bpb'])} | {s['floats_at_seq_len']} "
                     f"({s['recurrent_floats']} recurrent + {s['kv_floats_per_token']} per token) | "
                     f"{_f(st.get('decode_tokens_per_s'), '.0f')} |")
    tr = metrics["stages"].get("transfer")
    if tr:
        lines += ["", "## Stage 1: per-layer transfer residual", "",
                  f"Relative error on held-out text ({'Φ error' if cfg['match'] == 'phi' else '‖s(x) − y‖² / ‖y‖²'}); "
                  f"{tr['steps']} steps, {tr['tokens']} tokens, {tr['seconds']:.0f} s.", "",
                  "| layer | before | after |", "|---|---|---|"]
        for layer, before in tr["residual_before"].items():
            lines.append(f"| {layer} | {_f(before, '.4g')} | {_f(tr['residual_after'][layer], '.4g')} |")
        if tr.get("kept_softmax"):
            lines += ["", f"Softmax kept (largest residuals, `auto`): layers {tr['kept_softmax']}."]
    ft = metrics["stages"].get("finetune")
    if ft:
        lines += ["", "## Stage 2: fine-tuning", "", f"{ft['steps']} steps, {ft['tokens']} tokens, {ft['seconds']:.0f} s, "
                  f"{ft['trainable']} trainable parameters.", ""]
    if metrics.get("maps"):
        lines += ["", "## Maps", "", "The teacher's attention and the student's Φ (head 0) on the first 64 tokens of the "
                  "validation text, each from the teacher's input to that layer:", "", f"![maps]({metrics['maps']})"]
    return "\n".join(lines) + "\n"


def write_report(metrics: dict, path: Path) -> Path:
    Path(path).write_text(report_markdown(metrics))
    return Path(path)


def write_maps(model, teacher, ids, path: Path, *, head: int = 0) -> Path:
    """One figure: per student layer, the teacher's attention map and the student's Φ (map ``head``) on
    the token ids [1, T], both from the teacher's input to that layer (what stage 1 matches)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from .._plotting import save_figure
    from .api import students
    from .transfer import _teacher_mixers, capture

    studs = students(model)
    if not studs:
        raise ValueError("write_maps: argument 'model' holds no student")
    tmix = _teacher_mixers(teacher, studs)
    with torch.no_grad(), capture(teacher, studs) as cap:
        teacher(input_ids=ids, use_cache=False)
    fig, axes = plt.subplots(2, len(studs), figsize=(2.6 * len(studs), 5.2), squeeze=False)
    with torch.no_grad():
        for col, (layer, adapter) in enumerate(studs.items()):
            x = cap.inputs[layer]
            for row, (who, m) in enumerate((("teacher", tmix[layer]), (adapter.mixer.registry_name, adapter.mixer))):
                ax = axes[row][col]
                ax.imshow(m.phi(x)[0, head].float().cpu().numpy(), cmap="viridis")
                ax.set_title(f"layer {layer}: {who}", fontsize=8)
                ax.set_xticks([])
                ax.set_yticks([])
    return save_figure(fig, path, title=f"Φ of head {head}: the teacher's attention (top) and the student's map (bottom)")
