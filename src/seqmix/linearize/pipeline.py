"""The whole linearization of a checkpoint, stage by stage, resumable: what `seqmix linearize` runs.

    run(LinearizeConfig(hf="path/to/llama", mixer="gla", corpus="tinyshakespeare", tokenizer="byte",
                        transfer_tokens=200_000, finetune_tokens=400_000, out="runs/lin"))

OUT holds, when done:

    config.json, model.safetensors   the linearized model (``seqmix.interop.load_converted(OUT)``)
    tokenizer.json                   the tokenizer it was trained with, and tokenizer_config.json
                                     (PreTrainedTokenizerFast: what ``seqmix generate OUT`` reads)
    metrics.json                     per stage: validation loss (nats, bits per byte) of teacher and
                                     student, per-layer transfer residuals, state floats per token
    report.md, report.html           the same as tables (the HTML with maps.png embedded)
    maps.png                         the teacher's and the students' maps on one validation text
    stages/transfer/                 stage 1's model and done.json (kept: a re-run skips the stage)
    stages/transfer_run/progress.pt  while stage 1 runs: its progress every ``transfer_save_every``
                                     steps (an interrupted stage 1 resumes there; removed when done)
    stages/finetune/                 stage 2's model; stages/finetune_run/ the trainer's run folder
                                     (its checkpoint: an interrupted stage 2 resumes there)

A stage whose folder holds ``done.json`` for the same settings is not run again. ``device`` and
``precision`` apply to both stages and the evaluations; ``parallel="ddp"`` or ``"fsdp"`` (under
torchrun) makes the ranks > 0 wait for rank 0's stage 1 and join stage 2 (the Trainer's DDP, or FSDP2
with one unit per transformers decoder layer: :meth:`seqmix.interop.train.HFCausalLM.fsdp_units`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import torch

from .._checks import check_device, output_dir
from .recipes import DEFAULT_RECIPE, MATCHES, METHOD_FIELDS, RECIPES, recipe_settings

__all__ = ["LinearizeConfig", "run", "evaluate_lm", "evaluate_length", "state_floats_per_token"]

STAGES = ("transfer", "finetune")


#: the default recipe's settings: the defaults of LinearizeConfig's method fields (one source: recipes.py)
_D = RECIPES[DEFAULT_RECIPE].settings
#: the token budget of a run that names none (split transfer_share : 1 - transfer_share between the stages)
DEFAULT_TOKENS = 300_000


class LinearizeConfig(BaseModel):
    """Every setting of a linearization run (the CLI's flags).

    ``recipe`` names a preset of the method fields (:mod:`seqmix.linearize.recipes`); a field given
    explicitly overrides the recipe's value. The default recipe's values are the fields' defaults.
    The budget: ``tokens`` split ``transfer_share`` : 1 − ``transfer_share`` between stage 1 and
    stage 2, unless ``transfer_tokens`` / ``finetune_tokens`` are given themselves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recipe: str = Field(DEFAULT_RECIPE, description="a recipe of seqmix.linearize.recipes: its method fields are the defaults")
    hf: str = Field(description="the teacher: a transformers checkpoint folder (or a hub id in the local cache)")
    mixer: str = Field(_D["mixer"], description="the student: a registered mixer the init table covers")
    mixer_config: dict[str, Any] = Field(default_factory=lambda: dict(_D["mixer_config"]), description="the student's config fields")
    layers: str = Field(_D["layers"], description="'all', 'auto:K', 'uniform:K' or 'uniform:P%' (K softmax layers kept, evenly "
                        "spaced), or comma-separated layer indices")
    group_kv: bool = Field(_D["group_kv"], description="a teacher with grouped-query attention keeps its kv heads in the students "
                           "(their k and v rows tied per group: fewer weights to read per decoded token)")
    init: Literal["attention", "random", "random_hf"] = Field(
        _D["init"], description="student init: from the attention weights, its own, or its own with the Linear weights drawn "
        "as transformers draws the host model's (normal(0, initializer_range))")
    match: str = Field(_D["match"], description="stage 1's loss, or comma-separated losses run one after the other: output, phi, "
                       "both, block")
    transfer_split: tuple[float, ...] | None = Field(
        _D["transfer_split"], description="stage 1's steps split between its losses in this ratio (None: equal shares)")
    stages: tuple[str, ...] = Field(_D["stages"], description="the stages to run, in order: transfer, finetune")
    corpus: str = Field("tinyshakespeare", description="the text: a built-in corpus name or a path")
    tokenizer: str = Field("byte", description="byte, char, bpe, a tokenizer.json, or 'hf' (the teacher's tokenizer.json)")
    seq_len: int = Field(128, gt=0, description="tokens per training window")
    batch_size: int = Field(16, gt=0, description="windows per batch")
    tokens: int = Field(DEFAULT_TOKENS, ge=0, description="the token budget of both stages together")
    transfer_share: float = Field(_D["transfer_share"], ge=0, le=1, description="stage 1's share of ``tokens``")
    transfer_tokens: int = Field(description="stage 1's token budget (default: transfer_share · tokens)", ge=0)
    transfer_lr: float = Field(_D["transfer_lr"], gt=0, description="stage 1's peak learning rate")
    transfer_trainable: Literal["all", "new", "block"] = Field(
        _D["transfer_trainable"], description="stage 1's trainable set: every student parameter, 'new': only what the init table "
        "did not copy from the teacher (feature maps, decays, gates, norms, convolutions; LoLCATs' stage 1), or 'block': the "
        "students and the rest of their decoder blocks (MLP, norms)")
    transfer_save_every: int = Field(50, gt=0, description="stage 1 saves its progress every this many steps (a killed run resumes)")
    phi_len: int = Field(512, gt=0, description="chunk length of the Φ loss")
    finetune_tokens: int = Field(description="stage 2's token budget (default: the rest of ``tokens``)", ge=0)
    finetune_lr: float = Field(_D["finetune_lr"], gt=0, description="stage 2's peak learning rate")
    lora_rank: int = Field(_D["lora_rank"], ge=0, description="LoRA rank (0: no LoRA)")
    lora_targets: Literal["kept", "students", "all"] = Field(
        _D["lora_targets"], description="what LoRA adapts: the Linears kept from the teacher (MLPs, softmax layers kept), the "
        "students' projections copied from q/k/v/o, or both")
    finetune_trainable: Literal["all", "students", "lora"] | None = Field(
        _D["finetune_trainable"], description="stage 2's trained weights besides the LoRA adapters: every weight LoRA does not "
        "wrap ('all'), the students' ('students'), none ('lora'); None: 'students' with LoRA, 'all' without")
    kd: float = Field(_D["kd"], ge=0, description="weight of KL(teacher ‖ student) in stage 2")
    ce: float = Field(_D["ce"], ge=0, description="weight of the next-token cross-entropy in stage 2")
    length_multiples: tuple[int, ...] = Field(
        (1, 4, 16), description="the final model and the teacher are evaluated on windows of the largest of these multiples of "
        "seq_len that the validation text holds, the loss reported per band of positions (() : no length evaluation)")
    eval_batches: int = Field(8, gt=0, description="validation batches per evaluation")
    seed: int = Field(0, ge=0)
    threads: int | None = Field(None, gt=0, description="torch CPU threads")
    device: str = Field("cpu", description="torch device of both stages and the evaluations (cpu, cuda, cuda:0, ...)")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="autocast dtype of the forwards of both stages")
    parallel: Literal["none", "ddp", "fsdp"] = Field("none", description="stage 2 under torchrun: DDP or FSDP2 over the ranks (the Trainer's)")
    out: str = Field(description="the output folder")

    @model_validator(mode="before")
    @classmethod
    def _recipe(cls, data):
        """The recipe's method fields under the ones given; the budget split into the stages' tokens."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        given = {k: data[k] for k in METHOD_FIELDS if k in data}
        data.update(recipe_settings(data.get("recipe", DEFAULT_RECIPE), given))
        stages = data["stages"]
        if isinstance(stages, str):
            stages = tuple(s.strip() for s in stages.split(",") if s.strip())
            data["stages"] = stages
        tokens = data.get("tokens", DEFAULT_TOKENS)
        if isinstance(tokens, int) and isinstance(data.get("transfer_share"), (int, float)):
            if data.get("transfer_tokens") is None:
                data["transfer_tokens"] = round(data["transfer_share"] * tokens) if "transfer" in stages else 0
            if data.get("finetune_tokens") is None and isinstance(data["transfer_tokens"], int):
                data["finetune_tokens"] = max(0, tokens - data["transfer_tokens"]) if "finetune" in stages else 0
        return data

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v, "argument --device")

    @field_validator("match")
    @classmethod
    def _match(cls, v: str) -> str:
        parts = [m.strip() for m in v.split(",")]
        bad = [m for m in parts if m not in MATCHES]
        if bad or not parts:
            raise ValueError(f"match: expected one of {', '.join(MATCHES)} or several of them comma-separated, got {v!r}")
        return ",".join(parts)

    @property
    def matches(self) -> list[str]:
        """Stage 1's losses, in the order they run."""
        return self.match.split(",")

    @model_validator(mode="after")
    def _check(self):
        bad = [s for s in self.stages if s not in STAGES]
        if bad or len(set(self.stages)) != len(self.stages) or list(self.stages) != sorted(self.stages, key=STAGES.index):
            raise ValueError(f"stages: expected a subset of {','.join(STAGES)} in that order, got {','.join(self.stages)}")
        if self.layers.startswith("auto:") and "transfer" not in self.stages:
            raise ValueError(f"layers: {self.layers!r} ranks the layers by stage 1's residual: include the transfer stage")
        if self.transfer_trainable == "new" and self.init != "attention":
            raise ValueError(f"transfer_trainable: 'new' freezes the weights copied from the teacher, and init={self.init!r} copies "
                             "none: use 'all' (or init='attention')")
        if self.transfer_split is not None and (len(self.transfer_split) != len(self.matches)
                                                or any(not v > 0 for v in self.transfer_split)):
            raise ValueError(f"transfer_split: expected {len(self.matches)} positive shares, one per loss of match={self.match!r}, "
                             f"got {self.transfer_split}")
        if self.finetune_trainable == "lora" and self.lora_rank == 0:
            raise ValueError("finetune_trainable: 'lora' trains only the LoRA adapters, and lora_rank is 0 (no LoRA): give a rank "
                             "or another trainable set")
        if self.lora_targets != "kept" and self.lora_rank == 0 and "lora_targets" in self.model_fields_set:
            raise ValueError(f"lora_targets: {self.lora_targets!r} needs lora_rank > 0")
        if any(m < 1 for m in self.length_multiples):
            raise ValueError(f"length_multiples: expected positive multiples of seq_len, got {self.length_multiples}")
        if "finetune" in self.stages and self.ce == 0 and self.kd == 0:
            raise ValueError("ce, kd: stage 2 needs a loss: the cross-entropy weight (ce) or the KD weight (kd) must be > 0")
        return self

    @property
    def trainable(self) -> str:
        """Stage 2's trainable set with the default resolved ('students' with LoRA, 'all' without)."""
        if self.finetune_trainable is not None:
            return self.finetune_trainable
        return "students" if self.lora_rank else "all"

    def transfer_steps(self) -> list[int]:
        """Stage 1's optimizer steps per loss of :attr:`matches` (its tokens over batch × seq_len, split by transfer_split)."""
        total = max(1, -(-self.transfer_tokens // (self.batch_size * self.seq_len))) if self.transfer_tokens else 0
        n = len(self.matches)
        shares = self.transfer_split or (1.0,) * n
        out = [int(total * s / sum(shares)) for s in shares]
        for i in sorted(range(n), key=lambda i: -shares[i])[: total - sum(out)]:  # the rounding's remainder: largest shares first
            out[i] += 1
        return out

    def stage_key(self, stage: str) -> str:
        """The settings a stage's result depends on (a finished stage with another key is run again)."""
        common = ["hf", "mixer", "mixer_config", "layers", "init", "match", "corpus", "tokenizer", "seq_len", "batch_size",
                  "transfer_tokens", "transfer_lr", "phi_len", "seed", "stages"]
        if stage == "finetune":
            common += ["finetune_tokens", "finetune_lr", "lora_rank", "kd"]
        fields = {k: getattr(self, k) for k in common}
        # the fields below enter the key only away from their neutral value, so that a key names only what matters
        neutral = {"transfer_trainable": "all", "precision": "fp32", "transfer_split": None, "group_kv": False}
        if stage == "finetune":
            neutral.update(ce=1.0, lora_targets="kept", finetune_trainable=None)
        for k, default in neutral.items():
            if getattr(self, k) != default:
                fields[k] = getattr(self, k)
        if stage == "finetune" and "finetune_trainable" in fields and self.finetune_trainable == ("students" if self.lora_rank else "all"):
            del fields["finetune_trainable"]  # the value None resolves to: the same run
        blob = json.dumps(fields, sort_keys=True, default=list)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------


def state_floats_per_token(model, seq_len: int) -> dict:
    """Decoding state of ``model`` at ``seq_len`` tokens, in floats per sequence: the students'
    recurrent states (constant) and the softmax layers' KV caches (growing with the tokens)."""
    from ..interop import InteropMixer
    from .api import attention_layers

    cfg = model.config
    fixed, kv = 0, 0
    for _, path in attention_layers(model).items():
        m = model.get_submodule(path)
        if isinstance(m, InteropMixer) and m.mixer.registry_name != "softmax_attention":
            fixed += m.mixer.state_size(seq_len)
        else:
            kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            kv += 2 * kv_heads * head_dim
    return {"recurrent_floats": fixed, "kv_floats_per_token": kv, "floats_at_seq_len": fixed + kv * seq_len,
            "seq_len": seq_len}


def decode_tokens_per_s(model, *, prompt: int = 16, new: int = 64, vocab: int | None = None) -> float:
    """Greedy ``generate()`` speed of ``model`` (new tokens per second, batch 1, after one warm-up call):
    the students decode through their recurrent state, the softmax layers through their KV cache."""
    vocab = vocab or int(model.config.vocab_size)
    ids = (torch.arange(1, prompt + 1)[None] % vocab).to(next(model.parameters()).device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        model.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        t0 = time.perf_counter()
        model.generate(ids, **kw)
    return new / (time.perf_counter() - t0)


def evaluate_lm(model, test, eval_batches: int, trainer=None, *, device: str = "cpu", precision: str = "fp32") -> dict:
    """Validation loss (nats / token), bits per byte and perplexity of a transformers causal LM on the
    evaluation windows ``test``: the trainer's evaluation (``trainer``: a :class:`seqmix.train.Trainer`,
    by default one for a corpus run on ``device`` at ``precision``), through :class:`~seqmix.interop.train.HFCausalLM`."""
    from ..interop.train import HFCausalLM

    trainer = trainer or _evaluator(model, test, device, precision)
    ev = trainer.evaluate(HFCausalLM(model, None), test, max_batches=eval_batches)
    return {"loss": ev["loss"], "bpb": ev.get("bpb"), "ppl": ev.get("ppl")}


def evaluate_length(models: dict, corpus, multiples=(1, 4, 16), *, windows: int = 16, batch_size: int = 4,
                    device: str = "cpu", precision: str = "fp32") -> dict:
    """The next-token loss of each of ``models`` ({name: transformers causal LM}) per band of positions, on
    validation windows of the largest multiple of ``corpus.seq_len`` in ``multiples`` that the validation
    text holds (at most ``windows`` windows, the same for every model): bands [0, T), [T, 4T), [4T, 16T) for
    multiples (1, 4, 16) — a causal model's loss in the band [0, T) is what it scores in windows of T.
    Returns {"window": L, "windows": n, "bands": ["0-128", ...], "loss": {name: [loss per band]}};
    {} when not even one window of T fits."""
    from ..data import build_data
    from ..train.trainer import autocast

    T = corpus.seq_len
    for m in sorted(set(multiples), reverse=True):
        try:
            _, test = build_data(corpus.model_copy(update={"eval_seq_len": m * T, "eval_batch_size": batch_size}))
        except ValueError:  # the validation text is shorter than m·T
            continue
        batches = [b for _, b in zip(range(-(-windows // batch_size)), test.batches())]
        if batches:
            break
    else:
        return {}
    edges = [e * T for e in sorted(set(multiples)) if e <= m]
    edges = [0] + edges
    dev = torch.device(device)
    out = {}
    for name, model in models.items():
        total = torch.zeros(len(edges) - 1, dtype=torch.float64)
        count = 0
        model.eval()
        with torch.no_grad(), autocast(precision, dev):
            for b in batches:
                logits = model(input_ids=b.inputs.to(dev), use_cache=False).logits.float()
                ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.labels.to(dev), reduction="none")  # [B, L]
                for i in range(len(edges) - 1):
                    total[i] += float(ce[:, edges[i]:edges[i + 1]].mean()) * ce.shape[0]
                count += ce.shape[0]
        out[name] = [float(v / count) for v in total]
    return {"window": m * T, "windows": sum(b.inputs.shape[0] for b in batches),
            "bands": [f"{edges[i]}-{edges[i + 1]}" for i in range(len(edges) - 1)], "loss": out}


def evaluate_recall(models: dict, corpus, distance: int | None = None, *, windows: int = 16, batch_size: int = 4,
                    device: str = "cpu", precision: str = "fp32") -> dict:
    """Recall at a distance: what each of ``models`` ({name: transformers causal LM}) gains from text it saw
    ``distance`` tokens before. Each validation window W of T = ``corpus.seq_len`` tokens becomes
    W[0:d] + W[0:T−d] (d = ``distance``, default 5T/8: 80 at T = 128, beyond a 64-token window even for the
    token after the match, which an induction head reads): the repeat's tokens are the window's first T − d
    tokens again, each d positions after its first occurrence. ``first``: the next-token loss on the first
    occurrence (positions 0 .. T−d−2), ``repeat``: on the same targets in the repeat (positions d .. T−2),
    ``gain`` = first − repeat (nats): near 0 for a model that holds nothing from d tokens back (a softmax
    window shorter than d, apart from what the positions themselves change), large for attention over the
    whole window (copying). ``distance`` in [T/2, T − 2]: a shorter one would score repeats as first
    occurrences. Returns {"distance": d,
    "windows": n, "loss": {name: {"first", "repeat", "gain"}}}; {} when no validation window of T fits."""
    from ..data import build_data
    from ..train.trainer import autocast

    T = corpus.seq_len
    d = 5 * T // 8 if distance is None else int(distance)
    if not -(-T // 2) <= d <= T - 2:  # below T/2 the repeat would reach tokens that are themselves repeats
        raise ValueError(f"distance: expected seq_len/2 <= distance <= seq_len - 2 ({-(-T // 2)} .. {T - 2} at seq_len {T}), "
                         f"got {d}")
    try:
        _, test = build_data(corpus.model_copy(update={"eval_seq_len": T, "eval_batch_size": batch_size}))
    except ValueError:
        return {}
    batches = [b.inputs for _, b in zip(range(-(-windows // batch_size)), test.batches())]
    batches = [w[:max(windows - i * batch_size, 0)] for i, w in enumerate(batches)]  # exactly ``windows`` of them
    batches = [w for w in batches if w.shape[0]]
    if not batches:
        return {}
    dev = torch.device(device)
    out = {}
    for name, model in models.items():
        first = repeat = 0.0
        count = 0
        model.eval()
        with torch.no_grad(), autocast(precision, dev):
            for w in batches:
                ids = torch.cat([w[:, :d], w[:, :T - d]], dim=1).to(dev)  # [B, T]
                logits = model(input_ids=ids, use_cache=False).logits.float()
                ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
                first += float(ce[:, :T - d - 1].mean()) * ids.shape[0]  # targets ids[1 .. T-d-1]
                repeat += float(ce[:, d:].mean()) * ids.shape[0]  # the same targets, d positions later
                count += ids.shape[0]
        out[name] = {"first": first / count, "repeat": repeat / count, "gain": (first - repeat) / count}
    return {"distance": d, "windows": sum(w.shape[0] for w in batches), "loss": out}


def _evaluator(model, test, device: str = "cpu", precision: str = "fp32"):
    """A Trainer for evaluation only (a corpus run config with the model's sizes)."""
    from ..data import CorpusConfig
    from ..models import ModelConfig
    from ..train import Trainer
    from ..train.config import TrainConfig, make_run_config

    c = model.config
    run = make_run_config(data=CorpusConfig(seq_len=test.seq_len, batch_size=test.batch_size),
                          model=ModelConfig(mixer="softmax_attention", d_model=int(c.hidden_size), n_layers=int(c.num_hidden_layers),
                                            vocab_size=max(int(c.vocab_size), 256), positions="none"),
                          train=TrainConfig(max_steps=1, device=device, precision=precision))
    return Trainer(run, progress=False)


# ------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------


def _say(console, msg: str) -> None:
    if console is not None:
        console.print(msg, markup=False, highlight=False)


def _corpus(cfg: LinearizeConfig, vocab_size: int):
    from ..data import CorpusConfig
    from ..interop.train import hf_tokenizer

    tok = cfg.tokenizer
    if tok == "hf":
        tok = hf_tokenizer(cfg.hf)
        if tok == "byte":
            raise ValueError(f"argument --tokenizer: 'hf' needs a tokenizer.json in the teacher's folder {cfg.hf!r}")
    corpus = CorpusConfig(corpus=cfg.corpus, tokenizer=tok, seq_len=cfg.seq_len, batch_size=cfg.batch_size, seed=cfg.seed)
    if corpus.vocab_size > vocab_size:
        raise ValueError(f"argument --tokenizer: {cfg.tokenizer!r} gives token ids up to {corpus.vocab_size - 1}, but the "
                         f"teacher's vocabulary has {vocab_size} entries (vocab_size): use the tokenizer the teacher was "
                         "trained with")
    return corpus


def _done(folder: Path, key: str) -> dict | None:
    f = folder / "done.json"
    if not f.is_file():
        return None
    blob = json.loads(f.read_text())
    return blob if blob.get("key") == key else None


def _save(model, folder: Path) -> None:
    from .api import save

    save(model, folder)


def _save_tokenizer(corpus, folder: Path) -> None:
    """The tokenizer the model was trained with (the corpus'), saved into ``folder`` as a PreTrainedTokenizerFast
    (tokenizer.json, tokenizer_config.json): what `seqmix generate OUT` and AutoTokenizer read."""
    from ..data.text import corpus_tokenizer
    from ..hf.tokenizer import to_hf_tokenizer

    to_hf_tokenizer(corpus_tokenizer(corpus)).save_pretrained(str(folder))


def _rank() -> int:
    """This process's rank under torchrun (0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


def _wait_for(folder: Path, key: str, what: str, timeout: float = 24 * 3600.0) -> None:
    """A rank > 0 of a DDP run waits for rank 0 to finish ``folder`` (stage 1 runs on rank 0 alone)."""
    t0 = time.monotonic()
    while _done(folder, key) is None:
        if time.monotonic() - t0 > timeout:
            raise ValueError(f"parallel: rank {_rank()} waited {timeout:.0f} s for rank 0 to finish {what} ({folder})")
        time.sleep(2.0)


def run(cfg: LinearizeConfig, *, console=None, progress: bool = True,
        on_transfer_step: Callable[[int, dict], None] | None = None) -> dict:
    """Runs the stages of ``cfg`` (module docstring); returns metrics.json's content. ``on_transfer_step(step,
    record)``: called as stage 1 logs (every 10 steps; stage 1 saves its progress every
    ``cfg.transfer_save_every`` steps, so an interrupted run resumes there). Under torchrun with
    ``parallel="ddp"`` or ``"fsdp"``, rank 0 runs everything and the other ranks join stage 2 only (they return {})."""
    from ..data import build_data
    from ..interop.load import load_converted, load_transformers
    from .api import attention_layers, keep_softmax, linearize, parse_layers, students
    from .report import write_report
    from .attention_transfer import residuals, transfer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    teacher = load_transformers(cfg.hf, argument="--hf")
    n_attn = len(attention_layers(teacher))
    parse_layers(cfg.layers, n_attn)  # --layers checked before anything runs
    from ..mixers.base import mixer_entry

    mixer_entry(cfg.mixer)
    from .init import student_init

    student_init(cfg.mixer)
    device = torch.device(cfg.device)
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"argument --device: {cfg.device!r} is not available here ({torch.cuda.device_count()} CUDA devices)")
    if cfg.precision != "fp32":
        from ..train.distributed import check_precision

        try:
            check_precision(cfg.precision, device)
        except ValueError as e:
            raise ValueError(f"argument --precision: {e}") from None
    corpus = _corpus(cfg, int(teacher.config.vocab_size))
    train, test = build_data(corpus)
    out = output_dir(cfg.out, "--out")  # after the checks: bad input leaves no folder
    stage_dir = out / "stages"
    source = stage_dir / ("transfer" if "transfer" in cfg.stages else "init")
    if cfg.parallel != "none" and _rank() != 0:  # the other ranks: stage 2's data-parallel workers only
        _wait_for(source, cfg.stage_key(source.name), "stage 1" if source.name == "transfer" else "the initial model")
        if "finetune" in cfg.stages and _done(stage_dir / "finetune", cfg.stage_key("finetune")) is None:
            _finetune(cfg, source, teacher.to(device), corpus, stage_dir / "finetune", cfg.stage_key("finetune"), None, False)
        return {}
    teacher.to(device)

    def evaluate(model):
        return evaluate_lm(model, test, cfg.eval_batches, device=cfg.device, precision=cfg.precision)

    def reload(folder: Path):
        model = load_converted(folder, argument="--out")
        return model.to(device).eval()

    metrics: dict[str, Any] = {"config": cfg.model_dump(mode="json"), "stages": {}}
    t_eval = evaluate(teacher)
    metrics["teacher"] = {**t_eval, "state": state_floats_per_token(teacher, cfg.seq_len),
                          "decode_tokens_per_s": decode_tokens_per_s(teacher)}
    _say(console, f"teacher: val loss {t_eval['loss']:.4f} nats, {t_eval['bpb']:.4f} bits/byte")

    current = None  # the folder of the last finished stage's model
    # -- stage 0: the linearized model at init ------------------------------------------------
    torch.manual_seed(cfg.seed)
    lin = linearize(teacher, mixer=cfg.mixer, layers=cfg.layers, init=cfg.init, group_kv=cfg.group_kv, **cfg.mixer_config).to(device)
    auto = lin.seqmix_linearize["auto"]
    held_out = [b.inputs.to(device) for _, b in zip(range(2), test.batches())]
    metrics["init"] = evaluate(lin)
    res_match = cfg.matches[-1]  # the residual auto:K ranks: stage 1's last loss
    res_before = residuals(lin, teacher, held_out, match=res_match, phi_len=cfg.phi_len)
    _say(console, f"init ({cfg.mixer}, {cfg.init}): val loss {metrics['init']['loss']:.4f} nats")

    # -- stage 1: attention transfer ----------------------------------------------------------
    if "transfer" in cfg.stages:
        folder = stage_dir / "transfer"
        key = cfg.stage_key("transfer")
        done = _done(folder, key)
        if done is None:
            parts = cfg.transfer_steps()  # steps per loss of cfg.matches, run one after the other
            steps = sum(parts)
            t0 = time.perf_counter()
            bar = _bar(progress, console, "stage 1 transfer", steps)
            hist, offset = [], 0
            progress_files = [stage_dir / "transfer_run" / (f"progress{i}.pt" if i else "progress.pt") for i in range(len(parts))]
            resumed = any(f.is_file() for f in progress_files)  # (a file of other settings is not used: transfer checks its key)
            try:
                for i, (match, n) in enumerate(zip(cfg.matches, parts)):
                    def on_step(step, rec, offset=offset, match=match):
                        if bar:
                            bar[0].update(bar[1], completed=offset + step, info=f"{match} loss {rec['loss']:.4g}")
                        if on_transfer_step is not None:
                            on_transfer_step(offset + step, rec)

                    hist += transfer(lin, teacher, lambda m, offset=offset: train.batch(offset + m, seed=cfg.seed).inputs, steps=n,
                                     match=match, lr=cfg.transfer_lr, phi_len=cfg.phi_len, trainable=cfg.transfer_trainable,
                                     precision=cfg.precision, on_step=on_step, checkpoint=progress_files[i],
                                     save_every=cfg.transfer_save_every, key=f"{key}:{i}" if i else key)
                    offset += n
            finally:
                if bar:
                    bar[0].stop()
            res_after = residuals(lin, teacher, held_out, match=res_match, phi_len=cfg.phi_len)
            kept = []
            if auto:
                kept = sorted(sorted(res_after, key=lambda l: -res_after[l])[:auto])
                keep_softmax(lin, teacher, kept)
            _save(lin, folder)
            done = {"key": key, "steps": steps, "steps_per_match": dict(zip(cfg.matches, parts)),
                    "seconds": time.perf_counter() - t0, "history": hist[-1:] if hist else [],
                    "residual_before": res_before, "residual_after": res_after, "kept_softmax": kept,
                    "tokens": steps * cfg.batch_size * cfg.seq_len, "trainable": cfg.transfer_trainable}
            (folder / "done.json").write_text(json.dumps(done, indent=1))
            for f in progress_files:
                f.unlink(missing_ok=True)
            _say(console, f"stage 1: {steps} steps in {done['seconds']:.0f} s" + (" (resumed from its saved progress)" if resumed else "")
                 + (f"; softmax kept in layers {kept}" if auto else ""))
        else:
            _say(console, f"stage 1: finished before ({folder}), skipped")
        current = folder
        stage = dict(done)
        model1 = reload(folder)
        stage["eval"] = evaluate(model1)
        stage["state"] = state_floats_per_token(model1, cfg.seq_len)
        stage["decode_tokens_per_s"] = decode_tokens_per_s(model1)
        metrics["stages"]["transfer"] = stage
        _say(console, f"after stage 1: val loss {stage['eval']['loss']:.4f} nats, {stage['eval']['bpb']:.4f} bits/byte")
        del model1
    else:
        folder = stage_dir / "init"
        if _done(folder, cfg.stage_key("init")) is None:
            _save(lin, folder)
            (folder / "done.json").write_text(json.dumps({"key": cfg.stage_key("init")}))
        current = folder
    metrics["residual_before"] = {str(k): v for k, v in res_before.items()}
    del lin

    # -- stage 2: fine-tuning through the one Trainer -----------------------------------------
    if "finetune" in cfg.stages:
        folder = stage_dir / "finetune"
        key = cfg.stage_key("finetune")
        done = _done(folder, key)
        if done is None:
            done = _finetune(cfg, current, teacher, corpus, folder, key, console, progress)
        else:
            _say(console, f"stage 2: finished before ({folder}), skipped")
        model2 = reload(folder)
        stage = dict(done)
        stage["eval"] = evaluate(model2)
        stage["state"] = state_floats_per_token(model2, cfg.seq_len)
        stage["decode_tokens_per_s"] = decode_tokens_per_s(model2)
        metrics["stages"]["finetune"] = stage
        _say(console, f"after stage 2: val loss {stage['eval']['loss']:.4f} nats, {stage['eval']['bpb']:.4f} bits/byte")
        current = folder
        del model2
    # -- the result: the last stage's model in OUT ---------------------------------------------
    for f in current.iterdir():
        if f.name != "done.json" and f.is_file():
            shutil.copy2(f, out / f.name)
    _save_tokenizer(corpus, out)
    metrics["final_stage"] = current.name
    from .report import write_html, write_maps

    final = reload(out)
    attn = attention_layers(final)
    metrics["kept_softmax"] = [l for l in attn if l not in students(final)]
    if cfg.length_multiples:
        metrics["length"] = evaluate_length({"teacher": teacher, "student": final}, corpus, cfg.length_multiples,
                                            device=cfg.device, precision=cfg.precision)
    metrics["recall"] = evaluate_recall({"teacher": teacher, "student": final}, corpus, device=cfg.device,
                                        precision=cfg.precision)
    if students(final):
        ids = next(iter(test.batches())).inputs[:1, :64].to(device)
        metrics["maps"] = write_maps(final, teacher, ids, out / "maps.png").name
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1, default=float))
    write_report(metrics, out / "report.md")
    write_html(metrics, out / "report.html", maps=out / metrics["maps"] if metrics.get("maps") else None)
    return metrics


def _bar(progress: bool, console, what: str, total: int):
    if not progress or total == 0:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), console=console)
    bar.start()
    return bar, bar.add_task(what, total=total, info="")


def _finetune(cfg: LinearizeConfig, source: Path, teacher, corpus, folder: Path, key: str, console, progress) -> dict:
    """Stage 2 through the Trainer (its run folder: stages/finetune_run, resumable); saves the merged model."""
    from ..models import ModelConfig
    from ..train import Trainer
    from ..train.checkpoint import read_checkpoint
    from ..train.config import TrainConfig, make_run_config
    from .finetune import finetune_builder, merged

    hcfg = teacher.config
    steps = max(1, -(-cfg.finetune_tokens // (cfg.batch_size * cfg.seq_len)))
    placed = json.loads((source / "config.json").read_text()).get("seqmix_placed", {})
    student = next((r["config"] for r in placed.values() if r["mixer"] == cfg.mixer), None)  # the sizes the table gave it
    mixer_kwargs = {k: v for k, v in (student or {}).items() if k != "d_model"}
    run_cfg = make_run_config(
        experiment="linearize", label=f"{cfg.mixer} linearized", tags={"stage": "finetune", "key": key},
        data=corpus, init_from_hf=str(source.resolve()),
        model=ModelConfig(mixer=cfg.mixer, mixer_kwargs=mixer_kwargs, d_model=int(hcfg.hidden_size),
                          n_layers=int(hcfg.num_hidden_layers), vocab_size=int(hcfg.vocab_size), positions="none"),
        train=TrainConfig(lr=cfg.finetune_lr, max_steps=steps, weight_decay=0.0, early_stop=None, seed=cfg.seed,
                          eval_batches=cfg.eval_batches, eval_every_steps=max(1, steps // 4), threads=cfg.threads,
                          device=cfg.device, precision=cfg.precision, parallel=cfg.parallel),
    )
    builder = finetune_builder(source, teacher=teacher if cfg.kd > 0 else None, kd=cfg.kd, lora_rank=cfg.lora_rank, ce=cfg.ce,
                               lora_targets=cfg.lora_targets, trainable=cfg.trainable)
    run_dir = folder.parent / "finetune_run"
    t0 = time.perf_counter()
    trainer = Trainer(run_cfg, run_dir=run_dir, model_builder=builder, progress=progress, console=console, maps=False,
                      tensorboard=False)
    result = trainer.fit()
    if cfg.parallel != "none" and _rank() != 0:  # rank 0 saves the model
        return {}
    model = builder(run_cfg)
    blob = read_checkpoint(run_dir / "checkpoint.pt", keys=("run_id", "model"))
    model.load_state_dict(blob["model"])
    final = merged(model.hf)
    _save(final, folder)
    done = {"key": key, "steps": result.steps, "tokens": result.tokens, "seconds": time.perf_counter() - t0,
            "history": result.history, "lora_rank": cfg.lora_rank, "lora_targets": cfg.lora_targets, "kd": cfg.kd, "ce": cfg.ce,
            "trainable_set": cfg.trainable, "precision": cfg.precision,
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    (folder / "done.json").write_text(json.dumps(done, indent=1, default=float))
    return done
