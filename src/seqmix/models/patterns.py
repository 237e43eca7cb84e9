"""Named layer patterns: the stacks the papers compare a mixer against.

A pattern is a cycle of mixers: layer i of an N-layer model uses entry ``i % len(cycle)``.
``ModelConfig(pattern="mamba_swa", pattern_kwargs={"window": 32}, d_model=64)`` builds the
same layers as the equivalent ``hybrid`` list (``ModelConfig.layers`` is the cycle either
way; ``mixer`` defaults to the first layer's mixer). The config stores the pattern's name and
arguments, not the expansion: a round trip through JSON, or a changed argument, re-expands
it. The expansion of a name::

    seqmix.models.layer_pattern("mamba_swa", window=32)
    # [{'mixer': 'mamba'}, {'mixer': 'softmax_attention', 'mixer_kwargs': {'window': 32}}]

The registered patterns (B'MOJO paper §4, bmojo note §7.2-7.3):

==================  =======================================================================
``mamba_swa``       Mamba interleaved with sliding-window softmax attention (the paper's
                    "Hybrid": Mamba layers and SWA layers, Zoology's hybrid recipe);
                    kwargs ``window`` (default 512, the paper's 2k-context value), ``heads``
``mamba_only``      Mamba in every layer (the paper's "Mamba")
``attention_only``  full causal softmax attention in every layer (the paper's "Transformer"
                    paragon); kwarg ``heads``, and ``window`` for an SWA-only stack
``bmojo``           B'MOJO in every layer; kwargs: any B'MOJO config field
``bmojo_f``         B'MOJO-F in every layer; kwargs: any B'MOJO-F config field
``based``           Based's stack (Arora et al. 2024, §4): a gated short convolution
                    (``short_conv``, in the role of BaseConv), Based linear attention and
                    sliding-window softmax attention, in turn; kwargs ``window`` (default 64,
                    the paper's), ``heads``, ``feature_dim`` (the Taylor map's input width per
                    head, default 16, the paper's: n = feature_dim·heads)
==================  =======================================================================

``register_pattern(name, fn, description)`` adds one: ``fn(**kwargs)`` returns the list of
``{"mixer": name, "mixer_kwargs": {...}}`` dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class LayerPattern:
    name: str
    build: Callable[..., list[dict[str, Any]]]
    description: str


_PATTERNS: dict[str, LayerPattern] = {}


def register_pattern(name: str, build: Callable[..., list[dict[str, Any]]], description: str) -> None:
    """Registers a layer pattern under ``name`` (module docstring)."""
    if name in _PATTERNS:
        raise ValueError(f"register_pattern: a pattern named {name!r} is already registered")
    _PATTERNS[name] = LayerPattern(name, build, description)


def list_patterns() -> list[LayerPattern]:
    """Every registered layer pattern (hybrid stacks), sorted by name."""
    return [_PATTERNS[k] for k in sorted(_PATTERNS)]


def layer_pattern(name: str, **kwargs) -> list[dict[str, Any]]:
    """The cycle of ``{"mixer", "mixer_kwargs"}`` dicts of a registered pattern."""
    if not isinstance(name, str) or name not in _PATTERNS:
        raise ValueError(f"unknown layer pattern {name!r}; registered patterns: {', '.join(sorted(_PATTERNS))}")
    try:
        cycle = _PATTERNS[name].build(**kwargs)
    except TypeError as e:  # an unexpected keyword
        raise ValueError(f"layer pattern {name!r}: bad pattern_kwargs {sorted(kwargs)}: {e}") from None
    return [{"mixer": c["mixer"], "mixer_kwargs": dict(c.get("mixer_kwargs", {}))} for c in cycle]


def _only(mixer: str) -> Callable[..., list[dict[str, Any]]]:
    return lambda **kw: [{"mixer": mixer, "mixer_kwargs": kw}]


def _mamba_swa(window: int = 512, heads: int = 1, **mamba) -> list[dict[str, Any]]:
    return [{"mixer": "mamba", "mixer_kwargs": mamba},
            {"mixer": "softmax_attention", "mixer_kwargs": {"window": window, "heads": heads}}]


def _based(window: int = 64, heads: int = 1, feature_dim: int = 16) -> list[dict[str, Any]]:
    return [{"mixer": "short_conv"},
            {"mixer": "based", "mixer_kwargs": {"heads": heads, "n": feature_dim * heads}},
            {"mixer": "softmax_attention", "mixer_kwargs": {"window": window, "heads": heads}}]


register_pattern("mamba_swa", _mamba_swa, "Mamba and sliding-window attention layers, alternating (B'MOJO's Hybrid)")
register_pattern("mamba_only", _only("mamba"), "Mamba in every layer")
register_pattern("attention_only", _only("softmax_attention"), "softmax attention in every layer (full, or SWA with window)")
register_pattern("bmojo", _only("bmojo"), "B'MOJO in every layer")
register_pattern("bmojo_f", _only("bmojo_f"), "B'MOJO-F in every layer")
register_pattern("based", _based, "Based: gated short conv, Based linear attention and sliding-window attention layers, in turn")

__all__ = ["LayerPattern", "layer_pattern", "list_patterns", "register_pattern"]
