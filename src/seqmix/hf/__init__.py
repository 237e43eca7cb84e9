"""seqmix.hf: seqmix models in the HuggingFace ecosystem (optional extra: ``pip install seqmix[hf]``).

    import seqmix.hf                          # registers model type "seqmix" with the Auto classes
    from transformers import AutoModelForCausalLM
    hf = seqmix.hf.SeqmixForCausalLM.wrap(lm)  # an existing LanguageModel, shared not copied
    hf.save_pretrained("out"); AutoModelForCausalLM.from_pretrained("out").generate(ids, max_new_tokens=20)
    seqmix.hf.export_hf(run_dir, "out")       # a trained run folder -> a HuggingFace folder (`seqmix lm export --hf`)

See docs/hf.md. An adapter at the top of the library: nothing in seqmix imports it.
"""

try:
    import transformers  # noqa: F401
    import safetensors  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"seqmix.hf needs the optional extra 'hf' (transformers, safetensors): pip install 'seqmix[hf]' ({e})") from None

from .modeling import (CACHE_FIELD, SeqmixCache, SeqmixConfig, SeqmixForCausalLM, SeqmixPreTrainedModel, model_config_from_dict, output_cache,
                       register)
from .export import export_hf

__all__ = ["export_hf", "CACHE_FIELD", "SeqmixCache", "SeqmixConfig", "SeqmixForCausalLM", "SeqmixPreTrainedModel", "model_config_from_dict", "output_cache",
           "register"]
