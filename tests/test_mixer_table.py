"""docs/mixers.md is the generated DSF table of every registered mixer (seqmix.analysis.mixer_table)."""

from pathlib import Path

import pytest

import seqmix
from seqmix.analysis import model_maps
from seqmix.analysis.mixer_table import (
    BEGIN, END, GROWTH, MIXER_TABLE_COLUMNS, missing_lambda_structure, mixer_table, mixer_table_markdown, state_growth,
    update_docs,
)
from seqmix.analysis.model_maps import missing_norm_gate_rule, norm_and_gate
from seqmix.mixers.layers import LayerNorm, RMSNorm

DOCS = Path(__file__).resolve().parent.parent / "docs" / "mixers.md"


@pytest.fixture(scope="module")
def rows():
    return mixer_table()


def test_every_registered_mixer_has_a_lambda_structure():
    missing = missing_lambda_structure()
    assert not missing, (
        f"registered mixers without a Λ structure: {', '.join(missing)}; add an entry per name to LAMBDA_STRUCTURE "
        "in src/seqmix/analysis/model_maps.py, then run `python -m seqmix.analysis.mixer_table docs/mixers.md`"
    )


def test_a_mixer_without_lambda_structure_fails_naming_where(monkeypatch):
    name = seqmix.list_mixers()[0].name
    monkeypatch.delitem(model_maps.LAMBDA_STRUCTURE, name)
    assert missing_lambda_structure() == [name]
    with pytest.raises(ValueError, match=r"LAMBDA_STRUCTURE in src/seqmix/analysis/model_maps\.py") as e:
        mixer_table()
    assert name in str(e.value)


def test_every_registered_mixer_has_a_norm_gate_rule():
    missing = missing_norm_gate_rule()
    assert not missing, (
        f"registered mixers whose class has no entry in NORM_GATE_RULES: {', '.join(missing)}; add one (an empty one if the "
        "mixer has no functional norm and no gate) in src/seqmix/analysis/model_maps.py"
    )


def test_a_mixer_class_without_norm_gate_rule_fails_naming_where(monkeypatch):
    monkeypatch.delitem(model_maps.NORM_GATE_RULES, "Hyena")
    assert missing_norm_gate_rule() == ["hyena"]
    with pytest.raises(ValueError, match=r"hyena: add one per class to NORM_GATE_RULES in src/seqmix/analysis/model_maps\.py"):
        mixer_table()


def _example(name, **kw):
    return seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **kw})


def test_norm_and_gate_name_every_norm_module_and_gate(rows):
    """rwkv7, mamba3, gsa and mesanet (norms on o, B or C, per head or not): each norm module the mixer holds is
    named with what it acts on (never "none"), and each gate its config turns on."""
    by = {r["name"]: r for r in rows}
    for name in ("rwkv7", "mamba3", "gsa", "mesanet"):
        m = _example(name)
        mods = [(n, mod) for n, mod in m.named_children() if isinstance(mod, (RMSNorm, LayerNorm))]
        assert mods, name
        norm = by[name]["normalization"]
        assert norm == norm_and_gate(m)[0] != "none"
        for n, mod in mods:
            place = {"norm": "o", "B_norm": "B", "C_norm": "C"}[n]
            assert f"{type(mod).__name__} on " in norm and place in norm, (name, n, norm)
        groups = [getattr(mod, "groups", 1) for _, mod in mods]
        assert ("per head" in norm) == any(g == getattr(m, "H", 0) > 1 for g in groups), (name, norm)
    assert "l2(q, k)" in by["mesanet"]["normalization"] and "l2(κ̂)" in by["rwkv7"]["normalization"]
    # gates, from the modules and the config
    rw = _example("rwkv7")
    assert "output gate" in by["rwkv7"]["gating"] and hasattr(rw, "g1") and hasattr(rw, "g2")
    assert ("value-residual" in by["rwkv7"]["gating"]) == rw.config.value_residual
    assert "value-residual" not in norm_and_gate(_example("rwkv7", value_residual=False))[1]
    assert by["mamba3"]["gating"] == "SiLU(z) (block)"
    assert ("SiLU(o)" in by["gsa"]["gating"]) == (_example("gsa").config.output_act == "silu")
    assert norm_and_gate(_example("gsa", output_act="none"))[1] == "none"
    assert (by["mesanet"]["gating"] == "none") == (not _example("mesanet").config.gate)
    assert norm_and_gate(_example("mesanet", gate=True))[1] == "silu(x W_g)"


def test_norm_and_gate_follow_the_config():
    """A norm or gate the config turns off is not named; sub-mixers are read with their attribute name."""
    assert norm_and_gate(_example("ssd")) == ("none", "none")  # no block: no norm, no z (gate_norm is a block option)
    n, g = norm_and_gate(_example("mamba2"))
    assert "RMSNorm on o" in n and "inside the norm" in g
    assert "after the norm" in norm_and_gate(_example("mamba2", gate_norm="before_gate"))[1]
    fox = norm_and_gate(_example("fox", qk_norm=True, output_norm=True, output_gate=True))
    assert fox == ("qk-norm (RMSNorm per head); RMSNorm on o per head; softmax", "σ(x W_g) output gate")
    assert norm_and_gate(_example("fox")) == ("softmax", "none")
    assert norm_and_gate(_example("bmojo"))[1] == "ssm: SiLU(z) (block)"
    assert norm_and_gate(_example("falcon_mamba"))[0] == "RMSNorm on Δ, B, C (no weight)"
    assert norm_and_gate(_example("normalized_attention"))[0] == "normalizer η (exp)"


def test_docs_hold_the_generated_table(rows):
    text = DOCS.read_text(encoding="utf-8")
    table = mixer_table_markdown(rows)
    assert f"{BEGIN}\n{table}{END}" in text, (
        "docs/mixers.md is stale: run `python -m seqmix.analysis.mixer_table docs/mixers.md` (or `seqmix list --dsf`)"
    )


def test_one_row_per_registered_mixer(rows):
    assert [r["name"] for r in rows] == [e.name for e in seqmix.list_mixers()]
    for r in rows:
        assert list(r) == list(MIXER_TABLE_COLUMNS)
        assert r["lambda"] == model_maps.LAMBDA_STRUCTURE[r["name"]]
        assert r["growth"] in GROWTH
        assert r["modes"] and r["normalization"] and r["gating"]
    table = mixer_table_markdown(rows)
    assert len(table.strip().splitlines()) == len(rows) + 2


def test_state_columns(rows):
    by = {r["name"]: r for r in rows}
    # a fixed state: state_size() floats per sequence
    for name in ("mamba", "gla", "deltanet", "rwkv7"):
        e = seqmix.mixer_entry(name)
        m = seqmix.build_mixer(name, **e.example_config())
        assert by[name]["growth"] == "fixed" and by[name]["state"] == m.state_size() > 0 and by[name]["per_token"] is None
    # a KV cache: floats per token, = 2 · heads · head dim for plain softmax attention
    sa = seqmix.build_mixer("softmax_attention", **seqmix.mixer_entry("softmax_attention").example_config())
    assert by["softmax_attention"]["growth"] == "O(T)" and by["softmax_attention"]["state"] is None
    assert by["softmax_attention"]["per_token"] == sa.state_size(101) - sa.state_size(100) > 0
    # the log-linear mixers grow as log T
    for name in ("log_linear_mamba2", "log_linear_gdn"):
        assert by[name]["growth"] == "O(log T)" and by[name]["per_token"] > 0 and by[name]["state"] > by[name]["per_token"]


def test_state_growth_classifies():
    class Fixed:
        def state_size(self, T=None):
            return 7

    class Linear:
        def state_size(self, T=None):
            return 3 + 5 * T

    class Log:
        def state_size(self, T=None):
            return 4 * max(1, int(T).bit_length())

    assert state_growth(Fixed()) == ("fixed", 7, None)
    assert state_growth(Linear()) == ("O(T)", 0, 5)
    assert state_growth(Log()) == ("O(log T)", 4 * 13, 4)


def test_update_docs_rewrites_between_markers(tmp_path):
    p = tmp_path / "m.md"
    p.write_text(f"intro\n{BEGIN}\nold\n{END}\nafter\n", encoding="utf-8")
    assert update_docs(p) is True
    text = p.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith("after\n") and "old" not in text
    assert update_docs(p) is False
    p.write_text("no markers", encoding="utf-8")
    with pytest.raises(ValueError, match="markers"):
        update_docs(p)


def test_cli_list_dsf(capsys, rows):
    from seqmix.cli import main

    assert main(["list", "--dsf"]) == 0
    assert capsys.readouterr().out == mixer_table_markdown(rows)
