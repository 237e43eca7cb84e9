"""seqmix: every sequence mixer of foundation models as one causal linear time-varying system.

    import seqmix
    mixer = seqmix.build_mixer("linear_attention", d_model=64, heads=4)
    y = mixer(x)                      # x: [batch, time, d_model]
    Phi = mixer.phi(x)                # [batch, heads, time, time]
    system = mixer.dsf(x)             # seqmix.DSF: Λ_i, B_i, C_i, D_i

A mixer of one's own (docs/new_mixer.md): a ``MixerConfig`` and a ``Mixer`` subclass, one call
into ``seqmix.ops``, ``@seqmix.register("name")``, then ``seqmix.check_mixer("name")`` runs the
contract suite of the built-in mixers on it.
"""

from .dsf import DSF
from .mixers import (
    Cache, Mixer, MixerConfig, MixOut, build_mixer, list_mixers, mixer_entry, register, register_preset, unregister,
)
from .ops import linear_recurrence, recurrence_map, recurrence_step
from .contract import ContractError, check_mixer
from .version import __version__


def compile_decode(model, **kwargs) -> dict:
    """``torch.compile`` of the decoding step of every seqmix layer of a converted or linearized transformers
    model (opt-in): :func:`seqmix.interop.compile_decode`."""
    from .interop import compile_decode as compile_interop

    return compile_interop(model, **kwargs)


__all__ = [
    "DSF", "Cache", "Mixer", "MixerConfig", "MixOut", "build_mixer", "list_mixers", "mixer_entry", "register",
    "register_preset", "unregister", "check_mixer", "ContractError",
    "linear_recurrence", "recurrence_map", "recurrence_step", "compile_decode", "__version__",
]
