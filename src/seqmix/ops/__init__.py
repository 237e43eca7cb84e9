"""Pure tensor functions (no parameters): every mode of an op beside its reference."""

from .mkl import resolve_vml

resolve_vml()  # MKL's vector math settled before any op runs it on several threads (ops/mkl.py)

from .recurrence import MODES as RECURRENCE_MODES
from .attention import MODES as ATTENTION_MODES
from .attention import (
    KVCache, alibi_slopes, attention_decode, attention_mask, attention_probs, attention_step, kv_cache_trim, repeat_kv, softmax_attention,
)
from .rotary import (
    ROPE_SCALINGS, RotaryTable, apply_rotary, check_rope_scaling, rope_frequencies, rotary, rotary_angles, rotary_cos_sin,
    rotary_reference,
)
from .conv import causal_conv1d, causal_conv1d_step, direct_conv, fft_conv, toeplitz
from .features import FEATURE_MAPS, apply_feature_map, taylor_feature_dim, taylor_features
from .recurrence import linear_recurrence, recurrence_map, recurrence_step
from .delta_rule import MODES as DELTA_RULE_MODES
from .delta_rule import delta_product, delta_product_map, delta_rule, delta_rule_map, delta_rule_step
from .selective_scan import selective_scan, selective_scan_step
from .inplace import states_in_place
from .stabilizer import max_stabilizer, max_stabilizer_step
from .lse_gate import lse_gate
from .cyclic_clock import clock_atom, clock_phases, cyclic_readout, readout_basis
from .moba import moba_attention, moba_mask, moba_probs
from .nsa import nsa_attention, nsa_probs
from .deltaformer import deltaformer_attention, deltaformer_probs
from .parallax import parallax_attention, parallax_probs
from .wall import wall_attention, wall_probs
from .momentum_delta import MODES as MOMENTUM_DELTA_MODES
from .momentum_delta import momentum_delta_rule, momentum_delta_rule_map
from .ssm import (
    cauchy, diagonal_ssm_conv, discretize, dplr_kernel, hippo_legs, krylov_kernel, nplr_legs, s4d_init, ssm_final_state,
    ssm_free_response, ssm_scan, trapezoidal_map, trapezoidal_recurrence, trapezoidal_recurrence_reference, vandermonde,
    vandermonde_kernel, vandermonde_transpose,
)
from .forgetting import MODES as FORGETTING_MODES
from .forgetting import forgetting_attention, forgetting_decode, forgetting_probs
from .stickbreaking import MODES as STICKBREAKING_MODES
from .stickbreaking import stickbreaking_attention, stickbreaking_probs
from .path import MODES as PATH_MODES
from .path import householder, path_attention, path_probs, path_scores
from .log_linear import MODES as LOG_LINEAR_MODES
from .log_linear import fenwick_levels, hierarchical_mask, levels_needed, log_linear_attention
from .mesa import MODES as MESA_MODES
from .mesa import gram_states, mesa_net, mesa_readout, mesa_solve
from .window_attention import MODES as WINDOW_MODES
from .window_attention import window_softmax, window_softmax_step

__all__ = [
    "linear_recurrence", "recurrence_step", "recurrence_map", "RECURRENCE_MODES",
    "delta_rule", "delta_rule_step", "delta_rule_map", "DELTA_RULE_MODES",
    "fft_conv", "direct_conv", "toeplitz", "causal_conv1d", "causal_conv1d_step",
    "softmax_attention", "attention_probs", "attention_step", "attention_mask", "kv_cache_trim", "ATTENTION_MODES",
    "attention_decode", "alibi_slopes", "KVCache", "repeat_kv", "rotary", "rotary_angles", "rotary_cos_sin", "apply_rotary", "RotaryTable", "rotary_reference", "rope_frequencies", "check_rope_scaling", "ROPE_SCALINGS",
    "FEATURE_MAPS", "apply_feature_map", "taylor_features", "taylor_feature_dim",
    "selective_scan", "selective_scan_step", "states_in_place", "max_stabilizer", "max_stabilizer_step", "lse_gate", "clock_atom", "clock_phases", "cyclic_readout", "readout_basis", "momentum_delta_rule", "momentum_delta_rule_map", "MOMENTUM_DELTA_MODES",
    "moba_attention", "moba_mask", "moba_probs", "nsa_attention", "nsa_probs", "deltaformer_attention", "deltaformer_probs", "parallax_attention", "parallax_probs", "wall_attention", "wall_probs", "discretize", "krylov_kernel", "vandermonde", "vandermonde_transpose", "vandermonde_kernel",
    "cauchy", "dplr_kernel", "hippo_legs", "nplr_legs", "s4d_init", "ssm_scan", "ssm_free_response", "ssm_final_state",
    "diagonal_ssm_conv", "delta_product", "delta_product_map",
    "trapezoidal_recurrence", "trapezoidal_recurrence_reference", "trapezoidal_map",
    "forgetting_attention", "forgetting_probs", "forgetting_decode", "FORGETTING_MODES",
    "stickbreaking_attention", "stickbreaking_probs", "STICKBREAKING_MODES",
    "path_attention", "path_scores", "path_probs", "householder", "PATH_MODES",
    "log_linear_attention", "levels_needed", "fenwick_levels", "hierarchical_mask", "LOG_LINEAR_MODES",
    "mesa_net", "mesa_solve", "gram_states", "mesa_readout", "MESA_MODES",
    "window_softmax", "window_softmax_step", "WINDOW_MODES",
]
