"""Gated DeltaNet-2 (the ``gated_deltanet2`` preset of DeltaNet, channel_gates): its core against
flash-linear-attention's naive GDN-2 references (recurrent and chunk; they compute in float32 whatever
the input, hence F32_RTOL), with and without negative eigenvalues; KDA as the case b = w = β (float64);
config errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fla_ref import fla_naive

import seqmix
from tolerances import F32_RTOL, F64_ATOL, assert_decodes_splits_and_maps, max_abs, rel_err

B = 2


def build(name="gated_deltanet2", seed=0, **overrides):
    torch.manual_seed(seed)
    return seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **overrides}).double().eval()


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def fla_inputs(m, x):
    """GDN-2's inputs from the mixer's weights, written from fla's layer (no conv): q, k = l2(SiLU(x W)),
    v = SiLU(x W_v), g = −A_h softplus(x W_f¹ W_f² + b_Δ), b = σ(x W_b) (×2 with negative eigenvalues), w = σ(x W_w)."""
    Bt, T, _ = x.shape
    H, K, V = m.H, m.K, m.V
    l2 = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    q = l2(F.silu(m.W_q(x)).view(Bt, T, H, K))
    k = l2(F.silu(m.W_k(x)).view(Bt, T, H, K))
    v = F.silu(m.W_v(x)).view(Bt, T, H, V)
    g = -m.A_log.exp().view(H, 1) * F.softplus(m.W_a(x) + m.dt_bias).view(Bt, T, H, K)
    b = torch.sigmoid(m.W_b(x)).view(Bt, T, H, K) * (2 if m.config.negative_eigenvalues else 1)
    w = torch.sigmoid(m.W_w(x)).view(Bt, T, H, V)
    return q, k, v, g, b, w


@pytest.mark.parametrize("negative_eigenvalues", [False, True])
def test_gdn2_core_matches_fla_naive(negative_eigenvalues):
    recurrent = fla_naive("ops/gdn2/naive.py", "naive_recurrent_gdn2")
    chunk = fla_naive("ops/gdn2/naive.py", "naive_chunk_gdn2")
    m = build(conv_size=None, negative_eigenvalues=negative_eigenvalues)
    x = randn(B, 19, m.d_model)
    q, k, v, g, b, w = fla_inputs(m, x)
    o_ref, S_ref = recurrent(q, k, v, g, b, w, scale=m.K**-0.5, output_final_state=True)
    o_chunk, _ = chunk(q, k, v, g, b, w, scale=m.K**-0.5, chunk_size=8)
    assert rel_err(o_chunk, o_ref) < F32_RTOL  # fla's two references agree
    for mode in m.modes:
        _, mixed = m.core(x, mode=mode)
        assert rel_err(mixed, o_ref) < F32_RTOL, mode
    # the final state too (decoding continues from it)
    from seqmix.mixers.base import Cache
    cache = Cache()
    m(x, cache=cache)
    assert rel_err(cache.get(m)["S"], S_ref) < F32_RTOL
    assert_decodes_splits_and_maps(m, x, f"gdn2 negative_eigenvalues={negative_eigenvalues}")


def test_negative_eigenvalues_reach_below_zero():
    """With b doubled, the transition's eigenvalue along a unit k, α(1 − Σ_i b_i k_i²), lies in [−α, α]: with b ≈ 2
    (σ(x W_b) ≈ 1 on positive inputs) it is ≈ −α."""
    m = build(negative_eigenvalues=True)
    with torch.no_grad():
        m.W_b.weight.zero_()
        m.W_b.weight[:, 0] = 20.0
    x = randn(B, 9, m.d_model).abs()
    ev = m.spectrum(x)
    assert ev.real.min() < -0.5 and ev.abs().max() <= 1 + 1e-9


def test_gdn2_with_equal_gates_is_kda():
    """b = w = β (every channel of a head's gates is that head's β) gives KDA: same weights, same output."""
    kda = build("kda")
    gdn2 = build(channel_gates=True, norm_shared=False, gate_act="silu", qk_l2_eps=None)
    missing, unexpected = gdn2.load_state_dict(kda.state_dict(), strict=False)
    assert set(missing) == {"W_b.weight", "W_w.weight"} and unexpected == ["W_beta.weight"]
    with torch.no_grad():
        gdn2.W_b.weight.copy_(kda.W_beta.weight.repeat_interleave(kda.K, 0))
        gdn2.W_w.weight.copy_(kda.W_beta.weight.repeat_interleave(kda.V, 0))
    x = randn(B, 13, kda.d_model)
    assert max_abs(gdn2(x), kda(x)) < F64_ATOL


def test_channel_gates_config_errors():
    with pytest.raises(ValueError, match="channel_gates"):
        seqmix.build_mixer("gated_deltanet2", num_householder=2)
    with pytest.raises(ValueError, match="channel_gates"):
        seqmix.build_mixer("gated_deltanet2", inner_decay=True)
