"""``seqmix linearize``: a transformers checkpoint's attention replaced by a seqmix mixer, by a named
recipe (attention transfer, fine-tuning), saved as a folder ``load_converted`` reads (docs/linearize.md).

The method's flags default to the chosen ``--recipe`` (seqmix.linearize.recipes; by default the
measured best); a flag given overrides the recipe's value."""

from __future__ import annotations

import argparse


def _add_linearize(sub):
    from seqmix.linearize.recipes import DEFAULT_RECIPE, RECIPES

    p = sub.add_parser("linearize", help="turn a transformers checkpoint's attention into a seqmix mixer (a recipe: transfer, "
                       "fine-tune)")
    p.add_argument("--hf", required=True, help="the teacher: a transformers checkpoint folder (or a hub id in the local cache)")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, choices=list(RECIPES),
                   help=f"the method: a preset of the flags below (default {DEFAULT_RECIPE}: the measured best; docs/linearize.md)")
    p.add_argument("--tokens", type=int, default=None, help="the token budget of both stages (default 300000), split by "
                   "--transfer-share")
    m = p.add_argument_group("the method (default: the recipe's)")
    m.add_argument("--mixer", default=None, help="the student: a registered mixer that takes q/k/v (docs/linearize.md)")
    m.add_argument("--set", dest="mixer_set", action="append", default=None, metavar="KEY=VALUE",
                   help="a field of the student's config (e.g. feature_map=hedgehog, window=64); repeatable")
    m.add_argument("--layers", default=None, help="'all', 'auto:K' (keep K softmax layers: the largest stage-1 residuals), "
                   "'uniform:K' or 'uniform:P%%' (K or P%% softmax layers kept, evenly spaced), or comma-separated layer indices")
    m.add_argument("--group-kv", action=argparse.BooleanOptionalAction, default=None,
                   help="a teacher with grouped-query attention keeps its kv heads in the students (k and v rows tied per "
                   "group: fewer weights read per token); --no-group-kv: one k and v per query head")
    m.add_argument("--init", choices=["attention", "random", "random_hf"], default=None,
                   help="student init: from the attention weights, its own, or its own with transformers' Linear init")
    m.add_argument("--match", default=None, help="stage 1's loss: output, phi, both, block (each decoder layer's output), or "
                   "several comma-separated, run one after the other")
    m.add_argument("--transfer-split", default=None, help="stage 1's steps split between the losses of --match in this ratio "
                   "(e.g. 1,2)")
    m.add_argument("--stages", default=None, help="stages to run, in order: transfer,finetune")
    m.add_argument("--transfer-share", type=float, default=None, help="stage 1's share of --tokens")
    m.add_argument("--transfer-lr", type=float, default=None, help="stage 1's peak learning rate")
    m.add_argument("--transfer-trainable", choices=["all", "new", "block"], default=None,
                   help="stage 1 trains every student parameter (all), only those not copied from the teacher (new: feature "
                   "maps, decays, gates, norms, convolutions; LoLCATs' stage 1), or the students' whole decoder layers (block)")
    m.add_argument("--finetune-lr", type=float, default=None, help="stage 2's peak learning rate")
    g = m.add_mutually_exclusive_group()
    g.add_argument("--lora-rank", type=int, default=None, help="LoRA (peft) of this rank in stage 2")
    g.add_argument("--full", action="store_true", help="full fine-tuning in stage 2 (no LoRA, every weight trained)")
    m.add_argument("--lora-targets", choices=["kept", "students", "all"], default=None,
                   help="what LoRA adapts: the Linears kept from the teacher, the students' q/k/v/o projections, or both")
    m.add_argument("--finetune-trainable", choices=["all", "students", "lora"], default=None,
                   help="stage 2's weights trained besides the LoRA adapters: all, the students', none")
    m.add_argument("--kd", type=float, default=None, help="weight of KL(teacher ‖ student) in stage 2")
    m.add_argument("--ce", type=float, default=None, help="weight of the next-token cross-entropy in stage 2")
    p.add_argument("--corpus", default="tinyshakespeare", help="a built-in corpus name or a text file / folder")
    p.add_argument("--tokenizer", default="byte", help="byte, char, bpe, a tokenizer.json, or hf (the teacher's tokenizer.json)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per batch (default 16)")
    p.add_argument("--transfer-tokens", type=int, default=None, help="stage 1's tokens (instead of --transfer-share of --tokens)")
    p.add_argument("--finetune-tokens", type=int, default=None, help="stage 2's tokens (instead of the rest of --tokens)")
    p.add_argument("--transfer-save-every", type=int, default=50,
                   help="stage 1 saves its progress every this many steps: a killed run resumes there (default 50)")
    p.add_argument("--length", default="1,4,16", help="the final model and the teacher evaluated on windows of the largest of "
                   "these multiples of --seq-len, the loss per band of positions (default 1,4,16; 'none': skipped)")
    p.add_argument("--eval-batches", type=int, default=8, help="validation batches per evaluation (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--device", default="cpu", help="torch device of both stages and the evaluations (cpu, cuda, cuda:0)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="autocast dtype of both stages (default fp32)")
    p.add_argument("--parallel", choices=["none", "ddp", "fsdp"], default="none",
                   help="stage 2 under torchrun: DDP or FSDP2 (one unit per decoder layer); rank 0 runs stage 1 and the "
                        "evaluations (default none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--out", required=True, help="the output folder (a re-run resumes there: finished stages are skipped)")


def _numbers(text: str, argument: str, kind=float) -> tuple:
    try:
        return tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"argument {argument}: expected comma-separated numbers, got {text!r}") from None


def _run_linearize(args) -> int:
    from rich.console import Console

    from seqmix.linearize.pipeline import LinearizeConfig, run

    from ._common import _parse_kv

    if args.lora_rank is not None and args.lora_rank < 1:
        raise ValueError(f"argument --lora-rank: expected a rank >= 1, got {args.lora_rank} (or --full)")
    method = {"mixer": args.mixer, "layers": args.layers, "init": args.init, "match": args.match,
              "transfer_share": args.transfer_share, "transfer_lr": args.transfer_lr,
              "transfer_trainable": args.transfer_trainable, "finetune_lr": args.finetune_lr, "lora_rank": args.lora_rank,
              "lora_targets": args.lora_targets, "finetune_trainable": args.finetune_trainable, "kd": args.kd, "ce": args.ce,
              "group_kv": args.group_kv, "tokens": args.tokens, "transfer_tokens": args.transfer_tokens, "finetune_tokens": args.finetune_tokens}
    if args.mixer_set is not None:
        method["mixer_config"] = _parse_kv(args.mixer_set, "--set")
    if args.stages is not None:
        method["stages"] = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    if args.transfer_split is not None:
        method["transfer_split"] = _numbers(args.transfer_split, "--transfer-split")
    if args.full:
        method.update(lora_rank=0, finetune_trainable=args.finetune_trainable or "all")
    length = () if args.length.strip().lower() == "none" else _numbers(args.length, "--length", int)
    cfg = LinearizeConfig(
        recipe=args.recipe, hf=args.hf, corpus=args.corpus, tokenizer=args.tokenizer, seq_len=args.seq_len,
        batch_size=args.batch_size, eval_batches=args.eval_batches, seed=args.seed, threads=args.threads, out=args.out,
        device=args.device, precision=args.precision, parallel=args.parallel, transfer_save_every=args.transfer_save_every,
        length_multiples=length, **{k: v for k, v in method.items() if v is not None})
    console = Console()
    metrics = run(cfg, console=console, progress=not args.no_progress)
    if not metrics:  # a DDP rank > 0: rank 0 writes the folder
        return 0
    console.print(f"wrote {args.out}: the linearized model (seqmix.interop.load_converted), metrics.json, report.md, report.html "
                  f"(recipe {cfg.recipe}, final stage: {metrics['final_stage']})", markup=False, highlight=False)
    return 0


COMMANDS = {"linearize": (_add_linearize, _run_linearize)}
