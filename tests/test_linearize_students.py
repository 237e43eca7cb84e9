"""The recipes' students in seqmix.linearize: LoLCATs attention (``lolcats``), Liger-GLA (``liger_gla``) and Liger attention
(``liger_attention``), Phi-Mamba (``phi_mamba``, MOHAWK) and RAD-RWKV7 (``rad_rwkv7``, RADLADS; ``rwkv7``): the init table
copies q/k/v/o (and a Qwen2 teacher's biases) into each, the linearized model decodes through the students' constant
state, saves and loads, stage 1 lowers its transfer residual, and the window students initialised from attention are the
teacher itself when the window covers the sequence. Tiny random teachers (tests/test_linearize.py's), a few steps each."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from seqmix.interop import from_transformers  # noqa: E402
from seqmix.interop import load_converted  # noqa: E402
from seqmix.linearize import linearize, residuals, save, students, teacher_weights, transfer, valid_students  # noqa: E402
from test_linearize import VOCAB, ids, student_attention, teacher  # noqa: E402

#: (student, its config, stage-1 lr, trainable): what each recipe trains in stage 1 (LoLCATs: the feature maps and γ only)
NEW = [("lolcats", {"window": 4}, 1e-2, "new"), ("liger_gla", {}, 1e-3, "all"), ("liger_attention", {"window": 4}, 3e-4, "all"),
       ("phi_mamba", {}, 1e-3, "all"), ("rad_rwkv7", {}, 1e-3, "all"), ("rwkv7", {}, 1e-3, "all")]
IDS = [n for n, *_ in NEW]


def test_valid_students_lists_the_recipes_students():
    names = valid_students()
    for name in IDS:
        assert name in names, name
    assert names["lolcats"] == "LolcatsAttention" and names["liger_attention"] == "LigerAttention"
    assert names["liger_gla"] == "GeneralForm" and names["phi_mamba"] == "SSD" and names["rad_rwkv7"] == "RWKV7"


def _copied(s, H, K):
    """{q, k, v, o: the student's tensors the init table fills} (packed W_qk, Mamba-2's in_proj, RWKV-7's W_r or W_q), as
    the projections compute with them (a projection that keeps the teacher's kv heads, group_kv: its rows expanded)."""
    w = lambda name: s.get_submodule(name).weight  # noqa: E731
    names = dict(s.named_modules())
    if "W_qk" in names:
        return {"q": w("W_qk")[: H * K], "k": w("W_qk")[H * K:], "v": w("W_v"), "o": w("W_o")}
    if "in_proj" in names:  # [z; x; B; C; dt]
        D, W = H * K, w("in_proj")
        return {"v": W[D:2 * D], "k": W[2 * D:3 * D], "q": W[3 * D:4 * D], "o": w("out_proj")}
    return {"q": w("W_r") if "W_r" in names else w("W_q"), "k": w("W_k"), "v": w("W_v"), "o": w("W_o")}


@pytest.mark.parametrize("name,kw,lr,trainable", NEW, ids=IDS)
def test_student_takes_qkvo_decodes_saves_and_transfers(tmp_path, name, kw, lr, trainable):
    m = teacher()
    lin = linearize(m, mixer=name, layers=[0, 2], **kw)
    # the init table: q, k, v, o (kv heads repeated) are the teacher's
    H, Hkv, K = 4, 2, 8
    att = m.model.layers[2].self_attn
    rep = lambda w: w.view(Hkv, K, -1).repeat_interleave(H // Hkv, 0).reshape(H * K, -1)  # noqa: E731
    got = _copied(lin.model.layers[2].self_attn.mixer, H, K)
    for key, want in {"q": att.q_proj.weight, "k": rep(att.k_proj.weight), "v": rep(att.v_proj.weight), "o": att.o_proj.weight}.items():
        assert torch.equal(got[key], want.detach()), key
    # forward, greedy generate() through the students' state = argmax of full forwards, the saved folder
    x = ids(1, 12)
    out = lin.generate(x[:, :5], max_new_tokens=6, do_sample=False)
    assert torch.equal(lin(out).logits[:, 4:-1].argmax(-1), out[:, 5:])
    save(lin, tmp_path)
    back = load_converted(tmp_path)
    torch.testing.assert_close(back(x).logits, lin(x).logits, rtol=1e-5, atol=1e-5)
    cache = DynamicCache(config=back.config)
    back(x[:, :5], cache=cache, use_cache=True)
    floats = []
    for t in range(5, 12):
        back(x[:, t:t + 1], cache=cache, use_cache=True)
        floats.append(sum(v.numel() for v in cache.layers[0]._seqmix_state.values() if isinstance(v, torch.Tensor)))
    assert len(set(floats)) == 1 and floats[0] == lin.model.layers[0].self_attn.mixer.state_size()  # constant in the context
    # stage 1 lowers the transfer residual
    data = [ids(4, 24, seed=s) for s in range(8)]
    held = [ids(4, 24, seed=100)]
    before = residuals(lin, m, held)
    transfer(lin, m, lambda i: data[i % 8], steps=25, match="output", lr=lr, trainable=trainable)
    after = residuals(lin, m, held)
    assert sum(after.values()) < sum(before.values()), (before, after)


@pytest.mark.parametrize("name,kw", [("lolcats", {"window": 64}),
                                     ("liger_attention", {"window": 64, "window_weight": 1.0, "linear_weight": 0.0})],
                         ids=["lolcats", "liger_attention"])
def test_window_student_covering_the_sequence_is_the_teacher(name, kw):
    """Initialised from attention, with the window covering the sequence (LoLCATs: any γ, the linear sums are empty; Liger
    attention: the window's weight 1), every layer is the teacher's attention, RoPE included: the linearized model's
    logits are the teacher's. A window shorter than the sequence is not (the check can fail)."""
    m = teacher(attn="eager")
    x = ids(2, 24)
    want = m(input_ids=x, use_cache=False).logits
    lin = linearize(m, mixer=name, **kw)
    torch.testing.assert_close(lin(input_ids=x, use_cache=False).logits, want, rtol=1e-4, atol=1e-5)
    short = linearize(m, mixer=name, **{**kw, "window": 4})
    with torch.no_grad():
        assert float((short(input_ids=x, use_cache=False).logits - want).abs().max()) > 1e-3


def test_rad_rwkv7_takes_the_teachers_rope_no_shift_no_bonus_and_qwen2_biases():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    m = teacher()
    theta = teacher_weights(from_transformers(m).model.layers[1].self_attn.mixer).rope_theta
    s = linearize(m, mixer="rad_rwkv7", layers=[1]).model.layers[1].self_attn.mixer
    c = s.config
    assert theta and c.rope_theta == theta and not c.token_shift and not c.bonus and not c.value_residual
    names = {n for n, _ in s.named_parameters()}
    assert not names & {"mu", "r_k", "v0", "v1.weight", "v2.weight"}
    plain = linearize(m, mixer="rwkv7", layers=[1]).model.layers[1].self_attn.mixer
    assert plain.config.token_shift and plain.config.bonus and plain.config.rope_theta == theta
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    q2 = Qwen2ForCausalLM(cfg).eval()
    att = q2.model.layers[1].self_attn
    with torch.no_grad():
        att.k_proj.bias.normal_(0, 0.5)
    s = linearize(q2, mixer="rad_rwkv7", layers=[1]).model.layers[1].self_attn.mixer
    assert torch.equal(s.W_r.bias, att.q_proj.bias.detach())
    assert torch.equal(s.W_k.bias, att.k_proj.bias.detach().view(2, 8).repeat_interleave(2, 0).reshape(-1))


@pytest.mark.parametrize("cfg", [{"fused_conv": True}, {"conv_size": None}], ids=["fused_conv", "no_conv"])
def test_a_delta_rule_student_takes_the_convs_it_has(cfg):
    """The init table sets the delta rule's short convs to the identity where the student has them: three convs, one fused
    conv over [q; k; v], or none (conv_size None, where q, k, v go through SiLU alone, as through an identity conv): each
    student computes the same as the three-conv student with the same other weights."""
    m = teacher()
    sep = linearize(m, mixer="gated_deltanet", layers=[1])
    other = linearize(m, mixer="gated_deltanet", layers=[1], **cfg)
    a, b = sep.model.layers[1].self_attn.mixer, other.model.layers[1].self_attn.mixer
    sd = {k: v for k, v in a.state_dict().items() if not k.startswith("conv_")}
    if cfg.get("fused_conv"):
        sd["conv.weight"] = torch.cat([a.conv_q.weight, a.conv_k.weight, a.conv_v.weight])
        assert torch.equal(b.conv.weight, sd["conv.weight"])  # the identity, as the three convs are
    else:
        assert not [n for n, _ in b.named_parameters() if n.startswith("conv")]
    b.load_state_dict(sd)
    x = ids(1, 12)
    with torch.no_grad():
        torch.testing.assert_close(other(x).logits, sep(x).logits, rtol=1e-6, atol=1e-6)


def test_students_that_do_not_fit_the_teacher_are_refused_naming_mixer():
    """RWKV-7's heads split d_model (a teacher with heads·head_dim != d is refused)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    wide = LlamaForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="argument 'mixer'.*heads split d_model"):
        linearize(wide, mixer="rad_rwkv7")
    assert torch.isfinite(linearize(wide, mixer="liger_gla")(input_ids=ids(1, 6)).logits).all()


# -- the teachers' options: scaled RoPE (Llama 3.x), per-head qk-norm (Qwen3) ---------------------------------------

#: the default recipe's student (LoLCATs attention started at its window)
LOLCATS = {"window": 64, "window_factor": 0.99, "affine_window_factor": True}
#: transformers' RoPE scalings at a small context (max_position_embeddings 32, original 16: the test's 48 tokens reach past
#: both, where dynamic NTK and LongRoPE's long factors take over)
ROPES = {
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 4.0},
    "yarn": {"factor": 2.0, "original_max_position_embeddings": 16},
    "longrope": {"short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 2.5, 3.0, 3.5], "original_max_position_embeddings": 16},
}


def _sharp_(m):
    """q, k weights at std 0.5 (tests/test_linearize.py's teacher): maps far from uniform."""
    with torch.no_grad():
        for layer in m.model.layers:
            for p in (layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight):
                p.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("rope_type", list(ROPES))
def test_scaled_rope_teacher_is_the_window_students_at_init(rope_type):
    """A Llama teacher with a scaled RoPE: the students that take its RoPE take the scaling too (the one RoPE table of
    seqmix.ops.rotary), so lolcats at the default recipe's config, sliding-window attention and Liger attention (the
    window's weight 1), their windows covering the sequence, are the teacher: the logits are transformers' own. The same
    student without the scaling is not (the check can fail); rad_rwkv7 takes the scaling on r and k."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32,
                      rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **ROPES[rope_type]})
    cfg._attn_implementation = "eager"
    m = _sharp_(LlamaForCausalLM(cfg).eval())
    x = ids(2, 48)
    with torch.no_grad():
        want = m(input_ids=x, use_cache=False).logits
        for name, kw in (("lolcats", LOLCATS), ("sliding_window_attention", {"window": 64}),
                         ("liger_attention", {"window": 64, "window_weight": 1.0, "linear_weight": 0.0})):
            lin = linearize(m, mixer=name, **kw)
            assert lin.model.layers[0].self_attn.mixer.config.rope_scaling["type"] == rope_type
            torch.testing.assert_close(lin(input_ids=x, use_cache=False).logits, want, rtol=1e-4, atol=1e-5, msg=name)
        plain = linearize(m, mixer="lolcats", **LOLCATS, rope_scaling=None)
        assert float((plain(input_ids=x, use_cache=False).logits - want).abs().max()) > 1e-3
        rad = linearize(m, mixer="rad_rwkv7", layers=[1])
        assert rad.model.layers[1].self_attn.mixer.config.rope_scaling["type"] == rope_type
        assert torch.isfinite(rad(input_ids=x[:, :8], use_cache=False).logits).all()


def _qwen3(seed=0):
    """A tiny Qwen3 (GQA 4/2, head_dim 8), its qk-norm weights off 1 and its q, k sharp."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128, attention_bias=False)
    cfg._attn_implementation = "eager"
    m = _sharp_(Qwen3ForCausalLM(cfg).eval())
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 2.0)
            layer.self_attn.k_norm.weight.uniform_(0.5, 2.0)
    return m


def test_qwen3_teacher_is_the_window_students_at_init():
    """A Qwen3 teacher (per-head RMSNorm of q and k before RoPE): the separable students and sliding-window attention
    take its qk-norm (q, k rows as they are, γ into their own norm weights, frozen with the copied rows), so lolcats at
    the default recipe's config and sliding-window attention, their windows covering the sequence, are the teacher, and
    the identity-feature separable student's map is transformers' own attention. Without the norm (γ folded into the
    rows, no RMS division) lolcats is not the teacher (the check can fail)."""
    from seqmix.linearize.init import copied_rows

    m = _qwen3()
    att = m.model.layers[1].self_attn
    x = ids(2, 24)
    with torch.no_grad():
        out = m(input_ids=x, output_attentions=True, use_cache=False)
        for name, kw in (("lolcats", LOLCATS), ("sliding_window_attention", {"window": 64})):
            lin = linearize(m, mixer=name, **kw)
            s = lin.model.layers[1].self_attn.mixer
            assert s.config.qk_norm == "head" and s.config.qk_norm_eps == att.q_norm.variance_epsilon
            assert torch.equal(s.q_norm.weight, att.q_norm.weight) and torch.equal(s.k_norm.weight, att.k_norm.weight)
            assert torch.equal(s.W_qk.weight[:32], att.q_proj.weight)  # the rows as they are: γ is in the norm
            rows = copied_rows(s, teacher_weights(from_transformers(m).model.layers[1].self_attn.mixer))
            assert rows["q_norm.weight"] == [None] and rows["k_norm.weight"] == [None]
            torch.testing.assert_close(lin(input_ids=x, use_cache=False).logits, out.logits, rtol=1e-4, atol=1e-5, msg=name)
        folded = linearize(m, mixer="lolcats", **LOLCATS, qk_norm="none")
        s = folded.model.layers[1].self_attn.mixer
        assert s.q_norm is None  # no norm: γ ⊙ q in the rows
        gq = (att.q_proj.weight.view(4, 8, 32) * att.q_norm.weight.view(1, 8, 1)).reshape(32, 32)
        torch.testing.assert_close(s.W_qk.weight[:32], gq, rtol=0, atol=0)
        assert float((folded(input_ids=x, use_cache=False).logits - out.logits).abs().max()) > 1e-3
    for layer, probs in student_attention(m, x).items():
        torch.testing.assert_close(probs, out.attentions[layer], rtol=1e-5, atol=1e-6)


# -- sliding-window attention: the control student ---------------------------------------------------------------


def test_sliding_window_attention_is_the_teacher_cut_to_its_window():
    """The teacher's own attention with a window (kv heads kept grouped: its rows are q_proj, k_proj, v_proj, o_proj as
    they are): covering the sequence it is the teacher; at w = 4 it is transformers' own sliding-window attention
    (Mistral's, sliding_window = 4, on the same weights), not the teacher. softmax_attention itself, the name of a kept
    teacher layer, is no student."""
    from transformers import MistralConfig, MistralForCausalLM

    m = teacher(attn="eager")
    x = ids(2, 24)
    with torch.no_grad():
        want = m(input_ids=x, use_cache=False).logits
        lin = linearize(m, mixer="sliding_window_attention")
        s = lin.model.layers[2].self_attn.mixer
        att = m.model.layers[2].self_attn
        assert s.config.window == 64 and s.kv_heads == 2
        assert torch.equal(s.W_qk.weight, torch.cat([att.q_proj.weight, att.k_proj.weight]))
        assert torch.equal(s.W_v.weight, att.v_proj.weight) and torch.equal(s.W_o.weight, att.o_proj.weight)
        torch.testing.assert_close(lin(input_ids=x, use_cache=False).logits, want, rtol=1e-4, atol=1e-5)
        # beam search reorders the rows of its KV cache (kept on the slot's cache layer) as transformers' own
        assert torch.equal(lin.generate(x[:1, :6], max_new_tokens=6, do_sample=False, num_beams=3),
                           m.generate(x[:1, :6], max_new_tokens=6, do_sample=False, num_beams=3))
        c = m.config
        mcfg = MistralConfig(vocab_size=VOCAB, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                             num_hidden_layers=c.num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256, sliding_window=4, rms_norm_eps=c.rms_norm_eps,
                             rope_parameters={"rope_type": "default", "rope_theta": c.rope_parameters["rope_theta"]})
        mcfg._attn_implementation = "eager"
        mistral = MistralForCausalLM(mcfg).eval()
        mistral.load_state_dict(m.state_dict())
        ref = mistral(input_ids=x, use_cache=False).logits
        short = linearize(m, mixer="sliding_window_attention", window=4)(input_ids=x, use_cache=False).logits
        torch.testing.assert_close(short, ref, rtol=1e-4, atol=1e-5)
        assert float((short - want).abs().max()) > 1e-3
    names = valid_students()
    assert names["sliding_window_attention"] == "SoftmaxAttention" and "softmax_attention" not in names
    with pytest.raises(ValueError, match="argument 'mixer'.*teacher's own attention"):
        linearize(m, mixer="softmax_attention")


def test_sliding_window_attention_takes_a_qwen2_teachers_biases_grouped():
    """A Qwen2 teacher (q/k/v biases): the biases go with the rows, k's and v's per kv head as they are (not repeated),
    W_o's bias at 0; covering the sequence the student is the teacher; the bias rows are frozen with the weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from seqmix.linearize.init import copied_rows

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    m = _sharp_(Qwen2ForCausalLM(cfg).eval())
    with torch.no_grad():
        for layer in m.model.layers:
            for lin_ in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                lin_.bias.normal_(0, 0.5)
    x = ids(2, 24)
    lin = linearize(m, mixer="sliding_window_attention")
    s, att = lin.model.layers[1].self_attn.mixer, m.model.layers[1].self_attn
    assert torch.equal(s.W_qk.bias, torch.cat([att.q_proj.bias, att.k_proj.bias])) and torch.equal(s.W_v.bias, att.v_proj.bias)
    assert float(s.W_o.bias.abs().max()) == 0.0
    rows = copied_rows(s, teacher_weights(from_transformers(m).model.layers[1].self_attn.mixer))
    assert rows["W_qk.bias"] == [(0, 32), (32, 48)] and rows["W_v.bias"] == [None]
    with torch.no_grad():
        torch.testing.assert_close(lin(input_ids=x, use_cache=False).logits, m(input_ids=x, use_cache=False).logits,
                                   rtol=1e-4, atol=1e-5)


def test_sliding_window_attention_decodes_in_the_windows_kv(tmp_path):
    """Its decoding state is the window's keys and values (w − 1 tokens, a bounded buffer) kept on the slot's cache layer:
    constant in the context, state_size() floats per sequence; greedy generate() is the argmax of full forwards, the
    steps equal the full forward, and the saved folder loads and decodes the same."""
    m = teacher()
    lin = linearize(m, mixer="sliding_window_attention", window=4)
    assert sorted(students(lin)) == [0, 1, 2]
    x = ids(1, 40)
    out = lin.generate(x[:, :5], max_new_tokens=6, do_sample=False)
    assert torch.equal(lin(out).logits[:, 4:-1].argmax(-1), out[:, 5:])
    save(lin, tmp_path)
    back = load_converted(tmp_path)
    with torch.no_grad():
        full = back(x, use_cache=False).logits
        torch.testing.assert_close(full, lin(x, use_cache=False).logits, rtol=1e-5, atol=1e-5)
        cache = DynamicCache(config=back.config)
        steps = [back(x[:, :5], cache=cache, use_cache=True).logits]
        for t in range(5, x.shape[1]):
            steps.append(back(x[:, t:t + 1], cache=cache, use_cache=True).logits)
            kv = cache.layers[0]._seqmix_state["kv"]
            assert len(kv) == 3 and kv.capacity <= max(2 * 3, 3 + kv.BLOCK)
            assert kv.floats() == back.model.layers[0].self_attn.mixer.state_size() == 2 * 3 * 16
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-5)
