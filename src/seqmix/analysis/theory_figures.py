"""The theory figures of `seqmix show --theory` (docs/show.md), each a function returning
(figure, data): the data are the numbers the figure plots, computed by the analysis tools.

    lemma1_figure()          DSF paper Lemma 1: softmax attention as the limit of degree-P
                             Taylor-feature separable attention; map and output error vs P,
                             with the state size each P needs (dsf note §3.5)
    equivalence_figure()     S6 <-> generalized linear attention (dsf note §4.3): the maps are equal
                             when the exact condition holds (A = a·I, Δ_i = 1/η_i shared,
                             η_i e^{-a/η_i} = η_{i-1}) and differ when it is broken
    stick_breaking_figure()  MetaLA Prop. A2.2 (iv) (metala note §3.4): decays α from a softmax row
                             by stick breaking reproduce it exactly with q = 1, k = 1 - α, while a
                             fixed decay needs keys growing like α^{-(t-s)}

Figures are ``matplotlib.figure.Figure`` objects drawn by the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from ..mixers import build_mixer, mixer_entry
from .attention_theory import lemma1_study
from .metala import fixed_decay_keys, linattmap, stick_breaking_decays
from .ssm_theory import equivalence_condition, equivalence_normalizer, linear_attention_dsf, s6_dsf

__all__ = ["lemma1_figure", "equivalence_figure", "stick_breaking_figure", "THEORY_FIGURES"]


def _softmax(seed: int, **over):
    torch.manual_seed(seed)
    return build_mixer("softmax_attention", **{**mixer_entry("softmax_attention").example_config(), **over}).double()


def lemma1_figure(*, T: int = 16, orders=range(0, 8), input_scale: float = 0.5, seed: int = 0, dpi: int = 100):
    """Lemma 1 measured by :func:`~seqmix.analysis.lemma1_study` on a small float64 softmax attention
    (the example config: d_model 16, 2 heads, K = 4 per head) and an input of moderate norm
    (``input_scale``·N(0, 1): the Taylor remainder shrinks once P exceeds the scores' size).
    Returns (figure, rows of lemma1_study)."""
    m = _softmax(seed)
    x = input_scale * torch.randn(1, T, m.d_model, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    rows = lemma1_study(m, x, orders)
    P = [r["order"] for r in rows]
    fig = Figure(figsize=(6.4, 4.0), dpi=dpi, layout="constrained")
    ax = fig.add_subplot()
    floor = 1e-17  # an exact 0 would vanish from a log axis
    ax.semilogy(P, [max(r["map_error"], floor) for r in rows], "o-", label="map error max|Φ_P − Φ_softmax|")
    ax.semilogy(P, [max(r["output_error"], floor) for r in rows], "s--", label="output error max|Φ_P v − Φ v|")
    ax.set_xlabel("Taylor order P")
    ax.set_ylabel("error")
    ax2 = ax.twinx()
    ax2.semilogy(P, [r["state_size"] for r in rows], "^:", color="gray", label="state size (floats)")
    ax2.set_ylabel("state size per sequence (floats)", color="gray")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="center left")
    ax.set_title(f"Lemma 1: softmax attention = lim P→∞ of Taylor-feature attention (T = {T}, K = {m.head_qk})", fontsize=9)
    return fig, rows


def equivalence_figure(*, T: int = 16, d: int = 3, n: int = 4, a: float = 0.8, eta0: float = 2.0, seed: int = 0, dpi: int = 100):
    """S6 vs generalized linear attention with q_i = c_i, k_i = b_i, W_V = I (dsf note §4.3),
    built by :func:`~seqmix.analysis.s6_dsf` and :func:`~seqmix.analysis.linear_attention_dsf`.

    Row "met": A = a·I, η from :func:`~seqmix.analysis.equivalence_normalizer`, Δ_i = 1/η_i on every
    channel. Row "broken": the same but a different A on one state (A[:, 1] = 1.75·a), which
    breaks "A = a·I". Panels: channel 0 of Φ_S6, of Φ_attention, and |Φ_S6 − Φ_attention| over
    every channel. Returns (figure, {case: dict(condition, map_difference)})."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(1, T, n, generator=g, dtype=torch.float64)
    c = torch.randn(1, T, n, generator=g, dtype=torch.float64)
    eta = equivalence_normalizer(a, torch.tensor([eta0], dtype=torch.float64), T)  # [1, T]
    delta = (1 / eta).unsqueeze(-1).expand(1, T, d).clone()
    cases = {}
    for case in ("met", "broken"):
        A = torch.full((d, n), a, dtype=torch.float64)
        if case == "broken":
            A[:, 1] = 1.75 * a
        s6, att = s6_dsf(b, c, delta, A), linear_attention_dsf(c, b, eta, d)
        Ps, Pa = s6.blocks()[0], att.blocks()[0]  # [T, T, d, d]
        diff = (Ps - Pa).abs().amax((-1, -2))
        cases[case] = dict(condition=equivalence_condition(A, delta, eta), map_difference=float(diff.max()),
                           phi_s6=Ps[..., 0, 0], phi_attention=Pa[..., 0, 0], difference=diff)
    fig = Figure(figsize=(9.6, 6.0), dpi=dpi, layout="constrained")
    axes = fig.subplots(2, 3)
    for row, case in enumerate(("met", "broken")):
        r = cases[case]
        cond = r["condition"]
        vmax = float(max(r["phi_s6"].abs().max(), r["phi_attention"].abs().max()))
        for col, (key, title) in enumerate((("phi_s6", "Φ S6 (channel 0)"), ("phi_attention", "Φ attention (channel 0)"))):
            im = axes[row, col].imshow(r[key].numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
            axes[row, col].set_title(f"{case}: {title}", fontsize=9)
        fig.colorbar(im, ax=axes[row, :2], shrink=0.8)
        # log scale: rounding-level differences (met) and O(1) ones (broken) on one axis; 0 is left blank
        imd = axes[row, 2].imshow(r["difference"].numpy(), cmap="magma", norm=LogNorm(vmin=1e-17, vmax=max(vmax, 1e-16)))
        fig.colorbar(imd, ax=axes[row, 2], shrink=0.8)
        flags = ", ".join(f"{k}={'✓' if cond[k] else '✗'}" for k in ("scalar_A", "shared_delta", "normalizer_recursion"))
        axes[row, 2].set_title(f"|Φ_S6 − Φ_att| max {r['map_difference']:.1e}\n{flags}", fontsize=8)
    fig.suptitle(f"S6 ⇔ linear attention (dsf note §4.3): condition met vs broken (a = {a}, T = {T}, d = {d}, n = {n})", fontsize=10)
    return fig, {k: {"condition": v["condition"], "map_difference": v["map_difference"]} for k, v in cases.items()}


def stick_breaking_figure(*, T: int = 24, fixed_alpha: float = 0.8, seed: int = 0, dpi: int = 100):
    """MetaLA's Proposition A2.2 (iv) on the last row p of a softmax attention map (a float64
    example softmax attention on a random input): α = :func:`~seqmix.analysis.stick_breaking_decays`(p),
    the fitted row = LinAttMap(α) with q = 1, k = 1 - α (:func:`~seqmix.analysis.linattmap`), and
    the keys a fixed decay ``fixed_alpha`` would need (:func:`~seqmix.analysis.fixed_decay_keys`).
    Returns (figure, dict(p, alpha, fit, fit_error, fixed_keys))."""
    m = _softmax(seed)
    x = torch.randn(1, T, m.d_model, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    with torch.no_grad():
        p = m.phi(x)[0, 0, T - 1]  # row t = T-1 over s = 0..T-1, sums to 1
    alpha = stick_breaking_decays(p)
    fit = linattmap(alpha)[T - 1]
    keys = fixed_decay_keys(p, fixed_alpha)
    err = float((fit - p).abs().max())
    s = list(range(T))
    fig = Figure(figsize=(10.5, 3.4), dpi=dpi, layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    ax1.bar(s, p.numpy(), color="lightsteelblue", label="softmax row p_t,s")
    ax1.plot(s, fit.numpy(), "k.", label="stick-breaking LinAttMap")
    ax1.set_xlabel("s")
    ax1.legend(fontsize=7)
    ax1.set_title(f"row t = {T - 1}: max |fit − p| = {err:.1e}", fontsize=9)
    ax2.plot(s, alpha.numpy(), "o-", ms=3)
    ax2.set_ylim(-0.05, 1.05)
    ax2.set_xlabel("s")
    ax2.set_title("decays α_s = S_{s-1}/S_s (in [0, 1])", fontsize=9)
    ax3.semilogy(s, keys.numpy(), "r^-", ms=3, label=f"fixed α = {fixed_alpha}: k_s = p_s α^-(t-s)")
    ax3.semilogy(s, (1 - alpha).clamp_min(1e-17).numpy(), "o-", ms=3, label="stick breaking: k_s = 1 − α_s")
    ax3.set_xlabel("s")
    ax3.legend(fontsize=7)
    ax3.set_title("keys: bounded with Λ_t, growing with a fixed Λ", fontsize=9)
    fig.suptitle("MetaLA Prop. A2.2 (iv): (Q, Λ_t) fits a softmax row exactly", fontsize=10)
    return fig, dict(p=p, alpha=alpha, fit=fit, fit_error=err, fixed_keys=keys)


#: the CLI presets: name -> function
THEORY_FIGURES = {
    "lemma1": lemma1_figure,
    "equivalence": equivalence_figure,
    "stick_breaking": stick_breaking_figure,
}
