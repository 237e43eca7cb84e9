"""``seqmix lm train | eval | generate | export``: language modelling on text (docs/lm.md)."""

from __future__ import annotations

import sys

from ._common import _add_harness_common, _add_import, _add_parallel, _check_out_dir, _import_plugins, _is_rank0, _parse_kv, _with_parallel


def _add_lm_train(sub):
    p = sub.add_parser("train", help="train a language model on a text corpus (Tiny Shakespeare by default)")
    p.add_argument("--config", help="a RunConfig as JSON (file) with a corpus data config; the other options are ignored")
    g = p.add_argument_group("data")
    g.add_argument("--corpus", default="tinyshakespeare", help="tinyshakespeare, a text file or folder, or hf:<name>[/<config>]")
    g.add_argument("--tokenizer", default="char", help="byte, char, bpe, or a path to a tokenizer.json")
    g.add_argument("--bpe-vocab", type=int, default=1024, help="BPE vocabulary size (--tokenizer bpe)")
    g.add_argument("--text-field", default="text", help="text column of a HuggingFace dataset")
    g.add_argument("--seq-len", type=int, default=128, help="training context T")
    g.add_argument("--batch-size", type=int, default=16)
    g.add_argument("--eval-batch-size", type=int, default=None)
    g.add_argument("--data-seed", type=int, default=0)
    g = p.add_argument_group("model")
    g.add_argument("--mixer", default="softmax_attention", help="registered mixer (seqmix list)")
    g.add_argument("--mixer-kw", action="append", default=[], metavar="KEY=VALUE", help="mixer config fields (e.g. heads=4)")
    g.add_argument("--pattern", default=None, help="a layer pattern instead of one mixer (mamba_swa, bmojo, ...)")
    g.add_argument("--d-model", type=int, default=128)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--channel-mixer", default="mlp", help="mlp, swiglu or none")
    g.add_argument("--positions", default="auto", help="auto, learned, rope (rotary, for the attention mixers) or none")
    g.add_argument("--init-from-hf", default=None, metavar="PATH_OR_HUB_ID",
                   help="fine-tune a transformers checkpoint (local folder, or hub id in the local cache) converted by "
                        "seqmix.interop instead of building a model: the other model options are ignored, and the "
                        "tokenizer defaults to the checkpoint's tokenizer.json (bytes without one); docs/interop.md")
    g = p.add_argument_group("training")
    g.add_argument("--max-tokens", type=int, default=None, help="token budget (default 2M when --max-steps is not given)")
    g.add_argument("--max-steps", type=int, default=None)
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--lr", type=float, default=1e-3)
    g.add_argument("--warmup", type=float, default=0.1)
    g.add_argument("--min-lr", type=float, default=0.1, help="final learning rate as a fraction of --lr")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--betas", default="0.9,0.95")
    g.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping (0: off)")
    g.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (default: 10 evaluations)")
    g.add_argument("--eval-batches", type=int, default=None, help="evaluate on at most N batches (default: the whole split)")
    g.add_argument("--checkpoint-every", type=int, default=None, help="also checkpoint every N steps")
    g.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="cpu")
    _add_parallel(p)
    _add_harness_common(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-mfu", action="store_true", help="do not measure the matmul peak for the MFU estimate")


def _lm_config(args):
    from ..train import load_run_config, make_run_config

    if args.config:
        return load_run_config(args.config, "--config")
    data = {"kind": "corpus", "corpus": args.corpus, "tokenizer": args.tokenizer, "bpe_vocab_size": args.bpe_vocab,
            "text_field": args.text_field, "seq_len": args.seq_len, "batch_size": args.batch_size,
            "eval_batch_size": args.eval_batch_size, "seed": args.data_seed}
    model = {"d_model": args.d_model, "n_layers": args.layers, "channel_mixer": args.channel_mixer, "positions": args.positions}
    init = {}
    if args.init_from_hf:  # the checkpoint's sizes and tokenizer (seqmix.interop.train)
        from pathlib import Path

        from ..interop.train import hf_model_config, hf_tokenizer

        model = hf_model_config(args.init_from_hf)
        if args.tokenizer == "char":  # the default: the checkpoint's own
            data["tokenizer"] = hf_tokenizer(args.init_from_hf)
        src = Path(args.init_from_hf).expanduser()
        init = {"init_from_hf": str(src.resolve()) if src.is_dir() else args.init_from_hf}
    elif args.pattern:
        model["pattern"] = args.pattern
    else:
        model.update(mixer=args.mixer, mixer_kwargs=_parse_kv(args.mixer_kw, "--mixer-kw"))
    try:
        betas = tuple(float(b) for b in args.betas.split(","))
    except ValueError:
        raise ValueError(f"argument --betas: expected two numbers such as 0.9,0.95, got {args.betas!r}") from None
    train = {"lr": args.lr, "max_tokens": args.max_tokens if (args.max_tokens or args.max_steps) else 2_000_000,
             "max_steps": args.max_steps, "grad_accum": args.grad_accum, "warmup": args.warmup, "min_lr": args.min_lr,
             "weight_decay": args.weight_decay, "betas": betas, "grad_clip": args.clip or None, "early_stop": None,
             "eval_every_steps": args.eval_every, "eval_batches": args.eval_batches, "checkpoint_every": args.checkpoint_every,
             "precision": args.precision, "seed": args.seed, "device": args.device, "threads": args.threads}
    return make_run_config(experiment="lm", data=data, model=model, train=train, **init)


def _run_lm_train(args) -> int:
    from pathlib import Path

    from rich.console import Console

    import seqmix

    from ..analysis.trained import write_run_maps
    from ..train import Trainer, git_commit
    from ..train.flops import matmul_peak_flops
    from ..train.store import ResultsStore

    _import_plugins(args)
    config = _with_parallel(_lm_config(args), args)  # every field checked (and the tokenizer built) before training
    if not config.is_lm:
        raise ValueError("argument --config: the run's data is not a corpus (use `seqmix train` for synthetic tasks)")
    _check_out_dir(args.out, "--out")  # a file there: one line, before anything is built or trained
    run_dir = Path(args.out) / "runs" / config.run_id
    console = Console(quiet=not _is_rank0())  # under torchrun only rank 0 prints
    console.print(f"run {config.run_id}: {config.name} d={config.model.d_model} x{config.model.n_layers} on "
                  f"{config.data.describe()}, vocab {config.data.vocab_size} -> {run_dir}", markup=False, highlight=False)
    if config.train.threads:
        import torch

        torch.set_num_threads(config.train.threads)
    peak = None if args.no_mfu else matmul_peak_flops(config.train.device)
    builder = None
    if config.init_from_hf:  # a converted transformers model (seqmix.interop.train)
        from ..interop.train import hf_model_builder as builder
    trainer = Trainer(config, run_dir=run_dir, progress=not args.no_progress, console=console, peak_flops=peak,
                      write_maps=write_run_maps, model_builder=builder)  # maps: not for corpus runs unless Trainer(maps=True)
    result = trainer.fit()
    if not trainer.parallel.is_main:
        return 0
    store = ResultsStore(Path(args.out) / "results.sqlite", argument="--out")
    store.put(config, result, version=seqmix.__version__, git_commit=git_commit())
    mfu = f", MFU {100 * result.mfu:.1f}% of {peak / 1e9:.0f} GFLOP/s" if result.mfu is not None else ""
    console.print(f"val ppl {result.ppl:.3f}, {result.bpb:.4f} bits/byte (best at step {result.best_step} of {result.steps}), "
                  f"{result.tokens:,} tokens, {result.tokens_per_s:,.0f} tokens/s{mfu}, {result.wall_time:.1f}s, "
                  f"{result.params:,} parameters", markup=False, highlight=False)
    console.print(f"run folder: {run_dir} (checkpoint.pt, tokenizer.json, result.json, tb/)", markup=False, highlight=False)
    return 0


def _add_lm_eval(sub):
    p = sub.add_parser("eval", help="perplexity, bits per byte and length generalization of a trained LM run")
    _add_import(p)
    p.add_argument("run", help="a run folder, or a run id (prefix) under --runs")
    p.add_argument("--runs", default="runs", help="where runs live (the --out of lm train; default runs/)")
    p.add_argument("--split", default="val", choices=["val", "test"])
    p.add_argument("--lengths", default="1,2,4", help="context multiples of the training length (empty: skip)")
    p.add_argument("--max-tokens", type=int, default=65_536, help="tokens evaluated at each length (default 65536)")
    p.add_argument("--plot", default=None, help="the loss-by-position plot: FILE.png, or a folder (it gets length.png; "
                                                 "default: the run folder)")
    p.add_argument("--threads", type=int, default=None)


def _run_lm_eval(args) -> int:
    import json
    from pathlib import Path

    from .._checks import picture_paths
    from ..analysis.lm import evaluate_lm, length_generalization, plot_length_generalization
    from ..analysis.trained import find_run_dir, load_run

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.plot:  # a file or folder in the way: said before minutes of evaluation
        picture_paths(args.plot, ["length"], "--plot", create=False)
    run_dir = find_run_dir(args.run, args.runs)
    config, model = load_run(run_dir)
    ev = evaluate_lm(config, model, split=args.split)
    print(f"{config.name} ({config.run_id}) on {config.data.describe()}, {args.split} split: loss {ev['loss']:.4f}, "
          f"ppl {ev['ppl']:.3f}, {ev['bpb']:.4f} bits/byte, next-token accuracy {ev['accuracy']:.3f} ({ev['tokens']:,} tokens)")
    out = {"eval": ev}
    if args.lengths:
        try:
            ks = [int(k) for k in args.lengths.split(",")]
        except ValueError:
            raise ValueError(f"argument --lengths: expected comma-separated integers such as 1,2,4, got {args.lengths!r}") from None
        lg = length_generalization(config, model, split=args.split, multiples=ks, max_tokens=args.max_tokens)
        print(f"\nlength generalization (training context T = {lg['seq_len']}; same tokens at each length)\n")
        print("| context | ppl | bits/byte | windows |\n|---|---|---|---|")
        for r in lg["results"]:
            if "error" in r:
                print(f"| {r['k']}×T = {r['seq_len']} | not evaluated: {r['error']} | | |")
            else:
                print(f"| {r['k']}×T = {r['seq_len']} | {r['ppl']:.3f} | {r['bpb']:.4f} | {r['windows']} |")
        path = plot_length_generalization(lg, picture_paths(args.plot or run_dir, ["length"], "--plot")["length"])
        print(f"\nplot: {path}")
        out["length_generalization"] = lg
    (Path(run_dir) / f"eval_{args.split}.json").write_text(json.dumps(out, indent=1))
    return 0


def _add_lm_generate(sub):
    p = sub.add_parser("generate", help="generate text from a trained LM run, streaming tokens as they are made")
    _add_import(p)
    p.add_argument("run", help="a run folder, or a run id (prefix) under --runs")
    p.add_argument("--runs", default="runs", help="where runs live (the --out of lm train; default runs/)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="the prompt text (default: a newline)")
    src.add_argument("--prompt-file", default=None, help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default 200, fewer when a learned position table ends sooner (an explicit value past it is an error)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-samples", type=int, default=1, help="samples of the same prompt (drawn one after the other)")
    p.add_argument("--no-stream", action="store_true", help="print each sample when it is complete")
    p.add_argument("--threads", type=int, default=None)


def _run_lm_generate(args) -> int:
    from pathlib import Path

    import torch

    from ..analysis.trained import find_run_dir, load_run
    from ..data.text import load_tokenizer
    from ..train.trainer import TOKENIZER

    if args.num_samples < 1:
        raise ValueError(f"argument --num-samples: expected an integer >= 1, got {args.num_samples}")
    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir = find_run_dir(args.run, args.runs)
    if not (run_dir / TOKENIZER).is_file():
        raise ValueError(f"argument 'run': {str(run_dir)!r} has no {TOKENIZER} (generate needs an `seqmix lm train` run)")
    tok = load_tokenizer(run_dir / TOKENIZER)
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
    ids = tok.encode(prompt)
    _, model = load_run(run_dir)
    n_new = args.max_new_tokens
    if n_new is None:
        n_new = 200
        if model.pos is not None:  # learned positions: prompt + new - 1 <= max_seq_len
            n_new = min(n_new, model.pos.num_embeddings - len(ids) + 1)
            if n_new < 200:
                print(f"(at most {n_new} new tokens: the model's learned position table ends at max_seq_len = "
                      f"{model.pos.num_embeddings})", file=sys.stderr)
    from ..models.generation import check_positions

    check_positions(model, len(ids) + max(n_new, 1) - 1, "seqmix lm generate", "--max-new-tokens")
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        sys.stdout.write(prompt)
        new: list[int] = []
        shown = [0]  # characters of the decoded continuation already printed

        def show(tokens, final=False):
            new.extend(int(t) for t in tokens.reshape(-1))
            text = tok.decode(new)
            if not final:  # a byte or BPE token may end inside a UTF-8 character: wait for the rest
                text = text.rstrip("\ufffd")
            if len(text) > shown[0]:
                sys.stdout.write(text[shown[0]:])
                sys.stdout.flush()
                shown[0] = len(text)

        out = model.generate(torch.tensor([ids]), n_new, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, seed=args.seed + i, callback=None if args.no_stream else show)
        if args.no_stream:
            sys.stdout.write(tok.decode(out[0, len(ids):].tolist()))
        else:
            show(torch.tensor([], dtype=torch.long), final=True)
        sys.stdout.write("\n")
    return 0


def _add_lm_export(sub):
    p = sub.add_parser("export", help="export a trained LM run (docs/hf.md): --hf DIR writes a HuggingFace folder")
    _add_import(p)
    p.add_argument("run", help="a run folder, or a run id (prefix) under --runs")
    p.add_argument("--runs", default="runs", help="where runs live (the --out of lm train; default runs/)")
    p.add_argument("--hf", required=True, metavar="DIR",
                   help="write config.json, model.safetensors and the tokenizer (PreTrainedTokenizerFast) into DIR")


def _run_lm_export(args) -> int:
    try:
        from ..hf.export import export_hf
    except ImportError as e:
        raise ValueError(f"seqmix lm export --hf needs the optional extra 'hf': pip install 'seqmix[hf]' ({e})") from None
    out = export_hf(args.run, args.hf, runs=args.runs)
    print(f"wrote {out} (load it with: import seqmix.hf; AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


LM_COMMANDS = {
    "train": (_add_lm_train, _run_lm_train),
    "eval": (_add_lm_eval, _run_lm_eval),
    "generate": (_add_lm_generate, _run_lm_generate),
    "export": (_add_lm_export, _run_lm_export),
}


def _add_lm(sub):
    p = sub.add_parser("lm", help="language modelling on text: train, eval, generate, export (see docs/lm.md)")
    lsub = p.add_subparsers(dest="lm_command")
    for add, _ in LM_COMMANDS.values():
        add(lsub)
    p.set_defaults(_lm_parser=p)


def _run_lm(args) -> int:
    if not getattr(args, "lm_command", None):
        args._lm_parser.print_help()
        return 0
    return LM_COMMANDS[args.lm_command][1](args)



COMMANDS = {"lm": (_add_lm, _run_lm)}
