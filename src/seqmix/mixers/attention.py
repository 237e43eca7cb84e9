"""The attention family in the DSF (DSF paper §2.1, §3.2; Appendix B, G).

Linear attention (Katharopoulos et al. 2020; DSF paper eq. 16) is the exemplar of
the Mixer contract: the parametrization, one call into ``linear_recurrence``, the
readout. Per head h, with φ = ψ = elu + 1:

    y_i = Σ_{j<=i} φ(q_i)ᵀ φ(k_j) / η_i · v_j,      η_i = φ(q_i)ᵀ Σ_{j<=i} φ(k_j)        (16, A4 fixed)

The normalizer η_i is computed by the same recurrence as the numerator: the values
get one extra channel of ones, so the state is [K, V + 1] and its last column is
z_i = Σ_{j<=i} φ(k_j) (no second loop over time).

DSF form (eq. 15, with the corrected 15b of Appendix B):

    Λ_i = (η_{i-1}/η_i) I,   B_i = (1/η_i) I_V ⊗ φ(k_i),   C_i = I_V ⊗ φ(q_i)ᵀ,   D_i = 0

Parametrization of the DSF paper's experiments (dsf note §5.1): one projection
W_qk: d -> 2n (n = the state expansion = the total width of q and k over heads),
W_v: d -> d and an output projection W_o: d -> d.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..dsf import DSF
from ..ops import linear_recurrence, recurrence_map
from .base import MixerConfig, Mixer, MixOut, register


class LinearAttentionConfig(MixerConfig):
    n: int | None = Field(None, gt=0, description="state expansion: width of φ(q) and φ(k) over all heads (default d_model)")
    heads: int = Field(1, gt=0, description="number of heads; each has its own normalizer η")
    chunk_size: int = Field(64, gt=0, description="chunk length of the chunk mode")
    bias: bool = Field(False, description="biases in the projections")

    @model_validator(mode="after")
    def _sizes(self):
        n = self.n or self.d_model
        if n % self.heads:
            raise ValueError(f"n = {n} must be divisible by heads = {self.heads}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model = {self.d_model} must be divisible by heads = {self.heads}")
        return self


@register("linear_attention", description="Linear attention (Katharopoulos et al.), φ = elu+1, DSF eq. 16")
class LinearAttention(Mixer):
    """Multi-head linear attention with its normalizer, DSF paper eq. (16).

    Maps of phi(x): one per head, [B, heads, T, T], rows summing to 1.
    State per sequence: S ∈ R^{K × (V+1)} per head (numerator and normalizer):
    n·(d_model/heads + 1) floats.
    """

    family = "attention"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "n·(d_model/heads + 1)"
    map_unit = "head"
    Config = LinearAttentionConfig

    def __init__(self, config: LinearAttentionConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.n = c.n or c.d_model
        self.heads = c.heads
        self.W_qk = nn.Linear(c.d_model, 2 * self.n, bias=c.bias)
        self.W_v = nn.Linear(c.d_model, c.d_model, bias=c.bias)
        self.W_o = nn.Linear(c.d_model, c.d_model, bias=c.bias)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 8}

    # -- parametrization -------------------------------------------------------------------

    @staticmethod
    def feature_map(x: torch.Tensor) -> torch.Tensor:
        """φ(x) = elu(x) + 1 (positive, so η > 0)."""
        return F.elu(x) + 1

    def _qkv(self, x):
        """q, k: [B, T, H, n/H] (features applied); v: [B, T, H, d/H]."""
        B, T, _ = x.shape
        q, k = self.W_qk(x).chunk(2, dim=-1)
        q = self.feature_map(q).view(B, T, self.heads, -1)
        k = self.feature_map(k).view(B, T, self.heads, -1)
        v = self.W_v(x).view(B, T, self.heads, -1)
        return q, k, v

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        q, k, v = self._qkv(x)
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # last channel accumulates z_i = Σ φ(k_j)
        o1, S = linear_recurrence(
            q, k, v1,
            initial_state=state["S"] if state else None,
            output_final_state=need_state,
            mode=mode,
            chunk_size=self.config.chunk_size,
            check_values=False,
        )
        o = o1[..., :-1] / o1[..., -1:]  # numerator / η_i
        y = self.W_o(o.flatten(2))
        return MixOut(y, {"S": S} if need_state else None, values=v, mixed=o)

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, heads, T, T]: Φ[i, j] = φ(q_i)ᵀφ(k_j) / η_i for j <= i."""
        self.check_input(x)
        q, k, _ = self._qkv(x)
        A = recurrence_map(q, k, check_values=False)
        return A / A.sum(-1, keepdim=True)

    def dsf(self, x, *, projections: bool = False):
        """DSF eq. (15) with the corrected (15b). Input: the values v ([B, T, d_model], heads
        concatenated); output: the normalized head outputs before W_o. With
        ``projections=True`` the input is x and the output y (W_v and W_o absorbed)."""
        self.check_input(x)
        q, k, _ = self._qkv(x)
        eta = (q * k.cumsum(1)).sum(-1)  # η_i = φ(q_i)ᵀ Σ_{j<=i} φ(k_j)   [B, T, H]
        system = DSF.from_separable(q, k, eta, value_dim=self.d_model // self.heads)
        if projections:
            if self.config.bias:
                raise ValueError(f"{type(self).__name__}.dsf: projections=True needs bias=False (a bias is not linear)")
            system = system.compose(in_proj=self.W_v.weight, out_proj=self.W_o.weight)
        return system

    def state_size(self, seq_len: int | None = None) -> int:
        return self.n * (self.d_model // self.heads + 1)
