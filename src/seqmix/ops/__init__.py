"""Pure tensor functions (no parameters): every mode of an op beside its reference."""

from .recurrence import MODES as RECURRENCE_MODES
from .attention import MODES as ATTENTION_MODES
from .attention import (
    KVCache, attention_decode, attention_mask, attention_probs, attention_step, kv_cache_trim, repeat_kv, softmax_attention,
)
from .rotary import rotary, rotary_angles, rotary_reference
from .conv import causal_conv1d, causal_conv1d_step, direct_conv, fft_conv, toeplitz
from .features import FEATURE_MAPS, apply_feature_map, taylor_feature_dim, taylor_features
from .recurrence import linear_recurrence, recurrence_map, recurrence_step
from .delta_rule import MODES as DELTA_RULE_MODES
from .delta_rule import delta_rule, delta_rule_map, delta_rule_step
from .selective_scan import selective_scan
from .stabilizer import max_stabilizer
from .ssm import (
    cauchy, diagonal_ssm_conv, discretize, dplr_kernel, hippo_legs, krylov_kernel, nplr_legs, s4d_init, ssm_final_state,
    ssm_free_response, ssm_scan, vandermonde, vandermonde_kernel, vandermonde_transpose,
)

__all__ = [
    "linear_recurrence", "recurrence_step", "recurrence_map", "RECURRENCE_MODES",
    "delta_rule", "delta_rule_step", "delta_rule_map", "DELTA_RULE_MODES",
    "fft_conv", "direct_conv", "toeplitz", "causal_conv1d", "causal_conv1d_step",
    "softmax_attention", "attention_probs", "attention_step", "attention_mask", "kv_cache_trim", "ATTENTION_MODES",
    "attention_decode", "KVCache", "repeat_kv", "rotary", "rotary_angles", "rotary_reference",
    "FEATURE_MAPS", "apply_feature_map", "taylor_features", "taylor_feature_dim",
    "selective_scan", "max_stabilizer", "discretize", "krylov_kernel", "vandermonde", "vandermonde_transpose", "vandermonde_kernel",
    "cauchy", "dplr_kernel", "hippo_legs", "nplr_legs", "s4d_init", "ssm_scan", "ssm_free_response", "ssm_final_state",
    "diagonal_ssm_conv",
]
