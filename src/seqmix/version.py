"""The version of seqmix: one module that the package and its exported configs read (pyproject.toml states the same)."""

__version__ = "0.1.0"
