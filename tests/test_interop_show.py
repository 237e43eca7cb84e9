"""Real models in the DSF (docs/interop.md): `seqmix show --hf` on tiny
random transformers checkpoints saved to tmp_path (nothing downloaded), the maps it draws
reproduce each layer's output, the blocked map computation (seqmix.analysis.model_maps) equals
the mixers' own phi(x) and decays(x), and `seqmix lm train --init-from-hf` fine-tunes a
converted Mamba (the loss falls; a killed run resumes exactly)."""

from __future__ import annotations

import struct

import pytest
import torch
from matplotlib.image import AxesImage

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    FalconMambaConfig, FalconMambaForCausalLM, Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM,
)

import seqmix  # noqa: E402
from seqmix.analysis import show  # noqa: E402
from seqmix.analysis.mapstats import decay_summary  # noqa: E402
from seqmix.analysis.model_maps import (  # noqa: E402
    MAP_PIECES, layer_inputs, map_pieces, mixer_layers, model_maps, reduced_maps, reduced_spectrum,
)
from seqmix.cli import main  # noqa: E402
from seqmix.interop import from_transformers  # noqa: E402
from tolerances import max_abs  # noqa: E402

#: maps applied to the layer's values vs the mixer's own core output (float32), relative to its scale
MAP_RTOL = 1e-5
TEXT = "To be, or not to be, that is the question:"


def tiny(family: str, vocab: int = 300):
    torch.manual_seed(0)
    common = dict(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2, pad_token_id=0, eos_token_id=1,
                  bos_token_id=1)
    if family == "mamba":
        return MambaForCausalLM(MambaConfig(**common)).eval()
    if family == "falcon_mamba":
        return FalconMambaForCausalLM(FalconMambaConfig(**common, mixer_rms_eps=1e-5)).eval()
    if family == "mamba2":
        return Mamba2ForCausalLM(Mamba2Config(**common, num_heads=8, head_dim=8, n_groups=2, chunk_size=8)).eval()
    raise KeyError(family)


FAMILIES = ["mamba", "falcon_mamba", "mamba2"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for f in FAMILIES:
        out[f] = root / f
        tiny(f).save_pretrained(out[f])
    return out


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


# ------------------------------------------------------------------------------------------
# the blocked maps are the mixers' own maps
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", sorted(MAP_PIECES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_registered_pieces_are_the_mixers_phi_and_decays(cls):
    """Every MAP_PIECES entry: all maps, the mean (computed without per-map T×T tensors) and the
    spectrum summary equal phi(x), phi(x).mean and decay_summary(decays(x)) — registry presets of that class."""
    names = [e.name for e in seqmix.list_mixers() if e.cls is cls]
    assert names
    for name in names:
        torch.manual_seed(0)
        m = seqmix.build_mixer(name, **seqmix.mixer_entry(name).example_config()).eval()
        x = torch.randn(1, 37, m.d_model)  # 37: leaves of 16 and an uneven split
        with torch.no_grad():
            phi = m.phi(x)[0]
        p = map_pieces(m, x)
        M = phi.shape[0]
        scale = float(phi.abs().max())
        assert max_abs(p.at(list(range(M))), phi) <= 1e-5 * scale, name
        assert max_abs(p.mean(leaf=4), phi.mean(0)) <= 1e-5 * scale, name
        red = reduced_maps(m, x, [0, M - 1, -2], block_bytes=1)  # one map per block
        assert red.index == [0, M - 1, M - 2] and red.count == M and red.blocked
        assert max_abs(red.selected, phi[[0, M - 1, M - 2]]) <= 1e-5 * scale
        _, d, _ = reduced_spectrum(m, x)
        full = decay_summary(m.decays(x)[0])
        for k in ("N", "distinct_values", "trajectories", "parameters"):
            assert d[k] == full[k], (name, k)
        assert abs(d["memory"] - full["memory"]) <= 1e-9 * max(1.0, full["memory"]), name


def test_unregistered_mixer_uses_phi_under_the_memory_limit():
    torch.manual_seed(0)
    m = seqmix.build_mixer("softmax_attention", d_model=16, heads=2).eval()
    x = torch.randn(1, 12, 16)
    red = reduced_maps(m, x, [1])
    with torch.no_grad():
        phi = m.phi(x)[0]
    assert not red.blocked and red.count == 2 and max_abs(red.selected[0], phi[1]) == 0
    assert max_abs(red.mean, phi.mean(0)) <= 1e-7
    with pytest.raises(ValueError, match="seq_len"):
        reduced_maps(m, x, max_bytes=100)
    with pytest.raises(ValueError, match="'heads'"):
        reduced_maps(m, x, [2])


@pytest.mark.parametrize("family", FAMILIES)
def test_maps_reproduce_each_layers_output(family):
    """Φ of every channel / head of every converted layer, on that layer's own input in the
    model, applied to the layer's values equals the converted mixer's core output; the drawn
    arrays are those maps and their mean."""
    model = from_transformers(tiny(family))
    ids = torch.tensor(list(TEXT.encode()))
    mixers = mixer_layers(model)
    assert list(mixers) == [f"backbone.layers.{i}.mixer.mixer" for i in range(2)]
    xs = layer_inputs(model, ids)
    mm = model_maps(model, ids, layers="all", heads=list(range(64 if family != "mamba2" else 8)))
    assert len(mm.views) == 2 and len(mm.layers) == 2
    for view, (path, x) in zip(mm.views, xs.items()):
        mixer = mixers[path]
        with torch.no_grad():
            values, mixed = mixer.core(x)
        maps = view.phi[1:]  # [maps, T, T]: view.phi[0] is the mean
        y = torch.einsum("mts,bsmp->btmp", maps.double(), values.double())
        assert max_abs(y, mixed) <= MAP_RTOL * float(mixed.abs().max()), (family, path)
        assert max_abs(view.phi[0], maps.mean(0)) <= 1e-6 * float(maps.abs().max())
        assert view.total_maps == maps.shape[0] and view.map_labels[0].startswith("mean of")
        fig = show.show_figure([view], max_maps=3)
        arrays = {im.get_gid(): im.get_array() for ax in fig.axes for im in ax.get_images() if isinstance(im, AxesImage)}
        for i in range(3):
            assert max_abs(torch.as_tensor(arrays[f"phi:{view.label}:{i}"].data), view.phi[i]) == 0
        assert view.state_size == mixer.state_size(ids.numel()) == mm.layers[int(path.split(".")[2])].state_size


# ------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------


def test_show_hf_png_two_models_side_by_side(folders, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["show", "--hf", str(folders["mamba"]), "--hf", str(folders["mamba2"]), "--text", TEXT, "--out", str(out),
               "--maps", "3", "--dpi", "50"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "UTF-8 bytes" in text and "mamba layer 0" in text and "mamba2 layer 1" in text
    assert png_size((out / "maps.png").read_bytes()) == show.figure_size_px(4, 50)  # 2 models x layers 0, -1
    assert png_size((out / "layers.png").read_bytes())[0] > 0


def test_show_hf_html_heads_layers_and_ids(folders, tmp_path):
    out = tmp_path / "out"
    rc = main(["show", "--hf", str(folders["falcon_mamba"]), "--ids", "5,6,7,8,9,10,11,12", "--layers", "1", "--heads", "0,63",
               "--html", "--out", str(out), "--dpi", "40"])
    assert rc == 0
    page = (out / "report.html").read_text()
    assert "falcon_mamba layer 1" in page and "Across layers" in page and page.count("<img") == 2
    assert "falcon_mamba layer 0" not in page


def test_show_hf_uses_the_checkpoints_tokenizer(folders, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted(set(TEXT.replace(",", " ").replace(":", " ").split()))
    tk = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "with_tok"
    tiny("mamba").save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]").save_pretrained(folder)
    from seqmix.interop.load import tokenize

    ids, note = tokenize(str(folder), TEXT, vocab_size=300)
    assert ids.tolist() == tk.encode(TEXT).ids and len(ids) == 13  # 10 words + 3 punctuation marks (unknown)
    assert "of the checkpoint" in note and "bytes" not in note
    assert tokenize(str(folder), TEXT, vocab_size=300, seq_len=5)[0].tolist() == ids[:5].tolist()
    assert main(["show", "--hf", str(folder), "--text", TEXT, "--out", str(tmp_path / "o"), "--dpi", "30"]) == 0


@pytest.mark.parametrize("case,needle", [
    ("opt", "is a 'opt' model (OPTForCausalLM): an unsupported family; seqmix converts: "),
    ("hub", "hf download nobody/not-cached"),
    ("nofolder", "no such folder"),
    ("noconfig", "without config.json"),
    ("vocab", "outside the vocabulary"),
    ("mixers", "real models are shown on their own"),
    ("notext", "--hf needs the text"),
])
def test_show_hf_errors_are_one_line(case, needle, folders, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty_cache"))
    argv = ["show", "--out", str(tmp_path / "o"), "--text", TEXT]
    if case == "opt":
        from transformers import OPTConfig, OPTForCausalLM

        folder = tmp_path / "opt"
        OPTForCausalLM(OPTConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                                 word_embed_proj_dim=16)).save_pretrained(folder)
        argv += ["--hf", str(folder)]
    elif case == "hub":
        argv += ["--hf", "nobody/not-cached"]
    elif case == "nofolder":
        argv += ["--hf", str(tmp_path / "missing" / "x")]
    elif case == "noconfig":
        (tmp_path / "empty").mkdir()
        argv += ["--hf", str(tmp_path / "empty")]
    elif case == "vocab":
        folder = tmp_path / "small_vocab"
        tiny("mamba", vocab=64).save_pretrained(folder)
        argv += ["--hf", str(folder)]
    elif case == "mixers":
        argv += ["s6", "--hf", str(folders["mamba"])]
    elif case == "notext":
        argv = ["show", "--hf", str(folders["mamba"]), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "seqmix" in line]  # (save_pretrained's progress bars)
    assert len(err) == 1 and err[0].startswith("seqmix show: error:") and needle in err[0], err
    assert not (tmp_path / "o" / "maps.png").exists()


# ------------------------------------------------------------------------------------------
# training from a converted checkpoint
# ------------------------------------------------------------------------------------------


def _train_argv(folder, out, steps=12):
    return ["lm", "train", "--init-from-hf", str(folder), "--max-steps", str(steps), "--seq-len", "32", "--batch-size", "4",
            "--lr", "3e-3", "--warmup", "0.1", "--eval-every", "4", "--eval-batches", "2", "--checkpoint-every", "2",
            "--no-progress", "--no-mfu", "--out", str(out)]


@pytest.fixture(scope="module")
def byte_mamba(tmp_path_factory):
    folder = tmp_path_factory.mktemp("byte") / "mamba"
    tiny("mamba", vocab=256).save_pretrained(folder)
    return folder


def test_lm_train_init_from_hf_loss_falls_and_resumes(byte_mamba, tmp_path):
    import json

    from seqmix.cli import build_parser
    from seqmix.cli.lm import _lm_config
    from seqmix.interop.train import HFCausalLM, hf_model_builder
    from seqmix.train import Interrupted, Trainer

    argv = _train_argv(byte_mamba, tmp_path / "a")
    assert main(argv) == 0
    (run,) = (tmp_path / "a" / "runs").iterdir()
    full = json.loads((run / "result.json").read_text())
    losses = [h["loss"] for h in full["history"]]
    assert full["status"] == "finished" and full["steps"] == 12 and len(losses) == 3
    assert losses[-1] < losses[0] - 0.3, losses  # byte-level Tiny Shakespeare from a random init
    config = _lm_config(build_parser().parse_args(_train_argv(byte_mamba, tmp_path / "b")))
    assert config.init_from_hf == str(byte_mamba.resolve()) and config.run_id == run.name
    assert config.data.tokenizer == "byte" and config.model.mixer == "mamba"
    # the model the trainer drives: seqmix mixers inside transformers' model
    model = hf_model_builder(config)
    assert isinstance(model, HFCausalLM) and [type(b.mixer).__name__ for b in model.blocks] == ["S6", "S6"]
    # killed after its checkpoint at step 6, then started again through the CLI: the same run
    def kill(step, _):
        if step == 6:
            raise Interrupted

    part = Trainer(config, run_dir=tmp_path / "b" / "runs" / config.run_id, progress=False, model_builder=hf_model_builder,
                   on_checkpoint=kill).fit()
    assert part.status == "interrupted" and part.steps == 6
    torch.manual_seed(123)
    assert main(_train_argv(byte_mamba, tmp_path / "b")) == 0
    resumed = json.loads((tmp_path / "b" / "runs" / config.run_id / "result.json").read_text())
    assert resumed["steps"] == 12 and resumed["history"] == full["history"] and resumed["tokens"] == full["tokens"]
    # a plain Trainer refuses the run rather than training another model
    with pytest.raises(ValueError, match="model_builder"):
        Trainer(config, progress=False).build_model()
