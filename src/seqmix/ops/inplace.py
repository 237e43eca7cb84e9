"""Decoding steps that write their state in place (DESIGN.md, "the decode path").

A step op (:func:`~seqmix.ops.recurrence.recurrence_step`, :func:`~seqmix.ops.delta_rule.delta_rule_step`,
the selective scan's step) returns the new state. By default it is a new tensor, so a state handed to a
step is never changed (a caller may keep it: a fork of the decoding, a test comparing two paths). A
caller that owns the state and drops the old one after the step (transformers' cache object behind
interop's adapter, :func:`seqmix.models.generation.generate`'s Cache) runs its steps inside
:func:`states_in_place`: the ops then update the state's own buffer (S ← Λ S + k vᵀ as ``mul_`` and
``addcmul_``), with no new state tensor per token, and return that same tensor.

Where a state cannot be written (autograd records it, an inference tensor outside inference mode, a
dtype other than the step's compute dtype) the op computes a new one as without the context. Inside the
context the step ops also skip their argument checks (:func:`owned`): the caller made the states and the
inputs, and checked what it was handed once (interop's adapter checks a call fully before it trusts the
next ones).
"""

from __future__ import annotations

import torch

_IN_PLACE: list[bool] = []  # the open contexts, innermost last


class states_in_place:  # noqa: N801  (used as a context, like torch.no_grad)
    """Context: the decoding steps run inside it update their states in place (module docstring)."""

    def __enter__(self):
        _IN_PLACE.append(True)
        return self

    def __exit__(self, *exc):
        _IN_PLACE.pop()
        return False


def writable(state: torch.Tensor | None, dtype: torch.dtype) -> bool:
    """Whether a step may update ``state`` in place: inside :func:`states_in_place`, a state of the step's
    compute ``dtype`` that autograd does not record, and not an inference tensor outside inference mode."""
    if not _IN_PLACE or state is None or state.dtype != dtype:
        return False
    if state.requires_grad and torch.is_grad_enabled():
        return False
    if torch.compiler.is_compiling():  # (is_inference() cannot be traced; a compiled step runs on the eager step's states)
        return True
    return not state.is_inference() or torch.is_inference_mode_enabled()


def owned() -> bool:
    """Whether the running step's caller owns its states and inputs (inside :func:`states_in_place`): the step
    ops then skip their argument checks."""
    return bool(_IN_PLACE)
