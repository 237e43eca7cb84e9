"""Long convolutions in the DSF: H3, Hyena and GSS (the convolution view of seed 003;
convblog note §10, §12-14; peer-ssm note §3).

Each model reads the input into a few streams (projections), mixes along time with long
causal convolutions (an SSM kernel or an implicit filter, computed by FFT of size >= 2T:
``seqmix.ops.conv.fft_conv``) and elementwise or outer-product gates, and writes the
result back with an output projection (convblog note §14):

* H3 (Fu et al. 2023; note §12.2): q ⊙ SSM_diag(SSM_shift(k) ⊙ v) per head,

      k̃_t = Σ_(j<N_s) C^s_j k_(t-j) + D^s k_t                   shift SSM (A = shift matrix, B = e_1): an FIR
      o_t^h = Σ_k q_(t,k)^h Σ_(s<=t) (K^h_(t-s) + D_h δ_ts) k̃_(s,k)^h v_s^h      diagonal SSM (S4D) per head
      y = out_proj(o)

  i.e. linear attention (note §12.4) with φ(k) = shift(k) and the cumulative sum replaced by
  the decaying S4D kernel. Modes: "fft" (the outer products k̃ ⊗ v convolved by
  ``diagonal_ssm_conv``), "recurrent" and "chunk" (``linear_recurrence`` with q' = q ⊗ C,
  k' = k̃ ⊗ B̄, the complex log-decay log Ā per mode, v: a finite state).
* Hyena (Poli et al. 2023; note §13): streams v, x^1..x^N from a projection and a short
  causal conv (width 3), implicit long filters h^n (positional encoding -> sine-activated
  FFN -> exponential-decay window), and the order-N recurrence

      z^1 = v,   z^(n+1) = x^n ⊙ (h^n * z^n + b^n z^n),   y = out_proj(z^(N+1))            ("paper")

  "order" means this (N filters) in the paper and something else in the reference code
  (safari): there ``order`` counts gates, there are order - 1 filters and the first gate
  multiplies before any filter, i.e. the paper's form with h^1 = δ (note §8/§13.4; the
  option ``order_convention``). Order 2 in the code's convention is x^2 ⊙ (h * (x^1 ⊙ v)):
  the H3 structure. Modes: "fft" and "direct" (``direct_conv``, the O(T²) reference);
  decoding keeps the filters' past inputs (a state that grows with the context).
* GSS (Mehta et al. 2023; note §10): a GAU whose attention is a diagonal SSM (DSS),

      U = gelu(W_u x) (the gate, width F),   V = gelu(W_v x) (width H),   V̂ = K * V + D V,
      y = W_o (U ⊙ W_3 V̂)                  (paper; "simplified": no W_3 and H = F, the blog's form)

  Modes as S4D ("fft", "recurrent", "chunk"), finite state.
* The gated short convolution of LFM2, ``short_conv``: y = out_proj(c ⊙ conv_W(b ⊙ x)) with
  (b, c, x) = in_proj(u) and an explicit W-tap depthwise filter: Hyena of order 2 with a short
  filter, a finite state (the last W - 1 products). Modes "direct" and "fft".

The map of each (``phi``) is causal and per head / channel:

    H3:     Φ_h[t, s] = (q_t·k̃_s) (K^h_(t-s) + D_h δ_ts)                   [B, heads, T, T]
    Hyena:  Φ_c = D_(x^N) (T_(h^N) + b^N I) ⋯ D_(x^1) (T_(h^1) + b^1 I)     [B, d_model, T, T]
    GSS:    Φ_c = T_(K_c) + D_c I                                           [B, d_ssm, T, T]
    short:  Φ_c = D_(c) T_(w_c) D_(b)   (W taps)                            [B, d_model, T, T]

and ``dsf(x)`` is exact for H3 and GSS (finite state); Hyena has none (``finite_state = False``):
its filters are arbitrary length-T sequences, not the kernels of a small LTI system, so the
only exact state is the filters' whole input history (what its decoding cache holds).
docs/convolution.md has the equations, the choices and the errata relied on.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from einops import rearrange
from pydantic import Field, model_validator
from torch import nn

from .._checks import check_choice, check_positive_int
from ..dsf import DSF
from ..ops import linear_recurrence
from ..ops.conv import causal_conv1d, causal_conv1d_step, direct_conv, fft_conv, toeplitz
from ..ops.precision import linear_f32, upcast
from ..ops.ssm import diagonal_ssm_conv
from .base import Mixer, MixerConfig, MixOut, register
from .layers import ShortConv, project, token_mix
from .ssm import DiagonalSSM, DiagonalSSMConfig

# ------------------------------------------------------------------------------------------
# H3
# ------------------------------------------------------------------------------------------


class H3Config(DiagonalSSMConfig):
    head_dim: int = Field(1, gt=0, description="channels per head d_h (heads = d_model / head_dim); the H3 code's default is 1")
    shift_size: int | None = Field(None, gt=0, description="state size N_s of the shift SSM, the FIR length (default: d_state)")
    bias: bool = Field(True, description="biases of the q, k, v and output projections")

    @model_validator(mode="after")
    def _heads(self):
        if self.d_model % self.head_dim:
            raise ValueError(f"head_dim = {self.head_dim} must divide d_model = {self.d_model}")
        return self


@register("h3", description="H3 (Fu et al. 2023): q ⊙ SSM_diag(SSM_shift(k) ⊙ v) with heads; S4D diagonal SSM")
class H3(DiagonalSSM, Mixer):
    """H3, Hungry Hungry Hippos (convblog note §12.2; H3 paper §3).

    x [B, T, d] -> q, k, v = W_q x, W_k x, W_v x, split into H = d/d_h heads of d_h channels.

    1. Shift SSM on k, per channel (A = the N_s×N_s shift matrix, B = e_1, learnt C^s, skip
       D^s; its state is the last N_s inputs, so its kernel is the FIR C^s_j, j < N_s):
       k̃_t = Σ_j C^s_j k_(t-j) + D^s k_t, run by ``causal_conv1d`` (state: the last N_s - 1 k's).
       (The blog calls this step "non linear"; it is linear, convblog erratum 18.)
    2. Outer product per head k̃_t ⊗ v_t (d_h² channels per head).
    3. Diagonal SSM along time, one S4D system per head shared by its d_h² pairs
       (:class:`~seqmix.mixers.ssm.DiagonalSSM`: S4D-Lin init, ZOH, N = d_state):
       S_t = Σ_(s<=t) K_(t-s) k̃_s ⊗ v_s + D k̃_t ⊗ v_t.
    4. o_t = q_t S_t (sum over the key channel), heads concatenated (h major), y = W_o o.

    Modes: "fft" (step 3 by ``diagonal_ssm_conv``, FFT of size >= 2T), "recurrent" and
    "chunk" (``linear_recurrence`` per head with q' = q ⊗ C, k' = k̃ ⊗ B̄ over the d_h·M
    (key channel, mode) pairs, log-decay log Ā, v: S' ∈ C^(d_h·M × d_h) per head, output
    2·Re plus the D term). The state layout is the recurrence's in every mode.

    Maps of phi(x): one per head, [B, heads, T, T], Φ[t, s] = (q_t·k̃_s)(K_(t-s) + D δ_ts).
    State: d_model·head_dim·d_state (diagonal SSM) + d_model·(shift_size - 1) (shift SSM) floats.
    """

    family = "convolution"
    modes = ("recurrent", "chunk", "fft")
    reference_mode = "recurrent"
    state_formula = "d_model·head_dim·d_state + d_model·(shift_size-1)"
    map_unit = "head"
    Config = H3Config

    def __init__(self, config: H3Config | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d = c.d_model
        self.head_dim = c.head_dim
        self.heads = d // c.head_dim
        self.shift_size = c.shift_size or c.d_state
        self.q_proj = nn.Linear(d, d, bias=c.bias)
        self.k_proj = nn.Linear(d, d, bias=c.bias)
        self.v_proj = nn.Linear(d, d, bias=c.bias)
        bound = 1 / math.sqrt(self.shift_size)  # Conv1d-like (Kaiming-uniform) init of C^s, as in the H3 code
        self.shift_C = nn.Parameter(torch.empty(d, self.shift_size).uniform_(-bound, bound))
        self.shift_D = nn.Parameter(torch.randn(d))
        self._init_diagonal_ssm(self.heads)
        self.out_proj = nn.Linear(d, d, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "head_dim": 2, "d_state": 8, "shift_size": 4, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    def shift_kernel(self, T: int) -> torch.Tensor:
        """The shift SSM's kernel [T, d_model]: C^s_l + D^s δ_l0 for l < N_s, then zeros."""
        k = self.shift_C.clone()
        k[:, 0] = k[:, 0] + self.shift_D
        n = min(T, self.shift_size)
        return F.pad(k[:, :n], (0, T - n)).t()

    def _shift_weight(self) -> torch.Tensor:
        """The kernel as ``causal_conv1d`` weights [d, N_s] (the last tap multiplies the current k)."""
        return self.shift_C.flip(-1) + F.pad(self.shift_D.unsqueeze(-1), (self.shift_size - 1, 0))

    def _qkv(self, x, conv_state=None, need_state=False):
        """q, k̃, v [B, T, H, d_h] and the shift SSM's new state [B, d, N_s - 1] (or None)."""
        Bt, T, _ = x.shape
        k, conv = causal_conv1d(self.k_proj(x), self._shift_weight(), None, conv_state, output_final_state=need_state)

        def heads(t):
            return t.view(Bt, T, self.heads, self.head_dim)

        return heads(self.q_proj(x)), heads(k), heads(self.v_proj(x)), conv

    def _recurrence(self, q, k):
        """linear_recurrence operands: q' = q ⊗ C, k' = k̃ ⊗ B̄ [B, T, H, d_h·M] (key channel major),
        gk = log Ā repeated over the key channels [B, T, H, d_h·M]."""
        log_Ab, Bb, C = self.discrete()  # [H, M]
        Bt, T, H, dh = q.shape
        M = log_Ab.shape[-1]
        qq = (q.unsqueeze(-1) * C.unsqueeze(1)).flatten(-2)
        kk = (k.unsqueeze(-1) * Bb.unsqueeze(1)).flatten(-2)
        gk = log_Ab.unsqueeze(1).expand(H, dh, M).reshape(H, dh * M).expand(Bt, T, H, dh * M)
        return qq, kk, gk

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        q, k, v, conv = self._qkv(x, state["conv"] if state else None, need_state)
        Bt, T, H, dh = q.shape
        S0 = state["S"] if state else None  # [B, H, d_h·M, d_h]
        if mode in ("auto", "fft"):
            log_Ab, Bb, C = self.discrete()
            kv = rearrange(k.unsqueeze(-1) * v.unsqueeze(-2), "b t h k v -> (b k v) t h")
            h0 = rearrange(S0, "b h (k n) v -> (b k v) h n", k=dh) if S0 is not None else None
            s, S = diagonal_ssm_conv(
                kv, log_Ab, Bb, C, self.D, initial_state=h0, output_final_state=need_state,
                conj_pairs=self.complex_modes, check_values=False,
            )
            o = torch.einsum("bthk,bthkv->bthv", q, rearrange(s, "(b k v) t h -> b t h k v", b=Bt, k=dh))
            S = rearrange(S, "(b k v) h n -> b h (k n) v", b=Bt, k=dh) if S is not None else None
        else:  # "recurrent", "chunk", "step"
            qq, kk, gk = self._recurrence(q, k)
            o, S = linear_recurrence(
                qq, kk, v, gk, initial_state=S0, output_final_state=need_state, mode=mode,
                chunk_size=self.config.chunk_size, check_values=False,
            )
            o = self._out_scale * o.real if o.is_complex() else o
            o = o + (self.D * (q * k).sum(-1)).unsqueeze(-1) * v
        new_state = {"S": S, "conv": conv} if need_state else None
        return MixOut(self.out_proj(o.flatten(2)), new_state, values=v, mixed=o)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, heads, T, T]: Φ_h[t, s] = (q_t·k̃_s)(K^h_(t-s) + D_h δ_ts) for s <= t."""
        self.check_input(x)
        q, k, _, _ = self._qkv(x)
        scores = torch.einsum("bthk,bshk->bhts", q, k)
        return scores * self._diagonal_phi(1, x.shape[1])

    def dsf(self, x):
        """DSF.from_recurrence(q ⊗ C, k̃ ⊗ B̄, d_h, log Ā, scale 2) with D_t = D_h (q_t·k̃_t) I_(d_h)
        per head. Input: v ([B, T, d_model], heads concatenated); output: o before W_o."""
        self.check_input(x)
        q, k, _, _ = self._qkv(x)
        qq, kk, gk = (t.detach() for t in self._recurrence(q, k))
        Bt, T, H, dh = q.shape
        d_skip = (self.D * (q * k).sum(-1)).detach().repeat_interleave(dh, dim=-1)  # [B, T, d]
        dtype = torch.complex128 if self.complex_modes else torch.float64  # DSF.evaluate needs one dtype
        return DSF.from_recurrence(qq, kk, dh, gk=gk, scale=self._out_scale, D=torch.diag_embed(d_skip.to(dtype)))

    def state_size(self, seq_len: int | None = None) -> int:
        d = self.config.d_model
        return d * self.head_dim * self.config.d_state + d * (self.shift_size - 1)


# ------------------------------------------------------------------------------------------
# Hyena
# ------------------------------------------------------------------------------------------

POSITIONAL_ENCODINGS = ("fourier", "time")


def positional_encoding(name: str, l_max: int, emb_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions fed to Hyena's filter network (note §13.3): (z [l_max, emb_dim], t [l_max, 1]).

    t_l = l/(l_max - 1) (normalized time in [0, 1]). ``fourier`` (Hyena's): z_l = [t_l,
    Re e^(-i f_j ω_l), Im e^(-i f_j ω_l)] for j < (emb_dim - 1)/2 bands, ω_l = 2πl/l_max,
    f = linspace(1e-4, bands - 1, bands); ``time``: z_l = [t_l] (emb_dim = 1).
    Position l has the same encoding whatever the sequence length T <= l_max, so a filter
    tap does not change when the sequence grows (decoding, carried states).
    """
    where = "positional_encoding"
    check_choice("positional_encoding", name, POSITIONAL_ENCODINGS, where)
    check_positive_int("l_max", l_max, where)
    t = torch.linspace(0, 1, l_max).unsqueeze(-1)
    if name == "time":
        if emb_dim != 1:
            raise ValueError(f"{where}: argument 'emb_dim' must be 1 for positional_encoding 'time', got {emb_dim}")
        return t, t
    if emb_dim < 3 or emb_dim % 2 == 0:
        raise ValueError(f"{where}: argument 'emb_dim' must be odd and >= 3 for 'fourier' (time, then cos/sin bands), got {emb_dim}")
    bands = (emb_dim - 1) // 2
    w = 2 * math.pi * torch.arange(l_max, dtype=torch.float64).unsqueeze(-1) / l_max
    f = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float64)
    z = torch.exp(-1j * f * w)
    return torch.cat([t, z.real.float(), z.imag.float()], -1), t


class HyenaFilter(nn.Module):
    """Implicit long filters (note §13.3): h_l = window(t_l) · FFN(z_l) for positions l < l_max.

    FFN: Linear(emb_dim, W) -> Sin -> [Linear(W, W) -> Sin] × num_inner -> Linear(W, channels,
    no bias), with Sin(a) = sin(ω ⊙ a) and one learnt frequency vector ω shared by every Sin
    of the network (as in the safari code). Window (ExponentialModulation): h_(l,c) ← h_(l,c) ·
    (exp(-t_l |δ_c|) + shift), δ = linspace(ln(target)/slow, ln(target)/fast, channels): channel c
    decays to ``target`` at between fast and slow (fractions of l_max). The positional encoding
    and the window rates are fixed buffers; the parameter count does not depend on l_max.
    """

    def __init__(self, channels: int, *, l_max: int, emb_dim: int, width: int, num_inner: int, freq: float,
                 positional: str, modulate: bool, fast_decay: float, slow_decay: float, target: float, shift: float):
        super().__init__()
        z, t = positional_encoding(positional, l_max, emb_dim)
        self.l_max, self.channels, self.modulate, self.shift = l_max, channels, modulate, shift
        self.register_buffer("z", z, persistent=False)
        self.register_buffer("t", t, persistent=False)
        self.register_buffer(
            "decay", torch.linspace(math.log(target) / slow_decay, math.log(target) / fast_decay, channels).abs(), persistent=False
        )
        self.freq = nn.Parameter(torch.full((width,), float(freq)))
        self.ffn_in = nn.Linear(emb_dim, width)
        self.ffn_hidden = nn.ModuleList(nn.Linear(width, width) for _ in range(num_inner))
        self.ffn_out = nn.Linear(width, channels, bias=False)

    def forward(self, L: int) -> torch.Tensor:
        """The first L taps [L, channels] (L <= l_max)."""
        if L > self.l_max:
            raise ValueError(f"HyenaFilter: {L} taps asked, more than l_max = {self.l_max} (the filter length)")
        # the filter network runs in float32 or wider under autocast and with half parameters:
        # sin(ω·a) of a bf16 argument is wrong by up to |ω·a|·2⁻⁸, and each tap multiplies T
        # inputs (relative error 0.42 of the layer's output at T = 256 in bf16; docs/scale.md)
        freq = upcast(self.freq)
        a = torch.sin(freq * linear_f32(self.ffn_in, self.z[:L]))
        for lin in self.ffn_hidden:
            a = torch.sin(freq * linear_f32(lin, a))
        h = linear_f32(self.ffn_out, a)
        if self.modulate:
            h = h * (torch.exp(-upcast(self.t[:L]) * upcast(self.decay)) + self.shift)
        return h


class HyenaConfig(MixerConfig):
    order: int = Field(2, ge=1, description="order N of the Hyena recurrence (see order_convention)")
    order_convention: Literal["code", "paper"] = Field(
        "code",
        description="'paper': N long filters, each followed by a gate; 'code' (safari): N gates and N-1 filters, "
        "the first gate before any filter (= the paper's form with h^1 = δ; order 2 is the H3 structure)",
    )
    l_max: int = Field(1024, gt=0, description="filter length: the longest sequence (context, with a cache) the layer takes")
    filter_order: int = Field(64, gt=0, description="width W of the filter FFN")
    num_inner_mlps: int = Field(2, ge=0, description="hidden Linear -> Sin layers of the filter FFN")
    positional_encoding: Literal["fourier", "time"] = Field("fourier", description="filter FFN input: 'fourier' (Hyena's) or 'time' (t only)")
    emb_dim: int = Field(33, gt=0, description="positional-encoding width: odd >= 3 for 'fourier' (the Pile config's 33), 1 for 'time'")
    sin_freq: float = Field(14.0, gt=0, description="initial frequency ω of the Sin activations (the Pile config's w = 14; code default 1)")
    modulate: bool = Field(True, description="multiply the filters by the exponential-decay window")
    fast_decay_pct: float = Field(0.3, gt=0, description="fastest channel decays to decay_target at this fraction of l_max")
    slow_decay_pct: float = Field(1.5, gt=0, description="slowest channel decays to decay_target at this fraction of l_max")
    decay_target: float = Field(1e-2, gt=0, lt=1, description="window value reached at the decay fraction")
    modulation_shift: float = Field(0.0, description="added to the window: h·(exp(-t|δ|) + shift)")
    short_filter_order: int = Field(3, gt=0, description="width of the short causal conv on the projections")
    bias: bool = Field(True, description="biases of the input and output projections")

    @model_validator(mode="after")
    def _fits(self):
        if self.order_convention == "code" and self.order < 2:
            raise ValueError(
                f"order = {self.order} with order_convention = 'code' has no long filter (order - 1 = 0 filters); "
                "use order >= 2, or order_convention = 'paper'"
            )
        if self.positional_encoding == "fourier" and (self.emb_dim < 3 or self.emb_dim % 2 == 0):
            raise ValueError(f"emb_dim = {self.emb_dim} must be odd and >= 3 for positional_encoding 'fourier' (time, cos and sin bands)")
        if self.positional_encoding == "time" and self.emb_dim != 1:
            raise ValueError(f"emb_dim = {self.emb_dim} must be 1 for positional_encoding 'time' (t only)")
        return self


@register("hyena", description="Hyena (Poli et al. 2023): short conv, implicit FFN filters, order-N gated long convolutions")
class Hyena(Mixer):
    """The Hyena operator (convblog note §13; Hyena paper §3, safari's HyenaOperator).

    x [B, T, d] -> u = ShortConv_3(W_in x) [B, T, (N+1)·d] (depthwise causal, width 3) split into
    v, x^1, ..., x^N (each [B, T, d]); filters h^f [T, d] and skips b^f [d] from :class:`HyenaFilter`;

        paper:  z^1 = v,  z^(n+1) = x^n ⊙ (h^n * z^n + b^n z^n)    n = 1..N         (N filters)
        code:   z^2 = x^1 ⊙ v,  z^(n+1) = x^n ⊙ (h^n * z^n + b^n z^n)    n = 2..N   (N - 1 filters)
        y = W_out z^(N+1)

    (the code's gates x[order-1], ..., x[0] are x^1, ..., x^N here, its k[o] is h^(o+2)). Each
    long convolution is ``fft_conv`` (mode "fft", FFT of size >= 2T, any T) or ``direct_conv``
    (mode "direct", the reference). Decoding (a T == 1 call with a cache, mode "step") is exact:
    the cache keeps the inputs z^n of every filter for all past tokens ("z", [B, t, filters, d])
    and the short conv's last inputs ("conv"), and computes (h * z)_t = Σ_(s<=t) h_(t-s) z_s for
    the new token only, O(t·d) per filter. The state grows with the context:
    filters·d_model·seq_len + (N+1)·d_model·(short_filter_order - 1) floats (``state_size``).

    No finite DSF (finite_state = False): the filters are arbitrary learnt length-l_max
    sequences, not kernels C Āˡ B̄ of a small system (the paper: "not recurrent"; later work
    distils them into SSMs). dsf(x) raises; phi(x) is exact:
    Φ_c = D_(x^N)(T_(h^N) + b^N I) ⋯ D_(x^1)(T_(h^1) + b^1 I) per channel ([B, d_model, T, T];
    the code convention's first factor is D_(x^1) alone), applied to values = v.
    """

    family = "convolution"
    modes = ("direct", "fft")
    reference_mode = "direct"
    state_formula = "filters·d_model·seq_len + (order+1)·d_model·(short_filter_order-1), filters = order (paper) or order-1 (code)"
    map_unit = "channel"
    finite_state = False
    Config = HyenaConfig

    def __init__(self, config: HyenaConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, N = c.d_model, c.order
        # which of the N gated stages convolve first: all (paper) or all but the first (code)
        self.filtered = [True] * N if c.order_convention == "paper" else [False] + [True] * (N - 1)
        self.n_filters = sum(self.filtered)
        self.in_proj = nn.Linear(d, (N + 1) * d, bias=c.bias)
        self.short_conv = ShortConv((N + 1) * d, c.short_filter_order, bias=True)
        self.filter = HyenaFilter(
            d * self.n_filters, l_max=c.l_max, emb_dim=c.emb_dim, width=c.filter_order, num_inner=c.num_inner_mlps,
            freq=c.sin_freq, positional=c.positional_encoding, modulate=c.modulate, fast_decay=c.fast_decay_pct,
            slow_decay=c.slow_decay_pct, target=c.decay_target, shift=c.modulation_shift,
        )
        self.filter_bias = nn.Parameter(torch.randn(self.n_filters, d))  # b^f, the long convolutions' skip D
        self.out_proj = nn.Linear(d, d, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "order": 2, "l_max": 64, "filter_order": 8, "emb_dim": 5}

    # -- parametrization -------------------------------------------------------------------

    def filters(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(h [filters, T, d_model], b [filters, d_model]): the first T taps of each long filter and its skip."""
        self._check_length(T)
        h = self.filter(T).view(T, self.d_model, self.n_filters)  # channel-major, filter-minor (safari's "(v o)")
        return h.permute(2, 0, 1), self.filter_bias

    def _check_length(self, T: int, past: int = 0) -> None:
        if T > self.config.l_max:
            ctx = f" ({past} cached + {T - past} new)" if past else ""
            raise ValueError(
                f"{type(self).__name__}: argument 'x' reaches position {T}{ctx}, beyond the filter length l_max = "
                f"{self.config.l_max} (the implicit filters are defined on l_max positions); build the layer with l_max >= {T}"
            )

    def _streams(self, x, conv_state=None, need_state=False):
        """v and the gates x^1..x^N ([B, T, d] each), and the short conv's new state."""
        u, conv = self.short_conv(self.in_proj(x), conv_state, output_final_state=need_state)
        v, *gates = u.split(self.d_model, dim=-1)
        return v, gates, conv

    @staticmethod
    def _long_conv(z, h, b, past, mode):
        """(h * z)_t + b z_t for the new inputs z [B, T, d] after the past inputs [B, t0, d] (or None)."""
        full = torch.cat([past, z], 1) if past is not None else z
        if mode == "step":  # the new token only: Σ_(s<=t) h_(t-s) z_s
            y = torch.einsum("bsd,sd->bd", full, h[: full.shape[1]].flip(0)).unsqueeze(1)
        elif mode == "direct":
            y = direct_conv(full, h)[:, full.shape[1] - z.shape[1] :]
        else:  # "fft", "auto"
            y = fft_conv(full, h, check_values=False)[:, full.shape[1] - z.shape[1] :]
        return y + b * z

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        past = state["z"] if state else None  # [B, t0, filters, d]
        t0 = past.shape[1] if past is not None else 0
        T = x.shape[1]
        self._check_length(t0 + T, t0)
        v, gates, conv = self._streams(x, state["conv"] if state else None, need_state)
        h, b = self.filters(t0 + T)
        z, inputs, f = v, [], 0
        for gate, filtered in zip(gates, self.filtered):  # over the order, not over time
            if filtered:
                inputs.append(z)
                z = self._long_conv(z, h[f], b[f], past[:, :, f] if past is not None else None, mode)
                f += 1
            z = gate * z
        new_state = None
        if need_state:
            zs = torch.stack(inputs, 2)
            new_state = {"z": torch.cat([past, zs], 1) if past is not None else zs, "conv": conv}
        return MixOut(self.out_proj(z), new_state, values=v.unsqueeze(-1), mixed=z.unsqueeze(-1))

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, d_model, T, T]: Φ_c = D_(x^N)(T_(h^N) + b^N I) ⋯ D_(x^1)(T_(h^1) + b^1 I) (lower triangular)."""
        self.check_input(x)
        T = x.shape[1]
        v, gates, _ = self._streams(x)
        h, b = self.filters(T)
        M, f = None, 0
        for gate, filtered in zip(gates, self.filtered):
            g = gate.transpose(1, 2)  # [B, d, T]
            if filtered:
                Tf = toeplitz(h[f], T) + torch.diag_embed(b[f].unsqueeze(-1).expand(-1, T))  # [d, T, T]
                factor = g.unsqueeze(-1) * Tf  # diag(g) · (T_h + b I)
                f += 1
            else:
                factor = torch.diag_embed(g)
            M = factor if M is None else factor @ M
        return M

    def dsf(self, x, **kwargs):
        raise ValueError(
            f"{type(self).__name__}: Hyena has no finite-state DSF form: its implicit filters are arbitrary length-l_max "
            "sequences, so the only exact state is every past filter input (what the decoding cache keeps, "
            "state_size(seq_len) floats); use phi(x) for its map"
        )

    def state_size(self, seq_len: int | None = None) -> int:
        if seq_len is None:
            raise ValueError(f"{type(self).__name__}.state_size: the decoding state grows with the context; pass 'seq_len'")
        c = self.config
        return self.n_filters * c.d_model * seq_len + self.short_conv.state_size()


# ------------------------------------------------------------------------------------------
# GSS
# ------------------------------------------------------------------------------------------


class GSSConfig(DiagonalSSMConfig):
    init: Literal["lin", "inv", "real", "legs"] = Field("legs", description="DSS modes: S4D-LegS (DSS's skew-HiPPO normal part, default), lin, inv, real")
    d_gate: int | None = Field(None, gt=0, description="width F of the gate U (default 4·d_model, the paper's F = 4E)")
    d_ssm: int | None = Field(None, gt=0, description="width H of the stream through the DSS (default d_model/4, the paper's H = E/4)")
    simplified: bool = Field(False, description="the blog's form: no reduction before the SSM (H = F) and no W_3")
    activation: Literal["gelu", "none"] = Field("gelu", description="φ_u, φ_v on the two projections (GELU in the paper)")
    bias: bool = Field(True, description="biases of the dense layers")

    @model_validator(mode="after")
    def _widths(self):
        if self.simplified and self.d_ssm is not None and self.d_ssm != (self.d_gate or 4 * self.d_model):
            raise ValueError(f"d_ssm = {self.d_ssm} must equal d_gate with simplified = True (no reduction before the SSM), or be left unset")
        return self


@register("gss", description="GSS (Mehta et al. 2023): GELU gate ⊙ DSS long convolution (S4D/DSS kernel), GAU-style")
class GSS(DiagonalSSM, Mixer):
    """Gated State Space layer (convblog note §10; GSS paper Fig. 1).

    x [B, T, d] ->  U = φ(W_u x) [B, T, F] (the gate),  V = φ(W_v x) [B, T, H],
                    V̂_c = K_c * V_c + D_c V_c   (one diagonal SSM per channel: DSS)
                    y = W_o (U ⊙ W_3 V̂)          (simplified: y = W_o (U ⊙ V̂), H = F).

    DSS-EXP's kernel K_l = Re Σ_n w_n (e^(λ_nΔ) - 1)/λ_n e^(λ_n lΔ) is the S4D ZOH kernel with B
    folded into w = 2·C·B (:class:`~seqmix.mixers.ssm.DiagonalSSM`; LegS modes by default, as
    DSS). The paper's LayerNorm on the input and its residual shortcut belong to the block
    (seqmix.models), not to the mixer. Modes "fft", "recurrent", "chunk" as S4D.

    Maps of phi(x): one per DSS channel, [B, d_ssm, T, T] (values V, mixed V̂). State:
    d_ssm·d_state floats.
    """

    family = "convolution"
    modes = ("recurrent", "chunk", "fft")
    reference_mode = "recurrent"
    state_formula = "d_ssm·d_state"
    map_unit = "channel"
    Config = GSSConfig

    def __init__(self, config: GSSConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d = c.d_model
        self.d_gate = c.d_gate or 4 * d
        self.d_ssm = self.d_gate if c.simplified else (c.d_ssm or max(1, d // 4))
        self.W_u = nn.Linear(d, self.d_gate, bias=c.bias)
        self.W_v = nn.Linear(d, self.d_ssm, bias=c.bias)
        self._init_diagonal_ssm(self.d_ssm)
        self.W_3 = None if c.simplified else nn.Linear(self.d_ssm, self.d_gate, bias=c.bias)
        self.W_o = nn.Linear(self.d_gate, d, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_gate": 32, "d_ssm": 8, "d_state": 8, "chunk_size": 8}

    def _act(self, t):
        return F.gelu(t) if self.config.activation == "gelu" else t

    def _forward(self, x, *, state, mode, need_state):
        U, V = self._act(self.W_u(x)), self._act(self.W_v(x))
        V_hat, S = self._diagonal_ssm(V, state=state, mode=mode, need_state=need_state)
        uc = self.W_3(V_hat) if self.W_3 is not None else V_hat
        return MixOut(self.W_o(U * uc), {"S": S} if need_state else None, values=V.unsqueeze(-1), mixed=V_hat.unsqueeze(-1))

    def state_size(self, seq_len: int | None = None) -> int:
        return self.d_ssm * self.config.d_state


# ------------------------------------------------------------------------------------------
# the gated short convolution (LFM2)
# ------------------------------------------------------------------------------------------


def _fir(weight: torch.Tensor, L: int, dtype) -> torch.Tensor:
    """A depthwise causal conv's taps weight [C, W] (``causal_conv1d``: w[:, W-1] multiplies the current
    input) as a causal filter k [L, C]: k[j] = w[:, W-1-j] (j < W), zeros after."""
    k = weight.flip(-1).t().to(dtype)
    W = k.shape[0]
    return F.pad(k, (0, 0, 0, L - W)) if L > W else k[:L]


def shift_register_dsf(b: torch.Tensor, c: torch.Tensor, weight: torch.Tensor) -> DSF:
    """The DSF of y_t = c_t ⊙ Σ_(j<W) w_j ⊙ (b ⊙ u)_(t-W+1+j) per channel (a depthwise causal conv of W taps
    between two elementwise gates b, c [B, T, C]; weight [C, W] as ``causal_conv1d``'s): per channel
    h_i ∈ R^W holds the last W gated inputs, Λ the shift (Λ[j, j+1] = 1: nilpotent, all eigenvalues 0),
    B_i = b_i e_W, C_i = c_i w, D_i = 0. Dense (N = C·W: a theory object for small C), float64."""
    b, c = (t.detach().to(torch.float64) for t in (b, c))
    Bt, T, d = b.shape
    W = weight.shape[-1]
    N = d * W
    shift = torch.diag(torch.ones(W - 1, dtype=torch.float64, device=b.device), 1)  # Λ[j, j+1] = 1
    Lam = torch.block_diag(*[shift] * d).expand(Bt, T, N, N)
    e_last = torch.zeros(W, dtype=torch.float64, device=b.device)
    e_last[-1] = 1
    eye = torch.eye(d, dtype=torch.float64, device=b.device)
    Bm = torch.einsum("btc,cd,j->btcjd", b, eye, e_last).reshape(Bt, T, N, d)
    w = weight.detach().to(torch.float64)  # [d, W]
    Cm = torch.einsum("btc,cd,dj->btcdj", c, eye, w).reshape(Bt, T, d, N)
    return DSF.from_dense(Lam, Bm, Cm)


class ShortConvConfig(MixerConfig):
    width: int = Field(3, ge=1, description="W, the taps of the depthwise causal conv (LFM2's conv_L_cache)")
    bias: bool = Field(False, description="biases of in_proj, the conv and out_proj (LFM2's conv_bias)")


@register("short_conv", description="gated short convolution (LFM2): y = W_o(c ⊙ conv_W(b ⊙ x)), (b, c, x) = in_proj(u)")
class GatedShortConv(Mixer):
    """The gated short convolution of LFM2 (Liquid AI; transformers' ``Lfm2ShortConv``), per channel:

        (b_t, c_t, x_t) = in_proj(u_t),   z_t = b_t ⊙ x_t,   h_t = Σ_(j<W) w_j z_(t-W+1+j) (+ bias),
        y_t = out_proj(c_t ⊙ h_t)

    Hyena of order 2 in the code's convention (x² ⊙ (h * (x¹ ⊙ v))) with an explicit W-tap filter
    instead of an implicit long one, hence a finite state: the last W - 1 products z.

    Modes: "direct" (``causal_conv1d``, the sum of W shifted copies: the reference) and "fft"
    (``fft_conv`` of the filter zero-padded to the sequence: the convolution is time-invariant).

    DSF view (values x, maps = channels, mixed = c ⊙ conv(b ⊙ x) without the conv bias, which adds
    c ⊙ bias outside the map): Φ_c[t, s] = c_(t,c) w_(c, W-1-(t-s)) b_(s,c) for 0 <= t - s < W. As a
    system per channel, h_i ∈ R^W holds z_(i-W+1) .. z_i: Λ is the shift (Λ[j, j+1] = 1; nilpotent, all
    eigenvalues 0, not diagonal), B_i = b_i e_W, C_i = c_i w (the W taps), D_i = 0. ``dsf(x)`` builds
    it densely (N = d·W: a theory object for small d). The decoding state is the W - 1 inputs the
    next step reads (transformers' conv cache keeps W of them).
    """

    family = "convolution"
    modes = ("direct", "fft")
    reference_mode = "direct"
    state_formula = "d_model·(W-1)"
    map_unit = "channel"
    diagonal_transition = False
    Config = ShortConvConfig

    def __init__(self, config: ShortConvConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        d, W = c.d_model, c.width
        self.in_proj = nn.Linear(d, 3 * d, bias=c.bias)
        self.conv = ShortConv(d, W, bias=c.bias)
        self.out_proj = nn.Linear(d, d, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "width": 3, "bias": True}

    def _streams(self, x):
        b, c, v = self.in_proj(x).chunk(3, dim=-1)
        return b, c, v

    def _filter(self, L: int, dtype) -> torch.Tensor:
        """The conv as a causal filter k [L, d]: k[j] = w[:, W-1-j] (j < W), zeros after."""
        return _fir(self.conv.weight, L, dtype)

    def _forward(self, x, *, state, mode, need_state):
        b, c, v = self._streams(x)
        z = b * v
        prev = state.get("conv") if state else None
        W = self.config.width
        if mode == "fft":
            B_, T, d = z.shape
            past = prev.transpose(1, 2).to(z.dtype) if prev is not None else z.new_zeros(B_, W - 1, d)
            full = torch.cat([past, z], dim=1)
            h = fft_conv(full, self._filter(full.shape[1], z.dtype), check_values=False)[:, W - 1:]
            new = full[:, full.shape[1] - (W - 1):].transpose(1, 2) if need_state else None
        elif mode == "step":
            y1, new = causal_conv1d_step(z[:, 0], self.conv.weight, None, prev)
            h = y1.unsqueeze(1)
        else:
            h, new = causal_conv1d(z, self.conv.weight, None, prev, output_final_state=need_state)
        mixed = c * h
        out = mixed + c * self.conv.bias if self.conv.bias is not None else mixed
        return MixOut(self.out_proj(out), {"conv": new} if need_state else None, values=v.unsqueeze(-1), mixed=mixed.unsqueeze(-1))

    # -- the DSF view ----------------------------------------------------------------------

    def phi(self, x):
        """[B, d_model, T, T]: Φ_c[t, s] = c_(t,c) w_(c, W-1-(t-s)) b_(s,c), 0 <= t - s < W."""
        self.check_input(x)
        b, c, _ = self._streams(x)
        T = x.shape[1]
        K = toeplitz(self._filter(T, x.dtype), T)  # [d, T, T]
        return c.transpose(1, 2).unsqueeze(-1) * K.unsqueeze(0) * b.transpose(1, 2).unsqueeze(-2)

    def dsf(self, x):
        """Per channel the W-state shift register (see the class docstring), dense: N = d·W."""
        self.check_input(x)
        b, c, _ = self._streams(x)
        return shift_register_dsf(b, c, self.conv.weight)

    def spectrum(self, x):
        """The eigenvalues of the shift Λ: all 0 (nilpotent: the map reaches back W - 1 tokens exactly)."""
        self.check_input(x)
        return torch.zeros(x.shape[0], x.shape[1], self.config.d_model * self.config.width, dtype=torch.complex128)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.config.d_model * (self.config.width - 1)


# ------------------------------------------------------------------------------------------
# RWKV's channel-mix: a token shift (a width-2 conv) read by a squared-ReLU MLP and a receptance gate
# ------------------------------------------------------------------------------------------


class RWKVChannelMixConfig(MixerConfig):
    d_ff: int | None = Field(None, gt=0, description="width of the squared-ReLU key (RWKV's intermediate_size; None: 4·d_model)")


@register("rwkv_channel_mix",
          description="RWKV's channel-mix: σ(W_r x_r) ⊙ W_v relu(W_k x_k)², x_□ = μ_□ ⊙ x_t + (1 - μ_□) ⊙ x_(t-1)")
class RWKVChannelMix(Mixer):
    """RWKV's channel-mix (the feed-forward block of RWKV-4, Peng et al. 2023, eqs. 17-19; transformers'
    ``RwkvFeedForward``):

        x_□,t = μ_□ ⊙ x_t + (1 - μ_□) ⊙ x_(t-1)     (□ = k, r: the token shift)
        y_t = σ(W_r x_r,t) ⊙ W_v relu(W_k x_k,t)²

    It mixes tokens only through the token shift, a depthwise causal conv of width 2 with the taps
    (1 - μ, μ): ``causal_conv1d`` on the input read twice, [x, x] [B, T, 2·d], with the k taps on the first
    d channels and the r taps on the last d; everything after it acts on one token. The core map is that
    conv (maps = the 2·d channels (k then r), values [x, x]): Φ_c[t, t] = μ_c, Φ_c[t, t-1] = 1 - μ_c. As a
    system per channel, the shift register of :func:`shift_register_dsf` with W = 2: Λ = [[0, 1], [0, 0]]
    (nilpotent), B_i = e_2, C_i = (1 - μ_c, μ_c), D_i = 0. The decoding state is the last input x_(t-1)
    [B, d] ("x_prev", shared by both streams: RWKV's FFN state).

    Modes: "direct" (``causal_conv1d``; a decoding step: the two taps' sums as ``torch.lerp``, ``token_mix``).
    """

    family = "convolution"
    modes = ("direct",)
    reference_mode = "direct"
    state_formula = "d_model"
    map_unit = "channel"
    diagonal_transition = False
    Config = RWKVChannelMixConfig

    def __init__(self, config: RWKVChannelMixConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        d = self.config.d_model
        F_ = self.config.d_ff or 4 * d
        ramp = torch.arange(d, dtype=torch.float32) / d  # μ_k = μ_r = i/d: the RWKV-4 code's layer-0 initialization
        self.mu_k = nn.Parameter(ramp.clone())
        self.mu_r = nn.Parameter(ramp.clone())
        self.W_k = nn.Linear(d, F_, bias=False)
        self.W_r = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(F_, d, bias=False)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_ff": 24}

    def taps(self) -> torch.Tensor:
        """The token shift's conv taps [2·d, 2] (``causal_conv1d``'s layout): rows (1 - μ, μ), k then r."""
        mu = torch.cat([self.mu_k, self.mu_r])
        return torch.stack([1 - mu, mu], dim=-1)

    def _forward(self, x, *, state, mode, need_state):
        d = self.config.d_model
        prev = state.get("x_prev") if state else None
        if mode == "step":  # one token: the two taps' sums, (1 - μ) x_(t-1) + μ x_t, as two lerps (no conv call)
            p = prev.unsqueeze(1) if prev is not None else torch.zeros_like(x)
            xk, xr = token_mix(p, x, self.mu_k), token_mix(p, x, self.mu_r)
            values, mixed = lambda: torch.cat([x, x], dim=-1).unsqueeze(-1), lambda: torch.cat([xk, xr], dim=-1).unsqueeze(-1)
        else:
            xx = torch.cat([x, x], dim=-1)  # [B, T, 2d]: the input read by the k taps and by the r taps
            prev = None if prev is None else torch.cat([prev, prev], dim=-1).unsqueeze(-1)  # [B, 2d, 1]
            shifted, _ = causal_conv1d(xx, self.taps(), None, prev)
            xk, xr = shifted[..., :d], shifted[..., d:]
            values, mixed = xx.unsqueeze(-1), shifted.unsqueeze(-1)
        mods = self._modules  # (the projections without the module call's frames: project keeps hooks and wrappers)
        y = torch.sigmoid(project(mods["W_r"], xr)) * project(mods["W_v"], torch.relu(project(mods["W_k"], xk)).square())
        return MixOut(y, {"x_prev": x.select(1, -1)} if need_state else None, values=values, mixed=mixed)

    # -- the DSF view ----------------------------------------------------------------------

    def phi(self, x):
        """[B, 2·d_model, T, T]: Φ_c[t, t] = μ_c, Φ_c[t, t-1] = 1 - μ_c (k's channels, then r's)."""
        self.check_input(x)
        T = x.shape[1]
        K = toeplitz(_fir(self.taps(), T, x.dtype), T)  # [2d, T, T]
        return K.unsqueeze(0).expand(x.shape[0], -1, -1, -1)

    def dsf(self, x):
        """Per channel the 2-state shift register (see the class docstring), dense: N = 2·d·2."""
        self.check_input(x)
        ones = x.new_ones(x.shape[0], x.shape[1], 2 * self.config.d_model)
        return shift_register_dsf(ones, ones, self.taps())

    def spectrum(self, x):
        """The eigenvalues of the shift Λ: all 0 (the map reaches back one token exactly)."""
        self.check_input(x)
        return torch.zeros(x.shape[0], x.shape[1], 4 * self.config.d_model, dtype=torch.complex128)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.config.d_model
