"""The language-model backbone: logits at labels, positions by family, the dsf note §5.1
init, channel mixers, hybrids, state size, config errors."""

import math

import pytest
import torch

from seqmix.mixers import build_mixer
from seqmix.mixers.attention import SeparableAttention  # linear_attention is its preset
from seqmix.models import ModelConfig, build_model

BASE = dict(mixer="linear_attention", d_model=32, vocab_size=97, max_seq_len=16, mixer_kwargs={"n": 16})


def test_scored_logits_equal_full_logits_at_labels():
    m = build_model({**BASE, "channel_mixer": "mlp"}).eval()
    x = torch.randint(0, 97, (3, 16))
    labels = torch.full((3, 16), -100)
    labels[0, 5], labels[1, 9], labels[2, 15], labels[2, 0] = 4, 7, 9, 1
    logits, target = m.scored_logits(x, labels)
    full = m(x)
    mask = labels != -100
    assert logits.shape == (4, 97) and torch.equal(target, labels[mask])
    assert torch.allclose(logits, full[mask], atol=1e-5)


def test_head_is_tied_to_the_embedding():
    m = build_model(BASE)
    h = torch.randn(5, 32)
    assert torch.allclose(m.head(h), h @ m.embed.weight.T)
    assert sum(p.data_ptr() == m.embed.weight.data_ptr() for p in m.parameters()) == 1


def test_positions_by_family(monkeypatch):
    assert ModelConfig(**BASE).use_positions  # attention family: learned positions
    assert build_model(BASE).pos is not None
    monkeypatch.setattr(SeparableAttention, "family", "ssm")
    assert not ModelConfig(**BASE).use_positions  # SSMs: none (DSF paper)
    assert build_model(BASE).pos is None
    assert ModelConfig(**{**BASE, "positions": "learned"}).use_positions  # explicit choice wins
    monkeypatch.undo()
    assert not ModelConfig(**{**BASE, "positions": "none"}).use_positions


def test_positions_change_the_output():
    m = build_model(BASE).eval()
    x = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        a = m(x)
        m.pos.weight.add_(0.5)
        b = m(x)
    assert not torch.allclose(a, b)
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.randint(0, 97, (1, 17)))


def test_dsf_init():
    torch.manual_seed(0)
    m = build_model({**BASE, "d_model": 128, "n_layers": 4, "channel_mixer": "mlp", "mixer_kwargs": {"n": 128}})
    std_res = 0.02 / math.sqrt(2 * 4)
    assert abs(m.embed.weight.std().item() - 0.02) < 0.002
    for b in m.blocks:
        assert abs(b.mixer.W_qk.weight.std().item() - 0.02) < 0.002
        assert abs(b.mixer.W_o.weight.std().item() - std_res) < 0.1 * std_res  # residual projection
        assert abs(b.channel.fc2.weight.std().item() - std_res) < 0.1 * std_res
        assert abs(b.channel.fc1.weight.std().item() - 0.02) < 0.002
        assert torch.all(b.channel.fc1.bias == 0)


def test_mixer_init_options(monkeypatch):
    torch.manual_seed(0)
    own = build_model({**BASE, "d_model": 128, "mixer_kwargs": {"n": 128}, "mixer_init": "own"})
    # nn.Linear's own init: uniform(±1/sqrt(d)), std 1/sqrt(3d) ≈ 0.051 for d = 128
    assert abs(own.blocks[0].mixer.W_qk.weight.std().item() - 1 / math.sqrt(3 * 128)) < 0.005
    monkeypatch.setattr(SeparableAttention, "no_reinit", ("W_v",), raising=False)
    kept = build_model({**BASE, "d_model": 128, "mixer_kwargs": {"n": 128}})
    assert abs(kept.blocks[0].mixer.W_v.weight.std().item() - 1 / math.sqrt(3 * 128)) < 0.005  # left alone
    assert abs(kept.blocks[0].mixer.W_qk.weight.std().item() - 0.02) < 0.002
    every = build_model({**BASE, "d_model": 128, "mixer_kwargs": {"n": 128}, "mixer_init": "dsf_all"})
    assert abs(every.blocks[0].mixer.W_v.weight.std().item() - 0.02) < 0.002  # the released code's behaviour


@pytest.mark.parametrize("kind", ["mlp", "swiglu", "none"])
def test_channel_mixers(kind):
    m = build_model({**BASE, "channel_mixer": kind})
    y = m(torch.randint(0, 97, (2, 16)))
    assert y.shape == (2, 16, 97)
    has = [b.channel is not None for b in m.blocks]
    assert all(has) == (kind != "none")
    if kind == "swiglu":
        assert m.blocks[0].channel.fc2.in_features % 8 == 0


def test_state_size_sums_the_mixers():
    m = build_model({**BASE, "n_layers": 3})
    per = build_mixer("linear_attention", d_model=32, n=16).state_size()
    assert m.state_size() == 3 * per == sum(b.mixer.state_size() for b in m.blocks)


def test_hybrid_cycles_mixers():
    m = build_model({**BASE, "mixer_kwargs": {}, "n_layers": 3, "hybrid": [{"mixer": "linear_attention", "mixer_kwargs": {"n": 8}},
                                                        {"mixer": "linear_attention", "mixer_kwargs": {"n": 32}}]})
    assert [b.mixer.n for b in m.blocks] == [8, 32, 8]
    assert m.state_size() == sum(build_mixer("linear_attention", d_model=32, n=k).state_size() for k in (8, 32, 8))


@pytest.mark.parametrize("bad,field", [
    ({"mixer": "no_such_mixer"}, "mixer"),
    ({"mixer_kwargs": {"n": 15, "heads": 2}}, "mixer_kwargs"),
    ({"mixer_kwargs": {"d_model": 8}}, "mixer_kwargs"),
    ({"channel_mixer": "moe"}, "channel_mixer"),
    ({"d_model": 0}, "d_model"),
    ({"colour": "red"}, "colour"),
    ({"hybrid": [{"mixer": "nope"}]}, "hybrid"),
])
def test_bad_model_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        build_model({**BASE, **bad})


def test_input_checks():
    m = build_model(BASE)
    with pytest.raises(ValueError, match="input_ids"):
        m(torch.randint(0, 97, (16,)))
    with pytest.raises(ValueError, match="labels"):
        m.scored_logits(torch.randint(0, 97, (2, 16)), torch.zeros(2, 15, dtype=torch.long))


def test_layer_patterns():
    from seqmix.models import layer_pattern, list_patterns

    assert {p.name for p in list_patterns()} >= {"mamba_swa", "mamba_only", "attention_only", "bmojo", "bmojo_f"}
    cfg = ModelConfig(pattern="mamba_swa", pattern_kwargs={"window": 4}, d_model=16, n_layers=4, vocab_size=97, max_seq_len=16)
    assert cfg.mixer == "mamba" and not cfg.use_positions
    assert [cfg.layer_mixer(i)[0] for i in range(4)] == ["mamba", "softmax_attention"] * 2
    m = build_model(cfg)
    names = [b.mixer.registry_name for b in m.blocks]
    assert names == ["mamba", "softmax_attention"] * 2 and m.blocks[1].mixer.config.window == 4
    assert m(torch.randint(0, 97, (2, 16))).shape == (2, 16, 97)
    # a pattern is only a name for a hybrid list
    explicit = ModelConfig(mixer="mamba", hybrid=layer_pattern("mamba_swa", window=4), d_model=16, n_layers=4, vocab_size=97)
    assert explicit.layers == cfg.layers and not cfg.hybrid
    # the pattern, not its expansion, is stored: a round trip and a changed pattern argument both work
    again = ModelConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg and again.layers == cfg.layers
    wider = build_model(cfg, pattern_kwargs={"window": 8})
    assert wider.blocks[1].mixer.config.window == 8
    att = ModelConfig(pattern="attention_only", d_model=16, vocab_size=97, max_seq_len=16)
    assert att.mixer == "softmax_attention" and att.use_positions


@pytest.mark.parametrize("bad,match", [
    ({"pattern": "no_such_pattern"}, "unknown layer pattern 'no_such_pattern'"),
    ({"pattern": "mamba_swa", "pattern_kwargs": {"window": 0}}, "window"),
    ({"pattern": "mamba_only", "hybrid": [{"mixer": "s6"}]}, "either 'pattern' or 'hybrid'"),
    ({"pattern": "mamba_swa", "pattern_kwargs": {"windw": 4}}, "pattern_kwargs.*windw"),
    ({"pattern": "attention_only", "mixer": "mamba"}, "'mixer' = 'mamba' is not the first layer's mixer"),
    ({"pattern": "mamba_only", "mixer_kwargs": {"d_state": 4}}, "'mixer_kwargs' is not used with a 'pattern'"),
    ({"mixer": "mamba", "pattern_kwargs": {"window": 4}}, "'pattern_kwargs' is set without a 'pattern'"),
    ({"mixer": "mamba", "mixer_kwargs": {"d_state": 4}, "hybrid": [{"mixer": "s6"}]}, "'mixer_kwargs' is not used with 'hybrid'"),
    ({"pattern": "mamba_only", "pattern_kwargs": [1]}, "pattern_kwargs"),
])
def test_bad_patterns(bad, match):
    with pytest.raises(ValueError, match=match):
        build_model({"d_model": 16, "vocab_size": 97, "max_seq_len": 16, **bad})
