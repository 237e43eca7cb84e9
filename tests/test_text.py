"""Text data (seqmix.data.text): tokenizers, corpora (local file, folder, the shipped Tiny
Shakespeare, a HuggingFace dataset built from local files), the deterministic split, the
memory-mapped token files, the windows, and the bad-input errors. Local data only."""

import hashlib
import json

import numpy as np
import pytest
import torch

from seqmix.data import build_data
from seqmix.data.text import (
    ByteTokenizer, CharTokenizer, CorpusConfig, build_corpus, builtin_path, corpus_dir, load_tokenizer, token_file,
    text_pieces, tokenize_corpus, train_bpe,
)

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog, ça va? {'é' * (i % 3)}\n" for i in range(400))


pytestmark = pytest.mark.usefixtures("private_cache")  # conftest: a data cache of the test's own


@pytest.fixture
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def test_byte_and_char_tokenizers_round_trip(tmp_path):
    b = ByteTokenizer()
    s = "héllo, wörld ✓"
    assert b.encode(s) == list(s.encode("utf-8")) and b.decode(b.encode(s)) == s and b.vocab_size == 256
    c = CharTokenizer(sorted(set(s)))
    assert c.decode(c.encode(s)) == s and c.vocab_size == len(set(s))
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        c.encode("z")
    for tok in (b, c):
        back = load_tokenizer(tok.save(tmp_path / f"{tok.kind}.json"))
        assert back.encode(s) == tok.encode(s) and back.vocab_size == tok.vocab_size


def test_bpe_trains_saves_reloads_and_chunked_encoding_matches(tmp_path):
    tok = train_bpe(iter(TEXT.splitlines(keepends=True)), 300)
    assert 256 < tok.vocab_size <= 300
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT.encode()) / 1.5  # merges learned: fewer tokens than bytes
    assert tok.decode(ids) == TEXT
    # the corpus is encoded in pieces cut at safe line breaks: the same ids as one pass
    text = TEXT.replace("dog,", "dog \n  \n\n dog,", 7)  # whitespace around line breaks: unsafe cuts exist
    pieces = list(text_pieces(iter(text.splitlines(keepends=True)), piece_chars=50))
    assert len(pieces) > 50 and "".join(pieces) == text
    assert sum(tok.encode_batch(pieces), []) == tok.encode(text)
    assert sum(tok.encode_batch(text.splitlines(keepends=True)), []) != tok.encode(text)  # naive line cuts differ
    back = load_tokenizer(tok.save(tmp_path / "tok.json"))  # a plain HuggingFace tokenizer.json
    assert back.encode("the lazy dog") == tok.encode("the lazy dog") and back.vocab_size == tok.vocab_size


def test_local_file_split_is_deterministic_contiguous_and_cached(corpus):
    cfg = CorpusConfig(corpus=str(corpus), tokenizer="byte", seq_len=16, batch_size=4, val_fraction=0.1, test_fraction=0.1)
    folder = tokenize_corpus(cfg)
    meta = json.loads((folder / "meta.json").read_text())
    splits = {s: token_file(cfg, s)[0] for s in ("train", "val", "test")}
    assert all(isinstance(t, np.memmap) and t.dtype == np.uint16 for t in splits.values())
    whole = np.concatenate([splits[s] for s in ("train", "val", "test")])
    assert bytes(whole.astype(np.uint8)) == TEXT.encode()  # the three splits partition the text, in order
    n = len(whole)
    assert abs(len(splits["val"]) - 0.1 * n) < 100 and abs(len(splits["test"]) - 0.1 * n) < 100
    assert bytes(splits["val"][:5].astype(np.uint8)) == b"Line "  # cut at a line break
    assert meta["splits"]["val"]["bytes"] == len(splits["val"])
    mtime = (folder / "train.bin").stat().st_mtime_ns
    assert tokenize_corpus(cfg) == folder and (folder / "train.bin").stat().st_mtime_ns == mtime  # tokenized once
    assert corpus_dir(cfg.model_copy(update={"val_fraction": 0.2})) != folder  # keyed by the config


def test_char_and_bpe_corpora_and_folders(tmp_path, corpus):
    d = tmp_path / "folder"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text(TEXT[:5000])
    (d / "sub" / "b.txt").write_text(TEXT[5000:])
    (d / "skip.md").write_text("not read")
    cfg = CorpusConfig(corpus=str(d), tokenizer="char", seq_len=16, batch_size=4)
    tr, va = build_data(cfg)
    assert cfg.vocab_size == len(set(TEXT)) and va.bytes_per_token > 1  # é is two bytes
    text = tr.tokenizer.decode(np.concatenate([token_file(cfg, s)[0] for s in ("train", "val", "test")]))
    assert text == TEXT[:5000] + "\n" + TEXT[5000:]  # files in path order, joined by a newline
    bpe = CorpusConfig(corpus=str(corpus), tokenizer="bpe", bpe_vocab_size=300, seq_len=16, batch_size=4)
    tr, va = build_data(bpe)
    assert tr.tokenizer.vocab_size <= bpe.vocab_size == 300
    assert (corpus_dir(bpe) / "tokenizer.json").exists()
    # a saved tokenizer.json by path gives the same tokens
    by_path = CorpusConfig(corpus=str(corpus), tokenizer=str(corpus_dir(bpe) / "tokenizer.json"), seq_len=16, batch_size=4)
    assert np.array_equal(token_file(by_path, "val")[0], token_file(bpe, "val")[0])


def test_windows_random_by_seed_and_step_and_contiguous_for_eval(corpus):
    cfg = CorpusConfig(corpus=str(corpus), seq_len=16, batch_size=4, eval_batch_size=5)
    tr, va = build_data(cfg)
    a, b = tr.batch(7, seed=3), tr.batch(7, seed=3)
    assert torch.equal(a.inputs, b.inputs) and not torch.equal(a.inputs, tr.batch(8, seed=3).inputs)
    assert not torch.equal(a.inputs, tr.batch(7, seed=4).inputs)
    assert a.inputs.shape == (4, 16) and a.inputs.dtype == torch.int64
    assert torch.equal(a.inputs[:, 1:], a.labels[:, :-1])  # labels: the next token
    evs = list(va.batches())
    inputs = torch.cat([e.inputs for e in evs])
    assert inputs.shape[0] == va.num_windows() == (len(va.tokens) - 1) // 16
    assert torch.equal(inputs.reshape(-1), torch.from_numpy(va.tokens[: inputs.numel()].astype(np.int64)))  # non-overlapping
    assert [e.inputs.shape[0] for e in evs][:-1] == [5] * (len(evs) - 1)


def test_tiny_shakespeare_ships_with_its_provenance():
    p = builtin_path("tinyshakespeare")
    assert hashlib.md5(p.read_bytes()).hexdigest() == "6fb458f1232090904fb40fe944165e91"
    assert "char-rnn" in (p.parent / "README.md").read_text()
    tr, va = build_data(CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=64, batch_size=2))
    assert len(tr.tokens) + len(va.tokens) + len(token_file(CorpusConfig(corpus="tinyshakespeare"), "test")[0]) == p.stat().st_size


def test_hf_dataset_built_from_local_files(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    lines = TEXT.splitlines()
    ds = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": lines[:300]}),
        "validation": datasets.Dataset.from_dict({"text": lines[300:350]}),
        "test": datasets.Dataset.from_dict({"text": lines[350:]}),
    })
    ds.save_to_disk(str(tmp_path / "ds"))
    cfg = CorpusConfig(corpus=f"hf:{tmp_path / 'ds'}", tokenizer="byte", seq_len=16, batch_size=2)
    tr, va = build_data(cfg)
    assert bytes(va.tokens[:200].astype(np.uint8)) == "\n".join(lines[300:]).encode()[:200]  # its own validation split
    # a folder of data files that load_dataset reads (splits named by the files)
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, part in (("train", lines[:300]), ("validation", lines[300:350]), ("test", lines[350:])):
        (raw / f"{split}.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in part))
    cfg2 = CorpusConfig(corpus=f"hf:{raw}", text_field="body", tokenizer="byte", seq_len=16, batch_size=2)
    assert np.array_equal(token_file(cfg2, "val")[0], token_file(cfg, "val")[0])
    with pytest.raises(ValueError, match="text_field"):
        token_file(CorpusConfig(corpus=f"hf:{raw}", text_field="nope", seq_len=16), "val")


@pytest.mark.parametrize("case,match", [
    ("missing", "corpus: .* is not a file"),
    ("empty", "corpus: the file .* is empty"),
    ("latin1", "is not UTF-8 text"),
    ("dtype", "token_dtype: uint16"),
    ("long", "seq_len: 4096 is longer than the 'val' split"),
    ("tokenizer", "tokenizer: expected one of byte, char, bpe"),
])
def test_bad_input_is_a_clear_error(tmp_path, corpus, case, match):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(("ok line\n" * 50).encode() + "caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=match):
        if case == "missing":
            CorpusConfig(corpus=str(tmp_path / "nope.txt"))
        elif case == "empty":
            CorpusConfig(corpus=str(empty))
        elif case == "latin1":
            tokenize_corpus(CorpusConfig(corpus=str(latin), seq_len=4))
        elif case == "dtype":
            CorpusConfig(corpus=str(corpus), tokenizer="bpe", bpe_vocab_size=70_000, token_dtype="uint16")
        elif case == "long":
            build_corpus(CorpusConfig(corpus=str(corpus), seq_len=4096), "val")
        elif case == "tokenizer":
            CorpusConfig(corpus=str(corpus), tokenizer="wordpiece")


def test_run_config_holds_a_corpus(corpus):
    from seqmix.train import make_run_config

    data = {"kind": "corpus", "corpus": str(corpus), "tokenizer": "char", "seq_len": 16}
    cfg = make_run_config(data=data, model={"mixer": "linear_attention"}, train={"max_steps": 3})
    assert cfg.is_lm and cfg.model.vocab_size == len(set(TEXT)) and cfg.model.max_seq_len == 16
    with pytest.raises(ValueError, match="max_tokens or train.max_steps"):
        make_run_config(data=data, model={"mixer": "linear_attention"})
