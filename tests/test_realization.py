"""seqmix.analysis.realization (B'MOJO App. C) and seqmix.ops.ltv: each realization reproduces
its mixer's output (softmax attention with a window, linear attention, S4D), the companion
forms reproduce the systems they stand for, and the dense scan's two modes agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import seqmix
from seqmix.analysis import (
    attention_realization, companion_matrix, companion_realization, diagonal_to_ccf, linear_attention_realization,
    poly_from_roots, run_strict, run_system, shift_matrix, strictly_causal,
)
from seqmix.ops.ltv import ltv_scan
from tolerances import DSF_ATOL, F64_ATOL, max_abs


def inputs(T=10, B=2, d=16, seed=1):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def build(name, **cfg):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **cfg).double().eval()


@pytest.mark.parametrize("time_varying", [False, True])
def test_ltv_scan_modes_agree(time_varying):
    g = torch.Generator().manual_seed(0)
    B, T, N = 2, 13, 4
    A = torch.randn(B, T, N, N, generator=g, dtype=torch.float64) * 0.5 if time_varying else torch.randn(N, N, generator=g, dtype=torch.float64) * 0.5
    b = torch.randn(B, T, N, generator=g, dtype=torch.float64)
    x0 = torch.randn(B, N, generator=g, dtype=torch.float64)
    ref = ltv_scan(A, b, initial_state=x0)
    assert max_abs(ltv_scan(A, b, initial_state=x0, mode="parallel"), ref) < 1e-12
    At = A if time_varying else A.expand(B, T, N, N)
    assert max_abs(ref[:, 0], (At[:, 0] @ x0.unsqueeze(-1)).squeeze(-1) + b[:, 0]) < 1e-14
    with pytest.raises(ValueError, match="'A'"):
        ltv_scan(torch.zeros(N + 1, N + 1), b)


@pytest.mark.parametrize("window", [1, 3, 10])
def test_attention_shift_register_is_sliding_window_attention(window):
    """Eq. (9): the nil-potent shift register of [k; v] with a softmax read-out is SWA(window)."""
    m = build("softmax_attention", d_model=16, n=8, heads=2, window=window)
    x = inputs()
    q, k, v = m._qkv(x)
    _, mixed = m.core(x)
    assert max_abs(attention_realization(q, k, v, window, scale=1.0), mixed) < F64_ATOL


def test_companion_form_generalizes_attention():
    """B'MOJO-F's companion form: a = 0 is the attention shift register (the newest N blocks);
    a non-zero last row aggregates the stored blocks into the newest one (not a shift register)."""
    g = torch.Generator().manual_seed(2)
    B, T, N, p = 2, 9, 3, 5
    b = torch.randn(B, T, p, generator=g, dtype=torch.float64)
    Z = companion_realization(None, b, N)
    for t in range(T):
        for i in range(N):  # block i holds b_{t-(N-1-i)}, zeros before the start
            src = t - (N - 1 - i)
            assert max_abs(Z[:, t, i], b[:, src] if src >= 0 else torch.zeros_like(b[:, 0])) == 0
    a = torch.rand(B, T, N, generator=g, dtype=torch.float64)
    Za = companion_realization(a, b)
    assert max_abs(Za[:, :, :-1], Z[:, :, :-1]) > 0  # the aggregate propagates through the shift
    expected_last = (a[:, 1:].unsqueeze(-1) * Za[:, :-1]).sum(2) + b[:, 1:]
    assert max_abs(Za[:, 1:, -1], expected_last) < 1e-13
    assert torch.equal(companion_matrix(torch.zeros(N, dtype=torch.float64)), shift_matrix(N))


@pytest.mark.parametrize("window", [1, 2, 5])
def test_linear_attention_fir_and_local_global(window):
    """Eq. (13): the FIR shift register is windowed linear attention; eq. (15)-(18): with the
    integrator block it is full causal linear attention, the linear_attention mixer."""
    m = build("linear_attention", d_model=16, n=8, heads=2)
    x = inputs(T=11)
    fq, fk, _ = m.separable_parts(x)
    values, mixed = m.core(x)
    full = linear_attention_realization(fq, fk, values, window=window, global_memory=True)
    assert max_abs(full, mixed) < F64_ATOL
    fir = linear_attention_realization(fq, fk, values, window=window)
    T = x.shape[1]
    t = torch.arange(T)
    band = ((t[:, None] - t[None, :]) >= 0) & ((t[:, None] - t[None, :]) < window)
    A = torch.einsum("bthn,bshn->bhts", fq, fk) * band
    direct = torch.einsum("bhts,bshv->bthv", A, values) / A.sum(-1).transpose(1, 2).unsqueeze(-1)
    assert max_abs(fir, direct) < F64_ATOL
    if window < T:
        assert max_abs(fir, mixed) > 1e-3  # the window forgets; the integrator does not


def test_poly_from_roots():
    r = torch.tensor([0.5, -0.25, 0.9, 0.1], dtype=torch.float64)
    assert max_abs(poly_from_roots(r), torch.from_numpy(np.poly(r.numpy())[::-1].copy())) < 1e-15


def test_companion_form_of_s4d_real():
    """App. C.3: α from Π(z - a_i) and β from the strictly causal part give a companion-form
    system with the same output as the diagonal S4D-Real mixer, channel by channel."""
    m = build("s4d", d_model=4, d_state=4, init="real")
    u = inputs(T=12, d=4)
    log_A, Bb, C = (t.detach() for t in m.discrete())
    _, mixed = m.core(u)
    A_c, B_c, C_c, D_c = diagonal_to_ccf(log_A.exp(), Bb, C, m.D.detach())
    assert max_abs(run_strict(A_c, B_c, C_c, D_c, u), mixed[..., 0]) < 1e-10
    assert max_abs(run_system(torch.diag_embed(log_A.exp()), Bb, C, m.D.detach(), u), mixed[..., 0]) < F64_ATOL
    assert max_abs(A_c[:, :-1], shift_matrix(4).expand(4, 4, 4)[:, :-1]) == 0  # a companion matrix


def test_strictly_causal_rewriting():
    g = torch.Generator().manual_seed(4)
    H, N = 3, 4
    A = torch.randn(H, N, N, generator=g, dtype=torch.float64) * 0.4
    B = torch.randn(H, N, generator=g, dtype=torch.float64)
    C = torch.randn(H, N, generator=g, dtype=torch.float64)
    D = torch.randn(H, generator=g, dtype=torch.float64)
    u = inputs(T=9, d=H)
    y = run_system(A, B, C, D, u)
    assert max_abs(run_strict(*strictly_causal(A, B, C, D), u), y) < DSF_ATOL * 100
    assert max_abs(run_strict(A, B, C, D, u), y) > 1e-3  # the two conventions differ
