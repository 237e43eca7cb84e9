"""Second derivatives (backward with create_graph=True) through the ops' hand-written backwards: exact
where the op supports them (linear_recurrence's scan, through its reference loop), a clear error where it
does not (seqmix.ops.autograd.first_order) — never a silently incomplete result."""

from __future__ import annotations

import pytest
import torch

import seqmix


def _hvp_norm(m, x):
    """A Hessian-vector product's norm, x reaching the loss also through a residual (where
    once_differentiable dropped the op's second-order terms silently)."""
    x = x.clone().requires_grad_(True)
    loss = (m(x) ** 2).sum() + (x ** 2).sum()
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    (h,) = torch.autograd.grad((g ** 2).sum(), x)
    return h.norm().item()


def _mixer(name, mode, **kw):
    entry = seqmix.mixers.base.mixer_entry(name)
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{**entry.example_config(), "mode": mode, **kw}).double()


def test_hgrn_hessian_vector_product_through_the_scan_equals_the_reference_loop():
    m_auto, m_ref = _mixer("hgrn", "auto"), _mixer("hgrn", "recurrent")
    m_ref.load_state_dict(m_auto.state_dict())
    x = torch.randn(1, 200, m_auto.config.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert _hvp_norm(m_auto, x) == pytest.approx(_hvp_norm(m_ref, x), rel=1e-10)


@pytest.mark.parametrize("name,mode,T,match", [
    ("gla", "chunk", 64, "linear_recurrence \\(mode 'chunk'\\)"),
    ("s6", "recurrent", 64, "selective_scan"),  # the chunked torch scan or the C++ kernel
    ("mesanet", "auto", 64, ""),  # its Gram chunks, CG solve or readout recurrence, whichever the backward meets first
])
def test_first_order_backwards_refuse_create_graph(name, mode, T, match):
    m = _mixer(name, mode)
    x = torch.randn(1, T, m.config.d_model, dtype=torch.float64, requires_grad=True)
    loss = (m(x) ** 2).sum() + (x ** 2).sum()
    with pytest.raises(RuntimeError, match=f"{match}.*create_graph=True.*use "):
        torch.autograd.grad(loss, x, create_graph=True)
    (g,) = torch.autograd.grad((m(x) ** 2).sum(), x)  # first order: unchanged
    assert torch.isfinite(g).all()
