"""torch.compile sees every mixer's training forward, and the LM backbone's, as one graph.

``torch._dynamo.explain`` traces the call and counts the graph breaks: each one is a place where
dynamo gives up (a host read of a value, an untraceable kernel or autograd.Function) and the
compiled code returns to Python. None is left in any registered mixer's training forward (the
default mode, with gradients), nor in the backbone around a mixer or a hybrid pattern. What makes
it so: no host read while tracing (``seqmix.debug``), ``backend="auto"`` keeping to traceable
backends while tracing (``seqmix.ops.backends``), and the hand-written autograd Functions taking
traceable inputs (or autograd's path, for MesaNet's CG solve).
"""

from __future__ import annotations

import pytest
import torch

from seqmix.models import build_model
from test_contract import BATCH, NAMES, lengths, make
from tiny_models import tiny_config

pytestmark = pytest.mark.slow

#: mixers whose training forward still breaks the graph, with the reason (none today)
KNOWN_BREAKS: dict[str, str] = {}


def _breaks(fn, *args) -> tuple[int, list[str]]:
    import torch._dynamo as dynamo

    dynamo.reset()
    ex = dynamo.explain(fn)(*args)
    return ex.graph_break_count, sorted({str(b.reason).splitlines()[0] for b in ex.break_reasons})


@pytest.mark.parametrize("name", NAMES)
def test_training_forward_is_one_graph(name):
    m = make(name, torch.float32).train()
    x = torch.randn(BATCH, lengths(m)[1], m.d_model, requires_grad=True)
    n, reasons = _breaks(m, x)
    if name in KNOWN_BREAKS:
        assert n > 0, f"{name} is listed in KNOWN_BREAKS ({KNOWN_BREAKS[name]}) but no longer breaks: take it out"
        return
    assert n == 0, f"{name}: {n} graph break(s): {reasons}"


@pytest.mark.parametrize("case", ["softmax_attention", "gla", "mamba2", "pattern:mamba_swa"])
def test_backbone_training_forward_is_one_graph(case):
    torch.manual_seed(0)
    model = build_model(tiny_config(case)).float().train()
    ids = torch.randint(0, 29, (2, 16))
    n, reasons = _breaks(model, ids)
    assert n == 0, f"{case}: {n} graph break(s): {reasons}"
