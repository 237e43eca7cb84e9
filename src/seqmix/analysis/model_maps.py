"""The DSF of a whole model on one text: every layer's map Φ (per head or channel, and their
mean), its decay spectrum and its state size, across layers — at real sizes (docs/interop.md).

    from seqmix.analysis.model_maps import model_maps, layers_figure
    conv = seqmix.interop.from_transformers(MambaForCausalLM.from_pretrained(path), inplace=True)
    mm = model_maps(conv, ids, layers=(0, -1), label="mamba-130m")   # ModelMaps
    show.show_figure(mm.views).savefig("maps.png")                    # one column per drawn layer
    layers_figure([mm]).savefig("layers.png")                         # memory and state size per layer
    rows = layer_report(conv, ids)                                    # one dict per layer (`seqmix show --hf X --report`):
    open("report.md", "w").write(report_markdown(rows))               # class, mixer, state, Λ structure, norms, gates,
                                                                      # decay range, 90% mass lag of Φ (docs/interop.md)

The model is any torch module holding seqmix mixers: a seqmix ``LanguageModel`` or a
transformers model converted by :func:`seqmix.interop.from_transformers` (analysis sits below
interop and does not import it: convert first). Its layers are its outermost seqmix
:class:`~seqmix.mixers.base.Mixer` modules, in module order; each is seen on its own input
in the model (a forward pre-hook records what the mixer receives: the residual stream after
the block's norm), and the views are the show mechanism's :class:`~seqmix.analysis.show.MixerView`,
drawn by :func:`~seqmix.analysis.show.show_figure` and :func:`~seqmix.analysis.show.html_report`.

Real sizes. A 130M Mamba has d_inner = 1536 channel maps per layer: at T = 1024 that is
1.6 G floats, so the maps are reduced **as they are computed**: :func:`reduced_maps` runs the
mixer's core map in blocks of heads / channels, adds each block into the mean and keeps the
selected maps, and never holds more than one block. It reads the mixer's recurrence form
(:data:`MAP_PIECES`: q, k, the log-decay and the skip term of ``linear_recurrence``, the DSF's
C_i, B_i, Λ_i, D_i) where one is registered for the mixer's class, and ``mixer.phi(x)``
otherwise (a mixer with few maps: attention heads), under the dense-map memory limit. The
spectrum is read from the same pieces (Λ_i = exp(log-decay), each distinct value once, with
the DSF's N): ``dsf(x)`` would build D_i as a dense [T, d_inner, d_inner] float64 tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from matplotlib.figure import Figure
from torch import nn

from .._checks import check_positive_int
from ..mixers.base import Mixer
from ..mixers.layers import LayerNorm, RMSNorm
from ..mixers.ssm import S6, SSD
from ..ops.recurrence import recurrence_map
from .mapstats import (
    DEFAULT_MAX_MAP_BYTES, band_mass, check_seq_len, decay_summary, effective_rank, lag_quantile, map_distance,
    memory_lengths,
)
from .show import SPECTRUM_ROWS, MixerView, _conditions, softmax_reference

__all__ = [
    "Pieces", "MAP_PIECES", "register_map_pieces", "map_pieces", "ReducedMaps", "reduced_maps", "reduced_spectrum",
    "mixer_layers", "layer_inputs", "LayerSummary", "ModelMaps", "model_maps", "layers_figure", "BLOCK_BYTES",
    "LAMBDA_STRUCTURE", "lambda_structure", "norm_and_gate", "NORM_GATE_RULES", "NORM_PLACES", "norm_gate_rule",
    "missing_norm_gate_rule", "mass_lag", "layer_lag", "decay_range", "layer_report",
    "report_markdown", "report_html", "REPORT_HEADINGS", "REPORT_NOTE",
]

#: bytes of one block of maps computed at a time (float32 [block, T, T]); the block is at least one map
BLOCK_BYTES = 2**27


# ------------------------------------------------------------------------------------------
# the recurrence form of a mixer's core map: Φ computed a block of maps at a time
# ------------------------------------------------------------------------------------------


@dataclass
class Pieces:
    """The core map of a mixer in ``linear_recurrence`` form (DSF: C_i = q_i, B_i = k_i,
    Λ_i = exp(gk_i), D_i = skip): for map h,

        Φ_h[t, s] = Σ_k q_t[h, k] k_s[h, k] exp(Σ_(r=s+1..t) gk_r[h, k]) + skip_h δ_ts

    q, k [1, T, H, K]; gk [1, T, H, K] (per key) or [1, T, H] (per map); skip [H] or None;
    ``values``: channels V sharing one map (the DSF's N = H·V·K). A per-key decay that factors
    as gk[t, h, k] = dt[t, h]·rate[h, k] (S6: Δ_t^c·A[c, n]) gives ``dt`` [1, T, H] and ``rate``
    [H, K]: the map is then computed from one T×T difference of cumulative dt per map
    (:meth:`block`), not from the general tiled form of ``recurrence_map``."""

    q: torch.Tensor
    k: torch.Tensor
    gk: torch.Tensor | None
    skip: torch.Tensor | None = None
    values: int = 1
    dt: torch.Tensor | None = None
    rate: torch.Tensor | None = None

    @property
    def maps(self) -> int:
        return int(self.q.shape[2])

    def at(self, index: list[int]) -> torch.Tensor:
        """Φ of the maps ``index``: [len(index), T, T] (float32 at least)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        if self.dt is not None and self.rate is not None:
            A = self._factored(idx)
        else:
            gk = self.gk[:, :, idx] if self.gk is not None else None
            A = recurrence_map(self.q[:, :, idx], self.k[:, :, idx], gk, check_values=False)[0]
        if A.is_complex():
            A = A.real
        if self.skip is not None:
            T = A.shape[-1]
            r = torch.arange(T)
            A[:, r, r] += self.skip.detach()[idx].to(A.dtype).unsqueeze(-1)
        return A

    def mean(self, leaf: int = 16) -> torch.Tensor:
        """(1/H) Σ_h Φ_h [T, T] without any per-map T×T tensor: the sum over maps and keys is one
        contraction over H·K. The causal map is split in halves recursively; the block below the
        diagonal (t >= mid > s) is Q Kᵀ with Q_t = q_t ⊙ exp(G_t − G_(mid−1)) and
        K_s = k_s ⊙ exp(G_(mid−1) − G_s) (G = cumsum gk, float64; both factors <= 1 for decays,
        gk <= 0), the diagonal blocks of ``leaf`` tokens directly. O(T²·H·K) multiply-adds in
        matmuls, O(T·H·K·log T) exponentials."""
        q, k = self.q[0], self.k[0]  # [T, H, K]
        T, H, K = q.shape
        rdt = _real_dtype(q)
        if self.gk is None:
            G = torch.zeros(T, 1, 1, dtype=torch.float64)
        else:
            g = self.gk[0].to(torch.float64)
            G = (g if g.dim() == 3 else g.unsqueeze(-1)).cumsum(0)  # [T, H, K or 1]
        out = torch.zeros(T, T, dtype=rdt)

        def rec(lo: int, hi: int) -> None:
            if hi - lo <= leaf:
                D = G[lo:hi, None] - G[None, lo:hi]  # [t, s, H, K|1]
                causal = torch.ones(hi - lo, hi - lo, dtype=torch.bool).tril()[:, :, None, None]
                E = torch.where(causal, D, torch.full((), -math.inf, dtype=D.dtype)).exp().to(rdt)
                out[lo:hi, lo:hi] = torch.einsum("tshk,thk,shk->ts", E, q[lo:hi].to(rdt), k[lo:hi].to(rdt))
                return
            mid = (lo + hi) // 2
            rec(lo, mid)
            rec(mid, hi)
            R = G[mid - 1]
            Q = (q[mid:hi].to(rdt) * (G[mid:hi] - R).exp().to(rdt)).reshape(hi - mid, -1)
            Kx = (k[lo:mid].to(rdt) * (R - G[lo:mid]).exp().to(rdt)).reshape(mid - lo, -1)
            out[mid:hi, lo:mid] = Q @ Kx.T

        with torch.no_grad():
            rec(0, T)
        out /= H
        if self.skip is not None:
            r = torch.arange(T)
            out[r, r] += float(self.skip.detach().to(torch.float64).mean())
        return out

    @property
    def N(self) -> int:
        return self.maps * self.values * int(self.q.shape[-1])

    def _factored(self, idx: torch.Tensor) -> torch.Tensor:
        """Φ_h[t, s] = Σ_k q_t[h,k] k_s[h,k] exp(rate[h,k]·(c_t^h − c_s^h)) for s <= t, c = cumsum(dt)
        (in float64; the differences in float32, as the maps are drawn), 0 above the diagonal."""
        dt = _real_dtype(self.q)
        cum = self.dt[0][:, idx].to(torch.float64).cumsum(0).T  # [h, T]
        T = cum.shape[1]
        diff = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).to(dt)  # [h, T(t), T(s)]: c_t - c_s
        diff.masked_fill_(~torch.ones(T, T, dtype=torch.bool).tril(), float("inf"))  # exp(rate·inf) = 0 for rate < 0
        q = self.q[0][:, idx].to(dt).permute(1, 2, 0)  # [h, K, T]
        k = self.k[0][:, idx].to(dt).permute(1, 2, 0)
        rate = self.rate[idx].to(dt)  # [h, K]
        out = torch.zeros(len(idx), T, T, dtype=dt)
        E = torch.empty_like(out)
        for j in range(rate.shape[1]):
            torch.mul(diff, rate[:, j, None, None], out=E)
            E.exp_()
            E.mul_(q[:, j, :, None]).mul_(k[:, j, None, :])
            out += E
        return torch.nan_to_num_(out, nan=0.0)


def _real_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


#: {mixer class: pieces(mixer, x) -> Pieces}: exact classes (a subclass may compute another map);
#: tests/test_model_maps.py ties each entry to the mixer's own phi(x) and decays(x)
MAP_PIECES: dict[type, Callable[[Mixer, torch.Tensor], Pieces]] = {}


def register_map_pieces(cls: type):
    """Decorator: ``pieces(mixer, x)`` is the recurrence form of ``cls``'s phi(x)."""

    def deco(fn):
        MAP_PIECES[cls] = fn
        return fn

    return deco


@register_map_pieces(S6)
def _s6_pieces(m: S6, u: torch.Tensor) -> Pieces:
    """S6 / the Mamba block (as S6.phi): one map per channel, K = d_state, q = c, k = Δb, gk = ΔA, skip D."""
    x, _, delta, b, c, _ = m._inputs(u)
    q, k, _, gk = m._recurrence(x, delta, b, c)
    return Pieces(q, k, gk, m.D, values=1, dt=delta, rate=m.A)  # gk = Δ_t^c·A[c, n]


@register_map_pieces(SSD)
def _ssd_pieces(m: SSD, u: torch.Tensor) -> Pieces:
    """SSD / the Mamba-2 block (as SSD.phi): one map per head, gk = Δ·a per head, skip D_h, V = headdim."""
    _, _, delta, Bm, Cm, _ = m._inputs(u)
    q, k, gk = m._recurrence(delta, Bm, Cm)
    return Pieces(q, k, gk, m.D, values=m.config.headdim)


def map_pieces(mixer: Mixer, x: torch.Tensor) -> Pieces | None:
    """The recurrence form of ``mixer`` on x [1, T, d] (no gradients), or None when none is registered."""
    fn = MAP_PIECES.get(type(mixer))
    if fn is None:
        return None
    with torch.no_grad():
        return fn(mixer, x)


@dataclass
class ReducedMaps:
    """The maps of one mixer on one input, reduced as computed: ``mean`` [T, T] (float32, summed in
    float64) over all ``count`` maps, and the ``selected`` maps [k, T, T] at indices ``index``."""

    mean: torch.Tensor
    selected: torch.Tensor
    index: list[int]
    count: int
    blocked: bool  # True: computed a block at a time from the pieces; False: from mixer.phi(x)


def _check_index(index, count: int, unit: str) -> list[int]:
    out = []
    for i in index:
        if not isinstance(i, int) or not -count <= i < count:
            raise ValueError(f"argument 'heads': {i!r} is not a {unit} of a mixer with {count} {unit}s (0..{count - 1})")
        out.append(i % count)
    return list(dict.fromkeys(out))


def default_heads(count: int, n: int) -> list[int]:
    """``n`` map indices evenly spaced over 0..count-1 (the first and the last included)."""
    if n <= 0:
        return []
    if n >= count:
        return list(range(count))
    return sorted(dict.fromkeys(round(i * (count - 1) / max(1, n - 1)) for i in range(n))) if n > 1 else [0]


def reduced_maps(mixer: Mixer, x: torch.Tensor, heads=None, *, n_heads: int = 3, block_bytes: int = BLOCK_BYTES,
                 max_bytes: int = DEFAULT_MAX_MAP_BYTES, pieces: Pieces | None = None) -> ReducedMaps:
    """The mean map and the selected maps (``heads``: indices; default ``n_heads`` evenly spaced)
    of ``mixer`` on x [1, T, d_model]. With registered pieces (:data:`MAP_PIECES`) the maps are
    computed ``block_bytes`` at a time and never held all at once; otherwise ``mixer.phi(x)``
    is called when its dense maps fit in ``max_bytes`` (else a ValueError naming 'seq_len')."""
    if not isinstance(mixer, Mixer):
        raise ValueError(f"argument 'mixer' must be a seqmix Mixer, got {type(mixer).__name__}")
    mixer.check_input(x)
    if x.shape[0] != 1:
        raise ValueError(f"argument 'x' must hold one sequence [1, T, d_model], got batch {x.shape[0]}")
    T = x.shape[1]
    unit = type(mixer).map_unit
    pieces = pieces if pieces is not None else map_pieces(mixer, x)
    with torch.no_grad():
        if pieces is not None:
            M = pieces.maps
            index = _check_index(heads, M, unit) if heads is not None else default_heads(M, n_heads)
            step = max(1, block_bytes // (4 * T * T))  # selected maps computed a block at a time
            sel = [pieces.at(index[i:i + step]).float() for i in range(0, len(index), step)]
            sel = torch.cat(sel) if sel else torch.zeros(0, T, T)
            return ReducedMaps(pieces.mean().float(), sel, index, M, True)
        from .show import _maps_of

        M = _maps_of(mixer, x)
        check_seq_len(T, M, max_bytes=max_bytes, what=f"mixer {mixer.registry_name!r} (no blocked map form registered)")
        index = _check_index(heads, M, unit) if heads is not None else default_heads(M, n_heads)
        phi = mixer.phi(x)[0].detach()
        if phi.is_complex():
            phi = phi.real
        return ReducedMaps(phi.mean(0, dtype=torch.float64).float(), phi[index].float().clone(), index, M, False)


def reduced_spectrum(mixer: Mixer, x: torch.Tensor, *, pieces: Pieces | None = None, rows: int = SPECTRUM_ROWS):
    """(lam [T, r] — at most ``rows`` distinct trajectories of |Λ_i|, ordered by memory length —,
    decay summary (:func:`seqmix.analysis.mapstats.decay_summary` with the DSF's N; "order" indexes
    lam's columns), memory lengths of every column read [n]) of ``mixer`` on x [1, T, d]; (None,
    None, None) for a mixer without a finite-state DSF. With pieces, Λ_i = exp(gk_i) is read per
    key (or per map): each distinct trajectory once (equal multiplicities keep the median memory)."""
    pieces = pieces if pieces is not None else map_pieces(mixer, x)
    with torch.no_grad():
        if pieces is not None:
            gk = pieces.gk
            if gk is None:
                lam = torch.ones(x.shape[1], pieces.maps, dtype=torch.float64)
            else:
                lam = gk[0].flatten(1).to(torch.float64).exp()  # [T, H·K] or [T, H]
            N = pieces.N
        else:
            spec = mixer.spectrum(x)
            if spec is None:
                return None, None, None
            lam = spec[0].detach()
            N = int(lam.shape[-1])
        d = decay_summary(lam)
        tau = memory_lengths(lam)
        d["N"] = N
        order = d["order"]
        pick = order[torch.linspace(0, len(order) - 1, min(rows, len(order))).round().long()] if len(order) else order
        small = lam[:, pick].clone()
        d["order"] = torch.arange(small.shape[1])
        return small, d, tau


# ------------------------------------------------------------------------------------------
# the layers of a model and their inputs
# ------------------------------------------------------------------------------------------


def mixer_layers(model: nn.Module) -> dict[str, Mixer]:
    """{module path: Mixer} of the outermost seqmix mixers of ``model``, in module order."""
    out: dict[str, Mixer] = {}
    for path, m in model.named_modules():
        if isinstance(m, Mixer) and not any(path.startswith(p + ".") for p in out):
            out[path] = m
    if not out:
        hint = (" (a transformers model: convert it first with seqmix.interop.from_transformers(model))"
                if hasattr(getattr(model, "config", None), "model_type") else "")
        raise ValueError(f"argument 'model': {type(model).__name__} holds no seqmix mixer{hint}")
    return out


def _run(model: nn.Module, ids: torch.Tensor) -> None:
    """One forward pass of ``model`` on ids [1, T] without a cache (the backbone only where there is one)."""
    if hasattr(model, "hidden") and hasattr(model, "blocks"):  # a seqmix LanguageModel
        model.hidden(ids)
        return
    base = getattr(model, "base_model", None)
    target = base if isinstance(base, nn.Module) else model
    try:
        target(input_ids=ids, use_cache=False)
    except TypeError:
        target(ids)


def layer_inputs(model: nn.Module, tokens: torch.Tensor, paths=None) -> dict[str, torch.Tensor]:
    """{path: x [1, T, d]}: what each mixer of ``paths`` (default: every layer) receives when
    ``model`` reads tokens [T] (a forward pre-hook per mixer; no gradients)."""
    layers = mixer_layers(model)
    paths = list(layers) if paths is None else list(paths)
    seen: dict[str, torch.Tensor] = {}

    def hook(path):
        def fn(mod, args, kwargs):
            x = args[0] if args else kwargs.get("x")
            seen.setdefault(path, x.detach())
        return fn

    hooks = [layers[p].register_forward_pre_hook(hook(p), with_kwargs=True) for p in paths]
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            _run(model, tokens.reshape(1, -1).long())
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    missing = [p for p in paths if p not in seen]
    if missing:
        raise ValueError(f"argument 'model': the forward pass did not call the mixer(s) {missing[:3]}")
    return {p: seen[p] for p in paths}


def _layer_indices(layers, n: int) -> list[int]:
    if layers is None or layers == "all":
        return list(range(n))
    out = []
    for i in layers:
        if not isinstance(i, int) or not -n <= i < n:
            raise ValueError(f"argument 'layers': {i!r} is not a layer of a model with {n} mixer layers (0..{n - 1})")
        out.append(i % n)
    return list(dict.fromkeys(out))


# ------------------------------------------------------------------------------------------
# a model's views
# ------------------------------------------------------------------------------------------


@dataclass
class LayerSummary:
    """One layer across the model: its DSF facts that need no T×T map."""

    index: int
    path: str
    mixer: str
    state_size: int  # floats of state per sequence after T tokens (mixer.state_size(T))
    N: int | None  # the DSF's state size (None: no finite-state DSF)
    memory: float  # median e-fold memory over the DSF's states (steps)
    memory_q: tuple[float, float]  # its 25% and 75% quantiles
    trajectories: int | None


@dataclass
class ModelMaps:
    """What `seqmix show --hf` draws for one model on one input."""

    label: str
    source: str
    T: int
    views: list[MixerView]  # one per drawn layer
    layers: list[LayerSummary] = field(default_factory=list)  # every layer


def _view(mixer: Mixer, x: torch.Tensor, red: ReducedMaps, spectrum, *, label: str, source: str, band: int) -> MixerView:
    lam, decay, _ = spectrum
    unit = type(mixer).map_unit
    phi = torch.cat([red.mean.unsqueeze(0), red.selected], 0)
    ref = softmax_reference(x)
    mean = red.mean.unsqueeze(0)
    dist = map_distance(mean, ref)
    numbers = {  # of the mean map: every number of show's table, on Φ̄ = mean over the maps
        "frobenius": float(dist["frobenius"][0]), "frobenius_rel": float(dist["frobenius_rel"][0]), "kl": float(dist["kl"][0]),
        "effective_rank": float(effective_rank(mean)[0]), "band_mass": float(band_mass(mean, band)[0]),
        "lag90": float(lag_quantile(mean, 0.9)[0]),
    }
    labels = [f"mean of {red.count} {unit}s"] + [f"{unit} {i}" for i in red.index]
    T = x.shape[1]
    return MixerView(
        label=label, name=mixer.registry_name, family=type(mixer).family, map_unit=unit, source=source, T=T, phi=phi,
        lam=lam, decay=decay, numbers=numbers, band=band, state_size=int(mixer.state_size(T)), conditions=_conditions(mixer),
        config=mixer.config.model_dump(), diagonal=type(mixer).diagonal_transition, map_labels=labels, total_maps=red.count,
    )


def model_maps(model: nn.Module, tokens: torch.Tensor, *, layers=(0, -1), heads=None, n_heads: int = 3, band: int = 16,
               label: str = "", source: str = "", max_bytes: int = DEFAULT_MAX_MAP_BYTES,
               block_bytes: int = BLOCK_BYTES) -> ModelMaps:
    """The views of ``model``'s mixer layers on tokens [T] (module docstring).

    layers: indices into the model's mixer layers (negative from the end; "all" or None: every
    layer) drawn as columns; every layer gets a :class:`LayerSummary` (spectrum and state size,
    no T×T map). heads: the maps drawn beside the mean (indices; default ``n_heads`` evenly
    spaced). The numbers of a view are those of its mean map Φ̄ against the reference P (a
    random softmax attention on the same layer input, as for trained runs)."""
    check_positive_int("band", band, "model_maps")
    tokens = torch.as_tensor(tokens).reshape(-1)
    if tokens.numel() == 0:
        raise ValueError("argument 'tokens' is empty")
    mixers = mixer_layers(model)
    paths = list(mixers)
    drawn = set(_layer_indices(layers, len(paths)))
    xs = layer_inputs(model, tokens, paths)
    T = int(tokens.numel())
    views, summaries = [], []
    name = label or type(model).__name__
    for i, path in enumerate(paths):
        mixer, x = mixers[path], xs.pop(path)
        pieces = map_pieces(mixer, x)
        lam, decay, tau = spectrum = reduced_spectrum(mixer, x, pieces=pieces)
        if tau is not None and tau.numel():
            q = torch.quantile(tau.clamp(max=1e12), torch.tensor([0.25, 0.75], dtype=tau.dtype)).tolist()
        else:
            q = [math.nan, math.nan]
        summaries.append(LayerSummary(i, path, mixer.registry_name, int(mixer.state_size(T)), decay["N"] if decay else None,
                                      decay["memory"] if decay else math.nan, (q[0], q[1]),
                                      decay["trajectories"] if decay else None))
        if i in drawn:
            red = reduced_maps(mixer, x, heads, n_heads=n_heads, block_bytes=block_bytes, max_bytes=max_bytes, pieces=pieces)
            views.append(_view(mixer, x, red, spectrum, label=f"{name} layer {i}: {mixer.registry_name}", source=source or path,
                               band=band))
        del pieces, x
    return ModelMaps(name, source, T, views, summaries)


def layers_figure(models: list[ModelMaps], *, dpi: int = 100) -> Figure:
    """Across layers, one line per model: the median e-fold memory of the decay spectrum (with
    its 25-75% band; log scale) and the state size (floats per sequence after T tokens)."""
    if not models:
        raise ValueError("argument 'models' must hold at least one model")
    fig = Figure(figsize=(9.0, 3.4), dpi=dpi)
    ax1, ax2 = fig.add_axes([0.07, 0.17, 0.40, 0.70]), fig.add_axes([0.57, 0.17, 0.40, 0.70])
    for mm in models:
        idx = [s.index for s in mm.layers]
        med = [s.memory for s in mm.layers]
        lo = [s.memory_q[0] for s in mm.layers]
        hi = [s.memory_q[1] for s in mm.layers]
        (line,) = ax1.plot(idx, med, marker="o", ms=3, label=mm.label)
        ax1.fill_between(idx, lo, hi, color=line.get_color(), alpha=0.2)
        ax2.plot(idx, [s.state_size for s in mm.layers], marker="o", ms=3, color=line.get_color(), label=mm.label)
    if any(math.isfinite(s.memory) and s.memory > 0 for mm in models for s in mm.layers):
        ax1.set_yscale("log")
    else:  # attention only: no layer has a decay (its memory is nan), nothing to put on a log scale
        ax1.text(0.5, 0.5, "no decay in any layer (attention only)", ha="center", va="center", fontsize=7, transform=ax1.transAxes)
    ax1.set_title("decay memory (e-fold steps): median, 25–75%", fontsize=8)
    ax2.set_title(f"state size (floats per sequence, T = {models[0].T})", fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xlabel("layer", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6)
    return fig


# ------------------------------------------------------------------------------------------
# the layer report (`seqmix show --hf X --report`): one row per layer
# ------------------------------------------------------------------------------------------

#: the structure of the transition Λ_i of each registered mixer (registry name -> one of "scalar" (a
#: multiple of the identity per head), "diagonal", "diagonal + low rank", "product" (scalar or diagonal
#: times identity + rank one: the delta rule), "dense" (a full block per head: the momentum rule's pair of
#: states), "shift" (nilpotent), "identity" (no decay), "none" (no
#: finite state: attention)), with the detail after a colon. One table for the whole library;
#: tests/test_interop_report.py checks that every registered mixer has an entry.
LAMBDA_STRUCTURE: dict[str, str] = {
    # attention: no finite-state Λ
    "softmax_attention": "none: softmax attention (KV cache)",
    "sliding_window_attention": "none: softmax attention over the last w tokens (a bounded KV cache of w − 1)",
    "fox": "none: softmax attention with forget gate",
    "path_attention": "none: PaTH attention",
    "stickbreaking": "none: stick-breaking attention",
    "moba": "none: block-sparse softmax attention (own block + top-k − 1 past blocks)",
    "nsa": "none: gated compressed + selected-block + sliding-window softmax attention",
    "deltaformer": "none: softmax attention over delta-corrected values, P (I + βP_<)⁻¹",
    "parallax": "none: softmax weights a ⊙ (1 + Σ a s2 − s2), s2 = r·k",
    "wall_attention": "none: softmax of per-channel decayed scores Σ q k exp(G_t − G_s)",
    "bmojo": "none: SSM + sliding-window attention",
    "bmojo_f": "none: SSM + sliding-window attention",
    # window + linear hybrids: a shift register of the window's inputs beside the linear state
    "lolcats": "shift: a w-slot shift register (the window) feeding an identity linear state, [[Shift, 0], [ψ(k_{i−w}) e_wᵀ, I]] "
               "(eigenvalues 0 and 1)",
    "liger_attention": "shift: a w-slot shift register (the window) beside the recurrence's diag(σ(x W_K)^{1/16}) per key channel",
    "hyena": "none: implicit long convolution",
    # linear attention without decay: Λ = I
    "linear_attention": "identity", "separable_attention": "identity", "normalized_attention": "identity",
    "generalized_linear_attention": "identity", "linformer": "identity",
    "based": "identity", "rebased": "identity",
    # scalar per head: Λ_i = α_i·I
    "mamba2": "scalar: exp(Δ_i^h a_h) per head", "ssd": "scalar: exp(Δ_i^h a_h) per head",
    "phi_mamba": "scalar: exp(−softplus(dt_i^h)) per head (discrete, no Δ on the input)",
    "dsf_ssd": "scalar: exp(Δ_i a) shared", "lightning_attention": "scalar: fixed per head", "retnet": "scalar: fixed per head",
    "transnormer": "scalar: fixed per head", "mlstm": "scalar: σ(f_i) per head",
    # diagonal
    "mamba": "diagonal: exp(Δ_i^c A[c, n])", "s6": "diagonal: exp(Δ_i^c A[c, n])", "falcon_mamba": "diagonal: exp(Δ_i^c A[c, n])",
    "jamba_mamba": "diagonal: exp(Δ_i^c A[c, n])", "bilinear_mamba": "diagonal", "strip_mamba": "diagonal", "mamba_gf": "diagonal",
    "s4d": "diagonal (complex, time-invariant)", "lru": "diagonal (complex, time-invariant)", "rwkv4": "diagonal: fixed per channel",
    "rwkv6": "diagonal: data-dependent", "gla": "diagonal: data-dependent", "liger_gla": "diagonal: σ(x W_K)^{1/16} (the key projection)", "hgrn": "diagonal: data-dependent",
    "hgrn2": "diagonal: data-dependent", "metala": "diagonal: data-dependent", "general_form": "diagonal",
    "rg_lru": "diagonal: data-dependent", "rg_lru_block": "diagonal: data-dependent", "qlstm": "diagonal: data-dependent",
    "qlstm_block": "diagonal: data-dependent", "qlstm_rs": "diagonal: data-dependent", "qlstm_rs_block": "diagonal: data-dependent",
    "gsa": "diagonal: per slot", "raven": "diagonal: per slot, exp(−w_i A_h softplus(·)) on the routed slots, 1 on the others", "cyclic_flow_attention": "scalar: exp(−A_h softplus(·)) per head, shared by the m slots (Fourier coordinates of relative time)", "rodimus": "diagonal: exp(−g_i τ_i) per key channel (one head)", "abc": "diagonal: exp(z_{i−1} − z_i) per slot, z the running log-sum-exp of the slot logits", "lightnet": "diagonal: exp(z_{i−1} − z_i), z the running log-sum-exp of the key logits", "h3": "diagonal: shift SSM and diagonal SSM", "gss": "diagonal (time-invariant)",
    # diagonal plus low rank
    "s4": "diagonal + low rank (DPLR, time-invariant)",
    # the delta rule: a product
    "deltanet": "product: I − β_i k_i k_iᵀ", "gated_deltanet": "product: α_i·(I − β_i k_i k_iᵀ)",
    "qwen3_next_gdn": "product: α_i·(I − β_i k_i k_iᵀ)", "kda": "product: (I − β_i k_i k_iᵀ)·Diag(α_i)",
    "kimi_kda": "product: (I − β_i k_i k_iᵀ)·Diag(α_i)",
    "comba": "product: α_i·(I − β_i p_i k_iᵀ) (closed-loop key p)", "precond_gated_deltanet": "product: α_i·(I − β_i k̃_i k_iᵀ) (preconditioned write key k̃)",
    "precond_kda": "product: (I − β_i k̃_i k_iᵀ)·Diag(α_i) (preconditioned write key k̃)", "momentum_deltanet": "dense: 2K×2K per head on the pair (S, M), [[αI − βη kᵀp, −βμ I], [η kᵀp, μ I]]", "mom": "product: α_i·(I − β_i k_i k_iᵀ) per memory, I where the token is not routed there", "gated_deltanet2": "product: (I − k_i (b_i ⊙ k_i)ᵀ)·Diag(α_i) (erase gate b)", "gated_deltaproduct": "product: α_i·Π_j (I − β_j k_j k_jᵀ)",
    "log_linear_gdn": "product: α_i·(I − β_i k_i k_iᵀ) on O(log T) Fenwick states",
    # other structures
    "log_linear_mamba2": "scalar: exp(Δ_i^h a_h) per head, on O(log T) Fenwick states",
    "mesanet": "scalar: γ_i per head (states H and G)", "rwkv7": "diagonal + low rank: Diag(w_i) − (a ⊙ κ̂)ᵀκ̂", "rad_rwkv7": "diagonal + low rank: Diag(w_i) − (a ⊙ κ̂)ᵀκ̂",
    "mamba3": "diagonal (complex, rotary): data-dependent",
    # convolution with a finite state
    "short_conv": "shift: nilpotent (W taps)",
    "rwkv_channel_mix": "shift: nilpotent (2 taps: the token shift μ x_i + (1 − μ) x_(i−1))",
}


def lambda_structure(mixer: Mixer) -> str:
    """The structure of ``mixer``'s Λ_i (:data:`LAMBDA_STRUCTURE` by registry name; for a name not in
    it, read from the class: no finite state -> "none", ``diagonal_transition`` False -> "diagonal +
    low rank", else "diagonal")."""
    s = LAMBDA_STRUCTURE.get(mixer.registry_name)
    if s is not None and getattr(mixer.config, "alibi", False):  # ALiBi: a fixed decay on the map, not a finite state
        return s.replace("softmax attention", "softmax attention with a fixed decay e^{−m_h} per head on the map (ALiBi)")
    r = getattr(mixer.config, "kv_lora_rank", None)
    if s is not None and r:  # MLA: a softmax over a rank-limited key space, the KV cache holds the latent
        R = mixer.config.qk_rope_head_dim
        return s.replace("softmax attention (KV cache)", f"softmax attention over a rank-{r + R} latent key space (MLA: "
                         f"the KV cache holds the latent, {r} + {R} floats per token)")
    if s is not None:
        return s
    cls = type(mixer)
    return "none" if not cls.finite_state else ("diagonal" if cls.diagonal_transition else "diagonal + low rank")


# ------------------------------------------------------------------------------------------
# normalization and gating (the DSF table's columns: docs/mixers.md; the layer report's)
# ------------------------------------------------------------------------------------------

#: the norm modules a mixer may hold (read from its children by :func:`norm_and_gate`), class -> the name shown
_NORM_KINDS: tuple[tuple[type, str], ...] = (
    (RMSNorm, "RMSNorm"), (LayerNorm, "LayerNorm"), (nn.LayerNorm, "LayerNorm"), (nn.GroupNorm, "GroupNorm"),
    *(((nn.RMSNorm, "RMSNorm"),) if hasattr(nn, "RMSNorm") else ()),
)

#: what a norm module acts on, from its attribute name (the part before "_norm", lower case; "norm" alone:
#: the core output o); a name not listed is shown as it is
NORM_PLACES: dict[str, str] = {"": "o", "out": "o", "o": "o", "g": "o", "q": "q", "k": "k", "b": "B", "c": "C", "dt": "Δ"}


def _on(flag, text: str) -> list[str]:
    return [text] if flag else []


def _eta(name: str) -> str:
    return f"normalizer η ({name})"


def _hyena_gates(c) -> list[str]:
    if c.order_convention == "code":
        return [f"x¹ ⊙ v in, x^n ⊙ conv out (n = 2..{c.order})" if c.order > 2 else "x¹ ⊙ v in, x² ⊙ conv out"]
    return [f"x^n ⊙ conv out (n = 1..{c.order})"]


def _ssd_gates(c) -> list[str]:
    where = {"gated": " inside the norm: norm(y ⊙ SiLU(z))", "before_gate": " after the norm: norm(y) ⊙ SiLU(z)", "none": ""}
    return _on(c.block, ("SiLU(z + b_z) (block)" if c.z_bias else "SiLU(z) (block)") + where[c.gate_norm])


def _general_form(c) -> tuple[list[str], list[str]]:
    norms = _on(c.value == "lru", "γ = √(1 − |λ|²) on the input (LRU)") + _on(c.normalizer, _eta(c.normalizer_form))
    gates = (_on(c.gate != "none", f"{c.gate}(x W_g)") + _on(c.expand is not None, f"{c.outer_gate}(z) (block)")
             + _on(c.input_gate != "none", f"input gate {c.input_gate}(x W_i)") + _on(c.key == "sigmoid_proj", "input gate σ(x W_k) (key)")
             + _on(c.value == "gated_identity", "input gate σ(x W_x) ⊙ x"))
    return norms, gates


#: what each mixer class computes that is no module (functional norms: L2, a normalizer η, the softmax; every
#: gate: the block's z branch, output and input gates), read from its config: class name -> mixer ->
#: (norms, gates). Looked up along the class's MRO (a preset or subclass reads as its base class). The norm
#: modules (RMSNorm, LayerNorm, GroupNorm children) and sub-mixers are read by :func:`norm_and_gate` itself,
#: never listed here. Every registered mixer's class needs an entry, even an empty one (checked by
#: :func:`missing_norm_gate_rule` and tests/test_mixer_table.py): "none" in the table then means checked.
NORM_GATE_RULES: dict[str, Callable[[Mixer], tuple[list[str], list[str]]]] = {
    # attention
    "SeparableAttention": lambda m: (_on(m.config.feature_norm == "layernorm", "LayerNorm on q, k per head (γ, β shared)")
                                     + _on(m.config.normalizer != "none", _eta(m.config.normalizer)), []),
    "SoftmaxAttention": lambda m: (["softmax" + (" + a sink e^{z_h} in η (learned, per head)" if m.config.sinks else "")]
                                   + ([f"scores soft-capped: {m.config.softcap:g}·tanh(s/{m.config.softcap:g})"] if m.config.softcap else []),
                                   _on(m.config.output_gate, "σ(x W_g) output gate")),
    "ForgettingAttention": lambda m: (["softmax"], _on(m.config.output_gate, "σ(x W_g) output gate")),
    "PathAttention": lambda m: (["softmax", "l2(w)"], []),
    "StickBreakingAttention": lambda m: ([], []),
    "MoBA": lambda m: (["softmax"], []),
    "DeltaFormer": lambda m: (["softmax (both passes)"], []),
    "Parallax": lambda m: (["softmax"], []),
    "WallAttention": lambda m: (["softmax"], []),
    "NSA": lambda m: (["softmax (three branches)"], ["σ(x W_g) gates on the compressed, selected and window branches"]),  # no normalization: a row's weights sum to at most 1
    "Bmojo": lambda m: (["softmax"], []),  # its Mamba block is a sub-mixer (read as "ssm: ...")
    "LolcatsAttention": lambda m: ([("one η over the window's γ·exp(s − c) and " if m.config.window else "") + "φ(q)ᵀΣψ(k)"], []),
    "LigerAttention": lambda m: (["softmax (window)"] + _general_form(m.config)[0], _general_form(m.config)[1]),
    # convolution
    "GatedShortConv": lambda m: ([], ["b ⊙ x in, c ⊙ conv out"]),
    "RWKVChannelMix": lambda m: ([], ["σ(x_r W_r) receptance gate on W_v relu(x_k W_k)²"]),
    "Hyena": lambda m: ([], _hyena_gates(m.config)),
    "H3": lambda m: ([], ["k̃ ⊙ v in, q ⊙ SSM out" if m.config.head_dim == 1 else "k̃ ⊗ v in, q · SSM out (per head)"]),
    "GSS": lambda m: ([], [f"{m.config.activation}(x W_u) ⊙ SSM out" if m.config.activation != "none" else "x W_u ⊙ SSM out"]),
    # SSMs
    "S4": lambda m: ([], []),
    "S4D": lambda m: ([], []),
    "S6": lambda m: ([], _on(m.config.block, "SiLU(z) (block)")),
    "SSD": lambda m: ([], _ssd_gates(m.config)),
    "Mamba3": lambda m: ([], ["SiLU(z) (block)"]),
    # linear attention and linear RNNs
    "GeneralForm": lambda m: _general_form(m.config),
    "DeltaNet": lambda m: (["l2(q, k)"], _on(m.config.gate, f"{m.config.gate_act}(x W_g)" + (" low-rank" if m.config.gate_rank else ""))
                           + _on(m.config.channel_gates, "σ(x W_w) write gate on v")
                           + _on(m.config.preconditioner == "atk", "ATK preconditioner on the write key")),
    "MesaNet": lambda m: (["l2(q, k)"], _on(m.config.gate, "silu(x W_g)")),
    "Rodimus": lambda m: (["l2(k)"], ["g^τ input gate on k", "σ(u W_i¹ W_i²) value gate", "SiLU(x W_gate) (before the norm)"]),
    "MomentumDeltaNet": lambda m: (["l2(q, k)"], _on(m.config.gate, "SiLU(x W_g) (after the norm)")),
    "MoM": lambda m: (["l2(q, k)"], ["top-k router weights on the memories' outputs"] + _on(m.config.gate, "SiLU(x W_g) (after the norm)")),
    "LightNet": lambda m: ([], ["SiLU(x W_g¹ W_g²) output gate (low rank, after the norm)"]),
    "GatedSlotAttention": lambda m: ([], _on(m.config.output_act == "silu", "SiLU(o) = o ⊙ σ(o) (self-gate, before the norm)")
                                     + _on(m.config.output_gate, ("σ" if m.config.gate_act == "sigmoid" else "SiLU")
                                           + ("(x W_g¹ W_g² + b)" if m.config.gate_rank is not None else "(x W_g)")
                                           + " output gate (after the norm)")
                                     + _on(m.config.slots == "cyclic", "σ(x W_β + b) write strength on the clock's atom")
                                     + _on(m.config.slot_router is not None, "top-k σ router on the slots' writes")),
    "RWKV7": lambda m: (["l2(κ̂)"], ["σ(x G₁) G₂ output gate (low rank)"]
                        + _on(m.config.value_residual, "σ(ν) value-residual mix toward v_first")),
}


def norm_gate_rule(cls: type) -> Callable[[Mixer], tuple[list[str], list[str]]] | None:
    """The entry of :data:`NORM_GATE_RULES` for a mixer class (the first along its MRO), None without one."""
    for k in cls.__mro__:
        if k.__name__ in NORM_GATE_RULES:
            return NORM_GATE_RULES[k.__name__]
    return None


def missing_norm_gate_rule() -> list[str]:
    """Registered mixers whose class has no entry in :data:`NORM_GATE_RULES` (along its MRO)."""
    from ..mixers.base import list_mixers

    return [e.name for e in list_mixers() if norm_gate_rule(e.cls) is None]


def _heads(mixer: nn.Module) -> int:
    for a in ("H", "heads"):
        h = getattr(mixer, a, None)
        if isinstance(h, int) and not isinstance(h, bool):
            return h
    h = getattr(getattr(mixer, "config", None), "heads", None)
    return h if isinstance(h, int) else 1


def _norm_modules(mixer: nn.Module) -> list[str]:
    """The norm modules among ``mixer``'s children, one entry per (kind, scope, weight), their places
    merged: "RMSNorm on Δ, B, C (no weight)", "LayerNorm on o per head", "qk-norm (RMSNorm per head)".
    Scope (o, q, k only): "per head" when the norm has one group per head or normalizes one head's
    width (K, V, head_qk, head_v or headdim of the mixer), "in G groups of heads" for another group
    count (Mamba-2's grouped norm)."""
    H = _heads(mixer)
    widths = {getattr(mixer, a) for a in ("K", "V", "head_qk", "head_v", "headdim") if isinstance(getattr(mixer, a, None), int)}
    merged: dict[tuple[bool, str, str, str], list[str]] = {}  # q and k norms merge with each other only
    for name, mod in mixer.named_children():
        kind = next((k for cls, k in _NORM_KINDS if isinstance(mod, cls)), None)
        if kind is None:
            continue
        stem = name[: -len("norm")].rstrip("_").lower() if name.lower().endswith("norm") else name
        place = NORM_PLACES.get(stem, stem)
        groups = getattr(mod, "groups", None) or getattr(mod, "num_groups", 1)
        dim = getattr(mod, "dim", None) or getattr(mod, "num_channels", None) or (list(getattr(mod, "normalized_shape", [0]))[-1])
        scope = ""
        if place in ("o", "q", "k") and H > 1:
            if groups == H or (groups == 1 and dim in widths):
                scope = " per head"
            elif groups > 1:
                scope = f" in {groups} groups of heads"
        weight = "" if getattr(mod, "weight", None) is not None else " (no weight)"
        merged.setdefault((place in ("q", "k"), kind, scope, weight), []).append(place)
    out = []
    for (_, kind, scope, weight), places in merged.items():
        if places == ["q", "k"]:
            out.append(f"qk-norm ({kind}{scope}{weight})")
        else:
            out.append(f"{kind} on {', '.join(places)}{scope}{weight}")
    return out


def _norms_and_gates(mixer: Mixer) -> tuple[list[str], list[str]]:
    rule = norm_gate_rule(type(mixer))
    fn, gates = rule(mixer) if rule is not None else ([], [])
    norms, gates = _norm_modules(mixer) + list(fn), list(gates)
    for name, sub in mixer.named_children():  # a mixer inside the mixer (B'MOJO's Mamba block): its own, prefixed
        if isinstance(sub, Mixer):
            n, g = _norms_and_gates(sub)
            norms += [f"{name}: {s}" for s in n]
            gates += [f"{name}: {s}" for s in g]
    return norms, gates


def norm_and_gate(mixer: Mixer) -> tuple[str, str]:
    """(normalization, gating) of ``mixer``, "; "-joined, "none" where there is none.

    Normalization: its norm modules, read from its children (RMSNorm / LayerNorm / GroupNorm; what
    they act on from the attribute name, :data:`NORM_PLACES`: "RMSNorm on Δ, B, C", "LayerNorm on o per
    head", "qk-norm (RMSNorm per head)"), then what :data:`NORM_GATE_RULES` reads from its config: L2
    norms (of q and k in the delta rule), the attention normalizer η (the softmax; a linear attention's
    η, DSF eq. 15 and 22). Gating (:data:`NORM_GATE_RULES`): output gates, the block's z branch, input
    gates, the multiplicative gates of the H3 / Hyena family. A mixer held inside the mixer (B'MOJO's
    Mamba block) adds its own, prefixed by its attribute name."""
    norms, gates = _norms_and_gates(mixer)
    return ("; ".join(norms) or "none"), ("; ".join(gates) or "none")


#: the maps of one layer the 90% mass lag averages at most (evenly spaced; a real Mamba has 1536 channels)
LAG_MAPS = 256


def mass_lag(phi: torch.Tensor, q: float = 0.9) -> torch.Tensor:
    """The q-mass lag of maps phi [..., T, T], per map (mean over query rows with mass):
    :func:`seqmix.analysis.mapstats.lag_quantile` — per query i the smallest L (in tokens, i itself
    counted: 1 for a diagonal map) with Σ_(i-L < j <= i) |Φ_ij| >= q·Σ_(j <= i) |Φ_ij|."""
    return lag_quantile(phi, q)


def layer_lag(mixer: Mixer, x: torch.Tensor, *, q: float = 0.9, pieces: Pieces | None = None, block_bytes: int = BLOCK_BYTES,
              max_bytes: int = DEFAULT_MAX_MAP_BYTES, max_maps: int | None = LAG_MAPS) -> float:
    """The mean over ``mixer``'s maps of :func:`mass_lag` on x [1, T, d]: the maps computed a block
    at a time (``block_bytes``) from the recurrence pieces where registered, else ``mixer.phi(x)``
    under ``max_bytes``; never the full [maps, T, T] of a pieces mixer. A pieces mixer with more
    than ``max_maps`` maps (a real Mamba's 1536 channels) is averaged over ``max_maps`` evenly
    spaced ones (the time, not the memory, grows with the maps; None: every map)."""
    T = x.shape[1]
    pieces = pieces if pieces is not None else map_pieces(mixer, x)
    with torch.no_grad():
        if pieces is not None:
            index = list(range(pieces.maps)) if max_maps is None else default_heads(pieces.maps, max_maps)
            step = max(1, block_bytes // (8 * T * T))  # lag_quantile gathers a second [b, T, T]
            total = 0.0
            for i in range(0, len(index), step):
                total += float(mass_lag(pieces.at(index[i:i + step]).float(), q).sum())
            return total / len(index)
        from .show import _maps_of

        check_seq_len(T, _maps_of(mixer, x), max_bytes=max_bytes, what=f"mixer {mixer.registry_name!r} (no blocked map form)")
        phi = mixer.phi(x)[0].detach()
        if phi.is_complex():
            phi = phi.real
        return float(mass_lag(phi.float(), q).mean())


def decay_range(mixer: Mixer, x: torch.Tensor, *, pieces: Pieces | None = None) -> tuple[float, float] | None:
    """(min, max) over the text of the per-step decays |Λ_i| (the diagonal of Λ_i, the scalar or
    diagonal factor of a delta rule's product) of ``mixer`` on x [1, T, d]; None without decays
    (attention)."""
    pieces = pieces if pieces is not None else map_pieces(mixer, x)
    with torch.no_grad():
        if pieces is not None:
            if pieces.gk is None:
                return (1.0, 1.0)
            lam = pieces.gk.to(torch.float64).exp()
        else:
            if not type(mixer).finite_state:
                return None
            lam = mixer.decays(x)
            if lam is None:
                return None
            lam = lam.detach()
            lam = lam.abs() if lam.is_complex() else lam
    return float(lam.min()), float(lam.max())


def _hf_class(model: nn.Module, path: str) -> str:
    """The transformers class a converted layer replaced (the adapter's ``source``), else the mixer's class."""
    parent, _, name = path.rpartition(".")
    try:
        holder = model.get_submodule(parent) if parent else model
    except AttributeError:
        return ""
    return str(getattr(holder, "source", "")) if name == "mixer" and isinstance(getattr(holder, "source", None), str) else ""


def layer_report(model: nn.Module, tokens: torch.Tensor, *, q: float = 0.9, block_bytes: int = BLOCK_BYTES,
                 max_bytes: int = DEFAULT_MAX_MAP_BYTES, max_maps: int | None = LAG_MAPS) -> list[dict]:
    """One dict per sequence-mixing layer of ``model`` on tokens [T], in module order (converted
    mixers, and the layers a conversion kept as transformers' own: ``model.seqmix_kept``):

    index, path (the replaced module's path for a converted layer), family (the transformers class,
    or the seqmix mixer class), mixer (registry name, or "kept: transformers' own"), state (floats
    per sequence after T tokens: ``state_size(T)``), per_token (``state_size(T+1) − state_size(T)``:
    the KV floats per token of attention, 0 for a fixed state), lambda (:func:`lambda_structure`),
    norm, gate (:func:`norm_and_gate`), decay (min, max) (:func:`decay_range`, None: no decays),
    lag (:func:`layer_lag`: the mean q-mass lag of Φ, in tokens). Values of a kept layer are None."""
    tokens = torch.as_tensor(tokens).reshape(-1)
    if tokens.numel() == 0:
        raise ValueError("argument 'tokens' is empty")
    mixers = mixer_layers(model)
    xs = layer_inputs(model, tokens, list(mixers))
    T = int(tokens.numel())
    kept = dict(getattr(model, "seqmix_kept", {}) or {})
    order = {p: i for i, (p, _) in enumerate(model.named_modules())}
    rows = []
    for path, mixer in mixers.items():
        x = xs.pop(path)
        pieces = map_pieces(mixer, x)
        hf = _hf_class(model, path)
        norm, gate = norm_and_gate(mixer)
        shown = path[: -len(".mixer")] if hf else path
        rows.append(dict(
            path=shown, family=hf or type(mixer).__name__, mixer=mixer.registry_name, state=int(mixer.state_size(T)),
            per_token=int(mixer.state_size(T + 1)) - int(mixer.state_size(T)), **{"lambda": lambda_structure(mixer)}, norm=norm,
            gate=gate, decay=decay_range(mixer, x, pieces=pieces),
            lag=layer_lag(mixer, x, q=q, pieces=pieces, block_bytes=block_bytes, max_bytes=max_bytes, max_maps=max_maps), _order=order.get(path, 0)))
        del pieces, x
    for path, cls in kept.items():
        rows.append(dict(path=path, family=str(cls), mixer="kept: transformers' own", state=None, per_token=None, norm=None,
                         gate=None, decay=None, lag=None, _order=order.get(path, 0), **{"lambda": None}))
    rows.sort(key=lambda r: r.pop("_order"))
    for i, r in enumerate(rows):
        r["index"] = i
    return [{k: r[k] for k in REPORT_COLUMNS} for r in rows]


#: (key, column heading) of :func:`layer_report`'s rows, in the order the writers print them
REPORT_HEADINGS = (
    ("index", "#"), ("path", "module"), ("family", "transformers class"), ("mixer", "seqmix mixer"),
    ("state", "state floats (T tokens)"), ("per_token", "+floats / token"), ("lambda", "Λ structure"),
    ("norm", "normalization"), ("gate", "gating"), ("decay", "decay range on text"), ("lag", "90% mass lag (tokens)"),
)
REPORT_COLUMNS = tuple(k for k, _ in REPORT_HEADINGS)


def _cell(key: str, v) -> str:
    if v is None:
        return "—" if key not in ("decay",) else "none"
    if key == "decay":
        return f"{v[0]:.3g} – {v[1]:.3g}"
    if key == "lag":
        return f"{v:.1f}"
    if key in ("state", "per_token"):
        return f"{v:,}"
    return str(v)


def report_markdown(rows: list[dict], *, title: str = "", note: str = "") -> str:
    """The rows of :func:`layer_report` as a Markdown page (a heading, a note, one table)."""
    out = [f"# {title}", ""] if title else []
    if note:
        out += [note, ""]
    out.append("| " + " | ".join(h for _, h in REPORT_HEADINGS) + " |")
    out.append("|" + "|".join("---" for _ in REPORT_HEADINGS) + "|")
    for r in rows:
        out.append("| " + " | ".join(_cell(k, r.get(k)).replace("|", "\\|") for k, _ in REPORT_HEADINGS) + " |")
    return "\n".join(out) + "\n"


def report_html(rows: list[dict], *, title: str = "", note: str = "") -> str:
    """The rows of :func:`layer_report` as one self-contained HTML page."""
    from html import escape

    head = "".join(f"<th>{escape(h)}</th>" for _, h in REPORT_HEADINGS)
    body = "\n".join("<tr>" + "".join(f"<td>{escape(_cell(k, r.get(k)))}</td>" for k, _ in REPORT_HEADINGS) + "</tr>" for r in rows)
    style = ("body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;font-size:13px} "
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left} th{background:#f3f3f3}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{escape(title)}</title><style>{style}</style></head>"
            f"<body><h1>{escape(title)}</h1><p>{escape(note)}</p>\n<table><tr>{head}</tr>\n{body}\n</table></body></html>\n")


#: what the report's columns mean (printed under the table, and in docs/interop.md)
REPORT_NOTE = (
    "state: floats of the layer's decoding state per sequence after the T tokens read (state_size(T)); "
    "+floats/token: state_size(T+1) − state_size(T), the KV floats each token adds to an attention cache (0: a fixed "
    "state). Λ structure: the transition of the layer's DSF. decay range: min – max over the text of the per-step "
    "decays |Λ_i| (diagonal entries; the scalar or diagonal factor of a delta rule's product). 90% mass lag: for each "
    "map (head or channel) of Φ and each query i, the smallest L such that the L most recent positions "
    "i−L+1..i hold 90% of Σ_j |Φ_ij| (1 = only the token itself), averaged over queries and maps (at most 256 evenly "
    "spaced maps of a layer); maps computed a block at a time.")
