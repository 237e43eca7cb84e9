"""Run checkpoints on disk: opening a run folder runs no code.

    write_checkpoint({"run_id": ..., "config": config.model_dump(mode="json"), "model": state_dict, ...}, path)
    blob = read_checkpoint(path)          # torch.load(weights_only=True), or a ValueError naming the file

A checkpoint (``run_dir/checkpoint.pt``) holds only what ``torch.load(..., weights_only=True)``
reads back without executing anything: tensors and plain containers (dict, list, tuple, str,
int, float, bool, None) — the config as its JSON dict, state dicts, the loop state, and the
RNG states as tensors and lists (:func:`rng_state`). Run folders get shared, so a file that
holds anything else (a pickled object, whose loading could run its code) is refused with a
ValueError, and so is an empty, truncated, corrupt or foreign file: never an unpickling
traceback.

Format 1 holds numpy's RNG state as a numpy array. Such files are read too: the only globals
allowed for them are numpy's array reconstruction (``numpy.core.multiarray._reconstruct``,
``numpy.ndarray``, ``numpy.dtype``), which build arrays of plain numbers and run nothing else —
checked on the file's pickle opcodes before anything is loaded.
"""

from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

CHECKPOINT = "checkpoint.pt"
FORMAT = 2  # 1: numpy RNG state pickled as an array (no "format" key); 2: tensors, containers, JSON only

#: the globals of a format-1 checkpoint beyond weights_only's (numpy's RNG state array)
_V1_GLOBALS = {"numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
               "numpy.dtypes.UInt32DType"}


def rng_state() -> dict:
    """The torch, numpy and Python RNG states as tensors and lists (weights_only-loadable)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "numpy": {"bit_generator": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": _plain(random.getstate())}


def set_rng_state(rng: dict) -> None:
    """Restores what :func:`rng_state` returned."""
    torch.set_rng_state(rng["torch"].cpu())  # read with map_location: may sit on the run's device
    n = rng["numpy"]
    keys = n["keys"].cpu().numpy() if isinstance(n["keys"], torch.Tensor) else np.asarray(n["keys"])
    np.random.set_state((n["bit_generator"], keys.astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))


def _plain(x):
    """Tuples (nested) as lists."""
    return [_plain(v) for v in x] if isinstance(x, (tuple, list)) else x


def write_checkpoint(blob: dict, path: str | Path) -> None:
    """``torch.save`` of ``blob`` (with ``"format"``) to ``path``, atomically (a temporary file,
    then a rename: a killed process never leaves half a checkpoint)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save({**blob, "format": FORMAT}, tmp)
    os.replace(tmp, path)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def read_checkpoint(path: str | Path, *, map_location="cpu", keys=("config", "model")) -> dict:
    """The checkpoint at ``path``, loaded with ``weights_only=True`` (module docstring).
    ``keys``: entries it must have. Anything else — an empty, truncated or corrupt file, a
    file that is not a torch checkpoint, one holding pickled objects, one without ``keys`` —
    is a ValueError naming the file and what was expected."""
    path = Path(path)
    expected = "expected a seqmix run checkpoint (torch.save of tensors, containers and JSON)"
    try:
        size = path.stat().st_size
        is_zip = zipfile.is_zipfile(path)
    except OSError as e:
        raise ValueError(f"checkpoint {str(path)!r} cannot be read ({e.strerror or e})") from None
    if size == 0:
        raise ValueError(f"checkpoint {str(path)!r} is empty; {expected}")
    if not is_zip:  # torch.save writes a zip archive; a truncated one has lost its directory at the end
        raise ValueError(f"checkpoint {str(path)!r} is truncated, corrupt or not a torch checkpoint "
                         f"(not a torch.save zip archive, {size:,} bytes); {expected}")
    try:
        blob = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:  # globals weights_only refuses: a format-1 file, or pickled objects
        blob = _read_v1(path, map_location, expected)
    except Exception as e:  # noqa: BLE001  (a corrupt member: CRC, EOF, bad records, ...)
        raise ValueError(f"checkpoint {str(path)!r} is corrupt ({_first_line(e)}); {expected}") from None
    if not isinstance(blob, dict) or not all(k in blob for k in keys):
        got = f"a dict with keys {sorted(map(str, blob))[:8]}" if isinstance(blob, dict) else type(blob).__name__
        raise ValueError(f"checkpoint {str(path)!r} is not a seqmix run checkpoint: it holds {got}; expected a dict with "
                         f"{', '.join(map(repr, keys))}")
    if "model" in keys and not (isinstance(blob["model"], dict)
                                and all(isinstance(v, torch.Tensor) for v in blob["model"].values())):
        raise ValueError(f"checkpoint {str(path)!r} is not a seqmix run checkpoint: its 'model' is not a state dict "
                         "(names -> tensors)")
    return blob


def _read_v1(path: Path, map_location, expected: str) -> dict:
    """A format-1 checkpoint (numpy RNG array), its RNG state converted; anything else refused
    without being loaded."""
    from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals

    try:
        unsafe = set(get_unsafe_globals_in_checkpoint(path))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"checkpoint {str(path)!r} is corrupt ({_first_line(e)}); {expected}") from None
    if not unsafe <= _V1_GLOBALS:
        names = ", ".join(sorted(unsafe - _V1_GLOBALS)[:4])
        raise ValueError(f"checkpoint {str(path)!r} holds pickled Python objects ({names}) that seqmix does not load, "
                         "since loading them could run code: it was not written by seqmix; "
                         "retrain the run, or load the file yourself only if you trust its source")
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    allowed = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), (_reconstruct, "numpy.core.multiarray._reconstruct"),
               (_reconstruct, "numpy._core.multiarray._reconstruct")]
    try:
        with safe_globals(allowed):
            blob = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"checkpoint {str(path)!r} cannot be read safely ({_first_line(e)}); {expected}; "
                         "retrain the run") from None
    rng = blob.get("rng") if isinstance(blob, dict) else None
    if isinstance(rng, dict) and isinstance(rng.get("numpy"), tuple):
        name, keys, pos, has_gauss, cached = rng["numpy"]
        rng["numpy"] = {"bit_generator": name, "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)), "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return blob


__all__ = ["CHECKPOINT", "FORMAT", "read_checkpoint", "rng_state", "set_rng_state", "write_checkpoint"]
