"""The harness subcommands: train, sweep, results, reproduce."""

import json

import pytest

from seqmix.cli import main

TINY = ["--seq-len", "16", "--kv", "2", "--vocab", "32", "--train-examples", "64", "--test-examples", "32",
        "--batch-size", "32", "--d-model", "16", "--epochs", "1", "--threads", "1", "--no-progress"]


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def test_train_then_results(tmp_path, capsys):
    out = str(tmp_path / "runs")
    assert main(["train", *TINY, "--mixer-kw", "n=8", "--out", out]) == 0
    text = capsys.readouterr().out
    assert "accuracy" in text and "tokens/s" in text and "state 272 floats" in text
    assert main(["results", "--db", f"{out}/results.sqlite"]) == 0
    table = capsys.readouterr().out
    assert "## train" in table and "| linear_attention |" in table and "d_model=16" in table
    assert main(["results", "--db", f"{out}/results.sqlite", "--format", "csv", "--plot", str(tmp_path / "p.png")]) == 0
    csv = capsys.readouterr().out
    assert csv.startswith("experiment,task,label") and (tmp_path / "p.png").exists()
    assert main(["results", "--db", f"{out}/results.sqlite", "--list"]) == 0
    assert "train: 1 runs" in capsys.readouterr().out
    for sel in ("median", "per_seed"):
        assert main(["results", "--db", f"{out}/results.sqlite", "--lr-select", sel, "--lr-criterion", "final"]) == 0
        assert "| linear_attention |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["results", "--db", f"{out}/results.sqlite", "--lr-select", "mean"])
    assert "--lr-select: invalid choice: 'mean'" in capsys.readouterr().err


@pytest.mark.parametrize("args,field", [
    (["--lr", "0"], "train.lr"),
    (["--lr", "-1"], "train.lr"),
    (["--kv", "5"], "num_kv_pairs"),
    (["--mixer", "nope"], "model.mixer"),
    (["--task", "nope"], "unknown task 'nope'"),
    (["--mixer-kw", "heads=3"], "mixer_kwargs"),
    (["--task-kw", "colour=1"], "colour"),
])
def test_bad_configs_fail_before_training(tmp_path, capsys, args, field):
    out = tmp_path / "runs"
    assert main(["train", *TINY, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seqmix train: error:") and field in err
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing generated, nothing trained


def test_reproduce_lists_presets_and_reports_missing_mixers(tmp_path, capsys, monkeypatch):
    assert main(["reproduce"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in ("dsf-fig1", "dsf-fig2", "dsf-fig3", "dsf-table2", "metala-table-a7", "bmojo-table3"))
    from seqmix.experiments import PRESETS, ModelSpec

    ghost = PRESETS["dsf-fig2"].model_copy(update={"name": "ghost", "models": [ModelSpec(label="g", mixer="ghost_mixer")]})
    monkeypatch.setitem(PRESETS, "ghost", ghost)
    assert main(["reproduce", "ghost", "--out", str(tmp_path)]) == 2
    assert "not registered: ghost_mixer" in capsys.readouterr().err
    assert main(["reproduce", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["reproduce", "dsf-fig2", "--scale", "huge"]) == 2
    assert "unknown scale" in capsys.readouterr().err


def test_sweep_json_list_of_runs(tmp_path, capsys):
    run = {
        "experiment": "js", "label": "lin",
        "data": {"train": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 64}],
                 "test": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 32}],
                 "batch_size": 32},
        "model": {"mixer": "linear_attention", "d_model": 16},
        "train": {"lr": 3e-3, "epochs": 1, "threads": 1},
    }
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([run, {**run, "train": {**run["train"], "lr": 1e-3}}]))
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"]) == 0
    assert main(["results", "--db", str(tmp_path / "o" / "results.sqlite"), "--all-lrs"]) == 0
    out = capsys.readouterr().out
    assert "## js" in out and "| lin lr=0.001 |" in out and "| lin lr=0.003 |" in out
