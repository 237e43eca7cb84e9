"""Real models in: transformers' families converted to seqmix mixers, exactly (docs/interop.md).

    from seqmix.interop import from_transformers, load_converted, seqmix_mixers

    model = MambaForCausalLM.from_pretrained(path)     # or any supported family
    conv = from_transformers(model)                    # same class; every mixer is a seqmix mixer
    conv.generate(ids, max_new_tokens=20)              # decodes through the mixers' step mode
    conv.save_pretrained("out"); load_converted("out")  # model type "seqmix_converted": read back exactly
    seqmix_mixers(conv)["backbone.layers.0.mixer"].phi(x)   # the DSF view of a real layer

One mechanism for every family: ``InteropMixer`` (adapter.py), a module with the transformers
module's call signature and cache handling that holds a seqmix mixer, and per family a
``Family`` entry of tables (table.py, the families/ package) read by one converter (convert.py).

How to add a family (e.g. RWKV-4, RecurrentGemma, Llama attention):

1. Make the seqmix mixer able to compute what the transformers module computes. What it lacks
   (a norm, a bias, a clamp, RoPE, grouped KV heads) becomes an option of the existing mixer's
   config, documented in its docstring and tested by the mode contract (a registered preset
   gets the whole contract suite: see ``falcon_mamba`` in mixers/ssm.py) — never a copy of it.
2. In the group's module of families/ (recurrent, transformers, hybrids) write the adapter config, ``config(hf_config, module) -> dict`` of the
   mixer's config fields, raising ``Unsupported(option, value, why)`` for every option it
   cannot express; the weight table (``Weight(hf_name, seqmix_name, transform)`` rows covering
   every parameter and persistent buffer of the module, transforms from table.py); and the
   state table (``State(seqmix_key, "conv" | "recurrent", index, to_seqmix, to_hf)``: where
   transformers' cache object keeps each entry of the mixer's state, and the layout changes).
3. Add ``Family(model_type, (ModuleMap(module_class_path, mixer_name, config, weights, state,
   dsf=...),), slots=regex_of_mixer_paths)`` to ``FAMILIES``. A hybrid family lists several
   ModuleMaps (one per mixer class); a family whose mixers sit elsewhere than
   ``layers.N.mixer`` sets ``slots`` (e.g. ``r"layers\\.\\d+\\.self_attn$"``).
4. Add the family to tests/test_interop.py's cases (a tiny config: logits, generate, modes)
   and to docs/interop.md's table. A module whose decoding state is kept elsewhere than the
   existing ``State`` kinds (conv / recurrent slots, RWKV's stacked list, xLSTM's tuple, an
   attention layer's keys and values: "kv") needs a new kind, handled once in adapter.py.
   Attention modules (Llama, RecurrentGemma: tests/test_interop_attention.py) set
   ``returns_pair`` (they return (output, weights)), ``mask="causal"`` (a 4D attention mask) and
   ``positions`` (RoPE reads position_ids) on their ModuleMap; a weight stacked from several
   transformers tensors (W_qk = [q_proj; k_proj]) uses ``Weight(..., part=i)`` rows.
"""

from .adapter import InteropMixer, compile_decode, uncompile_decode
from .convert import convert_module, from_transformers, place_mixer, placed_mixers, seqmix_mixers, supported_families
from .families import FAMILIES
from .load import load_converted
from .saved import MODEL_TYPE, SeqmixConvertedConfig
from .table import Family, ModuleMap, State, Unsupported, Weight

__all__ = [
    "from_transformers", "load_converted", "compile_decode", "uncompile_decode", "seqmix_mixers", "supported_families",
    "convert_module", "place_mixer", "placed_mixers", "InteropMixer", "FAMILIES", "Family", "ModuleMap", "State",
    "Unsupported", "Weight", "MODEL_TYPE", "SeqmixConvertedConfig",
]
