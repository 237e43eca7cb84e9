"""The language-model backbone of the DSF / Zoology MQAR experiments (dsf note §5.1,
peer-zoology note §1.5), with any registered mixer in it by name.

    embed (+ learned absolute positions) -> dropout
    N × [ h = h + mixer(norm(h));  h = h + channel(norm(h)) ]      (pre-norm residual blocks)
    final norm -> head tied to the embedding

* positions: ``"auto"`` = learned absolute positions for the attention, recurrent and
  linear-attention families, none for SSMs, convolutions and hybrids (the DSF paper:
  "positional embeddings for attention and RNN models, none for SSMs"; B'MOJO: none);
  ``"rope"``: no position table; every layer whose mixer has a ``rope`` option
  (softmax_attention) gets ``rope=True`` (unless its mixer_kwargs set it), RoPE on q and k;
* channel mixer: ``"mlp"`` (d -> r·d -> d, GELU), ``"swiglu"`` (hidden 2/3·r·d rounded up
  to a multiple of 8) or ``"none"`` (the released DSF configs, peer-zoology note §2.1);
* init (dsf note §5.1, GPT-2's scheme): every ``nn.Linear`` weight and every embedding
  N(0, 0.02), Linear biases 0; the residual output projections (the channel mixer's
  second layer and the mixer's output projection) N(0, 0.02/sqrt(2·n_layers)).
  ``mixer_init`` says what happens inside mixers (module docstring of :class:`LanguageModel`).
* logits only where labels exist: :meth:`LanguageModel.scored_logits` gathers the
  labelled positions before the vocabulary-sized head (MQAR scores N of L positions).
* side information between layers: each forward pass (each call of :meth:`LanguageModel.hidden`:
  a whole sequence, a prefill or one decoding step) makes one empty dict and hands it to every
  block's mixer in order (``Mixer.forward``'s ``context``): RWKV-7's value residual writes the first
  layer's values there and later layers read them. It holds this pass's tokens only, never the cache.

Conventions a mixer may use (docs/harness.md, "For mixer developers"):
``out_proj_names`` (class attribute, default ("W_o", "out_proj", "W_out", "o_proj")):
the output projection(s) rescaled as residual projections; ``no_reinit`` (class attribute:
parameter names) or a tensor attribute ``_no_reinit = True``: parameters the backbone init
leaves alone (Mamba's dt bias, A_log); ``no_weight_decay`` / ``_no_weight_decay``: see
:mod:`seqmix.train.optim`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from torch import nn

from ..mixers import build_mixer, mixer_entry
from ..mixers.layers import RMSNorm
from .heads import ClassifierConfig

DEFAULT_OUT_PROJ = ("W_o", "out_proj", "W_out", "o_proj")
#: families that get learned absolute positions when positions = "auto"
POSITION_FAMILIES = ("attention", "recurrent", "linear_attention")


class LayerMixer(BaseModel):
    """One entry of a hybrid's cycle of mixers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mixer: str = Field(description="registered mixer name")
    mixer_kwargs: dict[str, Any] = Field(default_factory=dict, description="its config fields besides d_model")


def _check_mixer(name: str, kwargs: dict, d_model: int, where: str) -> None:
    if "d_model" in kwargs:
        raise ValueError(f"{where}: d_model is set by the model's d_model field")
    try:
        mixer_entry(name).config(d_model=d_model, **kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _has_rope(name: str) -> bool:
    return "rope" in mixer_entry(name).cls.Config.model_fields


class ModelConfig(BaseModel):
    """The backbone around one registered mixer (or a cycle of them: ``hybrid``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mixer: str = Field(description="registered mixer name (seqmix list)")
    mixer_kwargs: dict[str, Any] = Field(default_factory=dict, description="config fields of the mixer besides d_model")
    d_model: int = Field(64, gt=0, description="width d")
    n_layers: int = Field(2, gt=0, description="number of blocks")
    vocab_size: int | None = Field(None, gt=1, description="vocabulary (default: the data's)")
    max_seq_len: int | None = Field(None, gt=0, description="length of the position table (default: the data's)")
    positions: Literal["auto", "learned", "none", "rope"] = Field(
        "auto", description="learned absolute positions; auto = by mixer family; rope = no table, RoPE in the mixers with a 'rope' option")
    channel_mixer: Literal["mlp", "swiglu", "none"] = Field("mlp", description="the per-token MLP of each block")
    mlp_ratio: float = Field(4.0, gt=0, description="hidden width of the channel mixer / d_model")
    norm: Literal["layernorm", "rmsnorm"] = Field("layernorm", description="the block and final norms")
    embed_dropout: float = Field(0.0, ge=0, lt=1, description="dropout after the embedding")
    resid_dropout: float = Field(0.0, ge=0, lt=1, description="dropout on each residual branch")
    init_std: float = Field(0.02, gt=0, description="std of the N(0, std) init")
    hybrid: list[LayerMixer] = Field(
        default_factory=list, description="layer i uses hybrid[i % len(hybrid)] instead of mixer "
        "(Zoology's Hybrid; e.g. Mamba interleaved with sliding-window attention)")
    pattern: str | None = Field(
        None, description="a registered layer pattern (seqmix.models.patterns: mamba_swa, mamba_only, attention_only, "
        "bmojo, bmojo_f): the cycle of layer mixers, as hybrid does; mixer defaults to its first layer's mixer")
    pattern_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the pattern (window, ...)")
    mixer_init: Literal["dsf", "dsf_all", "own"] = Field(
        "dsf", description="dsf: backbone init of the mixers' Linear layers except no_reinit ones; "
        "dsf_all: all of them (the released DSF code); own: keep the mixers' own init")

    classifier: ClassifierConfig | None = Field(
        None, description="a sequence-classification head instead of the LM head (LRA; seqmix.models.classifier)")

    _cycle: list[LayerMixer] = PrivateAttr(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _pattern_mixer(cls, data):
        """With a pattern, ``mixer`` defaults to the pattern's first layer's mixer."""
        if isinstance(data, dict) and isinstance(data.get("pattern"), str) and "mixer" not in data:
            from .patterns import layer_pattern

            data = {**data, "mixer": layer_pattern(data["pattern"])[0]["mixer"]}  # names an unknown pattern
        return data

    @field_validator("mixer")
    @classmethod
    def _registered(cls, v):
        mixer_entry(v)  # ValueError listing the registered names
        return v

    @model_validator(mode="after")
    def _mixer_config(self):
        if self.pattern is None:
            if self.pattern_kwargs:
                raise ValueError("'pattern_kwargs' is set without a 'pattern'")
            if self.hybrid and self.mixer_kwargs:
                raise ValueError("'mixer_kwargs' is not used with 'hybrid' (each layer takes its entry's mixer_kwargs)")
            _check_mixer(self.mixer, self.mixer_kwargs, self.d_model, "mixer_kwargs")
            cycle = list(self.hybrid)
            for i, h in enumerate(cycle):
                _check_mixer(h.mixer, h.mixer_kwargs, self.d_model, f"hybrid.{i}")
        else:
            from .patterns import layer_pattern

            if self.hybrid:
                raise ValueError("set either 'pattern' or 'hybrid', not both")
            if self.mixer_kwargs:
                raise ValueError(f"'mixer_kwargs' is not used with a 'pattern': give the layers' config fields in 'pattern_kwargs'")
            try:
                cycle = [LayerMixer(**c) for c in layer_pattern(self.pattern, **self.pattern_kwargs)]
            except ValueError as e:
                raise ValueError(f"pattern / pattern_kwargs: {e}") from None
            if self.mixer != cycle[0].mixer:
                raise ValueError(f"'mixer' = {self.mixer!r} is not the first layer's mixer {cycle[0].mixer!r} of pattern "
                                 f"{self.pattern!r}: leave 'mixer' out")
            for i, h in enumerate(cycle):
                _check_mixer(h.mixer, h.mixer_kwargs, self.d_model, f"pattern_kwargs (layer {i} of {self.pattern!r}: {h.mixer})")
        self._cycle = cycle
        if self.positions == "rope":
            names = sorted({h.mixer for h in cycle} or {self.mixer})
            if not any(_has_rope(n) for n in names):
                raise ValueError(f"positions = 'rope' needs a mixer with a 'rope' option (softmax_attention), got {names}")
            for i in range(len(cycle) or 1):
                _check_mixer(*self.layer_mixer(i), self.d_model, "positions = 'rope'")
        return self

    @property
    def layers(self) -> list[LayerMixer]:
        """The cycle of layer mixers: the pattern's expansion, the hybrid list, or [] (every
        layer is ``mixer``)."""
        return list(self._cycle)

    def layer_mixer(self, i: int) -> tuple[str, dict]:
        """(name, kwargs) of layer i's mixer (with positions = "rope": rope=True where the mixer has it)."""
        if self._cycle:
            h = self._cycle[i % len(self._cycle)]
            name, kwargs = h.mixer, h.mixer_kwargs
        else:
            name, kwargs = self.mixer, self.mixer_kwargs
        if self.positions == "rope" and _has_rope(name) and "rope" not in kwargs:
            kwargs = {**kwargs, "rope": True}
        return name, kwargs

    @property
    def family(self) -> str:
        return mixer_entry(self.mixer).family

    @property
    def use_positions(self) -> bool:
        return self.positions == "learned" or (self.positions == "auto" and self.family in POSITION_FAMILIES)


class MLP(nn.Module):
    """The channel mixer "mlp": Linear(d, ratio·d), GELU, Linear(ratio·d, d)."""

    def __init__(self, d: int, ratio: float):
        super().__init__()
        h = int(round(ratio * d))
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    """The channel mixer "swiglu": fc2(SiLU(a) ⊙ b) with [a; b] = fc1(x), no biases; hidden width
    2/3 · ratio · d rounded up to a multiple of 8 (about the parameters of an MLP of that ratio)."""

    def __init__(self, d: int, ratio: float):
        super().__init__()
        h = 8 * math.ceil(2 * ratio * d / 3 / 8)
        self.fc1 = nn.Linear(d, 2 * h, bias=False)
        self.fc2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        a, b = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(a) * b)


def _norm(kind: str, d: int) -> nn.Module:
    return nn.LayerNorm(d) if kind == "layernorm" else RMSNorm(d, eps=1e-5)


class Block(nn.Module):
    """Pre-norm residual block: h + mixer(norm(h)), then h + channel(norm(h))."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.norm1 = _norm(cfg.norm, cfg.d_model)
        name, kwargs = cfg.layer_mixer(layer_idx)
        self.mixer = build_mixer(name, d_model=cfg.d_model, **kwargs)
        if cfg.channel_mixer == "none":
            self.norm2, self.channel = None, None
        else:
            self.norm2 = _norm(cfg.norm, cfg.d_model)
            self.channel = (MLP if cfg.channel_mixer == "mlp" else SwiGLU)(cfg.d_model, cfg.mlp_ratio)
        self.drop = nn.Dropout(cfg.resid_dropout)

    def forward(self, h, cache=None, context=None):
        """h [B, T, d]; cache: the decoding state; context: the forward pass's dict of side
        information between layers (``Mixer.forward``), shared by every block of one pass."""
        h = h + self.drop(self.mixer(self.norm1(h), cache=cache, context=context))
        if self.channel is not None:
            h = h + self.drop(self.channel(self.norm2(h)))
        return h


class LanguageModel(nn.Module):
    """Token LM around a registered mixer (module docstring).

    ``mixer_init``: "dsf" re-initializes every ``nn.Linear`` inside the mixers with the
    backbone's N(0, 0.02) / zero bias except parameters a mixer marks ``_no_reinit`` or lists
    in ``no_reinit`` (a documented deviation from the released DSF code, which zeroes even
    Mamba's dt bias: dsf note §5.1); "dsf_all" follows the released code exactly; "own"
    keeps every mixer parameter as the mixer initialized it.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("LanguageModel: config field 'vocab_size' must be set (RunConfig fills it from the data)")
        if config.use_positions and config.max_seq_len is None:
            raise ValueError("LanguageModel: config field 'max_seq_len' must be set when positions are used")
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self.pos = nn.Embedding(config.max_seq_len, d) if config.use_positions else None
        self.drop = nn.Dropout(config.embed_dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm_f = _norm(config.norm, d)
        self._init_weights()

    # -- init --------------------------------------------------------------------------

    def _init_weights(self):
        c = self.config
        std, std_res = c.init_std, c.init_std / math.sqrt(2 * c.n_layers)
        nn.init.normal_(self.embed.weight, std=std)
        if self.pos is not None:
            nn.init.normal_(self.pos.weight, std=std)
        for block in self.blocks:
            if block.channel is not None:
                for m in block.channel.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.normal_(m.weight, std=std)
                        if m.bias is not None:
                            nn.init.zeros_(m.bias)
                nn.init.normal_(block.channel.fc2.weight, std=std_res)
            mixer = block.mixer
            if c.mixer_init == "own":
                continue
            keep = set(getattr(mixer, "no_reinit", ()))
            for mname, m in mixer.named_modules():
                if not isinstance(m, nn.Linear):
                    continue
                for pname, p in m.named_parameters(recurse=False):
                    full = f"{mname}.{pname}" if mname else pname
                    if c.mixer_init == "dsf" and (getattr(p, "_no_reinit", False) or full in keep or mname in keep):
                        continue
                    if pname == "weight":
                        nn.init.normal_(p, std=std)
                    else:
                        nn.init.zeros_(p)
            for name in getattr(mixer, "out_proj_names", DEFAULT_OUT_PROJ):
                m = getattr(mixer, name, None)
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=std_res)

    # -- forward -----------------------------------------------------------------------

    def hidden(self, input_ids: torch.Tensor, cache=None, start: int = 0) -> torch.Tensor:
        """[B, T] token ids -> [B, T, d] final hidden states (after the final norm)."""
        if input_ids.dim() != 2:
            raise ValueError(f"LanguageModel: argument 'input_ids' must be [batch, time], got shape {list(input_ids.shape)}")
        T = input_ids.shape[1]
        h = self.embed(input_ids)
        if self.pos is not None:
            if start + T > self.pos.num_embeddings:
                raise ValueError(f"LanguageModel: sequence of {start + T} tokens exceeds max_seq_len = {self.pos.num_embeddings}")
            h = h + self.pos.weight[start:start + T]
        h = self.drop(h)
        context: dict = {}  # one per pass: what a layer hands to the later ones (RWKV-7's v_first), never cached
        for block in self.blocks:
            h = block(h, cache=cache, context=context)
        return self.norm_f(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.embed.weight)  # tied to the embedding

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] at every position."""
        return self.head(self.hidden(input_ids))

    def scored_logits(self, input_ids: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100):
        """(logits [M, vocab], targets [M]) at the M labelled positions only."""
        if labels.shape != input_ids.shape:
            raise ValueError(f"LanguageModel: 'labels' {list(labels.shape)} must have the shape of 'input_ids' {list(input_ids.shape)}")
        h = self.hidden(input_ids)
        mask = labels != ignore_index
        return self.head(h[mask]), labels[mask]

    # -- generation --------------------------------------------------------------------

    def generate(self, input_ids, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None, **kwargs) -> torch.Tensor:
        """Prefill in each mixer's parallel mode, then decode step by step through the Cache
        (temperature 0 = greedy). [B, T] (or a list of prompts) -> [B, T + new]. See
        :func:`seqmix.models.generation.generate` for every argument (attention_mask,
        eos_token_id, use_cache, callback) and the rule for prompts of different lengths."""
        from .generation import generate

        return generate(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        seed=seed, **kwargs)

    # -- sizes -------------------------------------------------------------------------

    def state_size(self, seq_len: int | None = None) -> int:
        """Floats of recurrent state per sequence, summed over the mixers (the memory axis of
        the B'MOJO and MetaLA plots); ``seq_len`` defaults to max_seq_len (KV caches grow with it)."""
        L = seq_len if seq_len is not None else self.config.max_seq_len
        return int(sum(b.mixer.state_size(L) for b in self.blocks))

    def num_params(self, *, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            n -= self.embed.weight.numel() + (self.pos.weight.numel() if self.pos is not None else 0)
        return n


def load_state_checked(model: nn.Module, state: dict, where: str) -> None:
    """``model.load_state_dict(state)`` with a ValueError that names the missing and unexpected
    keys and the mismatched shapes (a checkpoint from another config or seqmix version)."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        more = lambda ks: f"{ks[:8]}{' and %d more' % (len(ks) - 8) if len(ks) > 8 else ''}"  # noqa: E731
        raise ValueError(f"{where}: the state dict does not match the model built from its config: "
                         f"missing keys {more(missing)}, unexpected keys {more(unexpected)}")
    bad = [k for k in own if tuple(own[k].shape) != tuple(state[k].shape)]
    if bad:
        raise ValueError(f"{where}: shape mismatch: " + ", ".join(
            f"{k} {list(state[k].shape)} in the file, {list(own[k].shape)} in the model" for k in bad[:8]))
    model.load_state_dict(state, strict=True)

