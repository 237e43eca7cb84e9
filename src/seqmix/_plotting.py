"""Writing a matplotlib figure to disk, the same way for every plot of seqmix (results
tables, length generalization, LRA examples)."""

from __future__ import annotations

import textwrap
from pathlib import Path


def save_figure(fig, path: str | Path, *, title: str = "", dpi: int = 120) -> Path:
    """Adds ``title`` (wrapped at 70 characters) as the suptitle, lays the figure out tightly,
    writes it to ``path`` (creating its folder) and closes it. Returns the path."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle("\n".join(textwrap.wrap(title, 70)), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
