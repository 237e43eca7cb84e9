"""Argument checks shared by every layer of seqmix.

Bad input must raise a ``ValueError`` that names the argument and says what was
expected; these helpers keep those messages uniform. They are cheap (shape and
dtype checks) except the value checks (:func:`check_finite`, and the range checks of the ops, gated by
:func:`reads_values`), which read the tensor on the host: they run where that read costs no synchronisation (CPU tensors,
eager mode) and wherever asked (:func:`reads_values`, ``seqmix.debug.host_reads``).
"""

from __future__ import annotations

import cmath
import json
import math
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
COMPLEX = (torch.complex64, torch.complex128)


def fmt_shape(shape: Iterable) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def check_tensor(
    name: str,
    x,
    *,
    rank: int | Sequence[int] | None = None,
    layout: str | None = None,
    complex_ok: bool = False,
    where: str = "",
) -> torch.Tensor:
    """Checks that ``x`` is a floating (or complex, if allowed) tensor of the given rank.

    ``layout`` is the human-readable expected layout (e.g. "[B, T, H, K]") used in
    messages.
    """
    pre = f"{where}: " if where else ""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{pre}argument '{name}' must be a torch.Tensor {layout or ''}, got {type(x).__name__}")
    allowed = FLOATING + (COMPLEX if complex_ok else ())
    if x.dtype not in allowed:
        kinds = "floating or complex" if complex_ok else "floating"
        raise ValueError(f"{pre}argument '{name}' must have a {kinds} dtype, got {x.dtype}")
    if rank is not None:
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if x.dim() not in ranks:
            raise ValueError(
                f"{pre}argument '{name}' must be {layout or f'rank {ranks}'} "
                f"(rank {' or '.join(map(str, ranks))}), got shape {fmt_shape(x.shape)}"
            )
    return x


def check_shape(name: str, x: torch.Tensor, expected: Sequence, layout: str, where: str = "") -> None:
    """Checks ``x.shape == expected``; ``None`` entries in ``expected`` match anything."""
    pre = f"{where}: " if where else ""
    ok = x.dim() == len(expected) and all(e is None or int(e) == int(s) for e, s in zip(expected, x.shape))
    if not ok:
        exp = fmt_shape("?" if e is None else e for e in expected)
        raise ValueError(f"{pre}argument '{name}' must have shape {layout} = {exp}, got {fmt_shape(x.shape)}")


# ------------------------------------------------------------------------------------------
# host reads: the checks (and choices) that read a tensor's values on the host
# ------------------------------------------------------------------------------------------

#: the environment variable that sets the host-read policy of every process (``seqmix.debug``)
HOST_READS_ENV = "SEQMIX_HOST_READS"
#: the policies: "auto" reads values only where a read costs no synchronisation (a CPU tensor, outside
#: torch.compile's tracing); "always" reads them on every device (a debugging run on a GPU: each check
#: then waits for the device); "never" reads none anywhere (the value checks are skipped, and the ops
#: take the choices they take on an accelerator)
HOST_READ_POLICIES = ("auto", "always", "never")
_policy_override: list[str] = []  # seqmix.debug.host_reads(...) contexts, innermost last


# os.environ's own mapping and its key for HOST_READS_ENV (CPython's os._Environ), read by host_read_policy on every
# check: one dict lookup instead of os.environ.get's Python frames (encode the key, look up, decode the value)
_ENVIRON = os.environ  # (the mapping _ENV_DATA belongs to: a replaced os.environ is read through its own get)
_ENV_DATA = getattr(os.environ, "_data", None) if hasattr(os.environ, "encodekey") else None
_ENV_KEY = os.environ.encodekey(HOST_READS_ENV) if _ENV_DATA is not None else None


def host_read_policy() -> str:
    """The policy in force: the innermost :func:`seqmix.debug.host_reads` context, else the
    environment variable ``SEQMIX_HOST_READS``, else "auto"."""
    if _policy_override:
        return _policy_override[-1]
    env = _ENV_DATA.get(_ENV_KEY) if _ENV_DATA is not None and os.environ is _ENVIRON else os.environ.get(HOST_READS_ENV)
    if env is not None and not isinstance(env, str):
        env = os.environ.get(HOST_READS_ENV)  # (set: read it through os.environ, which decodes it)
    if not env:  # (the common case: unset)
        return "auto"
    env = env.strip().lower() or "auto"
    if env not in HOST_READ_POLICIES:
        raise ValueError(f"environment variable {HOST_READS_ENV}={env!r}: expected one of "
                         f"{', '.join(repr(p) for p in HOST_READ_POLICIES)}")
    return env


def reads_values(x: torch.Tensor | None = None) -> bool:
    """Whether a check may read the values of ``x`` on the host now.

    Under "auto" (the default) only a CPU tensor is read, and never while torch.compile traces
    (a read there would break the graph): on an accelerator a read waits for every queued kernel,
    and on the ``meta`` device there are no values. ``x`` None: whether reads are on at all."""
    policy = host_read_policy()
    if policy != "auto":
        return policy == "always"
    if x is not None and x.device.type != "cpu":
        return False
    return not torch.compiler.is_compiling()


def check_finite(name: str, x: torch.Tensor, where: str = "") -> None:
    """No NaN or Inf in ``x`` (one reduction and one host read; skipped where :func:`reads_values`
    says no)."""
    if not reads_values(x):
        return
    if x.requires_grad:
        x = x.detach()
    pre = f"{where}: " if where else ""
    # one cheap reduction first: a sum is finite whenever every entry is (the exact check
    # runs only when the sum is not, which also catches a sum that merely overflowed)
    if x.numel() and (cmath if x.is_complex() else math).isfinite(x.sum().item()):
        return
    if not bool(torch.isfinite(x).all()):
        n_nan = int(torch.isnan(x).sum()) if not x.is_complex() else int(torch.isnan(torch.view_as_real(x)).sum())
        raise ValueError(f"{pre}argument '{name}' contains non-finite values (NaN: {n_nan}, Inf: the rest)")


def check_choice(name: str, value, choices: Sequence, where: str = "") -> None:
    pre = f"{where}: " if where else ""
    if value not in choices:
        raise ValueError(f"{pre}unknown {name} {value!r}; expected one of {', '.join(repr(c) for c in choices)}")


def check_positive_int(name: str, value, where: str = "", minimum: int = 1) -> int:
    pre = f"{where}: " if where else ""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{pre}argument '{name}' must be an integer >= {minimum}, got {value!r}")
    return value


def read_json(path, argument: str, expected: str = "a JSON file"):
    """The JSON value in the file ``path``; a missing or unreadable file, a folder, binary or
    malformed text: one ValueError naming ``argument`` and what was expected."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"argument {argument}: {str(path)!r} is a folder, expected {expected}")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"argument {argument}: no such file {str(path)!r} (expected {expected})") from None
    except OSError as e:
        raise ValueError(f"argument {argument}: cannot read {str(path)!r} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"argument {argument}: {str(path)!r} is not UTF-8 text (expected {expected})") from None
    if not text.strip():
        raise ValueError(f"argument {argument}: {str(path)!r} is empty (expected {expected})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"argument {argument}: {str(path)!r} is not valid JSON (line {e.lineno}, column {e.colno}: "
                         f"{e.msg}; expected {expected})") from None


def output_dir(path, argument: str = "--out") -> Path:
    """The output folder ``path``, created (with its parents) when missing; an existing file
    there, or a folder that cannot be created or written: one ValueError naming ``argument``
    (and nothing of the user's is touched)."""
    p = Path(path).expanduser()
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            raise ValueError(f"argument {argument}: {str(q)!r} is a file, expected a folder (or a path that does not exist)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"argument {argument}: cannot create the folder {str(path)!r} ({e.strerror or e})") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise ValueError(f"argument {argument}: the folder {str(path)!r} is not writable")
    return p


def output_file(path, argument: str) -> Path:
    """The path of a file to write (its folder created when missing); a folder at ``path``, or
    a folder that cannot be created or written: one ValueError naming ``argument``."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(f"argument {argument}: {str(path)!r} is a folder, expected a file name")
    output_dir(p.parent, argument)
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"argument {argument}: {str(path)!r} is not writable")
    return p


#: file suffixes an output option may name; a picture or report is written in its own format only
PICTURE_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".pdf", ".html", ".htm")


def picture_paths(out, names: Sequence[str], argument: str = "--out", suffix: str = ".png", *,
                  create: bool = True) -> dict[str, Path]:
    """Where each picture of ``names`` goes for an output option, by one rule for every command
    that writes pictures: ``out`` ending in ``suffix`` is a file, the first picture is written
    there and each other one beside it as ``STEM-NAME{suffix}``; any other path is a folder
    holding ``NAME{suffix}`` each. A picture suffix other than ``suffix`` (``.svg`` for a PNG), a
    folder at a file's place or a file at a folder's: one ValueError naming ``argument``.
    ``create``: make the folder now (else only check that it could be made).

        picture_paths("maps.png", ["maps", "lemma1"]) -> {"maps": maps.png, "lemma1": maps-lemma1.png}
        picture_paths("out", ["maps"])                -> {"maps": out/maps.png}
    """
    p = Path(out).expanduser()
    ext = p.suffix.lower()
    if ext == suffix or (suffix == ".html" and ext == ".htm"):
        (output_file if create else _check_file_place)(p, argument)
        return {n: p if i == 0 else p.with_name(f"{p.stem}-{n}{p.suffix}") for i, n in enumerate(names)}
    if ext in PICTURE_SUFFIXES:
        raise ValueError(f"argument {argument}: this writes {suffix[1:].upper()} files: expected a FILE{suffix} or a folder, "
                         f"got {str(out)!r}")
    if create:
        output_dir(p, argument)
    else:
        _check_file_place(p / "x", argument)
    return {n: p / f"{n}{suffix}" for n in names}


def _check_file_place(p: Path, argument: str) -> None:
    """A file could be written at ``p``: no folder there, no file in place of a parent (nothing created)."""
    if p.is_dir():
        raise ValueError(f"argument {argument}: {str(p)!r} is a folder, expected a file name")
    for q in p.parents:
        if q.exists() and not q.is_dir():
            raise ValueError(f"argument {argument}: {str(q)!r} is a file, expected a folder (or a path that does not exist)")


def check_device(v: str, name: str = "device") -> str:
    """``v`` if torch reads it as a device (cpu, cuda, cuda:0, ...), else a ValueError naming ``name``."""
    try:
        torch.device(v)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name}: expected a torch device such as cpu, cuda or cuda:0, got {v!r}") from None
    return v
