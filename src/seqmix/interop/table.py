"""The data of a conversion: weight tables, state tables, module maps and families.

A family is data, not code: for each transformers module class it converts, a
:class:`ModuleMap` says which seqmix mixer replaces it (a registry name), how the
transformers config becomes that mixer's config (the *adapter config*: a function that
returns a dict or raises :class:`Unsupported` naming the option it cannot express), which
parameter goes where (the *weight table*: rows of :class:`Weight`) and which slot of
transformers' cache holds which entry of the mixer's seqmix state (the *state table*:
rows of :class:`State`). The one adapter module (``seqmix.interop.adapter``) and the one
converter (``seqmix.interop.convert``) read these tables; nothing is written per weight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------
# transforms: named tensor maps used by the tables
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transform:
    """A named tensor map (the name is what error messages and docs show)."""

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor] = field(repr=False, compare=False)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return self.fn(t)

    def __str__(self) -> str:
        return self.name


# (each map a module-level function, bound to its arguments by functools.partial: a converted model pickles, as
# torch.save(model) and a spawned process need; a lambda or a nested function would not)


def _squeeze(dim, t):
    return t.squeeze(dim)


def _unsqueeze(dim, t):
    return t.unsqueeze(dim)


def _transpose(a, b, t):
    return t.transpose(a, b).contiguous()


def _drop_first(n, t):
    return t[..., n:]


def _pad_first(n, t):
    return F.pad(t, (n, 0))


def _neg_exp(t):
    return -t.exp()


def _log_neg(t):
    return (-t).log()


def _flatten(t):
    return t.reshape(-1)


def _neg(t):
    return -t


def _rows(start, stop, t):
    return t[start:stop]


def _append_column(ts):
    return torch.cat([ts[0], ts[1].unsqueeze(-1).to(ts[0].dtype)], dim=-1)


def _split_column(t):
    return t[..., :-1], t[..., -1]


def _unstabilize_pair(ts):
    num, den, mx = ts
    scale = torch.exp(mx.float())
    return torch.stack([num.float() * scale, den.float() * scale], dim=-1).unsqueeze(-2)


def _stabilized_pair(t):
    num, den = t.select(-2, 0).unbind(-1)
    return num, den, torch.zeros_like(num)


def squeeze(dim: int) -> Transform:
    """Drops a size-1 dimension (a depthwise Conv1d weight [C, 1, W] -> seqmix's [C, W])."""
    return Transform(f"squeeze({dim})", functools.partial(_squeeze, dim))


def unsqueeze(dim: int) -> Transform:
    return Transform(f"unsqueeze({dim})", functools.partial(_unsqueeze, dim))


def transpose(a: int, b: int) -> Transform:
    return Transform(f"transpose({a}, {b})", functools.partial(_transpose, a, b))


def drop_first(n: int = 1) -> Transform:
    """Keeps all but the first n entries of the last dimension (transformers' conv window of W
    inputs -> seqmix's W - 1: the oldest input is never read again)."""
    return Transform(f"[..., {n}:]", functools.partial(_drop_first, n))


def pad_first(n: int = 1) -> Transform:
    """Prepends n zeros on the last dimension (seqmix's conv state of W - 1 inputs ->
    transformers' window of W; the prepended column is never read by either)."""
    return Transform(f"pad({n}, 0)", functools.partial(_pad_first, n))


def neg_exp() -> Transform:
    """x -> -exp(x) (a log-parametrized A stored as A itself)."""
    return Transform("-exp", _neg_exp)


def log_neg() -> Transform:
    """A -> log(-A) (the inverse of neg_exp)."""
    return Transform("log(-x)", _log_neg)


def flatten() -> Transform:
    """Any shape -> one dimension (RWKV's token-shift mixes [1, 1, d] -> seqmix's [d])."""
    return Transform("flatten", _flatten)


def neg() -> Transform:
    """x -> -x (RecurrentGemma's recurrent_param is seqmix's -Λ: log a = -c r softplus(param) = c r log σ(-param))."""
    return Transform("-x", _neg)


def rows(start: int, stop: int) -> Transform:
    """Rows start:stop of the first dimension: one part of a fused projection (xLSTM's
    ``weight_mode="fused"`` stacks q, k, v, o in one matrix and i, f in another)."""
    return Transform(f"[{start}:{stop}]", functools.partial(_rows, start, stop))


def append_column() -> Transform:
    """State (M, n) -> [M | n]: n [..., K] becomes the last column of M [..., K, V] (the mLSTM's
    normalizer n_t is the ones column of seqmix's state S [..., K, V + 1])."""
    return Transform("cat(M, n[..., None], -1)", _append_column)


def split_column() -> Transform:
    """The inverse of :func:`append_column`: S [..., K, V + 1] -> (S[..., :V], S[..., V])."""
    return Transform("(S[..., :-1], S[..., -1])", _split_column)


def unstabilize_pair() -> Transform:
    """RWKV-4's stabilized WKV state (num, den, max), each [B, C], real num = num·e^max -> seqmix's
    unstabilized state S [B, C, 1, 2] = (num·e^max, den·e^max) (an empty state, max = -1e30,
    gives 0)."""
    return Transform("(num·e^max, den·e^max)", _unstabilize_pair)


def stabilized_pair() -> Transform:
    """The inverse of :func:`unstabilize_pair`: S [B, C, 1, 2] -> (num, den, max = 0)."""
    return Transform("(num, den, 0)", _stabilized_pair)


# ------------------------------------------------------------------------------------------
# table rows
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Weight:
    """One row of a weight table: transformers' ``hf`` (a parameter or persistent buffer name
    inside the replaced module) is seqmix's ``seqmix`` (a name in the mixer's state dict),
    after ``transform``. A row whose two names are both absent (a bias switched off on both
    sides) is skipped; one present without the other is an error.

    ``part`` (several transformers tensors stacked into one seqmix tensor): this row fills row
    block number ``part`` of ``seqmix``; the blocks, numbered 0, 1, ... without a gap, are
    concatenated along the first dimension in that order (softmax attention's W_qk = [q_proj;
    k_proj], RecurrentGemma's W_in = [linear_x; linear_y]), and the stack must have seqmix's shape.

    ``seqmix=None`` (a *derived* row): the transformers tensor is a function of the config that the
    seqmix mixer recomputes itself (MiniMax's decay buffers from its slope rates, which the adapter
    config reads into the mixer's config and checks); the row marks it read, nothing is copied."""

    hf: str
    seqmix: str | None
    transform: Transform | None = None
    part: int | None = None


@dataclass(frozen=True)
class State:
    """One row of a state table: the mixer's seqmix state entry ``seqmix`` ("S", "conv")
    lives in transformers' decoding state as slot ``index`` of the ``kind``, converted by
    ``to_seqmix`` when read and ``to_hf`` when written. Where that state is, by kind:

    * ``"conv"`` / ``"recurrent"``: the layer's conv or recurrent state number ``index`` of a
      ``DynamicCache`` of linear-attention layers (Mamba, Mamba-2; ``cache=``).
    * ``"stacked"``: entry ``index`` of a list of tensors [B, C, num_layers] shared by all
      layers, this layer's column ``[:, :, layer_idx]`` (RWKV-4's ``state=`` list; written back
      in place, as transformers' module does).
    * ``"tuple"``: entry ``index`` of this layer's own tuple of tensors (xLSTM's (C, n, m),
      passed as the module's second argument); the new state is returned as a new tuple.
    * ``"kv"``: the keys and values of an attention layer of a ``DynamicCache`` (a
      ``DynamicLayer``, or a ``DynamicSlidingWindowLayer`` for a windowed mixer): seqmix's
      :class:`~seqmix.ops.KVCache` is kept in that layer, whose ``keys`` / ``values`` are views of
      its buffers ([B, kv_heads, L, K], transformers' layout), so transformers' sizes, masks and
      positions see the cached tokens without a copy; when transformers replaced them (beam
      search's reorder, crop, a cache filled by the original model) they are read into a new
      KVCache once. No transform (``to_seqmix`` / ``to_hf`` unused).
    * ``"linear_cache"``: the cache object's ``get_linear_cache(layer_idx)`` /
      ``set_linear_cache(layer_idx, state)`` (MiniMax's ``MiniMaxCache``, which keeps each lightning
      layer's state [B, H, K, V] in a list beside its attention layers); ``index`` unused.
    * ``"layer"``: the whole seqmix state of a finite-state mixer placed in an attention slot (a
      student of ``seqmix.linearize`` in a Llama layer) kept on that slot's attention layer of a
      ``DynamicCache`` (a ``DynamicLayer``): the entries as the mixer returns them, beside
      ``keys`` / ``values`` that are the row ids 0..B-1 broadcast to [B, 1, seen, 1] (a stride-0 view:
      no memory per token), so transformers' sizes, masks and positions count the tokens seen, and a
      reordering of the batch (beam search's ``reorder_cache``, ``batch_select_indices``,
      ``batch_repeat_interleave``) leaves in ``keys`` the old row of each new row, by which the state
      is reordered too (``index_select`` on its batch axis). A crop is refused: a recurrent state
      cannot forget tokens. ``index`` and the transforms are unused.

    ``index`` may be a tuple of slots that together make one seqmix entry (xLSTM's C and n are
    seqmix's S = [C | n]); ``to_seqmix`` then takes the tuple of tensors and ``to_hf`` returns one.
    """

    seqmix: str
    kind: Literal["conv", "recurrent", "stacked", "tuple", "kv", "linear_cache", "layer"]
    index: int | tuple[int, ...] = 0
    to_seqmix: Transform | None = None
    to_hf: Transform | None = None

    @property
    def slots(self) -> tuple[int, ...]:
        return self.index if isinstance(self.index, tuple) else (self.index,)


class Unsupported(Exception):
    """Raised by an adapter config: the transformers module uses ``option`` = ``value``,
    which the seqmix mixer cannot express (``why``). The converter turns it into a
    ValueError naming the module path."""

    def __init__(self, option: str, value: Any, why: str):
        super().__init__(option, value, why)
        self.option, self.value, self.why = option, value, why

    def __str__(self) -> str:
        return f"option {self.option!r} = {self.value!r} cannot be expressed: {self.why}"


@dataclass(frozen=True)
class ModuleMap:
    """How one transformers module class becomes a seqmix mixer.

    module:  the exact class, "package.module.ClassName" (subclasses are not matched: they
             may compute something else)
    mixer:   the seqmix registry name of the replacement
    config:  the adapter config, ``config(hf_config, module) -> dict`` of the mixer's config
             fields (raises :class:`Unsupported`)
    weights: the weight table; every parameter and persistent buffer of the module must
             have a row, every entry of the mixer's state dict must be filled
    state:   the state table (what transformers' cache holds for this layer)
    dsf:     one line: what Λ_i, B_i, C_i of the converted mixer are (docs, ``describe``)
    returns_state: the module returns ``(output, state)`` (RWKV-4, xLSTM) rather than the
             output alone; the adapter returns the same (the state argument, updated)
    aliases: ``(transformers submodule name, seqmix submodule name)`` pairs that transformers'
             code outside the module reaches into (RwkvModel rescales ``attention.output.weight``
             in place when it switches between training and inference); the adapter exposes the
             seqmix submodule under the transformers name, so that code acts on the converted weight
    layer_attr: the module's attribute holding its layer index in the decoding state (a module
             without it, RecurrentGemma's recurrent block: the N of ``layers.N.`` in its path)
    returns_pair: the module returns ``(output, second)`` where ``second`` is no state (attention
             weights of LlamaAttention / RecurrentGemmaAttention, None of RecurrentGemma's recurrent
             block); the adapter returns ``(output, None)``
    mask:    what the module's ``attention_mask`` is: ``"padding"`` (a 2D [B, T] mask, zeros
             refused: Mamba's mixers), ``"causal"`` (the 4D causal / sliding-window mask of
             transformers' attention, or None: it must be exactly the mask the seqmix mixer applies,
             so padding is refused) or ``"ignored"`` (the module ignores it: RecurrentGemma's
             recurrent block)
    positions: the module reads ``position_ids`` (RoPE; RecurrentGemma's reset at position 0): the
             adapter checks they are the positions the seqmix state implies (consecutive, from the
             cached prefix's length), since the seqmix mixer takes them from its state
    layer_arg: the module is told its layer index in the decoding state by this call argument
             (Zamba2's shared attention: ``self_attn(..., layer_idx=N)``, its own ``layer_idx`` is -1);
             the adapter's index is the N of ``layers.N.`` in its path (set ``layer_attr=""``) and the
             argument is checked to be that N
    residual: the module's second positional argument is the residual stream, which it adds to its
             output (BLOOM's attention: ``dropout_add(dense(o), residual)``); the adapter adds it too
    derived_args: call arguments the module reads that the seqmix mixer recomputes from its config and
             state (BLOOM's ``alibi``: slopes times the key positions of the padding mask, which the mask
             check already holds to be the causal rule); accepted and not read
    """

    module: str
    mixer: str
    config: Callable[[Any, Any], dict]
    weights: tuple[Weight, ...] | Callable[[Any], tuple[Weight, ...]]
    state: tuple[State, ...] = ()
    dsf: str = ""
    returns_state: bool = False
    aliases: tuple[tuple[str, str], ...] = ()
    layer_attr: str = "layer_idx"
    returns_pair: bool = False
    mask: Literal["padding", "causal", "ignored"] = "padding"
    positions: bool = False
    layer_arg: str | None = None
    residual: bool = False
    derived_args: tuple[str, ...] = ()

    @property
    def class_name(self) -> str:
        return self.module.rpartition(".")[2]

    def weight_rows(self, module) -> tuple[Weight, ...]:
        """The weight table for ``module``: the tuple itself, or, for a layout whose split points are
        the module's sizes (a fused projection), the function of the module evaluated."""
        return tuple(self.weights(module)) if callable(self.weights) else self.weights

    def layer_index(self, module) -> int | None:
        return getattr(module, self.layer_attr, None) if self.layer_attr else None


@dataclass(frozen=True)
class Family:
    """A transformers model family (its ``config.model_type``) and the module classes it
    converts. Every sequence-mixing module of a model of this family must be one of them."""

    model_type: str
    modules: tuple[ModuleMap, ...]
    #: a regular expression for the paths of the sequence-mixing modules (re.search against
    #: the module path): each module there must be one of ``modules``, or the model is refused
    slots: str = r"(^|\.)layers\.\d+\.mixer$"
    description: str = ""
    #: module classes ("package.module.ClassName") in a mixer slot that the family leaves as
    #: transformers' own (Kimi-Linear's MLA attention): they are not converted, not listed by
    #: ``seqmix_mixers``, and the converted model records them in ``model.seqmix_kept``
    #: ({module path: class name})
    keeps: tuple[str, ...] = ()
    #: module classes found in a mixer slot that mix no tokens (Nemotron-H's MLP and MoE layers sit at
    #: ``layers.N.mixer`` like its Mamba-2 and attention layers): left as transformers' own, not listed
    not_mixers: tuple[str, ...] = ()

    def module_map(self, module) -> ModuleMap | None:
        name = f"{type(module).__module__}.{type(module).__qualname__}"
        return next((m for m in self.modules if m.module == name), None)
