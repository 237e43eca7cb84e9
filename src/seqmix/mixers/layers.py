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


def rope_table(module: nn.Module, theta: float, scaling: dict | None = None) -> RotaryTable:
    """The :class:`~seqmix.ops.RotaryTable` of RoPE at base ``theta`` with the frequency ``scaling`` (``seqmix.ops.rotary``:
    linear, dynamic, yarn, llama3, longrope; None: the default frequencies) kept on ``module`` (built on first use and
    again when theta or the scaling changes, outside its parameters and state dict): the one table every mixer with
    RoPE rotates by."""
    table = module.__dict__.get("_rope_table")
    if table is None or table.theta != theta or table.scaling != scaling:
        table = module.__dict__["_rope_table"] = RotaryTable(theta, scaling)
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
    return tuple([apply_rotary(t, cos, sin, interleaved=interleaved) for t in ts])


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
        dtype = x.dtype  # computed in float32 or wider (1/rms and its gradient overflow float16), cast back
        x = upcast(x)
        if gate is not None:
            x = x * torch.nn.functional.silu(upcast(gate))
        shape = x.shape
        xg = x.reshape(*shape[:-1], self.groups, shape[-1] // self.groups)
        xg = xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + self.eps)
        y = xg.reshape(shape).to(dtype)
        return y * self.weight if self.weight is not None else y


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
