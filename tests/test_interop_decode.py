"""The decode path of interop's adapter (seqmix.interop.adapter, "the decoding step is checked once"): after
a fully checked call, a one-token call that matches the record is a trusted step (no per-call lookups, the
state updated in place); its outputs equal the fully checked path's, and every changed input still takes
the full path or is refused: other positions or a padding mask, a cache reordered, reset or written by
someone else, another cache object, another width, an argument the mixer does not take."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    DynamicCache, LlamaConfig, LlamaForCausalLM, Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM,
    RwkvConfig, RwkvForCausalLM,
)

from interop_helpers import INTEROP_RTOL, VOCAB, ids, scale_err  # noqa: E402
from seqmix.interop import InteropMixer, from_transformers  # noqa: E402


def _model(family: str):
    torch.manual_seed(0)
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    if family == "llama":
        m = LlamaForCausalLM(LlamaConfig(**common, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64))
    elif family == "mamba":
        m = MambaForCausalLM(MambaConfig(**common, state_size=8))
    elif family == "mamba2":
        m = Mamba2ForCausalLM(Mamba2Config(**common, state_size=8, num_heads=8, head_dim=8, n_groups=2, chunk_size=8))
    elif family == "rwkv":
        m = RwkvForCausalLM(RwkvConfig(**common, context_length=64))
    elif family == "gla":  # a linearized Llama: the "layer" state kind
        from seqmix.linearize import linearize
        return linearize(_model("llama"), mixer="gla", layers="all").eval()
    else:
        raise KeyError(family)
    return from_transformers(m.eval())


def _adapters(model) -> list[InteropMixer]:
    return [m for m in model.modules() if isinstance(m, InteropMixer) and m.state_table]


def _count_trusted(model, monkeypatch) -> list:
    """Records each adapter's trusted steps (one entry per call that took that path)."""
    taken = []
    orig = InteropMixer._trusted_step

    def spy(self, *a, **kw):
        out = orig(self, *a, **kw)
        if out is not None:
            taken.append(self)
        return out

    monkeypatch.setattr(InteropMixer, "_trusted_step", spy)
    return taken


def _no_trust(monkeypatch):
    monkeypatch.setattr(InteropMixer, "_trusted_step", lambda self, *a, **kw: None)


def _step_kw(model, cache, pos: int) -> dict:
    kw = {"cache": cache, "use_cache": True}
    if model.config.model_type in ("llama",):
        kw["position_ids"] = torch.tensor([[pos]])
    return kw


def _cache(model):
    return DynamicCache(config=model.config) if model.config.model_type != "rwkv" else None


def _decode(model, x, steps: int):
    """Logits of a prefill of x[:, :8] and then ``steps`` one-token calls on x[:, 8:8 + steps], by hand."""
    cache, outs = _cache(model), []
    with torch.no_grad():
        if model.config.model_type == "rwkv":
            out = model(x[:, :8], use_cache=True)
            state = out.state
            outs.append(out.logits)
            for t in range(8, 8 + steps):
                out = model(x[:, t:t + 1], state=state, use_cache=True)
                state = out.state
                outs.append(out.logits)
            return outs, state
        outs.append(model(x[:, :8], **{**_step_kw(model, cache, 0), "position_ids": None}).logits)
        for t in range(8, 8 + steps):
            outs.append(model(x[:, t:t + 1], **_step_kw(model, cache, t)).logits)
    return outs, cache


@pytest.mark.parametrize("family", ["llama", "mamba", "mamba2", "rwkv", "gla"])
def test_trusted_steps_equal_the_checked_path(family, monkeypatch):
    """Every layer takes the trusted path on every step after the prefill, and the logits equal those of the
    fully checked path (the trusted path switched off) to rounding."""
    model, x = _model(family), ids(batch=2, T=16)
    reference, _ = _no_trust_decode(model, x, monkeypatch)
    taken = _count_trusted(model, monkeypatch)
    outs, _ = _decode(model, x, 6)
    assert len(taken) == 6 * len(_adapters(model))
    for a, b in zip(outs, reference):
        assert scale_err(a, b) <= INTEROP_RTOL


def _no_trust_decode(model, x, monkeypatch):
    with monkeypatch.context() as mp:
        _no_trust(mp)
        return _decode(model, x, 6)


def test_generate_takes_the_trusted_path(monkeypatch):
    """generate(): one fully checked call per layer (the prefill), every decoding step trusted."""
    model = _model("mamba2")
    taken = _count_trusted(model, monkeypatch)
    prompt = ids(batch=1, T=9)
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert len(taken) == 4 * len(_adapters(model))


@pytest.mark.parametrize("family", ["llama", "mamba", "gla"])
def test_no_state_is_kept_after_generate_returns(family):
    """generate's cache object dies when it returns, and every adapter forgets its record with it: the decoding state
    (a KV cache's buffers, a recurrent state) is freed then, not held until the layer's next call."""
    model = _model(family)
    with torch.no_grad():
        model.generate(ids(batch=1, T=9), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert [a.where for a in _adapters(model) if a._trust is not None] == []


def test_the_record_and_its_state_live_as_long_as_the_cache():
    """While the caller holds the cache, the record stays (the next step is trusted); once the cache is dropped, the
    record goes and the seqmix state it held is freed."""
    import weakref

    model, x = _model("llama"), ids(batch=1, T=12)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :8], cache=cache, use_cache=True)
    adapter = _adapters(model)[0]
    kv = weakref.ref(adapter._trust.state["kv"])
    assert kv() is not None
    del cache
    assert adapter._trust is None and kv() is None


def test_the_state_is_updated_in_place_in_transformers_tensor():
    """Mamba's recurrent state is a view of transformers' slot: the trusted step writes it in place, no copy."""
    model, x = _model("mamba"), ids(batch=1, T=12)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :8], cache=cache, use_cache=True)
        slot = cache.layers[0].recurrent_states[0]
        before = slot.clone()
        version = slot._version
        model(x[:, 8:9], cache=cache, use_cache=True)
    assert cache.layers[0].recurrent_states[0] is slot and slot._version > version and not torch.equal(slot, before)


def _trusted_llama():
    """A converted Llama after a prefill of 8 tokens and one trusted step: (model, tokens [1, 12], its cache)."""
    model, x = _model("llama"), ids(batch=1, T=12)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :8], cache=cache, use_cache=True)
        model(x[:, 8:9], cache=cache, use_cache=True, position_ids=torch.tensor([[8]]))  # trusted from here
    return model, x, cache


def test_other_positions_or_a_padding_mask_are_refused_on_a_trusted_step():
    model, x, cache = _trusted_llama()
    with torch.no_grad(), pytest.raises(ValueError, match="position_ids"):
        model(x[:, 9:10], cache=cache, use_cache=True, position_ids=torch.tensor([[3]]))
    model, cache = _model("mamba"), None
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :8], cache=cache, use_cache=True)
        model(x[:, 8:9], cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="attention_mask"):
            model(x[:, 9:10], cache=cache, use_cache=True, attention_mask=torch.tensor([[1] * 9 + [0]]))


def test_an_argument_the_mixer_does_not_take_is_refused_on_a_trusted_step():
    model, x = _model("mamba"), ids(batch=1, T=12)
    cache = DynamicCache(config=model.config)
    layer = model.backbone.layers[0].mixer
    with torch.no_grad():
        model(x[:, :8], cache=cache, use_cache=True)
        h = torch.randn(1, 1, 32)
        layer(h, cache=cache)  # trusted from here
        with pytest.raises(ValueError, match="seq_idx"):
            layer(h, cache=cache, seq_idx=torch.zeros(1, 1, dtype=torch.int32))
        with pytest.raises(ValueError, match="d_model"):  # another width: the full path's input check
            layer(torch.randn(1, 1, 16), cache=cache)


def _expected_after(model, cache, x_step):
    """The next step's logits from ``cache`` through the fully checked path (a copy of the cache: another object)."""
    twin = copy.deepcopy(cache)
    with torch.no_grad():
        return model(x_step, cache=twin, use_cache=True).logits


@pytest.mark.parametrize("change", ["written in place", "reordered", "reset"])
def test_a_cache_changed_by_someone_else_takes_the_full_path(change, monkeypatch):
    """Mamba-2's state is kept as a copy beside transformers' (its layout is transposed), so a write by another
    hand must be seen: the version counter of the slot, a replaced slot (beam search's reorder), a reset."""
    model, x = _model("mamba2"), ids(batch=2, T=12)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :8], cache=cache, use_cache=True)
        model(x[:, 8:9], cache=cache, use_cache=True)  # trusted from here
        if change == "written in place":
            cache.layers[1].recurrent_states[0].mul_(0.5)
        elif change == "reordered":
            cache.reorder_cache(torch.tensor([1, 0]))
        else:
            cache.reset()
    expected = _expected_after(model, cache, x[:, 9:10])
    taken = _count_trusted(model, monkeypatch)
    with torch.no_grad():
        got = model(x[:, 9:10], cache=cache, use_cache=True).logits
    assert not taken, "the changed cache took the trusted path"
    assert torch.allclose(got, expected, rtol=0, atol=0)
    with torch.no_grad():  # and the next step is trusted again, from the state just read
        model(x[:, 10:11], cache=cache, use_cache=True)
    assert len(taken) == len(_adapters(model))


def test_another_cache_object_takes_the_full_path(monkeypatch):
    model, x = _model("llama"), ids(batch=1, T=12)
    first, second = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :8], cache=first, use_cache=True)
        model(x[:, :8], cache=second, use_cache=True)
        taken = _count_trusted(model, monkeypatch)
        a = model(x[:, 8:9], cache=first, use_cache=True).logits  # the adapters last saw `second`
        assert not taken
        b = model(x[:, 8:9], cache=second, use_cache=True).logits
    assert torch.equal(a, b)


# -- torch.compile of the decoding step (opt-in: seqmix.compile_decode) ------------------------------------


def _student(mixer: str, layers: int = 2, **cfg):
    from seqmix.linearize import linearize

    torch.manual_seed(0)
    t = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=64, pad_token_id=0, eos_token_id=1, bos_token_id=1))
    return linearize(t.eval(), mixer=mixer, **cfg).eval()


def test_compile_decode_refuses_what_it_cannot_compile():
    import seqmix

    with pytest.raises(ValueError, match="holds no converted or linearized"):
        seqmix.compile_decode(LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                           num_attention_heads=4, intermediate_size=64)))
    with pytest.raises(ValueError, match="'prompt'"):
        seqmix.compile_decode(_student("gla"), prompt=torch.randn(1, 4))


@pytest.mark.slow
@pytest.mark.parametrize("mixer,cfg", [("gla", {}), ("retnet", {}), ("mamba2", {}), ("gated_deltanet", {}),
                                       ("linear_attention", {"feature_map": "hedgehog"}),
                                       ("bmojo_f", {"window": 8, "ssm_mode": "chunk", "expand": 1, "d_state": 4}),
                                       ("lolcats", {"window": 8}), ("liger_attention", {"window": 8})])
def test_a_students_decoding_step_is_one_graph(mixer, cfg):
    """torch.compile traces each student's decoding step (in place, as the trusted step runs it) without a break."""
    import torch._dynamo as dynamo

    from seqmix.ops import states_in_place

    model = _student(mixer, layers=1, **cfg)
    adapter = _adapters(model)[0]
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids(batch=1, T=12), cache=cache, use_cache=True)
        dynamo.reset()
        with states_in_place():
            ex = dynamo.explain(adapter.mixer.decode_step)(torch.randn(1, 1, 32), adapter._trust.state)
    assert ex.graph_break_count == 0, [str(b.reason).splitlines()[0] for b in ex.break_reasons]


@pytest.mark.slow
def test_compile_decode_gives_the_eager_logits():
    """A linearized Llama's greedy generation with the compiled decoding step: the eager tokens and scores (to
    float32 rounding); the first call's time is measured; uncompile_decode restores the eager step."""
    import seqmix
    from seqmix.interop import uncompile_decode

    model, prompt = _student("gla"), ids(batch=1, T=9)
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = model.generate(prompt, **kw)
        info = seqmix.compile_decode(model, prompt=prompt)
        out = model.generate(prompt, **kw)
    assert info["compiled"] == 2 and info["eager"] == 0 and info["first_call_s"] > 0
    assert all(a.__dict__.get("_step_fn") is not None for a in _adapters(model))
    assert torch.equal(out.sequences, ref.sequences)
    assert scale_err(torch.stack(out.scores), torch.stack(ref.scores)) <= INTEROP_RTOL
    uncompile_decode(model)
    assert all(a.__dict__.get("_step_fn") is None for a in _adapters(model))


@pytest.mark.slow
def test_compile_decode_of_a_windowed_student_leaves_nothing_to_compile_at_any_prompt():
    """compile_decode's first call runs a sliding-window student's steps from one token through a full window (4), so
    that generating after a prompt shorter than the window, as long as it, or longer compiles no further graph
    (dynamo's count of unique graphs does not grow), and gives the eager tokens."""
    import seqmix
    from torch._dynamo.utils import counters

    model = _student("lolcats", window=4)
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with torch.no_grad():
        refs = {T: model.generate(ids(batch=1, T=T), **kw) for T in (2, 4, 9)}
        seqmix.compile_decode(model, prompt=ids(batch=1, T=9))
        graphs = counters["stats"]["unique_graphs"]
        for T, ref in refs.items():
            assert torch.equal(model.generate(ids(batch=1, T=T), **kw), ref), T
    assert counters["stats"]["unique_graphs"] == graphs
    seqmix.interop.uncompile_decode(model)


def test_the_one_token_check_passes_exactly_what_the_full_check_passes():
    """The trusted step's check of one sequence's token (one host read) against the rule the full check applies: the
    position equals the tokens seen (a KV cache) or follows position 0 (a recurrent state, key None); a causal mask row
    shows min(seen + 1, window) keys, as a bool or an additive float mask. Whatever it does not pass goes to the full
    check (False), so a wrong token is still refused there with its message."""
    from types import SimpleNamespace

    from seqmix.interop.adapter import _one_token_passes

    trust = SimpleNamespace(seen=5, window=None)
    assert _one_token_passes(torch.tensor([[5]]), ("positions", 5, 1), trust)
    assert not _one_token_passes(torch.tensor([[4]]), ("positions", 5, 1), trust)
    assert _one_token_passes(torch.tensor([[7]]), ("positions", None, 1), trust)  # a recurrent state: any after 0
    assert not _one_token_passes(torch.tensor([[0]]), ("positions", None, 1), trust)
    assert not _one_token_passes(torch.tensor([[5, 5]]), ("positions", 5, 1), trust)  # two sequences: the full check
    full = torch.ones(1, 1, 1, 6, dtype=torch.bool)
    assert _one_token_passes(full, ("causal", 5, 1, None), trust)
    hidden = full.clone()
    hidden[..., 0] = False  # a padded key
    assert not _one_token_passes(hidden, ("causal", 5, 1, None), trust)
    additive = torch.zeros(1, 1, 1, 6)
    assert _one_token_passes(additive, ("causal", 5, 1, None), trust)
    additive[..., 2] = float("-inf")
    assert not _one_token_passes(additive, ("causal", 5, 1, None), trust)
    windowed = SimpleNamespace(seen=5, window=4)  # the query sees its last 4 keys
    row = torch.zeros(1, 1, 1, 6, dtype=torch.bool)
    row[..., 2:] = True
    assert _one_token_passes(row, ("causal", 5, 1, 4), windowed)
    assert not _one_token_passes(full, ("causal", 5, 1, 4), windowed)


def test_a_padded_mask_row_is_refused_on_a_trusted_attention_step():
    model, x, cache = _trusted_llama()
    with torch.no_grad(), pytest.raises(ValueError, match="attention_mask"):
        model(x[:, 9:10], cache=cache, use_cache=True, position_ids=torch.tensor([[9]]),
              attention_mask=torch.tensor([[0] + [1] * 9]))


def test_each_step_check_reads_its_tensor_once_per_step(monkeypatch):
    """A model whose layers take different masks (Gemma 2: sliding and full attention) checks, per decoding step,
    each of its keys (the positions, each mask) once: the later layers of the step find it in ``_VERIFIED.steps``,
    and the keys of earlier steps are dropped before the current step's (no key read twice across the steps)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    import seqmix.interop.adapter as adapter

    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, intermediate_size=64, sliding_window=4, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                          layer_types=["sliding_attention", "full_attention"] * 2)
    model = from_transformers(Gemma2ForCausalLM(config).eval())
    checked = []
    one = adapter._one_token_passes

    def spy(t, key, trust):
        checked.append(key)
        return one(t, key, trust)

    monkeypatch.setattr(adapter, "_one_token_passes", spy)
    with torch.no_grad():
        model.generate(ids(batch=1, T=6), max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    kinds = {(k[0], k[-1]) for k in checked}
    assert {("positions", 1), ("causal", 4), ("causal", None)} <= kinds  # the positions and both masks were checked
    assert len(checked) == len(set(checked)) and len(checked) >= 3 * 6  # once each, over the trusted steps
