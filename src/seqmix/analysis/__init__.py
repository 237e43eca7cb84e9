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
from .mapstats import (
    band_mass, check_seq_len, count_distinct, decay_summary, dense_map_bytes, effective_rank, lag_quantile, map_distance,
    memory_lengths, row_profile,
)
from .show import (
    MixerView, html_report, inspect_mixer, inspect_mixers, load_mixer_checkpoint, make_input, save_mixer_checkpoint,
    show_figure, write_html,
)
from .theory_figures import THEORY_FIGURES, equivalence_figure, lemma1_figure, stick_breaking_figure
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
    "band_mass", "check_seq_len", "count_distinct", "decay_summary", "dense_map_bytes", "effective_rank", "lag_quantile",
    "map_distance", "memory_lengths", "row_profile",
    "MixerView", "html_report", "inspect_mixer", "inspect_mixers", "load_mixer_checkpoint", "make_input",
    "save_mixer_checkpoint", "show_figure", "write_html",
    "THEORY_FIGURES", "equivalence_figure", "lemma1_figure", "stick_breaking_figure",
]
from .realization import (
    attention_realization, ccf, companion_matrix, companion_realization, diagonal_to_ccf, linear_attention_realization,
    poly_from_roots, run_strict, run_system, shift_matrix, strictly_causal,
)

__all__ += [
    "attention_realization", "ccf", "companion_matrix", "companion_realization", "diagonal_to_ccf",
    "linear_attention_realization", "poly_from_roots", "run_strict", "run_system", "shift_matrix", "strictly_causal",
]
