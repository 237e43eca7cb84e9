"""Mixed precision: which parts of a mixer run in which dtype (docs/scale.md).

Under ``torch.autocast`` (bf16 or fp16) or with half parameters, the projections of a mixer
(its Linear layers, short convolutions, gates) run in the half dtype, and the numerically
delicate parts run in float32 (complex64 when complex), then cast back:

* recurrent states and decay products (cumulative log-decays, exp of them, the state S):
  ``linear_recurrence``, ``selective_scan``, ``ssm_scan``, ``ltv_scan``;
* complex decays and FFT convolutions (S4, S4D, LRU, RetNet's xPos rotation, H3, Hyena's
  filters): bf16/fp16 have no complex dtype, and the FFT of a long signal in half precision
  loses about log2(T) bits;
* softmax (the explicit ``parallel`` reference; SDPA keeps its own fp32 accumulation).

An op that computes in float32 must also switch autocast off inside: otherwise every matmul
it runs on its float32 tensors is cast back to the half dtype by autocast.
:func:`full_precision` does both at the op's entry; the op casts its output back to the
input's dtype at exit.
"""

from __future__ import annotations

import contextlib
import functools

import torch

HALF = (torch.float16, torch.bfloat16)


def compute_dtype(*tensors) -> torch.dtype | None:
    """The promoted dtype of the tensors given (None entries skipped), with half dtypes raised
    to float32 (complex stays complex: complex64 or wider)."""
    dt = None
    for t in tensors:
        if t is None:
            continue
        dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    return torch.float32 if dt in HALF else dt


def upcast(t: torch.Tensor | None) -> torch.Tensor | None:
    """t in float32 if it is half precision, else unchanged."""
    return t.float() if t is not None and t.dtype in HALF else t


def complex_(re: torch.Tensor, im: torch.Tensor) -> torch.Tensor:
    """torch.complex(re, im), computed from float32 when either part is half precision
    (there is no complex half dtype on CPU; complex64 is the precision for complex decays)."""
    re, im = upcast(re), upcast(im)
    dt = torch.promote_types(re.dtype, im.dtype)
    return torch.complex(re.to(dt), im.to(dt))


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``; a device type without autocast (``meta``) reads as off
    (torch's ``is_autocast_enabled`` refuses it)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def autocast_off(device_type: str):
    """A context with autocast disabled on ``device_type`` (a no-op context when it is off, or when the
    device type has no autocast)."""
    if autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def backward_autocast_off(backward):
    """Decorator for the backward of an autograd Function: runs it with autocast switched off on
    the device of the first saved tensor, so that the backward's matmuls stay in the forward's dtype."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        with autocast_off(ctx.saved_tensors[0].device.type):
            return backward(ctx, *grads)

    return wrapper


def full_precision(fn):
    """Decorator for an op that computes half inputs in float32: runs ``fn`` with autocast
    switched off on the device of its first tensor argument, so that the op's own matmuls
    stay in the dtype it chose. Casting inputs up and the output back stays the op's job."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        first = args[0] if args else None
        device = first.device.type if isinstance(first, torch.Tensor) else \
            next((a.device.type for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), "cpu")
        if not autocast_enabled(device):  # (the common case: no context to enter)
            return fn(*args, **kwargs)
        with torch.autocast(device, enabled=False):
            return fn(*args, **kwargs)

    return wrapper


def linear_f32(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` computed in float32 or wider whatever autocast or the parameters' dtype say
    (for a projection whose output feeds an ill-conditioned part, e.g. a signed, cancelling
    normalizer). Returns float32 for half inputs or parameters."""
    dt = compute_dtype(x, layer.weight)
    with autocast_off(x.device.type):
        bias = layer.bias.to(dt) if layer.bias is not None else None
        return torch.nn.functional.linear(x.to(dt), layer.weight.to(dt), bias)
