"""The README and the docs site: the README's size, picture and command table; the site built with
``mkdocs build --strict`` (broken links, missing references and docstring errors fail it), its API
reference generated from the docstrings; the mixer gallery current with the registry."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import seqmix

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: the README is the front page: what seqmix is, a picture, set-up, ten lines, one table, links
README_MAX_CHARS = 8_000


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_is_a_front_page_with_its_picture():
    assert len(README) <= README_MAX_CHARS, f"README.md has {len(README)} characters, at most {README_MAX_CHARS}"
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README)
    assert pictures and all((ROOT / p).is_file() for p in pictures), pictures
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_seqmix_help_lists_the_commands_in_the_order_of_the_readmes_table():
    """Each row of "What you can do" names a `seqmix CMD`; those commands come in the order of
    `seqmix --help` (HELP_ORDER), which lists every command."""
    from seqmix.cli import HELP_ORDER, build_parser

    section = README.split("## What you can do", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and "`" in ln]
    firsts = [m.group(1) for ln in rows if (m := re.search(r"`seqmix (\w+)", ln))]
    assert len(firsts) >= 8, firsts
    assert all(c in HELP_ORDER for c in firsts), firsts
    positions = [HELP_ORDER.index(c) for c in firsts]
    assert positions == sorted(positions), f"README table order {firsts} is not the order of seqmix --help {HELP_ORDER}"
    help_text = build_parser().format_help()
    listed = re.search(r"\{([a-z0-9,]+)\}", help_text).group(1).split(",")
    assert listed == list(HELP_ORDER)


def test_the_site_front_page_is_the_readme_with_its_links_into_docs_relative():
    hooks = _load(ROOT / "tools" / "mkdocs_hooks.py", "mkdocs_hooks")
    page = hooks.index_markdown("see [the harness](docs/harness.md) and ![maps](docs/img/front.png); [x](https://a/docs/b)")
    assert page == "see [the harness](harness.md) and ![maps](img/front.png); [x](https://a/docs/b)"


def test_sphinx_roles_become_inline_code_in_the_api_reference():
    roles = _load(ROOT / "tools" / "griffe_roles.py", "griffe_roles")
    text = "Calls :func:`seqmix.ops.linear_recurrence` and :class:`~seqmix.dsf.DSF`; :data:`BATCH` inputs."
    assert roles.plain_roles(text) == "Calls `seqmix.ops.linear_recurrence` and `DSF`; `BATCH` inputs."


def test_gallery_page_and_pictures_are_current_with_the_registry():
    """docs/gallery.md is what docs/figures.py writes for today's registry, and every mixer's picture
    exists (after adding a mixer: python docs/figures.py gallery)."""
    figures = _load(ROOT / "docs" / "figures.py", "docs_figures")
    assert (ROOT / "docs" / "gallery.md").read_text(encoding="utf-8") == figures.gallery_page(), \
        "docs/gallery.md is stale: run python docs/figures.py gallery"
    names = [e.name for e in seqmix.list_mixers()]
    missing = [n for n in names if not (ROOT / "docs" / "gallery" / f"{n}.png").is_file()]
    assert not missing, f"no gallery picture for {missing}: run python docs/figures.py gallery"
    extra = sorted({p.stem for p in (ROOT / "docs" / "gallery").glob("*.png")} - set(names))
    assert not extra, f"gallery pictures of mixers that are not registered: {extra}"


def test_docs_site_builds_strict_with_the_api_reference(tmp_path):
    """`mkdocs build --strict` (what `make docs` runs) passes: no broken link, no missing reference, no
    docstring warning; the API reference holds the public functions, and the front page is the README."""
    pytest.importorskip("mkdocs", reason="the docs extra (pip install -e '.[docs]'; make test installs it)")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    ops = (site / "api" / "ops" / "index.html").read_text(encoding="utf-8")
    for name in ("seqmix.ops.linear_recurrence", "seqmix.ops.selective_scan.selective_scan", "seqmix.ops.delta_rule.delta_rule"):
        assert f'id="{name}"' in ops, name
    assert 'id="seqmix.build_mixer"' in (site / "api" / "seqmix" / "index.html").read_text(encoding="utf-8")
    assert 'id="seqmix.contract.check_mixer"' in (site / "api" / "contract" / "index.html").read_text(encoding="utf-8")
    index = (site / "index.html").read_text(encoding="utf-8")
    assert 'src="img/front.png"' in index and (site / "img" / "front.png").is_file()
    gallery = (site / "gallery" / "index.html").read_text(encoding="utf-8")
    assert gallery.count("<img ") >= len(seqmix.list_mixers())
