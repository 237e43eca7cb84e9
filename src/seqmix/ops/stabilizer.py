"""The max-stabilizer of exponential gates (xLSTM, Beck et al. 2024, the mLSTM cell):

    m_t = max(log f_t + m_{t-1}, log i_t),        m_{-1} = m0 (0 when not given)

An exponential input gate i_t = exp(ĩ_t) (and an exponential forget gate f_t = exp(f̃_t))
make the state C_t = f_t C_{t-1} + i_t k_t v_tᵀ grow without bound. xLSTM stores the
stabilized state C̃_t = e^{-m_t} C_t instead, which obeys a linear recurrence whose gates
never exceed 1:

    C̃_t = f̃'_t C̃_{t-1} + i'_t k_t v_tᵀ,     log f̃'_t = log f_t + m_{t-1} - m_t <= 0,
                                             log i'_t = log i_t - m_t <= 0

so the stabilized gates are a log-decay and a key scale that ``linear_recurrence`` takes as
they are. A ratio of two readouts of the same state (the mLSTM normalizer) does not see m.

Shapes: log_f, log_i [B, T, ...] (one gate per head: [B, T, H]); m0 [B, ...].
Returns (log f', log i', m), each [B, T, ...], in the inputs' dtype (float32 or wider).

One token of a decoding step: :func:`max_stabilizer_step` (the recurrent mode's loop body, without the argument
checks and the stacking; tied to it by a test).

Modes (equal up to rounding; a test ties them):

* ``recurrent``: the reference, the loop over time of the definition.
* ``parallel``: unrolled, m_t = F_t + max(m0, max_{s<=t}(log i_s - F_s)) with
  F_t = Σ_{r<=t} log f_r: one cumulative sum and one ``torch.cummax``, computed in float64
  (the difference F_t - F_s of two long cumulative sums would lose digits in float32).
"""

from __future__ import annotations

import torch

from .._checks import check_choice, check_finite, check_tensor, fmt_shape
from .precision import compute_dtype, full_precision

MODES = ("recurrent", "parallel")

__all__ = ["max_stabilizer", "max_stabilizer_step", "MODES"]

_WHERE = "max_stabilizer"


def _stabilized(log_f, log_i, m, m_prev):
    """(log f', log i') from m and m shifted by one step; clamped at 0 against rounding (both are <= 0 exactly)."""
    return (log_f + m_prev - m).clamp(max=0), (log_i - m).clamp(max=0)


@full_precision
def max_stabilizer(log_f: torch.Tensor, log_i: torch.Tensor, m0: torch.Tensor | None = None, *, mode: str = "parallel",
                   check_values: bool = True):
    """The stabilized gates (log f', log i') and the stabilizer m of the module docstring.

    ``check_values=False`` skips the finite checks of the values (a mixer that computed the gates from an
    input it has checked: each check is a reduction and a host read, per decoding step)."""
    check_choice("mode", mode, MODES, _WHERE)
    check_tensor("log_f", log_f, where=_WHERE)
    check_tensor("log_i", log_i, where=_WHERE)
    if log_f.dim() < 2 or log_i.shape != log_f.shape:
        raise ValueError(
            f"{_WHERE}: arguments 'log_f' and 'log_i' must have one shape [B, T, ...], got {fmt_shape(log_f.shape)} and {fmt_shape(log_i.shape)}"
        )
    lead = (log_f.shape[0],) + tuple(log_f.shape[2:])
    if m0 is not None:
        check_tensor("m0", m0, where=_WHERE)
        if tuple(m0.shape) != lead:
            raise ValueError(f"{_WHERE}: argument 'm0' must have shape [B, ...] = {fmt_shape(lead)}, got {fmt_shape(m0.shape)}")
    if check_values:
        for name, t in (("log_f", log_f), ("log_i", log_i), ("m0", m0)):
            if t is not None:
                check_finite(name, t, _WHERE)
    dt = compute_dtype(log_f, log_i)  # float32 or wider
    if m0 is None:
        m0 = log_f.new_zeros(lead, dtype=dt)
    if mode == "recurrent":
        m, ms = m0.to(dt), []
        for lf, li in zip(log_f.to(dt).unbind(1), log_i.to(dt).unbind(1)):
            m = torch.maximum(lf + m, li)
            ms.append(m)
        m = torch.stack(ms, 1)
        m_prev = torch.cat([m0.to(dt).unsqueeze(1), m[:, :-1]], 1)
        lf_s, li_s = _stabilized(log_f.to(dt), log_i.to(dt), m, m_prev)
        return lf_s, li_s, m
    wide = torch.float64
    lf, li, m0w = log_f.to(wide), log_i.to(wide), m0.to(wide)
    F = lf.cumsum(1)
    running = torch.cummax(li - F, dim=1).values
    m = F + torch.maximum(running, m0w.unsqueeze(1))
    m_prev = torch.cat([m0w.unsqueeze(1), m[:, :-1]], 1)
    lf_s, li_s = _stabilized(lf, li, m, m_prev)
    return lf_s.to(dt), li_s.to(dt), m.to(dt)


def max_stabilizer_step(log_f: torch.Tensor, log_i: torch.Tensor, m_prev: torch.Tensor):
    """One token of :func:`max_stabilizer` (a decoding step): m = max(log f + m_prev, log i) and the stabilized gates
    (log f', log i'), elementwise with broadcasting (log f, log i of one token, m_prev the stabilizer before it, e.g.
    [B, 1, H] and [B, 1, H]), computed in the inputs' dtype (the caller's float32 or wider gates and state). No
    argument checks: the caller built its inputs (a mixer's step, from a checked input). Returns (log f', log i', m)."""
    m = torch.maximum(log_f + m_prev, log_i)
    return _stabilized(log_f, log_i, m, m_prev) + (m,)
