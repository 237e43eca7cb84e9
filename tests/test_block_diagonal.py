"""seqmix.mixers.layers.BlockDiagonalLinear (RecurrentGemma's RG-LRU gates) against the nn.Linear of its expanded
weight: forward and gradients, float64 tight and float32 relative; the general form's ``gate_blocks`` option."""

from __future__ import annotations

import pytest
import torch
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

from seqmix.mixers.layers import BlockDiagonalLinear


def _close(a, b, dtype):
    if dtype == torch.float64:
        assert max_abs(a, b) < F64_ATOL
    else:
        assert rel_err(a, b) < F32_RTOL


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(2, 5), (1, 1), (7,)])
def test_block_diagonal_linear_equals_the_linear_of_its_expanded_weight(dtype, bias, shape):
    torch.manual_seed(0)
    m = BlockDiagonalLinear(12, 8, 4, bias=bias).to(dtype)
    x = torch.randn(*shape, 12, dtype=dtype, requires_grad=True)
    y = m(x)
    W = m.expanded_weight()
    assert W.shape == (8, 12) and y.shape == (*shape, 8)
    assert torch.count_nonzero(W) <= 4 * 3 * 2  # only the blocks
    ref = torch.nn.functional.linear(x, W, m.bias)
    _close(y, ref, dtype)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, m.weight] + ([m.bias] if bias else []), g)
    want = torch.autograd.grad(ref, [x, m.weight] + ([m.bias] if bias else []), g)
    for a, b in zip(got, want):
        _close(a, b, dtype)


def test_block_diagonal_linear_refuses_widths_its_blocks_do_not_divide():
    with pytest.raises(ValueError, match="in_features"):
        BlockDiagonalLinear(10, 8, 4)
    with pytest.raises(ValueError, match="out_features"):
        BlockDiagonalLinear(8, 10, 4)


def test_gate_blocks_makes_the_rg_lru_gates_block_diagonal_and_equals_the_dense_block():
    """rg_lru_block with gate_blocks: W_a and W_x are BlockDiagonalLinear (1/blocks of the entries); a dense block
    whose gate weights are the expanded ones computes the same output and decoding states (float64)."""
    from seqmix.mixers.base import Cache, build_mixer

    torch.manual_seed(0)
    blk = build_mixer("rg_lru_block", d_model=16, gate_blocks=4).double()
    assert isinstance(blk.W_a, BlockDiagonalLinear) and isinstance(blk.W_v, BlockDiagonalLinear)
    dense = build_mixer("rg_lru_block", d_model=16).double()
    with torch.no_grad():
        for name, t in dense.state_dict().items():
            mod = name.rsplit(".", 1)[0]
            if mod in ("W_a", "W_v") and name.endswith("weight"):
                t.copy_(getattr(blk, mod).expanded_weight())
            else:
                t.copy_(blk.state_dict()[name])
    assert sum(p.numel() for p in blk.parameters()) < sum(p.numel() for p in dense.parameters())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    assert max_abs(blk(x), dense(x)) < F64_ATOL
    cb, cd = Cache(), Cache()
    blk(x[:, :8], cache=cb), dense(x[:, :8], cache=cd)
    assert max_abs(blk(x[:, 8:], cache=cb), dense(x[:, 8:], cache=cd)) < F64_ATOL
    with pytest.raises(ValueError, match="gate_blocks"):
        build_mixer("gla", d_model=16, gate_blocks=2)
    with pytest.raises(ValueError, match="gate_blocks"):
        build_mixer("rg_lru_block", d_model=16, gate_blocks=3)


@pytest.mark.parametrize("bias", [True, False])
def test_project_runs_a_plain_block_diagonal_linear_without_the_module_call_and_keeps_hooks(bias):
    """seqmix.mixers.layers.project on a BlockDiagonalLinear (a decoding step's RG-LRU gates): its forward without the
    module call, the numbers of calling it, with bfloat16 input on float32 weights too; a hook of its own or a global
    hook runs the module call."""
    from unittest import mock

    from seqmix.mixers.layers import project

    torch.manual_seed(0)
    m = BlockDiagonalLinear(12, 8, 4, bias=bias).double()
    u = torch.randn(3, 12, dtype=torch.float64)
    with mock.patch.object(torch.nn.Module, "__call__", side_effect=AssertionError("module called")):
        got = project(m, u)
    assert torch.equal(got, m(u))
    assert max_abs(got, torch.nn.functional.linear(u, m.expanded_weight(), m.bias)) < F64_ATOL
    m32, ub = m.float(), u.to(torch.bfloat16)
    assert torch.equal(project(m32, ub), m32(ub)) and project(m32, ub).dtype == torch.bfloat16
    h = m32.register_forward_hook(lambda mod, a, out: out * 2)
    assert torch.equal(project(m32, ub), 2 * BlockDiagonalLinear.forward(m32, ub))
    h.remove()
    seen = []
    g = torch.nn.modules.module.register_module_forward_hook(lambda mod, a, out: seen.append(type(mod).__name__) or out)
    try:
        project(m32, ub)
        assert seen == ["BlockDiagonalLinear"]
    finally:
        g.remove()


def test_call_plain_is_the_module_call_and_keeps_hooks():
    """seqmix.mixers.layers.call_plain (a decoding step's short conv): a plain module's forward called directly with
    the same result as the module call; a hook of its own, a global hook or an instance's own forward: the module call."""
    from unittest import mock

    from seqmix.mixers.layers import ShortConv, call_plain

    torch.manual_seed(0)
    conv = ShortConv(6, 4).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    with mock.patch.object(torch.nn.Module, "__call__", side_effect=AssertionError("module called")):
        y, s = call_plain(conv, x, None, output_final_state=True)
    y_ref, s_ref = conv(x, None, output_final_state=True)
    assert torch.equal(y, y_ref) and torch.equal(s, s_ref)
    h = conv.register_forward_hook(lambda mod, a, kw, out: (out[0] * 2, out[1]), with_kwargs=True)
    assert torch.equal(call_plain(conv, x, None, output_final_state=True)[0], 2 * y_ref)
    h.remove()
    seen = []
    g = torch.nn.modules.module.register_module_forward_hook(lambda mod, a, out: seen.append(1) or out)
    try:
        call_plain(conv, x, None)
        assert seen == [1]
    finally:
        g.remove()
    conv.forward = lambda *a, **k: ("replaced",)  # (accelerate replaces an instance's forward: honoured)
    assert call_plain(conv, x, None) == ("replaced",)


def test_block_diagonal_linear_with_a_parametrized_weight_and_bias():
    """A BlockDiagonalLinear whose weight and bias are parametrized (torch.nn.utils.parametrize: no longer entries of
    its parameter dict) computes with the parametrized values, called or through project."""
    from torch.nn.utils import parametrize

    from seqmix.mixers.layers import project

    class Doubled(torch.nn.Module):
        def forward(self, t):
            return 2 * t

    torch.manual_seed(0)
    m = BlockDiagonalLinear(12, 8, 4).double()
    u = torch.randn(3, 12, dtype=torch.float64)
    want = torch.nn.functional.linear(u, 2 * m.expanded_weight(), 2 * m.bias)
    parametrize.register_parametrization(m, "weight", Doubled())
    parametrize.register_parametrization(m, "bias", Doubled())
    assert max_abs(m(u), want) < F64_ATOL and max_abs(project(m, u), want) < F64_ATOL


def test_block_diagonal_linear_reads_a_bias_that_is_not_its_parameter():
    """A bias given as a plain tensor (on a layer made without one) or kept as a buffer is added, called or through
    project: the forward reads the attribute wherever the bias is not the layer's own parameter."""
    from seqmix.mixers.layers import project

    torch.manual_seed(0)
    u = torch.randn(3, 12, dtype=torch.float64)
    m = BlockDiagonalLinear(12, 8, 4, bias=False).double()
    m.bias = torch.randn(8, dtype=torch.float64)
    want = torch.nn.functional.linear(u, m.expanded_weight(), m.bias)
    assert max_abs(m(u), want) < F64_ATOL and max_abs(project(m, u), want) < F64_ATOL
    m2 = BlockDiagonalLinear(12, 8, 4).double()
    t = m2.bias.detach().clone()
    del m2.bias
    m2.register_buffer("bias", t)
    want2 = torch.nn.functional.linear(u, m2.expanded_weight(), t)
    assert max_abs(m2(u), want2) < F64_ATOL and max_abs(project(m2, u), want2) < F64_ATOL


def test_project_and_call_plain_run_a_compiled_module_through_its_compiled_call():
    """A layer compiled by Module.compile (which sets the instance's _compiled_call_impl) is called through its
    compiled call, not through its plain forward: a Linear and a BlockDiagonalLinear in project, a ShortConv in
    call_plain; the numbers are the uncompiled layer's."""
    from seqmix.mixers.layers import ShortConv, call_plain, project

    torch.manual_seed(0)
    u = torch.randn(3, 12, dtype=torch.float64)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    lin, bdl, conv = torch.nn.Linear(12, 5).double(), BlockDiagonalLinear(12, 8, 4).double(), ShortConv(12, 4).double()
    want = (lin(u), bdl(u), conv(x, None)[0])
    calls = []
    for m in (lin, bdl, conv):
        m.compile(backend="eager")
        compiled = m._compiled_call_impl
        assert compiled is not None
        m._compiled_call_impl = lambda *a, _c=compiled, _m=m, **k: calls.append(type(_m).__name__) or _c(*a, **k)
    got = (project(lin, u), project(bdl, u), call_plain(conv, x, None)[0])
    assert calls == ["Linear", "BlockDiagonalLinear", "ShortConv"]
    for a, b in zip(got, want):
        assert max_abs(a, b) < F64_ATOL
