"""Code, tests and docs describe the present: no history words in src/, tests/, bench/, docs/ and the
README (issue numbers, the work sessions called "stops", "previous version", "Second version"
narration, "is now" / "until now"). History belongs in the commit messages. The test names every
offending file:line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("src", "tests", "bench", "docs")
FILES = ("README.md",)
SUFFIXES = {".py", ".md", ".cpp", ".h", ".cu", ".yml", ".yaml", ".toml", ".cfg", ".html", ".js", ".css"}
SKIP_DIRS = {"__pycache__", "out", "site", ".ipynb_checkpoints"}  # generated outputs, never committed
#: this file holds the phrases it looks for (in its docstrings and its check of the checker)
SELF = Path(__file__).resolve()

#: (what it is, the pattern; case-insensitive)
HISTORY = [
    ("an issue number", r"\bissues?\s*#?\s*\d+"),
    ("a work session ('this stop')", r"\b(?:this|previous|last|earlier|later|next)\s+stop\b|\bstop's\b"),
    ("version narration", r"\b(?:previous|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)\s+version\b"),
    ("an earlier state of the code", r"\b(?:older|earlier|previous)\s+(?:seqmix|code|implementation|release)\b"
                                     r"|\bbefore\s+(?:this|the)\s+(?:change|fix|commit)\b|\bthis\s+(?:commit|PR)\b"),
    ("'was'/'now' narration", r"\b(?:is|are)\s+now\b|\buntil\s+now\b|\bpreviously\b|\bformerly\b|\bused\s+to\s+be\b"),
]
_PATTERNS = [(what, re.compile(p, re.IGNORECASE)) for what, p in HISTORY]


def history_words(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the matched words) of every history phrase in ``text``, in the order of the
    text (a phrase broken over two lines, as a docstring wraps it, counts at the line it starts on)."""
    found = [(text.count("\n", 0, m.start()) + 1, m.start(), what, " ".join(m.group(0).split()))
             for what, pat in _PATTERNS for m in pat.finditer(text)]
    return [(n, what, words) for n, _, what, words in sorted(found)]


def _files():
    for tree in TREES:
        for p in sorted((ROOT / tree).rglob("*")):
            if p.is_file() and p.suffix in SUFFIXES and not SKIP_DIRS & set(p.relative_to(ROOT).parts) and p.resolve() != SELF:
                yield p
    for name in FILES:
        if (ROOT / name).is_file():
            yield ROOT / name


def test_the_checker_finds_each_kind_and_leaves_the_present_alone():
    text = "\n".join([
        "as issue 27 asks", "(issue #5)", "the figure of this stop", "the previous stop's clone", "Fifth version: AVX",
        "in the previous version's runs", "against the code before this change", "the fused mode (the default until now)",
        "the scan is now 26% of the step", "the target of issue\n    27 (wrapped)",
        # the present tense, and words that contain the patterns' words
        "early_stop=None stops at 99%", "stop tokens end a row", "the transformers version >= 5.4 (its first release with the cache keyword)",
        "issues are reported by the CLI", "Φ's rows are no longer convex combinations", "now = time.perf_counter()",
    ])
    found = history_words(text)
    assert [n for n, _, _ in found] == list(range(1, 11)), found
    assert {what for _, what, _ in found} == {what for what, _ in HISTORY}


def test_no_history_words_in_code_tests_and_docs():
    files = list(_files())
    assert len(files) > 100 and any(f.suffix == ".md" for f in files)  # the trees were found
    bad = [f"{f.relative_to(ROOT)}:{n}: {what}: {words!r}" for f in files
           for n, what, words in history_words(f.read_text(errors="replace"))]
    assert not bad, f"{len(bad)} history phrase(s) (describe the present; history goes to commit messages):\n" + "\n".join(bad)
