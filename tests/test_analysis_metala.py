"""seqmix.analysis.metala: Table 2 (conditions), the stick-breaking solver of Prop. A2.2, and
the properties of MetaLA's map."""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.analysis import (
    TABLE2, conditions, fixed_decay_keys, linattmap, metala_channel_weights, metala_map, self_aug_diagonal,
    stick_breaking_decays, table2,
)
from seqmix.mixers.base import Cache
from seqmix.mixers.linear_attention import PRESETS
from tolerances import F64_ATOL, max_abs

DSF_EXACT = 1e-12


def randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------------------------------
# Table 2
# ------------------------------------------------------------------------------------------


def test_every_preset_has_its_documented_group():
    """The group computed from each preset's config is the one its registration documents."""
    for name, info in PRESETS.items():
        assert conditions(name).label == info["group"], name


def test_presets_listed_in_table2_fall_in_their_row():
    """For the models Table 2 lists, the group inferred from the config is the paper's row."""
    expected = {"linformer": "linear Transformer", "retnet": "RetNet", "transnormer": "TransNormer", "gla": "GLA",
                "mamba_gf": "Mamba", "rwkv4": "RWKV-4", "hgrn": "HGRN", "rg_lru": "Griffin", "lru": "LRU", "metala": "MetaLA"}
    for name, model in expected.items():
        c = conditions(name)
        assert model in c.table2_models, (name, c.label, c.table2_models)
        assert c.group_source == "Table 2 (verbatim)"
    # GLRU, HGRN's unit with an independent input gate, is the row {K, Λ_t}
    assert conditions("hgrn", key="sigmoid_proj").label == "{K, Λ_t}"
    assert "GLRU (HGRN)" in conditions("hgrn", key="sigmoid_proj").table2_models
    assert conditions("qlstm").group_source == "inferred from the config"


def test_only_q_and_dynamic_decay_meets_all_four():
    rows = {c.name: c for c in table2()}
    full = [n for n, c in rows.items() if c.C0.met and c.C1.met and c.C2.met and c.C3.met]
    # among Table 2's models only MetaLA; HGRN2 (2024, after the table: q, the tied key 1 - f_t, a dynamic f_t) has its group {Q, Λ_t}
    assert sorted(full) == ["hgrn2", "metala"]
    # the caption's three statements
    for c in rows.values():
        assert c.C1.met == ("Λ_t" in c.group)  # (i) no Λ_t, no C1
        if "Q" not in c.group:
            assert not c.C2.met  # (ii) LinRNNs lack Q
        if "K" in c.group:
            assert not c.C3.met  # (iii) K is redundant
        assert all(m.inferred for m in (c.C0, c.C1, c.C2, c.C3))  # the glyphs are lost: every mark is reconstructed
    # MetaLA's "w/ key" ablation moves it to GLA's row, which fails C3 only
    wk = conditions("metala", key="proj")
    assert wk.label == "{Q, K, Λ_t}" and wk.C2.met and not wk.C3.met


def test_every_group_of_table2_is_reachable_and_conditions_rejects_unknown_names():
    seen = {c.group for c in table2()} | {conditions("metala", decay="fixed").group, conditions("general_form", key="one", decay="none").group}
    assert {("Q", "K", "Λ"), ("Q", "K", "Λ_t"), ("Q", "K"), ("K", "Λ"), ("K", "Λ_t"), ("Q", "Λ_t"), ("Λ",), ("Λ_t",)} <= seen
    assert set(seen) <= set(TABLE2)
    assert conditions("softmax_attention").C0.met is False
    with pytest.raises(ValueError, match="metala"):
        conditions("meta_la")
    with pytest.raises(ValueError, match="preset"):
        conditions(3)


# ------------------------------------------------------------------------------------------
# Proposition A2.2: stick breaking
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 7, 33])
def test_stick_breaking_reproduces_random_softmax_rows(t):
    g = torch.Generator().manual_seed(t)
    scores = 3 * torch.randn(20, t, generator=g, dtype=torch.float64)
    p = torch.softmax(scores, -1)  # 20 random rows of length t
    alpha = stick_breaking_decays(p)
    assert bool(((alpha >= 0) & (alpha <= 1)).all())  # bounded (C2)
    assert float(alpha[:, 0].abs().max()) == 0.0  # α_1 = S_0/S_1 = 0
    for row, a in zip(p, alpha):
        M = linattmap(a)  # [t, t] through recurrence_map, q = 1, k = 1 - α
        assert max_abs(M[-1], row) < DSF_EXACT  # the last row is p exactly
    # the closed form equals the written-out product (Eq. A30) too
    a = alpha[0]
    w = torch.stack([torch.prod(a[s + 1 :]) * (1 - a[s]) for s in range(t)])
    assert max_abs(w, p[0]) < DSF_EXACT


def test_stick_breaking_with_leading_zeros_and_bad_rows():
    p = torch.tensor([0.0, 0.0, 0.25, 0.0, 0.75], dtype=torch.float64)
    alpha = stick_breaking_decays(p)
    assert max_abs(linattmap(alpha)[-1], p) < DSF_EXACT
    alpha2 = alpha.clone()
    alpha2[:2] = torch.tensor([0.3, 0.9])  # where S_s = 0 any α_s works
    assert max_abs(linattmap(alpha2)[-1], p) < DSF_EXACT
    with pytest.raises(ValueError, match="'p'"):
        stick_breaking_decays(torch.tensor([0.5, 0.6]))
    with pytest.raises(ValueError, match="'p'"):
        stick_breaking_decays(torch.tensor([-0.5, 1.5]))


def test_fixed_decay_needs_growing_keys():
    """Prop. A2.2 (i): a uniform row under a fixed decay α needs k_s ∝ α^{-(t-s)}: reproduces the row, unbounded."""
    t, alpha = 40, 0.8
    p = torch.full((t,), 1.0 / t, dtype=torch.float64)
    k = fixed_decay_keys(p, alpha)
    M = linattmap(torch.full((t,), alpha, dtype=torch.float64), k=k)
    assert max_abs(M[-1], p) < DSF_EXACT
    assert float(k[0] / k[-1]) == pytest.approx(alpha ** (-(t - 1)))


# ------------------------------------------------------------------------------------------
# properties of MetaLA's map
# ------------------------------------------------------------------------------------------


def _metala(**kw):
    torch.manual_seed(0)
    m = seqmix.build_mixer("metala", d_model=16, heads=2, chunk_size=8, **kw).double()
    with torch.no_grad():
        m.w_aug.copy_(randn(m.w_aug.shape[0], seed=4)) if m.config.self_aug else None
        m.W_a.weight.mul_(8)  # decays spread over (0, 1), not all near 1
    return m


def test_metala_rows_are_nonnegative_and_sum_to_one_minus_prod_alpha():
    m = _metala()
    x = randn(2, 21, 16)
    w = metala_channel_weights(m, x)  # [B, H, K, T, T]
    assert float(w.min()) >= 0
    P = m._params(x, None, False)
    alpha = P.gk.exp().permute(0, 2, 3, 1)  # [B, H, K, T]
    assert max_abs(w.sum(-1), 1 - torch.cumprod(alpha, -1)) < DSF_EXACT
    # the map is the q-weighted mixture of the channel weights, times d_k'^{-1/2}
    mix = torch.einsum("bthk,bhkts->bhts", P.q, w) * m.K**-0.5
    assert max_abs(mix, m.phi(x)) < DSF_EXACT


def test_self_augmentation_changes_only_the_diagonal():
    """Eq. A38 (linear σ_aug): the map gains diag(s_t) and nothing else, the output is that map
    applied to v, and the state (what later tokens see) is the one without self-augmentation."""
    bare = dict(conv_size=None, xnorm="none", gate="none", out_proj=False, aug_activation="none")
    m = _metala(**bare)
    x = randn(2, 21, 16)
    M = metala_map(m, x)
    M0 = metala_map(m, x, self_aug=False)
    off = ~torch.eye(21, dtype=torch.bool)
    assert float((M - M0).detach()[..., off].abs().max()) == 0.0
    assert max_abs(torch.diagonal(M - M0, dim1=-2, dim2=-1), self_aug_diagonal(m, x)) < DSF_EXACT
    assert float(self_aug_diagonal(m, x).detach().abs().min()) > 0  # the test sees a nonzero augmentation
    values, _ = m.core(x)
    for mode in m.modes:
        m.mode = mode
        y = m(x).view(2, 21, 2, 8)
        assert max_abs(y, torch.einsum("bhts,bshv->bthv", M, values)) < F64_ATOL
    # the state with and without self-augmentation (sigmoid or linear) is the same
    for act in ("none", "sigmoid"):
        m_aug = _metala(aug_activation=act)
        m_no = _metala(self_aug=False)
        m_no.load_state_dict({k: v for k, v in m_aug.state_dict().items() if k != "w_aug"})
        c1, c2 = Cache(), Cache()
        y1, y2 = m_aug(x, cache=c1), m_no(x, cache=c2)
        assert max_abs(c1.get(m_aug)["S"], c2.get(m_no)["S"]) == 0.0
        assert max_abs(y1, y2) > 1e-3  # while the outputs differ
    with pytest.raises(ValueError, match="sigmoid"):
        metala_map(_metala(), x)
    with pytest.raises(ValueError, match="mixer"):
        metala_channel_weights(seqmix.build_mixer("gla", d_model=16), x.float())


def test_cli_table2(capsys):
    from seqmix.cli import main

    assert main(["table2", "metala", "rwkv4"]) == 0
    out = capsys.readouterr().out
    assert "{Q, Λ_t}" in out and "{K, Λ}" in out
    assert main(["table2", "no_such_preset"]) == 2
    assert "known" in capsys.readouterr().err
