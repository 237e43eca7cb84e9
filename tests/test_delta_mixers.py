"""The delta-rule mixers beyond the registry-wide contract: their spectra, the β ∈ [0, 2]
option, and what `seqmix show` draws for a non-diagonal Λ_i."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.analysis import show
from tolerances import assert_modes_agree_f64, max_abs


def build(name, **kw):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{"d_model": 16, "heads": 2, "chunk_size": 8, **kw}).double().eval()


def x_(T=13, d=16, seed=1):
    return torch.randn(2, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_gated_deltanet_spectrum_is_alpha_and_alpha_one_minus_beta():
    m = build("gated_deltanet")
    x = x_()
    P = m._params(x, None, False)
    ev = m.spectrum(x).reshape(2, 13, m.H, m.V, m.K)  # [B, T, H, V, K]
    alpha, beta = P.g.exp(), P.beta  # [B, T, H]
    assert float(ev.imag.abs().max()) < 1e-12
    got = ev.real.sort(-1).values
    expected = torch.stack([alpha * (1 - beta)] + [alpha] * (m.K - 1), -1).sort(-1).values  # keys are unit vectors
    assert max_abs(got, expected.unsqueeze(3).expand_as(got)) < 1e-12
    # the diagonal part (decays) is α on every key channel
    assert max_abs(m.decays(x).reshape(2, 13, m.H, m.V, m.K), alpha[..., None, None].expand(2, 13, m.H, m.V, m.K)) == 0


def test_negative_eigenvalues_option():
    m = build("deltanet", negative_eigenvalues=True)
    x = x_(T=19)
    beta = m._params(x, None, False).beta.detach()
    assert float(beta.max()) > 1  # β = 2σ reaches past 1 ...
    assert float(m.spectrum(x).real.min()) < 0  # ... so an eigenvalue 1 − β is negative
    assert_modes_agree_f64(m, x, "deltanet, negative eigenvalues")


def test_kda_gate_is_keywise():
    m = build("kda")
    g = m._params(x_(), None, False).g.detach()
    assert g.shape == (2, 13, m.H, m.K) and float(g.max()) <= 0
    assert float((g - g[..., :1]).abs().max()) > 0  # not one value per head


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="expand_k"):
        seqmix.build_mixer("deltanet", d_model=16, heads=3)
    with pytest.raises(ValueError, match="decay"):
        seqmix.build_mixer("deltanet", decay="rwkv7")


def test_show_draws_the_eigenvalues_of_the_transition():
    inp = show.make_input("mqar", 24, seed=3)
    m = build("gated_deltanet").float()
    views = show.inspect_mixers([m], inp, seed=3)
    v = views[-1] if views[-1].name == "gated_deltanet" else views[0]
    assert not v.diagonal
    fig = show.show_figure(views)
    im = next(a for ax in fig.axes for a in ax.get_images() if a.get_gid() == f"decays:{v.label}")
    with torch.no_grad():
        mag = m.spectrum(show.embed(inp, m.d_model, seed=3))[0].abs().double()  # [T, N]
    arr = torch.from_numpy(im.get_array().data)
    for row in arr:  # every plotted row is a column of |eig Λ_i|
        assert float((mag - row.unsqueeze(1)).abs().amax(0).min()) < 1e-6
    assert any("non-diagonal" in ax.get_title() for ax in fig.axes)


def test_delta_models_are_extras_of_the_mqar_presets():
    from seqmix.experiments import get_preset

    for name in ("dsf-fig2", "metala-table-a7"):
        p = get_preset(name)
        default = [m.label for m in p.select(None, "tiny")]
        assert "DeltaNet" not in default and "Gated DeltaNet" not in default  # the paper's set is unchanged
        runs = p.runs("tiny", ["DeltaNet", "Gated DeltaNet"])
        assert {r.label for r in runs} == {"DeltaNet", "Gated DeltaNet"}
        assert {r.model.mixer for r in runs} == {"deltanet", "gated_deltanet"}
        assert {"deltanet", "gated_deltanet"} <= set(p.mixers())
