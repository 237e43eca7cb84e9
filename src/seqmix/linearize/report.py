"""report.md of a linearization run, from its metrics.json content (the numbers measured by the run)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_report", "report_markdown", "report_html", "write_html", "write_maps"]


def _f(v, fmt=".4f") -> str:
    return "—" if v is None else format(v, fmt)


def _title(metrics: dict) -> str:
    return f"Linearization of {metrics['config']['hf']} into {metrics['config']['mixer']}"


def _settings(metrics: dict) -> str:
    cfg = metrics["config"]
    return (f"layers `{cfg['layers']}`, init `{cfg['init']}`, stage 1 match `{cfg['match']}` (trainable "
            f"`{cfg.get('transfer_trainable', 'all')}`), stages `{','.join(cfg['stages'])}`, corpus `{cfg['corpus']}` "
            f"({cfg['tokenizer']}), windows {cfg['batch_size']} × {cfg['seq_len']}, LoRA rank "
            f"{cfg['lora_rank'] or 'none (full fine-tuning)'}, KD weight {cfg['kd']}, device `{cfg.get('device', 'cpu')}`, "
            f"precision `{cfg.get('precision', 'fp32')}`.")


def sections(metrics: dict) -> list[dict]:
    """The report's sections, each {"title", "text", "header", "rows"} (rows of cell strings): what both
    report.md and report.html show, from the numbers metrics.json holds."""
    cfg = metrics["config"]
    t = metrics["teacher"]
    rows = [["teacher", _f(t["loss"]), _f(t["bpb"]), str(t["state"]["kv_floats_per_token"]), "0",
             str(t["state"]["floats_at_seq_len"]), _f(t.get("decode_tokens_per_s"), ".0f")],
            ["student at init", _f(metrics["init"]["loss"]), _f(metrics["init"]["bpb"]), "", "", "", ""]]
    for name, st in metrics["stages"].items():
        s = st["state"]
        rows.append([f"student after {name}", _f(st["eval"]["loss"]), _f(st["eval"]["bpb"]), str(s["kv_floats_per_token"]),
                     str(s["recurrent_floats"]), str(s["floats_at_seq_len"]), _f(st.get("decode_tokens_per_s"), ".0f")])
    out = [{"title": "Validation loss, state and decoding speed",
            "text": f"Held-out windows of the corpus; state floats per sequence at T = {cfg['seq_len']} (the KV cache grows "
                    "per token, the students' recurrent state is constant); greedy decoding tokens/s at batch 1.",
            "header": ["model", "loss (nats/token)", "bits per byte", "KV floats per token", "recurrent state floats",
                       f"state floats at T = {cfg['seq_len']}", "decode tokens/s"],
            "rows": rows}]
    tr = metrics["stages"].get("transfer")
    if tr:
        text = (f"Relative error on held-out text ({'Φ error' if cfg['match'] == 'phi' else '‖s(x) − y‖² / ‖y‖²'}); "
                f"{tr['steps']} steps, {tr['tokens']} tokens, {tr['seconds']:.0f} s.")
        if tr.get("kept_softmax"):
            text += f" Softmax kept (largest residuals, `auto`): layers {tr['kept_softmax']}."
        out.append({"title": "Stage 1: per-layer transfer residual", "text": text, "header": ["layer", "before", "after"],
                    "rows": [[str(layer), _f(before, ".4g"), _f(tr["residual_after"][layer], ".4g")]
                             for layer, before in tr["residual_before"].items()]})
    ft = metrics["stages"].get("finetune")
    if ft:
        out.append({"title": "Stage 2: fine-tuning", "text": f"{ft['steps']} steps, {ft['tokens']} tokens, {ft['seconds']:.0f} s, "
                    f"{ft['trainable']} trainable parameters.", "header": [], "rows": []})
    return out


_MAPS_TEXT = ("The teacher's attention (top) and the student's Φ (bottom), head 0, on the first 64 tokens of the validation "
              "text, each from the teacher's input to that layer:")


def report_markdown(metrics: dict) -> str:
    lines = [f"# {_title(metrics)}", "", _settings(metrics)]
    for sec in sections(metrics):
        lines += ["", f"## {sec['title']}", "", sec["text"]]
        if sec["header"]:
            lines += ["", "| " + " | ".join(sec["header"]) + " |", "|" + "---|" * len(sec["header"])]
            lines += ["| " + " | ".join(r) + " |" for r in sec["rows"]]
    if metrics.get("maps"):
        lines += ["", "## Maps", "", _MAPS_TEXT, "", f"![maps]({metrics['maps']})"]
    return "\n".join(lines) + "\n"


def write_report(metrics: dict, path: Path) -> Path:
    Path(path).write_text(report_markdown(metrics))
    return Path(path)


def report_html(metrics: dict, maps: Path | None = None) -> str:
    """report.md's content as one self-contained HTML page (well-formed markup); ``maps``: the maps PNG,
    embedded as a data URI."""
    import base64
    import re
    from html import escape

    def inline(text: str) -> str:  # `code` -> <code>
        return re.sub(r"`([^`]*)`", r"<code>\1</code>", escape(text, quote=False))

    title = escape(_title(metrics))
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8"/>', f"<title>{title}</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #bbb;padding:0.2em 0.6em;text-align:right}td:first-child{text-align:left}"
             "img{max-width:100%}</style>", "</head>", "<body>", f"<h1>{title}</h1>", f"<p>{inline(_settings(metrics))}</p>"]
    for sec in sections(metrics):
        parts += [f"<h2>{escape(sec['title'])}</h2>", f"<p>{inline(sec['text'])}</p>"]
        if sec["header"]:
            parts.append("<table>")
            parts.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in sec["header"]) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in sec["rows"]]
            parts.append("</table>")
    if maps is not None:
        data = base64.b64encode(Path(maps).read_bytes()).decode("ascii")
        parts += ["<h2>Maps</h2>", f"<p>{escape(_MAPS_TEXT)}</p>",
                  f'<img alt="the teacher\'s and the student\'s maps" src="data:image/png;base64,{data}"/>']
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_html(metrics: dict, path: Path, *, maps: Path | None = None) -> Path:
    Path(path).write_text(report_html(metrics, maps))
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
    from .attention_transfer import _teacher_mixers, capture

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
