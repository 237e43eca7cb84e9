"""Based and ReBased: the feature-map linear attentions that hold recall (presets of separable
attention, src/seqmix/mixers/attention.py). Their feature maps' kernels (seqmix.ops.features),
their cores against flash-linear-attention's naive references where fla is installed, the
paper's state size, the layer pattern of Based's stack, and config errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from fla_ref import fla_naive

import seqmix
from seqmix.models import ModelConfig, build_model, layer_pattern
from seqmix.ops.features import apply_feature_map, feature_dim, square_features, taylor_feature_dim, taylor_features
from tolerances import F64_ATOL, assert_decodes_splits_and_maps, max_abs

B = 2


def build(name, seed=0, **overrides):
    torch.manual_seed(seed)
    return seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **overrides}).double().eval()


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("order", [0, 1, 2, 3])
def test_symmetric_taylor_basis_has_the_kronecker_kernel_in_fewer_features(order):
    x, y = randn(3, 7, 5, seed=1), randn(3, 7, 5, seed=2)
    kron = (taylor_features(x, order) * taylor_features(y, order)).sum(-1)
    sym_x, sym_y = taylor_features(x, order, "symmetric"), taylor_features(y, order, "symmetric")
    s = (x * y).sum(-1)
    assert max_abs((sym_x * sym_y).sum(-1), kron) < 1e-12
    assert max_abs(kron, sum(s**p / math.factorial(p) for p in range(order + 1))) < 1e-12
    assert sym_x.shape[-1] == taylor_feature_dim(5, order, "symmetric") == sum(math.comb(5 + p - 1, p) for p in range(order + 1))
    assert taylor_feature_dim(16, 2, "symmetric") == 153  # Based's feature width for K = 16


def test_square_features_are_the_squared_dot_product():
    x, y = randn(4, 6, seed=3), randn(4, 6, seed=4)
    assert max_abs((square_features(x) * square_features(y)).sum(-1), (x * y).sum(-1) ** 2) < 1e-12
    assert apply_feature_map("square", x).shape[-1] == feature_dim("square", 6) == 21
    with pytest.raises(ValueError, match="basis"):
        taylor_features(x, 2, "dense")


def _heads(t):
    return t.transpose(1, 2)  # [B, T, H, K] -> [B, H, T, K] (fla's naive layout)


def test_based_core_matches_fla_naive():
    naive = fla_naive("ops/based/naive.py", "naive_parallel_based")
    m = build("based")
    x = randn(B, 19, m.d_model)
    q, k, v = m._qkv(x, scaled=False)
    K = m.head_qk
    # fla normalizes by the row sum + 1e-6: the numerator and the row sum (values = 1) separately, exactly
    num = naive(_heads(q), _heads(k), _heads(v), scale=K**-0.5, use_norm=False)
    den = naive(_heads(q), _heads(k), torch.ones_like(_heads(v[..., :1])), scale=K**-0.5, use_norm=False)
    _, mixed = m.core(x)
    assert max_abs(mixed, _heads(num / den)) < F64_ATOL
    # and fla's normalized output within what its ε moves it: 1e-6·|o|/η, η = Σ(1 + s + s²/2) >= 1/2 per token
    assert max_abs(mixed, _heads(naive(_heads(q), _heads(k), _heads(v), scale=K**-0.5))) < 1e-5


def test_based_chunk_reference_of_fla_matches_too():
    naive = fla_naive("ops/based/naive.py", "naive_chunk_based")
    m = build("based")
    x = randn(B, 16, m.d_model)
    q, k, v = m._qkv(x, scaled=False)
    _, mixed = m.core(x, mode="chunk")
    assert max_abs(mixed, _heads(naive(_heads(q), _heads(k), _heads(v), chunk_size=8))) < 1e-5  # fla's ε, as above


def test_rebased_core_matches_fla_naive_with_a_learned_kernel():
    naive = fla_naive("ops/rebased/naive.py", "naive_parallel_rebased")
    m = build("rebased")
    with torch.no_grad():  # γ = 1, β = 0 at init: random ones, so that the test sees them
        m.feature_gamma.copy_(1 + 0.3 * randn(m.head_qk, seed=5))
        m.feature_beta.copy_(0.3 * randn(m.head_qk, seed=6))
    x = randn(B, 19, m.d_model)
    q, k, v = m._qkv(x, scaled=False)
    K = m.head_qk
    q, k = (F.layer_norm(t, (K,), m.feature_gamma, m.feature_beta) for t in (q, k))
    num = naive(_heads(q), _heads(k), _heads(v), scale=K**-0.5, use_norm=False)
    den = naive(_heads(q), _heads(k), torch.ones_like(_heads(v[..., :1])), scale=K**-0.5, use_norm=False)
    _, mixed = m.core(x)
    assert max_abs(mixed, _heads(num / den)) < F64_ATOL
    assert_decodes_splits_and_maps(m, x, "rebased with learned γ, β")


def test_paper_sizes_state():
    """Based at the paper's feature width K = 16 per head: 1 + 16 + 136 = 153 features, a state of
    153·(V + 1) per head (the row sum is the extra column); ReBased: K(K+1)/2 = 136."""
    based = seqmix.build_mixer("based", d_model=64, heads=4, n=64)
    assert based.n_features == 153 and based.state_size() == 4 * 153 * (16 + 1)
    rebased = seqmix.build_mixer("rebased", d_model=64, heads=4, n=64)
    assert rebased.n_features == 136 and rebased.state_size() == 4 * 136 * (16 + 1)


def test_based_pattern_builds_the_stack():
    assert layer_pattern("based", window=8, heads=2, feature_dim=4) == [
        {"mixer": "short_conv", "mixer_kwargs": {}},
        {"mixer": "based", "mixer_kwargs": {"heads": 2, "n": 8}},
        {"mixer": "softmax_attention", "mixer_kwargs": {"window": 8, "heads": 2}},
    ]
    torch.manual_seed(0)
    lm = build_model(ModelConfig(pattern="based", pattern_kwargs={"window": 8, "heads": 2, "feature_dim": 4}, d_model=16,
                                 n_layers=3, vocab_size=50, max_seq_len=32))
    ids = torch.randint(0, 50, (2, 20))
    assert lm(ids).shape == (2, 20, 50)
    # decoding through the cache gives the prefill's logits
    full = lm(ids[:1, :12])
    assert lm.generate(ids[:1, :11], 1, temperature=0)[0, -1] == full[0, 10].argmax()


def test_feature_map_config_errors():
    with pytest.raises(ValueError, match="both be 'square' or neither"):
        seqmix.build_mixer("rebased", key_feature_map="elu1", normalizer="abs_row_sum")
    with pytest.raises(ValueError, match="taylor_basis"):
        seqmix.build_mixer("based", taylor_basis="dense")
    with pytest.raises(ValueError, match="feature_norm"):
        seqmix.build_mixer("rebased", feature_norm="rms")
