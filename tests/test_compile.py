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


def _graph_break(fn, *args) -> str | None:
    """None when torch.compile(fullgraph=True) traces ``fn(*args)`` as one graph (and runs it), else the
    first graph break's reason. The backend runs the captured graph as it is (no code generation):
    the trace is what is tested."""
    import torch._dynamo as dynamo

    dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    try:
        torch.compile(fn, backend=capture, fullgraph=True)(*args)
    except dynamo.exc.Unsupported as e:  # a graph break: fullgraph refuses it, naming the reason
        return str(e).strip().splitlines()[0]
    assert len(graphs) == 1, f"{len(graphs)} graphs captured without a graph break"
    return None


def test_the_check_sees_a_graph_break():
    """A branch on a tensor's value in the forward (a host read) is a graph break, reported with its reason."""

    def host_read(x):
        return x * 2 if x.sum() > 0 else x

    assert _graph_break(host_read, torch.randn(3)) is not None
    assert _graph_break(lambda x: x * x.sum(), torch.randn(3)) is None


@pytest.mark.parametrize("name", NAMES)
def test_training_forward_is_one_graph(name):
    m = make(name, torch.float32).train()
    x = torch.randn(BATCH, lengths(m)[1], m.d_model, requires_grad=True)
    reason = _graph_break(m, x)
    if name in KNOWN_BREAKS:
        assert reason is not None, f"{name} is listed in KNOWN_BREAKS ({KNOWN_BREAKS[name]}) but does not break: take it out"
        return
    assert reason is None, f"{name}: a graph break: {reason}"


@pytest.mark.parametrize("case", ["softmax_attention", "gla", "mamba2", "pattern:mamba_swa"])
def test_backbone_training_forward_is_one_graph(case):
    torch.manual_seed(0)
    model = build_model(tiny_config(case)).float().train()
    ids = torch.randint(0, 29, (2, 16))
    reason = _graph_break(model, ids)
    assert reason is None, f"{case}: a graph break: {reason}"
