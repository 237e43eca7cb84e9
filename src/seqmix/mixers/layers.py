"""Small parametrized building blocks shared by several mixers (norms, the short convolution, RoPE's table).

These hold parameters; the computations they call live in ``seqmix.ops``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.conv import causal_conv1d, causal_conv1d_step
from ..ops.precision import upcast
from ..ops.rotary import RotaryTable, apply_rotary, check_rope_scaling

# torch's global module hooks (torch.nn.modules.module.register_module_forward_hook and its kin): dicts, empty
# unless a tool hooks every module
from torch.nn.modules.module import _global_backward_hooks as _GLOBAL_BACKWARD_HOOKS
from torch.nn.modules.module import _global_backward_pre_hooks as _GLOBAL_BACKWARD_PRE_HOOKS
from torch.nn.modules.module import _global_forward_hooks as _GLOBAL_HOOKS
from torch.nn.modules.module import _global_forward_pre_hooks as _GLOBAL_PRE_HOOKS


def rope_table(module: nn.Module, theta: float, scaling: dict | None = None) -> RotaryTable:
    """The :class:`~seqmix.ops.RotaryTable` of RoPE at base ``theta`` with the frequency ``scaling`` (``seqmix.ops.rotary``:
    linear, dynamic, yarn, llama3, longrope; None: the default frequencies) kept on ``module`` (found on first use and
    again when theta or the scaling changes, outside its parameters and state dict): the one table every mixer with
    RoPE rotates by, shared by every layer of the same settings (:meth:`~seqmix.ops.RotaryTable.shared`)."""
    table = module.__dict__.get("_rope_table")
    if table is None or table.theta != theta or table.scaling != scaling:
        if torch.compiler.is_compiling():  # (a traced call computes its rotation anew: a table of its own, not kept)
            return RotaryTable(theta, scaling)
        table = module.__dict__["_rope_table"] = RotaryTable.shared(theta, scaling)
    return table


def check_rope_fields(on: bool, scaling: dict | None, K: int, field: str) -> None:
    """The config check of a mixer's RoPE fields: with RoPE on (``on``; its switch is the config field ``field``) the head
    width K is even (pairs of channels turn), and a frequency ``scaling`` (``rope_scaling``) needs RoPE on and fits K
    (ValueError naming the field)."""
    if on and K % 2:
        raise ValueError(f"{field}: RoPE rotates pairs of channels, the head width K = {K} must be even")
    if scaling is not None:
        if not on:
            raise ValueError(f"rope_scaling = {scaling!r} is set but {field} turns RoPE off")
        check_rope_scaling(scaling, K, where="rope_scaling")


def rope_rotate(module: nn.Module, theta: float, start: int, *ts: torch.Tensor, scaling: dict | None = None,
                rotary_dim: int | None = None, interleaved: bool = False) -> tuple[torch.Tensor, ...]:
    """Each of ts [B, T, H, K] rotated by RoPE (base ``theta``, frequency ``scaling``; the first ``rotary_dim`` channels,
    default all K; Llama's rotate-half pairs, or (2j, 2j + 1) with ``interleaved``) at the absolute positions
    start .. start + T − 1, one cos / sin for all, sliced from :func:`rope_table` of ``module``."""
    t0 = ts[0]
    T, R = t0.shape[1], rotary_dim or t0.shape[-1]
    dt = torch.float64 if t0.dtype == torch.float64 else torch.float32  # as ops.rotary
    cos, sin = rope_table(module, theta, scaling)(start, T, R, device=t0.device, dtype=dt, seq_len=start + T, interleaved=interleaved)
    if ts[1:]:
        return tuple([apply_rotary(t, cos, sin, interleaved=interleaved) for t in ts])
    return (apply_rotary(t0, cos, sin, interleaved=interleaved),)  # (one tensor, q and k packed: no comprehension)


def project(lin: nn.Module, u: torch.Tensor) -> torch.Tensor:
    """``lin(u)`` for the mixers' projections (decoding steps, attention's q/k/v/o): ``F.linear`` on the weight and bias
    of a plain ``nn.Linear`` with no hook (of its own or global) and no ``forward`` of its own instance, without the
    module call's Python frames; a plain :class:`GroupedRows` around such a Linear (a linearized student's k and v
    kept at the teacher's kv heads) the same way, its rows gathered after; a plain :class:`BlockDiagonalLinear` (the
    RG-LRU's gates) by its ``forward`` directly; anything else (a subclass, a wrapped or hooked layer: LoRA,
    quantized, FSDP, accelerate's replaced ``forward``, a layer compiled by ``Module.compile``) is called as it is."""
    kind = type(lin)
    if (kind is nn.Linear or kind is GroupedRows or kind is BlockDiagonalLinear) and not (
            lin._forward_pre_hooks or lin._forward_hooks or lin._backward_pre_hooks or lin._backward_hooks
            or _GLOBAL_HOOKS or _GLOBAL_PRE_HOOKS or _GLOBAL_BACKWARD_HOOKS or _GLOBAL_BACKWARD_PRE_HOOKS
            or "forward" in lin.__dict__ or lin._compiled_call_impl is not None):  # (_unhooked's rule, inline: no call per projection)
        if kind is nn.Linear:
            return F.linear(u, lin.weight, lin.bias)
        if kind is BlockDiagonalLinear:
            return lin.forward(u)
        proj = lin._modules["proj"]
        if type(proj) is nn.Linear and _unhooked(proj):
            return lin.gather(F.linear(u, proj.weight, proj.bias))
    return lin(u)


def _unhooked(module: nn.Module) -> bool:
    """Whether calling ``module.forward`` directly equals the module call: no hook of its own or global, no ``forward``
    of its own instance (accelerate's replaced forward), not compiled by ``Module.compile``."""
    return not (module._forward_pre_hooks or module._forward_hooks or module._backward_pre_hooks or module._backward_hooks
                or _GLOBAL_HOOKS or _GLOBAL_PRE_HOOKS or _GLOBAL_BACKWARD_HOOKS or _GLOBAL_BACKWARD_PRE_HOOKS
                or "forward" in module.__dict__ or module._compiled_call_impl is not None)


def call_plain(module: nn.Module, *args, **kwargs):
    """``module(*args, **kwargs)``, by its ``forward`` directly where that is the same (:func:`_unhooked`), without the
    module call's Python frames (a decoding step's short conv)."""
    return module.forward(*args, **kwargs) if _unhooked(module) else module(*args, **kwargs)


def l2_normalize(t: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """t / max(‖t‖₂, eps) over the last dimension: ``F.normalize(t, dim=-1, eps=eps)``'s numbers without its Python
    wrappers (a decoding step calls it per token and head group)."""
    return t / torch.linalg.vector_norm(t, dim=-1, keepdim=True).clamp_min(eps)


def token_mix(prev: torch.Tensor, x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """RWKV's token shift, prev + μ ⊙ (x − prev) (RWKV-4: μ ⊙ x_t + (1 − μ) ⊙ x_(t−1); RWKV-7 hands (x_t, x_(t−1), μ):
    x_t + (x_(t−1) − x_t) ⊙ μ): one ``torch.lerp`` where the three dtypes agree (lerp takes one dtype), else the sum
    of products (equal up to rounding)."""
    return torch.lerp(prev, x, mu) if mu.dtype == x.dtype == prev.dtype else prev + mu * (x - prev)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, groups: int = 1, *,
             gate: torch.Tensor | None = None) -> torch.Tensor:
    """y = x / rms(x) · w over the last dimension (each of ``groups`` equal slices on its own), computed in float32
    or wider (1/rms and its gradient overflow float16) and cast back to x's dtype before the weight; with ``gate``
    z: norm(x · silu(z)). ``weight`` broadcasts against x (a row per head: one norm call for several heads)."""
    dtype = x.dtype
    x = upcast(x)
    if gate is not None:
        x = x * torch.nn.functional.silu(upcast(gate))
    shape = x.shape
    xg = x.reshape(*shape[:-1], groups, shape[-1] // groups) if groups != 1 else x
    xg = xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)
    y = xg.reshape(shape).to(dtype)
    return y * weight if weight is not None else y


class RMSNorm(nn.Module):
    """y = x / rms(x) · w over the last dimension, optionally per group of channels.

    groups > 1 normalizes each of ``groups`` equal slices separately (Mamba-2's grouped
    norm, a per-head norm). ``affine=False`` drops w (TransNormer's SRMSNorm without gain).
    """

    def __init__(self, dim: int, *, eps: float = 1e-6, groups: int = 1, affine: bool = True):
        super().__init__()
        if dim % groups:
            raise ValueError(f"RMSNorm: dim = {dim} must be divisible by groups = {groups}")
        self.dim, self.eps, self.groups = dim, eps, groups
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """With ``gate`` z: norm(x · silu(z)) (Mamba-2's gated RMSNorm, gate applied before the norm)."""
        return rms_norm(x, self.weight, self.eps, self.groups, gate=gate)


class ShortConv(nn.Module):
    """Depthwise causal convolution of width W with a carried state (Mamba's conv1d).

    forward(x [B, T, C], state [B, C, W-1] or None) -> (y [B, T, C], new state or None).
    Initialization as PyTorch's Conv1d (uniform ±1/sqrt(W)).
    """

    def __init__(self, channels: int, width: int, *, bias: bool = True, activation: str | None = None):
        super().__init__()
        if width < 1:
            raise ValueError(f"ShortConv: argument 'width' (conv kernel) must be >= 1, got {width}")
        self.channels, self.width, self.activation = channels, width, activation
        bound = 1 / math.sqrt(width)
        self.weight = nn.Parameter(torch.empty(channels, width).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(channels).uniform_(-bound, bound)) if bias else None

    def forward(self, x, state=None, *, output_final_state: bool = False):
        if x.shape[1] == 1 and state is not None:
            y, new = causal_conv1d_step(x[:, 0], self.weight, self.bias, state, activation=self.activation)
            return y.unsqueeze(1), new
        return causal_conv1d(x, self.weight, self.bias, state, activation=self.activation, output_final_state=output_final_state)

    def state_size(self) -> int:
        return self.channels * (self.width - 1)


def short_conv_qkv(m, x, state, need_state):
    """q, k, v = W_q x, W_k x, W_v x through the mixer's short convs ``conv_q``, ``conv_k``, ``conv_v`` (with
    the activation each conv was built with; their states read from and written to ``state`` / the returned
    dict), or SiLU alone without convs (``conv_size`` 0 or None): the input side of the delta-rule mixers
    and of Cyclic Flow Attention (convs without activation)."""
    q, k, v = m.W_q(x), m.W_k(x), m.W_v(x)
    new = {}
    if not m.config.conv_size:
        return F.silu(q), F.silu(k), F.silu(v), new
    outs = []
    for name, conv, t in (("conv_q", m.conv_q, q), ("conv_k", m.conv_k, k), ("conv_v", m.conv_v, v)):
        y, s = conv(t, state.get(name) if state else None, output_final_state=need_state)
        outs.append(y)
        if need_state:
            new[name] = s
    return (*outs, new)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, optionally per group of channels (a per-head
    LayerNorm, RetNet's GroupNorm, MetaLA's per-head norm without affine).

    groups > 1 normalizes each of ``groups`` equal slices separately (mean and variance per
    slice); ``affine`` adds a weight and a bias over all ``dim`` channels (``bias=False``: the
    weight only, xLSTM's multi-head norm without use_bias). Same API as :class:`RMSNorm`.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5, groups: int = 1, affine: bool = True, bias: bool = True):
        super().__init__()
        if dim % groups:
            raise ValueError(f"LayerNorm: dim = {dim} must be divisible by groups = {groups}")
        self.dim, self.eps, self.groups = dim, eps, groups
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xg = x.reshape(*shape[:-1], self.groups, shape[-1] // self.groups)
        y = torch.nn.functional.layer_norm(xg, xg.shape[-1:], eps=self.eps).reshape(shape)
        if self.weight is not None:
            y = y * self.weight
        return y + self.bias if self.bias is not None else y


class BlockDiagonalLinear(nn.Module):
    """A Linear whose weight is block-diagonal: the input and output split into ``blocks`` equal slices, slice h
    mapped by its own matrix, y_h = x_h W_h + b_h (RecurrentGemma's RG-LRU gates, one block per head: its
    ``input_gate_weight`` / ``recurrent_gate_weight`` layout, [blocks, in/blocks, out/blocks], x @ W). Reads and
    stores 1/blocks of the dense matrix's entries; equals the ``nn.Linear`` of :meth:`expanded_weight` (the
    reference, tied in tests). Initialization: each block as PyTorch's Linear of its own width (uniform ±1/sqrt(in/blocks))."""

    def __init__(self, in_features: int, out_features: int, blocks: int, *, bias: bool = True):
        super().__init__()
        for name, n in (("in_features", in_features), ("out_features", out_features)):
            if n % blocks:
                raise ValueError(f"BlockDiagonalLinear: argument '{name}' = {n} must be divisible by blocks = {blocks}")
        self.in_features, self.out_features, self.blocks = int(in_features), int(out_features), int(blocks)
        n_in, n_out = in_features // blocks, out_features // blocks
        bound = n_in ** -0.5
        self.weight = nn.Parameter(torch.empty(blocks, n_in, n_out).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound)) if bias else None

    def expanded_weight(self) -> torch.Tensor:
        """The dense weight of the ordinary Linear this projection equals, [out_features, in_features]."""
        return torch.block_diag(*[w.t() for w in self.weight.unbind(0)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, blocks = x.shape[:-1], self.blocks
        xb = x.reshape(-1, blocks, self.in_features // blocks).transpose(0, 1)  # [blocks, N, in/blocks]
        w, b = self.weight, self.bias
        if w.dtype != x.dtype:
            w = w.to(x.dtype)
        if b is None:
            y = torch.bmm(xb, w)
        else:
            y = torch.baddbmm((b if b.dtype == x.dtype else b.to(x.dtype)).view(blocks, 1, -1), xb, w)
        return y.transpose(0, 1).reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={self.blocks}, bias={self.bias is not None}"


class GroupedRows(nn.Module):
    """A Linear whose output rows come in groups that share their weights: grouped-query attention's k and v
    projections kept at the kv heads inside a mixer that reads one k and v per query head.

    ``segments``: the output, in order, as blocks ``(heads, kv_heads, width)``: ``heads·width`` output rows,
    of which head h is stored head ``h // (heads / kv_heads)`` (transformers' ``repeat_kv``: each kv head
    repeated in a row); ``(1, 1, n)`` is a block of n ordinary rows. The stored Linear ``proj`` holds
    ``Σ kv_heads·width`` rows, and ``forward(x) = proj(x)[..., index]``: it equals the ``nn.Linear`` whose
    weight is :meth:`expanded_weight` (the reference, tied in tests/test_grouped_rows.py), reading
    ``kv_heads/heads`` of its bytes for the grouped blocks. Its gradient flows into the stored rows (the sum
    over each group). The mixer around it sees an ordinary projection of ``out_features`` rows."""

    def __init__(self, in_features: int, segments, *, bias: bool = True, _proj: nn.Linear | None = None):
        super().__init__()
        self.segments = check_segments(segments)
        self.in_features = int(in_features)
        index = _group_index(self.segments)
        self.out_features = index.numel()
        self.proj = _proj if _proj is not None else nn.Linear(in_features, int(index.max()) + 1, bias=bias)
        self.register_buffer("index", index.to(self.proj.weight.device), persistent=False)
        # the same gather by blocks of contiguous rows (every head's rows are runs of ``block``, the widths' gcd): one
        # index per block instead of per row (an index_select of rows along the last axis is a strided gather per
        # element, 34x the time of the block gather on [1, 1024, 768] on the CPU)
        self.block = math.gcd(*[w for _, _, w in self.segments])
        self.register_buffer("block_index", index.view(-1, self.block)[:, 0].div(self.block, rounding_mode="floor")
                             .to(self.proj.weight.device), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, segments) -> GroupedRows:
        """The grouped projection of ``linear`` (its weight and bias: the first row of each group is kept; where the
        rows of a group are equal, as the teacher's repeated k and v rows are, it computes exactly what ``linear``
        does)."""
        segments = check_segments(segments)
        first = _first_rows(segments)
        if linear.out_features != _group_index(segments).numel():
            raise ValueError(f"GroupedRows: argument 'segments' = {segments} covers {_group_index(segments).numel()} rows, the "
                             f"Linear has {linear.out_features}")
        first = first.to(linear.weight.device)
        proj = nn.utils.skip_init(nn.Linear, linear.in_features, first.numel(), bias=linear.bias is not None,
                                  device=linear.weight.device, dtype=linear.weight.dtype)  # (draws nothing from the RNG)
        with torch.no_grad():
            proj.weight.copy_(linear.weight[first])
            if linear.bias is not None:
                proj.bias.copy_(linear.bias[first])
        proj.requires_grad_(linear.weight.requires_grad)
        return cls(linear.in_features, segments, _proj=proj)

    @property
    def weight(self) -> torch.Tensor:
        """The weight of the ordinary Linear this projection equals, [out_features, in_features] (the stored rows
        repeated: nn.Linear's contract for code that reads ``.weight``; the stored rows are ``proj.weight``)."""
        return self.proj.weight[self.index]

    @property
    def bias(self) -> torch.Tensor | None:
        return None if self.proj.bias is None else self.proj.bias[self.index]

    def expanded_weight(self) -> torch.Tensor:
        """The weight of the ordinary Linear this projection equals: [out_features, in_features]."""
        return self.weight

    def stored_block(self, start: int, stop: int) -> tuple[int, int]:
        """The stored rows (start, stop) that output rows start .. stop − 1 read (a block of one segment)."""
        rows = self.index[start:stop]
        return int(rows.min()), int(rows.max()) + 1

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """The output rows [..., out_features] from the stored rows' y [..., stored rows] (each group's row repeated)."""
        return y.unflatten(-1, (-1, self.block)).index_select(-2, self._buffers["block_index"]).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gather(self.proj(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, segments={self.segments}"


def check_segments(segments) -> list[list[int]]:
    """``segments`` of :class:`GroupedRows` as a list of [heads, kv_heads, width], checked: positive integers, kv_heads
    dividing heads (ValueError naming 'segments' otherwise)."""
    try:
        out = [[int(h), int(g), int(w)] for h, g, w in segments]
        ok = all(v == orig for seg, o in zip(out, segments) for v, orig in zip(seg, o))
    except (TypeError, ValueError):
        out, ok = [], False
    if not ok or not out or any(h < 1 or g < 1 or w < 1 or h % g for h, g, w in out):
        raise ValueError(f"GroupedRows: argument 'segments' must be a non-empty list of [heads, kv_heads, width] (positive "
                         f"integers, kv_heads dividing heads), got {segments!r}")
    return out


def _group_index(segments: list[list[int]]) -> torch.Tensor:
    """For each output row, the stored row it reads (module docstring of :class:`GroupedRows`)."""
    parts, stored = [], 0
    for h, g, w in segments:
        heads = torch.arange(h).repeat_interleave(w) // (h // g)
        parts.append(stored + heads * w + torch.arange(w).repeat(h))
        stored += g * w
    return torch.cat(parts)


def _first_rows(segments: list[list[int]]) -> torch.Tensor:
    """For each stored row, the first output row that reads it."""
    index = _group_index(segments)
    first = torch.full((int(index.max()) + 1,), index.numel(), dtype=torch.long)
    return first.scatter_reduce_(0, index, torch.arange(index.numel()), reduce="amin")


def group_rows(module: nn.Module, grouped: dict | None) -> nn.Module:
    """``module`` (in place) with each Linear named in ``grouped`` ({submodule name: segments}) replaced by its
    :class:`GroupedRows`; what :func:`grouped_rows` of a module returns rebuilds it (before its weights are loaded)."""
    if grouped is not None and not isinstance(grouped, dict):
        raise ValueError(f"group_rows: argument 'grouped' must map projection names to segments, got {grouped!r}")
    for name, segments in (grouped or {}).items():
        try:
            linear = module.get_submodule(name)
        except AttributeError:
            linear = None
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"group_rows: argument 'grouped': {type(module).__name__} has no Linear {name!r} to group "
                             f"(found {type(linear).__name__})")
        parent, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, attr, GroupedRows.from_linear(linear, segments))
    return module


def grouped_rows(module: nn.Module) -> dict[str, list[list[int]]]:
    """{submodule name: segments} of the :class:`GroupedRows` inside ``module`` ({} when none)."""
    return {name: m.segments for name, m in module.named_modules() if isinstance(m, GroupedRows)}
