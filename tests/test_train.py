"""The trainer: parameter groups, schedule, learning, early stopping, determinism, resume
after a kill, config errors before training; plus a slow check that 2-layer softmax
attention solves MQAR (64, 4)."""

import math

import pytest
import torch
from torch import nn

import seqmix
from seqmix.data import DataConfig, MQARConfig
from seqmix.train import RunConfig, Trainer, TrainConfig, lr_at, make_run_config, no_decay_names, param_groups, train
from resume import kill_and_resume


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _data(L=16, kv=2, V=32, n_train=2048, n_test=256, batch=32, shuffle=False):
    t = dict(seq_len=L, num_kv_pairs=kv, vocab_size=V)
    return DataConfig(train=[MQARConfig(num_examples=n_train, **t)], test=[MQARConfig(num_examples=n_test, **t)],
                      batch_size=batch, shuffle=shuffle)


def _run(**train_kw):
    model = train_kw.pop("model", dict(mixer="linear_attention", d_model=32, channel_mixer="mlp", mixer_kwargs={"n": 16}))
    data = train_kw.pop("data", _data())
    return RunConfig(data=data, model=model, train=TrainConfig(**{"threads": 1, **train_kw}))


# -- optimizer pieces -----------------------------------------------------------------------


class _SSMish(nn.Module):
    """Parameters named as an SSM names them, plus both marking conventions."""

    no_weight_decay = ("B_proj.weight",)

    def __init__(self):
        super().__init__()
        self.A_log = nn.Parameter(torch.zeros(4, 2))
        self.D = nn.Parameter(torch.ones(4))
        self.in_proj = nn.Linear(4, 4)
        self.B_proj = nn.Linear(4, 4, bias=False)
        self.custom = nn.Parameter(torch.zeros(3, 3))
        self.custom._no_weight_decay = True
        self.norm = nn.LayerNorm(4)


def test_no_decay_groups():
    m = nn.Sequential(nn.Embedding(10, 4), _SSMish())
    skip = no_decay_names(m)
    assert skip == {"1.A_log", "1.D", "1.in_proj.bias", "1.B_proj.weight", "1.custom", "1.norm.weight", "1.norm.bias"}
    groups = param_groups(m, 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert id(m[0].weight) in decayed and id(m[1].in_proj.weight) in decayed
    assert sum(len(g["params"]) for g in groups) == len(list(m.parameters()))


def test_lm_groups_cover_every_parameter_once():
    from seqmix.models import build_model

    m = build_model(dict(mixer="linear_attention", d_model=16, vocab_size=20, max_seq_len=8, channel_mixer="mlp"))
    groups = param_groups(m, 0.1)
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(m.parameters()))  # the tied head counted once
    no = {id(p) for p in groups[1]["params"]}
    assert id(m.norm_f.weight) in no and id(m.blocks[0].channel.fc1.bias) in no
    assert id(m.embed.weight) not in no


def test_warmup_then_cosine():
    total, lr = 100, 1.0
    xs = [lr_at(s, total=total, lr=lr, warmup=0.1) for s in range(total)]
    assert xs[0] == pytest.approx(0.1) and xs[9] == pytest.approx(1.0)  # linear warmup over 10 steps
    assert xs[10] == pytest.approx(1.0) and all(b < a for a, b in zip(xs[10:], xs[11:]))  # then cosine, decreasing
    assert xs[-1] < 0.01
    assert xs[10 + 45] == pytest.approx(0.5 * (1 + math.cos(math.pi * 45 / 90)))
    assert lr_at(99, total=100, lr=1.0, warmup=0.0, schedule="constant") == 1.0
    assert lr_at(99, total=100, lr=1.0, warmup=0.1, min_lr=0.1) > 0.1


# -- training ---------------------------------------------------------------------------------


def test_trainer_learns_mqar_with_linear_attention():
    """A short run on linear attention: the loss falls and the accuracy rises far above the
    1/16 of guessing a value (a trainer that does not update would stay there)."""
    r = train(_run(lr=3e-3, epochs=6, early_stop=None), progress=False)
    first, last = r.history[0], r.history[-1]
    assert last["loss"] < first["loss"] - 0.5
    assert r.accuracy > 0.4
    assert r.steps == 6 * 64 and r.epochs == 6 and len(r.history) == 6
    assert r.tokens_per_s > 0 and r.state_size == 2 * 16 * (32 + 1)
    assert set(r.slices) == {"mqar(L=16,kv=2)"}


def test_early_stop_and_max_steps():
    r = train(_run(lr=3e-3, epochs=5, early_stop=1e-6), progress=False)
    assert r.early_stopped and r.epochs == 1
    r = train(_run(lr=3e-3, epochs=5, max_steps=70), progress=False)
    assert r.steps == 70 and r.epochs == 2


def test_schedule_steps_runs_the_first_steps_of_a_longer_schedule():
    """train.schedule_steps: the rate of each step is the longer schedule's (read back from the
    history's lr at each evaluation); unset, the schedule spans the run; shorter than the run: refused
    by name. The run id changes only when the field is set."""
    small = _data(n_train=512, n_test=64)
    cut = train(_run(lr=1e-2, max_steps=30, eval_every_steps=10, early_stop=None, schedule_steps=300, data=small),
                progress=False)
    assert cut.steps == 30 and {10, 20, 30} <= {h["step"] for h in cut.history}
    for h in cut.history:  # each evaluation records the rate of the step before it
        assert h["lr"] == lr_at(h["step"] - 1, total=300, lr=1e-2, warmup=0.1) == pytest.approx(1e-2 * h["step"] / 30)
    whole = train(_run(lr=1e-2, max_steps=30, eval_every_steps=10, early_stop=None, data=small), progress=False)
    for h in whole.history:
        assert h["lr"] == lr_at(h["step"] - 1, total=30, lr=1e-2, warmup=0.1)
    assert whole.history[-1]["lr"] < 1e-4  # the whole cosine within the run
    assert _run(max_steps=30).run_id == _run(max_steps=30, schedule_steps=None).run_id != _run(max_steps=30, schedule_steps=300).run_id
    equal = train(_run(lr=1e-2, max_steps=30, eval_every_steps=10, early_stop=None, schedule_steps=30, data=small),
                  progress=False)
    assert equal.history == whole.history  # a horizon equal to the run is the run's own schedule


def test_schedule_steps_shorter_than_the_run_is_refused_before_the_run_folder(tmp_path):
    """Shorter than max_steps: refused by the config; shorter than the epochs' steps (known once the data
    is built): refused by the trainer, before it makes the run folder."""
    small = _data(n_train=512, n_test=64)  # 16 steps an epoch
    with pytest.raises(ValueError, match="schedule_steps = 20 is shorter than max_steps = 30"):
        make_run_config(data=small.model_dump(), model=dict(mixer="linear_attention", d_model=32),
                        train=dict(max_steps=30, schedule_steps=20))
    with pytest.raises(ValueError, match="schedule_steps = 20 is shorter than the run's 32"):
        Trainer(_run(lr=1e-2, epochs=2, schedule_steps=20, data=small), run_dir=tmp_path / "run", progress=False).fit()
    assert not (tmp_path / "run").exists()


def test_schedule_steps_resumes_exactly(tmp_path):
    """Killed at step 20 of a 40-step cut of a 400-step schedule and restarted: the same history,
    the rates of the longer schedule included."""
    cfg = _run(lr=1e-2, max_steps=40, eval_every_steps=10, early_stop=None, schedule_steps=400,
               data=_data(n_train=512, n_test=64, shuffle=True))
    full, part, resumed = kill_and_resume(cfg, tmp_path, hook="on_checkpoint", at=20, reseed=99)
    assert part.status == "interrupted" and resumed.status == "finished" and resumed.steps == 40
    assert resumed.history == full.history
    assert [h["lr"] for h in full.history if h["step"] % 10 == 0] == [lr_at(s - 1, total=400, lr=1e-2, warmup=0.1)
                                                                     for s in (10, 20, 30, 40)]


def test_deterministic_by_seed():
    small = _data(n_train=512, n_test=128)
    a = train(_run(lr=3e-3, epochs=1, seed=5, data=small), progress=False)
    b = train(_run(lr=3e-3, epochs=1, seed=5, data=small), progress=False)
    c = train(_run(lr=3e-3, epochs=1, seed=6, data=small), progress=False)
    assert a.history == b.history
    assert a.history != c.history


def test_resume_after_kill_equals_uninterrupted(tmp_path):
    """Killed after epoch 2 of 4 and restarted: the same metrics, epoch by epoch."""
    cfg = _run(lr=3e-3, epochs=4, early_stop=None, data=_data(n_train=512, shuffle=True),
               model=dict(mixer="linear_attention", d_model=32, channel_mixer="mlp", embed_dropout=0.1, resid_dropout=0.1))
    full, part, resumed = kill_and_resume(cfg, tmp_path, hook="on_epoch", at=2, reseed=1234)
    assert part.status == "interrupted" and part.epochs == 2
    assert resumed.status == "finished" and resumed.epochs == 4
    strip = lambda h: [{k: v for k, v in e.items()} for e in h]  # noqa: E731
    assert strip(resumed.history) == strip(full.history)
    assert resumed.accuracy == full.accuracy and resumed.steps == full.steps
    # a finished run is not trained again
    again = Trainer(cfg, run_dir=tmp_path / "b", progress=False, on_epoch=lambda *a: pytest.fail("retrained")).fit()
    assert again.history == resumed.history


@pytest.mark.parametrize("fields,name", [
    (dict(train={"lr": 0.0}), "train.lr"),
    (dict(train={"lr": -1e-3}), "train.lr"),
    (dict(model={"mixer": "not_a_mixer"}), "model.mixer"),
    (dict(data={"train": [{"task": "mqar", "seq_len": 64, "num_kv_pairs": 17, "num_examples": 8}]}), "num_kv_pairs"),
    (dict(data={"train": [{"task": "no_such_task", "num_examples": 8}]}), "no_such_task"),
    (dict(train={"epochs": 0}), "train.epochs"),
    (dict(model={"mixer": "linear_attention", "max_seq_len": 8}), "max_seq_len"),
    (dict(train={"warmup": 1.5}), "train.warmup"),
])
def test_bad_configs_fail_before_training_naming_the_field(fields, name):
    base = {
        "data": {"train": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 8}],
                 "test": [{"task": "mqar", "seq_len": 16, "num_kv_pairs": 2, "vocab_size": 32, "num_examples": 8}]},
        "model": {"mixer": "linear_attention"},
        "train": {"lr": 1e-3},
    }
    for k, v in fields.items():
        base[k] = {**base[k], **v}
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        make_run_config(**base)


def test_run_id_ignores_execution_fields():
    a = _run(lr=1e-3)
    b = RunConfig(**{**a.model_dump(), "train": {**a.train.model_dump(), "threads": 2, "device": "cpu:0"}})
    c = _run(lr=2e-3)
    assert a.run_id == b.run_id != c.run_id


@pytest.mark.slow
def test_softmax_attention_solves_mqar_64_4():
    """2-layer softmax attention reaches >= 99% on MQAR (64, 4) within a few CPU minutes."""
    t = dict(seq_len=64, num_kv_pairs=4, vocab_size=256)
    data = DataConfig(train=[MQARConfig(num_examples=10_000, **t)], test=[MQARConfig(num_examples=1_000, **t)], batch_size=32)
    cfg = RunConfig(data=data, model=dict(mixer="softmax_attention", d_model=64, n_layers=2, channel_mixer="none"),
                    train=TrainConfig(lr=1e-3, epochs=24, early_stop=0.99, threads=1))
    r = train(cfg, progress=False)
    assert r.accuracy >= 0.99, [round(h["accuracy"], 3) for h in r.history]
