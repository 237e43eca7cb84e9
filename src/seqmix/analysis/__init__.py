"""seqmix.analysis: theory tools and plots of Φ and of results."""

from .metala import (
    TABLE2, Conditions, Mark, conditions, fixed_decay_keys, linattmap, metala_channel_weights, metala_map,
    parameter_group, self_aug_diagonal, stick_breaking_decays, table2,
)

__all__ = [
    "TABLE2", "Conditions", "Mark", "conditions", "fixed_decay_keys", "linattmap", "metala_channel_weights", "metala_map",
    "parameter_group", "self_aug_diagonal", "stick_breaking_decays", "table2",
]
