"""MetaLA's theory as executable tools (seed 002 §4 and App. A2; metala note §3).

* :func:`conditions`: a preset's parameter groups among {Q, K, Λ/Λ_t} and which of the
  conditions C0-C3 of Definition 4.1 it meets: a programmatic Table 2. The ✓/✗ glyphs of
  Table 2 are lost from the seed text; every mark here is reconstructed from the
  propositions the paper proves (A2.1-A2.3) and the table's caption, and is flagged
  ``inferred``. The model lists of each row are the paper's, verbatim.
* :func:`stick_breaking_decays`: Proposition A2.2 (iv), the closed form that turns any
  softmax attention row p into decays α (with q = 1, k = 1 - α) whose map reproduces p.
* :func:`linattmap`: LinAttMap of Eq. 18 / A30 from decays (and q, k), through the same
  op as every mixer (``recurrence_map``).
* :func:`metala_channel_weights`, :func:`self_aug_diagonal`, :func:`metala_map`: the map of
  a built MetaLA mixer, per key channel (rows non-negative, summing to 1 - Πα) and with the
  self-augmentation, which adds to the diagonal only (Eq. A38).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import check_tensor, fmt_shape
from ..ops import recurrence_map

# the rows of Table 2, verbatim (metala note §3.7): parameter group -> the models it lists
TABLE2: dict[tuple[str, ...], tuple[str, ...]] = {
    ("Q", "K", "Λ"): ("RetNet", "TransNormer", "S4D", "H3", "DSS"),
    ("Q", "K", "Λ_t"): ("GLA", "Mamba"),
    ("Q", "K"): ("linear Transformer", "RFA", "Performer", "cosFormer"),
    ("K", "Λ"): ("RWKV-4",),
    ("K", "Λ_t"): ("GLRU (HGRN)",),
    ("Q", "Λ"): (),
    ("Q", "Λ_t"): ("MetaLA",),
    ("Q",): (),
    ("K",): (),
    ("Λ",): ("LRU", "S5"),
    ("Λ_t",): ("HGRN", "Griffin", "T-RNN"),
}
#: the registry names whose model Table 2 lists, with the name it uses
TABLE2_NAMES = {
    "linformer": "linear Transformer", "linear_attention": "linear Transformer", "retnet": "RetNet", "transnormer": "TransNormer",
    "gla": "GLA", "mamba_gf": "Mamba", "s6": "Mamba", "mamba": "Mamba", "s4d": "S4D", "h3": "H3", "rwkv4": "RWKV-4",
    "hgrn": "HGRN", "rg_lru": "Griffin", "lru": "LRU", "metala": "MetaLA",
}
# groups of the registry names that are not general-form presets (the other families), as Table 2 lists them
_OTHER_GROUPS = {"linear_attention": ("Q", "K"), "s6": ("Q", "K", "Λ_t"), "mamba": ("Q", "K", "Λ_t"),
                 "s4d": ("Q", "K", "Λ"), "h3": ("Q", "K", "Λ")}
# the two-or-three group sets that admit bounded exact approximation (Prop. A2.2)
_C2_GROUPS = {("Q", "K", "Λ_t"), ("Q", "K"), ("Q", "Λ_t")}


@dataclass(frozen=True)
class Mark:
    """One cell of Table 2: whether the condition is met, why, and whether the mark is inferred."""

    met: bool | None
    reason: str
    inferred: bool = True

    def glyph(self) -> str:
        s = "–" if self.met is None else ("✓" if self.met else "✗")
        return s + ("*" if self.inferred else "")


@dataclass(frozen=True)
class Conditions:
    """A row of Table 2 for one mixer config."""

    name: str
    group: tuple[str, ...]
    group_source: str  # "Table 2 (verbatim)" when the paper lists the model, else "inferred from the config"
    table2_models: tuple[str, ...]
    C0: Mark
    C1: Mark
    C2: Mark
    C3: Mark

    @property
    def label(self) -> str:
        return "{" + ", ".join(self.group) + "}" if self.group else "—"

    def row(self) -> dict:
        """The row as plain values (for tables): marks as ✓/✗/–, '*' on inferred marks."""
        return {"name": self.name, "group": self.label, "C0": self.C0.glyph(), "C1": self.C1.glyph(),
                "C2": self.C2.glyph(), "C3": self.C3.glyph(), "group_source": self.group_source,
                "table2_models": ", ".join(self.table2_models) or "–"}


def parameter_group(config) -> tuple[str, ...]:
    """The parameter groups of a general-form config among (Q, K, Λ | Λ_t) (metala note §3.2, C3).

    Q: the query is a function of x (q = 1 is no group). K: the key is its own function of x
    ('proj', 'sigmoid_proj', 'exp_proj', 'delta_proj'); a key of 1 or tied to the decay (1 - α,
    sqrt(1 - α²)) is none. Λ_t: a decay that depends on x; Λ: a decay that does not
    (a rotary phase alone, |α| = 1, is no decay).
    """
    from ..mixers.linear_attention import DYNAMIC_DECAYS, INDEPENDENT_KEYS

    g = []
    if config.query == "proj":
        g.append("Q")
    if config.key in INDEPENDENT_KEYS:
        g.append("K")
    if config.decay in DYNAMIC_DECAYS:
        g.append("Λ_t")
    elif config.decay != "none":
        g.append("Λ")
    return tuple(g)


def _marks(group: tuple[str, ...]) -> tuple[Mark, Mark, Mark, Mark]:
    c0 = Mark(True, "general form: O(n) training and O(1) state per step (App. A2.3, step 1)")
    c1 = Mark("Λ_t" in group, "needs a dynamic decay Λ_t (Prop. A2.1; Table 2 caption (i))")
    if group in _C2_GROUPS:
        c2 = Mark(True, "bounded exact solution exists: (Q,K,Λ_t), (Q,K) or (Q,Λ_t) (Prop. A2.2)")
    elif "Q" not in group:
        c2 = Mark(False, "no query: one attention distribution only (Prop. A2.2; caption (ii))")
    else:
        c2 = Mark(False, "a fixed decay Λ needs unbounded keys, k_s >= p_ts α^{-(t-s)}/C_q (Prop. A2.2 (i))")
    if not (c1.met and c2.met):
        c3 = Mark(False, "C3 asks the fewest groups among models meeting C0-C2, which this one does not (Prop. A2.3)")
    elif group == ("Q", "Λ_t"):
        c3 = Mark(True, "(Q, Λ_t) meets C0-C2 with the fewest groups (Prop. A2.3)")
    else:
        c3 = Mark(False, "K is redundant next to Λ_t (Prop. A2.3; caption (iii))")
    return c0, c1, c2, c3


def conditions(preset, **overrides) -> Conditions:
    """Table 2 for one mixer: ``preset`` is a registry name (a general-form preset, or one of the
    other families' names Table 2 lists: linear_attention, s6, mamba, s4d, h3, softmax_attention),
    a built :class:`~seqmix.mixers.linear_attention.GeneralForm` or its config; ``overrides``
    change config fields of a named preset (e.g. ``conditions("metala", key="proj")``)."""
    from ..mixers.base import mixer_entry
    from ..mixers.linear_attention import PRESETS, GeneralForm, GeneralFormConfig

    name = None
    if isinstance(preset, GeneralForm):
        name, cfg = preset.registry_name, preset.config
    elif isinstance(preset, GeneralFormConfig):
        name, cfg = "(config)", preset
    elif isinstance(preset, str):
        name = preset
        if preset == "softmax_attention":
            return Conditions(preset, (), "Table 2 (verbatim)", ("Transformer", "GPT", "Llama"),
                              Mark(False, "O(n²) training, O(n) cache per step"), Mark(True, "unbounded KV cache"),
                              Mark(True, "is the map being approximated"), Mark(None, "not applicable"))
        if preset in _OTHER_GROUPS and not overrides:
            g = _OTHER_GROUPS[preset]
            return Conditions(preset, g, "Table 2 (verbatim)", TABLE2.get(g, ()), *_marks(g))
        known = sorted(PRESETS) + ["general_form"] + sorted(_OTHER_GROUPS) + ["softmax_attention"]
        if preset not in PRESETS and preset != "general_form":
            raise ValueError(f"conditions: unknown preset {preset!r}; known: {', '.join(known)}")
        entry = mixer_entry(preset)
        cfg = entry.config(**overrides)
    else:
        raise ValueError(f"conditions: argument 'preset' must be a registry name, a GeneralForm or its config, got {type(preset).__name__}")
    if overrides and not isinstance(preset, str):
        cfg = cfg.model_copy(update=overrides)
    g = parameter_group(cfg)
    listed = TABLE2_NAMES.get(name) if not overrides else None
    source = "Table 2 (verbatim)" if listed and listed in " ".join(TABLE2.get(g, ())) else "inferred from the config"
    return Conditions(name, g, source, TABLE2.get(g, ()), *_marks(g))


def table2(names=None) -> list[Conditions]:
    """:func:`conditions` for every general-form preset (or ``names``)."""
    from ..mixers.linear_attention import PRESETS

    return [conditions(n) for n in (names or ["general_form", *PRESETS])]


# ------------------------------------------------------------------------------------------
# Proposition A2.2: the stick-breaking solution and the map
# ------------------------------------------------------------------------------------------


def stick_breaking_decays(p: torch.Tensor, *, atol: float = 1e-9) -> torch.Tensor:
    """Proposition A2.2 (iv), Eqs. A16-A21: decays α with q = 1, k = 1 - α reproducing a
    softmax row exactly.

    p [..., t] (non-negative, summing to 1 over the last dimension: row t of an attention map,
    over s = 1..t). With S_k = Σ_{s<=k} p_s (partial sums, not the state), the solution is
    α_s = S_{s-1} / S_s, in [0, 1]; α_1 = S_0/S_1 = 0. Where S_s = 0 (leading zeros of the
    row) the ratio is 0/0 and any α_s works (metala note §8.19): 0 is returned. Then
    (Π_{j=s+1..t} α_j)(1 - α_s) = p_s for every s (Eq. A30 with q = 1, d_k = 1).
    Returns α [..., t] in float64.
    """
    check_tensor("p", p, layout="[..., t]", where="stick_breaking_decays")
    p = p.detach().to(torch.float64)
    if p.dim() == 0 or p.shape[-1] < 1:
        raise ValueError(f"stick_breaking_decays: argument 'p' must be [..., t] with t >= 1, got {fmt_shape(p.shape)}")
    if bool((p < -atol).any()):
        raise ValueError("stick_breaking_decays: argument 'p' (an attention row) must be non-negative")
    sums = p.sum(-1)
    if float((sums - 1).abs().max()) > atol:
        raise ValueError(f"stick_breaking_decays: argument 'p' must sum to 1 over its last dimension; sums deviate by up to {float((sums - 1).abs().max()):.3g}")
    S = p.clamp(min=0).cumsum(-1)
    S_prev = torch.cat([torch.zeros_like(S[..., :1]), S[..., :-1]], -1)
    alpha = torch.where(S > 0, S_prev / torch.where(S > 0, S, torch.ones_like(S)), torch.zeros_like(S))
    return alpha.clamp(0, 1)


def _as4(x: torch.Tensor) -> torch.Tensor:
    return {1: lambda t: t.view(1, -1, 1, 1), 2: lambda t: t.unsqueeze(0).unsqueeze(2), 4: lambda t: t}[x.dim()](x)


def linattmap(alpha: torch.Tensor, q: torch.Tensor | None = None, k: torch.Tensor | None = None, *, scale: float = 1.0) -> torch.Tensor:
    """LinAttMap (MetaLA Eq. 18; Eq. A30 with the default k = 1 - α):
    M[t, s] = scale · q_t · ((Π_{j=s+1..t} α_j) ⊙ k_s) for s <= t, 0 above the diagonal.

    alpha: [T] (d_k = 1), [T, K] or [B, T, H, K], entries in [0, 1] (zeros allowed: they
    cut the past); q, k: the same shape (default q = 1, k = 1 - α). Returns [T, T] for
    1-d and 2-d inputs, [B, H, T, T] for 4-d ones. Computed by ``recurrence_map``.
    """
    where = "linattmap"
    check_tensor("alpha", alpha, rank=(1, 2, 4), layout="[T], [T, K] or [B, T, H, K]", where=where)
    if bool(((alpha < 0) | (alpha > 1)).any()):
        raise ValueError(f"{where}: argument 'alpha' (decays) must lie in [0, 1]")
    for name, t in (("q", q), ("k", k)):
        if t is not None and t.shape != alpha.shape:
            raise ValueError(f"{where}: argument '{name}' must have the shape of alpha {fmt_shape(alpha.shape)}, got {fmt_shape(t.shape)}")
    a = _as4(alpha.to(torch.float64))
    qq = _as4(q.to(torch.float64)) if q is not None else torch.ones_like(a)
    kk = _as4(k.to(torch.float64)) if k is not None else 1 - a
    # a zero decay is log 0 = -inf; -1e4 gives exp(-1e4) = 0 exactly in float64 and keeps the tiling finite
    gk = torch.log(a).clamp(min=-1e4)
    M = recurrence_map(qq, kk, gk, scale=scale, check_values=False)
    return M[0, 0] if alpha.dim() < 4 else M


def fixed_decay_keys(p: torch.Tensor, alpha: float, q: float = 1.0) -> torch.Tensor:
    """Prop. A2.2 (i), Eq. A8: with a fixed decay α the keys that reproduce a row p must be
    k_s = p_s / (q α^{t-s}): they grow like α^{-(t-s)}, unbounded in t (the reason a fixed
    decay fails C2). p [t] -> k [t] (float64)."""
    if not 0 < alpha < 1:
        raise ValueError(f"fixed_decay_keys: argument 'alpha' must lie in (0, 1), got {alpha}")
    p = p.detach().to(torch.float64)
    t = p.shape[-1]
    lag = torch.arange(t - 1, -1, -1, dtype=torch.float64)
    return p / (q * alpha**lag)


# ------------------------------------------------------------------------------------------
# the map of a built MetaLA mixer
# ------------------------------------------------------------------------------------------


def _metala_parts(mixer, x):
    from ..mixers.linear_attention import GeneralForm

    if not isinstance(mixer, GeneralForm) or mixer.config.key != "one_minus_decay" or mixer.config.decay in ("none", "lru"):
        raise ValueError("argument 'mixer' must be a general-form mixer with the key tied to the decay (k = 1 - α), e.g. build_mixer('metala')")
    mixer.check_input(x)
    P = mixer._params(x, None, False)
    B, T, H, K = P.q.shape
    la = P.gk if P.gk.dim() == 4 else P.gk.unsqueeze(-1).expand(B, T, H, K)
    return P, la


def metala_channel_weights(mixer, x: torch.Tensor) -> torch.Tensor:
    """Per key channel i, the weights w[t, s, i] = (Π_{j=s+1..t} α_{j,i})(1 - α_{s,i}) of the
    mixer's map on x (metala note §3.6): [B, H, K, T, T]. Each row is non-negative and sums to
    1 - Π_{j<=t} α_{j,i}; the map is Σ_i scale·q_{t,i} w[t, s, i] (Eq. A30)."""
    P, la = _metala_parts(mixer, x)
    B, T, H, K = P.q.shape
    alpha = la.exp().detach().to(torch.float64).reshape(B, T, H * K, 1)
    return linattmap(alpha).reshape(B, H, K, T, T)


def self_aug_diagonal(mixer, x: torch.Tensor) -> torch.Tensor:
    """s_t = Σ_i q_{t,i} w_aug,i (1 - α_{t,i}) per head, [B, H, T]: the self-augmentation's
    weight of token t on itself (Eq. A35, unscaled q as in the official code)."""
    P, _ = _metala_parts(mixer, x)
    if not mixer.config.self_aug:
        raise ValueError("self_aug_diagonal: argument 'mixer' has self_aug = False")
    s = (P.q * mixer.w_aug.view(mixer.H, mixer.K) * P.k).sum(-1)
    return s.transpose(1, 2)


def metala_map(mixer, x: torch.Tensor, *, self_aug: bool = True) -> torch.Tensor:
    """MetaLA's map [B, H, T, T]: LinAttMap (Eq. A30) plus, with the linear self-augmentation
    (aug_activation='none', Eq. A38), diag(s_t). Self-augmentation adds to the diagonal only: the
    state, and with it every later token's attention to token t, is unchanged (§A3.2). With
    the sigmoid σ_aug (Eq. A35, the code) the term is not linear in v and has no map:
    ``self_aug=True`` then raises."""
    _metala_parts(mixer, x)
    M = mixer.phi(x)
    if self_aug and mixer.config.self_aug:
        if mixer.config.aug_activation != "none":
            raise ValueError("metala_map: with aug_activation = 'sigmoid' the self-augmentation is not linear in v; "
                             "use aug_activation='none' (Eq. A38) or self_aug=False")
        M = M + torch.diag_embed(self_aug_diagonal(mixer, x))
    return M
