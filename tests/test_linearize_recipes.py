"""seqmix.linearize's recipes and the pipeline options they set: a recipe's fields under the ones given,
the budget split, stage 1 as a sequence of losses (match="phi,block"), the block match, stage 2's CE
weight, LoRA targets and trained sets, uniform:K layers, the per-band length evaluation. Tiny random
Llama teachers (tests/test_linearize.py's), a few steps each."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
from test_linearize import ids, teacher  # noqa: E402

from seqmix.linearize import DEFAULT_RECIPE, RECIPES, LinearizeConfig, linearize, parse_layers, residuals, students, transfer  # noqa: E402
from seqmix.linearize.attention_transfer import block_path, capture  # noqa: E402
from seqmix.linearize.recipes import METHOD_FIELDS, recipe_settings  # noqa: E402
from seqmix.mixers.layers import grouped_rows  # noqa: E402


def cfg(**kw):
    return LinearizeConfig(hf="unused", out="unused", **kw)


# -- the recipes ---------------------------------------------------------------------------------


def test_the_default_recipe_is_the_configs_defaults_and_a_given_field_overrides_a_recipe():
    c = cfg()
    assert c.recipe == DEFAULT_RECIPE
    for k in METHOD_FIELDS:
        want = RECIPES[DEFAULT_RECIPE].settings[k]
        assert getattr(c, k) == (tuple(want) if isinstance(want, list) else want), k
    for name, r in RECIPES.items():
        c = cfg(recipe=name)
        assert c.mixer == r.settings["mixer"] and c.kd == r.settings["kd"] and c.match == r.settings["match"]
        c = cfg(recipe=name, kd=0.25, transfer_lr=5e-4)
        assert (c.kd, c.transfer_lr) == (0.25, 5e-4)
    assert all(set(r.settings) == set(METHOD_FIELDS) for r in RECIPES.values())  # every recipe sets the whole method


def test_a_student_given_without_its_config_drops_the_recipes_config():
    name = next((n for n, r in RECIPES.items() if r.settings["mixer_config"]), None)
    if name is None:
        pytest.skip("no recipe with a student config")
    r = RECIPES[name]
    assert recipe_settings(name, {"mixer": "gla"})["mixer_config"] == {}
    assert recipe_settings(name, {"mixer": "gla", "mixer_config": {"heads": 2}})["mixer_config"] == {"heads": 2}
    assert recipe_settings(name, {"mixer": r.settings["mixer"]})["mixer_config"] == r.settings["mixer_config"]


def test_unknown_recipe_and_bad_method_fields_name_the_argument():
    with pytest.raises(ValueError, match="recipe"):
        cfg(recipe="nope")
    with pytest.raises(ValueError, match="match"):
        cfg(match="output,nope")
    with pytest.raises(ValueError, match="transfer_split"):
        cfg(match="phi,block", transfer_split=(1.0,))
    with pytest.raises(ValueError, match="finetune_trainable"):
        cfg(lora_rank=0, finetune_trainable="lora")
    with pytest.raises(ValueError, match="ce, kd"):
        cfg(ce=0.0, kd=0.0)


def test_the_budget_is_split_by_transfer_share_unless_the_stages_tokens_are_given():
    c = cfg(tokens=90_000, transfer_share=1 / 3)
    assert (c.transfer_tokens, c.finetune_tokens) == (30_000, 60_000)
    c = cfg(tokens=90_000, transfer_share=0.5, finetune_tokens=7)
    assert (c.transfer_tokens, c.finetune_tokens) == (45_000, 7)
    c = cfg(tokens=90_000, stages=("finetune",))
    assert (c.transfer_tokens, c.finetune_tokens) == (0, 90_000)
    # stage 1's steps split between its losses in the ratio transfer_split, every step given out
    c = cfg(tokens=10 * 16 * 128, transfer_share=1.0, stages=("transfer",), match="phi,block", transfer_split=(1, 2))
    assert c.transfer_steps() == [3, 7] and c.matches == ["phi", "block"]


def test_uniform_layers_keep_evenly_spaced_softmax_layers():
    assert parse_layers("uniform:2", 4) == ([0, 2], None)  # kept: 1, 3 (Mamba-in-the-Llama's odd layers at 50%)
    assert parse_layers("uniform:50%", 4) == ([0, 2], None)
    assert parse_layers("uniform:1", 4) == ([0, 1, 2], None)
    assert parse_layers("uniform:4", 32)[0] == [i for i in range(32) if i not in (7, 15, 23, 31)]
    assert parse_layers("uniform:25%", 8) == ([0, 1, 2, 4, 5, 6], None)
    assert parse_layers("uniform:0", 3) == ([0, 1, 2], None)
    with pytest.raises(ValueError, match="layers"):
        parse_layers("uniform:4", 4)


# -- stage 1: the block match ------------------------------------------------------------------


def test_block_path_and_capture_record_the_decoder_layers_call():
    m = teacher(layers=2)
    assert block_path("model.layers.1.self_attn") == "model.layers.1"
    with pytest.raises(ValueError, match="block"):
        block_path("encoder.attn")
    x = ids(2, 12)
    with torch.no_grad(), capture(m, [0, 1], level="block") as cap:
        out = m(input_ids=x, use_cache=False, output_hidden_states=True)
    hs = out.hidden_states  # (embeddings, after layer 0, after layer 1 [final norm applied to the last])
    torch.testing.assert_close(cap.inputs[0], hs[0])
    torch.testing.assert_close(cap.outputs[0], hs[1])
    torch.testing.assert_close(cap.inputs[1], hs[1])
    # the captured call replays: the teacher's own layer on its captured input gives its captured output
    args, kwargs = cap.calls[1]
    with torch.no_grad():
        again = m.model.layers[1](cap.inputs[1], *args, **kwargs)
    torch.testing.assert_close(again[0] if isinstance(again, tuple) else again, cap.outputs[1])


@pytest.mark.parametrize("trainable", ["all", "block"])
def test_block_matching_lowers_each_blocks_residual_and_trains_what_it_names(trainable):
    m = teacher(layers=2)
    lin = linearize(m, mixer="gla")
    held = [ids(2, 16, seed=5)]
    before = residuals(lin, m, held, match="block")
    mlp0 = lin.model.layers[0].mlp.down_proj.weight.detach().clone()
    hist = transfer(lin, m, lambda step: ids(2, 16, seed=step), steps=12, match="block", lr=1e-2, trainable=trainable)
    after = residuals(lin, m, held, match="block")
    assert len(hist) == 12
    assert all(after[l] < before[l] for l in before), (before, after)
    moved = not torch.equal(lin.model.layers[0].mlp.down_proj.weight, mlp0)
    assert moved == (trainable == "block")  # "all": the students alone; "block": their decoder layers too
    assert all(p.requires_grad for p in lin.parameters())  # nothing left frozen for stage 2


# -- stage 2: CE weight, LoRA targets, trained sets --------------------------------------------


def test_ce_weight_zero_trains_on_the_kd_term_alone():
    from seqmix.linearize.finetune import LinearizedLM
    from seqmix.train.trainer import Trainer

    m = teacher(layers=2)
    lin = linearize(m, mixer="gla")
    model = LinearizedLM(lin, None, teacher=m, kd=1.0, ce=0.0).train()
    x = ids(2, 10)
    logits, target = model.scored_logits(x, x)
    ce = torch.nn.functional.cross_entropy(logits, target)
    loss = Trainer.ce_weight(model) * ce + Trainer.auxiliary_loss(model)
    with torch.no_grad():
        t = m(input_ids=x, use_cache=False).logits.reshape(-1, logits.shape[-1])
    kl = torch.nn.functional.kl_div(logits.log_softmax(-1), t.log_softmax(-1), log_target=True, reduction="batchmean")
    torch.testing.assert_close(loss, kl)
    assert Trainer.ce_weight(torch.nn.Linear(1, 1)) == 1.0  # a model without the attribute: the plain CE


@pytest.mark.parametrize("targets,trainable", [("kept", "students"), ("students", "lora"), ("all", "all"), ("students", "students")])
def test_lora_targets_and_the_trained_set(targets, trainable):
    pytest.importorskip("peft")
    from seqmix.linearize.finetune import lora

    m = teacher(layers=2)
    lin = linearize(m, mixer="gla")
    peft_model = lora(lin, 2, targets=targets, trainable=trainable)
    names = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    adapters = {n for n in names if "lora_" in n}
    on_students = {n for n in adapters if ".mixer." in n}
    on_kept = adapters - on_students
    assert bool(on_students) == (targets in ("students", "all"))
    assert bool(on_kept) == (targets in ("kept", "all"))
    if targets in ("students", "all"):  # the students' projections copied from q/k/v/o: W_q, W_k, W_v, W_o
        assert {n.split(".mixer.")[1].split(".")[0] for n in on_students} == {"W_q", "W_k", "W_v", "W_o"}
    plain = names - adapters
    assert not any("base_layer" in n for n in plain)  # wrapped weights stay frozen
    student_plain = {n for n in plain if ".mixer." in n}
    assert bool(student_plain) == (trainable in ("students", "all"))  # e.g. GLA's decay projection
    assert bool(plain - student_plain) == (trainable == "all")  # embeddings, norms


def test_full_fine_tuning_trained_sets():
    from seqmix.linearize.finetune import set_trainable

    lin = set_trainable(linearize(teacher(layers=2), mixer="gla"), "students")
    trained = {n for n, p in lin.named_parameters() if p.requires_grad}
    assert trained and all(".self_attn.mixer." in n for n in trained)
    lin = set_trainable(lin, "all")
    assert all(p.requires_grad for p in lin.parameters())
    with pytest.raises(ValueError, match="trainable"):
        set_trainable(lin, "lora")


# -- the pipeline ----------------------------------------------------------------------------


def test_pipeline_runs_a_two_loss_stage_1_and_a_kd_only_stage_2_and_evaluates_length(tmp_path):
    from seqmix.linearize import run

    m = teacher(layers=2, vocab=256)
    m.save_pretrained(tmp_path / "teacher")
    c = LinearizeConfig(hf=str(tmp_path / "teacher"), mixer="gla", match="phi,block", transfer_split=(1, 2), seq_len=16,
                        batch_size=2, tokens=32 * 9, transfer_share=2 / 3, kd=1.0, ce=0.0, lora_rank=0, phi_len=16,
                        eval_batches=1, length_multiples=(1, 4), layers="uniform:1", out=str(tmp_path / "lin"))
    metrics = run(c, progress=False)
    tr = metrics["stages"]["transfer"]
    assert tr["steps_per_match"] == {"phi": 2, "block": 4} and tr["steps"] == 6
    assert metrics["stages"]["finetune"]["ce"] == 0.0 and metrics["kept_softmax"] == [1]  # uniform:1 of 2: the last layer
    length = metrics["length"]
    assert length["window"] == 64 and length["bands"] == ["0-16", "16-64"]
    assert set(length["loss"]) == {"teacher", "student"} and all(len(v) == 2 for v in length["loss"].values())
    saved = json.loads((tmp_path / "lin" / "metrics.json").read_text())
    assert saved["length"] == length


def test_length_bands_score_what_a_shorter_window_scores():
    """A causal model's loss on the band [0, T) of long windows equals its loss on windows of T that start
    at the same places: the evaluation's band [0, T) is the 1x row."""
    from seqmix.data import CorpusConfig
    from seqmix.linearize.pipeline import evaluate_length

    m = teacher(layers=2, vocab=256)
    corpus = CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=16, batch_size=2)
    long = evaluate_length({"t": m}, corpus, (1, 4), windows=4, batch_size=2)
    assert long["window"] == 64 and long["windows"] == 4
    from seqmix.data import build_data

    _, test = build_data(corpus.model_copy(update={"eval_seq_len": 64, "eval_batch_size": 2}))
    total, n = 0.0, 0
    with torch.no_grad():
        for b in [b for _, b in zip(range(2), test.batches())]:
            logits = m(input_ids=b.inputs[:, :16]).logits
            total += float(torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.labels[:, :16])) * b.inputs.shape[0]
            n += b.inputs.shape[0]
    assert abs(long["loss"]["t"][0] - total / n) < 1e-5


class _Logits:
    def __init__(self, logits):
        self.logits = logits


class _CopyFrom(torch.nn.Module):
    """Predicts, at position t, the token that followed position t − d + 1's twin d tokens back (a perfect
    recall of d tokens; nothing before position d): the repeat's loss is ~0, the first occurrence's log V."""

    def __init__(self, d: int, vocab: int = 256):
        super().__init__()
        self.d, self.vocab = d, vocab

    def forward(self, input_ids, use_cache=False):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, self.vocab)
        if self.d < T:
            src = input_ids[:, 1:T - self.d + 1]  # the token after t − d, for t = d .. T − 1
            logits[:, self.d:].scatter_(2, src.unsqueeze(-1), 50.0)
        return _Logits(logits)


def test_recall_at_a_distance_scores_a_perfect_copier_and_a_model_without_memory():
    """evaluate_recall: a model that copies from exactly d tokens back loses log V on the first occurrence and ~0
    on the repeat (gain log V); one with uniform logits gains nothing; the distance is checked."""
    import math

    from seqmix.data import CorpusConfig
    from seqmix.linearize.pipeline import evaluate_recall

    corpus = CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=32, batch_size=2)
    rec = evaluate_recall({"copy": _CopyFrom(20), "none": _CopyFrom(40), "next": _CopyFrom(19)}, corpus, 20,
                          windows=4, batch_size=2)
    assert rec["distance"] == 20 and rec["windows"] == 4
    copy, none, off = rec["loss"]["copy"], rec["loss"]["none"], rec["loss"]["next"]
    assert abs(copy["first"] - math.log(256)) < 1e-6 and copy["repeat"] < 1e-6 and abs(copy["gain"] - math.log(256)) < 1e-6
    assert abs(none["gain"]) < 1e-9 and abs(none["first"] - math.log(256)) < 1e-6
    assert off["repeat"] > 1.0  # copying from one token off is not recall at this distance
    assert evaluate_recall({"copy": _CopyFrom(20)}, corpus, windows=2, batch_size=2)["distance"] == 20  # 5T/8
    for bad in (31, 12):  # past T − 2; below T/2 the repeat would score repeats as first occurrences
        with pytest.raises(ValueError, match="distance"):
            evaluate_recall({"copy": _CopyFrom(20)}, corpus, bad)
    assert evaluate_recall({"copy": _CopyFrom(20)}, corpus, windows=5, batch_size=4)["windows"] == 5


# -- every recipe ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_and_ablation_is_a_valid_config_whose_claims_name_its_runs(name):
    from seqmix.mixers import mixer_entry

    r = RECIPES[name]
    labels = {name} | {f"{name}:{a}" for a in r.ablations}
    for claim in r.claims:
        assert {claim.a, claim.b} <= labels, claim.text
    m = teacher(layers=4)
    for overrides in [{}, *r.ablations.values()]:
        c = cfg(recipe=name, **overrides)
        mixer_entry(c.mixer)  # registered
        lin = linearize(m, mixer=c.mixer, layers=c.layers, init=c.init, **c.mixer_config)  # the student builds from a teacher
        assert len(students(lin)) == len(parse_layers(c.layers, 4)[0])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_runs_through_the_command_and_its_folder_loads_and_decodes(tmp_path, name):
    pytest.importorskip("peft")
    from seqmix.cli import main
    from seqmix.interop.load import load_converted

    m = teacher(layers=2, vocab=256)
    m.save_pretrained(tmp_path / "teacher")
    out = tmp_path / "lin"
    argv = ["linearize", "--hf", str(tmp_path / "teacher"), "--recipe", name, "--seq-len", "16", "--batch-size", "2",
            "--tokens", str(32 * 6), "--eval-batches", "1", "--length", "1,2", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    c = RECIPES[name].settings
    assert metrics["config"]["recipe"] == name and metrics["config"]["mixer"] == c["mixer"]
    assert list(metrics["stages"]) == list(c["stages"])
    if "transfer" in c["stages"]:
        assert list(metrics["stages"]["transfer"]["steps_per_match"]) == c["match"].split(",")
    back = load_converted(out)
    held = {i for i, _ in students(back).items()}
    assert held and all(a.mixer.registry_name == c["mixer"] for a in students(back).values())
    # the teacher's kv heads (GQA 4/2) kept as the recipe says, through the saved folder
    assert all(bool(grouped_rows(a.mixer)) == c["group_kv"] for a in students(back).values())
    assert back.generate(ids(1, 4, vocab=256), max_new_tokens=3, do_sample=False).shape == (1, 7)


def test_stage1_new_with_no_new_parameters_names_trainable():
    lin = linearize(teacher(layers=2), mixer="liger_gla")  # every weight copied from q/k/v/o: nothing new to train
    with pytest.raises(ValueError, match="trainable"):
        transfer(lin, teacher(layers=2), lambda step: ids(2, 8), steps=1, trainable="new")
    assert all(p.requires_grad for p in lin.parameters())
