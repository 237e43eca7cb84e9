"""LanguageModel.generate (seqmix.models.generation): cached decoding equals recomputation for
every registered mixer and layer pattern, prompts of different lengths equal each prompt
alone, sampling filters, positions, eos, beam reordering of the state, bad input."""

import pytest
import torch

from seqmix.models.generation import filter_logits, left_pad, prefill, step
from tiny_models import CASES, VOCAB, tiny_model

PROMPTS = [[3, 1, 4, 1, 5, 9], [2, 7, 1], [8, 2, 8, 1, 8, 2]]  # lengths 6, 3, 6: two groups
NEW = 6


@pytest.mark.parametrize("case", CASES)
def test_cached_greedy_equals_recomputation(case):
    """Prefill + step decoding through the Cache gives the tokens of full recomputation
    (each prompt alone, no padding) for a ragged batch (float64)."""
    m = tiny_model(case)
    cached = m.generate(PROMPTS, NEW, temperature=0)
    recomputed = m.generate(PROMPTS, NEW, temperature=0, use_cache=False)
    assert torch.equal(cached, recomputed), f"{case}:\n{cached}\n{recomputed}"
    # the batch equals each prompt alone, with the cache
    for i, p in enumerate(PROMPTS):
        alone = m.generate(torch.tensor([p]), NEW, temperature=0)
        assert torch.equal(alone[0, -NEW:], cached[i, -NEW:]), f"{case}: row {i}"


@pytest.mark.parametrize("case", ["gla", "softmax_attention", "mamba", "pattern:mamba_swa"])
def test_float32_cached_equals_recomputation(case):
    m = tiny_model(case, dtype=torch.float32)
    x = torch.randint(0, VOCAB, (2, 7))
    assert torch.equal(m.generate(x, 8, temperature=0), m.generate(x, 8, temperature=0, use_cache=False))


def test_prefill_logits_equal_the_forward_pass():
    m = tiny_model("gla")
    ids, mask = left_pad(PROMPTS)
    logits, state = prefill(m, ids, mask.sum(1))
    for i, p in enumerate(PROMPTS):
        ref = m(torch.tensor([p]))[0]
        assert torch.allclose(logits[i, -len(p):], ref, atol=1e-10)
        assert (logits[i, :-len(p)] == 0).all()
    assert sorted(state.positions.tolist()) == [3, 6, 6] and len(state.groups) == 2


def test_reorder_continues_the_selected_rows():
    """RaggedState.reorder_ (beam search) = Cache.map_(index_select): after reordering, each row
    continues the row it was taken from."""
    m = tiny_model("pattern:bmojo")
    ids, mask = left_pad(PROMPTS)
    _, state = prefill(m, ids, mask.sum(1))
    tok = torch.tensor([5, 6, 7])
    index = torch.tensor([2, 2, 1, 0])
    state.reorder_(index)
    got = step(m, tok[index], state)
    for j, r in enumerate(index.tolist()):
        _, alone = prefill(m, torch.tensor([PROMPTS[r]]))
        ref = step(m, tok[r:r + 1], alone)
        assert torch.allclose(got[j], ref[0], atol=1e-10)
    assert state.batch_size == 4


def test_sampling_is_seeded_and_filters_agree_with_greedy():
    m = tiny_model("gla", dtype=torch.float32)
    x = torch.randint(0, VOCAB, (2, 5))
    a = m.generate(x, 10, temperature=1.0, seed=3)
    b = m.generate(x, 10, temperature=1.0, seed=3)
    c = m.generate(x, 10, temperature=1.0, seed=4)
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = m.generate(x, 10, temperature=0)
    assert torch.equal(m.generate(x, 10, temperature=0.7, top_k=1, seed=0), greedy)
    assert torch.equal(m.generate(x, 10, temperature=0.7, top_p=1e-6, seed=0), greedy)


def test_filter_logits_against_a_loop():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 11, generator=g, dtype=torch.float64)
    for k, p in [(3, None), (None, 0.5), (5, 0.8), (11, 0.999)]:
        out = filter_logits(logits, k, p)
        for b in range(4):
            row = logits[b]
            keep = set(torch.argsort(row, descending=True)[: k or 11].tolist())
            if p is not None:
                order = [i for i in torch.argsort(row, descending=True).tolist() if i in keep]
                probs = torch.softmax(row[order], 0)  # top-p acts on the top-k renormalized
                acc, nucleus = 0.0, set()
                for i, q in zip(order, probs.tolist()):
                    if acc >= p:
                        break
                    nucleus.add(i)
                    acc += q
                keep = nucleus
            assert set(torch.isfinite(out[b]).nonzero().reshape(-1).tolist()) == keep


def test_eos_stops_rows_and_pads():
    m = tiny_model("mamba")
    x = torch.tensor(PROMPTS[0]).unsqueeze(0).repeat(2, 1)
    free = m.generate(x, NEW, temperature=0)
    eos = int(free[0, x.shape[1] + 1])  # the second new token
    out = m.generate(x, NEW, temperature=0, eos_token_id=eos, pad_token_id=0)
    assert out.shape[1] == x.shape[1] + 2  # every row finished: the loop stopped
    assert torch.equal(out[:, -2:], free[:, x.shape[1]:x.shape[1] + 2])


def test_learned_positions_bound_the_context():
    m = tiny_model("softmax_attention", max_seq_len=8)
    x = torch.randint(0, VOCAB, (1, 5))
    m.generate(x, 4, temperature=0)  # 5 + 4 - 1 = 8 positions: fits
    with pytest.raises(ValueError, match="max_seq_len = 8"):
        m.generate(x, 5, temperature=0)
    # a recurrent model without positions has no such bound
    r = tiny_model("mamba", max_seq_len=8)
    assert r.generate(x, 12, temperature=0).shape == (1, 17)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-1), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(eos_token_id=VOCAB), "eos_token_id"),
])
def test_bad_arguments(kwargs, match):
    m = tiny_model("gla")
    x = torch.randint(0, VOCAB, (1, 4))
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        m.generate(x, **kwargs)


def test_bad_prompts_and_masks():
    m = tiny_model("gla")
    with pytest.raises(ValueError, match="input_ids"):
        m.generate(torch.tensor([[1, VOCAB]]), 2)
    with pytest.raises(ValueError, match="input_ids"):
        m.generate(torch.randn(1, 3), 2)
    with pytest.raises(ValueError, match="input_ids"):
        m.generate([[1, 2], []], 2)
    x = torch.randint(0, VOCAB, (2, 4))
    with pytest.raises(ValueError, match="left padding"):
        m.generate(x, 2, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="attention_mask"):
        m.generate(x, 2, attention_mask=torch.ones(2, 3, dtype=torch.long))


def test_generate_restores_training_mode_and_streams():
    m = tiny_model("gla").train()
    seen = []
    out = m.generate(torch.randint(0, VOCAB, (2, 4)), 5, temperature=0, callback=seen.append)
    assert m.training and len(seen) == 5 and torch.equal(torch.stack(seen, 1), out[:, 4:])
