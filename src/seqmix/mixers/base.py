"""The Mixer contract, the registry and the Cache (DESIGN.md, "The Mixer contract").

Every registered mixer is an ``nn.Module`` built from a typed config:

    y = mixer(x)                    x, y: [batch, time, d_model]
    y = mixer(x, cache=cache)       reads this layer's state from the cache and writes the
                                    final state back; T == 1 is a decoding step ("step" mode)
    y = mixer(x, context=context)   context: a dict the backbone makes once per forward pass and hands
                                    to every layer in order, for what one layer passes to the later
                                    ones (RWKV-7's value residual: "v_first"); see ``Mixer.uses_context``
    mixer.phi(x)                    [batch, maps, time, time]: the token-mixing map(s) of the core
    mixer.core(x)                   (values, mixed), both [batch, time, maps, P], mixed = phi(x) @ values
    mixer.dsf(x)                    a :class:`~seqmix.dsf.DSF` with dsf(x).evaluate(values) == mixed
    mixer.decays(x)                 [batch, time, N]: the diagonal of Λ_i (dsf(x).lam), None without a finite DSF
                                    (for a diagonal-plus-low-rank Λ_i: its diagonal part, the decays α)
    mixer.spectrum(x)               [batch, time, N]: the eigenvalues of Λ_i (= decays(x) when Λ_i is diagonal)
    mixer.state_size(seq_len)       floats of recurrent state per sequence (the memory budget)
    mixer.mode                      "auto" or one of ``mixer.modes``
    mixer.segment_len               a forward longer than this runs in segments that carry the state
                                    (config ``segment_len``; by default 1024 for finite-state mixers)

A mixer implements ``_forward(x, state, mode) -> MixOut``: the parametrization (how
x becomes q, k, v, decays, gates), one call into ``seqmix.ops``, and the readout.
The ``values`` and ``mixed`` it returns are the core operator's input and output
in that very computation, so the contract tests can tie ``phi`` and ``dsf`` to the
forward pass itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pydantic
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from .._checks import check_choice, check_finite, fmt_shape

# ------------------------------------------------------------------------------------------
# configs
# ------------------------------------------------------------------------------------------


class MixerConfig(BaseModel):
    """Fields every mixer has. Subclasses add their own (typed, with bounds)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    d_model: int = Field(64, gt=0, description="width of the input and output, d")
    mode: str = Field("auto", description="computation mode: 'auto' or one of the mixer's modes")
    segment_len: int | None = Field(
        None, ge=0, description="a forward over more tokens runs in segments of this length, each carrying the state "
        "to the next (the same output up to rounding): None = AUTO_SEGMENT_LEN for finite-state mixers, else never; 0 = never",
    )


#: the segment length of ``segment_len=None`` for a finite-state mixer (``python bench/scaling.py
#: --mixers M --segment-len L``, d_model 128, batch 1): forward+backward per token at T = 16384 over
#: T = 512, whole-sequence pass / segments of 4096 / 2048 / 1024: Mamba-2 1.37 / 1.01-1.03 / 1.03-1.31 /
#: 1.22-1.25, KDA 2.37 / 1.27-1.31 / 0.96-1.11 / 1.00, RWKV-4 (not run) / - / 1.76 / 1.15. A segment's
#: tensors are small enough that the allocator reuses their memory (a tensor of more than 32 MB is
#: mapped fresh from the OS by glibc, its pages faulted in and zeroed on every call: 15-37 faults per
#: token at 16k; RWKV-4's 2048-token intermediates are that big) and stay in cache
AUTO_SEGMENT_LEN = 1024


class ExpandedWidths:
    """For a config with fields ``expand_k`` and ``expand_v``: the key and value widths d_k = expand_k·d_model,
    d_v = expand_v·d_model, and the check that both are positive integers."""

    @property
    def d_k(self) -> int:
        return round(self.expand_k * self.d_model)

    @property
    def d_v(self) -> int:
        return round(self.expand_v * self.d_model)

    def _check_widths(self) -> None:
        for name, e in (("expand_k", self.expand_k), ("expand_v", self.expand_v)):
            w = e * self.d_model
            if abs(w - round(w)) > 1e-9 or round(w) < 1:
                raise ValueError(f"{name} = {e} times d_model = {self.d_model} must be a positive integer")


#: at most this many problems are listed in one config error (then "and N more")
CONFIG_ERROR_PROBLEMS = 3
#: characters of one problem (a longer one is cut with "…"), and of a shown input value
CONFIG_ERROR_CHARS, CONFIG_ERROR_INPUT_CHARS = 500, 60
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w.]*): (?=\S)")


def config_location(loc) -> str:
    """pydantic's error location as the path a user writes: ``data.train[0].seq_len``.

    Left out: pydantic's validator wrappers (``function-after[_check(), CorpusConfig]``)
    and the tags of tagged unions, which seqmix writes as ``field=value`` (``kind=corpus``,
    ``task=mqar``): neither is a field the user could set."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in part or "=" in part or "(" in part:
            continue
        else:
            out += ("." if out else "") + part
    return out


def _short(value) -> str:
    r = repr(value)
    return r if len(r) <= CONFIG_ERROR_INPUT_CHARS else r[: CONFIG_ERROR_INPUT_CHARS - 1] + "…"


def config_error(where: str, exc: pydantic.ValidationError) -> ValueError:
    """Turns a pydantic error into a one-line ValueError naming each bad field: at most
    :data:`CONFIG_ERROR_PROBLEMS` problems, each as ``'field.path': what was expected (got
    value)``, without pydantic's validator names and union tags (:func:`config_location`).
    A validator's message that starts with a field name (``"corpus: ..."``) is placed under
    that field."""
    parts = []
    errors = exc.errors()
    for e in errors[:CONFIG_ERROR_PROBLEMS]:
        loc = config_location(e["loc"])
        msg = " ".join(str(e["msg"]).removeprefix("Value error, ").split())  # one line
        m = _FIELD_PREFIX.match(msg)
        if m:  # "corpus: ..." raised by a validator of the enclosing config
            name = m.group(1)
            if loc != name and not loc.endswith("." + name):
                loc = f"{loc}.{name}" if loc else name
            msg = msg[m.end():]
        inp = e.get("input")
        tag = (e.get("ctx") or {}).get("field")  # a tagged union's unknown tag: show the field's value
        if tag and isinstance(inp, dict) and tag in inp:
            inp = inp[tag]
        got = f" (got {_short(inp)})" if loc and "input" in e and not isinstance(inp, (dict, list, tuple)) \
            and "got " not in msg and repr(inp) not in msg else ""
        part = f"'{loc}': {msg}{got}" if loc else msg
        parts.append(part if len(part) <= CONFIG_ERROR_CHARS else part[: CONFIG_ERROR_CHARS - 1] + "…")
    if len(errors) > CONFIG_ERROR_PROBLEMS:
        parts.append(f"and {len(errors) - CONFIG_ERROR_PROBLEMS} more")
    return ValueError(f"{where}: invalid config: " + "; ".join(parts))


# ------------------------------------------------------------------------------------------
# the cache
# ------------------------------------------------------------------------------------------


def _is_state_object(x) -> bool:
    return not isinstance(x, torch.Tensor) and all(callable(getattr(x, m, None)) for m in ("floats", "nbytes", "map_"))


class Cache:
    """State for stateful inference, one entry per layer (keyed by the module itself).

    Each entry is a dict of named tensors (a mixer decides its names: "S" for a
    recurrence state, "conv" for a short-convolution state, ...) plus optional plain Python
    values (positions), or state objects with ``floats()``, ``nbytes()`` and ``map_(fn)``
    (softmax attention's preallocated :class:`~seqmix.ops.KVCache`, "kv"), which count their
    used part and apply fn to their buffers. The first call with a cache starts from an
    empty state; each call continues where the previous one ended.
    """

    def __init__(self):
        self._layers: dict[nn.Module, dict[str, Any]] = {}

    def get(self, layer: nn.Module) -> dict[str, Any] | None:
        return self._layers.get(layer)

    def set(self, layer: nn.Module, state: dict[str, Any] | None) -> None:
        if state is None:
            self._layers.pop(layer, None)
        else:
            self._layers[layer] = state

    def clear(self) -> None:
        self._layers.clear()

    def __len__(self) -> int:
        return len(self._layers)

    def __contains__(self, layer) -> bool:
        return layer in self._layers

    def _tensors(self):
        for st in self._layers.values():
            for t in st.values():
                if isinstance(t, torch.Tensor):
                    yield t

    def _objects(self):
        """State objects that count and map themselves (a preallocated KV cache)."""
        for st in self._layers.values():
            for t in st.values():
                if _is_state_object(t):
                    yield t

    def floats(self) -> int:
        """Number of floating-point (or complex: counted as 2) entries held, over all layers and the batch
        (state objects: their used part)."""
        n = 0
        for t in self._tensors():
            if t.is_floating_point():
                n += t.numel()
            elif t.is_complex():
                n += 2 * t.numel()
        return n + sum(o.floats() for o in self._objects())

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors()) + sum(o.nbytes() for o in self._objects())

    def map_(self, fn) -> "Cache":
        """Applies fn to every tensor in place (e.g. ``lambda t: t.detach()`` for truncated BPTT,
        ``lambda t: t.index_select(0, idx)`` to reorder the batch for beam search); state objects
        apply it to their buffers (fn must then act on the batch dimension or elementwise)."""
        for st in self._layers.values():
            for key, t in st.items():
                if isinstance(t, torch.Tensor):
                    st[key] = fn(t)
                elif _is_state_object(t):
                    t.map_(fn)
        return self


# ------------------------------------------------------------------------------------------
# the mixer base class
# ------------------------------------------------------------------------------------------


def _compact(state: dict | None) -> dict | None:
    """``state`` with each tensor that is a view of a larger one (a full-sequence call's last token: u[:, -1])
    copied out, so that a cache does not keep the call's activations alive (a prefill of 16k tokens' inputs,
    for a state of one token's)."""
    if not state:
        return state
    out = None
    for key, t in state.items():
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 2 * t.numel() * t.element_size() + 64:
            out = out if out is not None else dict(state)
            out[key] = t.clone()
    return out if out is not None else state


@dataclass
class MixOut:
    """What ``Mixer._forward`` returns.

    y: [B, T, d_model]; state: the layer's state after the last token (a dict, or None
    when the mixer was not asked for it); values, mixed: [B, T, maps, P], the input and
    output of the core map Φ (mixed[:, t, m] = Σ_s Φ[:, m, t, s] values[:, s, m]). ``values``
    and ``mixed`` may each be a function of no arguments that returns them, where they cost work
    that only :meth:`Mixer.core` reads (grouped kv heads repeated per query head; a decoding step's
    own layout).
    """

    y: torch.Tensor
    state: dict[str, Any] | None = None
    values: torch.Tensor | None = None
    mixed: torch.Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class Mixer(nn.Module):
    """Base class of every sequence mixer (see the module docstring for the contract)."""

    #: the family (attention, ssm, recurrent, linear_attention, convolution, hybrid)
    family: ClassVar[str] = ""
    #: modes of the full-sequence forward; "step" (T == 1 with a cache) is implied when decoding works
    modes: ClassVar[tuple[str, ...]] = ()
    #: the mode that is obviously correct; every other mode is tested against it
    reference_mode: ClassVar[str] = "recurrent"
    #: the state size per sequence as a formula of the config (for ``seqmix list``)
    state_formula: ClassVar[str] = ""
    #: what a map of phi(x) is ("head", "channel", ...)
    map_unit: ClassVar[str] = "head"
    #: whether dsf(x) is an exact finite-state system (False for softmax attention, Hyena)
    finite_state: ClassVar[bool] = True
    #: whether Λ_i is diagonal (False for the delta-rule mixers: diagonal plus low rank)
    diagonal_transition: ClassVar[bool] = True
    #: whether ``_forward`` takes ``context=`` (the per-forward dict of :meth:`forward`); False: the
    #: mixer never reads it
    uses_context: ClassVar[bool] = False
    #: the segment length of ``segment_len=None`` (:attr:`segment_len`): None = the rule (AUTO_SEGMENT_LEN
    #: for a finite state without context or FFT mode, else never); a mixer sets its own where the rule
    #: misjudges it (a bounded cache behind a non-finite DSF; large per-token intermediates); 0 = never
    auto_segment_len: ClassVar[int | None] = None
    #: the config class
    Config: ClassVar[type[MixerConfig]] = MixerConfig

    def __init__(self, config: MixerConfig | None = None, **kwargs):
        super().__init__()
        if config is None:
            try:
                config = self.Config(**kwargs)
            except pydantic.ValidationError as e:
                raise config_error(type(self).__name__, e) from None
        elif kwargs:
            raise ValueError(f"{type(self).__name__}: pass either a config or keyword arguments, not both")
        if config.segment_len and self.uses_context:
            raise ValueError(f"{type(self).__name__}: segment_len = {config.segment_len} cannot be used by a mixer that reads the "
                             "per-forward context (its entries cover the whole call's tokens); use segment_len = 0 or None")
        self.config = config
        self.d_model = config.d_model
        self.registry_name = getattr(type(self), "name", type(self).__name__)
        self._mode = "auto"
        self.mode = config.mode

    # -- mode --------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        check_choice("mode", value, ("auto",) + tuple(self.modes), f"{type(self).__name__}")
        self._mode = value

    @property
    def segment_len(self) -> int | None:
        """The length above which :meth:`forward` runs in segments (None: never): the config's
        ``segment_len``, or for None the class's ``auto_segment_len`` where it sets one, else
        ``AUTO_SEGMENT_LEN`` where the state is finite (a fixed size,
        whatever T), the mixer reads no per-forward context and has no FFT mode (S4, S4D, GSS, H3,
        the short conv: their training form is one long convolution, and a segment that starts from
        a state adds the state's free response over the segment: for S4's dense Ā, gigabytes at
        T = 16k)."""
        L = self.config.segment_len
        if L is None:
            L = type(self).auto_segment_len
        if L is None:
            auto = self.finite_state and not self.uses_context and "fft" not in self.modes
            return AUTO_SEGMENT_LEN if auto else None
        return L or None

    # -- the forward pass ------------------------------------------------------------------

    def check_input(self, x) -> None:
        where = f"{type(self).__name__}"
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{where}: argument 'x' must be a torch.Tensor [batch, time, d_model], got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{where}: argument 'x' must have a floating dtype, got {x.dtype}")
        if x.dim() != 3 or x.shape[-1] != self.d_model or x.shape[1] == 0:
            raise ValueError(
                f"{where}: argument 'x' must have shape [batch, time, d_model] = [?, >=1, {self.d_model}], got {fmt_shape(x.shape)}"
            )
        check_finite("x", x, where)

    def forward(self, x: torch.Tensor, cache: Cache | None = None, *, context: dict[str, Any] | None = None) -> torch.Tensor:
        """y [B, T, d] from x [B, T, d] (the module docstring).

        ``context``: side information between the layers of one forward pass. A backbone makes one
        empty dict per pass (per call of ``LanguageModel.hidden``: a prefill, or one decoding step) and
        hands it to every layer in order; a mixer with ``uses_context`` may read what an earlier layer
        wrote and write for the later ones, always about the tokens of this call, so nothing of it
        goes into the cache. The keys in use: "v_first" (RWKV-7's value residual: the first layer's
        values [B, T, d_v]). None (a mixer on its own): the mixer is the first layer."""
        self.check_input(x)
        if context is not None and not isinstance(context, dict):
            raise ValueError(f"{type(self).__name__}: argument 'context' must be a dict or None, got {type(context).__name__}")
        L = self.segment_len
        if L is not None and x.shape[1] > L:
            # segments of L tokens, each starting from the state the previous one left (the contract's
            # split-and-carry test holds every mixer to the one-pass output): a flat cost per token in T
            seg_cache = cache if cache is not None else Cache()
            return torch.cat([self._run(x[:, s:s + L], seg_cache, context) for s in range(0, x.shape[1], L)], 1)
        return self._run(x, cache, context)

    def _run(self, x: torch.Tensor, cache: Cache | None, context: dict | None) -> torch.Tensor:
        """:meth:`forward` of checked inputs over one segment."""
        state = cache.get(self) if cache is not None else None
        mode = "step" if (cache is not None and x.shape[1] == 1 and self.supports_step) else self.mode
        extra = {"context": context} if self.uses_context else {}
        out = self._forward(x, state=state, mode=mode, need_state=cache is not None, **extra)
        if cache is not None:
            cache.set(self, _compact(out.state) if x.shape[1] > 1 else out.state)
        return out.y

    def decode_step(self, x: torch.Tensor, state: dict[str, Any] | None) -> tuple[torch.Tensor, dict[str, Any] | None]:
        """One decoding step without :meth:`forward`'s input checks, for a caller that checked its input once
        (interop's trusted step, DESIGN.md "the decode path"): x [B, 1, d] and this layer's state (a Cache
        entry, or None) -> (y [B, 1, d], the new state). The same computation as ``forward(x, cache)`` with
        the state in that cache (the "step" mode, or the mixer's own mode where it has no step)."""
        mode = "step" if type(self).supports_step is Mixer.supports_step or self.supports_step else self.mode
        if self.uses_context:
            out = self._forward(x, state=state, mode=mode, need_state=True, context=None)
        else:
            out = self._forward(x, state=state, mode=mode, need_state=True)
        return out.y, out.state

    def layer_constant(self, key: str, fn, *params: torch.Tensor):
        """``fn()``, a quantity of the layer that no token changes (a decay made of parameters alone:
        RetNet's γ_h, Mamba's A = −exp(A_log)), computed once and kept for the calls that follow while
        ``params`` (the tensors it is made of) are the same tensors at the same versions, dtypes and devices, in the
        same inference mode; computed anew where
        autograd records them or torch.compile traces (the kept value is Python state)."""
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return fn()
        # (inference mode, dtypes and devices in the stamp: a value made in inference mode cannot be saved for a later
        # backward, and Module.to keeps a parameter's identity and version while changing its dtype or device; the
        # tensors themselves are kept, compared by identity: an id could be reused by a later tensor)
        kept = self.__dict__.get("_layer_constants")
        if kept is None:
            kept = self.__dict__["_layer_constants"] = {}
        inference = torch.is_inference_mode_enabled()
        e = kept.get(key)
        try:
            if e is not None and e[1] is inference:  # (a key always comes with as many tensors)
                for p, (q, version, dtype, device) in zip(params, e[0]):
                    if p is not q or p._version != version or p.dtype != dtype or p.device != device:
                        break
                else:
                    return e[2]
            stamp = tuple([(p, p._version, p.dtype, p.device) for p in params])
        except RuntimeError:  # an inference tensor keeps no version counter: computed anew (no test per tensor first)
            return fn()
        value = fn()
        kept[key] = (stamp, inference, value)
        return value

    def _forward(self, x: torch.Tensor, *, state: dict | None, mode: str, need_state: bool) -> MixOut:
        raise NotImplementedError

    @property
    def supports_step(self) -> bool:
        return True

    # -- the DSF view ---------------------------------------------------------------------

    def core(self, x: torch.Tensor, *, mode: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(values, mixed) of the core map on x, computed by the forward pass in ``mode``
        (default: the reference mode)."""
        self.check_input(x)
        out = self._forward(x, state=None, mode=mode or self.reference_mode, need_state=False)
        return tuple(t() if callable(t) else t for t in (out.values, out.mixed))

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        """The token-mixing map(s) [batch, maps, time, time] of the core operator."""
        raise NotImplementedError(f"{type(self).__name__} does not define phi(x)")

    def dsf(self, x: torch.Tensor, **kwargs):
        """The DSF system (input: the core's values flattened to [batch, T, maps·P]; output: mixed)."""
        raise ValueError(f"{type(self).__name__}: this mixer has no finite-state DSF form")

    def decays(self, x: torch.Tensor) -> torch.Tensor | None:
        """The diagonal of the transition Λ_i over time, [batch, T, N] (complex for complex
        systems), or None when the mixer has no finite-state DSF. Default: ``self.dsf(x).lam``
        (cheap: the DSF builds its B and C only when they are read); a mixer may override it,
        and must then return exactly dsf(x).lam."""
        if not self.finite_state:
            return None
        return self.dsf(x).lam

    def spectrum(self, x: torch.Tensor) -> torch.Tensor | None:
        """The eigenvalues of Λ_i over time, [batch, T, N]: ``decays(x)`` for a diagonal Λ_i;
        mixers with a non-diagonal Λ_i (``diagonal_transition = False``) override it."""
        return self.decays(x)

    def state_size(self, seq_len: int | None = None) -> int:
        """Floats of recurrent state per sequence needed to continue after ``seq_len`` tokens."""
        raise NotImplementedError

    @classmethod
    def example_config(cls) -> dict:
        """A small config for tests and examples: several heads, a chunk size that makes
        short sequences span several chunks."""
        return {"d_model": 16}

    def extra_repr(self) -> str:
        return f"name={self.registry_name!r}, mode={self.mode!r}"


# ------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MixerEntry:
    """A registered name: a mixer class with default config values (a preset)."""

    name: str
    cls: type[Mixer]
    defaults: dict
    description: str
    example: dict

    @property
    def family(self) -> str:
        return self.cls.family

    @property
    def modes(self) -> tuple[str, ...]:
        return self.cls.modes

    @property
    def state_formula(self) -> str:
        return self.cls.state_formula

    def config(self, **overrides) -> MixerConfig:
        try:
            return self.cls.Config(**{**self.defaults, **overrides})
        except pydantic.ValidationError as e:
            raise config_error(f"build_mixer({self.name!r})", e) from None

    def example_config(self) -> dict:
        return {**self.cls.example_config(), **self.example}


_REGISTRY: dict[str, MixerEntry] = {}


def register(name: str, *, description: str = "", defaults: dict | None = None, example: dict | None = None):
    """Class decorator: registers a Mixer subclass under ``name`` (its primary name)."""

    def deco(cls: type[Mixer]) -> type[Mixer]:
        if name in _REGISTRY:
            raise ValueError(f"register: a mixer named {name!r} is already registered")
        cls.name = name
        doc = description or (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else description
        _REGISTRY[name] = MixerEntry(name, cls, dict(defaults or {}), doc or "", dict(example or {}))
        return cls

    return deco


def register_preset(name: str, base: type[Mixer], *, description: str, defaults: dict, example: dict | None = None) -> None:
    """Registers ``name`` as a preset of an existing mixer class: the same code with other
    default config values (how MetaLA's general form expresses RetNet, GLA, ...)."""
    if name in _REGISTRY:
        raise ValueError(f"register_preset: a mixer named {name!r} is already registered")
    _REGISTRY[name] = MixerEntry(name, base, dict(defaults), description, dict(example or {}))


def unregister(name: str) -> MixerEntry:
    """Removes ``name`` from the registry (a mixer or a preset) and returns its entry: for a mixer
    registered in a script or a test that should leave the registry as it found it."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unregister: argument 'name' must be a registered mixer, got {name!r}")
    return _REGISTRY.pop(name)


def mixer_entry(name: str) -> MixerEntry:
    """The registry entry of ``name``: its class, preset defaults, description and example config
    (``entry.example_config()``, the config the contract suite checks). An unknown name: a ValueError
    listing the registered mixers."""
    if not isinstance(name, str) or name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown mixer {name!r}; registered mixers: {known}")
    return _REGISTRY[name]


def build_mixer(name: str, **config) -> Mixer:
    """Builds a registered mixer by name: ``build_mixer("linear_attention", d_model=128, heads=4)``."""
    entry = mixer_entry(name)
    mixer = entry.cls(entry.config(**config))
    mixer.registry_name = name
    return mixer


def list_mixers() -> list[MixerEntry]:
    """Every registered name, sorted by family then name."""
    return sorted(_REGISTRY.values(), key=lambda e: (e.family, e.name))
