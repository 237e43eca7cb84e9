"""seqmix: every sequence mixer of foundation models as one causal linear time-varying system.

    import seqmix
    mixer = seqmix.build_mixer("linear_attention", d_model=64, heads=4)
    y = mixer(x)                      # x: [batch, time, d_model]
    Phi = mixer.phi(x)                # [batch, heads, time, time]
    system = mixer.dsf(x)             # seqmix.DSF: Λ_i, B_i, C_i, D_i
"""

from .dsf import DSF
from .mixers import Cache, Mixer, MixerConfig, build_mixer, list_mixers, mixer_entry
from .ops import linear_recurrence, recurrence_map, recurrence_step

__version__ = "0.1.0"

__all__ = [
    "DSF", "Cache", "Mixer", "MixerConfig", "build_mixer", "list_mixers", "mixer_entry",
    "linear_recurrence", "recurrence_map", "recurrence_step", "__version__",
]
