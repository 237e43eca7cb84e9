"""Every registered mixer in the DSF, one row each: the DSF paper's comparison of Λ, state,
normalization and gating, extended to today's mixers (docs/mixers.md is this table).

    from seqmix.analysis.mixer_table import mixer_table, mixer_table_markdown
    rows = mixer_table()              # one dict per registered mixer (MIXER_TABLE_COLUMNS)
    print(mixer_table_markdown())     # the markdown table of docs/mixers.md (`seqmix list --dsf`)

One mechanism with the per-layer report of converted real models: the structure of Λ_i is
:data:`seqmix.analysis.model_maps.LAMBDA_STRUCTURE` (a new mixer gets its entry there), the
normalization and gating are :func:`seqmix.analysis.model_maps.norm_and_gate` (the norm modules
a mixer holds, plus :data:`~seqmix.analysis.model_maps.NORM_GATE_RULES` per class). Each mixer is
built at its example config (``MixerEntry.example_config()``, d_model 16: the size the contract
suite tests), and its state is counted by ``mixer.state_size(seq_len)``:

- fixed state (state_size(T) the same at every T): ``state_size()`` floats per sequence, in the
  column "state floats / sequence";
- a cache that grows with the context (a KV cache, Hyena's decoding state):
  ``state_size(T + 1) − state_size(T)`` floats per token (checked linear over T = 1024..4096), in the
  column "cache floats / token";
- a state that grows as log T (the log-linear mixers' Fenwick levels): ``state_size(4096)`` in
  the first column and ``state_size(2T) − state_size(T)`` (one more level) in the second.
"""

from __future__ import annotations

from ..mixers.base import list_mixers
from .model_maps import LAMBDA_STRUCTURE, lambda_structure, missing_norm_gate_rule, norm_and_gate

__all__ = [
    "MIXER_TABLE_COLUMNS", "GROWTH", "mixer_table", "mixer_table_markdown", "missing_lambda_structure", "state_growth",
    "update_docs", "BEGIN", "END",
]

#: the columns of a row of :func:`mixer_table`, in order, with their headings
MIXER_TABLE_COLUMNS: dict[str, str] = {
    "name": "mixer",
    "family": "family",
    "lambda": "structure of Λ_i",
    "growth": "state growth",
    "state": "state floats / sequence",
    "per_token": "cache floats / token",
    "normalization": "normalization",
    "gating": "gating",
    "modes": "modes",
}

#: the kinds of state growth: a fixed state, a cache growing linearly, Fenwick levels growing as log T
GROWTH = ("fixed", "O(T)", "O(log T)")

#: sequence lengths at which the state is probed (the log-linear state is read at the last one)
_PROBE = (64, 1024, 4096)


def state_growth(mixer) -> tuple[str, int, int | None]:
    """(growth, state, per_token) of ``mixer`` from its ``state_size``: growth is one of
    :data:`GROWTH`; "fixed": (state_size(), None); "O(T)": (0, floats per token);
    "O(log T)": (state_size(4096), floats per extra level). See the module docstring."""
    sizes = {T: mixer.state_size(T) for T in _PROBE}
    if len(set(sizes.values())) == 1:
        return "fixed", int(mixer.state_size()), None
    lo, hi = _PROBE[1], _PROBE[2]
    step = mixer.state_size(lo - 23) - mixer.state_size(lo - 24)  # off a power of two: no new Fenwick level
    if step > 0 and sizes[hi] - sizes[lo] == step * (hi - lo):
        return "O(T)", 0, int(step)
    return "O(log T)", int(sizes[hi]), int(mixer.state_size(2 * lo) - mixer.state_size(lo))


def missing_lambda_structure() -> list[str]:
    """Registered mixers without an entry in ``model_maps.LAMBDA_STRUCTURE``."""
    return [e.name for e in list_mixers() if e.name not in LAMBDA_STRUCTURE]


def mixer_table(*, strict: bool = True) -> list[dict]:
    """One dict per registered mixer (keys: :data:`MIXER_TABLE_COLUMNS`), sorted by family then
    name, each built at its example config. ``strict``: a registered mixer without a Λ structure
    entry, or whose class has no normalization / gating entry, raises a ValueError naming the table
    to add it to."""
    missing = missing_lambda_structure()
    if strict and missing:
        raise ValueError(
            f"mixer_table: no Λ structure for {', '.join(missing)}: add an entry per name to LAMBDA_STRUCTURE in "
            "src/seqmix/analysis/model_maps.py (scalar, diagonal, diagonal + low rank, product, shift, identity or none)"
        )
    missing = missing_norm_gate_rule()
    if strict and missing:
        raise ValueError(
            f"mixer_table: no normalization / gating entry for the class of {', '.join(missing)}: add one per class to "
            "NORM_GATE_RULES in src/seqmix/analysis/model_maps.py (an empty one if it has no functional norm and no gate)"
        )
    from ..mixers.base import build_mixer

    rows = []
    for e in list_mixers():
        m = build_mixer(e.name, **e.example_config())
        growth, state, per_token = state_growth(m)
        norm, gate = norm_and_gate(m)
        modes = list(e.modes) + (["step"] if m.supports_step and "step" not in e.modes else [])
        rows.append({
            "name": e.name, "family": e.family, "lambda": lambda_structure(m), "growth": growth,
            "state": state if growth != "O(T)" else None, "per_token": per_token,
            "normalization": norm, "gating": gate, "modes": ", ".join(modes),
        })
    return rows


def _cell(row: dict, key: str) -> str:
    v = row[key]
    if v is None:
        return "—"
    if key == "state" and row["growth"] == "O(log T)":
        return f"{v} at T = {_PROBE[-1]}"
    if key == "per_token" and row["growth"] == "O(log T)":
        return f"+{v} per level (2× T)"
    if key == "name":
        return f"`{v}`"
    return str(v).replace("|", "\\|")


def mixer_table_markdown(rows: list[dict] | None = None) -> str:
    """The markdown table of :func:`mixer_table` (docs/mixers.md holds it verbatim)."""
    rows = mixer_table() if rows is None else rows
    lines = ["| " + " | ".join(MIXER_TABLE_COLUMNS.values()) + " |", "|" + "---|" * len(MIXER_TABLE_COLUMNS)]
    lines += ["| " + " | ".join(_cell(r, k) for k in MIXER_TABLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


#: the markers around the generated table in docs/mixers.md
BEGIN, END = "<!-- mixer-table: begin (generated by seqmix.analysis.mixer_table; do not edit) -->", "<!-- mixer-table: end -->"


def update_docs(path="docs/mixers.md") -> bool:
    """Rewrites the table between :data:`BEGIN` and :data:`END` in ``path`` with
    :func:`mixer_table_markdown`; returns whether the file changed.
    ``python -m seqmix.analysis.mixer_table [PATH]``."""
    from pathlib import Path

    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"update_docs: {path} lacks the markers {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{mixer_table_markdown()}{END}{tail}"
    if new != text:
        p.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":
    import sys

    print("updated" if update_docs(*sys.argv[1:2]) else "unchanged")
