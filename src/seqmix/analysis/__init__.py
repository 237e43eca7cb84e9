"""seqmix.analysis: theory tools and plots of Φ and of results."""

from .attention_theory import (
    eta_telescoping_error,
    finite_state_attention_mixers,
    lemma1_study,
    lemma2_check,
    normalization_study,
    normalized_attention_variants,
)
from .metala import (
    TABLE2, Conditions, Mark, conditions, fixed_decay_keys, linattmap, metala_channel_weights, metala_map,
    parameter_group, self_aug_diagonal, stick_breaking_decays, table2,
)
from .ssm_theory import (
    equivalence_condition, equivalence_normalizer, linear_attention_dsf, map_difference, reversed_sigmoid_transition,
    s6_dsf, softplus_transition,
)

__all__ = [
    "lemma1_study", "lemma2_check", "eta_telescoping_error", "finite_state_attention_mixers",
    "normalized_attention_variants", "normalization_study",
    "TABLE2", "Conditions", "Mark", "conditions", "fixed_decay_keys", "linattmap", "metala_channel_weights", "metala_map",
    "parameter_group", "self_aug_diagonal", "stick_breaking_decays", "table2",
    "equivalence_condition", "equivalence_normalizer", "linear_attention_dsf", "map_difference",
    "reversed_sigmoid_transition", "s6_dsf", "softplus_transition",
]
