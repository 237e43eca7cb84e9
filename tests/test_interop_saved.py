"""Every folder a converted model is saved to loads exactly, or is refused loudly (seqmix.interop.saved,
seqmix.interop.load_converted): a linearized model, a model with a placed mixer and a plain converted
model save under the model type "seqmix_converted"; with seqmix imported, AutoModelForCausalLM and
load_converted return the model (logits equal to the saved model's); in a process that does not import
seqmix, transformers refuses the folder by that name; folders written with the family's model type and a
``seqmix_placed`` record still load; a folder whose weights do not fill the model is a ValueError. Tiny
random models, nothing downloaded."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, MambaConfig, MambaForCausalLM  # noqa: E402

from seqmix import build_mixer  # noqa: E402
from seqmix.interop import MODEL_TYPE, SeqmixConvertedConfig, from_transformers, load_converted, place_mixer  # noqa: E402
from seqmix.linearize import linearize, save  # noqa: E402
from test_linearize import ids, teacher  # noqa: E402


def _mamba():
    torch.manual_seed(0)
    return MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, state_size=4)).eval()


def _linearized():
    return linearize(teacher(), mixer="gla", layers=[0, 2])


def _logits(model, x):
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("kind", ["linearized", "placed", "converted"])
def test_saved_folder_is_a_seqmix_model_type_and_loads_exactly(kind, tmp_path):
    """The three kinds of folders: config.json names "seqmix_converted" (the family in seqmix_model_type);
    AutoModelForCausalLM (seqmix imported) and load_converted (str or Path) return the family's class with
    the saved model's logits, bit for bit."""
    x = ids(2, 10)
    if kind == "linearized":
        model, family = _linearized(), "llama"
        save(model, tmp_path)
    elif kind == "placed":
        model, family = teacher(), "llama"
        place_mixer(model, "model.layers.1.self_attn", build_mixer("retnet", d_model=32, heads=4))
        model.save_pretrained(tmp_path)
    else:
        model, family = from_transformers(_mamba()), "mamba"
        model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == MODEL_TYPE and cfg["seqmix_model_type"] == family
    assert model.config.model_type == family  # the live model's config is the family's
    auto_cfg = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(auto_cfg, SeqmixConvertedConfig) and auto_cfg.family_config().model_type == family
    want = _logits(model, x)
    for back in (AutoModelForCausalLM.from_pretrained(tmp_path), load_converted(tmp_path), load_converted(str(tmp_path))):
        assert type(back) is type(model)
        assert torch.equal(_logits(back, x), want)
    # saved again, it is still a seqmix folder, and loads the same
    back.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model_type"] == MODEL_TYPE
    assert torch.equal(_logits(load_converted(tmp_path / "again"), x), want)


def test_without_seqmix_transformers_refuses_the_folder_by_name(tmp_path):
    """A process that never imports seqmix: AutoModelForCausalLM.from_pretrained fails naming the model type
    (rather than loading the family's class with the mixers' weights dropped)."""
    save(_linearized(), tmp_path)
    code = ("import sys\nfrom transformers import AutoModelForCausalLM\n"
            "try:\n    AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
            "except ValueError as e:\n    print('REFUSED', e)\nelse:\n    print('LOADED')\n"
            "print('seqmix imported' if any(m.split('.')[0] == 'seqmix' for m in sys.modules) else 'seqmix not imported')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert "seqmix not imported" in out.stdout, out.stdout + out.stderr
    assert "REFUSED" in out.stdout and MODEL_TYPE in out.stdout, out.stdout + out.stderr


def test_a_folder_in_the_family_model_type_with_a_placed_record_still_loads(tmp_path):
    """A folder whose config.json carries the family's model type and ``seqmix_placed`` (as linearized folders
    were saved before the seqmix model type) loads with its students."""
    lin = _linearized()
    save(lin, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = cfg.pop("seqmix_model_type")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    x = ids(1, 8)
    assert torch.equal(_logits(load_converted(tmp_path), x), _logits(lin, x))


def test_a_folder_whose_weights_do_not_fill_the_model_is_refused(tmp_path):
    """A mixer weight missing, or a weight the model does not read: a ValueError naming the argument and the weight."""
    save(_linearized(), tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    key = next(k for k in weights if k.startswith("model.layers.0.self_attn.mixer."))
    save_file({k: v for k, v in weights.items() if k != key}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"argument 'path'.*{key}"):
        load_converted(tmp_path)
    save_file({**weights, "model.layers.1.mlp.extra.weight": torch.zeros(2)}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match="argument 'path'.*mlp.extra.weight"):
        load_converted(tmp_path)


def test_load_converted_bad_path_names_the_argument(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "nowhere", tmp_path / "file.txt", tmp_path / "empty", "", 3):
        with pytest.raises(ValueError, match="argument 'path'"):
            load_converted(bad)
    LlamaConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(tmp_path / "cfg")
    with pytest.raises(ValueError, match="argument 'path'"):  # a config without weights
        load_converted(tmp_path / "cfg")


def test_the_converted_config_copies_and_pickles_as_itself():
    """deepcopy and pickle keep the config's class (and so what it saves as)."""
    conv = from_transformers(_mamba())
    for back in (copy.deepcopy(conv.config), pickle.loads(pickle.dumps(conv.config))):
        assert type(back) is type(conv.config) and back.to_dict() == conv.config.to_dict()
        assert back.to_dict()["model_type"] == MODEL_TYPE and back.model_type == "mamba"
