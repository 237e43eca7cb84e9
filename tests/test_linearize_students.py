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
from seqmix.linearize import linearize, residuals, save, teacher_weights, transfer, valid_students  # noqa: E402
from test_linearize import VOCAB, ids, teacher  # noqa: E402

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
    """{q, k, v, o: the student's tensors the init table fills} (packed W_qk, Mamba-2's in_proj, RWKV-7's W_r or W_q)."""
    sd = s.state_dict()
    if "W_qk.weight" in sd:
        return {"q": sd["W_qk.weight"][: H * K], "k": sd["W_qk.weight"][H * K:], "v": sd["W_v.weight"], "o": sd["W_o.weight"]}
    if "in_proj.weight" in sd:  # [z; x; B; C; dt]
        D, W = H * K, sd["in_proj.weight"]
        return {"v": W[D:2 * D], "k": W[2 * D:3 * D], "q": W[3 * D:4 * D], "o": sd["out_proj.weight"]}
    q = sd["W_r.weight"] if "W_r.weight" in sd else sd["W_q.weight"]
    return {"q": q, "k": sd["W_k.weight"], "v": sd["W_v.weight"], "o": sd["W_o.weight"]}


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
    back(x[:, :5], past_key_values=cache, use_cache=True)
    floats = []
    for t in range(5, 12):
        back(x[:, t:t + 1], past_key_values=cache, use_cache=True)
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


def test_students_that_do_not_fit_the_teacher_are_refused_naming_mixer():
    """RWKV-7's heads split d_model (a teacher with heads·head_dim != d is refused); the students that take the teacher's
    RoPE (the window students, RWKV-7) refuse a scaled RoPE they cannot reproduce."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    wide = LlamaForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="argument 'mixer'.*heads split d_model"):
        linearize(wide, mixer="rad_rwkv7")
    assert torch.isfinite(linearize(wide, mixer="liger_gla")(input_ids=ids(1, 6)).logits).all()
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    scaled = LlamaForCausalLM(cfg).eval()
    for name in ("lolcats", "liger_attention", "rad_rwkv7"):
        with pytest.raises(ValueError, match="argument 'mixer'.*rope_scaling"):
            linearize(scaled, mixer=name)
    assert torch.isfinite(linearize(scaled, mixer="liger_gla")(input_ids=ids(1, 6)).logits).all()
