"""One report of every reproduction: a self-contained HTML page and a markdown summary.

    write_report(reproductions, "runs/report")   # -> runs/report/index.html, runs/report/summary.md

Per preset: its source and scale, the plot (PNG embedded as base64), the table (median and
range over seeds), the paper's numbers or statements beside ours, the claims with their
verdicts (and in how many seeds each holds), the notes and the run time. The page references
nothing outside itself; a small script marks every image that decoded (``data-images-decoded``
on the body), which the headless-browser test reads, as for ``seqmix show --html``.
"""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path

from ..analysis.show import _SCRIPT
from ..train.results import _cell, _fmt_x, _labels, _lr_note, panels

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
.agrees { color: #176b28; font-weight: 600; }
.disagrees { color: #a31515; font-weight: 600; }
.na { color: #8a6d00; font-weight: 600; }
.preset { border-top: 2px solid #888; margin-top: 2.5em; }
.side { display: flex; gap: 2em; flex-wrap: wrap; }
.muted { color: #666; font-size: 0.9em; }
img { max-width: 100%; height: auto; }
"""

_VERDICT_CLASS = {"agrees": "agrees", "does not agree": "disagrees"}


def _minutes(s: float) -> str:
    return f"{int(s // 60)} min {int(s % 60):02d} s" if s >= 60 else f"{s:.1f} s"


def _markdown_block(text: str) -> str:
    """The paper's field: markdown tables become HTML tables, other lines paragraphs."""
    esc = html.escape
    out, rows = [], []

    def flush():
        if rows:
            body = [r for r in rows if not set(r.replace("|", "").strip()) <= set("-: ")]
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in body]
            out.append("<table><thead><tr>" + "".join(f"<th>{esc(c)}</th>" for c in cells[0]) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
                       + "</tbody></table>")
            rows.clear()

    for line in text.splitlines():
        if line.strip().startswith("|"):
            rows.append(line)
        else:
            flush()
            if line.strip():
                out.append(f"<p>{esc(line)}</p>")
    flush()
    return "\n".join(out)


def _results_tables(rows: list[dict], x: str, order: list[str]) -> str:
    esc = html.escape
    out = []
    for title, rs in panels(rows, x).items():
        xs = sorted({r[x] for r in rs if r[x] is not None}, key=str if x == "task" else None)
        seeds = max((r.get("seeds", 1) for r in rs), default=1)
        lrs_shown = len({r["lr"] for r in rs}) > 1 or any(len(r.get("lrs", ())) > 1 for r in rs)
        out.append(f"<p><b>{esc(str(title))}</b> — accuracy (%), best over learning rates"
                   + (" (the chosen lr in brackets: one per seed where they differ)" if lrs_shown else "")
                   + (f"; median over {seeds} seeds (lowest–highest)" if seeds > 1 else "") + "</p>")
        out.append("<table><thead><tr><th>model</th>" + "".join(f"<th>{esc(x)}={esc(_fmt_x(v))}</th>" for v in xs)
                   + "</tr></thead><tbody>")
        for lab in _labels(rs, order):
            by_x = {r[x]: r for r in rs if r["label"] == lab}
            out.append(f"<tr><td>{esc(lab)}</td>" + "".join(
                f"<td>{esc(_cell(by_x[v]) + (f' [{_lr_note(by_x[v])}]' if lrs_shown else '')) if v in by_x else ''}</td>"
                for v in xs) + "</tr>")
        out.append("</tbody></table>")
    return "\n".join(out)


def _claim_rows(claims: list[dict]) -> str:
    esc = html.escape
    out = ["<table><thead><tr><th>claim</th><th>panel</th><th>verdict</th><th>seeds</th><th>ours</th></tr></thead><tbody>"]
    for c in claims:
        cls = _VERDICT_CLASS.get(c["verdict"], "na")
        seeds = f"{c['seeds_agree']}/{c['seeds']}" if c.get("seeds") else "1 seed"
        why = f"<br><span class=\"muted\">why: {esc(c['caveat'])}</span>" if c.get("caveat") else ""
        out.append(f"<tr><td>{esc(c['text'])}</td><td>{esc(c['panel'])}</td><td class=\"{cls}\">{esc(c['verdict'])}</td>"
                   f"<td>{seeds}</td><td>{esc(c['detail'])}{why}</td></tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _count(claims: list[dict]) -> str:
    k = sum(c["verdict"] == "agrees" for c in claims)
    return f"{k} of {len(claims)} agree" if claims else "no claims"


def verdicts(reproductions: list) -> tuple[str, list[tuple[str, dict]]]:
    """What the report opens with: one line of verdict counts (all presets, then each), and
    every claim that does not agree as (preset, claim) — its numbers (``detail``) and the
    measured cause (``caveat``) follow it in both reports."""
    total = [c for r in reproductions for c in r.claims]
    k = sum(c["verdict"] == "agrees" for c in total)
    per = ", ".join(f"{r.preset.name} {sum(c['verdict'] == 'agrees' for c in r.claims)}/{len(r.claims)}"
                    for r in reproductions if r.claims)
    line = f"{k} of {len(total)} claims agree" + (f" ({per})" if per else "")
    bad = [(r.preset.name, c) for r in reproductions for c in r.claims if c["verdict"] != "agrees"]
    return line, bad


def _seeds(c: dict) -> str:
    return f"{c['seeds_agree']}/{c['seeds']} seeds" if c.get("seeds") else "1 seed"


def report_html(reproductions: list, *, title: str = "seqmix reproductions", skipped: dict[str, str] | None = None) -> str:
    """The page: a summary table, then one section per reproduction (module docstring)."""
    esc = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">', f"<title>{esc(title)}</title>",
             f"<style>{_CSS}</style>", "</head>", "<body>", f"<h1>{esc(title)}</h1>",
             f"<p class=\"muted\">Written {esc(time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()))}. Accuracy: best "
             "validation accuracy of a run; a cell is the median over seeds with the lowest and highest seed in brackets. "
             "A claim agrees when it holds on the medians and for a majority of the seeds.</p>",
             "<h2>Summary</h2>"]
    line, bad = verdicts(reproductions)
    parts.append(f"<p><strong>Verdicts: {esc(line)}.</strong></p>")
    if bad:
        parts.append("<p>Claims that do not agree, with the numbers and the measured cause:</p><ul>" + "".join(
            f"<li><a href=\"#{esc(name)}\">{esc(name)}</a>: {esc(c['text'])} — {esc(c['verdict'])} ({esc(_seeds(c))}; "
            f"{esc(c['panel'])}: {esc(c['detail'])})" + (f"<br><span class=\"muted\">why: {esc(c['caveat'])}</span>" if c.get("caveat") else "")
            + "</li>" for name, c in bad) + "</ul>")
    parts += ["<table><thead><tr><th>preset</th><th>scale</th><th>runs</th><th>seeds</th>"
             "<th>claims</th><th>time (this call)</th><th>training (sum over runs)</th></tr></thead><tbody>"]
    for r in reproductions:
        sc = r.preset.scale(r.scale)
        parts.append(f"<tr><td><a href=\"#{esc(r.preset.name)}\">{esc(r.preset.name)}</a></td><td>{esc(r.scale)}</td>"
                     f"<td>{len(r.runs)}</td><td>{len(sc.seeds)}</td><td>{esc(_count(r.claims))}</td>"
                     f"<td>{esc(_minutes(r.elapsed))}</td><td>{esc(_minutes(r.train_time))}</td></tr>")
    for name, why in (skipped or {}).items():
        parts.append(f"<tr><td>{esc(name)}</td><td colspan=\"6\">not run: {esc(why)}</td></tr>")
    parts.append("</tbody></table>")
    for r in reproductions:
        p, sc = r.preset, r.preset.scale(r.scale)
        order = [m.label for m in p.models]
        parts += [f'<section class="preset" id="{esc(p.name)}">', f"<h2>{esc(p.name)}: {esc(p.title)}</h2>",
                  f"<p>{esc(p.source)}<br>Scale {esc(r.scale)}: {esc(sc.description)}<br>"
                  f"{len(r.runs)} runs, {len(sc.seeds)} seed(s); expected {esc(sc.budget or '?')}; "
                  f"this call {esc(_minutes(r.elapsed))}, training {esc(_minutes(r.train_time))} summed over runs"
                  + (f"; <span class=\"disagrees\">{r.failed} run(s) failed</span>" if r.failed else "") + "</p>"]
        if r.plot is not None and Path(r.plot).exists():
            png = base64.b64encode(Path(r.plot).read_bytes()).decode("ascii")
            parts.append(f'<figure><img alt="plot of {esc(p.name)}" src="data:image/png;base64,{png}"></figure>')
        parts.append('<div class="side"><div><h3>Ours</h3>')
        if not r.rows:
            parts.append("<p>no finished runs</p>")
        elif p.metric == "bpb":  # language modelling: the bits-per-byte table the terminal prints
            parts.append(_markdown_block(r.table))
        else:
            parts.append(_results_tables(r.rows, p.x, order))
        parts.append("</div><div><h3>Paper</h3>" + (_markdown_block(p.paper) if p.paper else "<p>(none given)</p>") + "</div></div>")
        if r.claims:
            parts += [f"<h3>Claims ({esc(_count(r.claims))})</h3>", _claim_rows(r.claims)]
        if p.notes:
            parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{esc(n)}</li>" for n in p.notes) + "</ul>")
        parts.append("</section>")
    parts += [f"<script>{_SCRIPT}</script>", "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def report_markdown(reproductions: list, *, skipped: dict[str, str] | None = None) -> str:
    """The terminal summary: the verdict counts and every disagreement with its numbers and
    cause first, then per preset its time, claims with verdicts and seed counts."""
    line, bad = verdicts(reproductions)
    lines = [f"**Verdicts: {line}.**", ""]
    if bad:
        lines += ["Claims that do not agree, with the numbers and the measured cause:", ""]
        lines += [f"- {name}: {c['text']} — {c['verdict']} ({_seeds(c)}; {c['panel']}: {c['detail']})"
                  + (f"; why: {c['caveat']}" if c.get("caveat") else "") for name, c in bad]
        lines.append("")
    lines += ["| preset | runs | seeds | claims | time (this call) | training (sum) |", "|---|---|---|---|---|---|"]
    for r in reproductions:
        lines.append(f"| {r.preset.name} | {len(r.runs)} | {len(r.preset.scale(r.scale).seeds)} | {_count(r.claims)} | "
                     f"{_minutes(r.elapsed)} | {_minutes(r.train_time)} |")
    for name, why in (skipped or {}).items():
        lines.append(f"| {name} | not run: {why} | | | | |")
    for r in reproductions:
        lines += ["", f"## {r.preset.name} ({r.scale})", ""]
        for c in r.claims:
            seeds = f" ({c['seeds_agree']}/{c['seeds']} seeds)" if c.get("seeds") else ""
            lines.append(f"- **{c['verdict']}**{seeds}: {c['text']} ({c['panel']}: {c['detail']})"
                         + (f" — why: {c['caveat']}" if c.get("caveat") else ""))
    return "\n".join(lines) + "\n"


def write_report(reproductions: list, out_dir: str | Path, *, skipped: dict[str, str] | None = None,
                 title: str = "seqmix reproductions") -> tuple[Path, Path]:
    """Writes ``out_dir/index.html`` and ``out_dir/summary.md``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    page, md = out / "index.html", out / "summary.md"
    page.write_text(report_html(reproductions, title=title, skipped=skipped), encoding="utf-8")
    md.write_text(report_markdown(reproductions, skipped=skipped), encoding="utf-8")
    return page, md


__all__ = ["report_html", "report_markdown", "write_report"]
