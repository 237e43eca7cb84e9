"""``seqmix generate PATH --prompt TEXT``: text from any model folder seqmix loads, streamed as it is made
(docs/generation.md), and the one generation path of the CLI (``seqmix lm generate`` runs it too).

What PATH may be, and how it is loaded:

* a seqmix run (``seqmix lm train``'s run folder: checkpoint.pt, config.json, tokenizer.json): its
  ``LanguageModel``, decoded by seqmix's own loop (``seqmix.models.generation``: prefill in each mixer's
  full-sequence mode, then one step per token through ``seqmix.Cache``);
* a transformers folder seqmix wrote or reads (config.json and weights): an exported seqmix model
  (``seqmix lm export --hf``, model type "seqmix": ``SeqmixForCausalLM``), a converted or linearized model
  (model type "seqmix_converted": ``seqmix.interop.load_converted``), or a checkpoint of a family seqmix
  converts (converted on load); decoded by transformers' ``generate()``, whose cache the converted mixers
  keep their state in (the mixers' step mode per token). Beam search (``--num-beams``) runs there too,
  for a run through ``SeqmixForCausalLM.wrap``.

The tokenizer is the folder's (tokenizer.json, with tokenizer_config.json when there is one) or the run's.
The prompt is printed, then the new text as each token is made (beam search: at the end, the best beam);
then, on stderr, the prefill's and the decoding's tokens/s and the bytes of the decoding state. Every
figure is measured in this call: the prefill is the time to the first token's logits, the decoding the
time per token after it (the printing excluded), the state the distinct tensor storages the cache holds
at the end (seqmix's Cache, transformers' cache object; allocated bytes, capacity included).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ._common import _add_import

#: the default number of new tokens (fewer where a learned position table ends sooner)
DEFAULT_NEW_TOKENS = 200
#: the default temperature of a sampled (not beam) generation
DEFAULT_TEMPERATURE = 0.8


def add_generation_options(p) -> None:
    """The options of a generation command (``seqmix generate`` and ``seqmix lm generate``)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="the prompt text (default: a newline)")
    src.add_argument("--prompt-file", default=None, help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"default {DEFAULT_NEW_TOKENS}, fewer when a learned position table ends sooner (an explicit value "
                        "past it is an error)")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"0 = greedy (default {DEFAULT_TEMPERATURE}; with --num-beams: beam search, no sampling)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens only")
    p.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of tokens of probability >= p")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (sample i: seed + i)")
    p.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (1: sample or greedy)")
    p.add_argument("--num-samples", type=int, default=1, help="samples of the same prompt (drawn one after the other)")
    p.add_argument("--no-stream", action="store_true", help="print each sample when it is complete")
    p.add_argument("--threads", type=int, default=None)


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate text from any model folder seqmix loads (a run, an exported, converted or "
                                        "linearized folder), streaming tokens as they are made; docs/generation.md")
    _add_import(p)
    p.add_argument("path", help="a seqmix run folder, or a transformers folder (exported, converted, linearized, or a "
                                "checkpoint of a family seqmix converts)")
    add_generation_options(p)
    p.add_argument("--device", default="cpu", help="torch device to run on (default cpu)")
    p.add_argument("--compile", action="store_true", help="compile the decoding step of every recurrent seqmix layer of a "
                   "converted or linearized folder first (seqmix.compile_decode: torch.compile, a few graphs per layer; its "
                   "first call's cost is printed)")


def _run_generate(args) -> int:
    _check_options(args)
    model, tok, what = load_for_generation(args.path, device=args.device)
    print(f"({what})", file=sys.stderr)
    return generate_text(model, tok, args)


# ------------------------------------------------------------------------------------------
# loading
# ------------------------------------------------------------------------------------------


@dataclass
class Text:
    """A tokenizer as the generation reads it: ``encode(text) -> ids``, ``decode(ids) -> text``, ``name``."""

    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    name: str


def seqmix_text(tok) -> Text:
    """A seqmix tokenizer (``seqmix.data.text.load_tokenizer``: byte, char, or a tokenizer.json)."""
    return Text(tok.encode, tok.decode, type(tok).__name__)


def _folder_text(folder: Path, argument: str) -> Text:
    """The folder's HuggingFace tokenizer: AutoTokenizer (tokenizer_config.json says how to call it: its BOS),
    else the bare tokenizer.json (PreTrainedTokenizerFast)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = None
    if (folder / "tokenizer_config.json").is_file():
        try:
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError, TypeError, KeyError):
            tok = None
    if tok is None and (folder / "tokenizer.json").is_file():
        try:
            tok = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001  (tokenizers raises its own exception types)
            raise ValueError(f"argument '{argument}': {str(folder)!r}: its tokenizer.json cannot be read ({e})") from None
    if tok is None:
        raise ValueError(f"argument '{argument}': {str(folder)!r} has no tokenizer (tokenizer.json): save the model's "
                         "tokenizer there (tokenizer.save_pretrained(folder))")
    return Text(lambda text: list(tok(text)["input_ids"]), lambda ids: tok.decode(ids, skip_special_tokens=True),
                type(tok).__name__)


def load_for_generation(path, *, device: str = "cpu", argument: str = "path"):
    """(model, Text, one line describing it) of ``path`` (module docstring): a seqmix LanguageModel for a run,
    a transformers causal LM for a transformers folder; on ``device``, eval mode."""
    import torch

    from ..train.checkpoint import CHECKPOINT
    from ..train.trainer import TOKENIZER

    p = Path(path).expanduser()
    if not p.exists():
        raise ValueError(f"argument '{argument}': no such folder {str(p)!r}")
    if not p.is_dir():
        raise ValueError(f"argument '{argument}': {str(p)!r} is a file; give a model folder (a seqmix run or a transformers "
                         "folder with config.json)")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"argument '--device': {device!r} is not a torch device (cpu, cuda, cuda:1, mps)") from None
    if (p / CHECKPOINT).is_file():
        from ..analysis.trained import load_run
        from ..data.text import load_tokenizer

        if not (p / TOKENIZER).is_file():
            raise ValueError(f"argument '{argument}': {str(p)!r} has no {TOKENIZER} (generate needs an `seqmix lm train` run)")
        try:
            config, model = load_run(p)
        except ValueError as e:
            raise ValueError(str(e).replace("argument 'run'", f"argument '{argument}'", 1)) from None
        return model.to(dev), seqmix_text(load_tokenizer(p / TOKENIZER)), f"seqmix run {config.run_id}: {config.name}"
    if not (p / "config.json").is_file():
        raise ValueError(f"argument '{argument}': {str(p)!r} is not a model folder: it has no config.json (a transformers or "
                         f"exported seqmix folder) and no {CHECKPOINT} (a seqmix run)")
    try:
        model_type = json.loads((p / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"argument '{argument}': {str(p / 'config.json')!r} is not a JSON config ({e})") from None
    if model_type == "seqmix":
        from ..hf import SeqmixForCausalLM

        model, what = SeqmixForCausalLM.from_pretrained(str(p)), "exported seqmix model"
    else:
        from ..interop.load import describe, load_converted

        model = load_converted(p, argument=argument)
        what = describe(model)
    return model.to(dev).eval(), _folder_text(p, argument), what


# ------------------------------------------------------------------------------------------
# generating
# ------------------------------------------------------------------------------------------


def _check_options(args) -> None:
    if args.num_samples < 1:
        raise ValueError(f"argument --num-samples: expected an integer >= 1, got {args.num_samples}")
    if args.num_beams < 1:
        raise ValueError(f"argument --num-beams: expected an integer >= 1, got {args.num_beams}")
    if args.max_new_tokens is not None and args.max_new_tokens < 0:
        raise ValueError(f"argument --max-new-tokens: expected an integer >= 0, got {args.max_new_tokens}")
    if args.temperature is not None and not args.temperature >= 0:
        raise ValueError(f"argument --temperature: expected a number >= 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"argument --top-k: expected an integer >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"argument --top-p: expected a number in (0, 1], got {args.top_p}")
    if args.num_beams > 1:
        if args.temperature:
            raise ValueError(f"argument --temperature: beam search (--num-beams {args.num_beams}) does not sample; "
                             "omit --temperature or pass 0")
        if args.top_k is not None or args.top_p is not None:
            raise ValueError("argument --top-k / --top-p: beam search (--num-beams) does not sample")
        if args.num_samples > 1:
            raise ValueError("argument --num-samples: beam search (--num-beams) gives one sequence; pass --num-samples 1")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"argument --threads: expected an integer >= 1, got {args.threads}")


def _prompt(args) -> str:
    if args.prompt_file is not None:
        path = Path(args.prompt_file)
        if not path.is_file():
            raise ValueError(f"argument --prompt-file: {str(path)!r} is not a file")
        try:
            prompt = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"argument --prompt-file: {str(path)!r} is not UTF-8 text") from None
    else:
        prompt = "\n" if args.prompt is None else args.prompt
    if not prompt:
        raise ValueError("argument --prompt: the prompt is empty (give at least one character)")
    return prompt


def _encode(tok: Text, prompt: str, vocab_size: int, argument: str) -> list[int]:
    try:
        ids = [int(i) for i in tok.encode(prompt)]
    except ValueError as e:
        raise ValueError(f"argument '{argument}': the tokenizer cannot encode the prompt: {e}") from None
    if not ids:
        raise ValueError(f"argument '{argument}': the prompt gives no tokens ({tok.name})")
    if max(ids) >= vocab_size:
        raise ValueError(f"argument '{argument}': the tokenizer ({tok.name}) gives token id {max(ids)}, outside the model's "
                         f"vocabulary (vocab_size = {vocab_size}): the folder's tokenizer is not the model's")
    return ids


def _is_seqmix_lm(model) -> bool:
    from ..models import LanguageModel

    return isinstance(model, LanguageModel)


def _position_limit(model) -> int | None:
    """The most tokens (prompt and new) a learned absolute position table allows: a LanguageModel's table (also
    inside an exported ``SeqmixForCausalLM``), or GPT-2's ``n_positions``; None where positions do not end (RoPE,
    ALiBi, recurrent mixers)."""
    lm = model if _is_seqmix_lm(model) else getattr(model, "model", None)
    if _is_seqmix_lm(lm):
        return lm.pos.num_embeddings if lm.pos is not None else None
    n = getattr(model.config, "n_positions", None)
    return int(n) if n else None


def _new_tokens(model, args, prompt_len: int) -> int:
    n_new = args.max_new_tokens
    limit = _position_limit(model)
    if n_new is None:
        n_new = DEFAULT_NEW_TOKENS
        if limit is not None and limit - prompt_len + 1 < n_new:
            n_new = max(limit - prompt_len + 1, 0)
            print(f"(at most {n_new} new tokens: the model's learned position table ends at max_seq_len = {limit})",
                  file=sys.stderr)
    total = prompt_len + max(n_new, 1) - 1
    if limit is not None and total > limit:
        raise ValueError(f"argument --max-new-tokens: the prompt ({prompt_len} tokens) plus {n_new} new tokens reach {total} "
                         f"positions, past the model's learned position table (max_seq_len = {limit}); shorten the prompt "
                         "or --max-new-tokens")
    return n_new


class _Printer:
    """Prints the continuation as tokens arrive: the text of prompt + new tokens past the prompt's own text (so a
    word-level tokenizer's spaces between the prompt and the new words are kept), the part not printed yet (a
    token that ends inside a UTF-8 character waits for the rest); keeps the time it spends (not decoding time)."""

    def __init__(self, tok: Text, prompt_ids: list[int], stream: bool):
        self.tok, self.stream = tok, stream
        self.prompt_ids = list(prompt_ids)
        self.skip = len(tok.decode(self.prompt_ids))
        self.new: list[int] = []
        self.shown = 0
        self.seconds = 0.0

    def __call__(self, tokens, final: bool = False) -> None:
        t0 = time.perf_counter()
        self.new.extend(int(t) for t in tokens.reshape(-1))
        if self.stream or final:
            text = self.tok.decode(self.prompt_ids + self.new)[self.skip:]
            if not final:
                text = text.rstrip("\ufffd")
            if len(text) > self.shown:
                sys.stdout.write(text[self.shown:])
                sys.stdout.flush()
                self.shown = len(text)
        self.seconds += time.perf_counter() - t0


class _Clock:
    """Timestamps of the generation steps: ``tick()`` once per new token, right after its logits are computed
    (before the printing); ``report`` turns them into prefill and decoding figures."""

    def __init__(self):
        self.start = time.perf_counter()
        self.ticks: list[float] = []
        self.printing: list[float] = []  # the printer's total time at each tick

    def tick(self, printing: float) -> None:
        self.ticks.append(time.perf_counter())
        self.printing.append(printing)

    def report(self, prompt_len: int, state_bytes: int | None) -> str:
        if not self.ticks:
            return "no token generated"
        pre = self.ticks[0] - self.start
        out = f"prefill: {prompt_len} tokens in {_num(1e3 * pre)} ms ({_num(prompt_len / pre)} tokens/s)"
        n = len(self.ticks) - 1
        if n:
            dec = (self.ticks[-1] - self.ticks[0]) - (self.printing[-1] - self.printing[0])
            out += f"; decode: {n} tokens in {_num(1e3 * dec)} ms ({_num(n / dec)} tokens/s, {_num(1e3 * dec / n)} ms/token)"
        if state_bytes is not None:
            out += f"; cache: {state_bytes:,} bytes ({state_bytes / 2**20:.3f} MiB)"
        else:
            out += "; cache: not returned by the model's generate()"
        return out


def _num(v: float) -> str:
    """A figure with 3 significant digits (1,234.5 above 100)."""
    return f"{v:,.1f}" if v >= 100 else f"{v:.3g}"


def state_nbytes(state) -> int:
    """Bytes of the distinct tensor storages reachable from a decoding state (seqmix's RaggedState / Cache and
    KVCache buffers; transformers' cache object, its layers and the seqmix state kept on them): allocated memory,
    each storage once (a stride-0 view counts its one element's storage)."""
    import torch
    from torch import nn

    storages: set[tuple[int, str]] = set()
    seen: set[int] = set()
    total = 0
    todo: list[Any] = [state]
    while todo:
        o = todo.pop()
        if id(o) in seen or o is None or isinstance(o, (str, bytes, int, float, bool, nn.Module, type)):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            key = (st.data_ptr(), str(o.device))
            if key not in storages:
                storages.add(key)
                total += st.nbytes()
        elif isinstance(o, dict):
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set)):
            todo.extend(o)
        elif hasattr(o, "__dict__"):
            todo.extend(vars(o).values())
    return total


def generate_text(model, tok: Text, args, *, argument: str = "--prompt") -> int:
    """Prints the prompt and ``args.num_samples`` continuations (streamed unless ``args.no_stream``), each
    followed on stderr by its prefill / decode tokens/s and state bytes. ``model``: a seqmix LanguageModel (its
    own loop; beam search through ``SeqmixForCausalLM.wrap``) or a transformers causal LM (``generate()``)."""
    import torch

    _check_options(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt = _prompt(args)
    vocab = int(model.config.vocab_size)
    ids = _encode(tok, prompt, vocab, "--prompt-file" if args.prompt_file is not None else argument)
    n_new = _new_tokens(model, args, len(ids))
    if getattr(args, "compile", False) and _is_seqmix_lm(model):
        raise ValueError("argument --compile: a seqmix run decodes through its own loop; --compile compiles the decoding "
                         "step of a converted or linearized transformers folder")
    if args.num_beams > 1 and _is_seqmix_lm(model):
        try:
            from ..hf import SeqmixForCausalLM
        except ImportError as e:
            raise ValueError(f"argument --num-beams: beam search runs through transformers' generate(), which needs the "
                             f"optional extra 'hf' (pip install 'seqmix[hf]'): {e}") from None
        model = SeqmixForCausalLM.wrap(model).eval()
    temperature = 0.0 if args.num_beams > 1 else (DEFAULT_TEMPERATURE if args.temperature is None else args.temperature)
    x = torch.tensor([ids], device=_device(model))
    if getattr(args, "compile", False):
        _compile(model, x)
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        sys.stdout.write(prompt)
        printer = _Printer(tok, ids, stream=not args.no_stream and args.num_beams == 1)
        clock = _Clock()
        if _is_seqmix_lm(model):
            holder: list = []
            model.generate(x, n_new, temperature=temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed + i,
                           callback=lambda t: (clock.tick(printer.seconds), printer(t)), on_prefill=holder.append)
            state = holder[0] if holder else None
        else:
            state = _hf_generate(model, x, n_new, temperature, args, args.seed + i, clock, printer)
        printer(torch.tensor([], dtype=torch.long), final=True)
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(clock.report(len(ids), state_nbytes(state) if state is not None else None), file=sys.stderr)
    return 0


def _compile(model, x) -> None:
    """``seqmix.compile_decode`` on a converted or linearized model (``--compile``), its first call on the prompt's first
    16 tokens (a sliding-window layer: compile_decode runs its steps from the first token through a full window); the
    cost on stderr. A model without a converted layer: a ValueError naming --compile."""
    from ..interop import compile_decode

    try:
        info = compile_decode(model, prompt=x[:, :16])
    except ValueError as e:
        raise ValueError(f"argument --compile: {e}") from None
    print(f"(compile_decode: {info['compiled']} layers compiled, {info['eager']} eager; first call "
          f"{info['first_call_s']:.1f} s)", file=sys.stderr)


def _device(model):
    import torch

    p = next(iter(model.parameters()), None)
    return p.device if p is not None else torch.device("cpu")


def _hf_generate(model, x, n_new: int, temperature: float, args, seed: int, clock: _Clock, printer: _Printer):
    """transformers' generate() of ``n_new`` tokens after ``x`` [1, T]: greedy, sampled (seeded) or beam search;
    each step's tokens to ``printer`` (a streamer; beam search: the best beam at the end), each step timed by a
    logits processor. Returns the cache object generate() hands back (None when it hands none back)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList
    from transformers.generation.streamers import BaseStreamer

    from ..hf.modeling import output_cache

    class Tick(LogitsProcessor):
        def __call__(self, input_ids, scores):
            clock.tick(printer.seconds)
            return scores

    class Stream(BaseStreamer):
        def __init__(self):
            self.prompt_seen = False

        def put(self, value):
            if not self.prompt_seen:  # generate() first puts the prompt
                self.prompt_seen = True
                return
            printer(value)

        def end(self):
            pass

    gc = model.generation_config
    pad = gc.pad_token_id if gc.pad_token_id is not None else (gc.eos_token_id if isinstance(gc.eos_token_id, int) else 0)
    kw: dict[str, Any] = dict(max_new_tokens=n_new, attention_mask=torch.ones_like(x), pad_token_id=pad,
                              logits_processor=LogitsProcessorList([Tick()]), return_dict_in_generate=True)
    if args.num_beams > 1:
        kw.update(num_beams=args.num_beams, do_sample=False)
    elif temperature > 0:
        kw.update(do_sample=True, temperature=temperature, top_k=args.top_k or 0, top_p=args.top_p or 1.0)
    else:
        kw.update(do_sample=False)
    if args.num_beams == 1:
        kw["streamer"] = Stream()
    torch.manual_seed(seed)
    if n_new == 0:
        return None
    with torch.no_grad():
        out = model.generate(x, **kw)
    if args.num_beams > 1:
        printer(out.sequences[0, x.shape[1]:])
    return output_cache(out)


COMMANDS = {"generate": (_add_generate, _run_generate)}
