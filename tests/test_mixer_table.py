"""docs/mixers.md is the generated DSF table of every registered mixer (seqmix.analysis.mixer_table)."""

from pathlib import Path

import pytest

import seqmix
from seqmix.analysis import model_maps
from seqmix.analysis.mixer_table import (
    BEGIN, END, GROWTH, MIXER_TABLE_COLUMNS, missing_lambda_structure, mixer_table, mixer_table_markdown, state_growth,
    update_docs,
)

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
