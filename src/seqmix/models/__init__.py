"""seqmix.models: the language-model backbone around any registered mixer.

    from seqmix.models import ModelConfig, build_model
    model = build_model(ModelConfig(mixer="linear_attention", d_model=64, vocab_size=8192, max_seq_len=64))
    logits, targets = model.scored_logits(inputs, labels)   # only where labels != -100
    model.state_size()                                      # floats of recurrent state per sequence
    build_model(ModelConfig(pattern="mamba_swa", pattern_kwargs={"window": 32}, ...))   # named layer patterns
"""

from .patterns import LayerPattern, layer_pattern, list_patterns, register_pattern
from .lm import MLP, Block, LanguageModel, LayerMixer, ModelConfig, SwiGLU
from .build import build_model

__all__ = ["Block", "LanguageModel", "LayerMixer", "MLP", "ModelConfig", "SwiGLU", "build_model",
           "LayerPattern", "layer_pattern", "list_patterns", "register_pattern"]
