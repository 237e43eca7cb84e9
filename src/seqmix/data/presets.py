"""Data presets of the published protocols (peer-zoology note §1.3, dsf note §5.1,
metala note §6.1, bmojo note §7.3). Each function returns a :class:`DataConfig`;
``scale`` < 1 shrinks the number of examples (for smoke runs), nothing else.

| preset | segments | filler | batch |
|---|---|---|---|
| ``zoology_iclr24(L, kv)`` | one task, 100k / 3k | 0 | 512 (L <= 128), 256 (256), 128 (512) |
| ``based_mixture()`` | 5 train (100k + 4×20k), 7 test (1k each, up to L = 1024) | random | 256 / 32 |
| ``dsf_mqar(L, kv)`` | one task, 100k / 3k, data seed 0 | 0 | 512 / 256 / 128 / 64 for L = 64 … 512 (qLSTM: half) |
| ``metala_a7()`` | (512, 80), 100k / 3k | 0 | 128 |
| ``mad_*()`` | 12,800 train / 1,280 test | | 128 |
"""

from __future__ import annotations

from . import DataConfig
from .mqar import MQARConfig
from .synthetic import FuzzyMQARConfig, InductionHeadsConfig, NoisyMQARConfig, SelectiveCopyingConfig

#: the four (L, #kv) tasks of Zoology ICLR'24 Fig. 2 and of the DSF paper
MQAR_TASKS = ((64, 4), (128, 8), (256, 16), (512, 64))


def _n(count: int, scale: float) -> int:
    return max(1, int(round(count * scale)))


def zoology_batch(seq_len: int) -> int:
    return 512 if seq_len <= 128 else 256 if seq_len <= 256 else 128


def dsf_batch(seq_len: int) -> int:
    """The DSF paper's batch: 512, halved at L >= 128, 256 and 512 (dsf note §5.1)."""
    return 512 if seq_len < 128 else 256 if seq_len < 256 else 128 if seq_len < 512 else 64


def mqar(seq_len: int, num_kv_pairs: int, *, train: int = 100_000, test: int = 3_000, vocab_size: int = 8192,
         batch_size: int = 64, random_non_queries: bool = False, seed: int = 0, power_a: float = 0.01) -> DataConfig:
    """One MQAR task, train and test drawn from separate streams."""
    kw = dict(seq_len=seq_len, num_kv_pairs=num_kv_pairs, vocab_size=vocab_size, power_a=power_a,
              random_non_queries=random_non_queries)
    return DataConfig(train=[MQARConfig(num_examples=train, **kw)], test=[MQARConfig(num_examples=test, **kw)],
                      batch_size=batch_size, seed=seed)


def zoology_iclr24(seq_len: int, num_kv_pairs: int, *, scale: float = 1.0) -> DataConfig:
    return mqar(seq_len, num_kv_pairs, train=_n(100_000, scale), test=_n(3_000, scale),
                batch_size=zoology_batch(seq_len), seed=123)


def dsf_mqar(seq_len: int, num_kv_pairs: int, *, scale: float = 1.0, half_batch: bool = False) -> DataConfig:
    b = dsf_batch(seq_len) // (2 if half_batch else 1)
    return mqar(seq_len, num_kv_pairs, train=_n(100_000, scale), test=_n(3_000, scale), batch_size=b, seed=0)


def metala_a7(*, scale: float = 1.0) -> DataConfig:
    return mqar(512, 80, train=_n(100_000, scale), test=_n(3_000, scale), batch_size=128, seed=123)


BASED_TRAIN = ((64, 4, 100_000), (128, 8, 20_000), (256, 16, 20_000), (256, 32, 20_000), (256, 64, 20_000))
BASED_TEST = ((64, 4), (64, 8), (64, 16), (128, 32), (256, 64), (512, 128), (1024, 256))


def based_mixture(*, scale: float = 1.0) -> DataConfig:
    """The Based / "original_mqar" mixture: random filler, length and #kv extrapolation at test."""
    tr = [MQARConfig(seq_len=L, num_kv_pairs=n, num_examples=_n(m, scale), random_non_queries=True) for L, n, m in BASED_TRAIN]
    te = [MQARConfig(seq_len=L, num_kv_pairs=n, num_examples=_n(1_000, scale), random_non_queries=True) for L, n in BASED_TEST]
    return DataConfig(train=tr, test=te, batch_size=256, test_batch_size=32, seed=123)


def _mad(cls, scale: float, test_kw: dict | None = None, **kw) -> DataConfig:
    return DataConfig(train=[cls(num_examples=_n(12_800, scale), **kw)],
                      test=[cls(num_examples=_n(1_280, scale), **{**kw, **(test_kw or {})})], batch_size=128, seed=0)


def mad_selective_copying(*, scale: float = 1.0, **kw) -> DataConfig:
    return _mad(SelectiveCopyingConfig, scale, **kw)


def mad_induction_heads(*, scale: float = 1.0, **kw) -> DataConfig:
    return _mad(InductionHeadsConfig, scale, **kw)


def mad_noisy_mqar(*, scale: float = 1.0, **kw) -> DataConfig:
    return _mad(NoisyMQARConfig, scale, **kw)


def mad_fuzzy_mqar(*, scale: float = 1.0, **kw) -> DataConfig:
    return _mad(FuzzyMQARConfig, scale, test_kw={"test_full_keys": True}, **kw)
