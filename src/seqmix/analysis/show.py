"""`seqmix show`: the maps Φ, the decay spectra |Λ_i| and the DSF facts of several mixers on one
input, side by side, as a PNG or a self-contained HTML report (docs/show.md).

    inp = make_input("mqar", seq_len=256)                   # random tokens, an MQAR example or a text
    views = inspect_mixers([build_mixer("s6"), build_mixer("gla")], inp)
    fig = show_figure(views)                                # one column per mixer (Agg, no display)
    fig.savefig("maps.png")                                 # pixel size: figure_size_px(len(views), dpi)
    write_html("report.html", views, theory={"lemma1": lemma1_figure()})

Everything goes through the Mixer contract only: ``phi(x)`` for the maps, ``spectrum(x)`` (the
diagonal of Λ_i, ``dsf(x).lam`` by default; the eigenvalues of a non-diagonal Λ_i, e.g. the
delta rule's α(I − βkᵀk)) for the spectrum, ``state_size``, ``family``,
``map_unit`` and ``finite_state`` for the facts, and ``seqmix.analysis.conditions`` for the
parameter groups and MetaLA's conditions where they are defined.

The input: token ids embedded by a fixed random table (N(0, 1) entries, seeded), the same
tokens for every mixer; the reference map P is the map of a softmax attention built with the
same seed and width on the same input (mean over its heads), or the map of one of the shown
mixers (``reference=label``).
"""

from __future__ import annotations

import base64
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from matplotlib.colors import LogNorm, Normalize, SymLogNorm
from matplotlib.figure import Figure

from .._checks import check_choice, check_positive_int
from ..mixers import Mixer, build_mixer, mixer_entry
from ..mixers.layers import group_rows, grouped_rows
from .mapstats import (
    DEFAULT_MAX_MAP_BYTES, band_mass, check_seq_len, decay_summary, effective_rank, lag_quantile, map_distance,
)

__all__ = [
    "INPUT_KINDS", "ShowInput", "make_input", "mqar_tokens", "text_tokens", "embed",
    "CHECKPOINT_FORMAT", "save_mixer_checkpoint", "load_mixer_checkpoint", "build_for_show",
    "check_mixer_name", "parse_overrides", "assign_checkpoints", "mixers_for_show",
    "MixerView", "inspect_mixer", "inspect_mixers", "softmax_reference",
    "show_figure", "overview_figure", "figure_size_px", "figure_png", "html_report", "write_html",
    "COLUMN_INCHES", "OVERVIEW_INCHES",
]

INPUT_KINDS = ("random", "mqar", "text")
#: one mixer's column in the PNG: (width, height) in inches; pixels = inches · dpi
COLUMN_INCHES = (4.0, 10.0)
#: effective rank is averaged over at most this many maps (evenly spaced): an SVD per map
RANK_MAPS = 16
#: rows of the decay-spectrum image (distinct trajectories, evenly spaced by memory length)
SPECTRUM_ROWS = 128
#: one mixer's column in :func:`overview_figure`: (width, height) in inches
OVERVIEW_INCHES = (1.5, 2.55)


# ------------------------------------------------------------------------------------------
# inputs
# ------------------------------------------------------------------------------------------


@dataclass
class ShowInput:
    """Token ids [T] of one sequence, with what they are."""

    kind: str
    tokens: torch.Tensor
    vocab: int
    description: str

    @property
    def T(self) -> int:
        return int(self.tokens.shape[0])


def mqar_tokens(seq_len: int, *, vocab: int = 8192, num_kv_pairs: int | None = None, seed: int = 0) -> torch.Tensor:
    """One MQAR example of the harness's generator (:func:`seqmix.data.mqar.multiquery_ar`, Zoology's
    layout and power-law query gaps): ``num_kv_pairs`` key-value pairs k_1 v_1 … k_N v_N (keys
    from [1, V/2), values from [V/2, V), distinct), then a query region of filler 0s in which
    every key appears once. [seq_len] int64; default N = min(64, seq_len // 4)."""
    from ..data.mqar import MQARConfig

    check_positive_int("seq_len", seq_len, "mqar_tokens", minimum=4)
    n = num_kv_pairs if num_kv_pairs is not None else max(1, min(64, seq_len // 4))
    try:
        cfg = MQARConfig(seq_len=seq_len, num_kv_pairs=n, vocab_size=vocab, num_examples=1)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        reason = "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors()) if hasattr(e, "errors") else str(e)
        raise ValueError(f"mqar_tokens: arguments 'seq_len' = {seq_len}, 'num_kv_pairs' = {n}, 'vocab' = {vocab} "
                         f"do not make an MQAR example: {reason}") from None
    return torch.from_numpy(cfg.generate(np.random.default_rng(seed)).inputs[0])


def text_tokens(text: str, seq_len: int | None = None) -> torch.Tensor:
    """The UTF-8 bytes of ``text`` as token ids (vocabulary 256), cut to ``seq_len``."""
    if not isinstance(text, str) or not text:
        raise ValueError("argument 'text' must be a non-empty string")
    ids = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    return ids[:seq_len] if seq_len else ids


def make_input(kind: str = "random", seq_len: int = 256, *, text: str | None = None, vocab: int | None = None, seed: int = 0) -> ShowInput:
    """The input of `seqmix show`: ``kind`` = "random" (uniform tokens), "mqar" (:func:`mqar_tokens`)
    or "text" (the bytes of ``text``, T = min(len, seq_len))."""
    check_choice("input", kind, INPUT_KINDS, "make_input")
    check_positive_int("seq_len", seq_len, "make_input")
    if kind == "text":
        toks = text_tokens(text, seq_len)
        return ShowInput("text", toks, 256, f"text, {toks.shape[0]} UTF-8 bytes: {text[:60]!r}{'…' if len(text) > 60 else ''}")
    if text is not None:
        raise ValueError(f"argument 'text' is only used with input 'text', not {kind!r}")
    if kind == "mqar":
        V = vocab or 8192
        n = max(1, min(64, seq_len // 4))
        toks = mqar_tokens(seq_len, vocab=V, num_kv_pairs=n, seed=seed)
        return ShowInput("mqar", toks, V, f"MQAR example, T = {seq_len}, {n} key-value pairs, vocab {V}, seed {seed}")
    V = vocab or 256
    toks = torch.randint(0, V, (seq_len,), generator=torch.Generator().manual_seed(seed))
    return ShowInput("random", toks, V, f"random tokens, T = {seq_len}, vocab {V}, seed {seed}")


def embed(inp: ShowInput, d_model: int, *, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """x [1, T, d_model]: the tokens looked up in a random N(0, 1) table [vocab, d_model] seeded by ``seed``."""
    table = torch.randn(inp.vocab, d_model, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)
    return table[inp.tokens].unsqueeze(0).to(dtype)


# ------------------------------------------------------------------------------------------
# mixers: random init or a checkpoint
# ------------------------------------------------------------------------------------------

#: the format tag of :func:`save_mixer_checkpoint` files
CHECKPOINT_FORMAT = "seqmix.mixer/1"


def check_mixer_name(name) -> None:
    """Raises a ValueError naming the argument 'mixer' for a name that is not registered."""
    try:
        mixer_entry(name)
    except ValueError as e:
        raise ValueError(f"argument 'mixer': {e}") from None


def build_for_show(name: str, *, seed: int = 0, **config) -> Mixer:
    """A randomly initialized mixer, in eval mode: the weights of ``torch.manual_seed(seed)`` then
    ``build_mixer`` (the global RNG is left as it was). An unknown name raises a ValueError naming
    the argument 'mixer'."""
    check_mixer_name(name)
    with torch.random.fork_rng(devices=[]):  # the same weights as manual_seed(seed) then build_mixer, the caller's RNG untouched
        torch.manual_seed(seed)
        return build_mixer(name, **config).eval()


def save_mixer_checkpoint(mixer: Mixer, path) -> None:
    """Saves a mixer as {format, mixer (registry name), config, state_dict, grouped}: what
    :func:`load_mixer_checkpoint` and `seqmix show NAME --checkpoint PATH` read. ``grouped``: the projections whose
    rows are tied per group (:class:`~seqmix.mixers.layers.GroupedRows`: a linearized student that keeps its
    teacher's kv heads) with their segments, rebuilt before the weights load."""
    torch.save({"format": CHECKPOINT_FORMAT, "mixer": mixer.registry_name, "config": mixer.config.model_dump(),
                "state_dict": mixer.state_dict(), "grouped": grouped_rows(mixer)}, path)


def load_mixer_checkpoint(name: str, path) -> Mixer:
    """The mixer ``name`` with the weights of the checkpoint ``path``.

    Reads a :func:`save_mixer_checkpoint` file (its config is used; a file of another mixer is
    refused) or a bare state dict (loaded strictly into ``name`` with its default config). Every
    mismatch raises a ValueError naming the argument 'checkpoint'."""
    check_mixer_name(name)
    entry_name = name
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"argument 'checkpoint': no such file {str(p)!r}")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # a file torch cannot read: one clear line, not its trace
        raise ValueError(f"argument 'checkpoint': {str(p)!r} is not a readable torch checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT:
        if obj["mixer"] != entry_name:
            raise ValueError(f"argument 'checkpoint': {str(p)!r} holds a {obj['mixer']!r} mixer, not {entry_name!r}")
        mixer = build_mixer(entry_name, **obj["config"])
        try:
            group_rows(mixer, obj.get("grouped"))
        except ValueError as e:
            raise ValueError(f"argument 'checkpoint': {str(p)!r}: its grouped projections do not fit mixer {entry_name!r} ({e})") from None
        state = obj["state_dict"]
    elif isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        mixer = build_mixer(entry_name)
        state = obj
    else:
        raise ValueError(f"argument 'checkpoint': {str(p)!r} is neither a seqmix mixer checkpoint nor a state dict")
    own = mixer.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        parts = []
        for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)):
            if keys:
                parts.append(f"{label}: {', '.join(keys[:5])}{' …' if len(keys) > 5 else ''}")
        raise ValueError(f"argument 'checkpoint': the tensors of {str(p)!r} do not fit mixer {entry_name!r} ({'; '.join(parts)})")
    mixer.load_state_dict(state)
    return mixer.eval()


def parse_overrides(items) -> dict:
    """``["heads=4", "scale=none", "dt_max=0.2"]`` -> {"heads": 4, "scale": "none", "dt_max": 0.2}: ints,
    floats, true/false and null/none as JSON reads them, anything else as a string."""
    import json

    out = {}
    for item in items or ():
        key, sep, raw = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"argument 'set' must be KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = {"none": None, "true": True, "false": False}.get(raw.lower(), raw)
        out[key.strip()] = value
    return out


def assign_checkpoints(names: list[str], specs) -> list[str | None]:
    """One checkpoint path (or None) per mixer name from specs "MIXER=PATH" (the first not yet
    assigned mixer of that name) or a bare "PATH" (only when one mixer is shown)."""
    out: list[str | None] = [None] * len(names)
    for spec in specs or ():
        key, sep, path = str(spec).partition("=")
        if sep and key in names:
            free = [i for i, n in enumerate(names) if n == key and out[i] is None]
            if not free:
                raise ValueError(f"argument 'checkpoint': more checkpoints than mixers named {key!r}")
            out[free[0]] = path
        elif len(names) == 1 and out[0] is None:
            out[0] = str(spec)
        else:
            raise ValueError(f"argument 'checkpoint': {spec!r} must be MIXER=PATH with MIXER one of the shown mixers {names}"
                             + (" (a bare PATH only when one mixer is shown)" if len(names) > 1 else ""))
    return out


def mixers_for_show(names, *, checkpoints=(), seed: int = 0, overrides: dict | None = None, d_model: int | None = None):
    """The mixers of `seqmix show` and where each comes from: (mixers, sources). Randomly initialized
    ones get ``d_model`` and the ``overrides`` that their config has (a field no shown mixer has
    raises); checkpointed ones keep the checkpoint's config."""
    names = list(names)
    for n in names:
        check_mixer_name(n)
    paths = assign_checkpoints(names, checkpoints)
    overrides = dict(overrides or {})
    if d_model is not None:
        overrides["d_model"] = d_model
    used = set()
    mixers, sources = [], []
    for n, path in zip(names, paths):
        if path is not None:
            mixers.append(load_mixer_checkpoint(n, path))
            sources.append(f"checkpoint {Path(path).name}")
            continue
        fields = mixer_entry(n).cls.Config.model_fields
        mine = {k: v for k, v in overrides.items() if k in fields}
        used |= set(mine)
        mixers.append(build_for_show(n, seed=seed, **mine))
        sources.append(f"random init, seed {seed}")
    unknown = sorted(set(overrides) - used - {"d_model"})
    if unknown:
        raise ValueError(f"argument 'set': no randomly initialized mixer shown has the config field(s) {', '.join(map(repr, unknown))} "
                         "(a checkpoint keeps its own config)")
    return mixers, sources


# ------------------------------------------------------------------------------------------
# one mixer's maps, spectrum and numbers
# ------------------------------------------------------------------------------------------


@dataclass
class MixerView:
    """What `seqmix show` draws and prints for one mixer on one input."""

    label: str
    name: str
    family: str
    map_unit: str
    source: str
    T: int
    phi: torch.Tensor  # [maps, T, T]: mixer.phi(x)[0], as the mixer returned it
    lam: torch.Tensor | None  # [T, N]: mixer.spectrum(x)[0] (= decays(x)[0] for a diagonal Λ_i), or None
    decay: dict | None  # decay_summary(lam)
    numbers: dict  # means over maps: frobenius, frobenius_rel, kl, effective_rank, band_mass, lag90
    band: int
    state_size: int
    conditions: object | None  # seqmix.analysis.Conditions, or None
    config: dict = field(default_factory=dict)
    diagonal: bool = True  # whether Λ_i is diagonal; if not, lam holds the eigenvalues of Λ_i (mixer.spectrum)
    #: reduced views (seqmix.analysis.model_maps): what each drawn map of ``phi`` is ("mean of 1536 channels",
    #: "channel 512", ...) and how many maps the mixer has in all; None: phi holds every map, titled by index
    map_labels: list[str] | None = None
    total_maps: int | None = None

    @property
    def maps(self) -> int:
        return int(self.total_maps if self.total_maps is not None else self.phi.shape[0])

    def facts(self) -> list[tuple[str, str]]:
        """The DSF facts table: (what, value) rows."""
        d, c, n = self.decay, self.conditions, self.numbers
        rows = [
            ("family / maps", f"{self.family}, {self.maps} × {self.map_unit}"),
            (f"state size (floats, T={self.T})", f"{self.state_size:,}"),
            ("DSF state N", f"{d['N']:,}" if d else "∞ (no finite DSF)"),
            ("distinct Λ_i values" if self.diagonal else "distinct eig(Λ_i) values", f"{d['distinct_values']:,}" if d else "–"),
            ("Λ parameters", (f"{d['parameters']:,}" if d["time_varying"] else "0 (time-invariant)") if d else "–"),
            ("memory (e-fold steps)", _fmt_len(d["memory"]) if d else "–"),
            ("parameter groups", c.label if c is not None else "–"),
            ("MetaLA C0 C1 C2 C3", " ".join(getattr(c, k).glyph() for k in ("C0", "C1", "C2", "C3")) if c is not None else "–"),
            ("‖Φ−P‖F / ‖P‖F", f"{n['frobenius_rel']:.3g}"),
            ("row KL(P‖Φ̂)", f"{n['kl']:.3g}"),
            ("effective rank", f"{n['effective_rank']:.1f} of {self.T}"),
            (f"mass in band w={self.band}", f"{100 * n['band_mass']:.1f}%"),
            ("90% mass lag", f"{n['lag90']:.1f}"),
        ]
        return rows


def _fmt_len(v: float) -> str:
    return "∞" if math.isinf(v) else (f"{v:.3g}" if v < 1e4 else f"{v:.2e}")


def _first(x: torch.Tensor) -> torch.Tensor:
    return x[0].detach()


def _conditions(mixer: Mixer):
    """MetaLA's Table 2 row of the mixer where seqmix.analysis.conditions defines one (a general-form
    mixer from its config, else its registry name), else None."""
    from .metala import conditions

    for arg in (mixer, mixer.registry_name):
        try:
            return conditions(arg)
        except ValueError:
            continue
    return None


def _maps_of(mixer: Mixer, x: torch.Tensor) -> int:
    """The number of maps of phi(x), read from a 2-token prefix (cheap)."""
    with torch.no_grad():
        return int(mixer.phi(x[:, : min(2, x.shape[1])]).shape[1])


def inspect_mixer(mixer: Mixer, x: torch.Tensor, reference: torch.Tensor, *, label: str | None = None, band: int = 16,
                  source: str = "", max_bytes: int = DEFAULT_MAX_MAP_BYTES) -> MixerView:
    """The maps, spectrum and numbers of ``mixer`` on x [1, T, d_model] against the reference map
    [T, T]. Raises a ValueError naming 'seq_len' when the dense maps would exceed ``max_bytes``."""
    if not isinstance(mixer, Mixer):
        raise ValueError(f"argument 'mixer' must be a seqmix Mixer, got {type(mixer).__name__}")
    mixer.check_input(x)
    T = x.shape[1]
    check_positive_int("band", band, "inspect_mixer")
    label = label or mixer.registry_name
    check_seq_len(T, _maps_of(mixer, x), max_bytes=max_bytes, what=f"mixer {label!r}")
    with torch.no_grad():
        phi = _first(mixer.phi(x))
        lam = mixer.spectrum(x)  # decays(x) for a diagonal Λ_i, its eigenvalues otherwise
    if phi.is_complex():
        phi = phi.real
    lam = _first(lam) if lam is not None else None
    decay = decay_summary(lam) if lam is not None else None
    dist = map_distance(phi, reference)
    step = max(1, math.ceil(phi.shape[0] / RANK_MAPS))
    numbers = {
        "frobenius": float(dist["frobenius"].mean()),
        "frobenius_rel": float(dist["frobenius_rel"].mean()),
        "kl": float(dist["kl"].mean()),
        "effective_rank": float(effective_rank(phi[::step]).mean()),
        "band_mass": float(band_mass(phi, band).mean()),
        "lag90": float(lag_quantile(phi, 0.9).mean()),
    }
    return MixerView(
        label=label, name=mixer.registry_name, family=type(mixer).family, map_unit=type(mixer).map_unit, source=source, T=T,
        phi=phi, lam=lam, decay=decay, numbers=numbers, band=band, state_size=int(mixer.state_size(T)),
        conditions=_conditions(mixer), config=mixer.config.model_dump(), diagonal=type(mixer).diagonal_transition,
    )


def softmax_reference(x: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
    """The reference map P [T, T]: a softmax attention (registry defaults, width of x) built with
    ``torch.manual_seed(seed)``, its map on x averaged over heads."""
    m = build_for_show("softmax_attention", seed=seed, d_model=x.shape[-1])
    with torch.no_grad():
        return m.phi(x.to(next(m.parameters()).dtype))[0].mean(0).detach()


def _labels(mixers) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for m in mixers:
        n = m.registry_name
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def inspect_mixers(mixers, inp: ShowInput, *, seed: int = 0, band: int = 16, reference: str | None = None,
                   sources: list[str] | None = None, max_bytes: int = DEFAULT_MAX_MAP_BYTES) -> list[MixerView]:
    """:func:`inspect_mixer` for each mixer on the input ``inp`` (embedded with :func:`embed` at each
    mixer's width). The reference map: a softmax attention at the same seed (default) or the
    mixer whose label is ``reference`` (mean over its maps; the labels are the registry names,
    "#2", "#3" for repeats)."""
    mixers = list(mixers)
    if not mixers:
        raise ValueError("argument 'mixers' must name at least one mixer")
    labels = _labels(mixers)
    sources = sources or ["random init, seed %d" % seed] * len(mixers)
    # fail early, before any map is built, if one would not fit
    xs = [embed(inp, m.d_model, seed=seed, dtype=next(iter(m.parameters()), torch.zeros(())).dtype) for m in mixers]
    for m, x, label in zip(mixers, xs, labels):
        check_seq_len(inp.T, _maps_of(m, x), max_bytes=max_bytes, what=f"mixer {label!r}")
    refs: dict[int, torch.Tensor] = {}
    if reference is not None:
        if reference not in labels:
            raise ValueError(f"argument 'reference' must be one of the shown mixers {labels}, got {reference!r}")
        i = labels.index(reference)
        with torch.no_grad():
            refs[mixers[i].d_model] = _first(mixers[i].phi(xs[i])).mean(0)
        if any(m.d_model != mixers[i].d_model for m in mixers):
            raise ValueError(f"argument 'reference': {reference!r} has d_model = {mixers[i].d_model}; every shown mixer must have it too")
    views = []
    for m, x, label, src in zip(mixers, xs, labels, sources):
        if m.d_model not in refs:
            refs[m.d_model] = softmax_reference(embed(inp, m.d_model, seed=seed), seed=seed)
        views.append(inspect_mixer(m, x, refs[m.d_model], label=label, band=band, source=src, max_bytes=max_bytes))
    return views


# ------------------------------------------------------------------------------------------
# drawing
# ------------------------------------------------------------------------------------------


def figure_size_px(n_columns: int, dpi: int = 100) -> tuple[int, int]:
    """(width, height) in pixels of :func:`show_figure` with ``n_columns`` mixers."""
    w, h = COLUMN_INCHES
    return round(w * n_columns * dpi), round(h * dpi)


def _map_norm(data: torch.Tensor, log: bool):
    """The colour scale of a mixer's maps: diverging and symmetric for signed maps. The top of
    the scale is the 99th percentile of the nonzero |Φ| (a few large entries, such as the first
    row of a normalized attention or a skip term D on the diagonal, saturate instead of washing
    out the rest); ``log``: a logarithmic scale over 4 decades below it (symmetric-log when signed)."""
    mag = data.abs().flatten().to(torch.float64)
    mag = mag[mag > 0]
    if mag.numel() > 1_000_000:  # the percentile of a strided sample
        mag = mag[:: math.ceil(mag.numel() / 1_000_000)]
    vmax = float(torch.quantile(mag, 0.99)) if mag.numel() else 1.0
    vmax = vmax if vmax > 0 else 1.0
    signed = bool((data < 0).any())
    if log:
        if signed:
            return SymLogNorm(linthresh=vmax * 1e-4, vmin=-vmax, vmax=vmax), "RdBu_r"
        return LogNorm(vmin=vmax * 1e-4, vmax=vmax, clip=True), "viridis"
    if signed:
        return Normalize(vmin=-vmax, vmax=vmax, clip=True), "RdBu_r"
    return Normalize(vmin=0, vmax=vmax, clip=True), "viridis"


class _Column:
    """Axes placed by hand in one mixer's column of the figure (inches from the column's top-left
    corner): no layout engine, so drawing is fast and the picture has the same geometry at any size."""

    def __init__(self, fig: Figure, index: int, n: int):
        self.fig, self.index = fig, index
        self.W, self.H = COLUMN_INCHES
        self.n = n

    def axes(self, left: float, top: float, width: float, height: float):
        W, H, n = self.W, self.H, self.n
        return self.fig.add_axes([(self.index * W + left) / (n * W), (H - top - height) / H, width / (n * W), height / H])

    def text(self, left: float, top: float, s: str, **kw):
        W, H, n = self.W, self.H, self.n
        self.fig.text((self.index * W + left) / (n * W), (H - top) / H, s, **kw)


def _draw_column(col: _Column, view: MixerView, *, log: bool, max_maps: int) -> None:
    """One mixer: its first ``max_maps`` maps (one colour scale), the decay spectrum, the facts."""
    T = view.T
    col.text(col.W / 2, 0.12, f"{view.label}", ha="center", va="top", fontsize=10, weight="bold")
    col.text(col.W / 2, 0.36, view.source, ha="center", va="top", fontsize=7, color="#444")
    # the maps: a grid in the box [0.35, 3.35] x [0.65, 4.45] (inches), colour bar at its right
    k = min(int(view.phi.shape[0]), max_maps)
    cols = math.ceil(math.sqrt(k))
    rows = math.ceil(k / cols)
    box_w, box_h, gap = 3.0, 3.8, 0.3
    side = min((box_w - gap * (cols - 1)) / cols, (box_h - gap * rows) / rows)
    norm, cmap = _map_norm(view.phi[:k], log)
    ticks = [0, T // 2, T - 1] if T > 2 else list(range(T))
    for i in range(k):
        r, c = divmod(i, cols)
        ax = col.axes(0.35 + c * (side + gap), 0.65 + gap + r * (side + gap), side, side)
        im = ax.imshow(view.phi[i].numpy(), cmap=cmap, norm=norm, interpolation="antialiased")
        im.set_gid(f"phi:{view.label}:{i}")
        ax.set_title(f"Φ {view.map_labels[i]}" if view.map_labels else f"Φ {view.map_unit} {i}", fontsize=7, pad=2)
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.tick_params(labelsize=5, length=2, pad=1)
    cax = col.axes(3.5, 0.65 + gap, 0.1, rows * side + (rows - 1) * gap)
    cb = col.fig.colorbar(im, cax=cax, extend="both" if norm.vmin < 0 else "max")
    cb.ax.tick_params(labelsize=5)
    # the decay spectrum
    ax = col.axes(0.45, 4.95, 2.9, 1.55)
    ax.tick_params(labelsize=5, length=2, pad=1)
    if view.lam is None:
        ax.text(0.5, 0.5, "no finite-state DSF:\nno transition Λ_i to show", ha="center", va="center", fontsize=8, transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("decay spectrum |Λ_i|", fontsize=7, pad=3)
    else:
        d = view.decay
        mag = _spectrum_rows(view)
        top = max(1.0, float(mag.max())) if mag.numel() else 1.0
        im = ax.imshow(mag.numpy(), aspect="auto", cmap="magma", vmin=0, vmax=top, interpolation="nearest")
        im.set_gid(f"decays:{view.label}")
        ax.set_xlabel("time i", fontsize=6, labelpad=1)
        ax.set_ylabel("state (by memory)", fontsize=6, labelpad=1)
        if mag.shape[0] <= 8:
            ax.set_yticks(range(mag.shape[0]))
        what = "|Λ_i|" if view.diagonal else "|eig Λ_i| (non-diagonal)"
        ax.set_title(f"{what}: {d['trajectories']:,} distinct of N = {d['N']:,}; memory ≈ {_fmt_len(d['memory'])}", fontsize=7, pad=3)
        cb = col.fig.colorbar(im, cax=col.axes(3.5, 4.95, 0.1, 1.55))
        cb.ax.tick_params(labelsize=5)
    # the facts
    ax = col.axes(0.15, 6.95, 3.7, 2.95)
    ax.axis("off")
    table = ax.table(cellText=[list(r) for r in view.facts()], colWidths=[0.55, 0.45], loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(6.5)
    table.scale(1.0, 1.2)


def _spectrum_rows(view: MixerView) -> torch.Tensor:
    """|Λ_i| of at most :data:`SPECTRUM_ROWS` distinct state trajectories, evenly spaced by memory: [rows, T] float64."""
    order = view.decay["order"]
    pick = order[torch.linspace(0, len(order) - 1, min(SPECTRUM_ROWS, len(order))).round().long()] if len(order) else order
    return view.lam[:, pick].abs().to(torch.float64).T


def overview_figure(views: list[MixerView], *, log: bool = False, dpi: int = 100, titles: list[str] | None = None,
                    subtitles: list[str] | None = None) -> Figure:
    """A compact picture of several mixers (the README's and the docs gallery's): one column of
    :data:`OVERVIEW_INCHES` each, its first map Φ on top (for a real model's layer, the mean map)
    and its decay spectrum |Λ_i| below (as in :func:`show_figure`), titled by ``titles`` and
    ``subtitles`` (default: the labels and the families); no facts table. ``log``: a logarithmic
    colour scale for the maps. Image artists: gid "phi:LABEL" and "decays:LABEL"."""
    if not views:
        raise ValueError("argument 'views' must hold at least one mixer")
    titles = list(titles) if titles is not None else [v.label for v in views]
    subtitles = list(subtitles) if subtitles is not None else [v.family for v in views]
    for name, given in (("titles", titles), ("subtitles", subtitles)):
        if len(given) != len(views):
            raise ValueError(f"argument '{name}' must have one entry per view ({len(views)}), got {len(given)}")
    W, H = OVERVIEW_INCHES
    n = len(views)
    fig = Figure(figsize=(W * n, H), dpi=dpi)

    def axes(i, left, top, width, height):
        return fig.add_axes([(i * W + left) / (n * W), (H - top - height) / H, width / (n * W), height / H])

    for i, (view, title, sub) in enumerate(zip(views, titles, subtitles)):
        fig.text((i * W + W / 2) / (n * W), 1 - 0.06 / H, title, ha="center", va="top", fontsize=8, weight="bold")
        fig.text((i * W + W / 2) / (n * W), 1 - 0.24 / H, sub, ha="center", va="top", fontsize=6.5, color="#444")
        norm, cmap = _map_norm(view.phi[:1], log)
        ax = axes(i, 0.12, 0.45, W - 0.24, W - 0.24)
        im = ax.imshow(view.phi[0].numpy(), cmap=cmap, norm=norm, interpolation="antialiased")
        im.set_gid(f"phi:{view.label}")
        ax.set_title(view.map_labels[0] if view.map_labels else f"Φ, {view.map_unit} 0", fontsize=6, pad=2)
        ax.set_xticks([])
        ax.set_yticks([])
        ax = axes(i, 0.12, W + 0.45, W - 0.24, H - W - 0.6)
        ax.set_xticks([])
        ax.set_yticks([])
        if view.lam is None:
            ax.text(0.5, 0.5, "no finite-state\nDSF: no Λ_i", ha="center", va="center", fontsize=6.5, transform=ax.transAxes)
            ax.set_title("decay spectrum", fontsize=6, pad=2)
        else:
            mag = _spectrum_rows(view)
            top = max(1.0, float(mag.max())) if mag.numel() else 1.0
            im = ax.imshow(mag.numpy(), aspect="auto", cmap="magma", vmin=0, vmax=top, interpolation="nearest")
            im.set_gid(f"decays:{view.label}")
            what = "|Λ_i|" if view.diagonal else "|eig Λ_i|"
            ax.set_title(f"{what}, memory ≈ {_fmt_len(view.decay['memory'])}", fontsize=6, pad=2)
    return fig


def show_figure(views: list[MixerView], *, log: bool = False, max_maps: int = 4, dpi: int = 100) -> Figure:
    """One column per mixer (:data:`COLUMN_INCHES` each): the maps Φ (heatmaps of the first
    ``max_maps`` heads or channels, linear or ``log`` colour scale), the decay spectrum and the
    facts table. The image artists hold the arrays of ``view.phi`` themselves (gid "phi:LABEL:i")."""
    if not views:
        raise ValueError("argument 'views' must hold at least one mixer")
    check_positive_int("max_maps", max_maps, "show_figure")
    w, h = COLUMN_INCHES
    fig = Figure(figsize=(w * len(views), h), dpi=dpi)
    for i, view in enumerate(views):
        _draw_column(_Column(fig, i, len(views)), view, log=log, max_maps=max_maps)
    return fig


def figure_png(fig: Figure, dpi: int | None = None) -> bytes:
    """The figure as PNG bytes (its own size; no tight bounding box, so the pixel size is known)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi or fig.dpi)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------
# the HTML report
# ------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table.numbers { border-collapse: collapse; font-size: 0.85em; }
table.numbers th, table.numbers td { border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: right; }
table.numbers th:first-child, table.numbers td:first-child { text-align: left; }
.mixers { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; } figcaption { font-size: 0.8em; color: #555; max-width: 400px; }
img { max-width: 100%; height: auto; }
"""

# marks every image that decoded, and the body with the count: what the headless-browser test reads
_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; imgs[i].setAttribute("data-decoded", "1"); }
    else { console.error("seqmix report: image not decoded: " + imgs[i].alt); }
  }
  document.body.setAttribute("data-images-decoded", ok + "/" + imgs.length);
});
"""


def _config_changes(view: MixerView) -> dict:
    """The config fields of a view whose values differ from its registry defaults."""
    defaults = mixer_entry(view.name).config().model_dump()
    return {k: v for k, v in view.config.items() if defaults.get(k, object()) != v}


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def html_report(views: list[MixerView], *, theory: dict | None = None, title: str = "seqmix show", input_description: str = "",
                log: bool = False, max_maps: int = 4, dpi: int = 100, theory_heading: str = "Theory figures",
                reference: str = "softmax attention on the same input (docs/show.md)") -> str:
    """A self-contained HTML page: the numbers of every mixer in one table, one figure per mixer
    (maps, spectrum, facts; PNG embedded as base64), and the figures ``theory`` ({name: figure or
    (figure, data)}) under ``theory_heading``. No external resource is referenced."""
    esc = html.escape
    parts = [
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">', f"<title>{esc(title)}</title>",
        f"<style>{_CSS}</style>", "</head>", "<body>", f"<h1>{esc(title)}</h1>",
    ]
    if input_description:
        parts.append(f"<p>Input: {esc(input_description)}. Reference map P: {esc(reference)}.</p>")
    if views:
        facts = [v.facts() for v in views]
        parts += ["<h2>Numbers</h2>", '<table class="numbers">', "<thead><tr><th>mixer</th>"]
        parts += [f"<th>{esc(k)}</th>" for k, _ in facts[0][1:]]
        parts += ["</tr></thead>", "<tbody>"]
        for v, f in zip(views, facts):
            parts.append(f"<tr><td>{esc(v.label)}</td>" + "".join(f"<td>{esc(val)}</td>" for _, val in f[1:]) + "</tr>")
        parts += ["</tbody>", "</table>", "<h2>Maps, decay spectra and DSF facts</h2>", '<div class="mixers">']
        for v in views:
            png = figure_png(show_figure([v], log=log, max_maps=max_maps, dpi=dpi))
            changed = _config_changes(v)
            cap = f"{v.label} ({v.family}; {v.source}): " + (
                "config " + ", ".join(f"{k}={val}" for k, val in changed.items()) + " (others: registry defaults)" if changed else "registry defaults")
            parts.append(f"<figure>{_img(png, 'maps of ' + v.label)}<figcaption>{esc(cap)}</figcaption></figure>")
        parts.append("</div>")
    if theory:
        parts.append(f"<h2>{esc(theory_heading)}</h2>")
        for name, fig in theory.items():
            fig = fig[0] if isinstance(fig, tuple) else fig
            parts.append(f"<figure>{_img(figure_png(fig), name)}<figcaption>{esc(name)}</figcaption></figure>")
    parts += [f"<script>{_SCRIPT}</script>", "</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write_html(path, views: list[MixerView], **kwargs) -> Path:
    """Writes :func:`html_report` to ``path`` (UTF-8); returns the path."""
    p = Path(path)
    p.write_text(html_report(views, **kwargs), encoding="utf-8")
    return p
