"""Reproduction presets: the grid, validation of mixers and fields at run time, claims,
and reproduce() end to end on a small preset built from linear attention."""

import json

import pytest

import seqmix
from seqmix.experiments import PRESETS, Claim, ModelSpec, Preset, Scale, TaskSpec, evaluate_claims, reproduce
from seqmix.experiments.base import LR_DSF
from seqmix.experiments.presets import DSF_FIG2, MAIN_LRS, TINY_N, tiny_mqar

#: the registry names every developer uses (BRIEF.md)
CANONICAL = set("""softmax_attention separable_attention linear_attention generalized_linear_attention normalized_attention
s4 s4d s6 mamba ssd mamba2 dsf_ssd general_form linformer retnet transnormer gla mamba_gf rwkv4 hgrn rg_lru lru
qlstm qlstm_rs qlstm_block qlstm_rs_block metala h3 hyena gss bmojo bmojo_f strip_mamba bilinear_mamba
deltanet gated_deltanet kda""".split())


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _mini(**kw) -> Preset:
    data = tiny_mqar(16, 2, train=96, test=32, batch_size=32)
    return Preset(
        name="mini", title="mini", source="test", x="d_model",
        models=[ModelSpec(label="lin", mixer="linear_attention", state_field="n"),
                ModelSpec(label="lin-fixed", mixer="linear_attention", mixer_kwargs={"n": 4})],
        scales={"tiny": Scale(tasks=[TaskSpec(name="mqar(16,2)", data=data)], d_models=[8, 16], ns=[4, 8], lrs=[1e-3, 3e-3],
                              seeds=[0, 1], train={"epochs": 1, "threads": 1}, model={"channel_mixer": "none"})},
        claims=[Claim(text="lin is not below lin-fixed", check="not_below", a="lin", b="lin-fixed", value=1.0)], **kw)


def test_every_preset_names_canonical_mixers_and_builds_its_data():
    assert set(PRESETS) == {"dsf-fig1", "dsf-fig2", "dsf-fig3", "dsf-table2", "metala-table-a7", "bmojo-table3",
                            "bmojo-fig2", "bmojo-fig2-me", "dsf-table1-lm", "dsf-table3", "metala-lra", "lra-tiny"}
    for p in PRESETS.values():
        assert set(p.mixers()) <= CANONICAL, p.name
        assert set(p.scales) == ({"tiny", "small", "gpu", "paper"} if p.name == "dsf-fig2" else {"tiny", "paper"})
        labels = [m.label for m in p.models]
        for c in p.claims:
            assert c.a in labels and (c.b is None or c.b in labels), (p.name, c.text)


def test_grid_of_a_preset():
    p = _mini()
    runs = p.runs("tiny")
    # lin: 2 d × 2 n × 2 lr × 2 seeds; lin-fixed has no state field: n is not swept for it
    assert len(runs) == 16 + 8
    lin = [r for r in runs if r.label == "lin"]
    assert {(r.model.d_model, r.model.mixer_kwargs["n"], r.tags["n"]) for r in lin} == {(d, n, n) for d in (8, 16) for n in (4, 8)}
    fixed = [r for r in runs if r.label == "lin-fixed"]
    assert all(r.tags["n"] is None and r.model.mixer_kwargs == {"n": 4} for r in fixed)
    assert all(r.experiment == "mini/tiny" and r.model.channel_mixer == "none" and r.train.epochs == 1 for r in runs)
    assert len({r.run_id for r in runs}) == len(runs)


def test_missing_mixers_are_reported_at_run_time_not_import():
    assert DSF_FIG2.missing_mixers() == []  # every mixer of the paper presets is registered now
    ghost = _mini().model_copy(update={"models": [*_mini().models, ModelSpec(label="g", mixer="ghost_mixer"),
                                                  ModelSpec(label="h", mixer="mamba", model={"hybrid": [{"mixer": "ghost2"}]})]})
    assert ghost.missing_mixers() == ["ghost_mixer", "ghost2"]
    with pytest.raises(ValueError) as e:
        ghost.runs("tiny")
    msg = str(e.value)
    assert "2 mixer(s) not registered: ghost_mixer, ghost2" in msg and "--skip-missing" in msg
    assert {r.label for r in ghost.runs("tiny", skip_missing=True)} == {"lin", "lin-fixed"}


def test_skip_missing_runs_the_registered_models():
    runs = DSF_FIG2.runs("tiny", skip_missing=True)
    registered = {e.name for e in seqmix.list_mixers()}
    assert {r.model.mixer for r in runs} == {m.mixer for m in DSF_FIG2.models} & registered
    # the paper's protocol: every model sweeps the rates (the main job's three of np.logspace(-4, -2, 4)), in order
    assert DSF_FIG2.scales["tiny"].sweep_stop and DSF_FIG2.scales["tiny"].lr_select == "per_seed"
    assert [r.train.lr for r in runs if r.label == "S6" and r.model.d_model == 32 and r.train.seed == 0] == MAIN_LRS
    assert set(MAIN_LRS) < set(LR_DSF)
    lin = [r for r in runs if r.label == "linear"]
    assert [(r.model.d_model, r.train.lr, r.train.seed) for r in lin] == [
        (d, lr, s) for d in (32, 64) for lr in MAIN_LRS for s in (0, 1, 2)]
    for r in lin:
        assert r.model.mixer_kwargs == {"heads": 1, "n": TINY_N}
        assert r.data.train[0].seq_len == 32 and r.data.train[0].num_kv_pairs == 4 and r.data.vocab_size == 128
        assert r.experiment == "dsf-fig2/tiny"
    # init std per model (presets docstring, "Init"): 0.1 for softmax and linear attention in the tiny
    # scale, the papers' 0.02 for the others and for every model of the paper scale
    assert {r.label: r.model.init_std for r in runs} == {"softmax": 0.1, "linear": 0.1, "normalized": 0.02, "S6": 0.02, "SSD": 0.02}
    assert {r.model.init_std for r in DSF_FIG2.runs("paper", skip_missing=True)} == {0.02}


def test_learning_rates_by_model():
    p = _mini()
    p = p.model_copy(update={"scales": {"tiny": p.scales["tiny"].model_copy(update={"lrs_by_model": {"lin-fixed": [1e-2]}})}})
    runs = p.runs("tiny")
    assert {r.train.lr for r in runs if r.label == "lin-fixed"} == {1e-2}
    assert {r.train.lr for r in runs if r.label == "lin"} == {1e-3, 3e-3}
    bad = p.model_copy(update={"scales": {"tiny": p.scales["tiny"].model_copy(update={"lrs_by_model": {"nope": [1e-2]}})}})
    with pytest.raises(ValueError, match="lrs_by_model names 'nope'"):
        bad.runs("tiny")


def test_learning_rates_by_task():
    """TaskSpec.lrs: every model's rates on that task, over the scale's lrs and lrs_by_model; a model's own
    lr in per_model still wins; a task without lrs keeps the scale's."""
    from seqmix.experiments.base import TaskModel

    p = _mini()
    sc = p.scales["tiny"].model_copy(update={"lrs_by_model": {"lin-fixed": [1e-2]}})

    def rates(task):
        grid = p.model_copy(update={"scales": {"tiny": sc.model_copy(update={"tasks": [task]})}}).runs("tiny")
        return {lab: {r.train.lr for r in grid if r.label == lab} for lab in ("lin", "lin-fixed")}

    plain = sc.tasks[0]
    assert rates(plain) == {"lin": {1e-3, 3e-3}, "lin-fixed": {1e-2}}
    assert rates(plain.model_copy(update={"lrs": [5e-4]})) == {"lin": {5e-4}, "lin-fixed": {5e-4}}
    own = plain.model_copy(update={"lrs": [5e-4], "per_model": {"lin": TaskModel(lr=2e-2)}})
    assert rates(own) == {"lin": {2e-2}, "lin-fixed": {5e-4}}


def test_bad_fields_and_names_are_reported():
    bad_field = _mini().model_copy(update={"models": [ModelSpec(label="x", mixer="linear_attention", state_field="d_state")]})
    with pytest.raises(ValueError, match="state_field 'd_state'"):
        bad_field.runs("tiny")
    bad_kw = _mini().model_copy(update={"models": [ModelSpec(label="x", mixer="linear_attention", mixer_kwargs={"heads": 3})]})
    with pytest.raises(ValueError, match="heads"):
        bad_kw.runs("tiny")
    with pytest.raises(ValueError, match="unknown scale"):
        _mini().runs("huge")
    with pytest.raises(ValueError, match="unknown model"):
        _mini().runs("tiny", ["nope"])


def _rows(values: dict, x="d_model"):
    return [{"experiment": "e", "label": lab, "task": "t", "d_model": d, "n": None, "lr": 1e-3, "accuracy": a,
             "std": 0.0, "seeds": 1, "state_size": 1, "params": 1, "epochs": 1, "wall_time": 1.0, "mixer": "m"}
            for lab, series in values.items() for d, a in series.items()]


@pytest.mark.parametrize("claim,values,verdict", [
    (Claim(text="", check="at_least", a="s", value=0.99), {"s": {16: 1.0, 32: 0.995}}, "agrees"),
    (Claim(text="", check="at_least", a="s", value=0.99), {"s": {16: 0.5, 32: 1.0}}, "does not agree"),
    (Claim(text="", check="at_least", a="s", value=0.99, where="max"), {"s": {16: 0.5, 32: 1.0}}, "agrees"),
    (Claim(text="", check="above", a="a", b="b", where="mean"), {"a": {16: 0.9, 32: 0.3}, "b": {16: 0.5, 32: 0.5}}, "agrees"),
    (Claim(text="", check="above", a="a", b="b"), {"a": {16: 0.9, 32: 0.3}, "b": {16: 0.5, 32: 0.5}}, "does not agree"),
    (Claim(text="", check="not_below", a="a", b="b", value=0.02, where="mean"), {"a": {16: 0.49}, "b": {16: 0.5}}, "agrees"),
    (Claim(text="", check="close", a="a", b="b", value=0.05, where="mean"), {"a": {16: 0.4}, "b": {16: 0.5}}, "does not agree"),
    (Claim(text="", check="increasing", a="a", value=0.02), {"a": {16: 0.3, 32: 0.29, 64: 0.8}}, "agrees"),
    (Claim(text="", check="increasing", a="a", value=0.02), {"a": {16: 0.3, 32: 0.2, 64: 0.8}}, "does not agree"),
    (Claim(text="", check="gap_shrinks", a="a", b="b"), {"a": {4: 0.3, 8: 0.9}, "b": {4: 1.0, 8: 1.0}}, "agrees"),
    (Claim(text="", check="above", a="a", b="missing"), {"a": {4: 0.3}}, "n/a"),
])
def test_claims(claim, values, verdict):
    p = _mini().model_copy(update={"claims": [claim]})
    out = evaluate_claims(p, _rows(values))
    assert [o["verdict"] for o in out] == [verdict]


def _budget_rows(points: dict):
    """points: label -> [(d, state_size, accuracy)]"""
    rows = _rows({lab: {d: a for d, _, a in pts} for lab, pts in points.items()})
    sizes = {(lab, d): s for lab, pts in points.items() for d, s, _ in pts}
    for r in rows:
        r["state_size"] = sizes[(r["label"], r["d_model"])]
    return rows


@pytest.mark.parametrize("points,verdict", [
    # a at 100 floats beats every b point with <= 100 floats; b's 500-float point is out of a's budget
    ({"a": [(16, 100, 0.6)], "b": [(16, 80, 0.5), (32, 500, 0.9)]}, "agrees"),
    # b reaches 0.7 with 90 floats, more than a's 0.6 with 100
    ({"a": [(16, 100, 0.6)], "b": [(16, 90, 0.7), (32, 500, 0.9)]}, "does not agree"),
    # within the tolerance of 1 point
    ({"a": [(16, 100, 0.6)], "b": [(16, 90, 0.605)]}, "agrees"),
    # nothing of b fits a's budget
    ({"a": [(16, 100, 0.6)], "b": [(16, 200, 0.1)]}, "n/a"),
])
def test_not_dominated_claim(points, verdict):
    claim = Claim(text="", check="not_dominated", a="a", b="b", value=0.01)
    p = _mini().model_copy(update={"claims": [claim], "x": "state_size"})
    out = evaluate_claims(p, _budget_rows(points))
    assert [o["verdict"] for o in out] == [verdict]


def test_bmojo_fig2_grid_uses_patterns_and_scale_models():
    from seqmix.experiments.presets import BMOJO_FIG2, BMOJO_FIG2_ME

    tiny, paper = BMOJO_FIG2.runs("tiny"), BMOJO_FIG2.runs("paper")
    assert len(tiny) == 5 * 2 * 2 * 2 and len(paper) == 5 * 3 * 4 * 3  # tiny: 2 tasks, 2 seeds
    assert {r.data.train[0].num_kv_pairs for r in tiny} == {4, 8}
    hybrid = next(r for r in tiny if r.label == "Hybrid")
    assert [(h.mixer, h.mixer_kwargs.get("window")) for h in hybrid.model.layers] == [("mamba", None), ("softmax_attention", 8)]
    assert not hybrid.model.use_positions
    transformer = next(r for r in tiny if r.label == "Transformer")
    assert transformer.model.use_positions and "window" not in transformer.model.layers[0].mixer_kwargs
    # the tiny scale's own Transformer: init std 0.1 (presets docstring, "Init"); the others keep 0.02
    assert transformer.model.init_std == 0.1 and transformer.train.lr == 1e-3 and hybrid.model.init_std == 0.02
    # the paper scale replaces the window and memory sizes of every model
    hybrid_p = next(r for r in paper if r.label == "Hybrid")
    assert hybrid_p.model.layers[1].mixer_kwargs["window"] == 32
    bm = next(r for r in paper if r.label == "B'MOJO")
    assert (bm.model.mixer_kwargs["window"], bm.model.mixer_kwargs["m_f"], bm.model.mixer_kwargs["m_e"]) == (32, 4, 16)
    me = BMOJO_FIG2_ME.runs("tiny")
    assert sorted({r.model.mixer_kwargs["m_e"] for r in me}) == [0, 2, 4, 8] and {r.tags["n"] for r in me} == {0, 2, 4, 8}
    assert sorted({r.model.mixer_kwargs["m_e"] for r in BMOJO_FIG2_ME.runs("paper")}) == [0, 2, 4, 8, 16, 24, 32]


def test_a_scale_model_must_belong_to_the_preset():
    p = _mini()
    sc = p.scales["tiny"].model_copy(update={"models": [ModelSpec(label="other", mixer="linear_attention")]})
    with pytest.raises(ValueError, match="'other', which is not a model of the preset"):
        p.model_copy(update={"scales": {"tiny": sc}}).runs("tiny")


def test_reproduce_end_to_end(tmp_path, monkeypatch, capsys):
    small = _mini().model_copy(update={"scales": {"tiny": _mini().scales["tiny"].model_copy(
        update={"d_models": [8], "ns": [4], "lrs": [3e-3], "seeds": [0]})}})
    monkeypatch.setitem(PRESETS, "mini", small)
    from rich.console import Console

    con = Console(file=open(tmp_path / "log.txt", "w"), width=160)
    r = reproduce("mini", "tiny", out_dir=tmp_path / "out", workers=1, progress=False, console=con)
    assert r.failed == 0 and {row["label"] for row in r.rows} == {"lin", "lin-fixed"}
    assert r.plot.exists() and (tmp_path / "out" / "mini-tiny.md").read_text() == r.table
    assert "| lin |" in r.table and r.claims[0]["verdict"] == "agrees"
    log = (tmp_path / "log.txt").read_text()
    assert "the paper's claims" in log and "agrees" in log
    agree = sum(c["verdict"] == "agrees" for c in r.claims)
    assert f"verdict: {agree} of {len(r.claims)} claims agree" in log
    r2 = reproduce("mini", "tiny", out_dir=tmp_path / "out", workers=1, progress=False, console=con)
    assert r2.rows == r.rows  # every run was skipped, the same table
    assert "already finished" in (tmp_path / "log.txt").read_text()


@pytest.mark.parametrize("preset", ["bmojo-fig2", "bmojo-fig2-me"])
def test_every_model_of_the_bmojo_presets_trains(preset):
    """Each model of the preset's tiny grid (smallest d) builds and takes real training steps
    through the harness, on a shrunken copy of its data."""
    from seqmix.train import Trainer

    runs = PRESETS[preset].runs("tiny")
    seen = set()
    for r in sorted(runs, key=lambda r: r.model.d_model):
        if r.label in seen:
            continue
        seen.add(r.label)
        small = r.data.model_copy(update={
            "train": [t.model_copy(update={"num_examples": 32}) for t in r.data.train],
            "test": [t.model_copy(update={"num_examples": 16}) for t in r.data.test]})
        cfg = r.model_copy(update={"data": small, "train": r.train.model_copy(update={"epochs": 1, "threads": 1})})
        res = Trainer(cfg, progress=False).fit()
        assert res.steps == 2 and 0.0 <= res.accuracy <= 1.0 and res.history[0]["loss"] == res.history[0]["loss"], r.label
        assert res.state_size > 0
    assert seen == {m.label for m in PRESETS[preset].models}


def test_sweep_stop_runs_a_cells_rates_in_order_until_one_reaches_early_stop(tmp_path):
    """sweep_stop: wave k runs the k-th rate of each cell not yet at the early-stop accuracy. A
    cell whose first rate reached it has no run at the second rate, every other cell has; without
    early stopping every rate runs."""
    from rich.console import Console

    from seqmix.experiments import lr_waves
    from seqmix.train.store import ResultsStore

    def preset(early_stop):
        sc = _mini().scales["tiny"].model_copy(update={
            "d_models": [8], "ns": [4], "lrs": [1e-2, 1e-3], "seeds": [0, 1], "sweep_stop": True,
            "train": {"epochs": 1, "threads": 1, "early_stop": early_stop}})
        return _mini().model_copy(update={"name": "mini", "scales": {"tiny": sc}})

    configs = preset(1e-4).runs("tiny")
    waves = lr_waves(configs)
    assert [len(w) for w in waves] == [4, 4]  # 2 models × 2 seeds per wave
    assert {c.train.lr for c in waves[0]} == {1e-2} and {c.train.lr for c in waves[1]} == {1e-3}
    con = Console(file=open(tmp_path / "log.txt", "w"), width=160)
    for early_stop in (1e-4, None):
        out = tmp_path / f"out-{early_stop}"
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(PRESETS, "mini", preset(early_stop))
            r = reproduce("mini", "tiny", out_dir=out, workers=1, progress=False, console=con)
        stored = ResultsStore(out / "results.sqlite").rows()
        first = {(row["label"], row["seed"]): row["accuracy"] for row in stored if row["lr"] == 1e-2}
        second = {(row["label"], row["seed"]) for row in stored if row["lr"] == 1e-3}
        assert len(first) == 4
        if early_stop is None:
            assert len(second) == 4
        else:
            solved = {k for k, acc in first.items() if acc >= early_stop}
            assert solved and second == set(first) - solved
            assert f"round 2/2: {4 - len(solved)} runs ({len(solved)} cells already" in (tmp_path / "log.txt").read_text()
        log_lines = (tmp_path / "log.txt").read_text().splitlines()
        assert [ln for ln in log_lines if "acc " in ln][-1].endswith("done, none to go]")  # each run's line: the estimate
        for row in r.rows:
            assert set(row["per_seed_lr"].values()) <= {1e-2, 1e-3}
        saved = json.loads((out / "mini-tiny.json").read_text())
        assert saved["lr_select"] == "per_seed" and len(saved["cells"]) == len(r.rows)


def test_time_left_counts_the_runs_to_go_as_a_range_and_times_them_at_the_finished_runs_rate():
    """TimeLeft: after a run that reaches the early-stop accuracy, the runs to go are at least the
    rest of its round and at most that plus the later rates of the cells not yet solved; each is
    timed at the finished runs' seconds per unit of cost (equal costs here: seconds per run), shared
    by the workers. Runs finished before the call are neither run nor counted."""
    from types import SimpleNamespace

    from seqmix.experiments import TimeLeft, lr_waves

    sc = _mini().scales["tiny"].model_copy(update={
        "d_models": [8], "ns": [4], "lrs": [1e-2, 1e-3], "seeds": [0, 1], "sweep_stop": True,
        "train": {"epochs": 1, "threads": 1, "early_stop": 0.99}})
    configs = _mini().model_copy(update={"scales": {"tiny": sc}}).runs("tiny")
    waves = lr_waves(configs)  # 2 rounds of 4 runs (2 models × 2 seeds), all of one cost
    left = TimeLeft(waves, workers=1)
    left.start_round(0, waves[0])
    first = left.note(waves[0][0], SimpleNamespace(wall_time=60.0, accuracy=1.0))  # solved: its second rate drops out
    assert first == "  [1 done, 3-6 to go: about 3-6 min left]"
    second = left.note(waves[0][1], SimpleNamespace(wall_time=180.0, accuracy=0.5))  # not solved; mean 120 s a run
    assert second == "  [2 done, 2-5 to go: about 4-10 min left]"
    two = TimeLeft(waves, workers=2, done={waves[0][0].run_id})
    two.start_round(0, waves[0][1:])
    assert two.note(waves[0][1], SimpleNamespace(wall_time=60.0, accuracy=0.5)) == "  [1 done, 2-6 to go: about 1-3 min left]"
    assert two.note(waves[0][2], None) == "  [2 done, 1-5 to go: about 1-2 min left]"  # failed: counted, nothing learned from it
