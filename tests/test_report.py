"""Multi-seed results (median and range), claims across seeds, --dry-run, `reproduce all`
and its HTML report (well-formed, self-contained; opened in headless Chromium when present)."""

import base64
from html.parser import HTMLParser

import pytest

from seqmix.cli import main
from seqmix.experiments import PRESETS, Claim, ModelSpec, Preset, Reproduction, Scale, TaskSpec, evaluate_claims, reproduce_all
from seqmix.experiments.presets import tiny_mqar
from seqmix.experiments.report import report_html, write_report
from seqmix.train.results import best_over_lr, lm_table, plot, seed_rows, table

from browser import CHROMIUM, SKIP_REASON, check_in_browser, console_lines, dump_dom, image_widths

pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _row(label, d, acc, seed, lr=1e-3):
    return {"experiment": "e", "label": label, "task": "t", "d_model": d, "n": 8, "lr": lr, "seed": seed,
            "accuracy": acc, "status": "finished", "state_size": 100, "params": 1, "epochs": 1, "wall_time": 2.0,
            "mixer": "m"}


def _seeded(values: dict) -> list[dict]:
    """values: label -> {d: [acc of seed 0, seed 1, ...]}"""
    return [_row(lab, d, a, s) for lab, series in values.items() for d, accs in series.items() for s, a in enumerate(accs)]


def test_median_and_range_over_seeds():
    rows = _seeded({"a": {16: [0.2, 0.9, 0.8]}}) + [_row("a", 16, 0.85, s, lr=3e-3) for s in range(3)]
    (r,) = best_over_lr(rows)
    # lr 1e-3: median 0.8 (mean 0.63); lr 3e-3: median 0.85: the median picks the lr
    assert r["lr"] == 3e-3 and r["accuracy"] == pytest.approx(0.85) and r["lo"] == r["hi"] == pytest.approx(0.85)
    every = {x["lr"]: x for x in best_over_lr(rows, all_lrs=True)}
    low = every[1e-3]
    assert low["accuracy"] == pytest.approx(0.8) and low["lo"] == pytest.approx(0.2) and low["hi"] == pytest.approx(0.9)
    assert low["mean"] == pytest.approx((0.2 + 0.9 + 0.8) / 3) and low["per_seed"] == {0: 0.2, 1: 0.9, 2: 0.8}
    md = table(best_over_lr(_seeded({"a": {16: [0.2, 0.9, 0.8], 32: [1.0, 1.0, 0.5]}})))
    assert "| a | 80.0 (20.0–90.0) | 100.0 (50.0–100.0) |" in md and "median over 3 seeds" in md
    one = table(best_over_lr(_seeded({"a": {16: [0.5]}})))
    assert "| a | 50.0 |" in one and "median" not in one


def test_seed_rows():
    rows = best_over_lr(_seeded({"a": {16: [0.2, 0.9, 0.8]}, "b": {16: [0.5, 0.5]}}))
    per = seed_rows(rows)
    assert set(per) == {0, 1}  # only the seeds every row has
    assert {r["label"]: r["accuracy"] for r in per[1]} == {"a": 0.9, "b": 0.5}


def _preset(claims, **scale) -> Preset:
    return Preset(name="mini", title="mini", source="test", x="d_model",
                  models=[ModelSpec(label="a", mixer="linear_attention", state_field="n"),
                          ModelSpec(label="b", mixer="linear_attention", state_field="n")],
                  scales={"tiny": Scale(tasks=[TaskSpec(name="mqar(16,2)", data=tiny_mqar(16, 2, train=64, test=32, batch_size=32))],
                                        d_models=[8], ns=[4], lrs=[3e-3], train={"epochs": 1, "threads": 1},
                                        model={"channel_mixer": "none"}, **scale)},
                  claims=claims, paper="| model | x |\n|---|---|\n| a | 99.0 |\nthe paper says a > b")


def test_claims_across_seeds():
    above = Claim(text="a > b", check="above", a="a", b="b", caveat="too small to tell")
    # medians 0.6 vs 0.5 hold, but a beats b in seed 0 only: does not agree, with the caveat
    (c,) = evaluate_claims(_preset([above]), best_over_lr(_seeded({"a": {8: [0.9, 0.6, 0.1]}, "b": {8: [0.5, 0.7, 0.2]}})))
    assert c["verdict"] == "does not agree" and (c["seeds_agree"], c["seeds"]) == (1, 3)
    assert "only for 1 of 3 seeds" in c["detail"] and c["caveat"] == "too small to tell"
    (c,) = evaluate_claims(_preset([above]), best_over_lr(_seeded({"a": {8: [0.9, 0.6, 0.1]}, "b": {8: [0.5, 0.5, 0.2]}})))
    assert c["verdict"] == "agrees" and c["seeds_agree"] == 2  # a majority: seeds 0 and 1
    (c,) = evaluate_claims(_preset([above]), best_over_lr(_seeded({"a": {8: [0.9, 0.6, 0.1]}, "b": {8: [0.5, 0.5, 0.0]}})))
    assert c["verdict"] == "agrees" and (c["seeds_agree"], c["seeds"]) == (3, 3) and c["caveat"] == ""
    (c,) = evaluate_claims(_preset([Claim(text="b grows", check="increasing", a="b")]), best_over_lr(_seeded({"b": {8: [0.5, 0.6]}})))
    assert c["verdict"] == "n/a" and c["seeds"] == 0 and "two x values" in c["detail"]  # one x: nothing to check
    (c,) = evaluate_claims(_preset([above]), best_over_lr(_seeded({"a": {8: [0.4]}, "b": {8: [0.5]}})))
    assert c["verdict"] == "does not agree" and c["seeds"] == 0 and c["caveat"] == "too small to tell"


def test_dry_run_lists_the_runs_without_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(PRESETS, "mini", _preset([], seeds=[0, 1, 2]))
    assert main(["reproduce", "mini", "--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "6 runs (3 seed(s) each)" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("| a |") or ln.startswith("| b |")]
    assert len(lines) == 6 and {ln.split("|")[6].strip() for ln in lines} == {"0", "1", "2"}
    assert "| a | mqar(16,2) | 8 | 4 | 0.003 | 0 |" in out
    assert not (tmp_path / "out").exists()  # nothing trained, nothing written
    assert main(["reproduce", "all", "--dry-run", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "dsf-fig2" in out and "bmojo-fig2-me" in out and "runs in" in out and not (tmp_path / "out").exists()


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.images, self.links, self.cells = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a)
        for k in ("href", "src"):
            if k in a and not (a[k].startswith("#") or a[k].startswith("data:")):
                self.links.append(a[k])
        if tag not in ("meta", "img", "br"):
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] in ("td", "th"):
            self.cells.append(data)


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    """A report of two reproductions built from rows (no training): one with a plot."""
    d = tmp_path_factory.mktemp("rep")
    p = _preset([Claim(text="a > b", check="above", a="a", b="b", caveat="too small to tell"),
                 Claim(text="a at least 50%", check="at_least", a="a", value=0.5)], seeds=[0, 1, 2])
    rows = best_over_lr(_seeded({"a": {8: [0.9, 0.6, 0.1], 16: [1.0, 0.9, 0.95]}, "b": {8: [0.5, 0.7, 0.2], 16: [0.3, 0.3, 0.3]}}))
    png = plot(rows, d / "mini.png", title="mini")
    r1 = Reproduction(p, "tiny", rows, table(rows), png, evaluate_claims(p, rows), runs=[None] * 12, elapsed=75.0, train_time=130.0)
    r2 = Reproduction(p.model_copy(update={"name": "mini2"}), "tiny", [], "", None, [], runs=[], elapsed=0.0)
    # a language-modelling preset: its rows have bits per byte, not accuracy per (d, n); the report shows its table
    lm_rows = [{"label": lab, "task": "corpus(char)", "d_model": 64, "lr": 3e-3, "ppl": ppl, "bpb": bpb, "bpb_std": 0.01,
                "seeds": 2, "tokens": 1000, "tokens_per_s": 10.0, "params": 5, "wall_time": 3.0}
               for lab, ppl, bpb in (("a", 10.4, 3.3766), ("b", 10.9, 3.4440))]
    r3 = Reproduction(p.model_copy(update={"name": "mini-lm", "metric": "bpb"}), "tiny", lm_rows, lm_table(lm_rows), None, [],
                      runs=[None] * 4, elapsed=1.0)
    page, md = write_report([r1, r2, r3], d / "report", skipped={"lm-x": "no 'tiny' scale"})
    return page, md


def test_report_is_well_formed_and_self_contained(small_report):
    page, md = small_report
    text = page.read_text(encoding="utf-8")
    c = _Page()
    c.feed(text)
    c.close()
    assert text.startswith("<!DOCTYPE html>") and not c.errors and not c.stack, (c.errors, c.stack)
    assert not c.links, c.links
    assert len(c.images) == 1 and c.images[0]["src"].startswith("data:image/png;base64,")
    assert base64.b64decode(c.images[0]["src"].split(",", 1)[1], validate=True)[:8] == b"\x89PNG\r\n\x1a\n"
    cells = [x.strip() for x in c.cells]
    # ours (median and range), the paper's table beside it, claims with verdicts, seeds, caveat, times
    assert "60.0 (10.0–90.0)" in cells and "95.0 (90.0–100.0)" in cells and "99.0" in cells
    assert "does not agree" in cells and "agrees" in cells and "1/3" in cells
    assert "why: too small to tell" in text and "the paper says a &gt; b" in text
    assert "1 min 15 s" in cells and "2 min 10 s" in cells and "not run: no &#x27;tiny&#x27; scale" in text
    assert "3.3766 ± 0.0100" in cells and "3.4440 ± 0.0100" in cells  # the LM preset's bits-per-byte table
    summary = md.read_text()
    assert "| mini | 12 | 3 | 1 of 2 agree | 1 min 15 s | 2 min 10 s |" in summary
    assert "**does not agree** (1/3 seeds): a > b" in summary and "why: too small to tell" in summary
    # both open with the verdict counts, then each disagreement with its numbers and cause
    assert summary.startswith("**Verdicts: 1 of 2 claims agree (mini 1/2).**")
    first = summary.index("- mini: a > b — does not agree (1/3 seeds; t: ")
    assert first < summary.index("| preset |") and "; why: too small to tell" in summary[first:summary.index("| preset |")]
    assert text.index("Verdicts: 1 of 2 claims agree (mini 1/2).") < text.index("<th>preset</th>")


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_report_opens_in_headless_chromium(small_report, tmp_path):
    page, _ = small_report
    r = dump_dom(page, tmp_path / "profile")
    assert r.returncode == 0, r.stderr[-2000:]
    assert not console_lines(r)
    dom = r.stdout
    assert 'data-images-decoded="1/1"' in dom
    assert "60.0 (10.0–90.0)" in dom and "does not agree" in dom and "1 of 2 agree" in dom
    check_in_browser(page, tmp_path, 1)  # the plot decoded, the screenshot not blank
    # the check can fail: a corrupted plot is reported
    bad = tmp_path / "bad.html"
    bad.write_text(page.read_text(encoding="utf-8").replace("base64,iVBOR", "base64,AAAA", 1), encoding="utf-8")
    r = dump_dom(bad, tmp_path / "profile")
    assert 'data-images-decoded="0/1"' in r.stdout
    assert image_widths(bad, tmp_path / "profile") == [0]


def test_reproduce_all_end_to_end(tmp_path, monkeypatch):
    """Two small presets run, resumably, into one report; a preset without the scale is listed as not run."""
    from rich.console import Console

    for k in list(PRESETS):
        monkeypatch.delitem(PRESETS, k)
    p = _preset([Claim(text="a is not below b", check="not_below", a="a", b="b", value=1.0)], seeds=[0, 1])
    monkeypatch.setitem(PRESETS, "mini", p)
    monkeypatch.setitem(PRESETS, "paper-only", p.model_copy(update={"name": "paper-only", "scales": {"paper": p.scales["tiny"]}}))
    con = Console(file=open(tmp_path / "log.txt", "w"), width=160)
    done, skipped, page = reproduce_all("tiny", out_dir=tmp_path / "out", workers=1, progress=False, console=con)
    assert [r.preset.name for r in done] == ["mini"] and skipped == {"paper-only": "no 'tiny' scale"}
    r = done[0]
    assert r.failed == 0 and len(r.runs) == 4 and r.train_time > 0 and r.claims[0]["verdict"] == "agrees"
    assert page == tmp_path / "out" / "report" / "index.html" and page.exists()
    text = page.read_text(encoding="utf-8")
    assert "mini" in text and "data:image/png;base64," in text and "1 of 1 agree" in text
    assert (tmp_path / "out" / "report" / "summary.md").exists()
    again, _, _ = reproduce_all("tiny", out_dir=tmp_path / "out", workers=1, progress=False, console=con)
    assert again[0].rows == r.rows and "already finished" in (tmp_path / "log.txt").read_text()
