"""A griffe extension for the API reference (mkdocs.yml): seqmix's docstrings use Sphinx roles
(:func:`seqmix.ops.linear_recurrence`, :class:`~seqmix.DSF`, :data:`BATCH`); Markdown has none,
so each becomes inline code with the name as written (a leading ``~`` keeps the last part)."""

from __future__ import annotations

import re

import griffe

#: :role:`target` or :role:`~dotted.target`
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|const|ref|term):`(~?)([^`]+)`")


def _code(m: re.Match) -> str:
    tilde, target = m.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def plain_roles(text: str) -> str:
    return ROLE.sub(_code, text)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)
