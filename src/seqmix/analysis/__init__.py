"""seqmix.analysis: theory tools and plots of Φ and of results."""

from .attention_theory import (
    eta_telescoping_error,
    finite_state_attention_mixers,
    lemma1_study,
    lemma2_check,
    normalization_study,
    normalized_attention_variants,
)

__all__ = [
    "lemma1_study", "lemma2_check", "eta_telescoping_error", "finite_state_attention_mixers",
    "normalized_attention_variants", "normalization_study",
]
