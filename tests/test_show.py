"""`seqmix show` (docs/show.md): the numbers on cases with known answers, the pictures (rendered
headless, pixel sizes, the plotted arrays are phi(x) itself), the HTML report (html.parser always,
headless Chromium when installed), the CLI and its errors, and Mixer.decays over the registry."""

from __future__ import annotations

import base64
import math
import struct
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import AxesImage

from browser import CHROMIUM, SKIP_REASON, check_in_browser, console_lines, dump_dom, image_widths

import seqmix
from seqmix.analysis import mapstats, show
from seqmix.analysis.mapstats import (
    band_mass, check_seq_len, count_distinct, decay_summary, effective_rank, lag_quantile, map_distance, memory_lengths,
)
from seqmix.analysis.theory_figures import THEORY_FIGURES
from seqmix.cli import main
from tolerances import DSF_ATOL, max_abs


def example(name, seed=0, **over):
    torch.manual_seed(seed)
    return seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **over})


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def softmax_map(T=24, seed=0, **over):
    m = example("softmax_attention", seed, **over)
    x = torch.randn(1, T, m.d_model, generator=torch.Generator().manual_seed(seed + 1))
    with torch.no_grad():
        return m.phi(x)[0]  # [heads, T, T]


# ------------------------------------------------------------------------------------------
# numbers with known answers
# ------------------------------------------------------------------------------------------


def test_softmax_map_distance_to_itself_is_zero_and_to_others_is_not():
    P = softmax_map()
    d = map_distance(P, P[0])
    assert float(d["frobenius"][0]) == 0 and float(d["kl"][0]) == 0 and float(d["frobenius_rel"][0]) == 0
    assert float(d["frobenius"][1]) > 1e-3 and float(d["kl"][1]) > 1e-4  # head 1 differs from head 0
    # Frobenius is the plain matrix norm of the difference; KL is of the row profiles
    Q = softmax_map(seed=3)[0]
    d = map_distance(Q, P[0])
    assert abs(float(d["frobenius"]) - float(torch.linalg.matrix_norm(Q.double() - P[0].double()))) < DSF_ATOL
    p, q = P[0].double(), Q.double()
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)  # float32 rows sum to 1 only to rounding
    kl = sum(float((p[t, : t + 1] * (p[t, : t + 1] / q[t, : t + 1]).log()).sum()) for t in range(p.shape[0])) / p.shape[0]
    assert abs(float(d["kl"]) - kl) < 1e-9
    # a scaled map has the same profile: KL 0, Frobenius not
    d = map_distance(3 * P[0], P[0])
    assert float(d["kl"]) < 1e-12 and abs(float(d["frobenius_rel"]) - 2) < 1e-6


def test_effective_rank_known_cases():
    T = 40
    assert abs(float(effective_rank(torch.eye(T))) - T) < 1e-9
    signs = torch.where(torch.rand(T) > 0.5, 1.0, -1.0)
    assert abs(float(effective_rank(torch.diag(0.3 * signs))) - T) < 1e-9  # a diagonal map of equal magnitudes
    u, v = torch.randn(T, 1, dtype=torch.float64), torch.randn(1, T, dtype=torch.float64)
    assert abs(float(effective_rank(u @ v)) - 1) < 1e-6
    assert float(effective_rank(torch.zeros(T, T))) == 0
    assert 1 < float(effective_rank(torch.diag(torch.linspace(1, 10, T)))) < T  # unequal entries: less than T
    # per map
    r = effective_rank(torch.stack([torch.eye(T), u @ v]))
    assert r.shape == (2,) and abs(float(r[0]) - T) < 1e-9


@pytest.mark.parametrize("w", [1, 4, 9])
def test_window_attention_has_all_its_mass_in_the_band(w):
    P = softmax_map(T=32, window=w)
    assert bool((band_mass(P, w) > 1 - 1e-6).all())
    if w > 1:
        assert bool((band_mass(P, w - 1) < 1 - 1e-3).all())
    assert float(band_mass(softmax_map(T=32), w).max()) < 1 - 1e-3  # full attention spreads beyond it
    assert float(lag_quantile(P, 1.0).max()) <= w


def test_lag_quantile_and_band_on_simple_maps():
    T = 16
    assert float(lag_quantile(torch.eye(T))) == 1
    assert float(band_mass(torch.eye(T), 1)) == 1
    shift = torch.diag(torch.ones(T - 3), -3)  # every row t looks exactly 3 back
    assert float(lag_quantile(shift)) == 4 and float(band_mass(shift, 3)) == 0 and float(band_mass(shift, 4)) == 1


def test_decay_summary_counts():
    T = 12
    g = torch.Generator().manual_seed(0)
    # one scalar per step repeated over every state: attention (1 value, 1 parameter)
    a = torch.rand(T, 1, generator=g, dtype=torch.float64)
    s = decay_summary(a.expand(T, 20))
    assert (s["N"], s["distinct_values"], s["trajectories"], s["parameters"], s["time_varying"]) == (20, 1, 1, 1, True)
    # S6-like: log Λ = -Δ_t^c A_n, d = 3 channels, n = 4 states: 12 values, 3 parameters
    delta = torch.rand(T, 3, 1, generator=g, dtype=torch.float64) + 0.1
    A = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    lam = torch.exp(-delta * A).reshape(T, 12)
    s = decay_summary(lam)
    assert (s["distinct_values"], s["trajectories"], s["parameters"]) == (12, 12, 3)
    # time-invariant: no parameters that change, memory = -1/log a exactly
    const = torch.tensor([0.5, 0.9, 0.9], dtype=torch.float64).expand(T, 3)
    s = decay_summary(const)
    assert (s["distinct_values"], s["trajectories"], s["parameters"], s["time_varying"]) == (2, 2, 0, False)
    tau = memory_lengths(const)
    assert max_abs(tau, torch.tensor([-1 / math.log(0.5), -1 / math.log(0.9), -1 / math.log(0.9)], dtype=torch.float64)) < 1e-12
    assert s["memory"] == float(tau.median())
    assert math.isinf(float(memory_lengths(torch.ones(T, 2))[0]))  # no decay: remembers forever
    # complex: the same modulus, different phases are different values
    z = torch.polar(torch.full((T, 2), 0.9, dtype=torch.float64), torch.tensor([[0.1, 0.2]], dtype=torch.float64).expand(T, 2))
    assert decay_summary(z)["distinct_values"] == 2
    # order: distinct trajectories by increasing memory
    s = decay_summary(lam)
    taus = memory_lengths(lam)[s["order"]]
    assert bool((taus[1:] >= taus[:-1]).all()) and len(s["order"]) == s["trajectories"]


def test_count_distinct_tolerance():
    pts = torch.tensor([[0.0, 1e-9, 0.5, 0.5 + 1e-3, 1.0]], dtype=torch.float64)
    n, reps = count_distinct(pts)
    assert int(n) == 4 and len(reps) == 4


@pytest.mark.parametrize("name", ["separable_attention", "linear_attention", "s6", "s4d"])
def test_decay_parameters_of_mixers(name):
    """The DSF paper's count of Λ's input-dependent parameters: 1 for attention, heads for multi-head
    attention, d for S6; 0 for a time-invariant SSM."""
    m = example(name, **({"heads": 1} if name == "linear_attention" else {}))
    x = torch.randn(1, 20, m.d_model)
    with torch.no_grad():
        s = decay_summary(m.decays(x)[0])
    want = {"separable_attention": m.config.heads if name == "separable_attention" else None, "linear_attention": 1,
            "s6": getattr(m, "d_inner", None), "s4d": 0}[name]
    assert s["parameters"] == want
    if name == "separable_attention":
        assert m.config.heads == 2 and s["distinct_values"] == 2
    if name == "s4d":
        assert not s["time_varying"]


def test_check_seq_len_says_memory_and_a_smaller_T():
    check_seq_len(256, 64)  # 16 MiB: fine
    with pytest.raises(ValueError, match=r"argument 'seq_len' = 100000 .* 64 map\(s\) of 100000×100000, which take 2.33 TiB .*use seq_len <= 2048"):
        check_seq_len(100_000, 64, max_bytes=2**30)


# ------------------------------------------------------------------------------------------
# Mixer.decays over the registry (the contract addition)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [e.name for e in seqmix.list_mixers()])
def test_decays_is_the_dsf_transition(name):
    m = example(name).double()
    x = torch.randn(2, 9, m.d_model, dtype=torch.float64)
    with torch.no_grad():
        lam = m.decays(x)
        if not m.finite_state:
            assert lam is None
            return
        system = m.dsf(x)
    assert lam.shape == (2, 9, system.N)
    assert float((lam - system.lam).abs().max()) == 0


def test_dsf_builds_B_and_C_only_when_read():
    q, k = torch.randn(1, 5, 2, 3, dtype=torch.float64), torch.randn(1, 5, 2, 3, dtype=torch.float64)
    system = seqmix.DSF.from_recurrence(q, k, 4, gk=-torch.rand(1, 5, 2, 3, dtype=torch.float64))
    assert system._B is None and system._C is None and (system.d_in, system.d_out, system.N) == (8, 8, 24)
    eager = seqmix.DSF(system.lam, system.B, system.C)
    assert system._B is not None and float((eager.blocks() - system.blocks()).abs().max()) == 0


# ------------------------------------------------------------------------------------------
# the pictures
# ------------------------------------------------------------------------------------------

T_PIC = 24


@pytest.fixture(scope="module")
def views_and_mixers():
    inp = show.make_input("mqar", T_PIC, seed=3)
    # the softmax attention of the reference (registry defaults, same seed and width) and two example mixers
    mixers = [show.build_for_show("softmax_attention", seed=3, d_model=16), example("s6"), example("gla")]
    return show.inspect_mixers(mixers, inp, seed=3), mixers, inp


def images(fig, prefix):
    return {im.get_gid(): im for im in fig.findobj(AxesImage) if (im.get_gid() or "").startswith(prefix)}


def test_figure_png_has_the_expected_pixel_size(views_and_mixers, tmp_path):
    views, _, _ = views_and_mixers
    for dpi in (50, 80):
        fig = show.show_figure(views, dpi=dpi)
        path = tmp_path / f"maps{dpi}.png"
        path.write_bytes(show.figure_png(fig))
        assert path.is_file() and path.stat().st_size > 1000
        assert png_size(path.read_bytes()) == show.figure_size_px(len(views), dpi) == (round(4.0 * 3 * dpi), round(10.0 * dpi))


@pytest.mark.parametrize("log", [False, True])
def test_plotted_maps_are_phi_of_x(views_and_mixers, log):
    """The arrays of the figure's image artists are mixer.phi(x) on the embedded input, computed here again."""
    views, mixers, inp = views_and_mixers
    fig = show.show_figure(views, log=log, max_maps=3)
    show.figure_png(fig)  # drawn
    ims = images(fig, "phi:")
    for v, m in zip(views, mixers):
        x = show.embed(inp, m.d_model, seed=3)
        with torch.no_grad():
            phi = m.phi(x)[0]
        k = min(3, phi.shape[0])
        for i in range(k):
            arr = ims[f"phi:{v.label}:{i}"].get_array()
            assert arr.shape == (T_PIC, T_PIC)
            assert float((torch.from_numpy(arr.data) - phi[i]).abs().max()) == 0
        assert f"phi:{v.label}:{k}" not in ims
    # a different input gives a different picture (the test can fail)
    x2 = show.embed(show.make_input("random", T_PIC, seed=9), mixers[1].d_model, seed=9)
    with torch.no_grad():
        other = mixers[1].phi(x2)[0, 0]
    assert float((torch.from_numpy(ims[f"phi:{views[1].label}:0"].get_array().data) - other).abs().max()) > 1e-6


def test_plotted_decay_spectrum_is_the_mixers_decays(views_and_mixers):
    views, mixers, inp = views_and_mixers
    fig = show.show_figure(views)
    ims = images(fig, "decays:")
    assert "decays:softmax_attention" not in ims  # no finite DSF: nothing plotted
    for v, m in zip(views[1:], mixers[1:]):
        with torch.no_grad():
            mag = m.decays(show.embed(inp, m.d_model, seed=3))[0].abs().double()  # [T, N]
        arr = torch.from_numpy(ims[f"decays:{v.label}"].get_array().data)  # [rows, T]: rows are columns of |Λ|
        assert arr.shape[1] == T_PIC and arr.shape[0] == min(show.SPECTRUM_ROWS, v.decay["trajectories"])
        for row in arr:
            assert float((mag - row.unsqueeze(1)).abs().amax(0).min()) == 0


def test_overview_figure_draws_each_mixers_first_map_and_its_spectrum(views_and_mixers):
    """overview_figure (the README's and the gallery's picture): one column per mixer holding
    phi(x)[0, 0] and the same spectrum rows as show_figure; no spectrum for a mixer without a DSF."""
    views, mixers, inp = views_and_mixers
    fig = show.overview_figure(views, dpi=40, titles=[v.label.upper() for v in views])
    assert png_size(show.figure_png(fig)) == (round(show.OVERVIEW_INCHES[0] * 3 * 40), round(show.OVERVIEW_INCHES[1] * 40))
    phis, decays = images(fig, "phi:"), images(fig, "decays:")
    full = images(show.show_figure(views), "decays:")
    for v, m in zip(views, mixers):
        with torch.no_grad():
            phi = m.phi(show.embed(inp, m.d_model, seed=3))[0, 0]
        assert float((torch.from_numpy(phis[f"phi:{v.label}"].get_array().data) - phi).abs().max()) == 0
        if v.lam is None:
            assert f"decays:{v.label}" not in decays
        else:
            assert (decays[f"decays:{v.label}"].get_array().data == full[f"decays:{v.label}"].get_array().data).all()
    assert {t.get_text() for t in fig.texts} >= {v.label.upper() for v in views}
    with pytest.raises(ValueError, match="argument 'titles'"):
        show.overview_figure(views, titles=["one"])
    with pytest.raises(ValueError, match="argument 'subtitles'"):
        show.overview_figure(views, subtitles=[])


def test_view_numbers_match_the_functions(views_and_mixers):
    views, mixers, inp = views_and_mixers
    ref = show.softmax_reference(show.embed(inp, mixers[0].d_model, seed=3), seed=3)
    softmax = views[0]
    assert softmax.numbers["frobenius"] == 0 and softmax.numbers["kl"] == 0  # same seed, same width: the reference itself
    v = views[2]
    assert abs(v.numbers["kl"] - float(map_distance(v.phi, ref)["kl"].mean())) < 1e-12
    assert abs(v.numbers["band_mass"] - float(band_mass(v.phi, v.band).mean())) < 1e-12
    assert v.conditions is not None and v.conditions.label == "{Q, K, Λ_t}"
    assert v.state_size == mixers[2].state_size(T_PIC) and v.decay["N"] == mixers[2].dsf(show.embed(inp, 16, seed=3)).N
    facts = dict(v.facts())
    assert facts["DSF state N"] == f"{v.decay['N']:,}" and facts["parameter groups"] == "{Q, K, Λ_t}"
    assert dict(views[0].facts())["DSF state N"].startswith("∞")


def test_reference_can_be_a_shown_mixer():
    inp = show.make_input("random", 16)
    a, b = example("linear_attention", heads=1), example("gla")
    views = show.inspect_mixers([a, b], inp, reference="linear_attention")
    assert views[0].numbers["kl"] == 0 and views[0].numbers["frobenius"] == 0  # one head: the reference is its map
    assert views[1].numbers["kl"] > 1e-3
    views = show.inspect_mixers([a, b], inp, reference="gla")
    assert views[0].numbers["kl"] > 1e-3 and views[1].numbers["kl"] > 0  # gla's heads against their mean
    with pytest.raises(ValueError, match="'reference'"):
        show.inspect_mixers([a, b], inp, reference="s6")


@pytest.mark.parametrize("name", list(THEORY_FIGURES))
def test_theory_figures_render_and_show_the_theory(name, tmp_path):
    fig, data = THEORY_FIGURES[name](dpi=60)
    png = show.figure_png(fig)
    w, h = fig.get_size_inches()
    assert png_size(png) == (round(w * 60), round(h * 60))
    if name == "lemma1":
        errs = [r["map_error"] for r in data]
        assert all(b < a for a, b in zip(errs, errs[1:])) and errs[-1] < 1e-6
    elif name == "equivalence":
        assert data["met"]["condition"]["holds"] and data["met"]["map_difference"] < DSF_ATOL
        assert not data["broken"]["condition"]["holds"] and data["broken"]["map_difference"] > 1e-3
    else:
        assert data["fit_error"] < DSF_ATOL and bool(((data["alpha"] >= 0) & (data["alpha"] <= 1)).all())
        assert float(data["fixed_keys"].max()) > float((1 - data["alpha"]).max())  # a fixed decay needs larger keys


# ------------------------------------------------------------------------------------------
# the HTML report
# ------------------------------------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Checker(HTMLParser):
    """Well-formedness (every non-void element closed in order) and the resources a page uses."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.images, self.links, self.tags = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.images.append(a)
        for key in ("href", "src"):
            if key in a and tag != "img":
                self.links.append(a[key])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
        else:
            self.stack.pop()


def check_html(text: str) -> Checker:
    c = Checker()
    c.feed(text)
    c.close()
    assert not c.errors and not c.stack, (c.errors, c.stack)
    assert text.startswith("<!DOCTYPE html>") and c.tags[:3] == ["html", "head", "meta"]
    assert not c.links, f"external resources: {c.links}"
    return c


@pytest.fixture(scope="module")
def report(views_and_mixers, tmp_path_factory):
    views, _, inp = views_and_mixers
    fig, _ = THEORY_FIGURES["stick_breaking"](dpi=50)
    path = tmp_path_factory.mktemp("report") / "report.html"
    show.write_html(path, views, theory={"stick_breaking": fig}, input_description=inp.description, dpi=50)
    return path, views


def test_html_report_is_well_formed_and_self_contained(report):
    path, views = report
    text = path.read_text(encoding="utf-8")
    c = check_html(text)
    assert len(c.images) == len(views) + 1
    for img in c.images:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1], validate=True)
        w, h = png_size(png)
        assert w > 100 and h > 100
    assert png_size(base64.b64decode(c.images[0]["src"].split(",", 1)[1])) == show.figure_size_px(1, 50)
    for v in views:
        assert f"<td>{v.label}</td>" in text
    # a broken report is caught by the checker
    with pytest.raises(AssertionError):
        check_html(text.replace("</table>", "", 1))


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_html_report_opens_in_headless_chromium(report, tmp_path):
    path, views = report
    r = dump_dom(path, tmp_path / "profile")
    assert r.returncode == 0, r.stderr[-2000:]
    console = console_lines(r)  # page errors and console output
    assert not console, console
    n = len(views) + 1
    assert f'data-images-decoded="{n}/{n}"' in r.stdout, r.stdout[:500]
    widths = check_in_browser(path, tmp_path, n)  # every image decoded, the screenshot not blank
    assert widths[0] == show.figure_size_px(1, 50)[0]
    # the check can fail: a corrupted image is reported
    bad = tmp_path / "bad.html"
    bad.write_text(path.read_text(encoding="utf-8").replace("base64,iVBOR", "base64,AAAA", 1), encoding="utf-8")
    r = dump_dom(bad, tmp_path / "profile")
    assert f'data-images-decoded="{n - 1}/{n}"' in r.stdout and console_lines(r)
    assert image_widths(bad, tmp_path / "profile")[0] == 0


# ------------------------------------------------------------------------------------------
# inputs, checkpoints
# ------------------------------------------------------------------------------------------


def test_inputs():
    r = show.make_input("random", 50, seed=1)
    assert r.T == 50 and int(r.tokens.max()) < r.vocab
    assert bool((show.make_input("random", 50, seed=1).tokens == r.tokens).all())
    t = show.make_input("text", 256, text="héllo")
    assert t.T == 6 and t.tokens.tolist() == list("héllo".encode())
    assert show.make_input("text", 3, text="hello").T == 3
    toks = show.mqar_tokens(64, num_kv_pairs=8, seed=0)
    keys, values = toks[:16:2], toks[1:16:2]
    assert bool((keys >= 1).all() and (keys < 4096).all() and (values >= 4096).all())
    queries = toks[16:]
    assert sorted(queries[queries > 0].tolist()) == sorted(keys.tolist())  # each key queried once
    # the harness's generator, not a copy: the same example as seqmix.data's MQAR with this seed
    from seqmix.data.mqar import multiquery_ar

    same = multiquery_ar(np.random.default_rng(0), num_examples=1, vocab_size=8192, seq_len=64, num_kv_pairs=8)
    assert toks.tolist() == same.inputs[0].tolist()
    with pytest.raises(ValueError, match="'seq_len' = 63.*must be even"):
        show.mqar_tokens(63, num_kv_pairs=8)
    x = show.embed(r, 8)
    assert x.shape == (1, 50, 8) and bool((x[0, r.tokens == r.tokens[0]] == x[0, 0]).all())
    with pytest.raises(ValueError, match="unknown input 'images'"):
        show.make_input("images", 10)
    with pytest.raises(ValueError, match="'text'"):
        show.make_input("text", 10)
    with pytest.raises(ValueError, match="'seq_len'"):
        show.make_input("random", 0)


def test_checkpoint_round_trip_and_refusals(tmp_path):
    trained = example("s6", seed=5)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.1)
    path = tmp_path / "s6.pt"
    show.save_mixer_checkpoint(trained, path)
    (loaded,), (src,) = show.mixers_for_show(["s6"], checkpoints=[str(path)])
    x = torch.randn(1, 10, trained.d_model)
    assert max_abs(loaded.phi(x), trained.phi(x)) == 0 and "checkpoint" in src
    torch.save(trained.state_dict(), tmp_path / "bare.pt")  # a bare state dict: needs the default config
    with pytest.raises(ValueError, match=r"argument 'checkpoint': the tensors of .* do not fit mixer 's6' \(.*shape mismatch"):
        show.load_mixer_checkpoint("s6", tmp_path / "bare.pt")
    show.save_mixer_checkpoint(example("gla"), tmp_path / "gla.pt")
    with pytest.raises(ValueError, match="argument 'checkpoint': .* holds a 'gla' mixer, not 's6'"):
        show.load_mixer_checkpoint("s6", tmp_path / "gla.pt")
    with pytest.raises(ValueError, match="argument 'checkpoint': no such file"):
        show.load_mixer_checkpoint("s6", tmp_path / "nothing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="argument 'checkpoint': .* not a readable torch checkpoint"):
        show.load_mixer_checkpoint("s6", tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="argument 'checkpoint': .* MIXER=PATH"):
        show.assign_checkpoints(["s6", "gla"], [str(path)])
    assert show.assign_checkpoints(["s6", "gla", "s6"], ["s6=a", "s6=b"]) == ["a", None, "b"]


def test_overrides():
    assert show.parse_overrides(["heads=4", "scale=none", "dt_max=0.2", "block=true", "name=x=y"]) == {
        "heads": 4, "scale": None, "dt_max": 0.2, "block": True, "name": "x=y"}
    ms, _ = show.mixers_for_show(["gla", "s6"], overrides={"heads": 2, "d_state": 4}, d_model=32)
    assert ms[0].config.heads == 2 and ms[1].config.d_state == 4 and ms[0].d_model == ms[1].d_model == 32
    with pytest.raises(ValueError, match="argument 'set': no randomly initialized mixer shown has the config field.*'nope'"):
        show.mixers_for_show(["gla"], overrides={"nope": 1})
    with pytest.raises(ValueError, match="argument 'set' must be KEY=VALUE"):
        show.parse_overrides(["heads"])


# ------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------


def test_cli_writes_png_with_expected_size(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["show", "linear_attention", "s6", "-T", "32", "--d-model", "16", "--out", str(out), "--dpi", "40", "--theory", "lemma1"]) == 0
    text = capsys.readouterr().out
    assert "effective rank" in text and "linear_attention" in text and "wrote" in text
    assert png_size((out / "maps.png").read_bytes()) == show.figure_size_px(2, 40)
    assert (out / "lemma1.png").is_file()


def test_cli_out_file_png_writes_that_file_and_the_other_pictures_beside_it(tmp_path, capsys):
    """--out FILE.png is a file (the maps; a theory figure beside it as FILE-NAME.png), --out FILE.html
    with --html the report; a picture suffix the command does not write is refused before any work."""
    maps = tmp_path / "sub" / "maps_s6.png"
    assert main(["show", "s6", "-T", "16", "--d-model", "8", "--out", str(maps), "--dpi", "40", "--theory", "lemma1"]) == 0
    assert maps.is_file() and png_size(maps.read_bytes()) == show.figure_size_px(1, 40)
    assert (tmp_path / "sub" / "maps_s6-lemma1.png").is_file() and sorted(p.name for p in maps.parent.iterdir()) == [
        "maps_s6-lemma1.png", "maps_s6.png"]
    only_theory = tmp_path / "lemma.png"
    assert main(["show", "--theory", "lemma1", "--out", str(only_theory), "--dpi", "40"]) == 0
    assert only_theory.is_file()
    page = tmp_path / "page.html"
    assert main(["show", "s6", "-T", "16", "--d-model", "8", "--html", "--out", str(page), "--dpi", "40"]) == 0
    assert page.is_file() and len(check_html(page.read_text(encoding="utf-8")).images) == 1
    capsys.readouterr()
    assert main(["show", "s6", "-T", "16", "--out", str(tmp_path / "maps.svg")]) == 2
    assert "argument --out: this writes PNG files" in capsys.readouterr().err and not (tmp_path / "maps.svg").exists()
    assert main(["show", "s6", "-T", "16", "--html", "--out", str(tmp_path / "x.png")]) == 2
    assert "writes HTML files" in capsys.readouterr().err
    (tmp_path / "taken.png").mkdir()
    assert main(["show", "s6", "-T", "16", "--out", str(tmp_path / "taken.png")]) == 2
    assert "is a folder, expected a file name" in capsys.readouterr().err


def test_cli_html_report(tmp_path):
    out = tmp_path / "h"
    assert main(["show", "gla", "metala", "--input", "text", "--text", "a small text, a small test", "--d-model", "16",
                 "--html", "--out", str(out), "--dpi", "40", "--log"]) == 0
    c = check_html((out / "report.html").read_text(encoding="utf-8"))
    assert len(c.images) == 2
    assert not (out / "maps.png").exists()


@pytest.mark.parametrize("argv,needle", [
    (["show", "no_such_mixer"], "argument 'mixer': unknown mixer 'no_such_mixer'"),
    (["show", "s6", "-T", "100000"], "argument 'seq_len' = 100000 is too large for dense maps"),
    (["show", "s6", "--set", "nope=1"], "argument 'set'"),
    (["show", "s6", "--input", "text"], "argument 'text'"),
    (["show"], "argument 'MIXER'"),
    (["show", "s6", "--maps", "0"], "argument '--maps'"),
    (["show", "s6", "--checkpoint", "missing.pt"], "argument 'checkpoint': no such file"),
])
def test_cli_errors_are_one_line(argv, needle, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert err.startswith("seqmix show: error:")


def test_cli_checkpoint_of_another_mixer(tmp_path, capsys):
    show.save_mixer_checkpoint(example("gla"), tmp_path / "gla.pt")
    assert main(["show", "s6", "--checkpoint", f"s6={tmp_path / 'gla.pt'}", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "argument 'checkpoint'" in err and "holds a 'gla' mixer, not 's6'" in err


def test_too_large_T_error_says_memory_and_suggests(capsys, tmp_path):
    assert main(["show", "s6", "-T", "50000", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "GiB" in err and "use seq_len <= 2048" in err and "64 map(s)" in err
