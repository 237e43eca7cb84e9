"""Bad input gets one short message naming the argument (issue 24, part 3).

Every class of mistake a user makes on the command line or in a config: missing, empty,
binary or malformed files, zero/negative sizes, non-numbers, unknown names, an output path
that cannot be written, corrupt or foreign folders. Each must end in exit status 2 with at
most 3 lines on stderr that name the argument, no traceback and no pydantic dump; and a
failed call must leave the user's files as they were.
"""

from __future__ import annotations

import json

import pytest

from seqmix.cli import main

#: what a readable error never shows
NOISE = ("Traceback", "function-after", "pydantic", "validation error", "errors.pydantic.dev", "kind=", "task=")

TINY_TASK = ["--seq-len", "16", "--kv", "2", "--vocab", "32", "--train-examples", "8", "--test-examples", "8",
             "--batch-size", "4", "--epochs", "1", "--d-model", "8", "--layers", "1", "--no-progress"]
TINY_LM = ["--max-steps", "1", "--seq-len", "8", "--d-model", "8", "--layers", "1", "--batch-size", "2",
           "--eval-batches", "1", "--no-progress", "--no-mfu"]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQMIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def bad(capsys, argv, *names) -> str:
    """Runs the CLI, expects a short error naming one of ``names``; returns the message."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, f"exit status {code}, stderr: {err}"
    lines = err.splitlines()
    assert 1 <= len(lines) <= 3, err
    assert err.startswith("seqmix "), err
    for word in NOISE:
        assert word not in err, f"{word!r} in {err!r}"
    assert any(n in err for n in names), f"none of {names} in {err!r}"
    return err


def files(tmp_path) -> dict:
    (tmp_path / "missing.json").unlink(missing_ok=True)
    out = {
        "binary": tmp_path / "binary.bin",
        "empty": tmp_path / "empty.txt",
        "malformed": tmp_path / "malformed.json",
        "list_of_int": tmp_path / "ints.json",
        "string": tmp_path / "string.json",
        "empty_object": tmp_path / "object.json",
        "text": tmp_path / "user.txt",
    }
    out["binary"].write_bytes(bytes(range(256)) * 4)
    out["empty"].write_text("")
    out["malformed"].write_text("{\"data\": 1,")
    out["list_of_int"].write_text("[1, 2]")
    out["string"].write_text("\"mqar\"")
    out["empty_object"].write_text("{}")
    out["text"].write_text("the user's own file\n")
    return out


# -- the config: one message that speaks of the kind of data the user chose ---------------------


@pytest.mark.parametrize("argv,name", [
    (["--corpus", "missing.txt"], "corpus"),
    (["--seq-len", "0"], "seq_len"),
    (["--seq-len", "-4"], "seq_len"),
    (["--bpe-vocab", "5", "--tokenizer", "bpe"], "bpe_vocab_size"),
    (["--tokenizer", "nope"], "tokenizer"),
    (["--tokenizer", "missing.json"], "tokenizer"),
    (["--batch-size", "0"], "batch_size"),
    (["--d-model", "0"], "d_model"),
    (["--layers", "-1"], "n_layers"),
    (["--mixer", "nope"], "mixer"),
    (["--pattern", "nope"], "model"),
    (["--lr", "0"], "lr"),
    (["--grad-accum", "0"], "grad_accum"),
    (["--warmup", "2"], "warmup"),
    (["--device", "nope"], "device"),
    (["--mixer-kw", "heads=abc"], "heads"),
    (["--betas", "x"], "--betas"),
])
def test_lm_train_config(capsys, tmp_path, argv, name):
    err = bad(capsys, ["lm", "train", *TINY_LM, "--out", tmp_path / "out", *argv], name)
    assert len(err) < 600, err  # the useful sentence, not 1,300 characters of union members
    assert not (tmp_path / "out").exists()  # nothing written for a config that fails


def test_lm_train_corpus_files(capsys, tmp_path):
    f = files(tmp_path)
    err = bad(capsys, ["lm", "train", *TINY_LM, "--corpus", f["binary"]], "corpus")
    assert "UTF-8" in err
    bad(capsys, ["lm", "train", *TINY_LM, "--corpus", f["binary"], "--tokenizer", "byte"], "corpus")
    assert "empty" in bad(capsys, ["lm", "train", *TINY_LM, "--corpus", f["empty"]], "corpus")
    (tmp_path / "nothing").mkdir()
    assert "*.txt" in bad(capsys, ["lm", "train", *TINY_LM, "--corpus", tmp_path / "nothing"], "corpus")
    bad(capsys, ["lm", "train", *TINY_LM, "--corpus", "hf:"], "corpus")
    # a tokenizer.json that is binary or not JSON
    tok = tmp_path / "tok.json"
    tok.write_bytes(b"\xff\xfe\x00")
    bad(capsys, ["lm", "train", *TINY_LM, "--tokenizer", tok], "tokenizer")
    tok.write_text("{")
    bad(capsys, ["lm", "train", *TINY_LM, "--tokenizer", tok], "tokenizer")


@pytest.mark.parametrize("argv,name", [
    (["--task", "nope"], "task"),
    (["--seq-len", "0"], "seq_len"),
    (["--kv", "0"], "num_kv_pairs"),
    (["--vocab", "3"], "vocab_size"),
    (["--batch-size", "0"], "batch_size"),
    (["--train-examples", "0"], "num_examples"),
    (["--task-kw", "foo=1"], "foo"),
    (["--task-kw", "foo"], "--task-kw"),
    (["--mixer", "nope"], "mixer"),
    (["--mixer-kw", "n=abc"], "'n'"),
    (["--channel-mixer", "nope"], "channel_mixer"),
    (["--positions", "nope"], "positions"),
    (["--epochs", "0"], "epochs"),
    (["--lr", "-1"], "lr"),
    (["--early-stop", "2"], "early_stop"),
    (["--threads", "0"], "threads"),
    (["--device", "nope"], "device"),
])
def test_train_config(capsys, tmp_path, argv, name):
    bad(capsys, ["train", *TINY_TASK, "--out", tmp_path / "out", *argv], name)
    assert not (tmp_path / "out").exists()


def test_a_task_error_names_the_segment(capsys, tmp_path):
    err = bad(capsys, ["train", *TINY_TASK, "--seq-len", "0"], "data.train[0].seq_len")
    assert "Extra inputs" not in err and "corpus" not in err  # nothing of the other kind of data


# -- config files: --config, sweep files, presets ---------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "binary", "empty", "malformed", "list_of_int", "empty_object", "folder"])
def test_run_config_file(tmp_path, kind):
    from seqmix.train import load_run_config

    f = files(tmp_path)
    path = {"missing": tmp_path / "missing.json", "folder": tmp_path}.get(kind) or f[kind]
    with pytest.raises(ValueError) as e:
        load_run_config(path)
    msg = str(e.value)
    assert "--config" in msg and len(msg.splitlines()) == 1 and not any(w in msg for w in NOISE), msg


@pytest.mark.parametrize("kind", ["missing", "binary", "empty", "malformed", "list_of_int", "string", "empty_object"])
def test_sweep_file(tmp_path, kind):
    from seqmix.experiments import load_sweep

    f = files(tmp_path)
    path = tmp_path / "missing.json" if kind == "missing" else f[kind]
    with pytest.raises(ValueError) as e:
        load_sweep(path)
    msg = str(e.value)
    assert "preset" in msg and len(msg.splitlines()) == 1 and not any(w in msg for w in NOISE), msg


def test_sweep_file_names_the_bad_entry(tmp_path):
    from seqmix.experiments import load_sweep

    good = {"data": {"train": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 8}],
                     "test": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 8}]},
            "model": {"mixer": "s6", "d_model": 8}}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([good, {**good, "model": {"mixer": "s6", "d_model": -1}}]))
    with pytest.raises(ValueError, match=r"runs\.json\[1\].*'model\.d_model'"):
        load_sweep(path)
    path.write_text(json.dumps([good]))
    configs, preset = load_sweep(path)
    assert len(configs) == 1 and preset is None


def test_unknown_preset_scale_model_workers(capsys, tmp_path):
    bad(capsys, ["sweep", "nope", "--out", tmp_path / "o"], "preset")
    bad(capsys, ["sweep", "dsf-fig2", "--scale", "nope", "--out", tmp_path / "o"], "scale")
    bad(capsys, ["sweep", "dsf-fig2", "--models", "nope", "--out", tmp_path / "o"], "model")
    bad(capsys, ["reproduce", "nope", "--dry-run"], "preset")
    bad(capsys, ["reproduce", "dsf-fig2", "--scale", "nope", "--dry-run"], "scale")
    bad(capsys, ["reproduce", "all", "--scale", "nope", "--dry-run"], "--scale")
    bad(capsys, ["reproduce", "dsf-fig2", "--workers", "0", "--dry-run"], "--workers")
    bad(capsys, ["reproduce", "dsf-fig2", "--threads", "-2", "--dry-run"], "--threads")
    assert not (tmp_path / "o").exists()


# -- mixers: list, info, table2, show ---------------------------------------------------------


def test_unknown_mixer_names(capsys, tmp_path):
    bad(capsys, ["info", "nope"], "nope")
    bad(capsys, ["table2", "nope"], "nope")
    bad(capsys, ["show", "nope", "--out", tmp_path / "o"], "nope")
    bad(capsys, ["show", "s6", "-T", "0", "--out", tmp_path / "o"], "seq_len")
    bad(capsys, ["show", "s6", "--set", "d_state=abc", "-T", "8", "--out", tmp_path / "o"], "d_state")
    bad(capsys, ["show", "s6", "--d-model", "0", "-T", "8", "--out", tmp_path / "o"], "d_model")
    bad(capsys, ["show", "s6", "--checkpoint", tmp_path / "missing.pt", "-T", "8", "--out", tmp_path / "o"], "checkpoint")
    f = files(tmp_path)
    bad(capsys, ["show", "s6", "--checkpoint", f["binary"], "-T", "8", "--out", tmp_path / "o"], "checkpoint")
    assert not (tmp_path / "o").exists()


# -- the results store and plots: a user's file is never overwritten ---------------------------


def test_results_store_that_is_not_one(capsys, tmp_path):
    f = files(tmp_path)
    for kind in ("binary", "text"):
        before = f[kind].read_bytes()
        err = bad(capsys, ["results", "--db", f[kind]], "--db")
        assert "not a results store" in err
        assert f[kind].read_bytes() == before  # left as it was
    bad(capsys, ["results", "--db", tmp_path], "--db")
    bad(capsys, ["results", "--db", tmp_path / "missing.sqlite"], "--db")


def test_output_paths_that_cannot_be_written(tmp_path):
    from seqmix._checks import output_dir, output_file
    from seqmix.train.store import ResultsStore

    f = files(tmp_path)
    before = f["text"].read_bytes()
    for call in (lambda: output_dir(f["text"], "--out"), lambda: output_dir(f["text"] / "sub", "--out"),
                 lambda: output_file(tmp_path, "--plot"), lambda: output_file(f["text"] / "x.png", "--plot"),
                 lambda: ResultsStore(f["text"] / "results.sqlite", argument="--out")):
        with pytest.raises(ValueError, match="--out|--plot"):
            call()
    assert f["text"].read_bytes() == before


def test_sweep_and_plot_into_a_file(tmp_path):
    from seqmix._plotting import save_figure
    from seqmix.train.sweep import run_sweep

    f = files(tmp_path)
    before = f["text"].read_bytes()
    with pytest.raises(ValueError, match="argument --out: .* is a file"):
        run_sweep([], out_dir=f["text"], progress=False)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with pytest.raises(ValueError, match="argument --plot: .* is a folder"):
        save_figure(plt.figure(), tmp_path, argument="--plot")
    assert f["text"].read_bytes() == before


def test_results_plot_into_a_folder_or_a_png_file_and_nothing_else(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["train", *TINY_TASK, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["results", "--db", str(out / "results.sqlite"), "--plot", str(tmp_path / "plots")]) == 0  # a folder
    assert (tmp_path / "plots" / "results.png").is_file() and str(tmp_path / "plots" / "results.png") in capsys.readouterr().out
    bad(capsys, ["results", "--db", out / "results.sqlite", "--plot", tmp_path / "plot.svg"], "--plot")
    (tmp_path / "dir.png").mkdir()
    bad(capsys, ["results", "--db", out / "results.sqlite", "--plot", tmp_path / "dir.png"], "--plot")
    bad(capsys, ["results", "--db", out / "results.sqlite", "--experiment", "nope"], "--experiment")
    bad(capsys, ["results", "--db", out / "results.sqlite", "--x", "nope"], "x axis")


def test_a_torn_result_file_is_not_a_finished_run(tmp_path):
    from seqmix.train.sweep import _finished_result

    p = tmp_path / "result.json"
    for text in ("{", "[1]", json.dumps({"status": "finished", "run_id": "abc", "foo": 1}),
                 json.dumps({"status": "finished", "run_id": "other"})):
        p.write_text(text)
        assert _finished_result(p, "abc") is None
    p.write_bytes(b"\xff\xfe")
    assert _finished_result(p, "abc") is None


# -- language-model runs: eval, generate on bad options and foreign folders --------------------


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    import os

    base = tmp_path_factory.mktemp("lm")
    old = os.environ.get("SEQMIX_CACHE")
    os.environ["SEQMIX_CACHE"] = str(base / "cache")
    corpus = base / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200)))
    try:
        assert main(["lm", "train", *TINY_LM, "--corpus", str(corpus), "--out", str(base / "out")]) == 0
    finally:
        if old is None:
            os.environ.pop("SEQMIX_CACHE")
        else:
            os.environ["SEQMIX_CACHE"] = old
    (run,) = (base / "out" / "runs").iterdir()
    return run, base / "cache"


def test_lm_eval_and_generate_options(capsys, tmp_path, monkeypatch, lm_run):
    run, cache = lm_run
    monkeypatch.setenv("SEQMIX_CACHE", str(cache))
    capsys.readouterr()
    bad(capsys, ["lm", "eval", run, "--lengths", "a"], "--lengths")
    bad(capsys, ["lm", "eval", run, "--lengths", "0"], "--lengths")
    bad(capsys, ["lm", "eval", run, "--lengths", "1", "--max-tokens", "0"], "--max-tokens")
    bad(capsys, ["lm", "eval", "nope", "--runs", tmp_path], "run")
    (tmp_path / "foreign").mkdir()
    bad(capsys, ["lm", "eval", tmp_path / "foreign"], "run")
    bad(capsys, ["lm", "generate", run, "--prompt-file", tmp_path / "missing.txt"], "--prompt-file")
    f = files(tmp_path)
    bad(capsys, ["lm", "generate", run, "--prompt-file", f["binary"]], "--prompt-file")
    for opt, v in (("--max-new-tokens", "-1"), ("--temperature", "-1"), ("--top-k", "0"), ("--top-p", "2")):
        bad(capsys, ["lm", "generate", run, "--max-new-tokens", "2", opt, v], opt.lstrip("-").replace("-", "_"))


# -- config objects raise a ValueError that names the field -----------------------------------


def _task(**kw):
    return {"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 8, **kw}


@pytest.mark.parametrize("data,model,train,field", [
    ({"train": [_task(seq_len=0)], "test": [_task()]}, {"mixer": "s6"}, {}, "data.train[0].seq_len"),
    ({"train": [_task(task="nope")], "test": [_task()]}, {"mixer": "s6"}, {}, "data.train[0].task"),
    ({"train": [_task()], "test": [_task()]}, {"mixer": "nope"}, {}, "model.mixer"),
    ({"train": [_task()], "test": [_task()]}, {"mixer": "s6", "d_model": 0}, {}, "model.d_model"),
    ({"train": [_task()], "test": [_task()]}, {"mixer": "s6"}, {"lr": "fast"}, "train.lr"),
    ({"train": [_task()], "test": [_task()]}, {"mixer": "s6"}, {"device": "gpu0"}, "train.device"),
    ({"kind": "corpus", "seq_len": 0}, {"mixer": "s6"}, {"max_steps": 1}, "data.seq_len"),
    ({"kind": "corpus", "corpus": "missing.txt"}, {"mixer": "s6"}, {"max_steps": 1}, "data.corpus"),
    ({"kind": "nope"}, {"mixer": "s6"}, {}, "data.kind"),
    ({"kind": "corpus"}, {"mixer": "s6"}, {}, "train"),
])
def test_run_config_names_the_field(data, model, train, field):
    from seqmix.train import RunConfig, make_run_config

    with pytest.raises(ValueError):
        RunConfig(data=data, model=model, train=train)
    with pytest.raises(ValueError) as e:
        make_run_config(data=data, model=model, train=train)
    msg = str(e.value)
    assert f"'{field}'" in msg, msg
    assert len(msg.splitlines()) == 1 and len(msg) < 800 and not any(w in msg for w in NOISE), msg


def test_model_config_names_the_field():
    from seqmix.models import ModelConfig

    for kw, field in (({"mixer": "s6", "d_model": -1}, "d_model"), ({"mixer": "s6", "n_layers": 0}, "n_layers"),
                      ({"mixer": "nope"}, "mixer"), ({"mixer": "s6", "channel_mixer": "x"}, "channel_mixer")):
        with pytest.raises(ValueError, match=field):
            ModelConfig(**kw)


def test_config_error_is_short():
    import pydantic

    from seqmix.data import DataConfig
    from seqmix.mixers.base import CONFIG_ERROR_PROBLEMS, config_error, config_location

    assert config_location(("data", "kind=tasks", "train", 0, "task=mqar", "seq_len")) == "data.train[0].seq_len"
    assert config_location(("data", "function-after[_check(), CorpusConfig]", "seq_len")) == "data.seq_len"
    bad_tasks = [_task(seq_len=0, vocab_size=1, num_examples=0, num_kv_pairs=0)] * 4
    with pytest.raises(pydantic.ValidationError) as e:
        DataConfig(train=bad_tasks, test=bad_tasks, batch_size="x" * 500)
    msg = str(config_error("data", e.value))
    assert msg.count("'data") == 0 and msg.count("': ") == CONFIG_ERROR_PROBLEMS and "more" in msg, msg
    assert len(msg) < 3 * 500 and "\n" not in msg


# -- the commands: config files, output paths, options (issue 24 part 3, CLI-1..7) ----------------


def test_config_files_on_the_command_line(capsys, tmp_path):
    f = files(tmp_path)
    for kind in ("binary", "malformed", "list_of_int", "empty_object"):
        bad(capsys, ["train", "--config", f[kind], "--out", tmp_path / "o"], "--config")
        bad(capsys, ["lm", "train", "--config", f[kind], "--out", tmp_path / "o"], "--config")
    bad(capsys, ["train", "--config", tmp_path / "missing.json", "--out", tmp_path / "o"], "--config")
    for kind in ("binary", "malformed", "list_of_int", "string", "empty_object"):
        path = tmp_path / f"{kind}.json"
        path.write_bytes(f[kind].read_bytes())
        bad(capsys, ["sweep", path, "--out", tmp_path / "o"], "preset")
    assert not (tmp_path / "o").exists()


def test_out_that_is_a_file(capsys, tmp_path):
    f = files(tmp_path)
    before = f["text"].read_bytes()
    for out in (f["text"], f["text"] / "sub"):
        assert "is a file" in bad(capsys, ["train", *TINY_TASK, "--out", out], "--out")
        bad(capsys, ["lm", "train", *TINY_LM, "--out", out], "--out")
        bad(capsys, ["show", "s6", "-T", "8", "--out", out], "--out")
    assert f["text"].read_bytes() == before


def test_show_text_file_and_list_family(capsys, tmp_path):
    f = files(tmp_path)
    err = bad(capsys, ["show", "s6", "--input", "text", "--text-file", f["binary"], "-T", "8", "--out", tmp_path / "o"],
              "--text-file")
    assert "UTF-8" in err
    bad(capsys, ["show", "s6", "--input", "text", "--text-file", tmp_path, "-T", "8", "--out", tmp_path / "o"], "--text-file")
    assert not (tmp_path / "o").exists()
    assert "families:" in bad(capsys, ["list", "--family", "nope"], "--family")


def test_a_validation_error_or_a_long_message_is_short(capsys, monkeypatch):
    from seqmix import cli
    from seqmix.data import DataConfig

    def invalid(args):
        DataConfig(train=[_task(seq_len=0)], test=[], batch_size="x")  # a pydantic error no layer turned into a line

    def long(args):
        raise ValueError("\n".join(f"line {i}" for i in range(10)))

    add = cli.COMMANDS["list"][0]
    monkeypatch.setitem(cli.COMMANDS, "list", (add, invalid))
    assert "train[0].seq_len" in bad(capsys, ["list"], "seq_len")
    monkeypatch.setitem(cli.COMMANDS, "list", (add, long))
    err = bad(capsys, ["list"], "line 0")
    assert "line 2 line 3" in err and "line 9" in err  # the lines past the third folded into it, not lost


def test_a_data_error_leaves_no_run_folder(capsys, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a short corpus\n" * 4)
    out = tmp_path / "out"
    bad(capsys, ["lm", "train", *TINY_LM, "--corpus", corpus, "--seq-len", "10000", "--out", out], "seq_len")
    assert not out.exists()  # no empty runs/<id> (nor --out) folder left behind


def test_a_torn_result_file_is_trained_again(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["train", *TINY_TASK, "--out", str(out)]) == 0
    (run,) = (out / "runs").iterdir()
    (run / "result.json").write_text("{")  # torn: not a finished run, so the run is trained (resumed) again
    assert main(["train", *TINY_TASK, "--out", str(out)]) == 0
    assert json.loads((run / "result.json").read_text())["status"] == "finished"


def test_results_plot_of_language_model_runs(capsys, tmp_path, lm_run):
    run, _ = lm_run
    capsys.readouterr()
    bad(capsys, ["results", "--db", run.parent.parent / "results.sqlite", "--plot", tmp_path / "p.png"], "--plot")
    assert not (tmp_path / "p.png").exists()


def test_lm_generate_eval_export_options(capsys, tmp_path, monkeypatch, lm_run):
    import shutil

    run, cache = lm_run
    monkeypatch.setenv("SEQMIX_CACHE", str(cache))
    capsys.readouterr()
    bad(capsys, ["lm", "generate", run, "--num-samples", "0", "--max-new-tokens", "2"], "--num-samples")
    (tmp_path / "taken.png").mkdir()
    bad(capsys, ["lm", "eval", run, "--plot", tmp_path / "taken.png"], "--plot")  # a folder where the file goes
    bad(capsys, ["lm", "eval", run, "--plot", tmp_path / "length.pdf"], "--plot")  # a format it does not write
    assert not (run / "eval_val.json").exists()  # said before evaluating
    # a run folder whose config.json is corrupt or not a RunConfig
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    for text in ("{\"data\": ", "[1]", json.dumps({"foo": 1})):
        (broken / "config.json").write_text(text)
        bad(capsys, ["lm", "eval", broken], "run")
    f = files(tmp_path)
    before = f["text"].read_bytes()
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    assert "is a file" in bad(capsys, ["lm", "export", run, "--hf", f["text"]], "--hf")
    bad(capsys, ["lm", "export", tmp_path / "nope", "--hf", tmp_path / "hf"], "run")
    assert not (tmp_path / "hf").exists() and f["text"].read_bytes() == before
