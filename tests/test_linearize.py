"""seqmix.linearize: the init table, stage 1 (output and Φ matching), auto:K, stage 2's KD term,
the saved folder (load_converted, generate() through the students' constant state), the CLI and
its bad input. Tiny random Llama teachers (nothing downloaded), a few steps each."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from seqmix.interop import InteropMixer, from_transformers, placed_mixers  # noqa: E402
from seqmix.interop import load_converted  # noqa: E402
from browser import CHROMIUM, SKIP_REASON, check_in_browser, console_lines, dump_dom, image_widths  # noqa: E402
from seqmix.linearize import (  # noqa: E402
    attention_layers, build_student, keep_softmax, linearize, phi_loss, residuals, save, students, teacher_weights, transfer,
    valid_students,
)
from seqmix.linearize.attention_transfer import _layer_losses, _teacher_mixers, capture  # noqa: E402

VOCAB = 64
STUDENTS = [("linear_attention", {"feature_map": "hedgehog"}), ("gla", {}), ("retnet", {}), ("gated_deltanet", {}),
            ("mamba2", {}), ("bmojo_f", {"window": 4, "ssm_mode": "chunk", "expand": 1, "d_state": 4})]


def teacher(layers=3, d=32, heads=4, kv_heads=2, vocab=VOCAB, attn="sdpa", seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256)
    cfg._attn_implementation = attn
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper attention than the 0.02 init: maps far from uniform
        for layer in m.model.layers:
            for p in (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight):
                p.normal_(0, 0.5)
    return m


def ids(batch=2, T=24, seed=1, vocab=VOCAB):
    return torch.randint(0, vocab, (batch, T), generator=torch.Generator().manual_seed(seed))


def student_attention(m, x, **kw) -> dict:
    """{layer: the causal softmax of the map of an identity-feature separable student} of teacher ``m`` on tokens ``x``
    (φ = ψ = identity, η = 1, ``kw`` its linearize options): transformers' own attention weights exactly when the
    student's scores are the teacher's logits (q, k copied, the 1/√K scale, RoPE, qk-norm and biases as the teacher's)."""
    studs = students(linearize(m, mixer="separable_attention", feature_map="identity", normalizer="none", **kw))
    with capture(m, studs) as cap, torch.no_grad():
        m(input_ids=x, use_cache=False)
        scores = {layer: a.mixer.phi(cap.inputs[layer]) for layer, a in studs.items()}
    causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
    return {layer: s.masked_fill(~causal, float("-inf")).softmax(-1) for layer, s in scores.items()}


# -- the init table ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", STUDENTS, ids=[s for s, _ in STUDENTS])
def test_init_table_copies_q_k_v_o(name, kw):
    """Every row the table maps holds the teacher's weight (k, v repeated over the GQA groups by hand: the students
    with one k and v per head, group_kv=False)."""
    m = teacher()
    lin = linearize(m, mixer=name, layers=[1], group_kv=False, **kw)
    att = m.model.layers[1].self_attn
    H, Hkv, K = 4, 2, 8
    q = att.q_proj.weight
    k = att.k_proj.weight.view(Hkv, K, -1).repeat_interleave(H // Hkv, 0).reshape(H * K, -1)
    v = att.v_proj.weight.view(Hkv, K, -1).repeat_interleave(H // Hkv, 0).reshape(H * K, -1)
    o = att.o_proj.weight
    s = lin.model.layers[1].self_attn.mixer
    sd = s.state_dict()
    if "W_qk.weight" in sd:
        got = {"q": sd["W_qk.weight"][: H * K], "k": sd["W_qk.weight"][H * K:], "v": sd["W_v.weight"], "o": sd["W_o.weight"]}
    elif "in_proj.weight" in sd:  # [z; x; B; C; dt], d_inner = H·K, one group per head
        D = H * K
        W = sd["in_proj.weight"]
        got = {"v": W[D:2 * D], "k": W[2 * D:3 * D], "q": W[3 * D:4 * D], "o": sd["out_proj.weight"]}
        assert torch.equal(sd["conv.weight"][:, -1], torch.ones_like(sd["conv.weight"][:, -1]))
        assert float(sd["conv.weight"][:, :-1].abs().sum()) == 0.0
    else:
        got = {"q": sd["W_q.weight"], "k": sd["W_k.weight"], "v": sd["W_v.weight"], "o": sd["W_o.weight"]}
    for key, want in {"q": q, "k": k, "v": v, "o": o}.items():
        assert torch.equal(got[key], want.detach()), key
    # the other layers are transformers' own, untouched
    assert type(lin.model.layers[0].self_attn).__name__ == "LlamaAttention"
    assert isinstance(lin.model.layers[1].self_attn, InteropMixer)
    assert m.model.layers[1].self_attn is att  # the teacher is not changed (a copy)


def test_identity_feature_map_student_reproduces_the_teachers_attention():
    """A separable student with φ = ψ = identity and η = 1, initialised from attention, has the
    teacher's logits as its map (q, k copied, kv heads repeated, the 1/√K scale, RoPE at the teacher's
    θ): its causal softmax is the attention map transformers itself returns (eager, output_attentions)."""
    m = teacher(attn="eager")
    x = ids(2, 12)
    out = m(input_ids=x, output_attentions=True, use_cache=False)
    for layer, probs in student_attention(m, x, layers=[0, 1, 2]).items():
        torch.testing.assert_close(probs, out.attentions[layer], rtol=1e-5, atol=1e-6)
    # without RoPE the maps differ: the check can fail
    probs = student_attention(m, x, layers=[0], rope=False)[0]
    assert (probs - out.attentions[0]).abs().max() > 1e-3


def test_students_that_cannot_take_qkv_are_refused_naming_mixer():
    m = teacher(layers=1)
    for bad in ("s4", "hyena", "hgrn", "no_such_mixer"):
        with pytest.raises(ValueError, match="mixer"):
            linearize(m, mixer=bad)
    names = valid_students()
    assert {"linear_attention", "gla", "retnet", "gated_deltanet", "mamba2", "bmojo_f"} <= set(names)
    assert "s4" not in names and "hgrn" not in names


def test_bad_layers_init_and_model_name_the_argument():
    m = teacher(layers=3)
    for bad in ([3], [-1], "auto:3", "auto:x", "1,9", "every"):
        with pytest.raises(ValueError, match="layers"):
            linearize(m, mixer="gla", layers=bad)
    with pytest.raises(ValueError, match="init"):
        linearize(m, mixer="gla", init="zeros")
    for bad in ("yes", 1, 0):
        with pytest.raises(ValueError, match="group_kv"):
            linearize(m, mixer="gla", group_kv=bad)
    from transformers import MambaConfig, MambaForCausalLM

    mamba = MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, state_size=4))
    with pytest.raises(ValueError, match="model"):
        linearize(mamba, mixer="gla")


# -- stage 1 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("match", ["output", "phi"])
def test_stage1_reduces_every_layers_residual(match):
    m = teacher()
    lin = linearize(m, mixer="gla")
    data = [ids(4, 24, seed=s) for s in range(8)]
    held = [ids(4, 24, seed=100)]
    before = residuals(lin, m, held, match=match)
    hist = transfer(lin, m, lambda i: data[i % 8], steps=25, match=match, lr=1e-2, log_every=5)
    after = residuals(lin, m, held, match=match)
    assert len(hist) == 25 and hist[-1]["loss"] < hist[0]["loss"]
    for layer in before:
        assert after[layer] < before[layer], (layer, before, after)
    # only the students were trained: the kept weights are the teacher's
    assert torch.equal(lin.model.layers[0].mlp.up_proj.weight, m.model.layers[0].mlp.up_proj.weight)


def test_phi_matching_is_the_squared_map_error_against_transformers_attention_weights():
    """The Φ loss of a layer equals Σ_j (Φ_s − Φ_t)² averaged over batch, heads and rows, with Φ_t the
    attention probabilities transformers itself returns (eager attention, output_attentions)."""
    m = teacher(attn="eager")
    lin = linearize(m, mixer="gla", layers=[0, 2])
    x = ids(2, 20)
    out = m(input_ids=x, output_attentions=True, use_cache=False)
    studs = students(lin)
    with capture(m, studs) as cap:
        m(input_ids=x, use_cache=False)
    losses = _layer_losses(studs, _teacher_mixers(m, studs), cap, "phi", 512, backward=False)
    for layer, a in studs.items():
        ref_t = out.attentions[layer]  # [B, H, T, T]
        ref_s = a.mixer.phi(cap.inputs[layer])
        want = ((ref_s - ref_t) ** 2).sum(-1).mean()
        torch.testing.assert_close(losses[layer], want.detach(), rtol=1e-4, atol=1e-6)
    # chunks: with phi_len 8 the maps are those of the 8-token pieces, each its own sequence
    chunked = _layer_losses(studs, _teacher_mixers(m, studs), cap, "phi", 8, backward=False)
    xin = cap.inputs[0][:, :16].reshape(4, 8, -1)
    want0 = phi_loss(studs[0].mixer.phi(xin), _teacher_mixers(m, [0])[0].phi(xin))
    torch.testing.assert_close(chunked[0], want0.detach())
    with pytest.raises(ValueError, match="match"):
        transfer(lin, m, lambda i: x, steps=1, match="logits")


def test_phi_matching_refuses_maps_that_do_not_pair():
    m = teacher()
    lin = linearize(m, mixer="bmojo_f", layers=[0], window=4, ssm_mode="chunk", expand=1, d_state=4)  # not one map per head
    with pytest.raises(ValueError, match="match"):
        transfer(lin, m, lambda i: ids(), steps=1, match="phi")


def test_keep_softmax_restores_the_teachers_layer():
    m = teacher()
    lin = linearize(m, mixer="gla")
    keep_softmax(lin, m, [1])
    assert set(students(lin)) == {0, 2}
    assert type(lin.model.layers[1].self_attn).__name__ == "LlamaAttention"
    assert "model.layers.1.self_attn" not in placed_mixers(lin)
    x = torch.randn(1, 6, 32)
    pos = m.model.rotary_emb(x, torch.arange(6)[None])
    a = lin.model.layers[1].self_attn(x, position_embeddings=pos, attention_mask=None)[0]
    b = m.model.layers[1].self_attn(x, position_embeddings=pos, attention_mask=None)[0]
    torch.testing.assert_close(a, b)


# -- the saved folder, decoding ------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", STUDENTS, ids=[s for s, _ in STUDENTS])
def test_saved_folder_loads_and_decodes_with_constant_state(tmp_path, name, kw):
    m = teacher()
    lin = linearize(m, mixer=name, layers=[0, 2], **kw)
    x = ids(1, 12)
    save(lin, tmp_path)
    back = load_converted(tmp_path)
    torch.testing.assert_close(back(x).logits, lin(x).logits, rtol=1e-5, atol=1e-5)
    # greedy generate() through the cache equals the argmax of full forwards
    out = back.generate(x[:, :5], max_new_tokens=6, do_sample=False)
    full = back(out).logits[:, 4:-1].argmax(-1)
    assert torch.equal(full, out[:, 5:])
    # step by step: the students' state does not grow with the tokens
    cache = DynamicCache(config=back.config)
    back(x[:, :5], cache=cache, use_cache=True)
    size = {}
    for t in range(5, 12):
        back(x[:, t:t + 1], cache=cache, use_cache=True)
        for layer in (0, 2):
            st = cache.layers[layer]._seqmix_state
            floats = sum(v.numel() for v in st.values() if isinstance(v, torch.Tensor))
            size.setdefault(layer, floats)
            assert floats == size[layer], (layer, t)
            keys = cache.layers[layer].keys
            assert keys.shape[-2] == t + 1 and keys.untyped_storage().nbytes() <= 4  # one row id (float32), broadcast
    assert cache.layers[1].keys.shape[-2] == 12  # the softmax layer's KV cache grows


def _sequence_logprob(model, seq: list[int], prompt: int) -> float:
    """log p(seq[prompt:] | seq[:prompt]) under ``model``, one token at a time through its own decoding step (a
    fresh cache for this sequence alone: no beam, no reordering)."""
    cache = DynamicCache(config=model.config)
    total = 0.0
    with torch.no_grad():
        for t in range(len(seq) - 1):
            logits = model(torch.tensor([[seq[t]]]), cache=cache, use_cache=True).logits[0, -1]
            if t + 1 >= prompt:
                total += float(torch.log_softmax(logits.double(), -1)[seq[t + 1]])
    return total


def _brute_force_beams(model, prompt: list[int], beams: int, new: int, vocab: int) -> list[tuple[float, list[int]]]:
    """Beam search by enumeration: at each step every continuation of every kept sequence by every token of
    the vocabulary is scored from scratch (:func:`_sequence_logprob`), and the ``beams`` best are kept.
    Returns (log p of the new tokens, sequence), best first."""
    kept = [list(prompt)]
    for _ in range(new):
        scored = [(_sequence_logprob(model, s + [v], len(prompt)), s + [v]) for s in kept for v in range(vocab)]
        scored.sort(key=lambda e: -e[0])
        kept = [s for _, s in scored[:beams]]
    return sorted(((_sequence_logprob(model, s, len(prompt)), s) for s in kept), key=lambda e: -e[0])


@pytest.mark.parametrize("name,kw", [STUDENTS[1], pytest.param(*STUDENTS[3], marks=pytest.mark.slow),
                                     pytest.param(*STUDENTS[4], marks=pytest.mark.slow)], ids=["gla", "gated_deltanet", "mamba2"])
def test_beam_search_of_a_student_equals_brute_force_beam_search(name, kw):
    """generate(num_beams=3) of a linearized model (students in layers 0 and 2, the teacher's softmax in
    layer 1) returns the beams that enumerating every continuation over a vocabulary of 12 finds: the
    students' state follows transformers' reordering of the beams."""
    V, K, new = 12, 3, 4
    m = teacher(vocab=V)
    lin = linearize(m, mixer=name, layers=[0, 2], **kw)
    lin.generation_config.eos_token_id = None  # no beam ends early: every beam has `new` tokens, as enumerated
    lin.generation_config.pad_token_id = 0
    prompt = [3, 7, 1, 9, 4]
    out = lin.generate(torch.tensor([prompt]), max_new_tokens=new, num_beams=K, num_return_sequences=K, do_sample=False,
                       length_penalty=0.0, output_scores=True, return_dict_in_generate=True)
    want = _brute_force_beams(lin, prompt, K, new, V)
    assert [s.tolist() for s in out.sequences] == [s for _, s in want]
    assert len({tuple(s) for _, s in want}) == K
    torch.testing.assert_close(out.sequences_scores.double(), torch.tensor([lp for lp, _ in want], dtype=torch.float64),
                               rtol=1e-4, atol=1e-4)


def test_a_cropped_cache_is_refused_for_a_student():
    """A crop would have the student forget tokens a recurrent state cannot give back: refused, naming the cache."""
    lin = linearize(teacher(), mixer="gla", layers=[0])
    cache = DynamicCache(config=lin.config)
    lin(ids(1, 6), cache=cache, use_cache=True)
    cache.crop(-2)  # drop the last two tokens
    with pytest.raises(ValueError, match="'cache'.*crop"):
        lin(ids(1, 1), cache=cache, use_cache=True)


# -- stage 2 -------------------------------------------------------------------------------------


def test_kd_term_is_the_kl_to_the_teacher_and_the_trainer_adds_it():
    from seqmix.linearize.finetune import LinearizedLM
    from seqmix.train import Trainer

    m = teacher()
    lin = linearize(m, mixer="gla")
    lm = LinearizedLM(lin, None, teacher=m, kd=0.5).train()
    x = ids(2, 10)
    labels = x.clone()
    labels[:, :3] = -100
    logits, target = lm.scored_logits(x, labels)
    mask = labels != -100
    t = torch.log_softmax(m(x).logits[mask], -1)
    s = torch.log_softmax(logits, -1)
    want = 0.5 * (t.exp() * (t - s)).sum(-1).mean()
    aux = Trainer.auxiliary_loss(lm)
    torch.testing.assert_close(aux, want, rtol=1e-5, atol=1e-7)
    assert Trainer.auxiliary_loss(lm) == 0.0  # read once per forward
    lm.eval()
    lm.scored_logits(x, labels)
    assert Trainer.auxiliary_loss(lm) == 0.0  # evaluation: no KD term
    with pytest.raises(ValueError, match="kd"):
        LinearizedLM(lin, None, teacher=None, kd=1.0)


def test_lora_adapts_the_kept_weights_and_trains_the_students(tmp_path):
    pytest.importorskip("peft")
    from seqmix.linearize.finetune import lora, merged

    m = teacher()
    lin = linearize(m, mixer="gla", layers=[0, 1])
    with warnings.catch_warnings(record=True) as caught:  # (peft reads a deprecated transformers alias: kept quiet)
        warnings.simplefilter("always")
        pm = lora(lin, 2)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)], [str(w.message) for w in caught]
    names = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert any("lora_A" in n and "layers.2.self_attn.q_proj" in n for n in names)  # the kept softmax layer
    assert any("lora_A" in n and "mlp.up_proj" in n for n in names)
    assert any(".mixer.W_q.weight" in n for n in names)  # the students train in full
    assert not any("lora" in n and ".mixer." in n for n in names)  # no LoRA inside the students
    assert not any(n.endswith("mlp.up_proj.base_layer.weight") for n in names)  # kept weights frozen
    out = merged(pm)
    assert not any("lora" in n for n, _ in out.named_parameters())
    # a saved and reloaded model (its kept layer a converted softmax attention): LoRA on that layer too
    save(out, tmp_path)
    back = load_converted(tmp_path)
    names = [n for n, p in lora(back, 2).named_parameters() if p.requires_grad]
    assert any("lora_A" in n and "layers.2.self_attn.mixer.W_qk" in n for n in names)
    assert not any("lora" in n and "layers.0.self_attn" in n for n in names)


# -- the run and the CLI -------------------------------------------------------------------------


def test_cli_end_to_end_auto_k_resume_and_report(tmp_path, capsys):
    pytest.importorskip("peft")
    from seqmix.cli import main

    m = teacher(layers=3, vocab=256)
    m.save_pretrained(tmp_path / "teacher")
    out = tmp_path / "lin"
    argv = ["linearize", "--hf", str(tmp_path / "teacher"), "--mixer", "gla", "--layers", "auto:1", "--seq-len", "16",
            "--batch-size", "2", "--transfer-tokens", "96", "--finetune-tokens", "64", "--lora-rank", "2", "--kd", "0.5",
            "--eval-batches", "1", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    tr = metrics["stages"]["transfer"]
    after = {int(k): v for k, v in tr["residual_after"].items()}
    assert tr["kept_softmax"] == [max(after, key=after.get)]  # auto:1 keeps the largest residual
    assert tr["steps"] == 3 and metrics["stages"]["finetune"]["steps"] == 2
    for key in ("teacher", "init"):
        assert metrics[key]["loss"] > 0 and metrics[key]["bpb"] > 0
    report = (out / "report.md").read_text()
    assert "per-layer transfer residual" in report and f"{metrics['teacher']['loss']:.4f}" in report
    assert (out / "maps.png").stat().st_size > 1000 and "maps.png" in report
    _check_html(out, metrics)
    assert metrics["teacher"]["decode_tokens_per_s"] > 0 and metrics["stages"]["finetune"]["decode_tokens_per_s"] > 0
    assert metrics["stages"]["finetune"]["state"]["recurrent_floats"] > 0
    back = load_converted(out)
    kept = tr["kept_softmax"][0]
    assert back.model.layers[kept].self_attn.mixer.registry_name == "softmax_attention"
    assert {i for i in range(3) if i != kept} == {i for i, a in students(back).items()}
    assert back.generate(ids(1, 4, vocab=256), max_new_tokens=3, do_sample=False).shape == (1, 7)
    # OUT holds the tokenizer it was trained with (bytes): `seqmix generate OUT` reads it and decodes the model's tokens
    capsys.readouterr()
    assert main(["generate", str(out), "--prompt", "To be", "--max-new-tokens", "3", "--temperature", "0"]) == 0
    io = capsys.readouterr()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("To be")["input_ids"] == list(b"To be")
    seq = back.generate(torch.tensor([list(b"To be")]), max_new_tokens=3, do_sample=False, pad_token_id=0)[0].tolist()
    assert io.out == "To be" + tok.decode(seq)[len("To be"):] + "\n"
    assert "prefill: 5 tokens" in io.err
    # a re-run skips both finished stages and leaves them as they were
    stamp = (out / "stages" / "finetune" / "done.json").read_text()
    capsys.readouterr()
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "stage 1: finished before" in said and "stage 2: finished before" in said
    assert (out / "stages" / "finetune" / "done.json").read_text() == stamp


def test_cli_bad_input_is_one_line_naming_the_argument(tmp_path, capsys):
    from seqmix.cli import main

    m = teacher(layers=2, vocab=VOCAB)
    m.save_pretrained(tmp_path / "teacher")
    base = ["linearize", "--hf", str(tmp_path / "teacher"), "--out", str(tmp_path / "o"), "--no-progress"]
    cases = [(["--layers", "5"], "layers"), (["--mixer", "s4"], "mixer"), (["--tokenizer", "byte"], "--tokenizer"),
             (["--stages", "finetune,transfer"], "stages"), (["--device", "nodevice"], "--device"),
             (["--transfer-trainable", "new", "--init", "random"], "transfer_trainable")]
    if not torch.cuda.is_available():
        cases.append((["--device", "cuda"], "--device"))
    for extra, name in cases:
        capsys.readouterr()
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert name in err and len(err.splitlines()) == 1, err
        assert not (tmp_path / "o").exists()  # nothing written


def test_nothing_below_linearize_imports_it():
    from test_imports import import_graph

    graph = import_graph()
    users = sorted(m for m, deps in graph.items()
                   if any(d == "seqmix.linearize" or d.startswith("seqmix.linearize.") for d in deps)
                   and not (m == "seqmix.linearize" or m.startswith(("seqmix.linearize.", "seqmix.cli"))))
    assert graph["seqmix.cli.linearize"], "the graph lacks the linearize CLI"
    assert users == [], users


def test_hedgehog_feature_map_modes_agree_and_phi_reproduces_the_core():
    import seqmix

    torch.manual_seed(0)
    mx = seqmix.build_mixer("linear_attention", d_model=16, heads=2, feature_map="hedgehog", chunk_size=4).double()
    with torch.no_grad():
        mx.fm_q_weight.add_(0.3 * torch.randn_like(mx.fm_q_weight))
        mx.fm_k_bias.add_(0.3 * torch.randn_like(mx.fm_k_bias))
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    outs = {}
    for mode in ("recurrent", "chunk", "parallel"):
        mx.mode = mode
        outs[mode] = mx(x)
    torch.testing.assert_close(outs["chunk"], outs["recurrent"])
    torch.testing.assert_close(outs["parallel"], outs["recurrent"])
    _, k, v, _ = mx._features(x)
    o = torch.einsum("bhij,bjhv->bihv", mx.phi(x), v)
    torch.testing.assert_close(mx.W_o(o.flatten(2)), outs["recurrent"])
    assert mx.state_size() == 2 * (2 * 8) * (8 + 1)
    with pytest.raises(ValueError, match="hedgehog"):
        seqmix.build_mixer("linear_attention", d_model=16, heads=2, feature_map="hedgehog", key_feature_map="elu1")


def test_hedgehog_features_and_packed_rope_equal_their_plain_forms():
    """φ's per-head map is x W_h + b_h (the einsum of the definition), with RoPE q and k rotated as one packed
    tensor equal each rotated on its own, and one token's φ(q), ψ(k) as one packed map equal the two maps (float64,
    tight; float32, relative)."""
    import seqmix
    from seqmix.mixers.attention import _per_head
    from seqmix.ops.rotary import rotary

    for dt, tol in ((torch.float64, {}), (torch.float32, dict(rtol=1e-5, atol=1e-6))):
        torch.manual_seed(0)
        x, W, b = torch.randn(2, 5, 3, 4, dtype=dt), torch.randn(3, 4, 6, dtype=dt), torch.randn(3, 6, dtype=dt)
        torch.testing.assert_close(_per_head(x, W, b), torch.einsum("bthk,hkf->bthf", x, W) + b, **tol)
        mx = seqmix.build_mixer("linear_attention", d_model=16, heads=2, feature_map="hedgehog", rope=True).to(dt)
        x = torch.randn(2, 7, 16, dtype=dt)
        q, k, v = mx._rotated(x, start=3)
        B, T = 2, 7
        q0, k0 = mx.W_qk(x).split([16, 16], dim=-1)
        pos = torch.arange(3, 3 + T)
        torch.testing.assert_close(q, rotary(q0.view(B, T, 2, 8), pos) * mx.qk_scale, **tol)
        torch.testing.assert_close(k, rotary(k0.view(B, T, 2, 8), pos), **tol)
        torch.testing.assert_close(v, mx.W_v(x).view(B, T, 2, 8), **tol)
        # one token's φ(q) and ψ(k) as one batched map of 2·H heads (the decoding step) equal the two maps
        for p in (mx.fm_q_weight, mx.fm_k_weight, mx.fm_q_bias, mx.fm_k_bias):
            with torch.no_grad():
                p.add_(0.1 * torch.randn_like(p))
        with torch.no_grad():  # (as decoding runs: the packed weights kept as a layer constant)
            q1, k1 = q[:, :1], k[:, 4:5]
            fq, fk = mx._qk_features(q1, k1)
            torch.testing.assert_close(fq, mx._query_features(q1), **tol)
            torch.testing.assert_close(fk, mx._key_features(k1), **tol)
            mx.fm_k_bias.add_(1.0)  # the packed weights follow a change of the parameters (their versions)
            torch.testing.assert_close(mx._qk_features(q1, k1)[1], mx._key_features(k1), **tol)


def test_teacher_weights_refuses_a_non_attention_mixer():
    import seqmix

    with pytest.raises(ValueError, match="softmax_attention"):
        teacher_weights(seqmix.build_mixer("gla", d_model=16))
    t = teacher_weights(_teacher_mixers(teacher(), [0])[0])
    assert (t.heads, t.kv_heads, t.head_dim) == (4, 2, 8)
    s = build_student("gla", t, init="random")
    assert not torch.equal(s.W_q.weight, t.q)
    assert attention_layers(teacher()) == {0: "model.layers.0.self_attn", 1: "model.layers.1.self_attn",
                                           2: "model.layers.2.self_attn"}


def test_the_trainer_adds_a_models_auxiliary_loss():
    """Trainer.fit adds model.auxiliary_loss() to each training step's loss: an L2 pull on the
    embedding shrinks it compared with the same run without it (the hook is used, not only defined)."""
    from seqmix.data import CorpusConfig
    from seqmix.models import LanguageModel, ModelConfig
    from seqmix.train import Trainer
    from seqmix.train.config import TrainConfig, make_run_config

    class Pulled(LanguageModel):
        weight = 0.0

        def auxiliary_loss(self):
            return self.weight * self.embed.weight.pow(2).sum() if self.weight else None

    norms = {}
    for w in (0.0, 10.0):
        run = make_run_config(data=CorpusConfig(seq_len=16, batch_size=2),
                              model=ModelConfig(mixer="gla", d_model=16, n_layers=1, mixer_kwargs={"heads": 2}),
                              train=TrainConfig(max_steps=3, lr=1e-2, weight_decay=0.0, early_stop=None, eval_batches=1))

        def build(cfg, w=w):
            torch.manual_seed(0)
            m = Pulled(cfg.model)
            m.weight = w
            return m

        trainer = Trainer(run, progress=False, model_builder=build)
        models = []
        orig = trainer.build_model
        trainer.build_model = lambda: models.append(orig()) or models[-1]
        trainer.fit()
        norms[w] = float(models[0].embed.weight.norm())
    assert norms[10.0] < norms[0.0] - 1e-3, norms


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_report_html_opens_in_headless_chromium(tmp_path):
    """linearize's report.html, from a tiny run, in a real browser: its one picture (maps.png) decodes
    at its own width, no console error, a screenshot that is not blank; and a page whose picture is
    corrupted fails the check."""
    from PIL import Image

    from seqmix.cli import main

    teacher(layers=2, vocab=256).save_pretrained(tmp_path / "teacher")
    out = tmp_path / "lin"
    assert main(["linearize", "--hf", str(tmp_path / "teacher"), "--mixer", "gla", "--layers", "0", "--seq-len", "16",
                 "--batch-size", "2", "--transfer-tokens", "32", "--finetune-tokens", "32", "--full",
                 "--eval-batches", "1", "--no-progress", "--out", str(out)]) == 0
    page = out / "report.html"
    r = dump_dom(page, tmp_path / "profile")
    assert r.returncode == 0 and not console_lines(r), console_lines(r)
    widths = check_in_browser(page, tmp_path, 1)
    assert widths == [Image.open(out / "maps.png").width]
    bad = tmp_path / "bad.html"
    bad.write_text(page.read_text(encoding="utf-8").replace("base64,iVBOR", "base64,AAAA", 1), encoding="utf-8")
    assert image_widths(bad, tmp_path / "profile") == [0]


def _check_html(out, metrics):
    """report.html: well-formed markup (parsed as XML after the doctype), the run's computed numbers in
    its table cells, and maps.png embedded byte for byte."""
    import base64
    import xml.etree.ElementTree as ET

    text = (out / "report.html").read_text()
    assert text.startswith("<!DOCTYPE html>")
    root = ET.fromstring(text.split("\n", 1)[1])
    cells = [td.text for td in root.iter("td")]
    tr, ft = metrics["stages"]["transfer"], metrics["stages"]["finetune"]
    for want in (f"{metrics['teacher']['loss']:.4f}", f"{metrics['teacher']['bpb']:.4f}", f"{ft['eval']['loss']:.4f}",
                 f"{ft['eval']['bpb']:.4f}", f"{tr['eval']['loss']:.4f}", str(ft["state"]["recurrent_floats"]),
                 str(metrics["teacher"]["state"]["kv_floats_per_token"]), f"{ft['decode_tokens_per_s']:.0f}",
                 f"{metrics['teacher']['decode_tokens_per_s']:.0f}"):
        assert want in cells, (want, cells)
    for layer, before in tr["residual_before"].items():
        assert f"{before:.4g}" in cells and f"{tr['residual_after'][layer]:.4g}" in cells
    img = [i for i in root.iter("img")]
    assert len(img) == 1 and img[0].get("src").startswith("data:image/png;base64,")
    assert base64.b64decode(img[0].get("src").split(",", 1)[1]) == (out / "maps.png").read_bytes()


def test_stage1_resumes_after_a_kill_without_losing_finished_steps(tmp_path):
    """A stage 1 killed after its save at step 4 resumes there: the second call runs steps 5-6 only, and
    the students end exactly as an uninterrupted run's."""
    m = teacher()
    data = [ids(2, 16, seed=s) for s in range(6)]

    def students_after(run):
        torch.manual_seed(3)
        lin = linearize(m, mixer="gla")
        run(lin)
        return {k: v.clone() for k, v in lin.state_dict().items()}

    kw = dict(steps=6, lr=1e-2, log_every=1, save_every=2)
    ref = students_after(lambda lin: transfer(lin, m, lambda i: data[i], **kw))

    class Killed(Exception):
        pass

    def kill(step, rec):
        if step == 5:
            raise Killed

    ckpt = tmp_path / "progress.pt"
    with pytest.raises(Killed):
        students_after(lambda lin: transfer(lin, m, lambda i: data[i], checkpoint=ckpt, key="k", on_step=kill, **kw))
    assert torch.load(ckpt, weights_only=True)["step"] == 4  # saved at step 4; step 5 was lost with the kill
    seen = []

    def batch(i):
        seen.append(i)
        return data[i]

    hist = []
    got = students_after(lambda lin: hist.extend(transfer(lin, m, batch, checkpoint=ckpt, key="k", **kw)))
    assert seen == [4, 5] and [h["step"] for h in hist] == [1, 2, 3, 4, 5, 6]
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-6)
    # another key (other settings): the progress is not used
    seen.clear()
    students_after(lambda lin: transfer(lin, m, batch, checkpoint=ckpt, key="other", **kw))
    assert seen == list(range(6))


@pytest.mark.parametrize("name", ["gla", "mamba2"])
def test_stage1_trainable_new_keeps_the_copied_weights(name):
    """trainable="new": the rows the init table copied from the teacher stay the teacher's (whole tensors,
    and Mamba-2's x/B/C row blocks of its packed in_proj), every other student parameter trains."""
    from seqmix.linearize.init import copied_rows

    m = teacher()
    lin = linearize(m, mixer=name, group_kv=False)  # (the grouped students: tests/test_grouped_rows.py)
    before = {l: {k: v.clone() for k, v in a.mixer.named_parameters()} for l, a in students(lin).items()}
    transfer(lin, m, lambda i: ids(2, 16, seed=i), steps=4, lr=1e-2, trainable="new")
    tmix = _teacher_mixers(m, students(lin))
    for l, a in students(lin).items():
        rows = copied_rows(a.mixer, teacher_weights(tmix[l]))
        assert rows
        frozen = torch.zeros(0)
        for k, p in a.mixer.named_parameters():
            assert p.requires_grad  # the flags are restored
            mask = torch.zeros_like(p, dtype=torch.bool)
            for b in rows.get(k, []):
                mask[slice(*b) if b else slice(None)] = True
            assert torch.equal(p.detach()[mask], before[l][k][mask]), (l, k)  # copied: untouched
            frozen = torch.cat([frozen, (p.detach()[~mask] - before[l][k][~mask]).abs().flatten()])
        assert frozen.max() > 0  # the new parameters moved
    if name == "mamba2":  # the gate z rows of in_proj (not copied) trained
        z = students(lin)[0].mixer.in_proj.weight[: 4 * 8]
        assert not torch.equal(z, before[0]["in_proj.weight"][: 4 * 8])


def test_pipeline_stage1_resumes_and_passes_device_precision_trainable(tmp_path):
    """run(): a stage 1 interrupted after its save at step 10 resumes there (steps 11.. only), with
    device, bf16 precision and trainable="new" passed to both stages."""
    from seqmix.linearize.pipeline import LinearizeConfig, run

    m = teacher(layers=2, vocab=256)
    m.save_pretrained(tmp_path / "teacher")
    cfg = LinearizeConfig(hf=str(tmp_path / "teacher"), mixer="gla", seq_len=16, batch_size=2, transfer_tokens=32 * 25,
                          finetune_tokens=64, eval_batches=1, transfer_save_every=5, transfer_trainable="new", device="cpu",
                          precision="bf16", out=str(tmp_path / "o"))

    class Killed(Exception):
        pass

    def kill(step, rec):
        if step == 10:
            raise Killed

    with pytest.raises(Killed):
        run(cfg, progress=False, on_transfer_step=kill)
    progress = tmp_path / "o" / "stages" / "transfer_run" / "progress.pt"
    assert torch.load(progress, weights_only=True)["step"] == 10
    seen = []
    metrics = run(cfg, progress=False, on_transfer_step=lambda s, r: seen.append(s))
    assert seen == [20, 25] and not progress.exists()
    tr, ft = metrics["stages"]["transfer"], metrics["stages"]["finetune"]
    assert tr["steps"] == 25 and tr["trainable"] == "new" and tr["history"][-1]["step"] == 25
    assert ft["precision"] == "bf16" and ft["steps"] == 2
    assert metrics["config"]["device"] == "cpu" and (tmp_path / "o" / "report.html").is_file()


def test_qwen3_teacher_folds_its_qk_norm_weights_into_the_copied_rows():
    """A Qwen3 teacher (per-head RMSNorm of q and k, weights γ): the students take γ_q ⊙ q and γ_k ⊙ k
    per head (kv heads repeated); gla and gated_deltanet students are built and run."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128, attention_bias=False)
    m = Qwen3ForCausalLM(cfg).eval()
    att = m.model.layers[1].self_attn
    with torch.no_grad():
        att.q_norm.weight.uniform_(0.5, 2.0)
        att.k_norm.weight.uniform_(0.5, 2.0)
    H, Hkv, K = 4, 2, 8
    q = (att.q_proj.weight.view(H, K, -1) * att.q_norm.weight.view(1, K, 1)).reshape(H * K, -1)
    k = (att.k_proj.weight.view(Hkv, K, -1) * att.k_norm.weight.view(1, K, 1)).repeat_interleave(H // Hkv, 0).reshape(H * K, -1)
    for name in ("gla", "gated_deltanet"):
        lin = linearize(m, mixer=name, layers=[1])
        s = lin.model.layers[1].self_attn.mixer
        torch.testing.assert_close(s.W_q.weight, q, rtol=0, atol=0)
        torch.testing.assert_close(s.W_k.weight, k, rtol=0, atol=0)
        out = lin(input_ids=ids(2, 12), use_cache=False).logits
        assert out.shape == (2, 12, VOCAB) and torch.isfinite(out).all()


@pytest.mark.parametrize("name,kw", STUDENTS, ids=[s for s, _ in STUDENTS])
def test_qwen2_teacher_biases_go_with_the_copied_rows(name, kw):
    """A Qwen2 teacher (q/k/v biases, none in o_proj): every student takes the biases with the weights
    (k, v repeated over the GQA groups), its other biases of those projections at 0; stage 1's
    trainable="new" freezes the copied bias rows with the weights; and the identity-feature separable
    student's map is exactly the teacher's attention (the biases inside its scores)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from seqmix.linearize.init import copied_rows, teacher_weights

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    m = Qwen2ForCausalLM(cfg).eval()
    att = m.model.layers[1].self_attn
    with torch.no_grad():
        for lin_ in (att.q_proj, att.k_proj, att.v_proj):
            lin_.bias.normal_(0, 0.5)
    H, Hkv, K = 4, 2, 8
    want = {"q": att.q_proj.bias, "k": att.k_proj.bias.view(Hkv, K).repeat_interleave(H // Hkv, 0).reshape(-1),
            "v": att.v_proj.bias.view(Hkv, K).repeat_interleave(H // Hkv, 0).reshape(-1)}
    lin = linearize(m, mixer=name, layers=[1], group_kv=False, **kw)  # (one k and v row per head: the names below)
    s = lin.model.layers[1].self_attn.mixer
    sd = s.state_dict()
    if "W_qk.bias" in sd:
        got = {"q": sd["W_qk.bias"][: H * K], "k": sd["W_qk.bias"][H * K:], "v": sd["W_v.bias"]}
        rest = [sd["W_o.bias"]]
    elif "in_proj.bias" in sd:  # [z; x; B; C; dt]: x <- v, B <- k, C <- q; z and dt rows at 0
        D, b = H * K, sd["in_proj.bias"]
        got = {"v": b[D:2 * D], "k": b[2 * D:3 * D], "q": b[3 * D:4 * D]}
        rest = [b[:D], b[4 * D:], sd["out_proj.bias"]]
    else:
        got = {"q": sd["W_q.bias"], "k": sd["W_k.bias"], "v": sd["W_v.bias"]}
        rest = [sd["W_o.bias"]] if "W_o.bias" in sd else []
    for key, w in want.items():
        assert torch.equal(got[key], w.detach()), key
    assert all(float(r.abs().max()) == 0.0 for r in rest)
    blocks = copied_rows(s, teacher_weights(from_transformers(m).model.layers[1].self_attn.mixer))
    assert any(n.endswith("bias") for n in blocks)  # frozen with the weights under trainable="new"
    out = lin(input_ids=ids(2, 12), use_cache=False).logits
    assert out.shape == (2, 12, VOCAB) and torch.isfinite(out).all()
    # a config override that takes the biases away: one message naming the argument, not a silent drop
    off = {"qkv_bias": False} if name == "gated_deltanet" else {"bias": False}
    with pytest.raises(ValueError, match="argument 'mixer'.*has a bias"):
        linearize(m, mixer=name, layers=[1], **kw, **off)
    if name == "linear_attention":  # the exact check, once: the identity-feature student's map is the teacher's
        x = ids(2, 12)
        ref = m(input_ids=x, output_attentions=True, use_cache=False).attentions[1]
        torch.testing.assert_close(student_attention(m, x, layers=[1])[1], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("parallel,lora", [("ddp", ["--full"]), ("fsdp", ["--lora-rank", "4"])])
def test_cli_parallel_two_ranks(tmp_path, parallel, lora):
    """--parallel ddp / fsdp under two ranks as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT;
    gloo on the CPU): rank 0 runs stage 1 and the evaluations, rank 1 waits for it and joins stage 2; the
    folder is rank 0's, and stage 2 ran its steps on both ranks (its result records the world size).
    FSDP2 (with LoRA and KD: frozen and trained parameters in one unit) shards each transformers decoder
    layer; its checkpoint is gathered whole and the saved model loads and decodes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import seqmix

    m = teacher(layers=2, vocab=256)
    m.save_pretrained(tmp_path / "teacher")
    from ports import free_port

    port = free_port()
    src = str(Path(seqmix.__file__).resolve().parents[1])
    argv = [sys.executable, "-c", "import sys; from seqmix.cli import main; sys.exit(main(sys.argv[1:]))", "linearize", "--hf", str(tmp_path / "teacher"), "--mixer", "gla",
            "--seq-len", "16", "--batch-size", "4", "--transfer-tokens", "128", "--finetune-tokens", "128",
            "--eval-batches", "1", "--no-progress", "--parallel", parallel, *lora, "--kd", "0.5",
            "--out", str(tmp_path / "o")]
    procs = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": src, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["config"]["parallel"] == parallel and metrics["stages"]["finetune"]["steps"] == 2
    ckpt = torch.load(tmp_path / "o" / "stages" / "finetune_run" / "checkpoint.pt", weights_only=True)
    assert ckpt["world_size"] == 2
    back = load_converted(tmp_path / "o")
    assert set(students(back)) == {0, 1}
    out = back.generate(ids(1, 6, vocab=256), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 9)


def test_scaled_rope_teacher_is_the_identity_feature_students_map_and_takes_decay_students():
    """A Llama-3 teacher (its "llama3" RoPE scaling): a separable student takes the scaled RoPE (rope_scaling), so the
    identity-feature student's causal softmax is transformers' own attention map (without the scaling it is not: the
    check can fail); gla (no RoPE, a decay) is built and runs."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    cfg._attn_implementation = "eager"
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            for p in (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight):
                p.normal_(0, 0.5)
    x = ids(2, 24)
    out = m(input_ids=x, output_attentions=True, use_cache=False)
    for layer, probs in student_attention(m, x).items():
        torch.testing.assert_close(probs, out.attentions[layer], rtol=1e-5, atol=1e-6)
    for layer, probs in student_attention(m, x, rope_scaling=None).items():  # the scaling dropped: the check can fail
        assert float((probs - out.attentions[layer]).abs().max()) > 1e-3
    lin = linearize(m, mixer="gla")
    assert torch.isfinite(lin(input_ids=ids(1, 8), use_cache=False).logits).all()


def test_random_hf_init_draws_the_students_linears_as_the_host_model():
    """init="random_hf": every Linear weight of the student ~ normal(0, initializer_range) (the std measured on
    its entries), biases zero; the parameters outside Linears (the Hedgehog feature maps) as with init="random"."""
    m = teacher()
    m.config.initializer_range = 0.05
    torch.manual_seed(0)
    own = linearize(m, mixer="linear_attention", init="random", feature_map="hedgehog").model.layers[0].self_attn.mixer
    torch.manual_seed(0)
    hf = linearize(m, mixer="linear_attention", init="random_hf", feature_map="hedgehog").model.layers[0].self_attn.mixer
    linears = [n for n, mod in hf.named_modules() if isinstance(mod, torch.nn.Linear)]
    assert linears
    for n in linears:
        w = hf.get_submodule(n).weight
        assert abs(float(w.std()) - 0.05) < 0.1 * 0.05, (n, float(w.std()))
        assert not torch.equal(w, own.get_submodule(n).weight)
    torch.testing.assert_close(hf.fm_q_weight, own.fm_q_weight, rtol=0, atol=0)
