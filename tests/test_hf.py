"""seqmix.hf: SeqmixConfig / SeqmixForCausalLM around LanguageModel, the Auto
classes, save -> from_pretrained -> equal logits and cached generate() == uncached generate()
for every registered mixer and layer pattern, left-padded batches, sampling, beam search, eos,
bad input. Skipped when the optional extra 'hf' (transformers, safetensors) is absent."""

import dataclasses
import json

import pytest
import torch

pytest.importorskip("transformers", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")
pytest.importorskip("safetensors", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")

import seqmix.hf as H  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from seqmix.models.generation import left_pad  # noqa: E402
from tiny_models import CASES, VOCAB, tiny_model  # noqa: E402

PROMPTS = [[3, 1, 4, 1, 5, 9], [2, 7, 1], [8, 2, 8, 1, 8, 2]]
LOGITS_ATOL = 1e-6  # float32 logits after a save / from_pretrained round trip


def hf_greedy(model, ids, mask=None, n=5, **kw):
    mask = torch.ones_like(ids) if mask is None else mask  # else generate() infers one from pad_token_id's positions
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0, **kw)


@pytest.mark.parametrize("case", CASES)
def test_round_trip_and_cached_generate(case, tmp_path):
    """save_pretrained -> AutoModelForCausalLM.from_pretrained gives the same logits (float32),
    and greedy generate() with the SeqmixCache equals generate() without a cache (float64) on a
    left-padded batch. One layer per mixer (a pattern keeps two: its whole cycle) to stay fast."""
    lm = tiny_model(case, dtype=torch.float32, **({} if case.startswith("pattern:") else {"n_layers": 1}))
    model = H.SeqmixForCausalLM.wrap(lm)
    assert model.model is lm
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is H.SeqmixForCausalLM
    x = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        err = (loaded(x).logits - model(x).logits).abs().max().item()
    assert err <= LOGITS_ATOL, f"{case}: {err}"
    loaded = loaded.double()
    ids, mask = left_pad(PROMPTS[:2])
    cached = hf_greedy(loaded, ids, mask, n=4)
    assert torch.equal(cached, hf_greedy(loaded, ids, mask, n=4, use_cache=False)), case


@pytest.mark.parametrize("case", ["softmax_attention", "gla", "mamba", "pattern:bmojo"])
def test_hf_generate_equals_native_generate(case):
    model = H.SeqmixForCausalLM.wrap(tiny_model(case))
    ids, mask = left_pad(PROMPTS)
    assert torch.equal(hf_greedy(model, ids, mask), model.model.generate(PROMPTS, 5, temperature=0))


def test_auto_config_and_model_type(tmp_path):
    model = H.SeqmixForCausalLM.wrap(tiny_model("mamba", dtype=torch.float32))
    model.save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert type(cfg) is H.SeqmixConfig and cfg.model_type == "seqmix"
    assert cfg.model_config == model.model.config
    assert json.loads((tmp_path / "config.json").read_text())["seqmix"]["mixer"] == "mamba"
    fresh = AutoModelForCausalLM.from_config(cfg)
    assert isinstance(fresh.model, type(model.model))


def test_generate_uses_the_seqmix_cache_in_step_mode(monkeypatch):
    """With use_cache the first call prefills, every later call feeds one token per row."""
    model = H.SeqmixForCausalLM.wrap(tiny_model("gla"))
    seen = []
    orig = model.model.hidden
    monkeypatch.setattr(model.model, "hidden", lambda ids, cache=None, start=0: seen.append((ids.shape[1], start, cache is not None)) or orig(ids, cache, start))
    out = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=4, do_sample=False, return_dict_in_generate=True)
    assert seen == [(6, 0, True), (1, 6, True), (1, 7, True), (1, 8, True)]
    cache = H.output_cache(out)
    assert isinstance(cache, H.SeqmixCache) and cache.floats() > 0


def test_sampling_top_k_top_p_eos():
    model = H.SeqmixForCausalLM.wrap(tiny_model("mamba", dtype=torch.float32))
    ids, mask = left_pad(PROMPTS)
    greedy = hf_greedy(model, ids, mask, n=6)
    assert torch.equal(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=1, pad_token_id=0), greedy)
    torch.manual_seed(1)
    a = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_p=0.9, temperature=1.3, pad_token_id=0)
    torch.manual_seed(1)
    b = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_p=0.9, temperature=1.3, pad_token_id=0)
    assert torch.equal(a, b) and a.shape == greedy.shape
    eos = int(greedy[0, ids.shape[1]])  # row 0's first new token
    out = hf_greedy(model, ids, mask, n=6, eos_token_id=eos)
    assert int(out[0, ids.shape[1]]) == eos and (out[0, ids.shape[1] + 1:] == 0).all()


def test_beam_search_reorders_the_state():
    model = H.SeqmixForCausalLM.wrap(tiny_model("pattern:mamba_swa"))
    ids, mask = left_pad(PROMPTS)
    kw = dict(num_beams=3, num_return_sequences=2)
    cached = hf_greedy(model, ids, mask, n=5, **kw)
    assert cached.shape == (6, ids.shape[1] + 5)
    assert torch.equal(cached, hf_greedy(model, ids, mask, n=5, use_cache=False, **kw))


def test_assisted_decoding_is_refused():
    model = H.SeqmixForCausalLM.wrap(tiny_model("gla"))
    with pytest.raises(ValueError, match="stateful"):
        model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=3, assistant_model=model, do_sample=False)


def test_labels_give_the_next_token_loss():
    lm = tiny_model("gla")
    model = H.SeqmixForCausalLM.wrap(lm)
    x = torch.randint(0, VOCAB, (2, 8))
    loss = model(x, labels=x).loss.detach()
    with torch.no_grad():
        ref = torch.nn.functional.cross_entropy(lm(x)[:, :-1].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
    assert abs(float(loss) - float(ref)) < 1e-10


# -- bad input ---------------------------------------------------------------------------


def _saved(tmp_path, case="gla"):
    H.SeqmixForCausalLM.wrap(tiny_model(case, dtype=torch.float32)).save_pretrained(tmp_path)
    return json.loads((tmp_path / "config.json").read_text())


def test_unknown_mixer_in_config_file(tmp_path):
    cfg = _saved(tmp_path)
    cfg["seqmix"]["mixer"] = "no_such_mixer"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown mixer 'no_such_mixer'"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_unknown_config_field(tmp_path):
    cfg = _saved(tmp_path)
    cfg["seqmix"]["flux_capacitor"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="flux_capacitor"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    cfg["seqmix"].pop("flux_capacitor")
    cfg["seqmix"]["mixer_kwargs"]["warp"] = 9
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="warp"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_missing_and_unexpected_state_dict_keys(tmp_path):
    from safetensors.torch import load_file, save_file

    _saved(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    state.pop("model.norm_f.weight")
    state["model.extra.weight"] = torch.zeros(2)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing keys \['model.norm_f.weight'\].*unexpected keys \['model.extra.weight'\]"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_generate_past_the_position_table():
    model = H.SeqmixForCausalLM.wrap(tiny_model("softmax_attention", max_seq_len=8))
    x = torch.randint(0, VOCAB, (1, 6))
    hf_greedy(model, x, n=3)  # 6 + 3 - 1 = 8 positions: fits
    with pytest.raises(ValueError, match="max_seq_len = 8"):
        hf_greedy(model, x, n=4)


def test_bad_forward_arguments():
    model = H.SeqmixForCausalLM.wrap(tiny_model("gla"))
    x = torch.randint(0, VOCAB, (2, 4))
    with pytest.raises(ValueError, match="left padding"):
        model(x, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="pass attention_mask explicitly"):  # token 0 = pad inside the prompt
        model.generate(torch.tensor([[3, 0, 5]]), max_new_tokens=2, pad_token_id=0)
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(inputs_embeds=torch.randn(2, 4, 16))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[1, VOCAB]]))


def test_lm_eval_hflm_loglikelihood():
    """lm-evaluation-harness's HFLM scores a seqmix model: loglikelihood of hand-written
    requests equals the sum of the model's own next-token log-probabilities."""
    pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed: pip install 'seqmix[eval]'")
    pytest.importorskip("accelerate", reason="lm_eval's HFLM needs accelerate: pip install 'seqmix[eval]'")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from seqmix.hf.tokenizer import byte_level_tokenizer, byte_to_char
    from seqmix.models import ModelConfig, build_model

    torch.manual_seed(0)
    lm = build_model(ModelConfig(mixer="gla", d_model=16, n_layers=1, vocab_size=256, max_seq_len=64,
                                 mixer_kwargs={"heads": 2})).eval()
    tok = byte_level_tokenizer(eos_token=byte_to_char()[0])
    ev = HFLM(pretrained=H.SeqmixForCausalLM.wrap(lm), tokenizer=tok, batch_size=2, device="cpu")
    pairs = [("The cat", " sat"), ("ab", "c"), ("Hello,", " world")]  # no trailing space in a context
    out = ev.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    for (ctx, cont), (ll, greedy) in zip(pairs, out):
        ids = torch.tensor([list((ctx + cont).encode())])
        with torch.no_grad():
            logp = torch.log_softmax(lm(ids)[0].double(), -1)
        T, n = ids.shape[1], len(cont.encode())
        ref = sum(float(logp[t - 1, ids[0, t]]) for t in range(T - n, T))
        want_greedy = all(int(logp[t - 1].argmax()) == int(ids[0, t]) for t in range(T - n, T))
        assert abs(ll - ref) < 1e-4 and greedy == want_greedy, (ctx, cont, ll, ref)


# -- transformers' cache keyword and the continuation mask -------------------------------


def _continue_by_hand(model, ids, mask, n, name):
    """Greedy decoding by hand: prefill, then n - 1 one-token calls that pass the state under
    the keyword `name` and the mask of past + new tokens, as transformers' generate() does."""
    out = model(ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    cache, toks = H.output_cache(out), []
    for _ in range(n):
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        toks.append(tok)
        mask = torch.cat([mask, torch.ones_like(tok)], 1)
        out = model(tok, attention_mask=mask, use_cache=True, logits_to_keep=1, **{name: cache})
        assert H.output_cache(out) is cache
    return torch.cat(toks, 1)


@pytest.mark.parametrize("name", ["cache", "past_key_values", "cache_params"])
def test_every_name_of_the_cache_keyword_continues_the_state(name):
    """`cache` (transformers >= 5.24) and the older `past_key_values` / `cache_params` all
    continue the state: the tokens equal generate()'s and the native generate's."""
    model = H.SeqmixForCausalLM.wrap(tiny_model("gla"))
    ids, mask = left_pad(PROMPTS)
    with torch.no_grad():
        toks = _continue_by_hand(model, ids, mask, 4, name)
    assert torch.equal(toks, hf_greedy(model, ids, mask, n=4)[:, ids.shape[1]:])
    assert torch.equal(toks, model.model.generate(PROMPTS, 4, temperature=0)[:, -4:])


def test_continuation_mask_is_checked_against_the_cache():
    model = H.SeqmixForCausalLM.wrap(tiny_model("gla"))
    ids, mask = left_pad(PROMPTS[:2])  # row 1 has 3 pad tokens on the left
    cache = H.output_cache(model(ids, attention_mask=mask, use_cache=True))
    tok = torch.tensor([[1], [2]])
    past = ids.shape[1]
    with torch.no_grad():
        ref = model(tok, cache=cache, use_cache=True).logits  # no mask: fine
        cache = H.output_cache(model(ids, attention_mask=mask, use_cache=True))
        same = model(tok, attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1), cache=cache).logits
    assert torch.equal(ref, same)  # the past + new mask is accepted and changes nothing
    cache = H.output_cache(model(ids, attention_mask=mask, use_cache=True))
    with pytest.raises(ValueError, match=r"'attention_mask' must be \[2, 7\].*or \[2, 1\]"):
        model(tok, attention_mask=torch.ones(2, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="does not match the cache: row 1 has 6 real past tokens"):
        model(tok, attention_mask=torch.ones(2, past + 1, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="marks some of the 1 new tokens as padding"):
        model(tok, attention_mask=torch.tensor([[1], [0]]), cache=cache)
    with pytest.raises(ValueError, match="pass the decoding state once, as argument 'cache'"):
        model(tok, cache=cache, past_key_values=H.SeqmixCache())


def test_generate_output_names_the_cache_as_the_installed_transformers_does():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    out = H.SeqmixForCausalLM.wrap(tiny_model("mamba"))(torch.tensor([PROMPTS[0]]), use_cache=True)
    assert H.CACHE_FIELD in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    assert isinstance(out[H.CACHE_FIELD], H.SeqmixCache)


def test_model_fields_outside_seqmix_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"'d_model', 'mixer' are fields of seqmix's ModelConfig.*SeqmixConfig\(seqmix=\{"):
        H.SeqmixConfig(mixer="gla", d_model=16)
    with pytest.raises(ValueError, match="'mixer' is a field"):
        AutoConfig.for_model("seqmix", mixer="gla")
    assert H.SeqmixConfig(seqmix={"mixer": "gla", "d_model": 16, "n_layers": 1, "vocab_size": 10}).hidden_size == 16
