"""seqmix.analysis: theory tools and plots of Φ and of results."""

from .attention_theory import (
    eta_telescoping_error,
    finite_state_attention_mixers,
    lemma1_study,
    lemma2_check,
    normalization_study,
    normalized_attention_variants,
)
from .ssm_theory import (
    equivalence_condition, equivalence_normalizer, linear_attention_dsf, map_difference, reversed_sigmoid_transition,
    s6_dsf, softplus_transition,
)

__all__ = [
    "lemma1_study", "lemma2_check", "eta_telescoping_error", "finite_state_attention_mixers",
    "normalized_attention_variants", "normalization_study",
    "equivalence_condition", "equivalence_normalizer", "linear_attention_dsf", "map_difference",
    "reversed_sigmoid_transition", "s6_dsf", "softplus_transition",
]
from .realization import (
    attention_realization, ccf, companion_matrix, companion_realization, diagonal_to_ccf, linear_attention_realization,
    poly_from_roots, run_strict, run_system, shift_matrix, strictly_causal,
)

__all__ += [
    "attention_realization", "ccf", "companion_matrix", "companion_realization", "diagonal_to_ccf",
    "linear_attention_realization", "poly_from_roots", "run_strict", "run_system", "shift_matrix", "strictly_causal",
]
