"""Wall attention (seqmix.ops.wall and the ``wall_attention`` mixer) against a loop over query/key pairs written
from fla's naive reference's formula (that file imports triton, GPU only, so it is not run here): logits
Σ_n q_tn k_sn exp(G_tn − G_sn) (+ c_t − c_s), causal softmax, a window; a continuation, decoding, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from seqmix.ops import wall_attention, wall_probs
from tolerances import F64_ATOL, max_abs


def loop_probs(q, k, G, c, window):
    B, T, H, K = q.shape
    P = torch.zeros(B, H, T, T, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                keys = [s for s in range(t + 1) if window is None or t - s < window]
                logit = torch.stack([(q[b, t, h] * k[b, s, h] * torch.exp(G[b, t, h] - G[b, s, h])).sum()
                                     + (c[b, t, h] - c[b, s, h] if c is not None else 0.0) for s in keys])
                P[b, h, t, keys] = torch.softmax(logit, 0)
    return P


@pytest.mark.parametrize("window, scalar", [(None, False), (4, True)])
def test_wall_map_equals_the_loop(window, scalar):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 11, 2, 3, generator=g, dtype=torch.float64) for _ in range(3))
    G = torch.cumsum(F.logsigmoid(torch.randn(2, 11, 2, 3, generator=g, dtype=torch.float64)), 1)
    c = torch.cumsum(F.logsigmoid(torch.randn(2, 11, 2, generator=g, dtype=torch.float64)), 1) if scalar else None
    P = wall_probs(q, k, G, G, c, c, window=window)
    assert max_abs(P, loop_probs(q, k, G, c, window)) < F64_ATOL
    assert max_abs(wall_attention(q, k, v, G, G, c, c, window=window), torch.einsum("bhts,bshv->bthv", P, v)) < F64_ATOL
    cut = (lambda t: t[:, 6:]) if scalar else (lambda t: None)
    P2 = wall_probs(q[:, 6:], k, G[:, 6:], G, cut(c) if scalar else None, c, window=window, start=6)
    assert max_abs(P2, P[:, :, 6:]) < F64_ATOL


def test_wall_mixer_decodes():
    torch.manual_seed(0)
    m = seqmix.build_mixer("wall_attention", **seqmix.mixer_entry("wall_attention").example_config(), window=6).double().eval()
    x = torch.randn(2, 13, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, :5], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(5, 13)], 1)
    assert max_abs(steps, y) < F64_ATOL
    assert set(cache.get(m)) == {"k", "v", "G", "c"} and cache.floats() == 2 * m.state_size(13)
    # the decay gate starts nearly open by default (log σ(8) ≈ −3e-4)
    assert float(seqmix.build_mixer("wall_attention", d_model=16).W_g.bias.detach()[0]) == 8.0


def test_wall_bad_input():
    q = torch.randn(1, 5, 2, 4)
    with pytest.raises(ValueError, match="'c_q' and 'c_k'"):
        wall_probs(q, q, q, q, torch.zeros(1, 5, 2), None)
    with pytest.raises(ValueError, match="'G_k'"):
        wall_probs(q, q, q, q[:, :3])
