"""``seqmix linearize``: a transformers checkpoint's attention replaced by a seqmix mixer, by
attention transfer and fine-tuning, saved as a folder ``load_converted`` reads (docs/linearize.md)."""

from __future__ import annotations


def _add_linearize(sub):
    p = sub.add_parser("linearize", help="turn a transformers checkpoint's attention into a seqmix mixer (transfer, fine-tune)")
    p.add_argument("--hf", required=True, help="the teacher: a transformers checkpoint folder (or a hub id in the local cache)")
    p.add_argument("--mixer", default="gla", help="the student: a registered mixer that takes q/k/v (docs/linearize.md)")
    p.add_argument("--set", dest="mixer_set", action="append", default=[], metavar="KEY=VALUE",
                   help="a field of the student's config (e.g. feature_map=hedgehog, window=64); repeatable")
    p.add_argument("--layers", default="all", help="'all', 'auto:K' (keep K softmax layers: the largest stage-1 residuals) "
                   "or comma-separated layer indices")
    p.add_argument("--init", choices=["attention", "random", "random_hf"], default="attention",
                   help="student init: from the attention weights (default), its own, or its own with transformers' Linear init")
    p.add_argument("--match", choices=["output", "phi", "both"], default="output", help="stage 1's loss (default output)")
    p.add_argument("--stages", default="transfer,finetune", help="stages to run, in order (default transfer,finetune)")
    p.add_argument("--corpus", default="tinyshakespeare", help="a built-in corpus name or a text file / folder")
    p.add_argument("--tokenizer", default="byte", help="byte, char, bpe, a tokenizer.json, or hf (the teacher's tokenizer.json)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per window (default 128)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per batch (default 16)")
    p.add_argument("--transfer-tokens", type=int, default=100_000, help="stage 1's tokens (default 100000)")
    p.add_argument("--transfer-lr", type=float, default=1e-3, help="stage 1's peak learning rate (default 1e-3)")
    p.add_argument("--transfer-trainable", choices=["all", "new"], default="all",
                   help="stage 1 trains every student parameter (all), or only those not copied from the teacher (new: "
                   "feature maps, decays, gates, norms, convolutions; LoLCATs' stage 1)")
    p.add_argument("--transfer-save-every", type=int, default=50,
                   help="stage 1 saves its progress every this many steps: a killed run resumes there (default 50)")
    p.add_argument("--finetune-tokens", type=int, default=200_000, help="stage 2's tokens (default 200000)")
    p.add_argument("--finetune-lr", type=float, default=1e-3, help="stage 2's peak learning rate (default 1e-3)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--lora-rank", type=int, default=None, help="LoRA (peft) of this rank on the weights kept from the teacher")
    g.add_argument("--full", action="store_true", help="full fine-tuning (the default when --lora-rank is not given)")
    p.add_argument("--kd", type=float, default=0.0, help="weight of KL(teacher ‖ student) in stage 2 (default 0)")
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


def _run_linearize(args) -> int:
    from rich.console import Console

    from seqmix.linearize.pipeline import LinearizeConfig, run

    from ._common import _parse_kv

    if args.lora_rank is not None and args.lora_rank < 1:
        raise ValueError(f"argument --lora-rank: expected a rank >= 1, got {args.lora_rank} (or --full)")
    stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    cfg = LinearizeConfig(
        hf=args.hf, mixer=args.mixer, mixer_config=_parse_kv(args.mixer_set, "--set"), layers=args.layers, init=args.init,
        match=args.match, stages=stages, corpus=args.corpus, tokenizer=args.tokenizer, seq_len=args.seq_len,
        batch_size=args.batch_size, transfer_tokens=args.transfer_tokens, transfer_lr=args.transfer_lr,
        finetune_tokens=args.finetune_tokens, finetune_lr=args.finetune_lr, lora_rank=args.lora_rank or 0, kd=args.kd,
        eval_batches=args.eval_batches, seed=args.seed, threads=args.threads, out=args.out, device=args.device,
        precision=args.precision, parallel=args.parallel, transfer_trainable=args.transfer_trainable,
        transfer_save_every=args.transfer_save_every)
    console = Console()
    metrics = run(cfg, console=console, progress=not args.no_progress)
    if not metrics:  # a DDP rank > 0: rank 0 writes the folder
        return 0
    console.print(f"wrote {args.out}: the linearized model (seqmix.interop.load_converted), metrics.json, report.md, report.html "
                  f"(final stage: {metrics['final_stage']})", markup=False, highlight=False)
    return 0


COMMANDS = {"linearize": (_add_linearize, _run_linearize)}
