"""`seqmix lm export --hf` and `seqmix lm generate` on a run that `seqmix lm train` made:
from_pretrained gives the run's logits, pipeline ("text-generation") works, the three tokenizer
kinds convert to PreTrainedTokenizerFast with the same ids. Local data only (a corpus the test writes)."""

import random

import pytest
import torch

pytest.importorskip("transformers", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")
pytest.importorskip("safetensors", reason="the optional extra 'hf' is not installed: pip install 'seqmix[hf]'")

import seqmix.hf  # noqa: E402,F401
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402

from seqmix.cli import main  # noqa: E402

WORDS = "the cat sat on a mat and the dog ran to his bed while birds sang".split()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 3-step `seqmix lm train` run (GLA, char tokenizer) on a corpus written here."""
    d = tmp_path_factory.mktemp("lm")
    rng = random.Random(0)
    (d / "corpus.txt").write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(200)))
    mp = pytest.MonkeyPatch()
    mp.setenv("SEQMIX_CACHE", str(d / "cache"))
    rc = main(["lm", "train", "--corpus", str(d / "corpus.txt"), "--tokenizer", "char", "--seq-len", "16",
               "--batch-size", "4", "--mixer", "gla", "--mixer-kw", "heads=2", "--d-model", "16", "--layers", "1",
               "--max-steps", "3", "--eval-batches", "1", "--no-progress", "--no-mfu", "--out", str(d / "runs")])
    assert rc == 0
    (run_dir,) = list((d / "runs" / "runs").iterdir())
    yield run_dir
    mp.undo()


def test_export_from_pretrained_same_logits_and_pipeline(run, tmp_path, capsys):
    from seqmix.analysis.trained import load_run

    out = tmp_path / "hf"
    assert main(["lm", "export", str(run), "--hf", str(out)]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    _, lm = load_run(run)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok.encode("the dog ran to")])
    with torch.no_grad():
        assert (model(ids).logits - lm(ids)).abs().max().item() <= 1e-6
    text = pipeline("text-generation", model=str(out))("the cat", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    greedy = lm.generate(torch.tensor([tok.encode("the cat")]), 5, temperature=0)[0, 7:].tolist()
    assert text == "the cat" + tok.decode(greedy)
    # the CLI's greedy stream prints the same continuation
    capsys.readouterr()
    assert main(["lm", "generate", str(run), "--prompt", "the cat", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_generate_cli_inputs(run, tmp_path, capsys):
    f = tmp_path / "prompt.txt"
    f.write_text("the mat")
    assert main(["lm", "generate", str(run), "--prompt-file", str(f), "--max-new-tokens", "4", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("the mat")
    # default length: capped by the learned position table (max_seq_len 16), with a note
    assert main(["lm", "generate", str(run), "--prompt", "the"]) == 0
    io = capsys.readouterr()
    assert "at most 14 new tokens" in io.err and len(io.out) == len("the") + 14 + 1
    assert main(["lm", "generate", str(run), "--prompt", "the", "--max-new-tokens", "15"]) == 2
    assert "max_seq_len = 16" in capsys.readouterr().err
    assert main(["lm", "generate", str(run), "--prompt-file", str(tmp_path / "missing.txt")]) == 2
    assert "--prompt-file" in capsys.readouterr().err
    assert main(["lm", "generate", str(run), "--prompt", "the Z"]) == 2  # 'Z' is not in the corpus
    assert "not in the vocabulary" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["byte", "char", "bpe"])
def test_tokenizers_convert_with_the_same_ids(kind):
    from seqmix.data.text import ByteTokenizer, CharTokenizer, train_bpe
    from seqmix.hf.tokenizer import to_hf_tokenizer

    text = "To be, or not to be: that is the question.\nWhether 'tis nobler — ça va?\n"
    tok = {"byte": lambda: ByteTokenizer(), "char": lambda: CharTokenizer(sorted(set(text))),
           "bpe": lambda: train_bpe(iter([text] * 20), 300)}[kind]()
    hf = to_hf_tokenizer(tok)
    assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
    assert hf.decode(tok.encode(text)) == text
