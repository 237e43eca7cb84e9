"""Sequence mixers, one file per family; importing this package registers them all."""

from . import attention  # noqa: F401  (registers)
from . import linear_attention  # noqa: F401  (registers the general form and its presets)
from . import ssm  # noqa: F401  (registers)
from . import convolution  # noqa: F401  (registers)
from . import hybrid  # noqa: F401  (registers)
from . import delta  # noqa: F401  (registers deltanet, gated_deltanet, kda)
from . import log_linear  # noqa: F401  (registers log_linear_mamba2, log_linear_gdn)
from . import regression  # noqa: F401  (registers mesanet)
from .base import Cache, Mixer, MixerConfig, MixerEntry, MixOut, build_mixer, list_mixers, mixer_entry, register, register_preset, unregister

__all__ = [
    "Cache", "Mixer", "MixerConfig", "MixerEntry", "MixOut",
    "build_mixer", "list_mixers", "mixer_entry", "register", "register_preset", "unregister",
]
