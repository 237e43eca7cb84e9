"""Linearization: a pretrained transformer's attention replaced by any seqmix mixer (docs/linearize.md).

    from seqmix.linearize import linearize, transfer, run, LinearizeConfig

    lin = linearize(llama, mixer="gla", layers="all")     # students initialised from q/k/v/o (init.py's table)
    transfer(lin, llama, batch, steps=200, match="output")  # stage 1: each student matches its layer
    run(LinearizeConfig(hf=..., mixer="gla", out=...))     # stages 1 and 2 (the Trainer), saved, resumable

The students are registered mixers inside interop's one adapter (``place_mixer``); stage 2 is the
one Trainer (``finetune.py``); the init map per student family is a table (``init.py``).
"""

from .api import attention_layers, keep_softmax, linearize, parse_layers, save, students
from .init import STUDENTS, StudentInit, Take, Teacher, build_student, teacher_weights, valid_students
from .pipeline import LinearizeConfig, run, state_floats_per_token
from .transfer import MATCHES, capture, phi_loss, residuals, transfer

__all__ = [
    "linearize", "save", "attention_layers", "parse_layers", "keep_softmax", "students", "STUDENTS", "StudentInit", "Take", "Teacher",
    "build_student", "teacher_weights", "valid_students", "transfer", "residuals", "phi_loss", "capture", "MATCHES",
    "LinearizeConfig", "run", "state_floats_per_token",
]
