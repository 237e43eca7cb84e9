"""LightNet (src/seqmix/mixers/linear_attention.py) against a float64 loop written from the paper's
equations: per key channel, the state is a softmax of the key logits over the whole prefix. fla ships
no naive reference for LightNet (its ops are Triton kernels only), so the loop is the reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from tolerances import F64_ATOL, assert_decodes_splits_and_maps, max_abs

B = 2


def build(seed=0, **overrides):
    torch.manual_seed(seed)
    return seqmix.build_mixer("lightnet", **{**seqmix.mixer_entry("lightnet").example_config(), **overrides}).double().eval()


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def loop(m, x):
    """y from Qin et al. 2024 §3 token by token: o_t = q_t Σ_{s<=t} softmax_s(κ_{≤t})ᵢ v_s / sqrt(d_k') per key
    channel i, then y_t = W_o(RMSNorm(o_t) ⊙ SiLU(x_t W_g¹ W_g²))."""
    Bt, T, d = x.shape
    H, K, V = m.H, m.K, m.V
    q = F.silu(x @ m.W_q.weight.T).view(Bt, T, H, K)
    kappa = (x @ m.W_k.weight.T).view(Bt, T, H, K)
    v = (x @ m.W_v.weight.T).view(Bt, T, H, V)
    out = []
    for t in range(T):
        w = torch.softmax(kappa[:, : t + 1], dim=1)  # [B, t+1, H, K]: over the prefix, per channel
        S = torch.einsum("bshk,bshv->bhkv", w, v[:, : t + 1])
        o = torch.einsum("bhk,bhkv->bhv", q[:, t], S) / K**0.5
        o = o.reshape(Bt, H * V)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + m.config.norm_eps) * m.norm.weight
        g = x[:, t] @ m.W_g[0].weight.T @ m.W_g[1].weight.T
        out.append((o * F.silu(g)) @ m.W_o.weight.T)
    return torch.stack(out, 1)


@pytest.mark.parametrize("d_model, head_size", [(16, 8), (12, 16)])
def test_lightnet_equals_the_papers_loop(d_model, head_size):
    m = build(d_model=d_model, head_size=head_size)
    x = randn(B, 13, d_model)
    ref = loop(m, x)
    for mode in m.modes:
        m.mode = mode
        assert max_abs(m(x), ref) < F64_ATOL, mode
    # decoding and a split carry z (the running log-sum-exp) with S
    cache = Cache()
    y = torch.cat([m(x[:, :5], cache=cache)] + [m(x[:, t : t + 1], cache=cache) for t in range(5, 13)], 1)
    assert max_abs(y, ref) < F64_ATOL
    assert set(cache.get(m)) == {"S", "z"}
    assert_decodes_splits_and_maps(m, x, f"lightnet d={d_model}")


def test_lightnet_state_weights_sum_to_one_per_channel():
    """Each key channel's weights over the prefix are a softmax: Σ_s Π α · k_s = 1, so with v = 1 the core's
    state is all ones, and the DSF's decays lie in (0, 1]."""
    m = build()
    x = randn(B, 11, m.d_model)
    q, k, v, g, _ = m._params(x)
    A = torch.exp(torch.cumsum(g, dim=1))  # Π_{r<=t} α_r
    weights_sum = (A * torch.cumsum(k / A, dim=1))  # Σ_{s<=t} (Π_{r=s+1}^{t} α_r) k_s
    assert max_abs(weights_sum, torch.ones_like(weights_sum)) < 1e-12
    lam = m.decays(x)
    assert lam.min() > 0 and lam.max() <= 1


def test_lightnet_config_errors():
    with pytest.raises(ValueError, match="head_size"):
        seqmix.build_mixer("lightnet", d_model=24, head_size=16)
    with pytest.raises(ValueError, match="gate_rank"):
        seqmix.build_mixer("lightnet", gate_rank=0)
