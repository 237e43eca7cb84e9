"""mkdocs hooks of the docs site (mkdocs.yml): the README is the site's front page.

The README lives at the repository root and links into docs/ (``docs/harness.md``,
``docs/img/front.png``); the site's index.md is the README with those links made relative to
docs/, so one text serves GitHub's front page and the site's."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
#: a Markdown link or image target that starts with docs/
DOCS_LINK = re.compile(r"\]\(docs/")


def index_markdown(readme: str) -> str:
    """The README's text with its ``](docs/...)`` targets relative to docs/."""
    return DOCS_LINK.sub("](", readme)


def on_files(files, config):
    if files.get_file_from_path("index.md") is None:
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        files.append(File.generated(config, "index.md", content=index_markdown(readme)))
    return files
