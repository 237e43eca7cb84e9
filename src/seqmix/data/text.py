"""Text corpora for language modelling: tokenizers, a deterministic split, memory-mapped
token files and the windows the trainer reads (docs/lm.md, "The data path").

    from seqmix.data import build_data
    from seqmix.data.text import CorpusConfig
    cfg = CorpusConfig(corpus="tinyshakespeare", tokenizer="bpe", bpe_vocab_size=1024, seq_len=256, batch_size=16)
    train, val = build_data(cfg)       # TokenWindows: random windows / contiguous windows
    b = train.batch(step, seed=0)      # Batch(inputs [B, T], labels [B, T]) drawn from (data seed, seed, step)
    for b in val.batches(): ...        # non-overlapping windows covering the split

A :class:`CorpusConfig` is the other kind of data config (beside the synthetic
:class:`seqmix.data.DataConfig`): :func:`seqmix.data.build_data` takes either, and the
trainer reads both through the same two objects (a training source and an evaluation
split).

Tokenizers (:func:`load_tokenizer`, :func:`corpus_tokenizer`): ``"byte"`` (the 256 UTF-8
byte values, nothing trained), ``"char"`` (the characters of the whole corpus, sorted),
``"bpe"`` (byte-level BPE trained on the training split with HuggingFace ``tokenizers``,
the optional extra ``text``; ``bpe_vocab_size`` symbols), or a path to a saved
``tokenizer.json`` (ours, or any HuggingFace ``tokenizers`` file). Every tokenizer has
``encode(str) -> list[int]``, ``decode(list[int]) -> str``, ``vocab_size`` and ``save(path)``.

Corpora: ``"tinyshakespeare"`` (shipped in the package, seqmix/data/corpora/), a path to a
UTF-8 text file or a folder (every ``*.txt`` under it, sorted by path, joined by newlines),
or ``"hf:<name>"`` / ``"hf:<name>/<config>"`` — a HuggingFace ``datasets`` dataset (the
extra ``text``; column ``text_field``) that the user has or can download.

Split (deterministic, no seed): a dataset with its own train/validation/test splits keeps
them; any other text is cut by position, at the first line break after the
``1 − val_fraction − test_fraction`` and ``1 − test_fraction`` points of its UTF-8 bytes
(nanoGPT's contiguous split: no window straddles two splits). Each split is tokenized once,
in pieces cut where the byte-level pre-tokenization cuts anyway (:func:`text_pieces`: the
same ids as one pass, memory bounded, ``encode_batch`` in parallel), into ``<cache>/text/<hash>/<split>.bin`` —
uint16 when the vocabulary fits, else uint32 — with meta.json (tokens, UTF-8 bytes) and the
tokenizer beside it; the hash covers the corpus (path, size and mtime of each file, or its
name), the tokenizer, the fractions and :data:`TEXT_VERSION`. The files are opened as
``np.memmap``, so a corpus bigger than memory streams.

Windows: training batch m of seed s holds ``batch_size`` windows of ``seq_len + 1`` tokens
at starts drawn uniformly from ``np.random.SeedSequence([data seed, s, m])`` — a resumed run
draws the same batches. Evaluation windows are contiguous and non-overlapping
(``(n − 1) // seq_len`` of them), each scored at every position. Bits per byte =
loss / ln 2 / (UTF-8 bytes of the split / tokens of the split): a tokenizer-independent
figure (char, byte and BPE runs compare), exact up to the ≤ seq_len tokens left over at the end.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .base import Batch, cache_dir, config_hash

#: bump when tokenizing or splitting changes for the same config (invalidates token caches)
TEXT_VERSION = 1
#: corpora shipped in the package (name -> file under seqmix/data/corpora)
BUILTIN_CORPORA = {"tinyshakespeare": "tinyshakespeare/input.txt"}
TOKENIZER_KINDS = ("byte", "char", "bpe")
SPLITS = ("train", "val", "test")
_CHUNK_BYTES = 4 << 20  # text tokenized per encode_batch call


# ------------------------------------------------------------------------------------------
# tokenizers
# ------------------------------------------------------------------------------------------


class ByteTokenizer:
    """The 256 byte values of the UTF-8 encoding (no training, no unknown symbol)."""

    kind = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def save(self, path) -> Path:
        return _write_json(path, {"seqmix_tokenizer": "byte"})


class CharTokenizer:
    """One id per character of ``chars`` (the corpus' characters, sorted)."""

    kind = "char"

    def __init__(self, chars):
        self.chars = list(chars)
        if not self.chars:
            raise ValueError("CharTokenizer: argument 'chars' is empty (the corpus has no characters)")
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    def encode(self, text: str) -> list[int]:
        try:
            return [self.index[ch] for ch in text]
        except KeyError as e:
            raise ValueError(f"CharTokenizer.encode: character {e.args[0]!r} is not in the vocabulary "
                             f"of {self.vocab_size} characters (those of the corpus it was built from)") from None

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def save(self, path) -> Path:
        return _write_json(path, {"seqmix_tokenizer": "char", "chars": self.chars})


class HFTokenizer:
    """A HuggingFace ``tokenizers.Tokenizer`` (our byte-level BPE, or any tokenizer.json)."""

    kind = "bpe"

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        self.tok.save(str(tmp))
        os.replace(tmp, path)
        return path


def _write_json(path, obj) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False))
    os.replace(tmp, path)
    return path


def _tokenizers_module():
    try:
        import tokenizers
    except ImportError:
        raise ValueError("BPE tokenizers need the HuggingFace 'tokenizers' package: pip install 'seqmix[text]'") from None
    return tokenizers


def train_bpe(lines: Iterator[str], vocab_size: int) -> HFTokenizer:
    """Byte-level BPE (GPT-2's pre-tokenization and 256-symbol base alphabet) with
    ``vocab_size`` symbols, trained on ``lines``."""
    tk = _tokenizers_module()
    if vocab_size < 257:
        raise ValueError(f"train_bpe: argument 'vocab_size' must be > 256 (the byte alphabet), got {vocab_size}")
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     special_tokens=[], show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    return HFTokenizer(tok)


def load_tokenizer(path) -> ByteTokenizer | CharTokenizer | HFTokenizer:
    """A saved tokenizer: our tokenizer.json (byte, char) or any HuggingFace tokenizer.json."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"load_tokenizer: argument 'path' = {str(path)!r} is not a file (expected a saved tokenizer.json)")
    try:
        blob = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"load_tokenizer: {str(path)!r} is not a tokenizer JSON file ({e})") from None
    kind = blob.get("seqmix_tokenizer") if isinstance(blob, dict) else None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(blob["chars"])
    tk = _tokenizers_module()
    try:
        return HFTokenizer(tk.Tokenizer.from_file(str(path)))
    except Exception as e:  # noqa: BLE001  (tokenizers raises its own exception types)
        raise ValueError(f"load_tokenizer: {str(path)!r} is neither a seqmix nor a HuggingFace tokenizer file ({e})") from None


# ------------------------------------------------------------------------------------------
# the config
# ------------------------------------------------------------------------------------------


class CorpusConfig(BaseModel):
    """A text corpus as language-modelling data (module docstring): what to read, how to
    tokenize it, how to split it, and the windows the trainer sees."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["corpus"] = Field("corpus", description="marks a corpus config (the synthetic DataConfig has none)")
    corpus: str = Field("tinyshakespeare", description="'tinyshakespeare', a path to a text file or folder, or 'hf:<name>[/<config>]'")
    text_field: str = Field("text", description="the text column of a HuggingFace dataset")
    tokenizer: str = Field("byte", description="'byte', 'char', 'bpe' or a path to a saved tokenizer.json")
    bpe_vocab_size: int = Field(1024, gt=256, description="symbols of the trained BPE (tokenizer='bpe')")
    token_dtype: Literal["auto", "uint16", "uint32"] = Field("auto", description="dtype of the token files (auto: uint16 if the vocabulary fits)")
    seq_len: int = Field(256, gt=0, description="training context T (tokens per window)")
    eval_seq_len: int | None = Field(None, gt=0, description="evaluation window length (default: seq_len)")
    batch_size: int = Field(16, gt=0, description="training windows per micro-batch")
    eval_batch_size: int | None = Field(None, gt=0, description="evaluation windows per batch (default: batch_size)")
    val_fraction: float = Field(0.05, gt=0, lt=0.5, description="share of the text in the validation split (text without splits)")
    test_fraction: float = Field(0.05, gt=0, lt=0.5, description="share of the text in the test split (text without splits)")
    eval_split: Literal["val", "test"] = Field("val", description="the split the trainer evaluates on")
    seed: int = Field(0, ge=0, description="data seed: training windows of step m come from (seed, train seed, m)")

    @model_validator(mode="after")
    def _check(self):
        if self.tokenizer not in TOKENIZER_KINDS and not self.tokenizer.endswith(".json"):
            raise ValueError(f"tokenizer: expected one of {', '.join(TOKENIZER_KINDS)} or a path to a tokenizer.json, got {self.tokenizer!r}")
        if self.tokenizer.endswith(".json") and not Path(self.tokenizer).expanduser().is_file():
            raise ValueError(f"tokenizer: no tokenizer file at {self.tokenizer!r}")
        if self.tokenizer.endswith(".json"):
            try:
                load_tokenizer(Path(self.tokenizer).expanduser())
            except ValueError as e:
                raise ValueError("tokenizer: " + str(e).removeprefix("load_tokenizer: ")) from None
        corpus_files(self.corpus)  # a missing path fails here, naming it
        if self.token_dtype == "uint16" and self.tokenizer == "bpe" and self.bpe_vocab_size > 1 << 16:
            raise ValueError(f"token_dtype: uint16 holds ids < 65536, but bpe_vocab_size = {self.bpe_vocab_size}; use uint32 or auto")
        return self

    # -- what the trainer and RunConfig read ---------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Token ids are < this: 256 for bytes, bpe_vocab_size for BPE (the trained one may
        have fewer symbols on a small corpus), the corpus' characters or the saved file's
        vocabulary otherwise (read or built, and cached, on first use)."""
        if self.tokenizer == "byte":
            return 256
        if self.tokenizer == "bpe":
            return self.bpe_vocab_size
        return corpus_tokenizer(self).vocab_size

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_len, self.eval_seq_len or 0)

    @property
    def shuffle(self) -> bool:
        return True

    @property
    def slice_name(self) -> str:
        return f"{corpus_name(self.corpus)}({self.tokenizer_name})"

    @property
    def tokenizer_name(self) -> str:
        if self.tokenizer == "bpe":
            return f"bpe{self.bpe_vocab_size}"
        return self.tokenizer if self.tokenizer in TOKENIZER_KINDS else Path(self.tokenizer).name

    def describe(self) -> str:
        return f"{self.slice_name} T={self.seq_len} batch {self.batch_size}"


def corpus_name(corpus: str) -> str:
    if corpus in BUILTIN_CORPORA or corpus.startswith("hf:"):
        return corpus
    return Path(corpus).name


# ------------------------------------------------------------------------------------------
# reading the corpus
# ------------------------------------------------------------------------------------------


def builtin_path(name: str) -> Path:
    return Path(__file__).resolve().parent / "corpora" / BUILTIN_CORPORA[name]


def corpus_files(corpus: str) -> list[Path] | None:
    """The files of a local corpus (None for a HuggingFace dataset); a missing path, an
    empty folder: ValueError naming 'corpus'."""
    if corpus.startswith("hf:"):
        if len(corpus) <= 3:
            raise ValueError("corpus: expected 'hf:<name>' or 'hf:<name>/<config>', got 'hf:'")
        return None
    if corpus in BUILTIN_CORPORA:
        return [builtin_path(corpus)]
    p = Path(corpus).expanduser()
    if p.is_file():
        if p.stat().st_size == 0:
            raise ValueError(f"corpus: the file {corpus!r} is empty (expected UTF-8 text)")
        _check_text_head(p)
        return [p]
    if p.is_dir():
        files = sorted(q for q in p.rglob("*.txt") if q.is_file())
        if not files:
            raise ValueError(f"corpus: the folder {corpus!r} has no *.txt files")
        for q in files[:_HEAD_FILES]:
            _check_text_head(q)
        return files
    raise ValueError(f"corpus: {corpus!r} is not a file, a folder, a built-in corpus ({', '.join(BUILTIN_CORPORA)}) "
                     "or 'hf:<name>[/<config>]'")


_HEAD_BYTES, _HEAD_FILES = 1 << 16, 64  # how much of a corpus a config checks to be text


def _check_text_head(path: Path) -> None:
    """The first 64 KiB of ``path`` are UTF-8 text (a binary file fails when the config is made,
    not after tokenizing; the rest is checked line by line while tokenizing)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError as e:
        raise ValueError(f"corpus: cannot read {str(path)!r} ({e.strerror or e})") from None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (len(head) == _HEAD_BYTES and e.start >= len(head) - 3):  # not a character cut by the 64 KiB
            raise ValueError(f"corpus: {str(path)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if b"\0" in head:
        raise ValueError(f"corpus: {str(path)!r} is not text (it holds NUL bytes: a binary file?)")


def _file_lines(path: Path) -> Iterator[str]:
    """Lines of a UTF-8 file (keeping their '\\n'); a non-UTF-8 file: ValueError naming it."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"corpus: {str(path)!r} is not UTF-8 text (line {i + 1}: {e.reason} at byte {e.start})") from None


def _hf_name(corpus: str) -> tuple[str, str | None]:
    """'hf:<name>/<config>' -> (name, config); a local folder keeps its whole path."""
    rest = corpus[3:]
    if Path(rest).expanduser().exists():
        return str(Path(rest).expanduser()), None
    name, _, cfg = rest.partition("/")
    return name, cfg or None


def _hf_dataset(corpus: str):
    try:
        import datasets
    except ImportError:
        raise ValueError("corpus: HuggingFace datasets need the 'datasets' package: pip install 'seqmix[text]'") from None
    name, cfg = _hf_name(corpus)
    try:
        if Path(name).is_dir() and any((Path(name) / f).exists() for f in ("dataset_dict.json", "state.json")):
            ds = datasets.load_from_disk(name)  # a dataset saved with save_to_disk
            return ds if isinstance(ds, datasets.DatasetDict) else datasets.DatasetDict({"train": ds})
        return datasets.load_dataset(name, cfg)  # a hub name, or a local folder of data files
    except Exception as e:  # noqa: BLE001  (network, missing dataset: say how to get it)
        raise ValueError(f"corpus: cannot load the HuggingFace dataset {name!r} (config {cfg!r}): {e}. "
                         "Download it once with datasets.load_dataset, or pass a local text file/folder") from None


_HF_SPLITS = {"train": ("train",), "val": ("validation", "valid", "val", "dev"), "test": ("test",)}


class _Source:
    """The lines of each split of a corpus, read lazily (module docstring: "Split")."""

    def __init__(self, config: CorpusConfig):
        self.config = config
        self.files = corpus_files(config.corpus)
        self.ds = None
        if self.files is None:
            self.ds = _hf_dataset(config.corpus)
        self._cuts = None

    def identity(self) -> dict:
        c = self.config
        if self.files is None:
            ident = {"hf": c.corpus, "field": c.text_field}
        elif c.corpus in BUILTIN_CORPORA:
            ident = {"builtin": c.corpus}
        else:
            ident = {"files": [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in self.files]}
        return {**ident, "val": c.val_fraction, "test": c.test_fraction}

    # -- local files: one stream cut at two byte positions ------------------------------

    def _all_lines(self) -> Iterator[str]:
        for k, p in enumerate(self.files):
            if k:
                yield "\n"
            yield from _file_lines(p)

    def cuts(self) -> tuple[int, int]:
        """Byte offsets where val and test start (at the first line break after the fractions)."""
        if self._cuts is None:
            total = sum(p.stat().st_size for p in self.files) + len(self.files) - 1
            if total <= 0:
                raise ValueError(f"corpus: {self.config.corpus!r} is empty (expected UTF-8 text)")
            targets = [int(total * (1 - self.config.val_fraction - self.config.test_fraction)),
                       int(total * (1 - self.config.test_fraction))]
            cuts, pos = [], 0
            for line in self._all_lines():
                pos += len(line.encode("utf-8"))
                while len(cuts) < 2 and pos >= targets[len(cuts)] and line.endswith("\n"):
                    cuts.append(pos)
            while len(cuts) < 2:
                cuts.append(pos)
            self._cuts = (cuts[0], cuts[1])
        return self._cuts

    def lines(self, split: str) -> Iterator[str]:
        if self.ds is not None:
            yield from self._hf_lines(split)
            return
        lo_val, lo_test = self.cuts()
        lo, hi = {"train": (0, lo_val), "val": (lo_val, lo_test), "test": (lo_test, 1 << 62)}[split]
        pos = 0
        for line in self._all_lines():
            n = len(line.encode("utf-8"))
            if lo <= pos < hi:
                yield line
            pos += n
            if pos >= hi:
                break

    def _hf_lines(self, split: str) -> Iterator[str]:
        names = [n for n in _HF_SPLITS[split] if n in self.ds]
        if names:
            part = self.ds[names[0]]
        else:  # a dataset without this split: cut its train split by rows, deterministically
            base = self.ds["train"] if "train" in self.ds else self.ds[list(self.ds)[0]]
            n = len(base)
            a = int(n * (1 - self.config.val_fraction - self.config.test_fraction))
            b = int(n * (1 - self.config.test_fraction))
            part = base.select(range(*{"train": (0, a), "val": (a, b), "test": (b, n)}[split]))
        if self.config.text_field not in part.column_names:
            raise ValueError(f"text_field: the dataset's columns are {part.column_names}, not {self.config.text_field!r}")
        for row in part:
            t = row[self.config.text_field]
            if t:
                yield t if t.endswith("\n") else t + "\n"


def _safe_boundary(prev: str, nxt: str) -> bool:
    """Cutting the text between line ``prev`` and line ``nxt`` leaves the byte-level
    pre-tokenization unchanged: ``prev`` ends in a non-space character and '\\n', ``nxt``
    starts with a non-space character (GPT-2's regex then splits there anyway)."""
    return len(prev) >= 2 and prev[-1] == "\n" and not prev[-2].isspace() and bool(nxt) and not nxt[0].isspace()


def text_pieces(lines: Iterator[str], piece_chars: int = 1 << 16) -> Iterator[str]:
    """The lines joined into pieces of about ``piece_chars`` characters, cut only at safe
    boundaries (:func:`_safe_boundary`): encoding the pieces one by one gives the ids of
    encoding the whole text, while bounding memory and letting ``encode_batch`` run in parallel."""
    buf: list[str] = []
    n = 0
    for line in lines:
        if n >= piece_chars and _safe_boundary(buf[-1], line):
            yield "".join(buf)
            buf, n = [], 0
        buf.append(line)
        n += len(line)
    if buf:
        yield "".join(buf)


def _chunks(lines: Iterator[str], size: int = _CHUNK_BYTES) -> Iterator[list[str]]:
    """Lists of pieces of about ``size`` characters in all (one encode_batch call each)."""
    buf, n = [], 0
    for piece in text_pieces(lines):
        buf.append(piece)
        n += len(piece)
        if n >= size:
            yield buf
            buf, n = [], 0
    if buf:
        yield buf


# ------------------------------------------------------------------------------------------
# tokenizing once into memory-mapped files
# ------------------------------------------------------------------------------------------


def _token_dtype(config: CorpusConfig, vocab_size: int):
    if config.token_dtype == "uint16" or (config.token_dtype == "auto" and vocab_size <= 1 << 16):
        if vocab_size > 1 << 16:
            raise ValueError(f"token_dtype: uint16 holds ids < 65536, but the tokenizer has {vocab_size} symbols; use uint32 or auto")
        return np.uint16
    if vocab_size > 1 << 32:
        raise ValueError(f"tokenizer: {vocab_size} symbols do not fit the largest token dtype (uint32)")
    return np.uint32


def _tokenizer_key(config: CorpusConfig) -> dict:
    if config.tokenizer in TOKENIZER_KINDS:
        return {"kind": config.tokenizer, **({"vocab": config.bpe_vocab_size} if config.tokenizer == "bpe" else {})}
    return {"file_sha1": hashlib.sha1(Path(config.tokenizer).expanduser().read_bytes()).hexdigest()}


def corpus_dir(config: CorpusConfig, source: _Source | None = None) -> Path:
    """<cache>/text/<name>-<hash>: the tokenizer, the token files and meta.json of ``config``."""
    source = source or _Source(config)
    key = config_hash({"corpus": source.identity(), "tokenizer": _tokenizer_key(config), "dtype": config.token_dtype,
                       "version": TEXT_VERSION})
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in corpus_name(config.corpus))[:40]
    return cache_dir() / "text" / f"{safe}-{key}"


@functools.lru_cache(maxsize=32)
def corpus_tokenizer(config: CorpusConfig):
    """The tokenizer of ``config`` (trained on the training split the first time, then loaded
    from the corpus' cache folder)."""
    if config.tokenizer == "byte":
        return ByteTokenizer()
    if config.tokenizer not in TOKENIZER_KINDS:
        return load_tokenizer(Path(config.tokenizer).expanduser())
    source = _Source(config)
    path = corpus_dir(config, source) / "tokenizer.json"
    if path.exists():
        return load_tokenizer(path)
    if config.tokenizer == "char":  # the characters of the whole corpus: no split meets an unknown one
        chars: set[str] = set()
        for split in SPLITS:
            for line in source.lines(split):
                chars.update(line)
        if not chars:
            raise ValueError(f"corpus: {config.corpus!r} is empty (expected UTF-8 text)")
        tok = CharTokenizer(sorted(chars))
    else:
        tok = train_bpe(source.lines("train"), config.bpe_vocab_size)
    tok.save(path)
    return tok


def tokenize_corpus(config: CorpusConfig) -> Path:
    """Tokenizes each split once into <corpus dir>/<split>.bin (module docstring); returns
    the folder. Written to temporary names and renamed, so a killed run leaves no torn file."""
    source = _Source(config)
    folder = corpus_dir(config, source)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        return folder
    tok = corpus_tokenizer(config)
    dtype = _token_dtype(config, tok.vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"vocab_size": tok.vocab_size, "dtype": np.dtype(dtype).name, "splits": {}, "config": config.model_dump(mode="json")}
    for split in SPLITS:
        tmp = folder / f"{split}.bin.{os.getpid()}.tmp"
        n_tok = n_bytes = 0
        with open(tmp, "wb") as f:
            for chunk in _chunks(source.lines(split)):
                n_bytes += sum(len(s.encode("utf-8")) for s in chunk)
                for ids in tok.encode_batch(chunk):
                    np.asarray(ids, dtype=dtype).tofile(f)
                    n_tok += len(ids)
        os.replace(tmp, folder / f"{split}.bin")
        meta["splits"][split] = {"tokens": n_tok, "bytes": n_bytes}
    if meta["splits"]["train"]["tokens"] == 0:
        raise ValueError(f"corpus: {config.corpus!r} has no text in its training split (an empty file?)")
    _write_json(meta_path, meta)
    return folder


def token_file(config: CorpusConfig, split: str) -> tuple[np.memmap, dict]:
    """(the split's tokens as a read-only memmap, that split's meta: tokens, bytes)."""
    if split not in SPLITS:
        raise ValueError(f"token_file: argument 'split' must be one of {', '.join(SPLITS)}, got {split!r}")
    folder = tokenize_corpus(config)
    meta = json.loads((folder / "meta.json").read_text())
    info = meta["splits"][split]
    if info["tokens"] == 0:
        return np.zeros(0, dtype=meta["dtype"]), info
    return np.memmap(folder / f"{split}.bin", dtype=meta["dtype"], mode="r", shape=(info["tokens"],)), info


# ------------------------------------------------------------------------------------------
# windows
# ------------------------------------------------------------------------------------------


@dataclass
class TokenWindows:
    """Windows of ``seq_len`` (+1 for the shifted labels) over one split's token memmap: the
    trainer's training source (:meth:`batch`) or evaluation split (:meth:`batches`)."""

    tokens: np.ndarray  # [n] uint16/uint32 memmap
    seq_len: int
    batch_size: int
    name: str
    n_bytes: int
    data_seed: int = 0
    tokenizer: object = None

    #: a stream has no epochs: the trainer counts its steps in tokens
    steps_per_epoch = None

    @property
    def names(self) -> list[str]:
        return [self.name]

    @property
    def tokens_per_batch(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / max(len(self.tokens), 1)

    def num_windows(self) -> int:
        """Contiguous non-overlapping evaluation windows."""
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def _window(self, starts: np.ndarray) -> Batch:
        T = self.seq_len
        idx = starts[:, None] + np.arange(T + 1)[None, :]
        w = torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))
        return Batch(w[:, :-1].contiguous(), w[:, 1:].contiguous(), 0, self.name)

    def batch(self, m: int, seed: int = 0) -> Batch:
        """Training micro-batch m: ``batch_size`` random windows from (data seed, seed, m)."""
        hi = len(self.tokens) - self.seq_len - 1
        if hi < 0:
            raise ValueError(f"seq_len: {self.seq_len} needs at least {self.seq_len + 1} tokens in the {self.name!r} split, "
                             f"which has {len(self.tokens)}")
        rng = np.random.default_rng(np.random.SeedSequence([self.data_seed, seed, m]))
        return self._window(rng.integers(0, hi + 1, size=self.batch_size))

    def batches(self, *, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> Iterator[Batch]:
        """Contiguous non-overlapping windows covering the split, in order (the keywords of
        :meth:`seqmix.data.Split.batches` are accepted; evaluation windows are never shuffled)."""
        n = self.num_windows()
        for a in range(0, n, self.batch_size):
            starts = np.arange(a, min(n, a + self.batch_size)) * self.seq_len
            yield self._window(starts)


def build_corpus(config: CorpusConfig, split: str, *, seq_len: int | None = None, batch_size: int | None = None) -> TokenWindows:
    """The windows of one split (tokenizing the corpus the first time)."""
    tokens, info = token_file(config, split)
    T = seq_len or (config.seq_len if split == "train" else config.eval_seq_len or config.seq_len)
    B = batch_size or (config.batch_size if split == "train" else config.eval_batch_size or config.batch_size)
    w = TokenWindows(tokens, T, B, split, info["bytes"], config.seed, corpus_tokenizer(config))
    if split != "train" and w.num_windows() == 0:
        raise ValueError(f"seq_len: {T} is longer than the {split!r} split of {config.corpus!r} ({len(tokens)} tokens); "
                         f"a window needs {T + 1}: use a shorter seq_len or a larger {split}_fraction")
    if split == "train" and len(tokens) < T + 1:
        raise ValueError(f"seq_len: {T} is longer than the training split of {config.corpus!r} ({len(tokens)} tokens)")
    return w


def build_text_data(config: CorpusConfig) -> tuple[TokenWindows, TokenWindows]:
    """(training windows, evaluation windows of ``eval_split``): what build_data returns for a corpus."""
    return build_corpus(config, "train"), build_corpus(config, config.eval_split)


__all__ = [
    "BUILTIN_CORPORA", "ByteTokenizer", "CharTokenizer", "CorpusConfig", "HFTokenizer", "TEXT_VERSION", "TokenWindows",
    "build_corpus", "build_text_data", "corpus_dir", "corpus_files", "corpus_tokenizer", "load_tokenizer", "token_file",
    "tokenize_corpus", "train_bpe",
]
