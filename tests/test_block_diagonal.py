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
