"""seqmix tokenizers as ``transformers.PreTrainedTokenizerFast`` (for ``seqmix lm export --hf``).

* byte-level (256 symbols, id = byte value): a ``tokenizers`` BPE with no merges over the 256
  byte symbols of the ByteLevel pre-tokenizer's alphabet (the GPT-2 byte-to-character map),
  so encoding any UTF-8 text gives exactly its bytes;
* character-level: a BPE with no merges over the corpus' characters (no pre-tokenizer, a
  decoder that concatenates). A character outside the vocabulary is dropped by the converted
  tokenizer (the tokenizers library's BPE has no unknown token here), where seqmix's
  CharTokenizer raises a ValueError;
* BPE trained with ``tokenizers``: its own ``tokenizer.json``, wrapped as it is.

The converted tokenizer is checked against the seqmix one on a sample text before it is
returned (:func:`check_same_ids`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def byte_to_char() -> dict[int, str]:
    """The reversible byte -> printable character map of byte-level BPE (GPT-2's): printable
    Latin-1 bytes map to themselves, the other bytes to code points 256, 257, ... in order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level_tokenizer(**special):
    """A PreTrainedTokenizerFast whose ids are the UTF-8 bytes of the text (vocab 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: b for b, c in byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def char_level_tokenizer(chars: list[str], unk: str | None = None, **special):
    """A PreTrainedTokenizerFast with id i = chars[i] (one token per character; unknown
    characters map to ``unk`` when it is one of ``chars``, else they are dropped)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, **special)


def check_same_ids(seqmix_tok: Any, hf_tok, text: str) -> None:
    """Raises a ValueError when the two tokenizers disagree on ``text``."""
    a = list(seqmix_tok.encode(text))
    b = hf_tok.encode(text, add_special_tokens=False)
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise ValueError(f"to_hf_tokenizer: the converted tokenizer disagrees with the seqmix one at token {first} of the "
                         f"sample text ({a[first:first + 5]} vs {b[first:first + 5]})")


def to_hf_tokenizer(tok: Any, sample: str = "Hello, world! Ça va? 123\n\tend", **special):
    """A seqmix tokenizer (seqmix.data.text: kind "byte", "char" or "bpe") -> an equivalent
    PreTrainedTokenizerFast, checked on ``sample`` (the characters the tokenizer knows)."""
    from transformers import PreTrainedTokenizerFast

    kind = getattr(tok, "kind", None)
    if kind == "byte":
        hf = byte_level_tokenizer(**special)
    elif kind == "char":
        hf = char_level_tokenizer(list(tok.chars), **special)
        known = set(tok.chars)
        sample = "".join(c for c in sample if c in known) or "".join(tok.chars[:20])
    else:
        inner = getattr(tok, "tok", None)
        if inner is None:  # anything that saves a tokenizers-library tokenizer.json
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "tokenizer.json")
                try:
                    tok.save(path)
                    data = json.load(open(path, encoding="utf-8"))
                except Exception as e:  # noqa: BLE001
                    raise ValueError(f"to_hf_tokenizer: cannot convert a {type(tok).__name__} (kind {kind!r}): {e}") from None
                if not isinstance(data, dict) or "model" not in data:
                    raise ValueError(f"to_hf_tokenizer: cannot convert a {type(tok).__name__} (kind {kind!r}): it saves "
                                     "no tokenizer.json of the tokenizers library")
                hf = PreTrainedTokenizerFast(tokenizer_file=path, **special)
        else:
            hf = PreTrainedTokenizerFast(tokenizer_object=inner, **special)
    check_same_ids(tok, hf, sample)
    return hf


__all__ = ["byte_level_tokenizer", "byte_to_char", "char_level_tokenizer", "check_same_ids", "to_hf_tokenizer"]
