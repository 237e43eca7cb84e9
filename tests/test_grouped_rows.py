"""GroupedRows (a Linear whose output rows are tied per group) against the ordinary Linear it equals, and
linearize's ``group_kv``: students that keep a GQA teacher's kv heads compute what the expanded students compute,
save and load exactly, decode, take LoRA on the stored rows and freeze the copied rows in stage 1."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqmix.mixers.layers import GroupedRows, group_rows, grouped_rows

SEGMENTS = [[1, 1, 3], [4, 2, 2], [6, 3, 1], [1, 1, 2]]


def _reference_index(segments) -> list[int]:
    """The stored row of each output row, written out head by head (transformers' repeat_kv order)."""
    out, stored = [], 0
    for heads, kv, width in segments:
        for h in range(heads):
            kv_head = h // (heads // kv)
            out += [stored + kv_head * width + c for c in range(width)]
        stored += kv * width
    return out


# the forward gathers blocks of the widths' gcd rows: 1 in SEGMENTS, 2 and 4 in these (q and k heads of one width)
@pytest.mark.parametrize("segments", [SEGMENTS, [[4, 2, 4], [2, 1, 6], [1, 1, 2]], [[8, 8, 4], [8, 2, 4]]])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_grouped_rows_is_the_linear_of_its_expanded_weight(dtype, tol, segments):
    torch.manual_seed(0)
    g = GroupedRows(5, segments).to(dtype)
    assert g.index.tolist() == _reference_index(segments)
    n_out = sum(h * w for h, _, w in segments)
    assert g.out_features == n_out and tuple(g.proj.weight.shape) == (sum(k * w for _, k, w in segments), 5)
    assert tuple(g.weight.shape) == (n_out, 5)  # nn.Linear's contract: the expanded weight
    x = torch.randn(2, 7, 5, dtype=dtype)
    W, b = g.expanded_weight(), g.proj.bias[g.index]
    assert torch.equal(g.bias, b)
    assert torch.equal(W, g.proj.weight[torch.tensor(_reference_index(segments))])
    torch.testing.assert_close(g(x), F.linear(x, W, b), rtol=tol, atol=tol)
    # the gradient of the stored rows: the sum over each group of the expanded Linear's
    lin = torch.nn.Linear(5, n_out).to(dtype)
    with torch.no_grad():
        lin.weight.copy_(W)
        lin.bias.copy_(b)
    up = torch.randn(2, 7, n_out, dtype=dtype)
    (g(x) * up).sum().backward()
    (lin(x) * up).sum().backward()
    expect = torch.zeros_like(g.proj.weight).index_add_(0, g.index, lin.weight.grad)
    torch.testing.assert_close(g.proj.weight.grad, expect, rtol=tol, atol=tol)


def test_from_linear_keeps_the_first_row_of_each_group_and_draws_nothing():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, sum(h * w for h, _, w in SEGMENTS))
    with torch.no_grad():  # rows tied as the index says: the grouped projection computes what lin does
        lin.weight.copy_(lin.weight[torch.tensor(_reference_index(SEGMENTS))])
        lin.bias.copy_(lin.bias[torch.tensor(_reference_index(SEGMENTS))])
    rng = torch.get_rng_state()
    g = GroupedRows.from_linear(lin, SEGMENTS)
    assert torch.equal(torch.get_rng_state(), rng)
    x = torch.randn(3, 4, dtype=torch.float32)
    torch.testing.assert_close(g(x), lin(x), rtol=1e-6, atol=1e-6)  # (a matmul of fewer rows: the last bit may differ)


def test_group_rows_rebuilds_from_what_grouped_rows_records():
    m = torch.nn.Module()
    m.W_k = torch.nn.Linear(4, 8, bias=False)
    m.W_q = torch.nn.Linear(4, 8)
    group_rows(m, {"W_k": [[4, 2, 2]]})
    assert grouped_rows(m) == {"W_k": [[4, 2, 2]]} and tuple(m.W_k.proj.weight.shape) == (4, 4)
    other = torch.nn.Module()
    other.W_k, other.W_q = torch.nn.Linear(4, 8, bias=False), torch.nn.Linear(4, 8)
    group_rows(other, grouped_rows(m)).load_state_dict(m.state_dict())
    x = torch.randn(2, 4)
    assert torch.equal(other.W_k(x), m.W_k(x))


@pytest.mark.parametrize("segments", [[[4, 3, 2]], [[0, 1, 2]], [[2, 1]], [[2, 1, 1.5]], [], "abc"])
def test_bad_segments_name_the_argument(segments):
    with pytest.raises(ValueError, match="argument 'segments'"):
        GroupedRows(4, segments)


def test_group_rows_refuses_what_it_cannot_group():
    m = torch.nn.Module()
    m.W_k = torch.nn.Linear(4, 8)
    with pytest.raises(ValueError, match="argument 'segments'.*covers 6 rows"):
        group_rows(m, {"W_k": [[3, 1, 2]]})
    with pytest.raises(ValueError, match="argument 'grouped'.*no Linear 'W_x'"):
        group_rows(m, {"W_x": [[4, 2, 2]]})
    with pytest.raises(ValueError, match="argument 'grouped' must map"):
        group_rows(m, [["W_k", [[4, 2, 2]]]])


# -- linearize(group_kv=True) ----------------------------------------------------------------------

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from seqmix.interop import load_converted, placed_mixers  # noqa: E402
from seqmix.linearize import linearize, save, students, teacher_weights, transfer  # noqa: E402
from seqmix.linearize.init import copied_rows  # noqa: E402

VOCAB = 64
#: every student family the init table groups (B'MOJO reads its weight rows itself: refused, below)
GROUPED = [("linear_attention", {"feature_map": "hedgehog"}), ("generalized_linear_attention", {}), ("lolcats", {"window": 4}), ("gla", {}), ("retnet", {}),
           ("gated_deltanet", {}), ("mamba2", {}), ("phi_mamba", {}), ("rad_rwkv7", {}), ("liger_gla", {}),
           ("liger_attention", {})]


def teacher(heads=4, kv_heads=2, d=32, layers=2, bias=False, vocab=VOCAB):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                      attention_bias=bias)
    cfg._attn_implementation = "sdpa"
    m = LlamaForCausalLM(cfg).eval()
    if bias:
        with torch.no_grad():
            for layer in m.model.layers:
                for p in (layer.self_attn.q_proj.bias, layer.self_attn.k_proj.bias, layer.self_attn.v_proj.bias):
                    p.normal_(0, 0.5)
    return m


def ids(T=20, seed=1):
    return torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(seed))


def _pair(m, name, kw, **extra):
    torch.manual_seed(1)
    a = linearize(m, mixer=name, group_kv=False, **kw, **extra)
    torch.manual_seed(1)
    b = linearize(m, mixer=name, group_kv=True, **kw, **extra)
    return a, b


@pytest.mark.parametrize("name,kw", GROUPED, ids=[s for s, _ in GROUPED])
def test_a_grouped_student_computes_the_expanded_students_function(name, kw):
    m = teacher().double()
    a, b = _pair(m, name, kw)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(b(x).logits, a(x).logits, rtol=1e-10, atol=1e-10)
    n_a = sum(p.numel() for p in a.parameters())
    n_b = sum(p.numel() for p in b.parameters())
    assert n_b == n_a - 2 * 2 * 16 * 32  # 2 layers x (k, v) x the 16 rows of 2 of the 4 heads x d 32
    for adapter in students(b).values():
        assert grouped_rows(adapter.mixer)
    assert b.seqmix_linearize["group_kv"] is True


@pytest.mark.parametrize("name,kw", [("gla", {}), ("mamba2", {})])
def test_grouped_students_with_teacher_biases_float32(name, kw):
    m = teacher(bias=True)
    a, b = _pair(m, name, kw)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(b(x).logits, a(x).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,kw", [("lolcats", {"window": 4}), ("gated_deltanet", {}), ("mamba2", {})])
def test_a_grouped_student_saves_loads_and_decodes_exactly(tmp_path, name, kw):
    m = teacher()
    _, lin = _pair(m, name, kw, layers=[0])
    rec = placed_mixers(lin)["model.layers.0.self_attn"]
    assert rec["grouped"]  # the record rebuilds the tied projections before the weights load
    save(lin, tmp_path)
    back = load_converted(tmp_path)
    x = ids(12)
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, lin(x).logits, rtol=0, atol=0)
        out = back.generate(x[:1, :5], max_new_tokens=6, do_sample=False)
        full = back(out).logits[:, 4:-1].argmax(-1)
    assert torch.equal(full, out[:, 5:])
    # transformers' own loader, with seqmix imported, gives the same model
    back2 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back2(x).logits, lin(x).logits, rtol=0, atol=0)


def test_group_kv_leaves_a_student_that_reads_its_weight_rows_expanded():
    m = teacher().double()
    a, b = _pair(m, "bmojo_f", dict(window=4, ssm_mode="chunk", expand=1, d_state=4))
    assert not placed_mixers(b)["model.layers.0.self_attn"].get("grouped")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(b(x).logits, a(x).logits, rtol=0, atol=0)


def test_group_kv_without_gqa_and_for_sliding_window_attention_changes_nothing():
    m = teacher(kv_heads=4)
    assert not placed_mixers(linearize(m, mixer="gla", group_kv=True))["model.layers.0.self_attn"].get("grouped")
    m = teacher()
    assert not placed_mixers(linearize(m, mixer="sliding_window_attention", group_kv=True, window=4))[
        "model.layers.0.self_attn"].get("grouped")  # its kv heads are grouped in the mixer itself


@pytest.mark.parametrize("name", ["gla", "mamba2"])
def test_stage1_trainable_new_freezes_the_copied_stored_rows(name):
    m = teacher()
    lin = linearize(m, mixer=name, group_kv=True)
    before = {l: {k: v.clone() for k, v in a.mixer.named_parameters()} for l, a in students(lin).items()}
    transfer(lin, m, lambda i: ids(16, seed=i), steps=3, lr=1e-2, trainable="new")
    for l, a in students(lin).items():
        rows = copied_rows(a.mixer, teacher_weights(_converted(m, l)))
        assert any(".proj." in k for k in rows)  # the grouped projections' stored rows
        moved = False
        for k, p in a.mixer.named_parameters():
            mask = torch.zeros_like(p, dtype=torch.bool)
            for blk in rows.get(k, []):
                mask[slice(*blk) if blk else slice(None)] = True
            assert torch.equal(p.detach()[mask], before[l][k][mask]), (l, k)
            moved |= bool((p.detach()[~mask] != before[l][k][~mask]).any())
        assert moved


def _converted(m, layer):
    from seqmix.interop import convert_module

    return convert_module(m.model.layers[layer].self_attn, m.config, path=f"model.layers.{layer}.self_attn").mixer


def test_lora_on_the_students_adapts_the_stored_rows():
    pytest.importorskip("peft")
    from seqmix.linearize.finetune import lora, merged

    m = teacher()
    lin = linearize(m, mixer="gla", group_kv=True)
    x = ids()
    pm = lora(lin, 2, targets="students", trainable="lora")
    names = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert any("mixer.W_k.proj.lora_A" in n for n in names) and any("mixer.W_q.lora_A" in n for n in names)
    with torch.no_grad():  # a non-zero adapter, then merged: the same function, the rows still tied
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
        y = pm(input_ids=x).logits
    out = merged(pm)
    assert isinstance(out.model.layers[0].self_attn.mixer.W_k, GroupedRows)
    with torch.no_grad():
        torch.testing.assert_close(out(x).logits, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flag,want", [([], True), (["--no-group-kv"], False), (["--recipe", "lolcats", "--group-kv"], True)])
def test_the_command_keeps_the_kv_heads_as_the_recipe_or_the_flag_says(tmp_path, flag, want):
    from seqmix.cli import main

    teacher(vocab=256).save_pretrained(tmp_path / "teacher")
    out = tmp_path / "lin"
    argv = ["linearize", "--hf", str(tmp_path / "teacher"), "--seq-len", "16", "--batch-size", "2", "--tokens", "96",
            "--eval-batches", "1", "--length", "none", "--stages", "transfer", "--no-progress", "--out", str(out), *flag]
    assert main(argv) == 0
    back = load_converted(out)
    assert all(bool(grouped_rows(a.mixer)) == want for a in students(back).values())


def test_group_kv_refuses_a_layout_that_is_not_head_major():
    """DeltaProduct's k rows are (n h k): grouping them as heads would tie the wrong rows, so it is refused."""
    with pytest.raises(ValueError, match="argument 'group_kv'"):
        linearize(teacher(), mixer="gated_deltanet", init="random", group_kv=True, num_householder=2)


@pytest.mark.parametrize("name,kw", [("lolcats", {"window": 4}), ("gla", {})])
def test_a_grouped_student_mixer_round_trips_through_a_mixer_checkpoint(tmp_path, name, kw):
    """save_mixer_checkpoint / load_mixer_checkpoint (`seqmix show --checkpoint`) of a student with its kv heads
    grouped: the tied projections are rebuilt before the weights load, the mixer computes exactly what it did; a
    record that names a projection the mixer lacks is refused naming the argument."""
    from seqmix.analysis.show import load_mixer_checkpoint, save_mixer_checkpoint

    _, lin = _pair(teacher(), name, kw, layers=[0])
    mixer = students(lin)[0].mixer
    path = tmp_path / "student.pt"
    save_mixer_checkpoint(mixer, path)
    back = load_mixer_checkpoint(name, path)
    assert grouped_rows(back) == grouped_rows(mixer) != {}
    x = torch.randn(2, 9, mixer.d_model)
    with torch.no_grad():
        torch.testing.assert_close(back(x), mixer.eval()(x), rtol=0, atol=0)
    obj = torch.load(path, weights_only=True)
    obj["grouped"] = {"W_nothing": [[4, 2, 8]]}
    torch.save(obj, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="argument 'checkpoint'.*grouped projections do not fit"):
        load_mixer_checkpoint(name, tmp_path / "bad.pt")
