"""Opening a run folder runs no code: every checkpoint is read with
``torch.load(weights_only=True)`` (seqmix.train.checkpoint). A checkpoint holding a pickled
object is refused before anything in it runs — on resume, in analysis.trained.load_run and in
`seqmix lm eval` — and an empty, truncated or foreign file is a one-line ValueError naming
the file, never an unpickling traceback. A format-1 checkpoint (numpy RNG array) still reads."""

import os
import pickle
import random

import numpy as np
import pytest
import torch

from seqmix.analysis import trained
from seqmix.cli import main
from seqmix.data import DataConfig, MQARConfig
from seqmix.train import Interrupted, RunConfig, TrainConfig, Trainer
from seqmix.train.checkpoint import CHECKPOINT, FORMAT, read_checkpoint, rng_state, set_rng_state

pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _config(epochs=2):
    t = dict(seq_len=16, num_kv_pairs=2, vocab_size=32)
    data = DataConfig(train=[MQARConfig(num_examples=64, **t)], test=[MQARConfig(num_examples=16, **t)], batch_size=16)
    model = dict(mixer="linear_attention", d_model=16, n_layers=2, channel_mixer="none")
    return RunConfig(data=data, model=model, train=TrainConfig(epochs=epochs, threads=1, early_stop=None), experiment="e")


class _Opens:
    """Unpickling this creates the marker file (what an attacker's payload would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _Shell:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(params=["open", "os.system", "raw pickle"])
def malicious_run(request, tmp_path):
    """A run folder of the config whose checkpoint.pt would create ``marker`` when unpickled."""
    cfg = _config()
    d = tmp_path / "runs" / cfg.run_id
    d.mkdir(parents=True)
    marker = tmp_path / "pwned"
    payload = _Shell(marker) if request.param == "os.system" else _Opens(marker)
    blob = {"run_id": cfg.run_id, "config": cfg.model_dump(mode="json"), "model": {}, "optimizer": payload,
            "state": {}, "rng": {}}
    if request.param == "raw pickle":  # not even a torch zip archive: a bare pickle stream
        (d / CHECKPOINT).write_bytes(pickle.dumps(blob))
    else:
        torch.save(blob, d / CHECKPOINT)
    (d / "config.json").write_text(cfg.model_dump_json())
    return cfg, d, marker


def test_the_payload_would_run_if_unpickled(tmp_path):
    """The test's payloads are live: a plain pickle.load does create the marker."""
    for cls in (_Opens, _Shell):
        marker = tmp_path / f"live-{cls.__name__}"
        pickle.loads(pickle.dumps(cls(marker)))
        assert marker.exists()


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_malicious_checkpoint_is_refused_on_resume(malicious_run):
    cfg, d, marker = malicious_run
    with pytest.raises(ValueError, match=CHECKPOINT) as e:
        Trainer(cfg, run_dir=d, progress=False).fit()
    assert "pickled Python objects" in str(e.value) or "not a torch.save zip archive" in str(e.value)
    assert not marker.exists()


def test_a_malicious_checkpoint_is_refused_by_load_run_and_lm_eval(malicious_run, capsys):
    cfg, d, marker = malicious_run
    with pytest.raises(ValueError, match="argument 'run': checkpoint") as e:
        trained.load_run(d)
    assert str(d / CHECKPOINT) in str(e.value)
    assert not marker.exists()
    assert main(["lm", "eval", str(d)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("seqmix lm eval: error: argument 'run': checkpoint") and CHECKPOINT in line
    assert main(["show", "--run", cfg.run_id[:8], "--runs", str(d.parent.parent)]) == 2
    assert "checkpoint" in _one_line(capsys.readouterr().err)
    assert not marker.exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run (its checkpoint written by this seqmix)."""
    d = tmp_path_factory.mktemp("finished")
    cfg = _config(epochs=1)
    Trainer(cfg, run_dir=d, progress=False).fit()
    return cfg, d


@pytest.mark.parametrize("kind", ["empty", "truncated", "text", "foreign zip", "foreign dict", "corrupt member"])
def test_a_broken_or_foreign_checkpoint_is_named(finished, tmp_path, capsys, kind):
    cfg, src = finished
    good = (src / CHECKPOINT).read_bytes()
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.json").write_text(cfg.model_dump_json())
    ckpt = d / CHECKPOINT
    if kind == "empty":
        ckpt.write_bytes(b"")
    elif kind == "truncated":
        ckpt.write_bytes(good[: len(good) // 2])
    elif kind == "text":
        ckpt.write_text("hello, this is not a checkpoint\n")
    elif kind == "foreign zip":
        import zipfile

        with zipfile.ZipFile(ckpt, "w") as z:
            z.writestr("readme.txt", "a zip, but not torch's")
    elif kind == "foreign dict":
        torch.save({"weights": torch.zeros(3)}, ckpt)
    else:  # flip bytes inside the pickled data of the archive
        i = good.index(b"data.pkl") + 200
        ckpt.write_bytes(good[:i] + bytes(b ^ 0xFF for b in good[i:i + 64]) + good[i + 64:])
    expected = {"empty": "is empty", "truncated": "truncated", "text": "not a torch.save zip archive",
                "foreign zip": "corrupt", "foreign dict": "not a seqmix run checkpoint", "corrupt member": ""}[kind]
    with pytest.raises(ValueError, match=CHECKPOINT) as e:
        trained.load_run(d)
    assert expected in str(e.value)
    with pytest.raises(ValueError, match=CHECKPOINT):
        Trainer(cfg, run_dir=d, progress=False).fit()
    assert main(["lm", "eval", str(d)]) == 2
    assert CHECKPOINT in _one_line(capsys.readouterr().err)


def test_a_checkpoint_holds_only_what_weights_only_reads(finished):
    cfg, d = finished
    blob = torch.load(d / CHECKPOINT, weights_only=True)
    assert blob["format"] == FORMAT and blob["run_id"] == cfg.run_id and RunConfig(**blob["config"]).run_id == cfg.run_id
    assert isinstance(blob["rng"]["numpy"]["keys"], torch.Tensor)
    config, model = trained.load_run(d)
    assert config.run_id == cfg.run_id and torch.equal(model.embed.weight, blob["model"]["embed.weight"])


def test_rng_states_round_trip():
    np.random.seed(3)
    np.random.standard_normal()  # a cached gaussian in numpy's state
    random.seed(4)
    torch.manual_seed(5)
    s = rng_state()
    want = (torch.rand(3), np.random.standard_normal(4), random.random())
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    set_rng_state(s)
    got = (torch.rand(3), np.random.standard_normal(4), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def test_a_format_1_checkpoint_still_resumes(tmp_path):
    """A checkpoint of the previous format (numpy's RNG state as a numpy array, no "format")
    resumes to the same numbers as an uninterrupted run."""
    cfg = _config(epochs=2)
    full = Trainer(cfg, run_dir=tmp_path / "a", progress=False).fit()

    def kill(epoch, _):
        raise Interrupted

    Trainer(cfg, run_dir=tmp_path / "b", progress=False, on_epoch=kill).fit()
    ckpt = tmp_path / "b" / CHECKPOINT
    blob = read_checkpoint(ckpt)
    set_rng_state(blob["rng"])
    del blob["format"]
    blob["rng"] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save(blob, ckpt)  # as seqmix wrote it before
    with pytest.raises(Exception):
        torch.load(ckpt, weights_only=True)  # the plain safe load refuses the numpy array
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    resumed = Trainer(cfg, run_dir=tmp_path / "b", progress=False).fit()
    assert resumed.status == "finished" and resumed.steps == full.steps
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in full.history]
    config, _ = trained.load_run(tmp_path / "b")
    assert config.run_id == cfg.run_id


def test_plain_pickles_load_numpy_arrays_and_refuse_objects(tmp_path):
    """seqmix._safe_pickle: for pickles of data (CIFAR-10's python batches)."""
    import io

    from seqmix._safe_pickle import load_plain_pickle

    batch = {b"data": np.arange(12, dtype=np.uint8).reshape(2, 6), b"labels": [3, 7], b"batch_label": b"x"}
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        got = load_plain_pickle(io.BytesIO(pickle.dumps(batch, protocol=protocol)), encoding="bytes")
        assert np.array_equal(got[b"data"], batch[b"data"]) and got[b"labels"] == [3, 7]
    marker = tmp_path / "pwned"
    for payload in (_Opens(marker), _Shell(marker), {"a": [1, _Opens(marker)]}):
        with pytest.raises(ValueError, match="pickled Python objects"):
            load_plain_pickle(io.BytesIO(pickle.dumps(payload)), where="batch")
    assert not marker.exists()
    with pytest.raises(ValueError, match="not a readable pickle"):
        load_plain_pickle(io.BytesIO(pickle.dumps(batch)[:20]), where="batch")


# -- linearize's stage-1 progress file --------------------------------------------------------------


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kind", ["open", "os.system", "raw pickle"])
def test_a_malicious_stage1_progress_file_is_refused(tmp_path, kind):
    """A file planted at stage 1's progress path (linearize.transfer's ``checkpoint``) that would run
    code when unpickled is refused with a ValueError naming the file, and its payload never runs."""
    from seqmix.linearize import linearize, transfer

    teacher = _tiny_llama()
    lin = linearize(teacher, mixer="gla")
    marker = tmp_path / "pwned"
    payload = _Shell(marker) if kind == "os.system" else _Opens(marker)
    blob = {"key": "", "steps": 1, "step": 0, "students": {}, "optimizer": payload, "history": []}
    progress = tmp_path / "stages" / "transfer_run" / "progress.pt"
    progress.parent.mkdir(parents=True)
    if kind == "raw pickle":
        progress.write_bytes(pickle.dumps(blob))
    else:
        torch.save(blob, progress)
    ran = []
    with pytest.raises(ValueError, match="progress.pt") as e:
        transfer(lin, teacher, lambda i: ran.append(i) or torch.zeros(1, 8, dtype=torch.long), steps=1, checkpoint=progress)
    assert "pickled Python objects" in str(e.value) or "not a torch.save zip archive" in str(e.value)
    assert not marker.exists() and ran == []  # refused before anything loaded or trained


def test_a_stage1_progress_file_round_trips_through_the_safe_load(tmp_path):
    """What stage 1 saves is what ``read_checkpoint`` (weights_only=True) reads back: a resumed call
    runs only the steps after the save."""
    from seqmix.linearize import linearize, transfer

    teacher = _tiny_llama()
    progress = tmp_path / "progress.pt"
    batch = lambda i: torch.randint(0, 32, (1, 8), generator=torch.Generator().manual_seed(i))  # noqa: E731
    transfer(linearize(teacher, mixer="gla"), teacher, batch, steps=2, checkpoint=progress, save_every=1)
    blob = read_checkpoint(progress, keys=("step", "students", "optimizer", "history"))
    assert blob["step"] == 2 and [h["step"] for h in blob["history"]] == [1, 2]
    seen = []
    transfer(linearize(teacher, mixer="gla"), teacher, lambda i: seen.append(i) or batch(i), steps=2, checkpoint=progress)
    assert seen == []  # every step was saved: nothing to run again


# -- every torch.load in the repository's code is weights_only=True ----------------------------------


def _unsafe_torch_loads(source: str, filename: str = "<string>") -> list[int]:
    """Line numbers of the calls ``torch.load(...)`` / ``torch.serialization.load(...)`` / a ``load``
    imported from torch, that do not pass ``weights_only=True`` as a literal keyword (parsed, so a
    comment or a string saying ``weights_only=True`` does not count)."""
    import ast

    tree = ast.parse(source, filename)
    local = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module in ("torch", "torch.serialization")
             for a in n.names if a.name == "load"}

    def is_load(f) -> bool:
        if isinstance(f, ast.Name):
            return f.id in local
        if isinstance(f, ast.Attribute) and f.attr == "load":
            v = f.value
            return (isinstance(v, ast.Name) and v.id == "torch") or (
                isinstance(v, ast.Attribute) and v.attr == "serialization" and isinstance(v.value, ast.Name) and v.value.id == "torch")
        return False

    def safe(call) -> bool:
        return any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)

    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and is_load(n.func) and not safe(n))


def test_the_torch_load_check_sees_what_a_regex_would_miss():
    """The checker flags a call whose weights_only is missing, False, or only written in a comment or string."""
    src = ("import torch\nfrom torch import load as L\n"
           "a = torch.load(p)  # weights_only=True\n"
           "b = torch.load(p, weights_only=False)\n"
           "c = L(p, map_location='weights_only=True')\n"
           "d = torch.serialization.load(p)\n"
           "e = torch.load(p, weights_only=True)\n"
           "f = L(p, weights_only=True)\n")
    assert _unsafe_torch_loads(src) == [3, 4, 5, 6]


def test_every_torch_load_in_src_bench_and_tests_is_weights_only():
    """torch.load without weights_only=True unpickles arbitrary objects (a planted file runs code):
    src/, bench/ and tests/ call it only with weights_only=True (or read through read_checkpoint)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    bad = [f"{f.relative_to(root)}:{line}" for d in ("src", "bench", "tests") for f in sorted((root / d).rglob("*.py"))
           for line in _unsafe_torch_loads(f.read_text(), str(f))]
    assert not bad, "torch.load without weights_only=True at " + ", ".join(bad)
