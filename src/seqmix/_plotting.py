"""Writing a matplotlib figure to disk, the same way for every plot of seqmix (results
tables, length generalization, LRA examples)."""

from __future__ import annotations

import textwrap
from pathlib import Path


def save_figure(fig, path: str | Path, *, title: str = "", dpi: int = 120, argument: str = "path") -> Path:
    """Adds ``title`` (wrapped at 70 characters) as the suptitle, lays the figure out tightly,
    writes it to ``path`` (creating its folder) and closes it. Returns the path. A folder at
    ``path``, or a folder that cannot be written: ValueError naming ``argument``."""
    import matplotlib.pyplot as plt

    from ._checks import output_file

    try:
        output_file(path, argument)
    except ValueError:
        plt.close(fig)
        raise
    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 70)), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
