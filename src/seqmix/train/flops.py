"""Model FLOPs per token and the matmul peak they are compared with (MFU).

The estimate (Kaplan et al. 2020, §2.1; PaLM appendix B's "model FLOPs"): a forward pass
costs 2 FLOPs per multiply-accumulate of every weight matrix, the backward twice that, so
training costs ``6·N`` FLOPs per token for N non-embedding matrix parameters plus the tied
head (d·V); attention-family mixers add ``6·n_layers·T·d`` for the scores and the weighted
sum over a context of T (half of 12·n_layers·T·d: the map is causal). Recurrent and
convolutional mixers' state updates are O(d·n) per token and are inside the ``6·N`` term's
order of magnitude only when n is small; they are not counted (the estimate is a floor for
them, as MFU conventionally is). Activation recomputation is never counted.
"""

from __future__ import annotations

import time

import torch

from ..models import LanguageModel

#: mixer families whose core costs O(T) per token (a T×T map)
QUADRATIC_FAMILIES = ("attention",)


def flops_per_token(model: LanguageModel, seq_len: int, *, training: bool = True) -> float:
    """Model FLOPs per token at context ``seq_len`` (module docstring): 6·N + 6·L·T·d for
    training, a third of it for a forward pass."""
    c = model.config
    n = model.num_params(embeddings=False) + c.vocab_size * c.d_model  # matrices + the tied head
    quad = 0
    for i, block in enumerate(model.blocks):
        from ..mixers import mixer_entry

        if mixer_entry(c.layer_mixer(i)[0]).family in QUADRATIC_FAMILIES:
            quad += seq_len * c.d_model
    fwd = 2 * n + 2 * quad
    return float(3 * fwd if training else fwd)


_PEAK: dict[tuple, float] = {}


def matmul_peak_flops(device: str = "cpu", sizes=(512, 1024), repeats: int = 3) -> float:
    """This machine's float32 matmul rate in FLOP/s, measured once per process (best of a few
    square sizes; bench/_common.matmul_peak_gflops does the same at larger sizes)."""
    key = (str(device), tuple(sizes))
    if key not in _PEAK:
        best = 0.0
        for n in sizes:
            a = torch.randn(n, n, device=device)
            b = torch.randn(n, n, device=device)
            a @ b
            for _ in range(repeats):
                if str(device).startswith("cuda"):
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                a @ b
                if str(device).startswith("cuda"):
                    torch.cuda.synchronize()
                best = max(best, 2 * n**3 / max(time.perf_counter() - t0, 1e-9))
        _PEAK[key] = best
    return _PEAK[key]


__all__ = ["QUADRATIC_FAMILIES", "flops_per_token", "matmul_peak_flops"]
