"""Multi-query associative recall (MQAR), compatible with the Zoology generator.

The layout of one example (peer-zoology note §1.2; dsf note §5.1), V = vocab_size,
N = num_kv_pairs, L = seq_len:

    inputs   k_1 v_1 k_2 v_2 … k_N v_N | 0 0 k_3 0 0 0 k_1 0 …        (length L)
    labels   -100 …             -100   | … v_3 at k_3's position, v_1 at k_1's …

* keys are drawn from [1, V/2), values from [V/2, V), N distinct keys and N distinct
  values per example (token 0 is the filler);
* every key is queried once in the query region (length L − 2N); its query sits at
  offset 2·g of that region, the gaps g drawn without replacement from
  p(g) ∝ a·(g+1)^(a−1), g = 0 … (L − 2N)/2 − 1 (power_a = a = 0.01: queries crowd right
  after the context);
* the label is the key's value, placed at the query position (next-token prediction:
  the value itself never appears after the query); -100 everywhere else;
* ``random_non_queries`` replaces every filler 0 by a token drawn uniformly from the
  whole vocabulary (the Based mixture's setting; the ICLR'24 and DSF protocols use 0).

Generation is vectorized over examples: distinct keys and values by rejection (few
collisions) or by the order of uniform scores (many); the gaps by the Gumbel-top-k trick,
which draws an ordered sample without replacement from the same distribution as drawing
one gap at a time and renormalizing (Plackett–Luce). Zoology draws with numpy's legacy
``choice(replace=False, p=…)``, which draws in rounds: the same marginal law up to that
detail, not the same bits (peer-zoology note §1.10). 100k examples of (512, 64) take a
few seconds.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from .base import IGNORE, TaskArrays, TaskConfig

__all__ = ["MQARConfig", "multiquery_ar", "distinct_choice", "power_law_gaps"]


def distinct_choice(rng: np.random.Generator, n: int, k: int, rows: int) -> np.ndarray:
    """[rows, k] integers in [0, n), distinct within each row, each row a uniformly random
    ordered k-subset."""
    if k > n:
        raise ValueError(f"distinct_choice: cannot draw k = {k} distinct values from n = {n}")
    if k * k <= 2 * n:  # P(collision) <= 1 - e^-1: rejection is cheap
        out = rng.integers(0, n, size=(rows, k))
        todo = np.arange(rows)
        while todo.size:
            s = np.sort(out[todo], axis=1)
            bad = (s[:, 1:] == s[:, :-1]).any(axis=1) if k > 1 else np.zeros(todo.size, bool)
            todo = todo[bad]
            if todo.size:
                out[todo] = rng.integers(0, n, size=(todo.size, k))
        return out
    out = np.empty((rows, k), dtype=np.int64)
    step = max(1, (1 << 24) // n)  # rows per chunk: ~16M scores at a time
    for a in range(0, rows, step):
        u = rng.random((min(step, rows - a), n), dtype=np.float32)
        sel = np.argpartition(u, k - 1, axis=1)[:, :k]  # the k smallest scores: a uniform k-subset
        order = np.argsort(np.take_along_axis(u, sel, 1), axis=1)  # in score order: a uniform permutation
        out[a:a + u.shape[0]] = np.take_along_axis(sel, order, 1)
    return out


def power_law_gaps(rng: np.random.Generator, space: int, k: int, rows: int, power_a: float) -> np.ndarray:
    """[rows, k] distinct gaps in [0, space), drawn in order without replacement from
    p(g) ∝ a·(g+1)^(a−1) (Gumbel-top-k: the k largest of log p(g) + Gumbel noise)."""
    if k > space:
        raise ValueError(f"power_law_gaps: cannot place k = {k} queries in {space} slots")
    logp = (power_a - 1.0) * np.log(np.arange(1, space + 1, dtype=np.float64))
    out = np.empty((rows, k), dtype=np.int64)
    step = max(1, (1 << 23) // space)
    for a in range(0, rows, step):
        r = min(step, rows - a)
        score = logp - np.log(-np.log(rng.random((r, space))))
        top = np.argpartition(-score, k - 1, axis=1)[:, :k] if k < space else np.tile(np.arange(space), (r, 1))
        order = np.argsort(-np.take_along_axis(score, top, 1), axis=1)
        out[a:a + r] = np.take_along_axis(top, order, 1)
    return out


def multiquery_ar(
    rng: np.random.Generator,
    *,
    num_examples: int,
    vocab_size: int = 8192,
    seq_len: int = 64,
    num_kv_pairs: int = 4,
    power_a: float = 0.01,
    random_non_queries: bool = False,
) -> TaskArrays:
    """MQAR examples (module docstring): inputs and labels, int64 [num_examples, seq_len].

    Needs only numpy: usable on its own to evaluate any model (zoology#25)."""
    V, L, N, M = vocab_size, seq_len, num_kv_pairs, num_examples
    keys = distinct_choice(rng, V // 2 - 1, N, M) + 1  # [M, N] in [1, V/2)
    values = distinct_choice(rng, V - V // 2, N, M) + V // 2  # [M, N] in [V/2, V)
    inputs = np.zeros((M, L), dtype=np.int64)
    labels = np.full((M, L), IGNORE, dtype=np.int64)
    inputs[:, 0:2 * N:2] = keys
    inputs[:, 1:2 * N:2] = values
    gaps = power_law_gaps(rng, (L - 2 * N) // 2, N, M, power_a)  # gap of key i's query
    pos = 2 * N + 2 * gaps  # [M, N]
    rows = np.arange(M)[:, None]
    inputs[rows, pos] = keys
    labels[rows, pos] = values
    if random_non_queries:
        filler = inputs == 0
        inputs[filler] = rng.integers(0, V, size=int(filler.sum()))
    return TaskArrays(inputs, labels)


class MQARConfig(TaskConfig):
    """One MQAR segment (defaults: Zoology's V = 8192, power_a = 0.01, filler 0)."""

    task: Literal["mqar"] = "mqar"
    vocab_size: int = Field(8192, gt=1, description="V: keys from [1, V/2), values from [V/2, V)")
    seq_len: int = Field(64, gt=1, description="L, even; needs 4·num_kv_pairs <= L and V > L")
    num_kv_pairs: int = Field(4, gt=0, description="N key-value pairs, each queried once")
    num_examples: int = Field(100_000, gt=0, description="examples in this segment")
    power_a: float = Field(0.01, gt=0, description="power-law exponent of the query gaps (1 = uniform)")
    random_non_queries: bool = Field(False, description="random filler tokens instead of 0 (Based mixture)")

    @model_validator(mode="after")
    def _fits(self):
        L, N, V = self.seq_len, self.num_kv_pairs, self.vocab_size
        if L % 2:
            raise ValueError(f"seq_len = {L} must be even")
        if 4 * N > L:
            raise ValueError(f"num_kv_pairs = {N} does not fit seq_len = {L}: needs 4·num_kv_pairs <= seq_len")
        if V <= L:
            raise ValueError(f"vocab_size = {V} must exceed seq_len = {L} (Zoology's check)")
        if N > V // 2 - 1:
            raise ValueError(f"num_kv_pairs = {N} exceeds the {V // 2 - 1} keys of vocab_size = {V}")
        return self

    @property
    def slice_name(self) -> str:
        return f"mqar(L={self.seq_len},kv={self.num_kv_pairs})"

    def generate(self, rng: np.random.Generator) -> TaskArrays:
        return multiquery_ar(
            rng,
            num_examples=self.num_examples,
            vocab_size=self.vocab_size,
            seq_len=self.seq_len,
            num_kv_pairs=self.num_kv_pairs,
            power_a=self.power_a,
            random_non_queries=self.random_non_queries,
        )
