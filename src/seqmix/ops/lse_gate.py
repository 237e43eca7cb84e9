"""The log-sum-exp gate: a key and a decay from one running normalizer (LightNet; ABC's slots).

Given logits κ_t (one per channel: a key channel, a memory slot), the running log-sum-exp

    z_t = log Σ_{s<=t} exp(κ_s)                     (z_{-1} = −∞, or carried from a state)

sets both the write weight and the decay of a linear recurrence S_t = α_t S_{t-1} + w_t ⊗ x_t:

    w_t = exp(κ_t − z_t),      log α_t = z_{t-1} − z_t  (<= 0; 0 at t = 0 from an empty state)

so S_t = Σ_{s<=t} exp(κ_s − z_t) x_s = Σ_s softmax_{s<=t}(κ)_s x_s: per channel, a softmax over the
whole prefix, updated in O(1) per token. LightNet (Qin et al. 2024, "You Only Scan Once") uses it on
the key channels of a gated linear attention; ABC (Peng et al. 2022, "ABC: Attention with Bounded-
memory Control") on the memory slots (flash-linear-attention's ``fused_additive_gate`` is the same
map). Shapes: logits [B, T, ...]; z0 [B, ...]. Computed in float32 or wider.
"""

from __future__ import annotations

import torch

from .._checks import check_tensor
from .precision import upcast


def lse_gate(logits: torch.Tensor, z0: torch.Tensor | None = None):
    """(w [B, T, ...], log α [B, T, ...], z_T [B, ...]) from the logits κ [B, T, ...] and the running
    log-sum-exp z0 [B, ...] before them (None: an empty state), as the module docstring."""
    check_tensor("logits", logits, where="lse_gate")
    if logits.dim() < 2 or logits.shape[1] == 0:
        raise ValueError(f"lse_gate: argument 'logits' must be [B, T, ...] with T >= 1, got shape {tuple(logits.shape)}")
    kappa = upcast(logits)
    z = torch.logcumsumexp(kappa, dim=1)
    if z0 is None:  # z_{-1} = −∞: α_0 = 1 (it multiplies the empty state)
        z_prev = torch.cat([z[:, :1], z[:, :-1]], dim=1)
    else:
        if tuple(z0.shape) != (logits.shape[0], *logits.shape[2:]):
            raise ValueError(f"lse_gate: argument 'z0' must have shape {(logits.shape[0], *logits.shape[2:])}, got {tuple(z0.shape)}")
        z0 = z0.unsqueeze(1).to(z.dtype)
        z = torch.logaddexp(z, z0)
        z_prev = torch.cat([z0, z[:, :-1]], dim=1)
    return torch.exp(kappa - z), z_prev - z, z[:, -1]


__all__ = ["lse_gate"]
