"""seqmix.analysis.attention_theory: Lemma 1, Lemma 2, the telescoping of η, the
normalization study."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix import DSF
from seqmix.analysis import (
    eta_telescoping_error, finite_state_attention_mixers, lemma1_study, lemma2_check,
    normalization_study, normalized_attention_variants,
)
from tolerances import DSF_ATOL, F64_ATOL


def example(name, **over):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{**seqmix.mixer_entry(name).example_config(), **over}).double()


def x_of(m, T=10, scale=1.0, seed=1):
    return scale * torch.randn(2, T, m.d_model, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# -- Lemma 1 -------------------------------------------------------------------------------


def test_lemma1_error_decreases_and_state_grows_combinatorially():
    m = example("softmax_attention")
    rows = lemma1_study(m, x_of(m, scale=0.5), orders=range(0, 7))
    K, V, H = m.head_qk, m.head_v, m.heads
    errs = [r["map_error"] for r in rows]
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-6 and errs[0] > 1e-3
    assert all(b["output_error"] < a["output_error"] for a, b in zip(rows, rows[1:]))
    for r in rows:
        n_P = sum(K**p for p in range(r["order"] + 1))
        assert (r["features_per_head"], r["state_size"], r["dsf_N"]) == (n_P, H * n_P * (V + 1), m.d_model * n_P)


def test_lemma1_agrees_with_the_dsf_form():
    """The study's map (features) is the map of mixer.dsf(x, taylor_order=P)."""
    m = example("softmax_attention")
    x = x_of(m, T=6, scale=0.5)
    for r in lemma1_study(m, x, orders=[1, 2, 3]):
        blocks = m.dsf(x, taylor_order=r["order"]).blocks()  # [B, T, T, d, d], Φ_P ⊗ I_V per head
        diag = torch.diagonal(blocks, dim1=-2, dim2=-1)  # [B, T, T, d]: entry of head h at channels h·V..
        phi_P = diag[..., :: m.head_v].permute(0, 3, 1, 2)  # [B, H, T, T]
        assert abs(float((phi_P - m.phi(x).detach()).abs().max()) - r["map_error"]) < 1e-12


def test_lemma1_refuses_orders_too_large_for_memory():
    m = example("softmax_attention")
    with pytest.raises(ValueError, match=r"taylor_order = 12 is too large for memory: its features need .*GiB"):
        lemma1_study(m, x_of(m), orders=[2, 12])
    with pytest.raises(ValueError, match="taylor_order"):
        lemma1_study(m, x_of(m), orders=[-1])
    with pytest.raises(ValueError, match="'mixer'"):
        lemma1_study(example("linear_attention"), x_of(m))


# -- Lemma 2 -------------------------------------------------------------------------------


def test_every_finite_state_attention_mixer_is_listed():
    names = finite_state_attention_mixers()
    for expected in ("linear_attention", "separable_attention", "generalized_linear_attention", "normalized_attention"):
        assert expected in names
    assert "softmax_attention" not in names


@pytest.mark.parametrize("name", finite_state_attention_mixers())
@pytest.mark.parametrize("extra", [0, 1, 9])
def test_lemma2_embedding_reproduces_every_attention_mixer(name, extra):
    m = example(name)
    r = lemma2_check(m, x_of(m), extra=extra, seed=extra)
    assert r["N_bar"] == r["N"] + extra
    assert r["error"] < F64_ATOL and r["error_small"] < F64_ATOL
    if extra:
        assert r["extra_state_norm"] > 1e-3  # the added states do evolve


def test_lemma2_refuses_softmax():
    m = example("softmax_attention")
    with pytest.raises(ValueError, match="finite-state"):
        lemma2_check(m, x_of(m))


# -- telescoping of η ----------------------------------------------------------------------


@pytest.mark.parametrize("name", finite_state_attention_mixers())
def test_eta_telescopes(name):
    m = example(name)
    assert eta_telescoping_error(m, x_of(m)) < DSF_ATOL


def test_eta_telescopes_for_the_taylor_dsf_of_softmax():
    m = example("softmax_attention")
    assert eta_telescoping_error(m, x_of(m, scale=0.5), taylor_order=2) < DSF_ATOL


def test_telescoping_check_catches_the_main_text_typo():
    """DSF erratum A3: (15b) as printed in the main text divides B_i by η_{i-1}; that system
    does not telescope (and does not reproduce the layer); the check must say so."""
    m = example("linear_attention")
    x = x_of(m)
    fq, fk, eta = m.separable_parts(x)
    eta_prev = torch.cat([torch.ones_like(eta[:, :1]), eta[:, :-1]], 1)
    good = m.dsf(x, projections=True)
    typo = DSF(good.lam, good.B * (eta / eta_prev).double().repeat_interleave(good.N // m.heads, -1).unsqueeze(-1), good.C)
    assert eta_telescoping_error(m, x, system=typo) > 1e-3
    assert eta_telescoping_error(m, x, system=good) < DSF_ATOL


# -- normalization study -------------------------------------------------------------------


def test_normalization_variants_share_weights_and_differ_in_eta():
    variants = normalized_attention_variants(d_model=16, n=8, heads=2)
    assert list(variants) == ["exp", "softplus", "sigmoid"]
    sd = variants["exp"].state_dict()
    for name, m in variants.items():
        assert m.config.normalizer == name
        assert all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        ys = [m(x) for m in variants.values()]
    assert float((ys[0] - ys[1]).abs().max()) > 1e-4 and float((ys[0] - ys[2]).abs().max()) > 1e-4


def test_normalization_study_rows():
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rows = normalization_study(x, n=8, heads=2)
    assert [r["normalizer"] for r in rows] == ["exp", "softplus", "sigmoid"]
    for r in rows:
        assert 0 < r["eta_min"] <= r["eta_max"]
        assert r["lambda_min"] <= r["lambda_max"]
    assert rows[2]["eta_max"] < 1  # σ(·) < 1
    # Λ_i = η_{i-1}/η_i (η_{-1} = 1) computed by hand for the exp normalizer
    m = normalized_attention_variants(["exp"], d_model=16, n=8, heads=2)["exp"].double()
    with torch.no_grad():
        z = m.W_eta(x)
    lam = torch.cat([(-z[:, :1]).exp(), (z[:, :-1] - z[:, 1:]).exp()], 1)
    assert abs(float(lam.max()) - rows[0]["lambda_max"]) < 1e-12
    assert abs(float(lam.min()) - rows[0]["lambda_min"]) < 1e-12


def test_unknown_normalizer_name():
    with pytest.raises(ValueError, match="'normalizers'"):
        normalized_attention_variants(["exp", "tanh"])
    with pytest.raises(ValueError, match="'normalizers'"):
        normalization_study(torch.randn(1, 4, 16), normalizers=[])
