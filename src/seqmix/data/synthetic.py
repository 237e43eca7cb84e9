"""The synthetic tasks of the B'MOJO paper's Table 3 (bmojo note §7.3), vectorized.

The paper gives no task hyper-parameters; the defaults are those of the MAD benchmark
(Poli et al. 2024, `athms/mad-lab` task configs) and of the Mamba paper, as the bmojo
note §7.3 recommends. Every task writes inputs and labels of exactly ``seq_len`` tokens,
labels already aligned with the input position whose output is scored (-100 elsewhere).

* **selective copying** (Mamba paper; MAD ``selective-copying``): ``num_tokens`` tokens
  from [0, V−2) at random positions among blanks (V−2), then the copy token (V−1), then
  ``num_tokens`` blanks at whose positions the tokens are to be output in order.
* **induction heads** (Olsson et al.; Mamba paper's synthetic): random tokens from
  [0, V−1); a trigger token (V−1) followed by a target token at a random place; the
  sequence ends with the trigger, whose position must output the target.
* **noisy MQAR** (MAD ``noisy-in-context-recall``, multi-query): key-value pairs (keys
  from [0, K/2), values from [K/2, K), K = V − noise_vocab_size, each key keeping its
  value within the example); each pair slot is replaced by two noise tokens from
  [K, V) with probability ``frac_noise``; every value whose key was seen before is
  scored at its key's position; the last pair re-queries a key seen before.
* **fuzzy MQAR** (MAD ``fuzzy-in-context-recall``, multi-query): keys and values are
  motifs of 1 … ``k_motif_size`` / ``v_motif_size`` distinct tokens (keys from [0, K/2),
  values from [K/2, K), K = V − 1, pad token V − 1 on the left); every token of a
  value whose key motif was seen before is scored (teacher forcing), as is the final
  re-queried pair. As in MAD, test examples use keys of the full motif size only
  (``test_full_keys``).

Differences to MAD, chosen for a fixed length and vectorized generation: sequences are
exactly ``seq_len`` long (MAD drops one token in the shift); the noisy task scores at
the key's position the value that follows (the same next-token target); the fuzzy task
lays pairs left to right until the next pair would not fit and then left-pads, and its
probe pair is a pair of the body drawn at random (MAD inserts a fresh probe pair).
MAD trains on the next token everywhere and scores only the probes at test time: set
``DataConfig.train_targets = "all_tokens"`` for that.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from .base import IGNORE, TaskArrays, TaskConfig

__all__ = ["SelectiveCopyingConfig", "InductionHeadsConfig", "NoisyMQARConfig", "FuzzyMQARConfig"]


def _sorted_positions(rng, rows: int, slots: int, k: int) -> np.ndarray:
    """[rows, k] increasing positions: a uniform k-subset of [0, slots) per row."""
    u = rng.random((rows, slots))
    return np.sort(np.argpartition(u, k - 1, axis=1)[:, :k], axis=1)


class SelectiveCopyingConfig(TaskConfig):
    """Selective copying (MAD defaults: V = 16, L = 256, 16 tokens, 12,800 examples)."""

    task: Literal["selective_copying"] = "selective_copying"
    vocab_size: int = Field(16, gt=3, description="V: tokens [0, V-2), blank V-2, copy token V-1")
    seq_len: int = Field(256, gt=1, description="L, needs L > 2·num_tokens + 1")
    num_examples: int = Field(12_800, gt=0)
    num_tokens: int = Field(16, gt=0, description="tokens to copy")

    @model_validator(mode="after")
    def _fits(self):
        if self.seq_len <= 2 * self.num_tokens + 1:
            raise ValueError(f"num_tokens = {self.num_tokens} does not fit seq_len = {self.seq_len}: needs seq_len > 2·num_tokens + 1")
        return self

    @property
    def slice_name(self) -> str:
        return f"selcopy(L={self.seq_len},k={self.num_tokens})"

    def generate(self, rng):
        V, L, k, M = self.vocab_size, self.seq_len, self.num_tokens, self.num_examples
        blank, copy = V - 2, V - 1
        tokens = rng.integers(0, V - 2, size=(M, k))
        inputs = np.full((M, L), blank, dtype=np.int64)
        rows = np.arange(M)[:, None]
        inputs[rows, _sorted_positions(rng, M, L - k - 1, k)] = tokens
        inputs[:, L - k - 1] = copy
        labels = np.full((M, L), IGNORE, dtype=np.int64)
        labels[:, L - k:] = tokens
        return TaskArrays(inputs, labels)


class InductionHeadsConfig(TaskConfig):
    """Induction heads (Mamba paper: V = 16, L = 256)."""

    task: Literal["induction_heads"] = "induction_heads"
    vocab_size: int = Field(16, gt=2, description="V: tokens [0, V-1), trigger V-1")
    seq_len: int = Field(256, gt=3, description="L")
    num_examples: int = Field(12_800, gt=0)

    @property
    def slice_name(self) -> str:
        return f"induction(L={self.seq_len})"

    def generate(self, rng):
        V, L, M = self.vocab_size, self.seq_len, self.num_examples
        trigger = V - 1
        inputs = rng.integers(0, V - 1, size=(M, L))
        at = rng.integers(0, L - 2, size=M)  # the trigger's first place; its target follows
        rows = np.arange(M)
        target = inputs[rows, at + 1]
        inputs[rows, at] = trigger
        inputs[:, L - 1] = trigger
        labels = np.full((M, L), IGNORE, dtype=np.int64)
        labels[:, L - 1] = target
        return TaskArrays(inputs, labels)


class NoisyMQARConfig(TaskConfig):
    """Noisy multi-query recall (MAD defaults: V = 32 with 16 noise tokens, L = 128, 20% noise)."""

    task: Literal["noisy_mqar"] = "noisy_mqar"
    vocab_size: int = Field(32, gt=3, description="V, including the noise vocabulary")
    seq_len: int = Field(128, gt=3, description="L, even")
    num_examples: int = Field(12_800, gt=0)
    noise_vocab_size: int = Field(16, ge=0, description="noise tokens [V - noise_vocab_size, V)")
    frac_noise: float = Field(0.2, ge=0, lt=1, description="probability that a pair slot is noise")

    @model_validator(mode="after")
    def _fits(self):
        if self.seq_len % 2:
            raise ValueError(f"seq_len = {self.seq_len} must be even")
        if self.vocab_size - self.noise_vocab_size < 2:
            raise ValueError(f"noise_vocab_size = {self.noise_vocab_size} leaves fewer than 2 key/value tokens of vocab_size = {self.vocab_size}")
        if self.frac_noise > 0 and self.noise_vocab_size == 0:
            raise ValueError("frac_noise > 0 needs noise_vocab_size > 0")
        return self

    @property
    def slice_name(self) -> str:
        return f"noisy_mqar(L={self.seq_len},noise={self.frac_noise:g})"

    def generate(self, rng):
        V, L, M = self.vocab_size, self.seq_len, self.num_examples
        K = V - self.noise_vocab_size
        nk = K // 2
        P = L // 2  # pair slots; the last one is the probe
        rows = np.arange(M)[:, None]
        keys = rng.integers(0, nk, size=(M, P))
        table = rng.integers(nk, K, size=(M, nk))  # each key's value in this example
        noise = rng.random((M, P)) < self.frac_noise
        noise[np.arange(M), rng.integers(0, P - 1, size=M)] = False  # at least one pair before the probe
        noise[:, P - 1] = False
        # the probe re-queries a key presented in the body
        onehot = np.zeros((M, P, nk), dtype=bool)
        onehot[rows, np.arange(P), keys] = ~noise
        presented = onehot[:, : P - 1].any(1)  # [M, nk]
        score = np.where(presented, rng.random((M, nk)), -1.0)
        keys[:, P - 1] = score.argmax(1)
        onehot[:, P - 1] = False
        onehot[np.arange(M), P - 1, keys[:, P - 1]] = True
        values = table[rows, keys]
        seen_before = (np.cumsum(onehot, 1) - onehot)[rows, np.arange(P), keys] > 0  # [M, P]
        inputs = np.empty((M, L), dtype=np.int64)
        inputs[:, 0::2] = keys
        inputs[:, 1::2] = values
        nz = int(noise.sum())
        noise_tok = rng.integers(K, V, size=(nz, 2)) if nz else np.zeros((0, 2), np.int64)
        inputs.reshape(M, P, 2)[noise] = noise_tok
        labels = np.full((M, L), IGNORE, dtype=np.int64)
        scored = seen_before & ~noise
        lab = labels[:, 0::2]
        lab[scored] = values[scored]
        labels[:, 0::2] = lab
        return TaskArrays(inputs, labels)


class FuzzyMQARConfig(TaskConfig):
    """Fuzzy multi-query recall: multi-token keys and values (MAD defaults: V = 16, L = 128, motifs of 3)."""

    task: Literal["fuzzy_mqar"] = "fuzzy_mqar"
    vocab_size: int = Field(16, gt=4, description="V: keys [0, K/2), values [K/2, K), K = V - 1; pad V - 1")
    seq_len: int = Field(128, gt=3, description="L")
    num_examples: int = Field(12_800, gt=0)
    k_motif_size: int = Field(3, gt=0, description="largest key motif (tokens)")
    v_motif_size: int = Field(3, gt=0, description="largest value motif (tokens)")
    test_full_keys: bool = Field(False, description="keys of the full motif size only (MAD's test split)")

    @model_validator(mode="after")
    def _fits(self):
        nk = (self.vocab_size - 1) // 2
        nv = (self.vocab_size - 1) - nk
        if self.k_motif_size > nk or self.v_motif_size > nv:
            raise ValueError(
                f"k_motif_size = {self.k_motif_size} / v_motif_size = {self.v_motif_size} exceed the {nk} key / {nv} value "
                f"tokens of vocab_size = {self.vocab_size} (motifs are of distinct tokens)"
            )
        if self.seq_len < 2 * (self.k_motif_size + self.v_motif_size):
            raise ValueError(f"seq_len = {self.seq_len} must hold at least two pairs of the largest motifs")
        return self

    @property
    def slice_name(self) -> str:
        return f"fuzzy_mqar(L={self.seq_len},k={self.k_motif_size},v={self.v_motif_size})"

    def generate(self, rng):
        P = self.seq_len // 2 + 1
        step = max(1, (1 << 25) // (P * P))  # rows per chunk: bounds the [rows, P, P] comparison
        parts = [self._rows(rng, min(step, self.num_examples - a)) for a in range(0, self.num_examples, step)]
        return TaskArrays(np.concatenate([p.inputs for p in parts]), np.concatenate([p.labels for p in parts]))

    def _rows(self, rng, M: int) -> TaskArrays:
        V, L = self.vocab_size, self.seq_len
        ks, vs = self.k_motif_size, self.v_motif_size
        K = V - 1
        nk, pad = K // 2, V - 1
        P = L // 2 + 1  # enough pair slots to fill L (each pair has >= 2 tokens)
        # motif sizes and tokens (a motif is an ordered tuple of distinct tokens)
        ksz = np.full((M, P), ks) if self.test_full_keys else rng.integers(1, ks + 1, size=(M, P))
        vsz = rng.integers(1, vs + 1, size=(M, P))
        kt = np.argsort(rng.random((M, P, nk)), axis=2)[:, :, :ks]  # [M, P, ks]
        kid = (kt * (nk ** np.arange(ks))).cumsum(2)[np.arange(M)[:, None], np.arange(P), ksz - 1] * (ks + 1) + ksz  # motif id
        vt_new = np.argsort(rng.random((M, P, K - nk)), axis=2)[:, :, :vs] + nk
        # a repeated key motif keeps the value of its first occurrence
        same = kid[:, :, None] == kid[:, None, :]  # [M, P, P]
        first = same.argmax(2)  # first occurrence of pair j's key
        vt = vt_new[np.arange(M)[:, None], first]
        vsz = vsz[np.arange(M)[:, None], first]
        seen_before = first < np.arange(P)
        # fill left to right while the pair fits, keeping room for the final probe
        plen = ksz + vsz
        end = np.cumsum(plen, 1)
        room = L - (ks + vs)
        fits = end <= room
        nb = fits.sum(1)  # pairs in the body (>= 2 since L >= 2·(ks + vs))
        # the probe: a body pair drawn at random, repeated at the very end
        pj = (rng.random(M) * nb).astype(np.int64)
        # token arrays per pair slot: [M, P + 1, ks + vs], the last slot is the probe
        idx = np.concatenate([np.arange(P), [0]])[None].repeat(M, 0)
        idx[:, P] = pj
        tok = np.concatenate([kt, vt], 2)[np.arange(M)[:, None], idx]  # [M, P+1, ks+vs]
        kk, vv = ksz[np.arange(M)[:, None], idx], vsz[np.arange(M)[:, None], idx]
        scored_pair = np.concatenate([seen_before & fits, np.ones((M, 1), bool)], 1)
        used = np.concatenate([fits, np.ones((M, 1), bool)], 1)
        c = np.arange(ks + vs)
        is_key = c[None, None] < kk[..., None]
        is_val = (c[None, None] >= ks) & (c[None, None] < ks + vv[..., None])
        keep = (is_key | is_val) & used[..., None]  # [M, P+1, ks+vs]
        lab_tok = np.where(is_val & scored_pair[..., None], tok, IGNORE)
        n_tok = keep.sum((1, 2))  # tokens per example (<= L)
        # right-align in L + 1 slots (the last token lands at index L), pad on the left
        rank = np.cumsum(keep.reshape(M, -1), 1).reshape(keep.shape) - 1
        pos = (L + 1 - n_tok)[:, None, None] + rank
        seq = np.full((M, L + 1), pad, dtype=np.int64)
        lab = np.full((M, L + 1), IGNORE, dtype=np.int64)
        r, p, q = np.nonzero(keep)
        seq[r, pos[r, p, q]] = tok[r, p, q]
        lab[r, pos[r, p, q]] = lab_tok[r, p, q]
        # next-token shift: the output at t predicts token t + 1 (a value token is scored where its predecessor sits)
        return TaskArrays(np.ascontiguousarray(seq[:, :L]), np.ascontiguousarray(lab[:, 1:]))
