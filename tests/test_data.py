"""The task generators: MQAR (label placement, key uniqueness, ranges, power-law gaps,
disjoint train/test streams, determinism, the cache) and the B'MOJO synthetic tasks."""

import numpy as np
import pytest
import torch

from seqmix.data import DataConfig, MQARConfig, build_data, multiquery_ar
from seqmix.data.base import IGNORE
from seqmix.data.mqar import distinct_choice, power_law_gaps
from seqmix.data.synthetic import FuzzyMQARConfig, InductionHeadsConfig, NoisyMQARConfig, SelectiveCopyingConfig


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


def _mqar(M=500, V=8192, L=64, N=4, seed=0, **kw):
    return multiquery_ar(np.random.default_rng(seed), num_examples=M, vocab_size=V, seq_len=L, num_kv_pairs=N, **kw)


@pytest.mark.parametrize("L,N", [(64, 4), (128, 8), (64, 16), (32, 8)])
def test_mqar_layout_labels_keys_values(L, N):
    V = 256
    a = _mqar(M=400, V=V, L=L, N=N)
    x, y = a.inputs, a.labels
    assert x.shape == y.shape == (400, L)
    keys, vals = x[:, 0:2 * N:2], x[:, 1:2 * N:2]
    # ranges: keys in [1, V/2), values in [V/2, V)
    assert keys.min() >= 1 and keys.max() < V // 2
    assert vals.min() >= V // 2 and vals.max() < V
    for i in range(x.shape[0]):
        assert len(set(keys[i])) == N and len(set(vals[i])) == N  # unique per example
        pos = np.nonzero(y[i] != IGNORE)[0]
        assert len(pos) == N  # exactly one query per key
        assert pos.min() >= 2 * N and np.all((pos - 2 * N) % 2 == 0)  # even offsets of the query region
        kv = dict(zip(keys[i], vals[i]))
        assert sorted(x[i, pos]) == sorted(keys[i])  # the queried tokens are this example's keys
        assert all(y[i, p] == kv[x[i, p]] for p in pos)  # the label is the key's value, at the query
        filler = np.setdiff1d(np.arange(2 * N, L), pos)
        assert np.all(x[i, filler] == 0)  # filler 0 (random_non_queries off)
    assert np.all(y[:, : 2 * N] == IGNORE)


def test_random_filler_leaves_context_and_queries():
    a = _mqar(M=200, V=512, L=64, N=4, random_non_queries=True)
    b = _mqar(M=200, V=512, L=64, N=4, random_non_queries=False)
    scored = b.labels != IGNORE
    same = (a.inputs == b.inputs)
    assert np.all(same[:, :8]) and np.all(same[scored])  # context and queries untouched
    filler = ~scored
    filler[:, :8] = False
    assert (a.inputs[filler] != 0).mean() > 0.95  # the zeros became random tokens over the whole vocabulary
    assert a.inputs[filler].max() >= 256  # values' range included (distractors)


def test_power_law_first_gap_follows_the_law():
    space, a = 28, 0.01  # (64, 4)
    g = power_law_gaps(np.random.default_rng(1), space, 4, 60_000, a)
    w = a * np.arange(1, space + 1) ** (a - 1)
    p = w / w.sum()
    emp = np.bincount(g[:, 0], minlength=space) / g.shape[0]
    assert 0.5 * np.abs(emp - p).sum() < 0.01  # total variation: the first draw is exactly p
    assert np.all(np.sort(g, 1)[:, 1:] != np.sort(g, 1)[:, :-1])  # without replacement
    # power_a = 1 is uniform
    u = power_law_gaps(np.random.default_rng(2), space, 4, 60_000, 1.0)
    emp_u = np.bincount(u[:, 0], minlength=space) / u.shape[0]
    assert 0.5 * np.abs(emp_u - 1 / space).sum() < 0.01
    # the law crowds queries right after the context: gap 0 is far likelier than the last gap
    assert emp[0] > 5 * emp[-1]


def test_query_gaps_match_numpy_sequential_choice():
    """The mean gap agrees with Zoology's numpy choice(replace=False, p=...) (peer-zoology note §1.2)."""
    space, N, a = 56, 8, 0.01  # (128, 8)
    w = a * np.arange(1, space + 1) ** (a - 1)
    rs = np.random.RandomState(0)
    ref = np.stack([rs.choice(space, N, replace=False, p=w / w.sum()) for _ in range(4000)])
    ours = power_law_gaps(np.random.default_rng(0), space, N, 20_000, a)
    assert abs(ours.mean() - ref.mean()) < 0.05 * ref.mean()
    assert abs((ours < 8).mean() - (ref < 8).mean()) < 0.02


@pytest.mark.parametrize("n,k", [(4095, 8), (4095, 80), (20, 16), (10, 10)])
def test_distinct_choice_both_paths(n, k):
    out = distinct_choice(np.random.default_rng(0), n, k, 300)
    assert out.shape == (300, k) and out.min() >= 0 and out.max() < n
    assert all(len(set(r)) == k for r in out)
    with pytest.raises(ValueError, match="distinct"):
        distinct_choice(np.random.default_rng(0), 5, 6, 1)


def test_determinism_and_seed_sensitivity():
    a, b = _mqar(seed=3), _mqar(seed=3)
    c = _mqar(seed=4)
    assert np.array_equal(a.inputs, b.inputs) and np.array_equal(a.labels, b.labels)
    assert not np.array_equal(a.inputs, c.inputs)


def _cfg(n_train=2000, n_test=2000, seed=0, **kw):
    t = dict(seq_len=64, num_kv_pairs=4, vocab_size=8192, **kw)
    return DataConfig(train=[MQARConfig(num_examples=n_train, **t)], test=[MQARConfig(num_examples=n_test, **t)], seed=seed)


def test_train_and_test_are_disjoint_streams():
    train, test = build_data(_cfg())
    tr, te = train.segments[0], test.segments[0]
    assert not torch.equal(tr.inputs, te.inputs)
    rows = {bytes(r.numpy().tobytes()) for r in tr.inputs}
    assert not any(bytes(r.numpy().tobytes()) in rows for r in te.inputs)  # no test sequence in training
    # not even the key sets line up (the Task-Level-Insights same-seed pitfall)
    assert (tr.inputs[:, :8:2] == te.inputs[:, :8:2]).all(1).float().mean() < 0.01
    # a larger test split does not change the training data
    train2, _ = build_data(_cfg(n_test=500))
    assert torch.equal(train2.segments[0].inputs, tr.inputs)


def test_cache_roundtrip(tmp_path):
    cfg = _cfg(n_train=300, n_test=100)
    a, _ = build_data(cfg)
    files = list((tmp_path / "cache" / "data").glob("mqar-*.pt"))
    assert len(files) == 2  # train and test, named by config hash
    mtimes = [f.stat().st_mtime_ns for f in files]
    b, _ = build_data(cfg)
    assert [f.stat().st_mtime_ns for f in files] == mtimes  # loaded, not rewritten
    assert torch.equal(a.segments[0].inputs, b.segments[0].inputs)
    assert a.segments[0].inputs.dtype == torch.int16  # compact storage; batches are int64
    batch = next(a.batches())
    assert batch.inputs.dtype == torch.int64 and batch.inputs.shape == (64, 64)
    c, _ = build_data(_cfg(n_train=300, n_test=100, seed=1))
    assert not torch.equal(c.segments[0].inputs, a.segments[0].inputs)


def test_batches_fixed_order_and_shuffle():
    train, _ = build_data(_cfg(n_train=256, n_test=10))
    e0 = [b.inputs for b in train.batches()]
    e1 = [b.inputs for b in train.batches(epoch=1)]
    assert all(torch.equal(x, y) for x, y in zip(e0, e1))  # Zoology: the same order every epoch
    s0 = torch.cat([b.inputs for b in train.batches(shuffle=True, seed=0, epoch=0)])
    s0b = torch.cat([b.inputs for b in train.batches(shuffle=True, seed=0, epoch=0)])
    s1 = torch.cat([b.inputs for b in train.batches(shuffle=True, seed=0, epoch=1)])
    assert torch.equal(s0, s0b) and not torch.equal(s0, s1)
    assert torch.equal(s0.sort(0).values, torch.cat(e0).sort(0).values)  # a permutation of the same examples


@pytest.mark.parametrize("kw,field", [
    (dict(seq_len=64, num_kv_pairs=17), "num_kv_pairs"),
    (dict(seq_len=63, num_kv_pairs=4), "seq_len"),
    (dict(seq_len=64, num_kv_pairs=4, vocab_size=64), "vocab_size"),
    (dict(seq_len=64, num_kv_pairs=4, power_a=0), "power_a"),
])
def test_bad_mqar_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        MQARConfig(num_examples=10, **kw)


def test_mixed_vocab_sizes_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        DataConfig(train=[MQARConfig(num_examples=5)], test=[MQARConfig(num_examples=5, vocab_size=4096)])


# -- the B'MOJO synthetic tasks -------------------------------------------------------------


def test_selective_copying():
    c = SelectiveCopyingConfig(num_examples=200, seq_len=64, num_tokens=8, vocab_size=16)
    a = c.generate(np.random.default_rng(0))
    for x, y in zip(a.inputs, a.labels):
        body = x[: 64 - 8 - 1]
        toks = body[body != 14]  # the tokens among the blanks, in order
        assert len(toks) == 8 and toks.max() < 14
        assert x[64 - 8 - 1] == 15 and np.all(x[64 - 8:] == 14)
        assert np.array_equal(y[64 - 8:], toks) and np.all(y[: 64 - 8] == IGNORE)


def test_induction_heads():
    a = InductionHeadsConfig(num_examples=300, seq_len=32).generate(np.random.default_rng(0))
    for x, y in zip(a.inputs, a.labels):
        trig = np.nonzero(x == 15)[0]
        assert len(trig) == 2 and trig[-1] == 31  # one trigger inside, one at the end
        assert y[31] == x[trig[0] + 1] and np.all(y[:31] == IGNORE)


def test_noisy_mqar():
    c = NoisyMQARConfig(num_examples=300, seq_len=64)
    a = c.generate(np.random.default_rng(0))
    K = c.vocab_size - c.noise_vocab_size
    for x, y in zip(a.inputs, a.labels):
        pairs = x.reshape(-1, 2)
        noise = pairs[:, 0] >= K
        assert np.all(pairs[noise] >= K) and np.all(pairs[~noise, 0] < K // 2)
        assert not noise[-1] and y[-2] == pairs[-1, 1]  # the probe is scored
        kv = {}
        for j, (k, v) in enumerate(pairs):
            if k >= K:
                assert y[2 * j] == IGNORE
                continue
            if k in kv:
                assert v == kv[k] and y[2 * j] == v  # a key keeps its value; a repeat is scored
            else:
                kv[k] = v
                assert y[2 * j] == IGNORE  # a first occurrence is not
        assert np.all(y[1::2] == IGNORE)
    assert 0.1 < (a.inputs.reshape(300, -1, 2)[:, :-1, 0] >= K).mean() < 0.3  # about frac_noise of the slots


@pytest.mark.parametrize("full", [False, True])
def test_fuzzy_mqar(full):
    c = FuzzyMQARConfig(num_examples=300, seq_len=64, test_full_keys=full)
    a = c.generate(np.random.default_rng(0))
    assert a.inputs.shape == (300, 64)
    n_scored = (a.labels != IGNORE).sum(1)
    assert n_scored.min() >= 1
    for x, y in zip(a.inputs, a.labels):
        s = np.nonzero(y != IGNORE)[0]
        # teacher forcing: each scored label is the next token of the stream (a value token)
        inner = s[s < 63]
        assert np.all(y[inner] == x[inner + 1])
        assert np.all(y[s] >= 7) and np.all(y[s] < 15)  # value tokens
        assert y[63] != IGNORE  # the final probe's last value token
        pad = np.nonzero(x != 15)[0][0]
        assert np.all(x[:pad] == 15) and np.all(x[pad:] < 15)  # left padding only


def test_synthetic_bad_configs_name_the_field():
    with pytest.raises(ValueError, match="num_tokens"):
        SelectiveCopyingConfig(num_examples=1, seq_len=16, num_tokens=8)
    with pytest.raises(ValueError, match="noise_vocab_size"):
        NoisyMQARConfig(num_examples=1, vocab_size=16, noise_vocab_size=15)
    with pytest.raises(ValueError, match="k_motif_size"):
        FuzzyMQARConfig(num_examples=1, k_motif_size=9)
