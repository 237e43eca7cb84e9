"""The one adapter: a seqmix mixer behind a transformers mixer's call signature and cache.

``InteropMixer(mixer, layer_idx=..., state=STATE_TABLE)`` is called by transformers' block
exactly as the module it replaces: ``forward(hidden_states, cache=None, attention_mask=None,
**kwargs) -> hidden_states`` (the older keywords ``cache_params`` / ``past_key_values`` are
read too). Without a cache it is ``mixer(x)`` (the mixer's own mode: "auto" or what
``from_transformers(mode=...)`` set). With transformers' cache object it maps this layer's
slots of that object to a :class:`seqmix.Cache` entry (the state table: which slot holds
which entry, and how the layouts differ), runs ``mixer(x, cache=...)`` — T == 1 is the
mixer's own decoding step, a longer input a full-sequence mode continuing from the state —
and writes the new state back in transformers' layout. The state therefore lives in
transformers' cache object, where ``generate()`` reorders it for beam search, resets and
offloads it; the seqmix Cache is a per-call view of it. Families with their own state objects
use the state kinds ``stacked`` (RWKV-4's ``state=`` list of [B, d, layers] tensors, this layer's
column) and ``tuple`` (xLSTM's per-layer (C, n, m), the module's second argument), and return
``(output, state)`` as their modules do (``returns_state``).

The decoding step is checked once (DESIGN.md, "the decode path"). The first call with a cache object
(a prefill, or the first step) runs every check above; the adapter then records what it checked
(:class:`_Trust`: the cache object, the batch, width, dtype and device of the input, the tokens
seen, and the objects in this layer's slots of the cache with their version counters). A later
one-token call that matches the record — the same cache object, the slots still holding what this
adapter left there, unmodified (a beam-search reorder, a crop, a reset, an offload or another
model's write replaces or modifies them), no argument the mixer does not take — is a trusted step:
it runs ``mixer.decode_step`` on the seqmix state kept from the previous call, its state updated in
place (:func:`seqmix.ops.states_in_place`; an attention layer's KV cache writes the token into its buffers'
next slot in any case, and hands transformers' layer the views of them), and writes back only the slots
whose seqmix entry is not a view of transformers' tensor. What changes from token to token, ``position_ids`` and the attention
mask, is still checked on every call (by the first layer: the others share its check, ``_VERIFIED``);
the input's finite check and the cache layer's lookups and type checks run on the full path only.
"""

from __future__ import annotations

import functools
import time
import weakref

import torch
from torch import nn

from .._checks import reads_values
from ..hf.modeling import resolve_cache_argument
from ..mixers.base import Cache, Mixer
from ..ops import KVCache
from ..ops.inplace import _IN_PLACE  # (the states_in_place flag, set inline: the trusted step's two calls fewer)
from .table import State

@functools.cache
def _cache_classes():
    """transformers.cache_utils, imported once (the adapter's cache checks run per call: an import statement in
    each would cost the import machinery's calls every time; transformers is not imported at this module's import)."""
    import transformers.cache_utils as cu

    return cu


#: keyword arguments transformers' blocks may pass that do not change a recurrent mixer's output
_HARMLESS = frozenset({"position_ids", "cache_position", "use_cache", "output_attentions", "return_dict", "position_embeddings",
                       "output_router_logits", "output_hidden_states"})  # the last two: MoE hybrids pass them to every layer


class _Verified:
    """The call arguments whose values a converted layer has checked, and what against: transformers hands
    the same ``position_ids`` and ``attention_mask`` tensors to every layer of a forward pass, so the first
    layer's check serves the others (each layer would otherwise read them on the host again). An entry is
    a weak reference to the tensor, its version counter and the check's key (the positions or the mask the
    layer expects); another tensor, one written in place since, or an inference tensor (no version counter)
    is checked again. ``steps``: per key of a trusted decoding step's check (the kind, "padding", "causal" or
    "positions", with what it checked against: the tokens seen for a KV cache, none for a recurrent state), the
    tensor checked last and its version counter (a strong reference to a one-token call's small tensor: the later
    layers of that step find it there, a hybrid's attention and recurrent layers each under their own key)."""

    def __init__(self):
        self._seen: dict = {}
        self.steps: dict = {}

    def __contains__(self, item) -> bool:
        t, key = item
        e = self._seen.get(key)
        return e is not None and e[0]() is t and not t.is_inference() and e[1] == t._version

    def add(self, t: torch.Tensor, key) -> None:
        if t.is_inference():
            return
        if len(self._seen) >= 64:  # the keys of one model: a few per layer kind
            self._seen.clear()
        self._seen[key] = (weakref.ref(t), t._version)


_VERIFIED = _Verified()

#: the state kinds whose slots the trusted step reads through its own copy of the seqmix state where that is
#: not a view of transformers' tensor: their version counters tell a write by anyone else (an attention
#: layer's keys are replaced, never written, by transformers' reorder, crop and reset: their identity tells)
_VERSIONED_KINDS = frozenset({"conv", "recurrent", "linear_cache"})


def _one_token_passes(t, key: tuple, trust) -> bool:
    """A trusted step's check of one sequence's token in one host read: its position (``position_ids`` [1, 1]: the
    tokens seen, or any position after 0 for a recurrent state) or its causal mask row ([1, 1, 1, L]: as many keys
    visible as the rule shows it, min(seen + 1, window)). True where it passes; False where it does not or cannot
    tell (another shape, a tensor whose values are not read): the full check then decides, with its message."""
    if type(t) is not torch.Tensor or not reads_values(t):
        return False
    shape = t.shape
    if key[0] == "positions":
        if shape != (1, 1) and shape != (1,):
            return False
        p = int(t)
        return p == key[1] if key[1] is not None else p >= 1
    if key[0] == "causal" and shape[:-1] == (1, 1, 1):  # [1, 1, 1, L]: the visible keys counted, as the full check does
        n = int((t if t.dtype == torch.bool else t == 0).sum())
        w = trust.window
        return n == (trust.seen + 1 if w is None or trust.seen + 1 < w else w)
    return False


class _Trust:
    """What a fully checked call left (``InteropMixer._trust``), against which a later one-token call is
    matched (module docstring): the cache object (a weak reference where the object takes one: ``owner``, the
    adapter, forgets the record when the cache dies, :func:`_forgetter`), the input's
    batch, width, dtype and device, the tokens seen, the seqmix state, for each row of the state table
    whether that entry is a view of transformers' tensor (an in-place step then needs no write), and the
    objects in this layer's slots (``objs``) with the version counters of the versioned kinds (``versions``, of the
    tensors at the positions ``tensors`` of ``objs``: the next step reads the counters there without a type test)."""

    __slots__ = ("cache", "batch", "lead", "tail", "dtype", "device", "seen", "state", "alias", "objs", "versions",
                 "tensors", "window", "sliding", "columns", "held")

    def __init__(self, cache, x: torch.Tensor, seen: int, state: dict, alias: tuple[bool, ...], objs: tuple, versions: tuple,
                 tensors: tuple, owner: nn.Module):
        try:  # (the owner forgets this record when the cache object dies: the state, a whole KV cache, freed with it)
            self.cache, self.held = weakref.ref(cache, _forgetter(owner)), None
        except TypeError:  # a list or tuple (RWKV-4's, xLSTM's): small, held until the next call
            self.cache, self.held = None, cache
        self.batch, self.dtype, self.device = x.shape[0], x.dtype, x.device
        self.lead, self.tail = (x.shape[0],), (1, x.shape[2])  # a step's x.shape[:-2] and x.shape[-2:]: [batch, 1, width]
        self.seen, self.state, self.alias, self.objs, self.versions, self.tensors = seen, state, alias, objs, versions, tensors
        self.window = None  # the sliding window of the layer's mask (InteropMixer._window), set by the record
        self.sliding = False  # a KV cache's transformers layer is a sliding one (it counts every token seen), set by the record
        self.columns = None  # the "stacked" kind: slot -> this layer's column of the list's tensor (a view), at the first write


def _forgetter(owner: nn.Module):
    """The callback of a record's weak reference to its cache object: ``owner`` (the adapter, held weakly) drops the
    record when the cache dies, so that what the record holds (the seqmix state: a KV cache's buffers, a recurrent
    state) is freed with the cache when ``generate`` returns, not kept until the layer's next call."""
    owner_ref = weakref.ref(owner)

    def forget(cache_ref) -> None:
        adapter = owner_ref()
        trust = adapter.__dict__.get("_trust") if adapter is not None else None
        if trust is not None and trust.cache is cache_ref:
            adapter.__dict__["_trust"] = None

    return forget


def _aliases(t, hf) -> bool:
    """Whether the seqmix entry ``t`` is a view of transformers' tensor(s) ``hf`` (an in-place step on it writes there)."""
    if isinstance(hf, (tuple, list)):
        return False
    return isinstance(t, torch.Tensor) and isinstance(hf, torch.Tensor) and t.device == hf.device \
        and t.untyped_storage().data_ptr() == hf.untyped_storage().data_ptr()


class InteropMixer(nn.Module):
    """A seqmix :class:`~seqmix.mixers.base.Mixer` in the place of a transformers module.

    mixer:     the seqmix mixer (holding the converted weights)
    layer_idx: the layer's index in transformers' cache object
    state:     the state table (rows of :class:`~seqmix.interop.table.State`)
    where:     the module path it replaced (error messages)
    source:    the class name it replaced
    returns_state: return ``(output, state)`` as the replaced module does (RWKV-4, xLSTM)
    aliases:   ``(transformers name, seqmix name)`` submodules exposed under the transformers name
               (``ModuleMap.aliases``: transformers' code that reaches into the replaced module)
    returns_pair: return ``(output, None)`` as an attention module returns (output, weights)
    mask:      what ``attention_mask`` is: "padding" (2D), "causal" (4D attention mask), "ignored"
    positions: check ``position_ids`` against the positions the seqmix state implies
    residual:  the second positional argument is the residual stream, added to the output (BLOOM)
    derived_args: call arguments accepted and not read: the mixer recomputes them (BLOOM's ``alibi``)
    """

    def __init__(self, mixer: Mixer, *, layer_idx: int | None, state: tuple[State, ...], where: str, source: str,
                 returns_state: bool = False, aliases: tuple[tuple[str, str], ...] = (), returns_pair: bool = False,
                 mask: str = "padding", positions: bool = False, layer_arg: str | None = None, residual: bool = False,
                 derived_args: tuple[str, ...] = ()):
        super().__init__()
        self.mixer = mixer
        self.layer_idx = layer_idx
        self.state_table = tuple(state)
        self.where = where
        self.source = source
        self.returns_state = bool(returns_state)
        self.aliases = dict(aliases)
        self.returns_pair = bool(returns_pair)
        self.mask_kind = mask
        self.positions = bool(positions)
        self.layer_arg = layer_arg
        self.residual = bool(residual)
        self.derived_args = tuple(derived_args)
        # (read at every call as plain attributes of the instance: no dict lookup, no nn.Module __getattr__)
        self._trust = None  # the record of the last fully checked call (_Trust), or None
        self._step_fn = None  # compile_decode's compiled decode_step, or None (the mixer's own)
        self._slot_spec = None  # (conv?, slot) of every slot the state table reads, made at the first use

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            alias = self.__dict__.get("aliases", {}).get(name)
            if alias is None:
                raise
            return self.mixer.get_submodule(alias)

    def extra_repr(self) -> str:
        return f"replaces={self.source}, layer_idx={self.layer_idx}"

    def __getstate__(self):
        """What pickling keeps (torch.save(model), a copy to a spawned process): the module without its run-time
        records — the trusted step's record of the last call (a weak reference to a cache object) and
        compile_decode's compiled step (``seqmix.compile_decode`` again after loading); the next call checks
        everything anew."""
        state = self.__dict__.copy()
        state["_trust"] = None
        state["_step_fn"] = None
        return state

    # -- the call ---------------------------------------------------------------------------

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask: torch.Tensor | None = None, *,
                state=None, cache_params=None, past_key_values=None, layer_past=None, **kwargs):
        mixer = self._modules["mixer"]  # (one lookup: nn.Module's __getattr__ and this class's cost a call each)
        if past_key_values is None:  # GPT-NeoX's and BLOOM's attention take their cache as layer_past
            past_key_values = layer_past
        residual = None
        if self.residual:  # BLOOM: the second positional argument is the residual stream
            residual, cache = cache, None
        for name in self.derived_args:  # recomputed by the mixer (ModuleMap.derived_args)
            kwargs.pop(name, None)
        trust = self._trust
        if trust is not None:
            out = self._trusted_step(trust, mixer, hidden_states, cache, state, past_key_values, cache_params, attention_mask,
                                     kwargs, residual)
            if out is not None:
                return out
        where = f"{self.where} ({self.source} -> seqmix {mixer.registry_name!r})"
        if state is not None and cache is not None and state is not cache:
            raise ValueError(f"{where}: pass the decoding state once (got both 'cache' and 'state')")
        # RWKV-4 passes its state list as ``state=``, xLSTM its layer tuple as the second argument
        hf_cache = resolve_cache_argument(cache if cache is not None else state, past_key_values, cache_params, where)
        if self.layer_arg is not None:  # Zamba2's shared attention is told its cache layer by the call
            self._check_layer_arg(kwargs.pop(self.layer_arg, None), where)
        self._check_kwargs(kwargs, where)
        if trust is not None:
            self.__dict__["_trust"] = None  # (a plain attribute: nn.Module's __setattr__ costs a call)
        seqmix_state = self.read_state(hf_cache, where) if hf_cache is not None else None
        if self.mask_kind == "padding":
            self._check_mask(attention_mask, hidden_states, where)
        elif self.mask_kind == "causal":
            self._check_causal_mask(attention_mask, hidden_states, self._cached(hf_cache, seqmix_state), where)
        if self.positions:
            self._check_positions(kwargs.get("position_ids"), hidden_states, self._positions_start(hf_cache, seqmix_state),
                                  where)
        if hf_cache is None:
            y = mixer(hidden_states)
            return self._output(y if residual is None else y + residual, None)
        view = Cache()
        if seqmix_state is not None:
            view.set(mixer, seqmix_state)
        y = mixer(hidden_states, cache=view)
        new_state = view.get(mixer)
        new = self.write_state(hf_cache, new_state, where, tokens=hidden_states.shape[1])
        self._record(hf_cache, hidden_states, new_state, where)
        return self._output(y if residual is None else y + residual, new)

    def _output(self, y, new):
        """What the replaced module returns: (y, None) for an attention module, (y, state) for RWKV-4 and xLSTM."""
        if self.returns_pair:
            return y, None
        return (y, new) if self.returns_state else y

    # -- the trusted step (module docstring) ------------------------------------------------------

    def _slot_objects(self, hf_cache) -> tuple:
        """The objects in this layer's slots of transformers' decoding state, as the trusted step compares them
        (cheap: no checks; an AttributeError, IndexError, KeyError or TypeError where the structure is not the
        one recorded)."""
        kind, i = self.state_table[0].kind, self.layer_idx
        if kind == "kv":
            layer = hf_cache.layers[i]
            return layer, layer.keys, layer.values, getattr(layer, "record_past", None)
        if kind == "layer":
            layer = hf_cache.layers[i]
            return layer, layer.keys
        spec = self._slot_spec
        if spec is None:  # (conv?, slot) of every slot the table reads, once
            spec = self._slot_spec = tuple((row.kind == "conv", j) for row in self.state_table for j in row.slots)
        if kind in ("conv", "recurrent"):
            layer = hf_cache.layers[i]
            out = [layer, layer.record_past]
            for conv, j in spec:
                out += ((layer.conv_states if conv else layer.recurrent_states)[j], layer.has_previous_state[j])
            return tuple(out)
        if kind == "linear_cache":
            return (hf_cache.get_linear_cache(i),)
        return (hf_cache, *[hf_cache[j] for _, j in spec])  # "stacked", "tuple"

    def _record(self, hf_cache, x, state, where: str) -> None:
        """After a fully checked call with a cache: the :class:`_Trust` a later one-token call is matched against
        (none where the mixer kept no state)."""
        if not self.state_table or state is None:
            return
        kind = self.state_table[0].kind
        # the tokens seen (the start of the next call's positions and mask; a recurrent state's next call starts
        # anywhere after position 0, so there it is not read)
        seen = state["kv"].seen if kind == "kv" else self._cached(hf_cache, state) if kind == "layer" else x.shape[1]
        alias = (False,) * len(self.state_table)
        if kind in ("conv", "recurrent", "linear_cache"):  # the entries as views of transformers' tensors, where they are
            state = self.read_state(hf_cache, where)
            if state is None:
                return
            alias = tuple(_aliases(state[row.seqmix], self._hf_tensor(hf_cache, row)) for row in self.state_table)
        if kind in _VERSIONED_KINDS and any(isinstance(o, torch.Tensor) and o.is_inference() for o in self._slot_objects(hf_cache)):
            return  # (no version counters to tell another writer: every call takes the full path)
        trust = self.__dict__["_trust"] = _Trust(hf_cache, x, seen, dict(state), alias, *self._slot_record(hf_cache, kind), self)
        trust.window = self._window()
        trust.sliding = kind == "kv" and hasattr(trust.objs[0], "cumulative_length")  # (the layer a trusted step finds again)

    def _slot_record(self, hf_cache, kind: str) -> tuple[tuple, tuple, tuple]:
        """(:meth:`_slot_objects`, their tensors' version counters for _VERSIONED_KINDS, else (), the positions of
        those tensors in the first)."""
        objs = self._slot_objects(hf_cache)
        if kind not in _VERSIONED_KINDS:
            return objs, (), ()
        tensors = tuple([i for i, o in enumerate(objs) if isinstance(o, torch.Tensor)])
        return objs, tuple([objs[i]._version for i in tensors]), tensors

    def _hf_tensor(self, hf_cache, row):
        """Transformers' tensor of a ``conv`` / ``recurrent`` / ``linear_cache`` row (a tuple for a row of several slots)."""
        if row.kind == "linear_cache":
            return hf_cache.get_linear_cache(self.layer_idx)
        ts = tuple(self._get(hf_cache, row.kind, j) for j in row.slots)
        return ts if isinstance(row.index, tuple) else ts[0]

    def _trusted_step(self, trust, mixer, x, cache, state, past_key_values, cache_params, mask, kwargs, residual):
        """The trusted step (module docstring), or None where the call does not match ``trust`` (the full path
        then runs, checking everything and recording anew)."""
        hf = cache if cache is not None else state if state is not None else past_key_values \
            if past_key_values is not None else cache_params
        if hf is None or hf is not (trust.held if trust.cache is None else trust.cache()) or type(x) is not torch.Tensor:  # (a tensor subclass: the full path)
            return None
        for other in (cache, state, past_key_values, cache_params):
            if other is not None and other is not hf:
                return None
        # (the checks below in plain comparisons and loops: no builtin called per step)
        shape = x.shape  # [batch, 1, width] as recorded
        if shape[-2:] != trust.tail or shape[:-2] != trust.lead or x.dtype != trust.dtype or x.device != trust.device:
            return None
        for name in kwargs:  # an argument the mixer does not take, given: the full path (which refuses it)
            if name not in _HARMLESS and kwargs[name] is not None:
                if name != self.layer_arg or int(kwargs[name]) != self.layer_idx:
                    return None
        kind = self.state_table[0].kind
        try:
            objs = self._slot_objects(hf)
            # (the positions the record found tensors at; an object replaced there by a non-tensor raises AttributeError,
            # one replaced at any position fails the identity test below)
            if kind in _VERSIONED_KINDS and tuple([objs[i]._version for i in trust.tensors]) != trust.versions:
                return None
        except (AttributeError, IndexError, KeyError, TypeError, RuntimeError):
            return None
        for a, b in zip(objs, trust.objs):  # (as many as recorded: _slot_objects' length is fixed by the kind and the table)
            if a is not b:
                return None
        pos = kwargs.get("position_ids") if self.positions else None
        if (mask is not None and self.mask_kind != "ignored") or pos is not None:
            self._step_checks(mixer, x, mask, pos, trust)
        step = self._step_fn or mixer.decode_step
        if kind == "kv":  # a KV cache: its step writes the token into the buffers' next slot whatever the context
            y, new = step(x, trust.state)
            layer = objs[0]  # (the layer the step checked, the recorded one: no lookup)
            keys, values = self._put_kv(layer, new["kv"], trust.sliding)
            trust.objs = (layer, keys, values, objs[3])  # what _slot_objects reads after the write
            out = hf
        else:
            _IN_PLACE.append(True)  # (seqmix.ops.states_in_place, inline)
            try:
                y, new = step(x, trust.state)
            finally:
                _IN_PLACE.pop()
            if kind == "layer":  # the state beside the row ids on the cache layer: the slots are (layer, its new keys)
                layer = objs[0]
                self._put_layer_step(layer, new, trust)
                trust.objs = (layer, layer.keys)
                trust.seen += 1
                trust.state = new
                if residual is not None:
                    y = y + residual
                return (y, None) if self.returns_pair else (y, hf) if self.returns_state else y
            out, replaced = self._write_trusted(hf, trust, new)
            if replaced:  # (else every entry was written in place, in transformers' own tensors: the same objects)
                objs = self._slot_objects(hf)
            if kind in _VERSIONED_KINDS:
                # (inline, as in the check above and in _slot_record: a helper would cost a Python call per step)
                try:  # the tensors sit where the record found them (the step writes tensors into tensor slots only)
                    trust.versions = tuple([objs[i]._version for i in trust.tensors])
                except AttributeError:  # (a slot of another type there: recorded anew)
                    objs, trust.versions, trust.tensors = self._slot_record(hf, kind)
            trust.objs = objs
        trust.seen += 1
        trust.state = new
        if residual is not None:
            y = y + residual
        return (y, None) if self.returns_pair else (y, out) if self.returns_state else y

    def _step_checks(self, mixer, x, mask, pos, trust) -> None:
        """A trusted step's per-token checks: the attention mask and ``position_ids`` against the tokens seen,
        each read by the first layer of the step that is handed the tensor (the later ones find it in
        ``_VERIFIED.steps``: the same tensor, key and version)."""
        steps, where = _VERIFIED.steps, None
        kv_like = self.state_table[0].kind in ("kv", "layer")
        for t, is_pos in ((mask if self.mask_kind != "ignored" else None, False), (pos, True)):
            if t is None:
                continue
            if is_pos:
                key = ("positions", trust.seen if kv_like else None, 1)
            else:
                key = ("padding", 1) if self.mask_kind == "padding" else ("causal", trust.seen, 1, trust.window)
            e = steps.get(key)
            if e is not None and e[0] is t and e[1] == t._version:
                continue
            if not _one_token_passes(t, key, trust):  # (else the full check: it passes the same or names what is wrong)
                where = where or f"{self.where} ({self.source} -> seqmix {mixer.registry_name!r})"
                self._full_step_check(t, x, key, trust, where)
            if isinstance(t, torch.Tensor) and not t.is_inference():
                if len(steps) >= 8:  # (a few keys per step: the earlier steps' go, keyed by other tokens seen; all where none is)
                    old = [k for k in steps if k[0] != "padding" and k[1] is not None and k[1] != trust.seen]
                    for k in old or list(steps):
                        del steps[k]
                steps[key] = (t, t._version)

    def _full_step_check(self, t, x, key, trust, where: str) -> None:
        """A step check of ``_step_checks`` by the full path's checks (which raise naming what is wrong)."""
        if key[0] == "padding":
            self._check_mask(t, x, where)
        elif key[0] == "causal":
            self._check_causal_mask(t, x, trust.seen, where)
        else:
            self._check_positions(t, x, key[1], where)

    def _write_trusted(self, hf, trust, new: dict):
        """The trusted step's write of a ``conv`` / ``recurrent`` / ``linear_cache`` / ``stacked`` / ``tuple`` state
        (the ``kv`` and ``layer`` kinds are written by :meth:`_trusted_step` itself): what :meth:`write_state` writes,
        without its lookups and checks, and nothing for an entry updated in place as a view of transformers' tensor.
        Returns (what the module hands back, whether anything was written: else transformers' slots hold the objects
        they held)."""
        kind = self.state_table[0].kind
        if kind == "stacked" or kind == "tuple":  # (never views of transformers' tensors: every row is written)
            return self._write_listed(hf, trust, new, kind), False
        alias = list(trust.alias)
        todo = []
        for n, row in enumerate(self.state_table):
            t = new[row.seqmix]
            if alias[n] and t is trust.state.get(row.seqmix):
                continue  # written in place, in transformers' own tensor
            alias[n] = False
            todo.append(row)
        trust.alias = tuple(alias)
        if not todo:
            return hf, False
        if kind == "linear_cache":
            row = todo[0]
            t = new[row.seqmix]
            hf.set_linear_cache(self.layer_idx, row.to_hf(t) if row.to_hf else t)
            trust.alias = (_aliases(t, hf.get_linear_cache(self.layer_idx)),)
            return hf, True
        return self._write_rows(hf, todo, new, hf.layers[self.layer_idx] if kind in ("conv", "recurrent") else None), True

    def _write_listed(self, hf, trust, new: dict, kind: str):
        """The trusted step's write of a ``stacked`` state (each entry into this layer's column of the list's tensors,
        through views kept on the record: the tensors the trusted step finds in the slots by identity; returns the
        list) or a ``tuple`` state (returns the new tuple, the layer's tuple ``hf`` unchanged). Either way the slots
        of ``hf`` hold the objects they held."""
        stacked = kind == "stacked"
        if stacked:
            cols = trust.columns
            if cols is None:
                i = self.layer_idx
                cols = trust.columns = {j: hf[j][:, :, i] for row in self.state_table for j in row.slots}
        else:
            cols = list(hf)
        for row in self.state_table:
            t = new[row.seqmix]
            if row.to_hf is not None:
                t = row.to_hf(t)
            for j, v in (zip(row.index, t) if type(row.index) is tuple else ((row.index, t),)):
                if stacked:
                    cols[j].copy_(v)
                else:
                    cols[j] = v
        return hf if stacked else tuple(cols)

    def _check_layer_arg(self, layer, where: str) -> None:
        """``ModuleMap.layer_arg``: the cache layer index the caller passes must be this adapter's (the N
        of ``layers.N.`` in its path: one converted module per use of a shared block)."""
        if layer is not None and int(layer) != self.layer_idx:
            raise ValueError(f"{where}: argument {self.layer_arg!r} = {layer} is not this converted module's layer "
                             f"{self.layer_idx} (a shared block is converted once per use, each use keeping its own state)")

    @staticmethod
    def _check_kwargs(kwargs: dict, where: str) -> None:
        if kwargs.keys() <= _HARMLESS:  # (the common case: one set comparison)
            return
        bad = sorted(k for k, v in kwargs.items() if v is not None and k not in _HARMLESS)
        if bad:
            raise ValueError(f"{where}: argument(s) {', '.join(repr(k) for k in bad)} are not supported by the converted "
                             "mixer (packed sequences, seq_idx and kernel options have no seqmix equivalent yet)")

    @staticmethod
    def _check_mask(mask, x, where: str) -> None:
        """transformers zeroes padded positions inside the mixer (before in_proj and after the conv);
        the seqmix mixers take no padding mask, so only an all-ones mask is accepted."""
        if mask is None:
            return
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise ValueError(f"{where}: argument 'attention_mask' must be a 2D padding mask [batch, time] or None, got "
                             f"{type(mask).__name__ if not isinstance(mask, torch.Tensor) else list(mask.shape)}")
        if (mask, ("padding", x.shape[1])) in _VERIFIED or not reads_values(mask):
            return
        if bool((mask[:, -x.shape[1]:] != 0).all()):
            _VERIFIED.add(mask, ("padding", x.shape[1]))
        else:
            raise ValueError(f"{where}: argument 'attention_mask' has padding (zeros): the converted seqmix mixer takes no "
                             "padding mask; pass prompts of equal length (no padding) or one prompt at a time")

    def _window(self):
        """The sliding window of transformers' mask for this slot: the mixer's own for a converted attention
        (the ``kv`` kind); none for a finite-state mixer in an attention slot (the ``layer`` kind: the slot's
        mask is the full causal one, whatever window the mixer keeps inside its state)."""
        if self.state_table and self.state_table[0].kind == "layer":
            return None
        return getattr(self._modules["mixer"].config, "window", None)

    def _cached(self, hf_cache, state) -> int:
        """Tokens already in the decoding state (positions and masks of this call start there)."""
        if state is None:
            return 0
        if "kv" in state:
            return state["kv"].seen
        return self._attention_layer(hf_cache, "").get_seq_length()

    def _check_causal_mask(self, mask, x, start: int, where: str) -> None:
        """transformers' attention takes a 4D mask [B, 1, T, L] (bool: True = visible; float: 0 =
        visible) built from the padding mask and the causal / sliding-window rule, or None (SDPA's
        is_causal). The seqmix mixer applies the causal (windowed) rule itself and takes no padding,
        so the mask must be exactly that rule: query i (absolute position p = the cached tokens + i)
        sees min(p + 1, window) keys. Padding (or any other mask) hides some and is refused."""
        if mask is None:
            return
        if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
            what = list(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"{where}: argument 'attention_mask' must be transformers' 4D attention mask [batch, 1, query, key] "
                             f"or None, got {what} (use attn_implementation 'eager' or 'sdpa')")
        T = x.shape[1]
        w = self._window()
        key = ("causal", start, T, w)
        if (mask, key) in _VERIFIED or not reads_values(mask):
            return
        visible = mask if mask.dtype == torch.bool else mask == 0
        seen = visible[..., -T:, :].sum(-1, dtype=torch.int32)  # [B, 1, T]: keys each query sees (int32: half int64's bytes)
        expect = torch.arange(start + 1, start + T + 1, device=mask.device)
        if w is not None:
            expect = expect.clamp(max=w)
        if bool((seen == expect).all()):
            _VERIFIED.add(mask, key)
        else:
            raise ValueError(f"{where}: argument 'attention_mask' has padding (or is not the causal"
                             f"{' sliding-window' if w else ''} mask): the converted seqmix attention applies the causal mask "
                             "itself and takes no padding mask; pass prompts of equal length (no padding) or one prompt at a time")

    def _positions_start(self, hf_cache, state) -> int | None:
        """The position of this call's first token as the seqmix state implies it: 0 without a state, the cached
        tokens for a KV cache or a ``layer`` state; None for a recurrent state (consecutive positions after 0:
        the reset happened at the start)."""
        if state is None:
            return 0
        if "kv" in state or (self.state_table and self.state_table[0].kind == "layer"):
            return self._cached(hf_cache, state)
        return None

    def _check_positions(self, position_ids, x, start: int | None, where: str) -> None:
        """The seqmix mixer takes its positions from its state (RoPE: the KV cache's token count;
        RecurrentGemma's reset: whether a state exists), so ``position_ids`` must be those: start ..
        start + T − 1 (:meth:`_positions_start`; None: any consecutive positions after position 0)."""
        if position_ids is None:
            return
        if type(position_ids) is torch.Tensor and (position_ids, ("positions", start, x.shape[1])) in _VERIFIED:
            return  # (an earlier layer of this call checked the same tensor: one lookup, before any other work)
        given = pos = torch.as_tensor(position_ids)
        if not reads_values(pos):  # the check reads the positions
            return
        T = x.shape[1]
        if pos.dim() == 1:
            pos = pos[None]
        if pos.dim() != 2 or pos.shape[-1] != T:
            raise ValueError(f"{where}: argument 'position_ids' must be [batch, {T}], got {list(pos.shape)}")
        key = ("positions", start, T)
        if (given, key) in _VERIFIED:
            return
        if start is None:
            start = int(pos[0, 0])
            if start < 1:
                raise ValueError(f"{where}: argument 'position_ids' starts at {start} although the cache holds a state: "
                                 "position 0 resets RecurrentGemma's recurrence, which the converted mixer does only at the start")
        expect = start if T == 1 else torch.arange(start, start + T, device=pos.device)
        if bool((pos == expect).all()):
            _VERIFIED.add(given, key)
        else:
            raise ValueError(f"{where}: argument 'position_ids' must be the consecutive positions {start}..{start + T - 1} of "
                             "this call's tokens after the cached prefix (the converted mixer takes positions from its state); "
                             "got other positions (generate() derives them from a padding 'attention_mask'; or packed "
                             "sequences): pass prompts of equal length (no padding)")

    # -- the state: transformers' cache object <-> a seqmix Cache entry ------------------------

    def _layer(self, hf_cache, where: str):
        LinearAttentionCacheLayerMixin = _cache_classes().LinearAttentionCacheLayerMixin
        layers = getattr(hf_cache, "layers", None)
        if self.layer_idx is None or layers is None or self.layer_idx >= len(layers) \
                or not isinstance(layers[self.layer_idx], LinearAttentionCacheLayerMixin):
            raise ValueError(f"{where}: argument 'cache' ({type(hf_cache).__name__}) has no linear-attention layer "
                             f"{self.layer_idx}: build it as DynamicCache(config=model.config), as the model does")
        if hf_cache.is_recording_past(self.layer_idx):
            raise ValueError(f"{where}: the cache records past states (assisted decoding / cropping): not supported by "
                             "the converted mixer")
        return layers[self.layer_idx]

    def _check_container(self, hf_state, where: str) -> None:
        """The ``stacked`` and ``tuple`` kinds: a list / tuple of tensors with the slots the table reads."""
        kind = self.state_table[0].kind
        need = max(i for row in self.state_table for i in row.slots) + 1
        ok = isinstance(hf_state, (list, tuple)) and len(hf_state) >= need and all(isinstance(t, torch.Tensor) for t in hf_state)
        if ok and kind == "stacked":
            ok = self.layer_idx is not None and all(t.dim() == 3 and self.layer_idx < t.shape[-1] for t in hf_state)
        if not ok:
            what = (f"a list of at least {need} tensors [batch, channels, layers] holding layer {self.layer_idx}"
                    if kind == "stacked" else f"this layer's tuple of at least {need} state tensors")
            raise ValueError(f"{where}: argument 'state' must be {what} (as the model builds it), got "
                             f"{type(hf_state).__name__}")

    def _get(self, hf_cache, kind: str, slot: int):
        if kind == "conv":
            return hf_cache.get_conv_state(self.layer_idx, state_idx=slot)
        if kind == "recurrent":
            return hf_cache.get_recurrent_state(self.layer_idx, state_idx=slot)
        if kind == "stacked":
            return hf_cache[slot][:, :, self.layer_idx]
        return hf_cache[slot]  # "tuple"

    def read_state(self, hf_cache, where: str = "") -> dict | None:
        """This layer's seqmix state from transformers' decoding state, or None (nothing read yet)."""
        if not self.state_table:
            return None
        if self.state_table[0].kind == "kv":
            return self._read_kv(hf_cache, where)
        if self.state_table[0].kind == "linear_cache":
            return self._read_linear_cache(hf_cache, where)
        if self.state_table[0].kind == "layer":
            return self._read_layer_state(hf_cache, where)
        if self.state_table[0].kind in ("conv", "recurrent"):
            self._layer(hf_cache, where)
        else:
            self._check_container(hf_cache, where)
        state = {}
        for row in self.state_table:
            ts = tuple(self._get(hf_cache, row.kind, i) for i in row.slots)
            if any(t is None for t in ts):
                return None
            t = ts if isinstance(row.index, tuple) else ts[0]
            state[row.seqmix] = row.to_seqmix(t) if row.to_seqmix else t
        return state

    def write_state(self, hf_cache, state: dict | None, where: str = "", *, tokens: int = 0):
        """Writes the mixer's new seqmix state into transformers' decoding state (in place where the slot
        exists, as transformers does, so that static addresses are kept) and returns the state object the
        replaced module would return: the cache / list itself, or (``tuple`` kind) the new tuple.
        ``tokens``: the tokens of this call (the ``layer`` kind counts them for transformers)."""
        if not self.state_table or state is None:
            return hf_cache
        kind = self.state_table[0].kind
        if kind == "kv":
            self._write_kv(hf_cache, state, where)
            return hf_cache
        if kind == "layer":
            self._write_layer_state(hf_cache, state, tokens, where)
            return hf_cache
        if kind == "linear_cache":
            self._linear_cache_object(hf_cache, where)
            for row in self.state_table:
                if state.get(row.seqmix) is None:
                    raise ValueError(f"{where}: the mixer's state has no entry {row.seqmix!r} (state table of {self.source})")
                t = state[row.seqmix]
                hf_cache.set_linear_cache(self.layer_idx, row.to_hf(t) if row.to_hf else t)
            return hf_cache
        for row in self.state_table:
            if row.seqmix not in state or state[row.seqmix] is None:
                raise ValueError(f"{where}: the mixer's state has no entry {row.seqmix!r} (state table of {self.source})")
        return self._write_rows(hf_cache, self.state_table, state, self._layer(hf_cache, where) if kind in ("conv", "recurrent") else None)

    def _write_rows(self, hf_cache, rows, state: dict, layer):
        """Writes the entries of ``rows`` (a ``conv`` / ``recurrent`` / ``stacked`` / ``tuple`` table's) into
        transformers' state: in place where the slot holds a tensor of the shape (``layer``: this layer's cache
        layer for conv / recurrent rows). Returns the cache / list itself, or (``tuple``) the new tuple."""
        i = self.layer_idx
        out = list(hf_cache) if self.state_table[0].kind == "tuple" else None
        for row in rows:
            t = state[row.seqmix]
            t = row.to_hf(t) if row.to_hf else t
            for slot, v in zip(row.slots, t if isinstance(row.index, tuple) else (t,), strict=True):
                if row.kind == "tuple":
                    out[slot] = v
                elif row.kind == "stacked":
                    hf_cache[slot][:, :, i] = v
                else:
                    held = layer.conv_states if row.kind == "conv" else layer.recurrent_states
                    prev = held[slot] if layer.has_previous_state[slot] else None
                    if prev is not None and prev.shape == v.shape:
                        if prev is not v:
                            prev.copy_(v)
                    elif row.kind == "conv":  # first write (or after reset): transformers allocates the slot, width = v's
                        hf_cache.update_conv_state(v, i, state_idx=slot, conv_kernel_size=v.shape[-1])
                    else:
                        hf_cache.update_recurrent_state(v, i, state_idx=slot)
                    layer.has_previous_state[slot] = True
        return tuple(out) if out is not None else hf_cache

    # -- the "linear_cache" kind: a cache object's get_linear_cache / set_linear_cache (MiniMaxCache) ----

    def _linear_cache_object(self, hf_cache, where: str) -> None:
        if self.layer_idx is None or not (hasattr(hf_cache, "get_linear_cache") and hasattr(hf_cache, "set_linear_cache")):
            raise ValueError(f"{where}: argument 'cache' ({type(hf_cache).__name__}) has no get_linear_cache / set_linear_cache "
                             f"for layer {self.layer_idx}: pass the model's own cache class (MiniMaxCache), as the model builds it")
        layers = getattr(hf_cache, "layers", None) or []
        if self.layer_idx < len(layers) and getattr(layers[self.layer_idx], "record_past", False):
            raise ValueError(f"{where}: the cache records past states (assisted decoding / cropping): not supported by "
                             "the converted mixer")

    def _read_linear_cache(self, hf_cache, where: str) -> dict | None:
        self._linear_cache_object(hf_cache, where)
        t = hf_cache.get_linear_cache(self.layer_idx)
        if not isinstance(t, torch.Tensor):  # None, or [] for a layer not written yet
            return None
        row = self.state_table[0]
        return {row.seqmix: row.to_seqmix(t) if row.to_seqmix else t}

    # -- the "kv" kind: seqmix's KVCache kept in a DynamicCache's attention layer ------------------

    # -- the "layer" kind: a finite-state mixer's whole state kept on a DynamicCache's attention layer ----

    def _attention_layer(self, hf_cache, where: str):
        DynamicLayer = _cache_classes().DynamicLayer
        layers = getattr(hf_cache, "layers", None)
        if self.layer_idx is not None and layers is not None and getattr(hf_cache, "layer_class_to_replicate", None) is not None:
            while len(layers) <= self.layer_idx:  # a DynamicCache() without config creates its layers lazily
                layers.append(hf_cache.layer_class_to_replicate())
        if self.layer_idx is None or layers is None or self.layer_idx >= len(layers) or type(layers[self.layer_idx]) is not DynamicLayer:
            got = type(layers[self.layer_idx]).__name__ if layers is not None and self.layer_idx is not None \
                and self.layer_idx < len(layers) else "no such layer"
            raise ValueError(f"{where}: argument 'cache' ({type(hf_cache).__name__}) layer {self.layer_idx} is {got}; the "
                             "seqmix mixer in this attention slot keeps its recurrent state on a DynamicLayer of a "
                             "DynamicCache(config=model.config) (static, quantized and offloaded caches are not supported)")
        return layers[self.layer_idx]

    def _read_layer_state(self, hf_cache, where: str) -> dict | None:
        """The state this adapter last wrote on its cache layer. The layer's ``keys`` hold each row's index in that
        state (row ids broadcast over the tokens): when transformers has moved the rows since (beam search's
        ``reorder_cache``, ``batch_select_indices``, ``batch_repeat_interleave``: an index on the batch axis of
        ``keys``), the ids it left say where each new row comes from, and the state follows by the same
        ``index_select``. A crop (fewer tokens than the state has read) or a layer this adapter did not write
        cannot be followed: refused."""
        layer = self._attention_layer(hf_cache, where)
        if not layer.is_initialized or layer.keys is None or layer.get_seq_length() == 0:
            return None
        keys, mine = layer.keys, getattr(layer, "_seqmix_keys", None)
        if keys is mine:
            return layer._seqmix_state
        if mine is None or keys.dim() != 4 or keys.shape[1:] != mine.shape[1:]:
            raise ValueError(f"{where}: argument 'cache' layer {self.layer_idx} was changed outside the converted mixer (a crop, "
                             "or a cache filled by another model): the recurrent state of the seqmix mixer in this attention "
                             "slot cannot follow; decode from a fresh cache")
        rows = keys[:, 0, 0, 0].to(torch.long)  # [B']: new row j continues old row rows[j] (no host read)
        view = Cache()
        view.set(self.mixer, dict(layer._seqmix_state))
        view.map_(lambda t: t.index_select(0, rows.to(t.device)))
        return view.get(self.mixer)

    def _write_layer_state(self, hf_cache, state: dict, tokens: int, where: str) -> None:
        self._put_layer_state(self._attention_layer(hf_cache, where), state, tokens, where)

    def _put_layer_state(self, layer, state: dict, tokens: int, where: str = "") -> None:
        """:meth:`_write_layer_state` on the cache ``layer`` itself (the trusted step has it already): keeps ``state``
        on it beside ``keys`` = ``values`` = the row ids 0..B-1 (float32) broadcast to [B, 1, seen, 1] (a stride-0
        view: no memory per token), so that transformers' sizes, masks and positions count the tokens seen and its
        batch reorderings (beam search) leave the row ids for :meth:`_read_layer_state`."""
        ref = next((t for t in state.values() if isinstance(t, torch.Tensor)), None)
        if ref is None:  # a KV cache (sliding-window attention placed in an attention slot): its buffers
            ref = next((t.k for t in state.values() if isinstance(t, KVCache) and t.k is not None), None)
        if ref is None:
            raise ValueError(f"{where}: the mixer's state holds no tensor (state table of {self.source})")
        seen = (layer.get_seq_length() if layer.is_initialized and layer.keys is not None else 0) + tokens
        batch = ref.shape[0]
        rows = getattr(layer, "_seqmix_rows", None)  # made once per batch size, not at every step
        if rows is None or rows.shape[0] != batch or rows.device != ref.device:
            rows = layer._seqmix_rows = torch.arange(batch, dtype=torch.float32, device=ref.device).view(batch, 1, 1, 1)
        keys = rows.expand(batch, 1, seen, 1)
        if not layer.is_initialized:
            layer.lazy_initialization(keys, keys)
        layer.keys, layer.values = keys, keys
        layer._seqmix_keys, layer._seqmix_state = keys, state

    def _put_layer_step(self, layer, state: dict, trust) -> None:
        """:meth:`_put_layer_state` of a trusted step (one token; ``layer`` holds this adapter's keys, checked by the
        step): the row ids of the recorded call, broadcast to the tokens seen after this one."""
        rows = layer.__dict__.get("_seqmix_rows")
        if rows is None or rows.shape[0] != trust.batch:  # (not written by _put_layer_state for this batch)
            self._put_layer_state(layer, state, 1)
            return
        keys = rows.expand(trust.batch, 1, trust.seen + 1, 1)
        layer.keys = layer.values = layer._seqmix_keys = keys
        layer._seqmix_state = state

    def _kv_layer(self, hf_cache, where: str):
        cu = _cache_classes()
        layers = getattr(hf_cache, "layers", None)
        if self.layer_idx is not None and layers is not None and getattr(hf_cache, "layer_class_to_replicate", None) is not None:
            while len(layers) <= self.layer_idx:  # a DynamicCache() without config creates its layers lazily, as update() does
                layers.append(hf_cache.layer_class_to_replicate())
        if self.layer_idx is None or layers is None or self.layer_idx >= len(layers):
            raise ValueError(f"{where}: argument 'cache' ({type(hf_cache).__name__}) has no attention layer {self.layer_idx}: "
                             "build it as DynamicCache(config=model.config), as the model does")
        layer = layers[self.layer_idx]
        w = self._window()
        want = cu.DynamicLayer if w is None else cu.DynamicSlidingWindowLayer
        # a hybrid layer of the cache (Zamba2's hybrid layers, Falcon-H1's parallel attention + Mamba-2) keeps the
        # keys and values in the same dynamic layer, beside the Mamba layer's conv / recurrent states
        hybrid = cu.LinearAttentionAndFullAttentionLayer if w is None else cu.LinearAttentionAndSlidingWindowAttentionLayer
        if type(layer) not in (want, hybrid) or (w is not None and layer.sliding_window != w):
            got = type(layer).__name__ + (f"(sliding_window={layer.sliding_window})" if hasattr(layer, "sliding_window") else "")
            raise ValueError(f"{where}: argument 'cache' layer {self.layer_idx} is a {got}; the converted attention"
                             f"{f' (window {w})' if w else ''} keeps its keys and values in a {want.__name__}"
                             f"{f'(sliding_window={w})' if w else ''} of a DynamicCache (static, quantized and offloaded "
                             "caches are not supported)")
        if getattr(layer, "record_past", False):
            raise ValueError(f"{where}: the cache records past states (assisted decoding / cropping): not supported by "
                             "the converted mixer")
        return layer

    def _read_kv(self, hf_cache, where: str) -> dict | None:
        layer = self._kv_layer(hf_cache, where)
        if not layer.is_initialized or layer.keys is None or layer.get_seq_length() == 0:
            return None
        kv = getattr(layer, "_seqmix_kv", None)
        if kv is not None and layer.keys is getattr(layer, "_seqmix_keys", None) \
                and layer.values is getattr(layer, "_seqmix_values", None):
            return {"kv": kv}  # the layer still holds the views this adapter wrote: the same KVCache, no copy
        # transformers replaced them (beam search's reorder, crop, offload) or filled the layer itself: one copy
        kv = KVCache(window=self._window())
        if layer.keys.shape[-2]:
            kv.append(layer.keys.transpose(1, 2), layer.values.transpose(1, 2))
        kv.seen = int(layer.get_seq_length())
        return {"kv": kv}

    def _write_kv(self, hf_cache, state: dict, where: str) -> None:
        kv = state.get("kv")
        if not isinstance(kv, KVCache):
            raise ValueError(f"{where}: the mixer's state has no KV cache 'kv' (state table of {self.source})")
        self._put_kv(self._kv_layer(hf_cache, where), kv)

    @staticmethod
    def _put_kv(layer, kv: KVCache, sliding: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Hands transformers' attention ``layer`` the views of ``kv``'s buffers (and keeps ``kv`` on it); returns them.
        ``sliding``: whether the layer is a sliding one (it counts every token seen), None: read from the layer."""
        keys, values = kv.head_first()  # [B, Hkv, L, ·]: views of its buffers
        if not layer.is_initialized:
            layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        if hasattr(layer, "cumulative_length") if sliding is None else sliding:  # (positions, mask sizes)
            layer.cumulative_length = kv.seen
        layer._seqmix_kv, layer._seqmix_keys, layer._seqmix_values = kv, keys, values
        return keys, values


# -- compiling the decoding step (opt-in) -----------------------------------------------------------


def compile_decode(model: nn.Module, *, prompt: torch.Tensor | None = None, **compile_kwargs) -> dict:
    """Compiles the decoding step of every finite-state seqmix layer of ``model`` (a converted or linearized
    transformers model) with ``torch.compile``: each adapter's trusted step then runs the compiled
    ``mixer.decode_step`` (its state updated in place, as eager). Attention layers (the ``kv`` kind: a KV cache
    that grows by a token per step, which would recompile every step) stay eager. Opt-in: compiling costs
    time at the first decoding step (one graph per layer; a sliding-window layer a few, while its window fills and once it is full;
    torch.compile's recompile limit is raised to the
    number of layers so that none falls back to eager), and pays where the step's many small ops dominate
    (small widths, CPU). ``compile_kwargs`` go to ``torch.compile`` (e.g. ``mode="max-autotune"``).

    ``prompt`` [B, T] token ids: run ``generate`` of two tokens after it once (where a layer has a sliding window of
    w tokens: of w + 3 tokens after its first token, the steps while the window fills and once it is full), so that
    the compilation happens here, and report its time. Returns {"compiled": layers, "eager": layers left eager,
    "first_call_s": that time or None}. ``model`` without a seqmix layer: ValueError."""
    adapters = [m for m in model.modules() if isinstance(m, InteropMixer) and m.state_table]
    if not adapters:
        raise ValueError(f"compile_decode: argument 'model' ({type(model).__name__}) holds no converted or linearized "
                         "seqmix layer (seqmix.interop.from_transformers, seqmix.linearize.linearize)")
    if prompt is not None and (not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.is_floating_point()):
        raise ValueError("compile_decode: argument 'prompt' must be token ids [batch, time] (an integer tensor), got "
                         f"{list(prompt.shape) if isinstance(prompt, torch.Tensor) else type(prompt).__name__}")
    compiled = [m for m in adapters if m.state_table[0].kind != "kv"]
    from torch import _dynamo

    # a graph per layer where its guards tell the layers apart, a second where the first state's layout differs, and a
    # sliding-window layer's three more (its window filling, filled, full with the position dynamic)
    limit = 4 * len(compiled) + 8
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(_dynamo.config, name) and getattr(_dynamo.config, name) < limit:
            setattr(_dynamo.config, name, limit)
    for m in compiled:
        m._step_fn = torch.compile(m.mixer.decode_step, **compile_kwargs)
    first = None
    if prompt is not None:
        t0 = time.perf_counter()
        pad = getattr(model.config, "pad_token_id", None) or 0
        # a sliding-window layer's step takes other graphs while its window fills (the first w tokens: the keys seen
        # grow), at the step that fills it, and once it is full (the position dynamic from the second full step on):
        # where a layer has a window of w, the prompt's first token alone and w + 3 steps after it run them all, so that
        # no prompt compiles as it decodes; else two tokens after the prompt
        w = max([int(getattr(m.mixer.config, "window", 0) or 0) for m in compiled] + [0])
        ids, new = (prompt[:, :1], w + 3) if w > 1 else (prompt, 2)
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=pad)
        first = time.perf_counter() - t0
    return {"compiled": len(compiled), "eager": len(adapters) - len(compiled), "first_call_s": first}


def uncompile_decode(model: nn.Module) -> None:
    """Undoes :func:`compile_decode`: every adapter of ``model`` runs the eager decoding step again."""
    for m in model.modules():
        if isinstance(m, InteropMixer):
            m._step_fn = None
