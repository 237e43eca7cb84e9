"""docs/new_mixer.md runs: its first Python block is written to the module it names, the other
Python blocks are executed in order in one namespace, and the ``seqmix`` lines of its shell
blocks are run through ``seqmix.cli.main``, all in a temporary folder. The page's mixer is
registered for this test only: the name is unregistered and its module forgotten afterwards,
so the registry the other tests see is unchanged. Also: ``check_mixer`` fails on a broken
mixer, naming the check."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

import seqmix
from seqmix.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "new_mixer.md"
FILE_LINE = re.compile(r"^# (\w+)\.py\n")


def blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a markdown text: (language, code)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def test_the_block_reader_reads_fences():
    text = "a\n```python\nx = 1\n```\ntext\n```bash\nseqmix list\n```\n"
    assert blocks(text) == [("python", "x = 1\n"), ("bash", "seqmix list\n")]


@pytest.fixture
def page_module(tmp_path, monkeypatch):
    """The page's module name; the test runs in tmp_path, which is on sys.path; afterwards the
    name is unregistered and the module dropped."""
    code = blocks(DOC.read_text(encoding="utf-8"))
    lang, first = code[0]
    m = FILE_LINE.match(first)
    assert lang == "python" and m, "the page's first block must be the mixer's module, starting with '# NAME.py'"
    module = m.group(1)
    names_before = {e.name for e in seqmix.list_mixers()}
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{module}.py").write_text(first, encoding="utf-8")
    yield module, code[1:]
    for name in {e.name for e in seqmix.list_mixers()} - names_before:
        seqmix.unregister(name)
    sys.modules.pop(module, None)
    assert {e.name for e in seqmix.list_mixers()} == names_before


def test_the_new_mixer_page_runs(page_module, tmp_path):
    pytest.importorskip("transformers", reason="the page's last step needs the optional extra 'hf'")
    module, rest = page_module
    namespace: dict = {"__name__": "new_mixer_doc"}
    ran = {"python": 0, "seqmix": 0}
    for lang, code in rest:
        if lang == "python":
            exec(compile(code, f"{DOC.name} (python block)", "exec"), namespace)
            ran["python"] += 1
        elif lang == "bash":
            for line in code.splitlines():
                if line.startswith("seqmix "):
                    assert main(shlex.split(line)[1:]) == 0, line
                    ran["seqmix"] += 1
    assert ran == {"python": 3, "seqmix": 2}
    assert "capped_gla" in {e.name for e in seqmix.list_mixers()}
    assert (tmp_path / "show" / "maps.png").is_file() and (tmp_path / "hf" / "config.json").is_file()


def test_check_mixer_fails_a_broken_mixer(page_module):
    """A mixer whose phi drops the decay passes every check but phi and dsf: check_mixer names phi."""
    import importlib

    from seqmix.ops import recurrence_map

    module, _ = page_module
    mod = importlib.import_module(module)

    @seqmix.register("capped_gla_without_decay_in_phi", example={"heads": 2, "chunk_size": 8})
    class Broken(mod.CappedGLA):
        def phi(self, x):
            q, k, _, _ = self.params(x)
            return recurrence_map(q, k, None, check_values=False)

    assert seqmix.check_mixer("capped_gla_without_decay_in_phi", checks=["registry", "step"]) == {"registry": "passed", "step": "passed"}
    with pytest.raises(seqmix.ContractError, match=r"check 'phi' failed: capped_gla_without_decay_in_phi: phi\(x\) applied"):
        seqmix.check_mixer("capped_gla_without_decay_in_phi", checks=["phi"])
    # a built mixer is checked at its own config; single-mode checks are skips, not passes
    m = seqmix.build_mixer("capped_gla", d_model=12, heads=3, chunk_size=4, mode="chunk")
    assert seqmix.check_mixer(m, checks=["modes_f64", "split"]) == {"modes_f64": "passed", "split": "passed"}
    with pytest.raises(ValueError, match="argument 'checks'"):
        seqmix.check_mixer("capped_gla", checks=["no_such_check"])
    with pytest.raises(ValueError, match="argument 'mixer'"):
        seqmix.check_mixer(3)
    with pytest.raises(ValueError, match="unknown mixer"):
        seqmix.check_mixer("no_such_mixer")


def test_unregister_takes_a_name_back():
    from seqmix.mixers.base import Mixer

    class Tmp(Mixer):
        family, modes, state_formula = "linear_attention", ("recurrent",), "0"

    seqmix.register("tmp_unregister_test")(Tmp)
    entry = seqmix.unregister("tmp_unregister_test")
    assert entry.cls is Tmp and "tmp_unregister_test" not in {e.name for e in seqmix.list_mixers()}
    with pytest.raises(ValueError, match="argument 'name'"):
        seqmix.unregister("tmp_unregister_test")


def test_cli_import_of_a_missing_module_is_one_line(capsys):
    assert main(["list", "--import", "no_such_module_for_seqmix"]) == 2
    assert "argument '--import': cannot import 'no_such_module_for_seqmix'" in capsys.readouterr().err
