"""State space models in the DSF: S4, S4D, S6 / Mamba, SSD / Mamba-2, Mamba-3 and the DSF paper's MQAR "SSD".

Every model here is h_i = Λ_i h_{i-1} + B_i u_i, y_i = C_i h_i + D_i u_i (DSF paper eq. 11)
with one SSM per channel (S4, S4D, S6) or per head (SSD):

* time-invariant (S4, S4D; dsf note §3.10): Λ_i = Ā, B_i = B̄, C_i = C; the map is a
  Toeplitz convolution with kernel K_l = C Āˡ B̄, computed by ``seqmix.ops.ssm``
  (Cauchy + Woodbury for S4's DPLR Ā, Vandermonde for S4D's diagonal Ā) and applied
  by ``seqmix.ops.conv.fft_conv`` (mode "fft"); the recurrent modes run the
  discretized system (S4: ``ssm_scan`` with a dense Ā; S4D: ``linear_recurrence``
  with a constant complex decay).
* selective (S6, DSF paper eq. 4 and 19; SSD, Mamba-2): Λ_i = exp(Δ_i A), B_i = Δ_i b_i,
  C_i = c_i with Δ_i = softplus(W_Δ u_i + b_Δ): ``linear_recurrence`` with q = C_t,
  k = Δ_t B_t, v = x_t and log-decay gk = Δ_t A (A < 0, Mamba's sign: the paper's
  positive A is exp(A_log), so Λ = exp(-Δ·exp(A_log))); S6's recurrent mode runs the
  same recurrence through ``seqmix.ops.selective_scan`` (a hand-written backward).

Conventions (docs/ssm.md has the full list): tensors [batch, time, ...]; S6's channels are
heads of ``linear_recurrence`` with K = d_state, V = 1; SSD's heads have K = d_state,
V = headdim; Mamba's semantics exactly (delta_softplus with the dt bias added inside,
A = -exp(A_log), B̄ = ΔB "ZOH-A / Euler-B", D skip per channel).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..dsf import DSF
from ..ops import linear_recurrence, recurrence_map
from ..ops.precision import complex_, upcast
from ..ops.conv import fft_conv, toeplitz
from ..ops.selective_scan import selective_scan, selective_scan_step
from ..ops.ssm import (
    diagonal_ssm_conv, discretize, dplr_kernel, nplr_legs, rotate_pairs, s4d_init, ssm_final_state, ssm_free_response,
    ssm_scan, trapezoidal_map, trapezoidal_recurrence, vandermonde_kernel,
)
from .base import Mixer, MixerConfig, MixOut, register, register_preset
from .layers import RMSNorm, ShortConv

# ------------------------------------------------------------------------------------------
# shared initializations
# ------------------------------------------------------------------------------------------


def log_uniform(n: int, lo: float, hi: float) -> torch.Tensor:
    """n samples log-uniform in [lo, hi]."""
    return torch.exp(torch.rand(n) * (math.log(hi) - math.log(lo)) + math.log(lo))


def dt_bias_init(n: int, dt_min: float, dt_max: float, floor: float) -> torch.Tensor:
    """Mamba's Δ bias: dt log-uniform in [dt_min, dt_max] (clamped at ``floor``), stored as its
    inverse softplus, so that softplus(bias) = dt at initialization."""
    dt = log_uniform(n, dt_min, dt_max).clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


def _complex_param(z: torch.Tensor) -> nn.Parameter:
    """A complex tensor stored as a real parameter [..., 2] (``Module.to(dtype)`` keeps it intact)."""
    return nn.Parameter(torch.view_as_real(z.to(torch.complex64)).clone())


def _as_complex(p: torch.Tensor) -> torch.Tensor:
    """The complex tensor a :func:`_complex_param` stores (complex64 at least: a half parameter is upcast)."""
    return torch.view_as_complex(upcast(p).contiguous())


class _DtRange(MixerConfig):
    dt_min: float = Field(1e-3, gt=0, description="smallest Δ at initialization (log-uniform in [dt_min, dt_max])")
    dt_max: float = Field(1e-1, gt=0, description="largest Δ at initialization")

    @model_validator(mode="after")
    def _dt_range(self):
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min = {self.dt_min} must be <= dt_max = {self.dt_max}")
        return self


def _readout(y_core, activation: str, out_proj: nn.Linear):
    """The position-wise readout of S4 / S4D after the core: activation, then out_proj."""
    return out_proj(F.gelu(y_core) if activation == "gelu" else y_core)


def _toeplitz_map(K: torch.Tensor, D: torch.Tensor, T: int, batch: int) -> torch.Tensor:
    """[batch, H, T, T]: the Toeplitz map of the kernel K [H, >=T] plus D on the diagonal."""
    M = toeplitz(K[:, :T].transpose(0, 1), T) + torch.diag_embed(D.unsqueeze(-1).expand(-1, T))
    return M.unsqueeze(0).expand(batch, -1, -1, -1)


# ------------------------------------------------------------------------------------------
# S4: HiPPO-LegS in DPLR form, Cauchy kernel
# ------------------------------------------------------------------------------------------


class S4Config(_DtRange):
    d_state: int = Field(64, gt=0, description="state size N per channel (even: N/2 conjugate pairs of modes)")
    l_max: int = Field(1024, gt=0, description="kernel length the layer is built for (C̃ = C(I - Ā^l_max) is learnt)")
    on_longer: Literal["error", "recompute"] = Field(
        "error", description="mode 'fft' on T > l_max: raise, or recompute C̃ for length T from C (exact, O(N³ log T))"
    )
    activation: Literal["gelu", "none"] = Field("gelu", description="activation between the core and out_proj")

    @model_validator(mode="after")
    def _even_state(self):
        if self.d_state % 2:
            raise ValueError(f"d_state = {self.d_state} must be even (S4 stores N/2 conjugate pairs of modes)")
        return self


@register("s4", description="S4 (Gu et al. 2022): HiPPO-LegS DPLR SSM, Cauchy + Woodbury kernel, FFT convolution")
class S4(Mixer):
    """S4 with the HiPPO-LegS initialization in DPLR form (convblog note §8-9).

    Per channel h (H = d_model channels, each its own single-input SSM of N = d_state states):

        A = diag(Λ) - P P*   (Λ = -exp(log_A_real) + i·A_imag, M = N/2 conjugate pairs),
        bilinear discretization with Δ = exp(log_dt),
        K_l = C Āˡ B̄ (dplr_kernel: generating function at the roots of unity, Cauchy
              kernel, Woodbury correction; C̃ = C(I - Ā^l_max) is the learnt parameter, as in S4),
        y_core = K * u + D u,     y = out_proj(gelu(y_core)).

    Modes: "fft" (the kernel, ``fft_conv``) and "recurrent" (the same system as a real dense
    N×N recurrence, ``ssm_scan``; also the decoding step). The recurrent state is the real
    form [Re h; Im h] of the N/2 complex pair states: d_model·d_state floats per sequence.
    With a carried state the fft mode adds the free response C Ā^(t+1) h_0 and computes the
    final state by ``ssm_free_response`` / ``ssm_final_state``.

    Maps of phi(x): one per channel, [B, d_model, T, T] (Toeplitz, the same for every x).
    dsf(x) diagonalizes the dense Ā numerically (eig in float64): exact in exact arithmetic,
    but the eigenvectors of LegS-like matrices are ill-conditioned (cond ≈ 8e4 at N = 8,
    1e10 at N = 16, convblog note §8.3), so its accuracy degrades with d_state.
    """

    family = "ssm"
    modes = ("recurrent", "fft")
    reference_mode = "recurrent"
    state_formula = "d_model·d_state"
    map_unit = "channel"
    Config = S4Config

    def __init__(self, config: S4Config | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        H, N = c.d_model, c.d_state
        Lam, P, B, _ = nplr_legs(N)  # float64, M = N/2
        self.log_dt = nn.Parameter(log_uniform(H, c.dt_min, c.dt_max).log())
        self.log_A_real = nn.Parameter((-Lam.real).log().float().repeat(H, 1))
        self.A_imag = nn.Parameter(Lam.imag.float().repeat(H, 1))
        self.P = _complex_param(P.repeat(H, 1))
        self.B = _complex_param(B.repeat(H, 1))
        self.C = _complex_param(torch.randn(H, N // 2, dtype=torch.complex64))  # C̃ for length l_max
        self.D = nn.Parameter(torch.randn(H))
        self.out_proj = nn.Linear(H, H)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_state": 8, "l_max": 32}

    # -- parametrization -------------------------------------------------------------------

    def _dplr(self):
        """(Δ [H], Λ [H, M], P [H, M], B [H, M], C̃ [H, M]) of the continuous-time DPLR system."""
        Lam = complex_(-self.log_A_real.exp(), self.A_imag)  # complex64 or wider (docs/scale.md)
        return upcast(self.log_dt).exp(), Lam, _as_complex(self.P), _as_complex(self.B), _as_complex(self.C)

    def _real_system(self):
        """The discretized system in real form: (Ā [H, N, N], B̄ [H, N], C [H, N]).

        The N = 2M complex states [h; conj h] evolve as h' = X h + Y conj(h) + B u with
        X = diag(Λ) - P Pᴴ and Y = -P Pᵀ (the blocks of A = diag(Λ, Λ̄) - [P; P̄][P; P̄]*);
        in the real coordinates [Re h; Im h] this is a real N×N system, discretized by the
        bilinear rule. Its output row is C = C̃ (I - Ā^l_max)⁻¹, the C that C̃ stands for.
        """
        dt, Lam, P, B, Ct = self._dplr()
        X = torch.diag_embed(Lam) - P.unsqueeze(-1) * P.conj().unsqueeze(-2)
        Y = -P.unsqueeze(-1) * P.unsqueeze(-2)
        A = torch.cat([torch.cat([X.real + Y.real, Y.imag - X.imag], -1), torch.cat([X.imag + Y.imag, X.real - Y.real], -1)], -2)
        Ab, Bb = discretize(A, torch.cat([B.real, B.imag], -1), dt, "bilinear", structure="dense")
        Ct_real = torch.cat([2 * Ct.real, -2 * Ct.imag], -1)
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        C = torch.linalg.solve((eye - torch.linalg.matrix_power(Ab, self.config.l_max)).mT, Ct_real.unsqueeze(-1)).squeeze(-1)
        return Ab, Bb, C

    def kernel(self, T: int) -> torch.Tensor:
        """K [d_model, T] (the convolution kernel of each channel)."""
        c = self.config
        dt, Lam, P, B, Ct = self._dplr()
        L = c.l_max
        if T > L:
            if c.on_longer == "error":
                raise ValueError(
                    f"{type(self).__name__}: argument 'x' has T = {T} tokens, more than l_max = {L}, the kernel length this "
                    f"layer was built for (its C̃ = C(I - Ā^l_max) is tied to l_max); build it with l_max >= {T}, "
                    f"set on_longer='recompute', or use mode 'recurrent'"
                )
            Ab, _, C = self._real_system()  # C̃ for length T: C (I - Ā^T), back to the half complex form
            eye = torch.eye(Ab.shape[-1], dtype=Ab.dtype, device=Ab.device)
            Ct_real = (C.unsqueeze(-2) @ (eye - torch.linalg.matrix_power(Ab, T))).squeeze(-2)
            M = Ct_real.shape[-1] // 2
            Ct = complex_(Ct_real[..., :M], -Ct_real[..., M:]) / 2
            L = T
        return dplr_kernel(Lam, P.unsqueeze(0), B, Ct, dt, L)[:, :T]

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        u = x  # [B, T, H]: S4 acts on the d_model channels directly
        T = u.shape[1]
        h0 = state["S"] if state else None
        if mode in ("auto", "fft"):
            y = fft_conv(u, self.kernel(T).transpose(0, 1), self.D, check_values=False)
            S = None
            if h0 is not None or need_state:
                Ab, Bb, C = self._real_system()
                if h0 is not None:
                    y = y + ssm_free_response(Ab, C, h0, T)
                if need_state:
                    S = ssm_final_state(u, Ab, Bb, initial_state=h0)
        else:  # "recurrent" or "step": the discretized system itself
            Ab, Bb, C = self._real_system()
            y, S = ssm_scan(u, Ab, Bb, C, initial_state=h0, output_final_state=need_state)
            y = y + self.D * u
        out = _readout(y, self.config.activation, self.out_proj)
        return MixOut(out, {"S": S} if need_state else None, values=u.unsqueeze(-1), mixed=y.unsqueeze(-1))

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, d_model, T, T]: Φ[t, s] = K_(t-s) + D δ_ts per channel."""
        self.check_input(x)
        T = x.shape[1]
        return _toeplitz_map(self.kernel(T), self.D, T, x.shape[0])

    def dsf(self, x):
        """The system with Ā diagonalized (float64 eig): Λ = eig(Ā), B = V⁻¹B̄, C = C V, D = diag(D);
        complex, real output. Input: x (the channels); output: y_core."""
        self.check_input(x)
        Bt, T, H = x.shape
        Ab, Bb, C = (t.detach().double() for t in self._real_system())
        evals, V = torch.linalg.eig(Ab)
        Bd = torch.linalg.solve(V, Bb.to(V.dtype).unsqueeze(-1)).squeeze(-1)
        Cd = (C.to(V.dtype).unsqueeze(-2) @ V).squeeze(-2)

        def seq(t):  # [H, N] -> [B, T, H, N]
            return t.expand(Bt, T, *t.shape)

        D = torch.diag_embed(self.D.detach().to(torch.complex128)).expand(Bt, T, H, H)  # complex: DSF.evaluate needs one dtype
        return DSF.from_recurrence(seq(Cd), seq(Bd), 1, gk=seq(evals.log()), D=D)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.config.d_model * self.config.d_state


# ------------------------------------------------------------------------------------------
# S4D: diagonal SSM, Vandermonde kernel
# ------------------------------------------------------------------------------------------


class DiagonalSSMConfig(_DtRange):
    """Fields of a diagonal LTI SSM (S4D; also H3's diagonal SSM and GSS's DSS)."""

    d_state: int = Field(64, gt=0, description="state size N of each SSM (complex inits: N/2 conjugate pairs)")
    init: Literal["lin", "inv", "real", "legs"] = Field("lin", description="S4D-Lin, S4D-Inv, S4D-Real or S4D-LegS")
    discretization: Literal["zoh", "bilinear"] = Field("zoh", description="ZOH (S4D default) or bilinear")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _fits(self):
        if self.init != "real" and self.d_state % 2:
            raise ValueError(f"d_state = {self.d_state} must be even for init = {self.init!r} (N/2 conjugate pairs of modes)")
        if self.init == "real" and self.discretization == "bilinear":
            raise ValueError(
                "discretization = 'bilinear' does not fit init = 'real': for Δλ < -2 the bilinear Ā is negative and "
                "has no real log-decay; use discretization = 'zoh' or a complex init"
            )
        return self


class DiagonalSSM:
    """Mixin: H independent diagonal LTI SSMs (the S4D parametrization), shared by S4D, H3's
    diagonal SSM (one per head) and GSS's DSS (one per channel). The class using it has a
    ``config`` with the fields of :class:`DiagonalSSMConfig` and calls
    :meth:`_init_diagonal_ssm` in its ``__init__``.

    Per SSM h: modes λ_n (init lin, inv, legs: M = N/2 complex conjugate pairs, output 2·Re;
    real: N real modes λ_n = -(n+1)), Re λ = -exp(log_A_real) < 0, Ā = exp(Δλ) and
    B̄ = (exp(Δλ)-1)/λ·B (ZOH) or the bilinear rule, Δ = exp(log_dt) log-uniform in
    [dt_min, dt_max] at init, C complex normal, skip D normal:

        K_l = 2·Re Σ_n C_n B̄_n Ā_nˡ (Vandermonde),      y = K * u + D u.
    """

    def _init_diagonal_ssm(self, H: int) -> None:
        c = self.config
        Lam, B = s4d_init(c.init, c.d_state)
        self.complex_modes = Lam.is_complex()
        self.log_dt = nn.Parameter(log_uniform(H, c.dt_min, c.dt_max).log())
        self.log_A_real = nn.Parameter((-Lam.real).log().float().repeat(H, 1))
        if self.complex_modes:
            self.A_imag = nn.Parameter(Lam.imag.float().repeat(H, 1))
            self.B = _complex_param(B.repeat(H, 1))
            self.C = _complex_param(torch.randn(H, Lam.shape[0], dtype=torch.complex64))
        else:
            self.B = nn.Parameter(B.float().repeat(H, 1))
            self.C = nn.Parameter(torch.randn(H, Lam.shape[0]))
        self.D = nn.Parameter(torch.randn(H))

    def discrete(self):
        """(log Ā, B̄, C), each [H, M]: the discretized diagonal systems."""
        dt = upcast(self.log_dt).exp()  # the system in float32 or wider, complex64 or wider (docs/scale.md)
        re = -upcast(self.log_A_real).exp()
        if self.complex_modes:
            Lam, B, C = complex_(re, self.A_imag), _as_complex(self.B), _as_complex(self.C)
        else:
            Lam, B, C = re, upcast(self.B), upcast(self.C)
        Ab, Bb = discretize(Lam, B, dt, self.config.discretization)
        log_Ab = dt.unsqueeze(-1) * Lam if self.config.discretization == "zoh" else Ab.log()
        return log_Ab, Bb, C

    @property
    def _out_scale(self) -> float:
        return 2.0 if self.complex_modes else 1.0  # 2·Re for conjugate pairs

    def kernel(self, T: int) -> torch.Tensor:
        """K [H, T] (the convolution kernel of each SSM, without D)."""
        log_Ab, Bb, C = self.discrete()
        return vandermonde_kernel(log_Ab, Bb, C, T, conj_pairs=self.complex_modes)

    def _diagonal_ssm(self, u, *, state, mode, need_state):
        """y = K * u + D u on u [B, T, H] in ``mode`` ("fft"/"auto": ``diagonal_ssm_conv``; else
        ``linear_recurrence`` with heads = SSMs, q = C, k = B̄, v = u, gk = log Ā), continuing
        from state["S"] [B, H, M, 1]. Returns (y [B, T, H], final state [B, H, M, 1] or None)."""
        Bt, T, H = u.shape
        log_Ab, Bb, C = self.discrete()
        if mode in ("auto", "fft"):
            y, S = diagonal_ssm_conv(
                u, log_Ab, Bb, C, self.D,
                initial_state=state["S"][..., 0] if state else None, output_final_state=need_state,
                conj_pairs=self.complex_modes, check_values=False,
            )
            return y, (S.unsqueeze(-1) if S is not None else None)

        def seq(t):  # [H, M] -> [B, T, H, M]
            return t.expand(Bt, T, *t.shape)

        o, S = linear_recurrence(
            seq(C), seq(Bb), u.unsqueeze(-1), seq(log_Ab),
            initial_state=state["S"] if state else None,
            output_final_state=need_state,
            mode=mode,
            chunk_size=self.config.chunk_size,
            check_values=False,
        )
        o = o[..., 0]
        return (self._out_scale * o.real if o.is_complex() else o) + self.D * u, S

    def phi(self, x):
        """[B, H, T, T]: the Toeplitz map of each SSM's kernel K plus D on the diagonal (S4D: H =
        d_model, from u to y; GSS: H = d_ssm, from V to V̂; H3 overrides it)."""
        self.check_input(x)
        return self._diagonal_phi(x.shape[0], x.shape[1])

    def dsf(self, x):
        """The SSMs as one DSF: Λ_i = Ā, B_i = B̄, C_i = 2C (conjugate pairs; real output) or C,
        D_i = diag(D), on the same input and output as :meth:`phi`."""
        self.check_input(x)
        return self._diagonal_dsf(x.shape[0], x.shape[1])

    def _diagonal_phi(self, batch: int, T: int) -> torch.Tensor:
        """[batch, H, T, T]: the Toeplitz map of K plus D on the diagonal."""
        return _toeplitz_map(self.kernel(T), self.D, T, batch)

    def _diagonal_dsf(self, batch: int, T: int) -> DSF:
        """Λ_i = Ā, B_i = B̄, C_i = 2C (conjugate pairs; real output) or C, D_i = diag(D)."""
        log_Ab, Bb, C = (t.detach() for t in self.discrete())
        H = log_Ab.shape[0]

        def seq(t):
            return t.expand(batch, T, *t.shape)

        dtype = torch.complex128 if self.complex_modes else torch.float64  # DSF.evaluate needs one dtype
        D = torch.diag_embed(self.D.detach().to(dtype)).expand(batch, T, H, H)
        return DSF.from_recurrence(seq(C), seq(Bb), 1, gk=seq(log_Ab), scale=self._out_scale, D=D)


class S4DConfig(DiagonalSSMConfig):
    activation: Literal["gelu", "none"] = Field("gelu", description="activation between the core and out_proj")


@register("s4d", description="S4D (Gu et al. 2022): diagonal SSM (Lin/Inv/Real/LegS), Vandermonde kernel")
class S4D(DiagonalSSM, Mixer):
    """S4D: one diagonal SSM per channel (convblog note §9.4, dsf note §3.10).

    Per channel h (the :class:`DiagonalSSM` parametrization): modes λ_n (init lin, inv, legs:
    M = N/2 complex conjugate pairs, output 2·Re; real: N real modes λ_n = -(n+1)),
    Ā = exp(Δλ), B̄ = (exp(Δλ)-1)/λ·B (ZOH) or the bilinear rule, Δ = exp(log_dt)
    log-uniform in [dt_min, dt_max] at init,

        K_l = 2·Re Σ_n C_n B̄_n Ā_nˡ  (Vandermonde),     y_core = K * u + D u,
        y = out_proj(gelu(y_core)).

    Modes: "fft" (``vandermonde_kernel`` + ``fft_conv``, with the state terms of
    ``diagonal_ssm_conv``), "recurrent" and "chunk" (``linear_recurrence`` with heads =
    channels, q = C, k = B̄, v = u and the constant complex log-decay gk = log Ā).
    Re λ = -exp(log_A_real) < 0 keeps |Ā| < 1.

    Maps of phi(x): one per channel, [B, d_model, T, T]. State: M complex (or N real)
    entries per channel, d_model·d_state floats. dsf(x) is complex with real output
    (DSF C = 2·C for conjugate pairs).
    """

    family = "ssm"
    modes = ("recurrent", "chunk", "fft")
    reference_mode = "recurrent"
    state_formula = "d_model·d_state"
    map_unit = "channel"
    Config = S4DConfig

    def __init__(self, config: S4DConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        H = self.config.d_model
        self._init_diagonal_ssm(H)
        self.out_proj = nn.Linear(H, H)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_state": 8, "chunk_size": 8}

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        u = x  # [B, T, H]
        y, S = self._diagonal_ssm(u, state=state, mode=mode, need_state=need_state)
        out = _readout(y, self.config.activation, self.out_proj)
        return MixOut(out, {"S": S} if need_state else None, values=u.unsqueeze(-1), mixed=y.unsqueeze(-1))

    # -- DSF view: phi and dsf come from DiagonalSSM ------------------------------------------

    def state_size(self, seq_len: int | None = None) -> int:
        return self.config.d_model * self.config.d_state


# ------------------------------------------------------------------------------------------
# S6 and the Mamba block
# ------------------------------------------------------------------------------------------


class S6Config(_DtRange):
    d_state: int = Field(16, gt=0, description="state size n per channel (Mamba's d_state)")
    expand: int = Field(1, gt=0, description="d_inner = expand·d_model (block=True only; the bare S6 has expand = 1)")
    dt_rank: int | None = Field(None, gt=0, description="rank p of the Δ projection (None: ceil(d_model/16), Mamba's 'auto')")
    block: bool = Field(False, description="the full Mamba block: in_proj (x, z), short conv + SiLU, SiLU(z) gate")
    d_conv: int = Field(4, gt=0, description="short-conv width of the block")
    conv_bias: bool = Field(True, description="bias of the short conv")
    bias: bool = Field(False, description="biases of in_proj and out_proj")
    scalar_A: bool = Field(False, description="one learnt A for the whole layer (the DSF paper's MQAR 'SSD'), init A = -1")
    shared_delta: bool = Field(
        False, description="Δ pre-activation of rank 1 shared by all channels plus a per-channel bias (needs dt_rank = 1)"
    )
    dt_init_floor: float = Field(1e-4, gt=0, description="lower clamp of the initial Δ")
    dt_scale: float = Field(1.0, gt=0, description="scale of dt_proj's uniform init, ±dt_scale/sqrt(dt_rank)")
    bcdt_rms: bool = Field(
        False, description="Falcon-Mamba: weightless RMS norms on δ (before dt_proj), b and c, each over its own features"
    )
    bcdt_rms_eps: float = Field(1e-6, gt=0, description="epsilon of the bcdt_rms norms (Falcon-Mamba's mixer_rms_eps)")
    bcdt_rms_affine: bool = Field(
        False, description="Jamba: the bcdt_rms norms carry a learnt weight each (dt_norm [dt_rank], b_norm, c_norm [d_state])"
    )
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")

    @model_validator(mode="after")
    def _fits(self):
        if not self.block and self.expand != 1:
            raise ValueError(
                f"expand = {self.expand} does not fit the bare S6 (block = False has no in_proj, so d_inner = d_model); "
                "use expand = 1 or block = True"
            )
        d_inner = self.expand * self.d_model
        rank = self.dt_rank if self.dt_rank is not None else math.ceil(self.d_model / 16)
        if rank > d_inner:
            raise ValueError(f"dt_rank = {rank} must be <= d_inner = expand·d_model = {d_inner} (a low-rank Δ projection)")
        if self.shared_delta and rank != 1:
            raise ValueError(f"shared_delta = True needs dt_rank = 1 (one Δ pre-activation for all channels), got dt_rank = {rank}")
        if self.bcdt_rms_affine and not self.bcdt_rms:
            raise ValueError("bcdt_rms_affine = True needs bcdt_rms = True (it gives the bcdt_rms norms their weights)")
        return self


@register("s6", description="S6, Mamba's selective SSM (DSF eq. 4, 19); bare mixer of the DSF paper's MQAR")
class S6(Mixer):
    """S6, the selective SSM of Mamba (DSF paper eq. 4 and 19, dsf note §3.8), and the Mamba block.

    Per channel c of x ∈ R^(d_inner) and state r < n = d_state (Mamba's semantics):

        (δ_t, b_t, c_t) = x_proj(x_t),   δ_t ∈ R^p, b_t, c_t ∈ R^n           (p = dt_rank)
        Δ_t = softplus(dt_proj(δ_t) + b_Δ)                        (delta_softplus, dt bias inside)
        h_t[c, r] = exp(Δ_t^c A[c, r]) h_(t-1)[c, r] + Δ_t^c b_t[r] x_t[c]     (A = -exp(A_log) < 0)
        y_t[c] = Σ_r c_t[r] h_t[c, r] + D[c] x_t[c]

    i.e. DSF eq. (19): Λ_t = exp(-(Δ_t ⊗ I_n) ⊙ A_paper) with A_paper = exp(A_log) > 0,
    B_t = Δ_t ⊗ b_t, C_t = I ⊗ c_tᵀ, D_t = diag(D) (Mamba's constant D; the dsf note's A8).
    Modes: "recurrent" (also the decoding step) runs ``selective_scan`` (Mamba's scan with a
    hand-written backward); "chunk" runs ``linear_recurrence`` with one head per channel,
    K = n, V = 1: q = c_t, k = Δ_t b_t, v = x_t, gk = Δ_t A (the same recurrence, chunkwise).

    block = False (``s6``, the DSF paper's MQAR mixer): x = u, no conv, no gate, then out_proj.
    block = True (``mamba``): (x, z) = in_proj(u) with d_inner = expand·d_model,
    x = SiLU(conv_4(x)) (``ShortConv``), y = out_proj(y_core ⊙ SiLU(z)).
    scalar_A and shared_delta (``dsf_ssd``): one A for the layer and Δ_t^c = softplus(δ_t + b_Δ^c)
    with a rank-1 δ_t (dsf note §3.9, A17).
    bcdt_rms (``falcon_mamba``, Falcon-Mamba): δ_t, b_t and c_t are each divided by their RMS
    (no weight, eps = bcdt_rms_eps) right after x_proj, before dt_proj and the scan; Λ_i, B_i and
    C_i keep the form above with the normalized δ, b, c (a per-token rescaling of B_i and C_i).
    bcdt_rms_affine (``jamba_mamba``, Jamba's dt_layernorm, b_layernorm, c_layernorm): the same
    norms, each with a learnt weight (dt_norm.weight [p], b_norm.weight and c_norm.weight [n]).

    Init (Mamba): A_log = log(1..n) per channel (S4D-Real) or 0 (scalar_A), D = 1, dt_proj
    weight U(±dt_scale/√p), b_Δ = softplus⁻¹(dt) with dt log-uniform in [dt_min, dt_max].

    Maps of phi(x): one per channel, [B, d_inner, T, T]. State: d_inner·d_state
    (+ d_inner·(d_conv - 1) conv state for the block) floats.
    """

    family = "ssm"
    modes = ("recurrent", "chunk")
    reference_mode = "recurrent"
    state_formula = "d_inner·d_state (+ d_inner·(d_conv-1) with block)"
    map_unit = "channel"
    Config = S6Config

    def __init__(self, config: S6Config | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.d_inner = D = c.expand * c.d_model
        self.dt_rank = R = c.dt_rank if c.dt_rank is not None else math.ceil(c.d_model / 16)
        n = c.d_state
        if c.block:
            self.in_proj = nn.Linear(c.d_model, 2 * D, bias=c.bias)
            self.conv = ShortConv(D, c.d_conv, bias=c.conv_bias, activation="silu")
        self.x_proj = nn.Linear(D, R + 2 * n, bias=False)
        if not c.shared_delta:
            self.dt_proj = nn.Linear(R, D, bias=False)
            nn.init.uniform_(self.dt_proj.weight, -c.dt_scale * R**-0.5, c.dt_scale * R**-0.5)
        self.dt_bias = nn.Parameter(dt_bias_init(D, c.dt_min, c.dt_max, c.dt_init_floor))
        if c.scalar_A:
            self.A_log = nn.Parameter(torch.zeros(()))
        else:
            self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(D, 1))
        self.D = nn.Parameter(torch.ones(D))
        self.out_proj = nn.Linear(D, c.d_model, bias=c.bias)
        if c.bcdt_rms:  # weightless (Falcon-Mamba: the state dict is unchanged) or with a weight each (Jamba)
            self.dt_norm, self.b_norm, self.c_norm = (RMSNorm(m, eps=c.bcdt_rms_eps, affine=c.bcdt_rms_affine) for m in (R, n, n))

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_state": 4, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    @property
    def A(self) -> torch.Tensor:
        """A = -exp(A_log) [d_inner, d_state] (< 0; the paper's A is its negative)."""
        return self.layer_constant("A", lambda: (-self.A_log.exp()).expand(self.d_inner, self.config.d_state), self.A_log)

    def _inputs(self, u, conv_state=None, need_state=False, pre_activation=False):
        """u [B, T, d_model] -> (x [B, T, D], z or None, Δ [B, T, D], b [B, T, n], c [B, T, n], conv state).

        pre_activation: the third output is Δ's pre-activation dt_proj(δ) [B, T, D] instead (shared_delta:
        δ itself, [B, T, 1]), for ``selective_scan``'s delta_bias = b_Δ, delta_softplus = True, which
        compute :meth:`_delta` of it inside the scan."""
        z = new_conv = None
        x = u
        if self.config.block:
            x, z = self.in_proj(u).chunk(2, dim=-1)
            x, new_conv = self.conv(x, conv_state, output_final_state=need_state)
        n = self.config.d_state
        dt, b, c = self.x_proj(x).split([self.dt_rank, n, n], dim=-1)
        if self.config.bcdt_rms:
            dt, b, c = self.dt_norm(dt), self.b_norm(b), self.c_norm(c)
        pre = dt if self.config.shared_delta else self.dt_proj(dt)  # [B, T, 1] broadcasts over channels
        return x, z, pre if pre_activation else self._delta(pre), b, c, new_conv

    def _delta(self, pre):
        """Δ = softplus(pre + b_Δ) [B, T, D] (pre: dt_proj(δ), or shared_delta's δ [B, T, 1] broadcast over
        the channels). The one definition of Δ: the fused scan's delta_bias / delta_softplus is this same
        expression (``selective_scan``'s torch modes run it as written here)."""
        return F.softplus(pre + self.dt_bias)

    def _recurrence(self, x, delta, b, c):
        """linear_recurrence operands (heads = channels, K = n, V = 1)."""
        Bt, T, D = x.shape
        q = c.unsqueeze(2).expand(Bt, T, D, c.shape[-1])
        k = delta.unsqueeze(-1) * b.unsqueeze(2)
        gk = delta.unsqueeze(-1) * self.A
        return q, k, x.unsqueeze(-1), gk

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, u, *, state, mode, need_state):
        # the selective scan applies Δ = softplus(pre + b_Δ) itself (Mamba's delta_bias / delta_softplus: the
        # "cpp" kernel fuses it, sparing torch's softplus forward and backward); the chunk mode takes Δ
        x, z, delta, b, c, conv = self._inputs(u, state.get("conv") if state else None, need_state,
                                               pre_activation=mode != "chunk")
        S0 = state["S"] if state else None  # [B, D, n, 1], the linear_recurrence layout
        if mode == "chunk":
            q, k, v, gk = self._recurrence(x, delta, b, c)
            o, S = linear_recurrence(
                q, k, v, gk, initial_state=S0, output_final_state=need_state, mode="chunk",
                chunk_size=self.config.chunk_size, check_values=False,
            )
            y_core = o[..., 0] + self.D * x
        elif mode == "step":  # one token: the scan's fused step, the state written in place where the caller allows it
            y_core, S = selective_scan_step(x[:, 0], delta.expand_as(x)[:, 0], self.A, b[:, 0], c[:, 0], self.D,
                                            state=S0[..., 0] if S0 is not None else None, delta_bias=self.dt_bias, delta_softplus=True)
            y_core, S = y_core.unsqueeze(1), S.unsqueeze(-1)
        else:  # "recurrent", "auto": Mamba's selective scan (the same recurrence, fused backward)
            # shared_delta's pre-activation [B, T, 1] is expanded (the kernel copies it to [B, T, D]; measured
            # as fast as or faster than the explicit Δ at the main job's size, and the gradient's sum over the
            # channels comes from expand's backward)
            y_core, S = selective_scan(
                x, delta.expand_as(x), self.A, b, c, self.D,
                initial_state=S0[..., 0] if S0 is not None else None, output_final_state=need_state, check_values=False,
                delta_bias=self.dt_bias, delta_softplus=True,
            )
            S = S.unsqueeze(-1) if S is not None else None
        y = y_core * F.silu(z) if z is not None else y_core
        new_state = None
        if need_state:
            new_state = {"S": S, "conv": conv} if self.config.block else {"S": S}
        return MixOut(self.out_proj(y), new_state, values=x.unsqueeze(-1), mixed=y_core.unsqueeze(-1))

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, u):
        """[B, d_inner, T, T]: Φ_c[t, s] = Δ_s^c (c_t·b_s) exp(A_c Σ_(r=s+1..t) Δ_r^c) per state, + D_c δ_ts."""
        self.check_input(u)
        x, _, delta, b, c, _ = self._inputs(u)
        q, k, _, gk = self._recurrence(x, delta, b, c)
        T = u.shape[1]
        return recurrence_map(q, k, gk, check_values=False) + torch.diag_embed(self.D.unsqueeze(-1).expand(-1, T))

    def dsf(self, u):
        """DSF eq. (19) (channel-major state, N = d_inner·d_state) with D_t = diag(D).
        Input: x (the channels entering the scan); output: y_core (before gate and out_proj)."""
        self.check_input(u)
        x, _, delta, b, c, _ = self._inputs(u)
        q, k, _, gk = self._recurrence(x, delta, b, c)
        Bt, T, D = x.shape
        Dm = torch.diag_embed(self.D.detach().double()).expand(Bt, T, D, D)
        return DSF.from_recurrence(q, k, 1, gk=gk, D=Dm)

    def state_size(self, seq_len: int | None = None) -> int:
        n = self.d_inner * self.config.d_state
        return n + (self.d_inner * (self.config.d_conv - 1) if self.config.block else 0)


register_preset(
    "mamba", S6,
    description="Mamba block (Gu & Dao 2023): in_proj (expand 2), short conv 4 + SiLU, S6, SiLU gate, out_proj",
    defaults={"block": True, "expand": 2},
    example={"d_model": 16, "d_state": 4, "chunk_size": 8},
)
register_preset(
    "falcon_mamba", S6,
    description="Falcon-Mamba block (Zuo et al. 2024): the Mamba block with weightless RMS norms on Δ's input, B and C",
    defaults={"block": True, "expand": 2, "bcdt_rms": True},
    # dt_rank > 1: the RMS norm of a single feature is its sign, with a gradient that is 0 or huge
    example={"d_model": 16, "d_state": 8, "dt_rank": 4, "chunk_size": 8},
)
register_preset(
    "jamba_mamba", S6,
    description="Jamba's Mamba block (Lieber et al. 2024): the Mamba block with RMS norms (learnt weights) on Δ's input, B and C",
    defaults={"block": True, "expand": 2, "bcdt_rms": True, "bcdt_rms_affine": True},
    example={"d_model": 16, "d_state": 8, "dt_rank": 4, "chunk_size": 8},
)
register_preset(
    "dsf_ssd", S6,
    description="the DSF paper's MQAR 'SSD': S6 with one scalar A and a shared rank-1 Δ plus per-channel Δ bias",
    defaults={"scalar_A": True, "shared_delta": True, "dt_rank": 1},
    example={"d_model": 16, "d_state": 4, "chunk_size": 8},
)


# ------------------------------------------------------------------------------------------
# SSD and the Mamba-2 block
# ------------------------------------------------------------------------------------------


class SSDConfig(_DtRange):
    d_state: int = Field(64, gt=0, description="state size N per head (Mamba-2's d_state)")
    headdim: int = Field(64, gt=0, description="channels per head P; heads = d_inner / headdim")
    groups: int = Field(1, gt=0, description="groups of B and C (Mamba-2's ngroups); heads are split evenly among them")
    expand: int = Field(1, gt=0, description="d_inner = expand·d_model (block=True only; the bare SSD has expand = 1)")
    block: bool = Field(False, description="the full Mamba-2 block: in_proj (z, x, B, C, Δ), short conv + SiLU, gated RMSNorm")
    d_conv: int = Field(4, gt=0, description="short-conv width of the block")
    conv_bias: bool = Field(True, description="bias of the short conv")
    bias: bool = Field(False, description="biases of in_proj and out_proj")
    A_init_min: float = Field(1.0, gt=0, description="-A per head is initialized uniform in [A_init_min, A_init_max]")
    A_init_max: float = Field(16.0, gt=0, description="see A_init_min")
    dt_init_floor: float = Field(1e-4, gt=0, description="lower clamp of the initial Δ")
    norm_eps: float = Field(1e-5, gt=0, description="epsilon of the gated RMSNorm")
    dt_limit: tuple[float, float] | None = Field(
        None, description="Mamba-2's dt_limit: Δ is clamped to [lo, hi] after the softplus, in every mode (None: no clamp)"
    )
    d_inner: int | None = Field(
        None, gt=0, description="block only: the inner width itself, overriding expand·d_model (Falcon-H1's mamba_d_ssm, "
        "Nemotron-H's mamba_num_heads·mamba_head_dim); None = expand·d_model"
    )
    gate_norm: Literal["gated", "before_gate", "none"] = Field(
        "gated", description="block only, the readout before out_proj: 'gated' = RMSNorm_G(y ⊙ SiLU(z)) (Mamba-2), "
        "'before_gate' = RMSNorm_G(y) ⊙ SiLU(z) (mamba_ssm's norm_before_gate, Falcon-H1's mamba_norm_before_gate), "
        "'none' = y ⊙ SiLU(z) without a norm (Falcon-H1's mamba_rms_norm = False)"
    )
    in_multiplier: float = Field(
        1.0, gt=0, description="block only: u is multiplied by it before in_proj (Falcon-H1's μP ssm_in_multiplier)"
    )
    zxbcdt_multipliers: tuple[float, float, float, float, float] = Field(
        (1.0, 1.0, 1.0, 1.0, 1.0), description="block only: in_proj's output blocks z, x, B, C, dt are multiplied by these "
        "(Falcon-H1's μP ssm_multipliers), before the conv"
    )
    discretization: Literal["zoh", "discrete"] = Field(
        "zoh", description="'zoh': Mamba-2's Λ_t = exp(Δ_t a_h), input Δ_t B_t x_t, with A_log and dt_bias; 'discrete': Phi-Mamba's "
        "discrete-time SSM (MOHAWK's DiscreteMamba2), Λ_t = exp(−softplus(dt_t)) per head and token, input B_t x_t (no Δ), A = −1 "
        "and no dt bias (no A_log, dt_bias parameters)")
    conv_activation: Literal["silu", "identity"] = Field(
        "silu", description="block only: the activation after the short conv (Mamba-2: SiLU; Phi-Mamba: none)")
    z_bias: bool = Field(False, description="block only: a learnt bias on the gate branch, SiLU(z + b_z), zero at init (Phi-Mamba's "
                         "z_bias)")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode (the SSD algorithm)")

    @property
    def inner(self) -> int:
        """d_inner: the d_inner field, or expand·d_model."""
        return self.d_inner if self.d_inner is not None else self.expand * self.d_model

    @model_validator(mode="after")
    def _fits(self):
        if not self.block and self.expand != 1:
            raise ValueError(
                f"expand = {self.expand} does not fit the bare SSD (block = False has no in_proj, so d_inner = d_model); "
                "use expand = 1 or block = True"
            )
        mup = self.in_multiplier != 1.0 or any(m != 1.0 for m in self.zxbcdt_multipliers)
        if not self.block and (self.d_inner is not None or self.gate_norm != "gated" or mup or self.conv_activation != "silu"
                               or self.z_bias):
            raise ValueError("d_inner, gate_norm, in_multiplier, zxbcdt_multipliers, conv_activation and z_bias are options of the "
                             "block (block = True): the bare SSD has no in_proj, conv, gate or norm")
        if not all(math.isfinite(m) and m > 0 for m in self.zxbcdt_multipliers):
            raise ValueError(f"zxbcdt_multipliers = {self.zxbcdt_multipliers} must be finite numbers > 0")
        d_inner = self.inner
        if d_inner % self.headdim:
            raise ValueError(f"headdim = {self.headdim} must divide d_inner = {d_inner}")
        heads = d_inner // self.headdim
        if heads % self.groups:
            raise ValueError(f"groups = {self.groups} must divide the number of heads d_inner/headdim = {heads}")
        if self.A_init_min > self.A_init_max:
            raise ValueError(f"A_init_min = {self.A_init_min} must be <= A_init_max = {self.A_init_max}")
        if self.dt_limit is not None and not 0 <= self.dt_limit[0] < self.dt_limit[1]:
            raise ValueError(f"dt_limit = {self.dt_limit} must be (lo, hi) with 0 <= lo < hi")
        return self


@register("ssd", description="SSD, Mamba-2's state space dual: scalar A per head, B/C groups, chunked (bare mixer)")
class SSD(Mixer):
    """SSD (Dao & Gu 2024, Mamba-2; dsf note §3.9) and the Mamba-2 block.

    Heads h < H = d_inner/headdim of P = headdim channels, groups g < G of B and C (head h
    reads group h·G/H), per head one scalar a_h = -exp(A_log_h) < 0:

        Δ_t^h = softplus(dt_t^h + b_Δ^h)
        S_t^h = exp(Δ_t^h a_h) S_(t-1)^h + (Δ_t^h B_t^g) x_t^hᵀ        S ∈ R^(N×P)
        y_t^h = C_t^gᵀ S_t^h + D_h x_t^h

    i.e. Λ_t = exp(Δ_t^h a_h)·I per head (a 1-semiseparable map, the SSD view), run by
    ``linear_recurrence`` with q = C, k = ΔB, v = x and the per-head log-decay Δa: mode
    "chunk" is the chunked SSD algorithm, "parallel" the quadratic (attention-like) dual.

    block = False (``ssd``): x = u; (B, C, dt) = x_proj(x); out_proj.
    block = True (``mamba2``): (z, x, B, C, dt) = in_proj(u), (x, B, C) = SiLU(conv_4(x, B, C)),
    y = out_proj(RMSNorm_G(y_core ⊙ SiLU(z))) (gated RMSNorm, gate before the norm, one norm per group).
    dt_limit = (lo, hi) (Mamba-2's time_step_limit): Δ_t^h = clamp(softplus(dt_t^h + b_Δ^h), lo, hi)
    in every mode (the DSF view reads the clamped Δ).
    Options of the hybrids' Mamba-2 layers (block only): d_inner (an inner width that is no multiple of
    d_model: Falcon-H1's mamba_d_ssm); gate_norm, the readout: 'gated' (above), 'before_gate'
    y = out_proj(RMSNorm_G(y_core) ⊙ SiLU(z)), 'none' y = out_proj(y_core ⊙ SiLU(z)) (no norm weight);
    Falcon-H1's μP multipliers: (z, x, B, C, dt) = m ⊙ in_proj(in_multiplier·u) with m the five
    zxbcdt_multipliers, one per output block. They scale the inputs of Λ, B, C (through Δ, B, C) and
    the gate; the DSF view reads the scaled ones.

    Phi-Mamba (MOHAWK, Bick et al. 2024; goombalab/phi-mamba's DiscreteMamba2, the ``phi_mamba`` preset):
    discretization 'discrete' drops the zero-order hold, S_t^h = exp(−softplus(dt_t^h)) S_(t-1)^h + B_t x_t^hᵀ (A = −1,
    no dt bias, the input not scaled by Δ: its x / softplus(A_log) cancels the kernel's Δ); conv_activation 'identity'
    (no SiLU after the conv); gate_norm 'none' (no norm); z_bias, SiLU(z + b_z); expand 1 and one B/C group per head
    (groups = heads: its "multi-head" structure, n_qk_heads = n_v_heads), d_state = headdim.

    Init (Mamba-2): -A ~ U[A_init_min, A_init_max], D = 1, b_Δ = softplus⁻¹(dt), dt log-uniform.
    Maps of phi(x): one per head, [B, heads, T, T]. State: heads·d_state·headdim
    (+ (d_inner + 2·groups·d_state)·(d_conv - 1) for the block) floats.
    """

    family = "ssm"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "d_inner·d_state (+ (d_inner + 2·groups·d_state)·(d_conv-1) with block)"
    map_unit = "head"
    Config = SSDConfig

    def __init__(self, config: SSDConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.d_inner = D = c.inner
        self.heads = H = D // c.headdim
        G, N = c.groups, c.d_state
        if c.block:
            self.in_proj = nn.Linear(c.d_model, 2 * D + 2 * G * N + H, bias=c.bias)
            self.conv = ShortConv(D + 2 * G * N, c.d_conv, bias=c.conv_bias, activation=None if c.conv_activation == "identity" else "silu")
            if c.z_bias:
                self.z_bias = nn.Parameter(torch.zeros(D))
            if c.gate_norm != "none":
                self.norm = RMSNorm(D, eps=c.norm_eps, groups=G)
            widths = (D, D, G * N, G * N, H)
            mup = torch.cat([torch.full((w,), float(m)) for w, m in zip(widths, c.zxbcdt_multipliers)])
            # μP multipliers (Falcon-H1): a constant of the config, not a weight (absent from the state dict)
            self.register_buffer("zxbcdt_scale", mup if bool((mup != 1).any()) else None, persistent=False)
        else:
            self.x_proj = nn.Linear(D, 2 * G * N + H, bias=False)
        if c.discretization == "zoh":
            self.dt_bias = nn.Parameter(dt_bias_init(H, c.dt_min, c.dt_max, c.dt_init_floor))
            self.A_log = nn.Parameter(torch.empty(H).uniform_(c.A_init_min, c.A_init_max).log())
        self.D = nn.Parameter(torch.ones(H))
        self.out_proj = nn.Linear(D, c.d_model, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_state": 8, "headdim": 4, "groups": 2, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    def _inputs(self, u, conv_state=None, need_state=False, step=False):
        """u -> (x [B,T,H,P], z [B,T,D] or None, Δ [B,T,H], B and C [B,T,H,N] (groups repeated to heads), conv state).
        step (a decoding step): one group's B and C are expanded to the heads (a view), not copied."""
        c = self.config
        G, N, H = c.groups, c.d_state, self.heads
        z = new_conv = None
        if c.block:
            zxbcdt = self.in_proj(u * c.in_multiplier if c.in_multiplier != 1.0 else u)
            if self.zxbcdt_scale is not None:
                zxbcdt = zxbcdt * self.zxbcdt_scale.to(zxbcdt.dtype)
            z, xBC, dt = zxbcdt.split([self.d_inner, self.d_inner + 2 * G * N, H], dim=-1)
            if c.z_bias:
                z = z + self.z_bias
            xBC, new_conv = self.conv(xBC, conv_state, output_final_state=need_state)
            x, Bm, Cm = xBC.split([self.d_inner, G * N, G * N], dim=-1)
        else:
            x = u
            Bm, Cm, dt = self.x_proj(x).split([G * N, G * N, H], dim=-1)
        Bt, T, _ = u.shape

        def heads(t):  # [B, T, G·N] -> [B, T, H, N], head h reads group h // (H/G)
            if step and G == 1:  # the step's products read it elementwise or copy it: the same values, no copy here
                return t.view(Bt, T, 1, N).expand(Bt, T, H, N)
            return t.view(Bt, T, G, N).repeat_interleave(H // G, dim=2)

        delta = F.softplus(dt + self.dt_bias) if c.discretization == "zoh" else F.softplus(dt)
        if c.dt_limit is not None:
            delta = delta.clamp(*c.dt_limit)
        return x.view(Bt, T, H, c.headdim), z, delta, heads(Bm), heads(Cm), new_conv

    def _recurrence(self, delta, Bm, Cm):
        """(q, k, gk): q = C, k = ΔB, per-head log-decay Δ·a [B, T, H]; discretization 'discrete': k = B, log-decay −Δ."""
        if self.config.discretization == "discrete":
            return Cm, Bm, -delta
        return Cm, delta.unsqueeze(-1) * Bm, delta * self.layer_constant("a", lambda: -self.A_log.exp(), self.A_log)

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, u, *, state, mode, need_state):
        x, z, delta, Bm, Cm, conv = self._inputs(u, state.get("conv") if state else None, need_state, step=mode == "step")
        q, k, gk = self._recurrence(delta, Bm, Cm)
        o, S = linear_recurrence(
            q, k, x, gk,
            initial_state=state["S"] if state else None,
            output_final_state=need_state,
            mode=mode,
            chunk_size=self.config.chunk_size,
            check_values=False,
        )
        y_core = o + self.D.unsqueeze(-1) * x  # [B, T, H, P]
        y = y_core.flatten(2)
        if self.config.block:
            y = self._readout(y, z)
        new_state = None
        if need_state:
            new_state = {"S": S, "conv": conv} if self.config.block else {"S": S}
        return MixOut(self.out_proj(y), new_state, values=x, mixed=y_core)

    def _readout(self, y, z):
        """The block's gate and norm (gate_norm): RMSNorm_G(y ⊙ SiLU(z)), RMSNorm_G(y) ⊙ SiLU(z) or y ⊙ SiLU(z)."""
        how = self.config.gate_norm
        if how == "gated":
            return self.norm(y, gate=z)
        if how == "before_gate":  # as transformers / mamba_ssm: the product in float32 (or wider), cast back
            return (upcast(self.norm(y)) * F.silu(upcast(z))).to(y.dtype)
        return y * F.silu(z)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, u):
        """[B, heads, T, T]: Φ_h[t, s] = (C_t·B_s) Δ_s exp(a_h Σ_(r=s+1..t) Δ_r) + D_h δ_ts."""
        self.check_input(u)
        _, _, delta, Bm, Cm, _ = self._inputs(u)
        q, k, gk = self._recurrence(delta, Bm, Cm)
        T = u.shape[1]
        return recurrence_map(q, k, gk, check_values=False) + torch.diag_embed(self.D.unsqueeze(-1).expand(-1, T))

    def dsf(self, u):
        """Λ_t = exp(Δ_t^h a_h) I per head (N = d_inner·d_state), B_t = Δ_t I_P ⊗ B_t, C_t = I_P ⊗ C_tᵀ,
        D_t = diag(D_h repeated over the head's channels). Input: x; output: y_core."""
        self.check_input(u)
        x, _, delta, Bm, Cm, _ = self._inputs(u)
        q, k, gk = self._recurrence(delta, Bm, Cm)
        Bt, T, H, P = x.shape
        Dm = torch.diag_embed(self.D.detach().double().repeat_interleave(P)).expand(Bt, T, H * P, H * P)
        return DSF.from_recurrence(q, k, P, gk=gk, D=Dm)

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        n = self.d_inner * c.d_state
        return n + ((self.d_inner + 2 * c.groups * c.d_state) * (c.d_conv - 1) if c.block else 0)


register_preset(
    "mamba2", SSD,
    description="Mamba-2 block (Dao & Gu 2024): in_proj, short conv 4 + SiLU, SSD, gated RMSNorm, out_proj",
    defaults={"block": True, "expand": 2, "d_state": 128},
    example={"d_model": 16, "d_state": 8, "headdim": 8, "groups": 2, "chunk_size": 8},
)
#: Phi-Mamba's mixer (MOHAWK, Bick et al. 2024, §4; goombalab/phi-mamba modules/mixers/discrete_mamba2.py and
#: assets/sample_config.json: d_state 64, expand 1, d_conv 4 with bias, activation identity, no norm, z_bias): the Mamba-2 block
#: with a discrete-time decay. Its multi-head structure is groups = heads = d_inner / headdim (linearize sets it from the
#: teacher, with headdim = d_state = the teacher's head size)
PHI_MAMBA = dict(block=True, expand=1, d_state=64, headdim=64, discretization="discrete", conv_activation="identity",
                 gate_norm="none", z_bias=True, conv_bias=True)
register_preset(
    "phi_mamba", SSD,
    description="Phi-Mamba (MOHAWK): the Mamba-2 block, discrete decay exp(−softplus(dt)) per head, no Δ on the input, "
                "no conv activation, no norm, one B/C group per head",
    defaults=PHI_MAMBA,
    example={"d_model": 16, "d_state": 4, "headdim": 4, "groups": 4, "chunk_size": 8},  # one group per head, d_state = headdim
)


# ------------------------------------------------------------------------------------------
# Mamba-3: trapezoidal discretization, complex states by data-dependent rotation
# ------------------------------------------------------------------------------------------


class Mamba3Config(_DtRange):
    d_state: int = Field(128, gt=0, description="state size N per head")
    headdim: int = Field(64, gt=0, description="channels per head P; heads = d_inner / headdim")
    expand: int = Field(2, gt=0, description="d_inner = expand·d_model")
    groups: int = Field(1, gt=0, description="groups of B and C; heads are split evenly among them")
    rope_fraction: float = Field(
        0.5, ge=0, le=1, description="fraction of the N state channels that are complex (rotated in pairs (2j, 2j+1)): "
        "R = floor(N·rope_fraction/2) angles; 0 gives a real SSM (Mamba-2's Λ)"
    )
    trapezoid: float | None = Field(
        None, ge=0, le=1, description="λ of the trapezoidal rule: None = data-dependent λ_t = σ(W_λ u_t) (Mamba-3); "
        "a number fixes it (1 = Euler / Mamba-2's rule, 0.5 = the classical trapezoid)"
    )
    A_floor: float = Field(1e-4, gt=0, description="A_t = min(-softplus(W_A u_t), -A_floor): the decay rate's floor")
    dt_init_floor: float = Field(1e-4, gt=0, description="lower clamp of the initial Δ")
    norm_eps: float = Field(1e-5, gt=0, description="epsilon of the RMS norms of B and C")
    bias: bool = Field(False, description="biases of in_proj and out_proj")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")
    mimo_rank: int = Field(
        1, gt=0, description="r of the MIMO form: rank-r input B_t X_tᵀ and r outputs C_tᵀ h_t per head; 1 = SISO "
        "(the layer unchanged, no MIMO parameters)"
    )

    @model_validator(mode="after")
    def _fits(self):
        d_inner = self.expand * self.d_model
        if d_inner % self.headdim:
            raise ValueError(f"headdim = {self.headdim} must divide d_inner = expand·d_model = {d_inner}")
        if (d_inner // self.headdim) % self.groups:
            raise ValueError(f"groups = {self.groups} must divide the number of heads d_inner/headdim = {d_inner // self.headdim}")
        return self


@register("mamba3", description="Mamba-3 (Lahoti et al. 2026): trapezoidal SSD with data-dependent complex (rotary) states")
class Mamba3(Mixer):
    """Mamba-3 (Lahoti et al., "Mamba-3: Improved Sequence Modeling using State Space Principles"),
    the SISO form and (``mimo_rank`` > 1) the MIMO form; layer layout of the reference implementation
    (mamba_ssm / fla ``Mamba3``: no short conv, RMS-normed B and C plus a learnt per-head bias, data-dependent A).

    Heads h < H = d_inner/headdim of P = headdim channels; B, C in groups of N = d_state:

        (z, x, B, C, dt, a, λ̂, θ) = in_proj(u)
        Δ_t = softplus(dt_t + b_Δ),  A_t = min(−softplus(a_t), −A_floor),  λ_t = σ(λ̂_t)   (per head)
        B_t = RMSNorm(B_t) + b_B,    C_t = RMSNorm(C_t) + b_C                             (per head)

    1. Trapezoidal discretization (generalized trapezoidal rule, a two-tap input):

        h_t = α_t h_(t−1) + β_t B_(t−1) x_(t−1)ᵀ + γ_t B_t x_tᵀ,
        α_t = exp(Δ_t A_t),  β_t = (1 − λ_t) Δ_t α_t,  γ_t = λ_t Δ_t;

       λ = 1 is Mamba-2's Euler rule (``trapezoid=1.0``), λ = ½ the classical trapezoid.
    2. Complex states, the "RoPE trick": R = floor(N·rope_fraction/2) state pairs are complex with
       Λ_t = α_t e^(iθ_t^h), θ_t^h = Δ_t^h θ_t (θ_t [R] from in_proj, shared by the heads); this equals
       the real system above with B_t and C_t rotated pairwise by −φ_t, φ_t = Σ_(r≤t) θ_r
       (``ops.ssm.rotate_pairs``); the β term uses the previous token's rotated B (as the paper's
       discretization of e^(ΔA) with complex A implies).
    3. y_t = C̃_tᵀ h_t + D_h x_t,  out = out_proj(y ⊙ SiLU(z)).

    The recurrence runs in ``ops.ssm.trapezoidal_recurrence``: ``linear_recurrence`` on the folded key
    k̃_t = (γ_t + η_(t+1)) B̃_t (η = (1−λ)Δ) with a diagonal correction, so every mode of that op
    (recurrent, chunk = the SSD algorithm, parallel, step) comes for free.
    4. MIMO (``mimo_rank`` = r > 1): B_t, C_t ∈ R^(N×r) per head (in_proj gives r groups' worth of each,
       rank-major; RMS norm per rank, bias [H, r, N]), rotated like SISO (the same head angle for every
       rank). x is projected to r channels per head dim, X_t[p, j] = W_x[h, j, p]·x_t[p] (learnt, init 1),
       the r outputs are combined back by a learnt per-channel down-projection W_o[h, j, p] (init 1/r):

        h_t = α_t h_(t−1) + β_t B̃_(t−1) X_(t−1)ᵀ + γ_t B̃_t X_tᵀ   (a sum of r outer products),
        y_t[p] = Σ_j W_o[h, j, p] (C̃_tᵀ h_t)[j, p] + D_h x_t[p],   then the SiLU(z) gate as in SISO.

       Since X_t is x_t scaled per channel, column p of h_t is a SISO system of its own with the
       effective vectors b_(t,p) = Σ_j W_x[h,j,p] B̃_(t,j) and c_(t,p) = Σ_j W_o[h,j,p] C̃_(t,j):
       h_t[:, p] = α_t h_(t−1)[:, p] + (two-tap of) b_(t,p) x_t[p], y_t[p] = c_(t,p)ᵀ h_t[:, p] — exact, not
       an approximation. So MIMO runs the same op with H·P single-channel heads (K = N, V = 1) sharing the
       head's decay; the state is still N·P per head. Maps of phi(x) are per channel, [B, heads·headdim,
       T, T], and the core's values / mixed are [B, T, heads·headdim, 1]. (The reference code's per-rank
       z scaling, mimo_z, is not taken: the gate is applied after the combination, as in SISO, so the
       core stays a linear map of x.)
    Not implemented: the output norm option (is_outproj_norm).

    DSF view (real, diagonal): Λ_t = α_t I per head (the rotation folded into B and C),
    B_t = (γ_t + η_(t+1)) I_P ⊗ B̃_t, C_t = I_P ⊗ C̃_tᵀ, D_t = (D_h − η_(t+1) C̃_t·B̃_t) I_P. Its state is
    h_t + η_(t+1) B̃_t x_tᵀ (the true state plus the next token's trapezoid input), so B_t and D_t read
    token t+1's Δ and λ: an exact realization of the causal map Φ(x), not of the causal state.
    decays(x) are the magnitudes α_t; the complex eigenvalues α_t e^(±iθ_t) are not in this view.
    Maps of phi(x): one per head, [B, heads, T, T] (MIMO: one per channel, see 4.; the DSF view is
    the same with H·P single-channel heads, B_t and C_t read b_(t,p) and c_(t,p)).
    State (the Cache): S [B, H, N, P], the last rotated B̃ [B, H, N] (MIMO: [B, H, r, N]) and x [B, H, P]
    (the next token's β term), the cumulative angle φ mod 2π [B, H, R]: H·(N·P + r·N + P + R) floats.
    """

    family = "ssm"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "heads·(d_state·headdim + mimo_rank·d_state + headdim + R), R = floor(d_state·rope_fraction/2)"
    map_unit = "head"
    Config = Mamba3Config

    def __init__(self, config: Mamba3Config | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.d_inner = D = c.expand * c.d_model
        self.heads = H = D // c.headdim
        G, N = c.groups, c.d_state
        self.angles = R = int(N * c.rope_fraction) // 2
        self.rank = r = c.mimo_rank
        self.mimo = r > 1
        self.in_proj = nn.Linear(c.d_model, 2 * D + 2 * r * G * N + 3 * H + R, bias=c.bias)
        self.dt_bias = nn.Parameter(dt_bias_init(H, c.dt_min, c.dt_max, c.dt_init_floor))
        self.B_norm = RMSNorm(N, eps=c.norm_eps)
        self.C_norm = RMSNorm(N, eps=c.norm_eps)
        self.B_bias = nn.Parameter(torch.ones(H, r, N) if self.mimo else torch.ones(H, N))
        self.C_bias = nn.Parameter(torch.ones(H, r, N) if self.mimo else torch.ones(H, N))
        if self.mimo:  # x up to r channels per head dim, the r outputs back down (per channel)
            self.mimo_x = nn.Parameter(torch.ones(H, r, c.headdim))
            self.mimo_o = nn.Parameter(torch.full((H, r, c.headdim), 1.0 / r))
        self.D = nn.Parameter(torch.ones(H))
        self.out_proj = nn.Linear(D, c.d_model, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "d_state": 8, "headdim": 8, "groups": 2, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    def _inputs(self, u, phi0=None):
        """u -> dict of x [B,T,H,P], z [B,T,D], q = C̃ and k = B̃ [B,T,H,N] (rotated; MIMO [B,T,H,r,N]),
        g = log α, gamma, eta [B,T,H], phi [B,T,H,R] (cumulative angle, float32 or wider)."""
        c = self.config
        G, N, H, R, r = c.groups, c.d_state, self.heads, self.angles, self.rank
        Bt, T, _ = u.shape
        z, x, Bm, Cm, dt, a, lam, theta = self.in_proj(u).split([self.d_inner, self.d_inner, r * G * N, r * G * N, H, H, H, R], dim=-1)

        def heads(t, norm, bias):  # [B, T, (r·)G·N] -> [B, T, H, (r,) N], head h reads group h // (H/G)
            if self.mimo:  # rank-major: [B, T, r, G, N] -> [B, T, H, r, N]
                return norm(t.view(Bt, T, r, G, N)).repeat_interleave(H // G, dim=3).transpose(2, 3) + bias
            return norm(t.view(Bt, T, G, N)).repeat_interleave(H // G, dim=2) + bias

        delta = F.softplus(upcast(dt) + self.dt_bias)
        A = (-F.softplus(upcast(a))).clamp(max=-c.A_floor)
        lam = torch.sigmoid(upcast(lam)) if c.trapezoid is None else torch.full_like(delta, c.trapezoid)
        phi = torch.cumsum(delta.unsqueeze(-1) * upcast(theta).unsqueeze(2), dim=1)  # [B, T, H, R]
        if phi0 is not None:
            phi = phi + phi0.unsqueeze(1)
        rot = phi.unsqueeze(3) if self.mimo else phi  # every rank of a head turns by the head's angle
        return dict(
            x=x.view(Bt, T, H, c.headdim), z=z, g=delta * A, gamma=lam * delta, eta=(1 - lam) * delta, phi=phi,
            q=rotate_pairs(heads(Cm, self.C_norm, self.C_bias), rot), k=rotate_pairs(heads(Bm, self.B_norm, self.B_bias), rot),
        )

    def _channels(self, p):
        """MIMO as H·P single-channel heads (class docstring, 4.): q = c_(t,p), k = b_(t,p) [B,T,H·P,N],
        v = x [B,T,H·P,1], g, gamma, eta repeated per channel [B,T,H·P]. SISO: the head form unchanged."""
        if not self.mimo:
            return p["q"], p["k"], p["x"], p["g"], p["gamma"], p["eta"]
        Bt, T, H, P = p["x"].shape
        q = torch.einsum("bthjn,hjp->bthpn", p["q"], self.mimo_o.to(p["q"].dtype)).reshape(Bt, T, H * P, -1)
        k = torch.einsum("bthjn,hjp->bthpn", p["k"], self.mimo_x.to(p["k"].dtype)).reshape(Bt, T, H * P, -1)
        per_channel = [t.repeat_interleave(P, dim=2) for t in (p["g"], p["gamma"], p["eta"])]
        return (q, k, p["x"].reshape(Bt, T, H * P, 1), *per_channel)

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, u, *, state, mode, need_state):
        p = self._inputs(u, state["phi"] if state else None)
        x = p["x"]
        Bt, T, H, P = x.shape
        q, k, v, g, gamma, eta = self._channels(p)
        S0, prev = (state["S"], (state["k"], state["v"])) if state else (None, None)
        if self.mimo and state:  # cache layout [B,H,N,P] / rank form -> H·P single-channel heads
            S0 = S0.transpose(-1, -2).reshape(Bt, H * P, -1, 1)
            prev = (torch.einsum("bhjn,hjp->bhpn", prev[0], self.mimo_x.to(prev[0].dtype)).reshape(Bt, H * P, -1),
                    prev[1].reshape(Bt, H * P, 1))
        o, S = trapezoidal_recurrence(
            q, k, v, g, gamma, eta, initial_state=S0, prev=prev,
            output_final_state=need_state, mode=mode, chunk_size=self.config.chunk_size,
        )
        D = self.D.repeat_interleave(P).unsqueeze(-1) if self.mimo else self.D.unsqueeze(-1)
        y_core = o.to(x.dtype) + D * v  # [B, T, H, P]; MIMO [B, T, H·P, 1]
        y = y_core.flatten(2) * F.silu(p["z"])
        new_state = None
        if need_state:
            if self.mimo:
                S = S.reshape(Bt, H, P, -1).transpose(-1, -2)
            new_state = {"S": S, "k": p["k"][:, -1], "v": upcast(x[:, -1]), "phi": torch.remainder(p["phi"][:, -1], 2 * math.pi)}
        return MixOut(self.out_proj(y), new_state, values=v, mixed=y_core)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, u):
        """[B, heads, T, T]: Φ_h[t, s] = (C̃_t·B̃_s) Π_(r=s+1..t) α_r (γ_s + η_(s+1)[s < t]) + D_h δ_ts.
        MIMO: [B, heads·headdim, T, T], the same with c_(t,p)·b_(s,p) (class docstring, 4.)."""
        self.check_input(u)
        p = self._inputs(u)
        T = u.shape[1]
        q, k, _, g, gamma, eta = self._channels(p)
        M = trapezoidal_map(q, k, g, gamma, eta)
        D = self.D.repeat_interleave(self.config.headdim) if self.mimo else self.D
        return M + torch.diag_embed(upcast(D).unsqueeze(-1).expand(-1, T))

    def dsf(self, u):
        """Λ_t = α_t I per head (N = heads·d_state·headdim), B_t = (γ_t + η_(t+1)) I_P ⊗ B̃_t, C_t = I_P ⊗ C̃_tᵀ,
        D_t = (D_h − η_(t+1) C̃_t·B̃_t) I_P (see the class docstring). Input: x; output: y_core.
        MIMO: the same with H·P single-channel heads, B̃_t, C̃_t -> b_(t,p), c_(t,p), P -> 1."""
        self.check_input(u)
        p = self._inputs(u)
        q, k, v, g, gamma, eta = (t.detach().double() for t in self._channels(p))
        P = v.shape[-1]
        D = (self.D.repeat_interleave(self.config.headdim) if self.mimo else self.D).detach().double()
        eta_next = torch.cat((eta[:, 1:], torch.zeros_like(eta[:, :1])), dim=1)
        w = gamma + eta_next
        d = D - eta_next * (q * k).sum(-1)  # [B, T, H] (MIMO [B, T, H·P])
        Dm = torch.diag_embed(d.repeat_interleave(P, dim=-1))
        return DSF.from_recurrence(q, k * w.unsqueeze(-1), P, gk=g, D=Dm)

    def state_size(self, seq_len: int | None = None) -> int:
        c = self.config
        return self.heads * (c.d_state * c.headdim + self.rank * c.d_state + c.headdim + self.angles)
