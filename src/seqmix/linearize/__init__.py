"""Linearization: a pretrained transformer's attention replaced by any seqmix mixer (docs/linearize.md).

    from seqmix.linearize import linearize, transfer, run, LinearizeConfig

    lin = linearize(llama, mixer="gla", layers="all")     # students initialised from q/k/v/o (init.py's table)
    transfer(lin, llama, batch, steps=200, match="output")  # stage 1: each student matches its layer
    run(LinearizeConfig(hf=..., recipe="lolcats", out=...))  # a recipe's stages (the Trainer), saved, resumable

The students are registered mixers inside interop's one adapter (``place_mixer``); stage 2 is the
one Trainer (``finetune.py``); the init map per student family is a table (``init.py``); the
field's methods are recipes (``recipes.py``), typed presets of :class:`LinearizeConfig`.

The names below load their module on first use (``seqmix linearize --help`` reads the recipes
without importing transformers).
"""

from importlib import import_module

#: public name -> the submodule that defines it
_WHERE = {
    **dict.fromkeys(["linearize", "save", "attention_layers", "parse_layers", "uniform_layers", "keep_softmax", "students"], "api"),
    **dict.fromkeys(["STUDENTS", "StudentInit", "Take", "Teacher", "build_student", "teacher_weights", "valid_students"], "init"),
    **dict.fromkeys(["LinearizeConfig", "run", "state_floats_per_token", "evaluate_length"], "pipeline"),
    **dict.fromkeys(["transfer", "residuals", "phi_loss", "capture", "MATCHES"], "attention_transfer"),
    **dict.fromkeys(["Recipe", "RECIPES", "DEFAULT_RECIPE", "recipe", "recipe_settings"], "recipes"),
}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'seqmix.linearize' has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
