"""Language modelling end to end on local text: the step-based trainer on a corpus
(perplexity, bits per byte, token budget, gradient accumulation, precision, exact resume
after a kill, the run folder), length generalization, `seqmix lm train/eval` and
`seqmix results`. Tiny corpora and models: the file runs in well under a minute."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqmix.data import DataConfig, MQARConfig
from seqmix.data.text import CorpusConfig, build_corpus, load_tokenizer
from seqmix.train import RunConfig, Trainer, TrainConfig
from resume import kill_and_resume
from tolerances import BF16_LOSS_RTOL, LOSS_RTOL

TEXT = "".join(f"{w} and {w} went up the hill to fetch a pail of water.\n" for w in ["Jack", "Jill", "Tom", "Ann"] * 60)


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "rhymes.txt"
    p.write_text(TEXT)
    return str(p)


def _lm(corpus, *, mixer="linear_attention", tokenizer="char", model=None, **train):
    data = CorpusConfig(corpus=corpus, tokenizer=tokenizer, seq_len=32, batch_size=8, eval_batch_size=16, val_fraction=0.1, test_fraction=0.1)
    m = {"mixer": mixer, "d_model": 32, "n_layers": 2, **(model or {})}
    return RunConfig(experiment="lm-test", data=data, model=m,
                     train=TrainConfig(**{"lr": 3e-3, "max_steps": 40, "early_stop": None, "threads": 1, "eval_every_steps": 20, **train}))


def test_lm_run_learns_and_reports_ppl_and_bits_per_byte(tmp_path, corpus):
    cfg = _lm(corpus)
    r = Trainer(cfg, run_dir=tmp_path / "run", progress=False, peak_flops=1e10).fit()
    first, last = r.history[0], r.history[-1]
    assert r.steps == 40 and r.tokens == 40 * 8 * 32 and [h["step"] for h in r.history] == [20, 40]
    assert last["loss"] < math.log(cfg.data.vocab_size) - 1.0  # far below guessing uniformly
    assert r.ppl == pytest.approx(math.exp(r.loss)) and r.best_step == 40
    # the evaluation, recomputed by a direct loop over the contiguous validation windows
    from seqmix.analysis.trained import load_run

    _, model = load_run(tmp_path / "run")
    val = build_corpus(cfg.data, "val")
    tot, n = 0.0, 0
    with torch.no_grad():
        for b in val.batches():
            tot += float(F.cross_entropy(model(b.inputs).flatten(0, 1), b.labels.flatten(), reduction="sum"))
            n += b.labels.numel()
    assert r.loss == pytest.approx(tot / n, rel=LOSS_RTOL)
    n_bytes = json.loads(next((tmp_path / "cache" / "text").glob("*/meta.json")).read_text())["splits"]["val"]["bytes"]
    assert r.bpb == pytest.approx(r.loss / math.log(2) / (n_bytes / len(val.tokens)), rel=1e-9)
    assert r.mfu == pytest.approx(r.tokens_per_s * r.flops_per_token / 1e10)
    # the run folder is self-contained: tokenizer, checkpoint, result, TensorBoard events
    tok = load_tokenizer(tmp_path / "run" / "tokenizer.json")
    assert tok.decode(tok.encode("Jack and Jill")) == "Jack and Jill" and tok.vocab_size == cfg.model.vocab_size
    assert json.loads((tmp_path / "run" / "result.json").read_text())["bpb"] == r.bpb
    pytest.importorskip("tensorboard")
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_killed_lm_run_resumes_exactly(tmp_path, corpus):
    """Killed at a mid-run checkpoint (between evaluations) and restarted: the same numbers."""
    cfg = _lm(corpus, max_steps=12, eval_every_steps=4, checkpoint_every=3,
              model={"embed_dropout": 0.1, "resid_dropout": 0.1})
    full, part, resumed = kill_and_resume(cfg, tmp_path, hook="on_checkpoint", at=6, reseed=99)
    assert part.status == "interrupted" and part.steps == 6
    assert resumed.status == "finished" and resumed.steps == 12
    assert resumed.history == full.history and resumed.bpb == full.bpb and resumed.tokens == full.tokens


def test_token_budget_and_gradient_accumulation(corpus):
    r = Trainer(_lm(corpus, max_steps=None, max_tokens=5000, grad_accum=2, eval_batches=1), progress=False).fit()
    assert r.steps == math.ceil(5000 / (2 * 8 * 32)) and r.tokens == r.steps * 2 * 8 * 32
    # accumulating two micro-batches of 16 = one batch of 32 (MQAR, fixed order): the same step
    t = dict(seq_len=16, num_kv_pairs=2, vocab_size=32)
    runs = []
    for batch, acc in ((32, 1), (16, 2)):
        data = DataConfig(train=[MQARConfig(num_examples=64, **t)], test=[MQARConfig(num_examples=32, **t)], batch_size=batch, test_batch_size=32)
        cfg = RunConfig(data=data, model={"mixer": "linear_attention", "d_model": 16}, train=TrainConfig(
            lr=1e-2, max_steps=1, grad_accum=acc, warmup=0.0, early_stop=None, threads=1, grad_clip=None))
        runs.append(Trainer(cfg, progress=False, maps=False).fit())
    assert runs[0].steps == runs[1].steps == 1
    assert runs[1].history[0]["loss"] == pytest.approx(runs[0].history[0]["loss"], rel=1e-5)
    assert runs[1].history[0]["train_loss"] == pytest.approx(runs[0].history[0]["train_loss"], rel=1e-5)


def test_bf16_autocast_evaluates_close_to_fp32(tmp_path, corpus):
    cfg = _lm(corpus, max_steps=20)
    Trainer(cfg, run_dir=tmp_path / "r", progress=False).fit()
    from seqmix.analysis.trained import load_run

    config, model = load_run(tmp_path / "r")
    val = build_corpus(cfg.data, "val")
    ref = Trainer(config, progress=False).evaluate(model, val)
    bf = Trainer(config.model_copy(update={"train": config.train.model_copy(update={"precision": "bf16"})}), progress=False).evaluate(model, val)
    assert ref["loss"] != bf["loss"] and bf["loss"] == pytest.approx(ref["loss"], rel=BF16_LOSS_RTOL)
    r = Trainer(_lm(corpus, mixer="gla", max_steps=4, precision="bf16", eval_batches=1), progress=False).fit()
    assert r.history[-1]["loss"] < math.log(cfg.data.vocab_size)
    # fp16: the gradient scaler skips the overflowing first steps instead of writing non-finite weights
    r = Trainer(_lm(corpus, mixer="gla", max_steps=4, precision="fp16", eval_batches=1), progress=False).fit()
    assert math.isfinite(r.loss)


def test_length_generalization_recurrent_vs_learned_positions(tmp_path, corpus):
    from seqmix.analysis.lm import evaluate_lm, length_generalization, plot_length_generalization, position_losses
    from seqmix.analysis.trained import load_run

    lgs = []
    for name, model in (("nope", {"positions": "none"}), ("learned", {"positions": "learned"})):
        Trainer(_lm(corpus, max_steps=10, model=model), run_dir=tmp_path / name, progress=False).fit()
        config, m = load_run(tmp_path / name)
        lg = length_generalization(config, m, multiples=(1, 2, 4))
        lgs.append(lg)
        one = lg["results"][0]
        # the 1× figure is the trainer's own evaluation of the same windows
        ev = evaluate_lm(config, m, batch_size=one["windows"], max_batches=1)
        assert one["loss"] == pytest.approx(ev["loss"], rel=LOSS_RTOL)
        assert len(one["position_loss"]) == 32
        if name == "nope":
            assert [r["k"] for r in lg["results"] if "ppl" in r] == [1, 2, 4]
            assert len({r["tokens"] for r in lg["results"]}) == 1  # the same tokens at every length
            pl = position_losses(m, build_corpus(config.data, "val", seq_len=128), max_windows=2)
            assert pl.shape == (128,)
        else:
            assert "ppl" in one and all("learned position table" in r["error"] for r in lg["results"][1:])
            with pytest.raises(ValueError, match="learned position table"):
                evaluate_lm(config, m, seq_len=64)
    assert plot_length_generalization(lgs, tmp_path / "len.png").stat().st_size > 1000


def test_flops_per_token_counts_the_attention_term():
    from seqmix.models import build_model
    from seqmix.train.flops import flops_per_token

    sm = build_model(dict(mixer="softmax_attention", d_model=32, n_layers=3, vocab_size=50, max_seq_len=256))
    la = build_model(dict(mixer="linear_attention", d_model=32, n_layers=3, vocab_size=50, max_seq_len=256))
    assert flops_per_token(sm, 128) - flops_per_token(sm, 64) == 6 * 3 * 64 * 32
    assert flops_per_token(la, 128) == flops_per_token(la, 64) == 6 * (la.num_params(embeddings=False) + 50 * 32)


def test_cli_lm_train_eval_and_results(tmp_path, corpus, capsys):
    from seqmix.cli import main

    out = tmp_path / "out"
    args = ["lm", "train", "--corpus", corpus, "--tokenizer", "byte", "--mixer", "linear_attention", "--d-model", "16",
            "--layers", "1", "--seq-len", "16", "--batch-size", "4", "--max-steps", "6", "--eval-batches", "2",
            "--out", str(out), "--no-progress", "--threads", "1", "--no-mfu"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "bits/byte" in text and "tokens/s" in text
    run = next((out / "runs").iterdir())
    assert (run / "tokenizer.json").exists() and (run / "checkpoint.pt").exists()
    assert main(["lm", "eval", run.name[:6], "--runs", str(out), "--lengths", "1,2", "--max-tokens", "256"]) == 0
    text = capsys.readouterr().out
    assert "ppl" in text and "2×T = 32" in text and (run / "length.png").exists() and (run / "eval_val.json").exists()
    assert main(["results", "--db", str(out / "results.sqlite")]) == 0
    text = capsys.readouterr().out
    assert "bits/byte" in text and "linear_attention" in text
    # bad input: a clear one-line error, exit code 2
    assert main(["lm", "train", "--corpus", str(tmp_path / "missing.txt"), "--out", str(out)]) == 2
    assert "corpus" in capsys.readouterr().err


def test_lm_preset_grid_and_every_tiny_model_trains(monkeypatch, corpus):
    """dsf-table1-lm: the paper grid expands without touching the network (BPE vocabulary
    known from the config); each model of the tiny scale takes real steps on a small corpus."""
    from seqmix.experiments import PRESETS

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    p = PRESETS["dsf-table1-lm"]
    paper = p.runs("paper")
    assert {r.label for r in paper} == {"softmax", "linear", "normalized"} and len(paper) == 12
    r0 = paper[0]
    assert (r0.model.d_model, r0.model.n_layers, r0.model.mixer_kwargs.get("heads"), r0.data.seq_len) == (512, 6, 8, 1024)
    assert r0.train.betas == (0.9, 0.95) and r0.train.grad_clip == 1.0 and r0.data.batch_size * r0.train.grad_accum == 128
    tiny = p.runs("tiny")
    labels = ["softmax", "linear", "normalized", "S6", "GLA", "MetaLA"]
    assert [(r.label, r.train.seed) for r in tiny] == [(m, s) for m in labels for s in (0, 1)]
    for r in tiny[::2]:
        small = r.data.model_copy(update={"corpus": corpus, "seq_len": 16, "batch_size": 2, "eval_batch_size": 8})
        cfg = r.model_copy(update={"data": small, "train": r.train.model_copy(update={
            "max_tokens": None, "max_steps": 2, "eval_batches": 1, "threads": 1})})
        res = Trainer(cfg, progress=False).fit()
        assert res.steps == 2 and math.isfinite(res.bpb), r.label


def test_lm_claims_in_bits_per_byte():
    from seqmix.experiments import PRESETS, evaluate_claims

    p = PRESETS["dsf-table1-lm"]
    rows = [{"label": lab, "task": "t", "bpb": v} for lab, v in (("softmax", 2.0), ("linear", 3.0), ("normalized", 2.75))]
    gap, below = evaluate_claims(p, rows)
    assert gap["verdict"] == "agrees" and "25% of the gap" in gap["detail"] and below["verdict"] == "agrees"
    rows[2]["bpb"] = 3.1
    assert evaluate_claims(p, rows)[0]["verdict"] == "does not agree"
    assert evaluate_claims(p, rows[:2])[0]["verdict"] == "n/a"
