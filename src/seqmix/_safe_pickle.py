"""Reading a pickle that someone else wrote without running its code.

    with open(path, "rb") as fh:
        blob = load_plain_pickle(fh, encoding="bytes", where=path)   # CIFAR-10's python batches

``pickle.load`` calls whatever the stream names (``os.system``, ``open``, ...). The
unpickler here resolves only numpy's array reconstruction (``_reconstruct``, ``_frombuffer``, ``ndarray``,
``dtype``: arrays of plain numbers; numpy refuses object arrays from a raw buffer) and
``_codecs.encode`` (bytes in protocol-2 pickles) — the
containers, numbers, strings and bytes of a pickle need no global at all. Anything else is a
ValueError naming the file and the global, raised before it is called.
"""

from __future__ import annotations

import pickle

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # protocol 5
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("_codecs", "encode"),  # bytes in protocol-2 pickles (a text-to-bytes transform; torch's weights_only allows it too)
}


class _Refused(pickle.UnpicklingError):
    """A global outside the allowed set (raised before it is resolved)."""


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")


def load_plain_pickle(fh, *, encoding: str = "ASCII", where="the file"):
    """``pickle.load(fh, encoding=encoding)`` of plain data and numpy arrays only (module docstring)."""
    try:
        return _PlainUnpickler(fh, encoding=encoding).load()
    except _Refused as e:
        raise ValueError(f"{str(where)!r} holds pickled Python objects ({e}) that seqmix does not load, since loading "
                         "them could run code; expected plain data and numpy arrays") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
        raise ValueError(f"{str(where)!r} is not a readable pickle of plain data ({type(e).__name__}: {e})") from None
