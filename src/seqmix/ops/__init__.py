"""Pure tensor functions (no parameters): every mode of an op beside its reference."""

from .recurrence import MODES as RECURRENCE_MODES
from .conv import causal_conv1d, causal_conv1d_step, direct_conv, fft_conv, toeplitz
from .recurrence import linear_recurrence, recurrence_map, recurrence_step

__all__ = [
    "linear_recurrence", "recurrence_step", "recurrence_map", "RECURRENCE_MODES",
    "fft_conv", "direct_conv", "toeplitz", "causal_conv1d", "causal_conv1d_step",
]
