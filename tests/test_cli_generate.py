"""`seqmix generate PATH` (seqmix.cli.generate) on every kind of folder seqmix loads, built here (nothing
downloaded): a seqmix run (`seqmix lm train`), its export (`seqmix lm export --hf`), a linearized folder, a
converted folder and a transformers checkpoint of a family seqmix converts. Greedy, sampled and beam-search
output equal what the model's own generate() gives; the text is streamed token by token; the figures on stderr
are there, and the state's bytes stay constant for a model of students and grow for softmax attention. Each bad
input is one line naming the argument, exit status 2."""

from __future__ import annotations

import io
import re
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

from seqmix.cli import main  # noqa: E402
from seqmix.interop import from_transformers, load_converted  # noqa: E402
from seqmix.linearize import linearize, save  # noqa: E402
from test_hf_export import WORDS, run  # noqa: E402,F401  (the module's `seqmix lm train` run fixture)
from test_interop import tiny  # noqa: E402
from test_linearize import teacher  # noqa: E402

KINDS = ["run", "exported", "linearized", "converted", "checkpoint"]
PROMPT = "the cat sat on"
#: the run's model (and its export) reads characters and has a learned position table of 16: a shorter prompt
PROMPTS = {"run": "the c", "exported": "the c"}


def _tokenizer(folder) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the test's words ([UNK] = 0), saved into ``folder``."""
    words = sorted(set(WORDS))
    tk = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]")
    tok.save_pretrained(folder)
    return tok


def _mamba2(vocab: int = 64):
    """A tiny Mamba-2 (the conv and recurrent state kinds of the cache)."""
    return tiny("mamba2", vocab_size=vocab)


@pytest.fixture(scope="module")
def folders(run, tmp_path_factory):  # noqa: F811
    """{kind: folder} of every kind."""
    d = tmp_path_factory.mktemp("gen")
    out = {"run": run, "exported": d / "exported"}
    assert main(["lm", "export", str(run), "--hf", str(out["exported"])]) == 0
    out["linearized"] = d / "linearized"
    save(linearize(teacher(vocab=64), mixer="gla", layers=[0, 2]), out["linearized"])
    out["converted"] = d / "converted"
    from_transformers(_mamba2()).save_pretrained(out["converted"])
    out["checkpoint"] = d / "checkpoint"
    teacher(vocab=64).save_pretrained(out["checkpoint"])
    for kind in ("linearized", "converted", "checkpoint"):
        _tokenizer(out[kind])
    return out


def _model_and_tokens(kind, folder):
    """(a transformers causal LM of the folder, loaded without the CLI; encode; decode)."""
    if kind in ("run", "exported"):
        import seqmix.hf  # noqa: F401

        from seqmix.analysis.trained import load_run
        from seqmix.data.text import load_tokenizer

        if kind == "run":
            model = seqmix.hf.SeqmixForCausalLM.wrap(load_run(folder)[1]).eval()
            tok = load_tokenizer(folder / "tokenizer.json")
            return model, tok.encode, tok.decode
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    else:
        model = load_converted(folder)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return model, (lambda text: tok(text)["input_ids"]), (lambda ids: tok.decode(ids, skip_special_tokens=True))


def _continuation(kind, folder, new: int, **kw) -> str:
    """The text the model's own generate() appends to the kind's prompt."""
    model, encode, decode = _model_and_tokens(kind, folder)
    ids = torch.tensor([encode(PROMPTS.get(kind, PROMPT))])
    gc = model.generation_config
    pad = gc.pad_token_id if gc.pad_token_id is not None else (gc.eos_token_id if isinstance(gc.eos_token_id, int) else 0)
    seed = kw.pop("seed", None)
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new, attention_mask=torch.ones_like(ids), pad_token_id=pad, **kw)
    prompt = ids[0].tolist()
    return decode(out[0].tolist())[len(decode(prompt)):]


def _figures(err: str) -> dict:
    num = r"([\d,.]+(?:e[+-]\d+)?)"
    m = re.search(rf"prefill: (\d+) tokens in {num} ms \({num} tokens/s\); decode: (\d+) tokens in {num} ms "
                  rf"\({num} tokens/s, {num} ms/token\); cache: ([\d,]+) bytes", err)
    assert m, err
    def f(i):
        return float(m[i].replace(",", ""))

    return {"prompt": int(m[1]), "prefill": f(3), "decoded": int(m[4]), "decode": f(6), "bytes": int(m[8].replace(",", ""))}


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_and_beam_search_equal_the_models_generate(kind, folders, capsys):
    folder, prompt = folders[kind], PROMPTS.get(kind, PROMPT)
    capsys.readouterr()
    assert main(["generate", str(folder), "--prompt", prompt, "--max-new-tokens", "6", "--temperature", "0"]) == 0
    io_ = capsys.readouterr()
    assert io_.out == prompt + _continuation(kind, folder, 6, do_sample=False) + "\n"
    f = _figures(io_.err)
    assert f["decoded"] == 5 and f["prefill"] > 0 and f["decode"] > 0 and f["bytes"] > 0
    assert main(["generate", str(folder), "--prompt", prompt, "--max-new-tokens", "5", "--num-beams", "3"]) == 0
    assert capsys.readouterr().out == prompt + _continuation(kind, folder, 5, num_beams=3, do_sample=False) + "\n"


@pytest.mark.parametrize("kind", ["linearized", "exported"])
def test_sampling_is_seeded_as_the_models_generate(kind, folders, capsys):
    folder, prompt = folders[kind], PROMPTS.get(kind, PROMPT)
    argv = ["generate", str(folder), "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0.9", "--seed", "4"]
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    want = _continuation(kind, folder, 8, do_sample=True, temperature=0.9, top_k=0, top_p=1.0, seed=4)
    assert out == prompt + want + "\n"
    assert main(argv) == 0 and capsys.readouterr().out == out


class _Writes(io.StringIO):
    """stdout that counts the writes."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, s):
        self.writes.append(s)
        return super().write(s)


def test_compile_gives_the_eager_text_and_prints_its_cost(folders, capsys):
    """--compile (seqmix.compile_decode) on a linearized folder (students in layers 0 and 2, the teacher's attention
    in layer 1, which stays eager): the same greedy text as eager, the compile's first call on stderr; a converted attention-only model compiles nothing; a seqmix run or a folder without a converted
    layer refuses it naming --compile."""
    folder = folders["linearized"]
    argv = ["generate", str(folder), "--prompt", PROMPT, "--max-new-tokens", "5", "--temperature", "0"]
    capsys.readouterr()
    assert main(argv) == 0
    eager = capsys.readouterr().out
    try:
        assert main([*argv, "--compile"]) == 0
        io_ = capsys.readouterr()
        assert io_.out == eager
        assert re.search(r"compile_decode: 2 layers compiled, 1 eager; first call [\d.]+ s", io_.err), io_.err
    finally:
        torch._dynamo.reset()
    argv = ["generate", str(folders["checkpoint"]), "--prompt", PROMPT, "--max-new-tokens", "2", "--compile"]
    assert main(argv) == 0  # a converted Llama: attention only, nothing to compile (its KV cache grows every step)
    assert "compile_decode: 0 layers compiled, 3 eager" in capsys.readouterr().err
    for kind, needle in (("run", "a seqmix run decodes through its own loop"), ("exported", "holds no converted or linearized")):
        argv = ["generate", str(folders[kind]), "--prompt", PROMPTS.get(kind, PROMPT), "--max-new-tokens", "2", "--compile"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "argument --compile" in err and needle in err, err


def test_tokens_are_streamed_as_they_are_made(folders, monkeypatch, capsys):
    """Streaming: the continuation arrives in one write per new word; --no-stream: in one write at the end."""
    argv = ["generate", str(folders["converted"]), "--prompt", PROMPT, "--max-new-tokens", "6", "--temperature", "0"]
    outs = {}
    for extra in ([], ["--no-stream"]):
        w = _Writes()
        monkeypatch.setattr(sys, "stdout", w)
        assert main(argv + extra) == 0
        monkeypatch.undo()
        outs[bool(extra)] = w
    assert outs[False].getvalue() == outs[True].getvalue()
    cont = [s for s in outs[False].writes if s not in (PROMPT, "\n")]
    words = outs[False].getvalue()[len(PROMPT):].split()
    assert len(cont) == len(words) >= 2  # one write per new word ([UNK]s print nothing)
    assert len([s for s in outs[True].writes if s not in (PROMPT, "\n")]) == 1


def test_the_state_of_students_stays_constant_and_attentions_grows(tmp_path, capsys):
    """A model whose every layer is a student holds the same bytes of state after 4 and after 100 new tokens; the
    teacher's KV caches grow (allocated bytes: past their first allocation)."""
    m = teacher(vocab=64)
    m.generation_config.eos_token_id = None  # every call decodes all its tokens
    save(linearize(m, mixer="gla", layers="all"), tmp_path / "students")
    m.save_pretrained(tmp_path / "teacher")
    size = {}
    for name in ("students", "teacher"):
        _tokenizer(tmp_path / name)
        for new in (4, 100):
            capsys.readouterr()
            assert main(["generate", str(tmp_path / name), "--prompt", PROMPT, "--max-new-tokens", str(new),
                         "--temperature", "0"]) == 0
            f = _figures(capsys.readouterr().err)
            assert f["decoded"] == new - 1
            size[name, new] = f["bytes"]
    assert size["students", 4] == size["students", 100]
    assert size["teacher", 100] > size["teacher", 4]


def _bad_folders(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    from transformers import OPTConfig, OPTForCausalLM

    OPTForCausalLM(OPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                             word_embed_proj_dim=16)).save_pretrained(tmp_path / "opt")
    from_transformers(_mamba2()).save_pretrained(tmp_path / "notok")
    from_transformers(_mamba2(vocab=8)).save_pretrained(tmp_path / "smallvocab")
    _tokenizer(tmp_path / "smallvocab")


@pytest.mark.parametrize("case,argv,needle", [
    ("nofolder", ["{tmp}/nowhere"], r"argument 'path': no such folder"),
    ("file", ["{tmp}/file.txt"], r"argument 'path': .* is a file"),
    ("notmodel", ["{tmp}/empty"], r"argument 'path': .* is not a model folder"),
    ("family", ["{tmp}/opt"], r"argument 'path': .*'opt' model .*unsupported family"),
    ("notokenizer", ["{tmp}/notok"], r"argument 'path': .* has no tokenizer"),
    ("vocab", ["{tmp}/smallvocab", "--prompt", "while birds sang"], r"argument '--prompt': .*outside the model's vocabulary"),
    ("unencodable", ["{run}", "--prompt", "the Z"], r"argument '--prompt': the tokenizer cannot encode .*not in the vocabulary"),
    ("empty", ["{conv}", "--prompt", ""], r"argument --prompt: the prompt is empty"),
    ("negative", ["{conv}", "--max-new-tokens", "-3"], r"argument --max-new-tokens: expected an integer >= 0"),
    ("temperature", ["{conv}", "--temperature", "-1"], r"argument --temperature"),
    ("top_p", ["{conv}", "--top-p", "0"], r"argument --top-p"),
    ("top_k", ["{conv}", "--top-k", "0"], r"argument --top-k"),
    ("beams", ["{conv}", "--num-beams", "0"], r"argument --num-beams"),
    ("beam_sampling", ["{conv}", "--num-beams", "2", "--temperature", "0.7"], r"argument --temperature: beam search"),
    ("samples", ["{conv}", "--num-samples", "0"], r"argument --num-samples"),
    ("prompt_file", ["{conv}", "--prompt-file", "{tmp}/missing.txt"], r"argument --prompt-file"),
    ("device", ["{conv}", "--device", "nodevice"], r"argument '--device'"),
    ("positions", ["{run}", "--prompt", "the", "--max-new-tokens", "40"], r"argument --max-new-tokens: .*max_seq_len = 16"),
])
def test_bad_input_is_one_line_naming_the_argument(case, argv, needle, folders, tmp_path, capsys):
    _bad_folders(tmp_path)
    argv = [a.format(tmp=tmp_path, run=folders["run"], conv=folders["converted"]) for a in argv]
    capsys.readouterr()
    assert main(["generate", *argv]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("seqmix generate:")]
    assert len(err) == 1 and re.search(needle, err[0]), err
    assert "Traceback" not in err[0]


@pytest.mark.parametrize("kind, line", [("linearized", "parameters, linearized: gla in 2 layers)"),
                                        ("converted", "parameters, converted)"), ("checkpoint", "parameters, converted)")])
def test_the_first_line_says_what_the_folder_holds(kind, line, folders, capsys):
    """stderr's first line: the model's class and size, and for a linearized folder which students sit in how many
    layers (the teacher's attention kept in layer 1 not counted)."""
    capsys.readouterr()
    assert main(["generate", str(folders[kind]), "--prompt", PROMPTS.get(kind, PROMPT), "--max-new-tokens", "1"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.endswith(line), first
