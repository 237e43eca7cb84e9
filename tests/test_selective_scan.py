"""seqmix.ops.selective_scan: the fused mode (hand-written backward) against the reference loop,
both against Mamba's selective_scan_ref semantics and against linear_recurrence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqmix.ops import linear_recurrence
from seqmix.ops.selective_scan import selective_scan
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err


def make(B=2, T=13, D=3, N=4, per_channel=False, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_(True)

    x = r(B, T, D)
    delta = (torch.rand(B, T, D, generator=g, dtype=torch.float64) * 0.5).to(dtype).requires_grad_(True)
    A = (-torch.rand(D, N, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_(True)
    shape = (B, T, D, N) if per_channel else (B, T, N)
    return dict(x=x, delta=delta, A=A, B=r(*shape), C=r(*shape), D=r(D), h0=r(B, D, N))


def run(mode, a, with_state=True):
    y, h = selective_scan(
        a["x"], a["delta"], a["A"], a["B"], a["C"], a["D"],
        initial_state=a["h0"] if with_state else None, output_final_state=True, mode=mode,
    )
    g = torch.Generator().manual_seed(9)
    w = torch.randn(y.shape, generator=g, dtype=y.dtype)
    wh = torch.randn(h.shape, generator=g, dtype=h.dtype)
    leaves = list(a.values())
    grads = torch.autograd.grad((y * w).sum() + (h * wh).sum(), leaves, allow_unused=True)
    return y.detach(), h.detach(), grads


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("T", [1, 2, 13])
@pytest.mark.parametrize("with_state", [False, True])
def test_fused_equals_reference_float64(per_channel, T, with_state):
    a = make(T=T, per_channel=per_channel)
    y1, h1, g1 = run("reference", a, with_state)
    y2, h2, g2 = run("fused", a, with_state)
    assert max_abs(y1, y2) < F64_ATOL and max_abs(h1, h2) < F64_ATOL
    for u, v in zip(g1, g2):
        if u is None or v is None:
            assert u is None and v is None
            continue
        assert max_abs(u, v) < F64_ATOL


def test_fused_float32_relative():
    a = make(T=40, D=5, N=6, dtype=torch.float32)
    y1, h1, g1 = run("reference", a)
    y2, h2, g2 = run("fused", a)
    assert y2.dtype == torch.float32
    assert rel_err(y2, y1) < F32_RTOL and rel_err(h2, h1) < F32_RTOL
    for u, v in zip(g1, g2):
        assert rel_err(v, u) < F32_RTOL


def mamba_reference(u, delta, A, B, C, D, delta_bias):
    """Mamba's selective_scan_ref semantics, channel-first (b, d, l) as there: delta_softplus with
    the bias added inside, deltaA = exp(delta·A), deltaB_u = delta·B·u, y = Σ_n x·C + D·u."""
    delta = F.softplus(delta + delta_bias[..., None])
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    x = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for dA, dBu, C_i in zip(deltaA.unbind(2), deltaB_u.unbind(2), C.unbind(2)):
        x = dA * x + dBu
        ys.append(torch.einsum("bdn,bn->bd", x, C_i))
    return torch.stack(ys, 2) + u * D[:, None]


def test_semantics_equal_mamba_reference():
    g = torch.Generator().manual_seed(3)
    Bt, D, N, L = 2, 5, 4, 17
    u = torch.randn(Bt, D, L, generator=g, dtype=torch.float64)
    dt_pre = torch.randn(Bt, D, L, generator=g, dtype=torch.float64)
    bias = torch.randn(D, generator=g, dtype=torch.float64)
    A = -torch.exp(torch.randn(D, N, generator=g, dtype=torch.float64))
    B = torch.randn(Bt, N, L, generator=g, dtype=torch.float64)
    C = torch.randn(Bt, N, L, generator=g, dtype=torch.float64)
    Dv = torch.randn(D, generator=g, dtype=torch.float64)
    ref = mamba_reference(u, dt_pre, A, B, C, Dv, bias)
    delta = F.softplus(dt_pre + bias[:, None]).transpose(1, 2)
    for mode in ("reference", "fused"):
        y, _ = selective_scan(u.transpose(1, 2), delta, A, B.transpose(1, 2), C.transpose(1, 2), Dv, mode=mode)
        assert max_abs(y.transpose(1, 2), ref) < F64_ATOL


def test_equals_linear_recurrence_with_one_head_per_channel():
    a = make(T=11)
    x, delta, A, B, C = (a[k].detach() for k in ("x", "delta", "A", "B", "C"))
    Bt, T, D = x.shape
    N = A.shape[1]
    y, h = selective_scan(x, delta, A, B, C, output_final_state=True)
    o, S = linear_recurrence(
        C.unsqueeze(2).expand(Bt, T, D, N), delta.unsqueeze(-1) * B.unsqueeze(2), x.unsqueeze(-1),
        delta.unsqueeze(-1) * A, output_final_state=True, mode="recurrent",
    )
    assert max_abs(y, o[..., 0]) < F64_ATOL and max_abs(h, S[..., 0]) < F64_ATOL


def test_bad_input():
    a = {k: v.detach() for k, v in make().items()}
    args = (a["x"], a["delta"], a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="'A'"):
        selective_scan(a["x"], a["delta"], -a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="'delta'"):
        selective_scan(a["x"], -a["delta"], a["A"], a["B"], a["C"])
    with pytest.raises(ValueError, match="'B'"):
        selective_scan(a["x"], a["delta"], a["A"], a["B"][..., :2], a["C"])
    with pytest.raises(ValueError, match="'initial_state'"):
        selective_scan(*args, initial_state=a["h0"][:, :2])
    with pytest.raises(ValueError, match="mode"):
        selective_scan(*args, mode="parallel")
    with pytest.raises(ValueError, match="'x'"):
        selective_scan(a["x"].masked_fill(a["x"] > 1, float("nan")), a["delta"], a["A"], a["B"], a["C"])
