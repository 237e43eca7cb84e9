"""seqmix models as HuggingFace transformers models (docs/hf.md).

    SeqmixConfig(PreTrainedConfig)      the whole seqmix ModelConfig, as a dict in ``config.seqmix``
    SeqmixForCausalLM(PreTrainedModel, GenerationMixin)
                                        holds a seqmix LanguageModel as ``.model`` (the same module:
                                        nothing is copied or re-implemented)
    SeqmixCache(transformers Cache)     seqmix's own decoding state (a RaggedState of
                                        seqmix.Cache objects) behind the Cache interface that
                                        generate() passes from step to step

``generate()`` with ``use_cache=True`` runs the same code as ``LanguageModel.generate``: the
first forward call prefills each mixer in its own full-sequence mode through ``seqmix.Cache``,
each later call feeds one token per row through the mixers' step mode (O(1) per token for
recurrent mixers). A left-padded batch (``attention_mask`` with zeros on the left) is split
into groups of equal prompt length (seqmix.models.generation, "Prompts of different
lengths"): no padding token enters a mixer, so every mixer is correct without a padding mask.
Beam search reorders the state with ``Cache.map_(index_select)``; assisted (speculative)
decoding needs to crop a state and is refused (``_is_stateful``).

``from_pretrained`` is seqmix's own loader (``config.json`` + ``model.safetensors``): the model
is built by seqmix on the CPU (not on the meta device, so buffers that mixers compute in
``__init__`` are real), and the state dict must match key for key, or a ValueError lists the
missing and unexpected keys.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pydantic
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache as HFCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..version import __version__
from ..mixers.base import config_error
from ..models import LanguageModel, ModelConfig
from ..models.lm import load_state_checked
from ..models.generation import RaggedState, check_ids, check_positions, extend, prefill, prompt_lengths

WEIGHTS_NAME = "model.safetensors"

# transformers 5.24 renamed the decoding state's keyword and output field from
# ``past_key_values`` (and Mamba's ``cache_params``) to ``cache``; older 5.x releases use the
# old names. seqmix reads every name and writes the one the installed release declares.
CACHE_FIELD = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
OLD_CACHE_NAMES = ("past_key_values", "cache_params")


def resolve_cache_argument(cache, past_key_values, cache_params, where: str):
    """The one decoding state passed under any of its names (``cache``, or the older
    ``past_key_values`` / ``cache_params``); a ValueError when two different ones are given."""
    if past_key_values is None and cache_params is None:  # (the common case: no dict to build)
        return cache
    given = {name: v for name, v in (("cache", cache), ("past_key_values", past_key_values),
                                     ("cache_params", cache_params)) if v is not None}
    if len({id(v) for v in given.values()}) > 1:
        raise ValueError(f"{where}: pass the decoding state once, as argument 'cache' (got {', '.join(given)})")
    return next(iter(given.values()), None)


def output_cache(output):
    """The SeqmixCache of a model output or of ``generate(..., return_dict_in_generate=True)``,
    under the field name of the installed transformers (``cache`` or ``past_key_values``)."""
    for name in ("cache",) + OLD_CACHE_NAMES:
        if name in output:
            return output[name]
    return None


def check_continuation_mask(attention_mask: torch.Tensor | None, cache: "SeqmixCache", T: int, where: str) -> None:
    """Checks the attention mask of a call that continues ``cache`` with T new tokens.

    transformers' generate() passes the mask of the whole sequence, past and new tokens
    ([B, cache.seen_tokens + T]); a caller may also pass the new tokens' mask alone ([B, T]).
    The state already holds each row's past (its left padding was never fed to a mixer), so the
    mask must agree with it: the ones of a row's past columns count the tokens that row has
    read, and every new token is a real one (a recurrent state cannot skip a token)."""
    if attention_mask is None:
        return
    B = cache.state.batch_size
    past = cache.seen_tokens
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2 or attention_mask.shape[0] != B \
            or attention_mask.shape[1] not in (T, past + T):
        shape = list(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"{where}: argument 'attention_mask' must be [{B}, {past + T}] (the cache's {past} tokens and "
                         f"the {T} new ones) or [{B}, {T}] (the new ones) when continuing a cache, got {shape}")
    mask = attention_mask.detach().to("cpu", torch.long)
    if not bool((mask[:, -T:] == 1).all()):
        raise ValueError(f"{where}: argument 'attention_mask' marks some of the {T} new tokens as padding: a seqmix "
                         "cache can only continue with real tokens (pad on the left of the prompt only)")
    if mask.shape[1] == past + T:
        read = mask[:, :past].sum(1)
        have = cache.state.positions
        if not torch.equal(read, have):
            bad = int((read != have).nonzero()[0, 0])
            raise ValueError(f"{where}: argument 'attention_mask' does not match the cache: row {bad} has "
                             f"{int(read[bad])} real past tokens in the mask, the cache has read {int(have[bad])}")



def model_config_from_dict(d: dict, where: str = "SeqmixConfig") -> ModelConfig:
    """A seqmix ModelConfig from its JSON dict, with a ValueError naming unknown mixers or fields."""
    if isinstance(d, ModelConfig):
        return d
    if not isinstance(d, dict):
        raise ValueError(f"{where}: field 'seqmix' must be a dict (seqmix's ModelConfig), got {type(d).__name__}")
    try:
        return ModelConfig(**d)
    except pydantic.ValidationError as e:
        raise ValueError(f"{config_error(where + '.seqmix', e)} (installed seqmix {__version__}: a config written by "
                         f"another version may use mixers or fields this one does not know)") from None
    except ValueError as e:
        raise ValueError(f"{where}.seqmix: {e} (installed seqmix {__version__})") from None


class SeqmixConfig(PreTrainedConfig):
    """A HuggingFace config holding a whole seqmix :class:`~seqmix.models.ModelConfig`.

    ``seqmix``: the ModelConfig as a JSON dict (mixer or pattern, sizes, mixer fields);
    ``vocab_size``, ``hidden_size``, ``num_hidden_layers`` and ``max_position_embeddings``
    mirror it for HF tools (pipelines, lm-eval) and are filled from it.
    """

    model_type = "seqmix"

    seqmix: dict | None = None
    seqmix_version: str | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = True
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        misplaced = sorted(k for k in kwargs if k in ModelConfig.model_fields)
        if misplaced:
            example = ", ".join(f"{k!r}: {kwargs[k]!r}" for k in misplaced)
            raise ValueError(f"SeqmixConfig: {', '.join(repr(k) for k in misplaced)} "
                             f"{'is a field' if len(misplaced) == 1 else 'are fields'} of seqmix's ModelConfig, not of "
                             f"SeqmixConfig: pass the model as SeqmixConfig(seqmix={{{example}, ...}})")
        if self.seqmix is not None:
            cfg = model_config_from_dict(self.seqmix)
            self.seqmix = cfg.model_dump(mode="json")
            self.seqmix_version = self.seqmix_version or __version__
            self.vocab_size = cfg.vocab_size
            self.hidden_size = cfg.d_model
            self.num_hidden_layers = cfg.n_layers
            self.max_position_embeddings = cfg.max_seq_len if cfg.use_positions else None
        super().__post_init__(**kwargs)

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, **kwargs) -> "SeqmixConfig":
        return cls(seqmix=cfg.model_dump(mode="json"), **kwargs)

    @property
    def model_config(self) -> ModelConfig:
        if self.seqmix is None:
            raise ValueError("SeqmixConfig: field 'seqmix' (seqmix's ModelConfig) is not set")
        return model_config_from_dict(self.seqmix)


class SeqmixCache(HFCache):
    """seqmix's decoding state behind transformers' Cache interface.

    ``state``: a :class:`~seqmix.models.generation.RaggedState` (rows grouped by prompt length,
    one ``seqmix.Cache`` per group, with every mixer's own entries: recurrent state, conv
    state, KV cache, B'MOJO's memories). ``get_seq_length`` counts the (padded) tokens the
    calls have fed, as transformers expects.
    """

    is_compileable = False

    def __init__(self, state: RaggedState | None = None, seen_tokens: int = 0):
        super().__init__(layers=[])
        self.state = state
        self.seen_tokens = seen_tokens

    def __repr__(self):
        g = len(self.state.groups) if self.state is not None else 0
        return f"SeqmixCache(seen_tokens={self.seen_tokens}, groups={g})"

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0

    @property
    def is_croppable(self) -> bool:
        return False

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return self.state is not None

    def update(self, *args, **kwargs):
        raise ValueError("SeqmixCache: seqmix layers keep their own state; Cache.update (a key/value cache API) is not used")

    def crop(self, max_length: int) -> None:
        raise ValueError("SeqmixCache cannot be cropped: a recurrent state does not keep the tokens it has read "
                         "(assisted / speculative decoding is not supported for seqmix models)")

    def activate_past_recording(self):
        raise ValueError("SeqmixCache cannot record and roll back past states (assisted decoding is not supported)")

    def reset(self) -> None:
        self.state, self.seen_tokens = None, 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: row j continues row beam_idx[j] (Cache.map_ with index_select)."""
        if self.state is not None:
            self.state.reorder_(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.state is not None:
            self.state.reorder_(torch.arange(self.state.batch_size).repeat_interleave(repeats))

    def floats(self) -> int:
        return self.state.floats() if self.state is not None else 0


class SeqmixPreTrainedModel(PreTrainedModel):
    config_class = SeqmixConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _is_stateful = True  # refuses assisted generation: a state cannot be rolled back
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        """seqmix's LanguageModel initializes itself (dsf note §5.1 scheme); nothing to add."""
        return


class SeqmixForCausalLM(SeqmixPreTrainedModel, GenerationMixin):
    """A causal LM for transformers around seqmix's :class:`~seqmix.models.LanguageModel`.

    ``SeqmixForCausalLM(config)`` builds a fresh one; ``SeqmixForCausalLM.wrap(lm)`` wraps an
    existing LanguageModel (shared, not copied); ``.model`` is the LanguageModel.
    """

    def __init__(self, config: SeqmixConfig, model: LanguageModel | None = None):
        super().__init__(config)
        self.model = model if model is not None else LanguageModel(config.model_config)
        self.post_init()

    @classmethod
    def wrap(cls, model: LanguageModel, **config_kwargs) -> "SeqmixForCausalLM":
        """Wraps an existing LanguageModel (its parameters are shared, not copied)."""
        if not isinstance(model, LanguageModel):
            raise ValueError(f"SeqmixForCausalLM.wrap: argument 'model' must be a seqmix LanguageModel, got {type(model).__name__}")
        return cls(SeqmixConfig.from_model_config(model.config, **config_kwargs), model=model)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own SeqmixCache on the first call

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return None  # the head is tied to the embedding functionally (LanguageModel.head)

    # -- forward -------------------------------------------------------------------------

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                cache: SeqmixCache | None = None, use_cache: bool | None = None,
                labels: torch.LongTensor | None = None, inputs_embeds: torch.Tensor | None = None,
                logits_to_keep: int = 0, return_dict: bool | None = None,
                past_key_values: SeqmixCache | None = None, **kwargs) -> CausalLMOutputWithPast:
        """input_ids [B, T] -> logits [B, T, vocab] (the last ``logits_to_keep`` positions when > 0).

        attention_mask: left padding only (1 = token); padded positions get logits 0 and no loss.
        On a call that continues a cache it may cover the past and the new tokens ([B, past + T],
        transformers' convention in generate()) or the new tokens only ([B, T]); either way it is
        checked against the cache (each row's past ones = the tokens that row has read, the new
        tokens all ones), since a seqmix state cannot skip a token it has not read.
        cache: a SeqmixCache from an earlier call (then input_ids are the new tokens); its older
        names ``past_key_values`` and ``cache_params`` (transformers < 5.24) are accepted too.
        use_cache: return one. labels: [B, T], the loss is next-token cross entropy (-100 ignored).
        ``position_ids`` are not needed (each row's positions start at its first real token).
        """
        where = "SeqmixForCausalLM.forward"
        cache = resolve_cache_argument(cache, past_key_values, kwargs.pop("cache_params", None), where)
        if inputs_embeds is not None:
            raise ValueError(f"{where}: argument 'inputs_embeds' is not supported: pass 'input_ids'")
        if input_ids is None:
            raise ValueError(f"{where}: argument 'input_ids' is required")
        check_ids(self.model, input_ids, where)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        last_only = logits_to_keep == 1
        if cache is not None and not isinstance(cache, SeqmixCache):
            if isinstance(cache, HFCache) and cache.get_seq_length() == 0:
                cache = None  # an empty cache transformers made for us: use ours
            else:
                raise ValueError(f"{where}: argument 'cache' must be a SeqmixCache returned by this model, "
                                 f"got {type(cache).__name__}")
        B, T = input_ids.shape
        if cache is not None and cache.state is not None:
            if cache.state.batch_size != B:
                raise ValueError(f"{where}: 'input_ids' has {B} rows, the cache holds {cache.state.batch_size}")
            check_continuation_mask(attention_mask, cache, T, where)
            check_positions(self.model, cache.state.max_pos() + T, where, "input_ids")
            logits = extend(self.model, input_ids, cache.state, last_only=last_only)
            cache.seen_tokens += T
        else:
            try:
                lengths = prompt_lengths(input_ids, attention_mask, where)
            except ValueError as e:
                raise ValueError(f"{e} (when no attention_mask is passed, generate() builds one from the positions of "
                                 "pad_token_id in input_ids: pass attention_mask explicitly if pad_token_id is a real "
                                 "token of the prompt)") from None
            check_positions(self.model, int(lengths.max()), where, "input_ids")
            if use_cache or bool((lengths < T).any()):
                logits, state = prefill(self.model, input_ids, lengths, last_only=last_only)
                if use_cache:
                    cache = cache if cache is not None else SeqmixCache()
                    cache.state, cache.seen_tokens = state, T
            else:
                h = self.model.hidden(input_ids)
                logits = self.model.head(h[:, -1:] if last_only else h)
        if logits_to_keep and not last_only:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape or logits.shape[1] != T:
                raise ValueError(f"{where}: argument 'labels' must have the shape of 'input_ids' {[B, T]} "
                                 f"(with logits_to_keep = 0), got {list(labels.shape)}")
            labels = labels.to(logits.device)
            if attention_mask is not None:
                labels = labels.masked_fill(attention_mask.to(labels.device) == 0, -100)
            lg = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
            loss = F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache if use_cache else None})

    # -- loading -------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config: SeqmixConfig | None = None,
                        dtype: Any = None, torch_dtype: Any = None, device_map: Any = None, **kwargs):
        """Loads ``config.json`` and ``model.safetensors`` from a folder (or a hub id, through
        transformers' file resolution). dtype: a torch dtype, its name, or "auto" (the saved
        dtype; default float32). The state dict must match the model key for key."""
        from safetensors.torch import load_file
        from transformers.utils import cached_file

        where = "SeqmixForCausalLM.from_pretrained"
        hub = {k: kwargs[k] for k in ("cache_dir", "force_download", "local_files_only", "token", "revision",
                                      "subfolder") if k in kwargs}
        path = os.fspath(pretrained_model_name_or_path)
        if config is None:
            config = SeqmixConfig.from_pretrained(path, **hub)
        elif not isinstance(config, SeqmixConfig):
            raise ValueError(f"{where}: argument 'config' must be a SeqmixConfig, got {type(config).__name__}")
        try:
            weights = cached_file(path, WEIGHTS_NAME, **hub)
        except OSError as e:
            raise ValueError(f"{where}: no {WEIGHTS_NAME} in {path!r} ({e})") from None
        state = load_file(weights)
        model = cls(config)
        load_state_checked(model, state, f"{where}({path!r}: {WEIGHTS_NAME})")
        dtype = dtype if dtype is not None else torch_dtype
        if dtype == "auto":
            dtype = next((t.dtype for t in state.values() if t.is_floating_point()), None)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if dtype is not None:
            model = model.to(dtype)
        if isinstance(device_map, (str, torch.device)) and str(device_map) != "auto":
            model = model.to(device_map)
        model.eval()
        return model


def register() -> None:
    """Registers SeqmixConfig and SeqmixForCausalLM with AutoConfig / AutoModelForCausalLM
    under the model type "seqmix" (done on ``import seqmix.hf``)."""
    try:
        AutoConfig.register("seqmix", SeqmixConfig)
    except ValueError:  # already registered
        pass
    try:
        AutoModelForCausalLM.register(SeqmixConfig, SeqmixForCausalLM)
    except ValueError:
        pass


register()

__all__ = ["CACHE_FIELD", "SeqmixCache", "SeqmixConfig", "SeqmixForCausalLM", "SeqmixPreTrainedModel", "model_config_from_dict",
           "output_cache", "register"]
