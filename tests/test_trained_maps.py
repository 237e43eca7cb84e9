"""Maps of trained models: the harness writes the first and last layer's maps after a run,
`seqmix show --run` redraws them, `seqmix results --maps` lists them, and the map drawn is
the trained mixer's map on its own input inside the model."""

import json

import matplotlib.image as mpimg
import pytest
import torch

from seqmix.analysis import trained
from seqmix.analysis.show import figure_size_px
from seqmix.cli import main
from seqmix.data import DataConfig, MQARConfig
from seqmix.train import RunConfig, TrainConfig, Trainer
from seqmix.train.store import ResultsStore


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _config(mixer="linear_attention", **mixer_kwargs):
    t = dict(seq_len=16, num_kv_pairs=2, vocab_size=32)
    data = DataConfig(train=[MQARConfig(num_examples=64, **t)], test=[MQARConfig(num_examples=16, **t)], batch_size=16)
    model = dict(mixer=mixer, d_model=16, n_layers=3, channel_mixer="none", mixer_kwargs=mixer_kwargs)
    return RunConfig(data=data, model=model, train=TrainConfig(epochs=1, threads=1), experiment="e", label="lin")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One finished run in <out>/runs/<id> with its row in <out>/results.sqlite, as a sweep leaves it."""
    out = tmp_path_factory.mktemp("out")
    cfg = _config(n=8)
    res = Trainer(cfg, run_dir=out / "runs" / cfg.run_id, progress=False, write_maps=trained.write_run_maps).fit()
    ResultsStore(out / "results.sqlite").put(cfg, res)
    return out, cfg


def test_the_trainer_writes_the_maps_of_the_first_and_last_layer(run):
    out, cfg = run
    d = out / "runs" / cfg.run_id
    info = json.loads((d / trained.MAPS_JSON).read_text())
    assert "error" not in info and [v["label"] for v in info["layers"]] == ["layer 0: linear_attention", "layer 2: linear_attention"]
    img = mpimg.imread(d / trained.MAPS_PNG)
    assert (img.shape[1], img.shape[0]) == figure_size_px(2, dpi=80)
    assert info["T"] == 16 and 0 <= info["layers"][0]["numbers"]["band_mass"] <= 1


def test_the_map_is_the_trained_mixers_map_on_its_input_in_the_model(run):
    out, cfg = run
    config, model = trained.load_run(cfg.run_id[:6], out)  # a unique prefix is enough
    tokens = trained.run_example(config)
    # the input of block 2's mixer, computed by hand: embed + positions, blocks 0 and 1, norm1
    with torch.no_grad():
        h = model.embed(tokens[None]) + model.pos.weight[: tokens.shape[0]]
        for b in model.blocks[:2]:
            h = b(h)
        x2 = model.blocks[2].norm1(h)
        want = model.blocks[2].mixer.phi(x2)[0]
    assert torch.allclose(trained.layer_inputs(model, tokens)[2], x2)
    views = trained.model_views(model, tokens, layers=(2,))
    assert torch.equal(views[0].phi, want)
    # and the weights are the trained ones, not a fresh init
    blob = torch.load(out / "runs" / cfg.run_id / "checkpoint.pt", weights_only=True)
    assert torch.equal(model.blocks[0].mixer.W_qk.weight, blob["model"]["blocks.0.mixer.W_qk.weight"])


def test_show_run_and_results_maps(run, tmp_path, capsys):
    out, cfg = run
    assert main(["show", "--run", cfg.run_id[:8], "--runs", str(out), "--layers", "0,1,-1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"run {cfg.run_id[:8]} (lin)" in printed and "wrote" in printed
    img = mpimg.imread(tmp_path / "maps.png")  # three columns: layers 0, 1 and 2
    assert (img.shape[1], img.shape[0]) == figure_size_px(3)
    assert main(["results", "--db", str(out / "results.sqlite"), "--maps"]) == 0
    printed = capsys.readouterr().out
    assert f"| {cfg.run_id[:8]} | lin |" in printed and str(out / "runs" / cfg.run_id / "maps.png") in printed


def test_bad_runs_are_named(run, tmp_path, capsys):
    out, cfg = run
    assert main(["show", "--run", "zzzz", "--runs", str(out)]) != 0
    assert "argument 'run': no run id starting with 'zzzz'" in capsys.readouterr().err
    assert main(["show", "--run", cfg.run_id, "--runs", str(out), "--layers", "7"]) != 0
    assert "argument 'layers': 7 is not a layer of a 3-layer model" in capsys.readouterr().err
    assert main(["show", "s6", "--run", cfg.run_id, "--runs", str(out)]) != 0
    assert "argument '--run'" in capsys.readouterr().err
    assert main(["show", "--run", "x", "--runs", str(tmp_path / "nothing")]) != 0
    assert "no runs folder" in capsys.readouterr().err


def test_a_map_that_cannot_be_drawn_is_explained_not_fatal(tmp_path):
    from seqmix.models import LanguageModel

    cfg = _config(n=8)
    model = LanguageModel(cfg.model)
    info = trained.write_run_maps(tmp_path, cfg, model, layers=(5,))
    assert "layers" in info["error"] and not (tmp_path / trained.MAPS_PNG).exists()
    assert json.loads((tmp_path / trained.MAPS_JSON).read_text()) == info


def test_a_stopped_run_is_shown_from_its_checkpoint(tmp_path):
    """A run stopped after its first epoch has no config.json yet: its checkpoint carries the config."""
    from seqmix.train import Interrupted

    cfg = _config(n=8).model_copy(update={"train": TrainConfig(epochs=3, threads=1)})

    def stop(epoch, record):
        raise Interrupted

    d = tmp_path / "runs" / cfg.run_id
    res = Trainer(cfg, run_dir=d, progress=False, on_epoch=stop).fit()
    assert res.status == "interrupted" and not (d / "config.json").exists()
    config, model = trained.load_run(cfg.run_id, tmp_path)
    assert config.run_id == cfg.run_id and not model.training
    assert len(trained.model_views(model, trained.run_example(config))) == 2
