"""The worked example of docs/interop.md: small transformers models — MambaForCausalLM and
LlamaForCausalLM, and (``--models qwen3``) Qwen3ForCausalLM — trained on Tiny Shakespeare here
(no hub is reachable), saved as ordinary
transformers checkpoints, then converted and drawn side by side with `seqmix show --hf` on one
paragraph.

    python bench/interop_example.py                         # d 128, 2 layers each, byte vocabulary, ~3 minutes each
    python bench/interop_example.py --minutes 10 --layers 4 --out runs/interop_example
    python bench/interop_example.py --models mamba          # one of them
    python bench/interop_example.py --models qwen3          # the Qwen3-architecture teacher (GQA, qk-norm)
    seqmix show --hf runs/interop_example/mamba-small --hf runs/interop_example/llama-small \
        --text-file runs/interop_example/paragraph.txt --layers all [--report]

1. transformers' own ``MambaForCausalLM(MambaConfig(vocab_size=256, hidden_size=128, ...))`` and
   ``LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, 4 heads, ...))``, random init
   (``torch.manual_seed``), reading UTF-8 bytes (ids 0-255: no tokenizer needed).
2. Training, the same mechanism for both: the model converted with ``from_transformers`` (its
   mixers are seqmix mixers — S6 for Mamba, softmax attention with RoPE for Llama; embeddings,
   norms, MLPs and head are transformers'), AdamW on random 128-byte windows of the training
   part of Tiny Shakespeare (the corpus shipped in src/seqmix/data/corpora/) for ``--minutes``
   (or ``--steps``) per model, the same batches for both. transformers' own torch path for Mamba
   (no mamba_ssm kernels on CPU) takes tens of seconds per step here; the converted model
   computes the same function (tests: equal logits) with seqmix's selective scan.
3. Saving as transformers' checkpoint: the trained converted weights are written back into
   the original model (outside the mixers: the same names; inside: the family's weight table
   read backwards — every transform a reshape, fused tensors such as attention's
   W_qk = [q_proj; k_proj] split at their ``part`` rows), ``save_pretrained``. The script
   checks that each saved folder, loaded by transformers and converted again, gives the
   trained model's logits.
4. The picture: ``seqmix show --hf MAMBA --hf LLAMA --text-file paragraph.txt`` (a paragraph of
   the held-out part), the maps side by side and the layers figure (PNG), then ``--report``.

The same commands for a real checkpoint (a local Mamba-130m folder, e.g. from
``hf download state-spaces/mamba-130m-hf --local-dir mamba-130m``) are in docs/interop.md.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
CORPUS = ROOT / "src/seqmix/data/corpora/tinyshakespeare/input.txt"


def write_back(conv, orig) -> None:
    """The converted model's (trained) weights into the original transformers model, in place."""
    from seqmix.interop import FAMILIES, InteropMixer

    family = FAMILIES[orig.config.model_type]
    conv_sd = conv.state_dict()
    adapters = {p for p, m in conv.named_modules() if isinstance(m, InteropMixer)}
    new = {}
    for name, t in orig.state_dict().items():
        if not any(name.startswith(p + ".") for p in adapters):
            new[name] = conv_sd[name]
    for path in adapters:
        module = orig.get_submodule(path)
        mm = family.module_map(module)
        own = dict(module.state_dict())
        rows = [r for r in mm.weights if r.hf in own]
        for row in rows:
            if row.seqmix is None:  # derived from the config: the original keeps its own
                new[f"{path}.{row.hf}"] = own[row.hf]
                continue
            if row.transform is not None and not str(row.transform).startswith(("squeeze", "unsqueeze")):
                raise ValueError(f"write_back: {row.hf} -> {row.seqmix} uses {row.transform}, not a reshape")
            t = conv_sd[f"{path}.mixer.{row.seqmix}"]
            if row.part is not None:  # one block of a fused tensor (W_qk = [q_proj; k_proj]): its rows
                parts = sorted((r for r in rows if r.seqmix == row.seqmix and r.part is not None), key=lambda r: r.part)
                start = sum(own[r.hf].shape[0] for r in parts if r.part < row.part)
                t = t[start:start + own[row.hf].shape[0]]
            new[f"{path}.{row.hf}"] = t.reshape(own[row.hf].shape)
    orig.load_state_dict(new, strict=True)


def build(name: str, args):
    """transformers' own model of ``name`` (random init, byte vocabulary), its class and its folder name."""
    from transformers import LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    ids = dict(vocab_size=256, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    if name == "mamba":
        return MambaForCausalLM, MambaForCausalLM(MambaConfig(hidden_size=args.d_model, num_hidden_layers=args.layers,
                                                              state_size=16, **ids))
    if name == "llama":
        return LlamaForCausalLM, LlamaForCausalLM(LlamaConfig(hidden_size=args.d_model, intermediate_size=3 * args.d_model,
                                                              num_hidden_layers=args.layers, num_attention_heads=4,
                                                              num_key_value_heads=4, max_position_embeddings=1024,
                                                              tie_word_embeddings=False, **ids))
    if name == "qwen3":  # Qwen3's attention: GQA (2 kv heads), qk-norm per head (RMSNorm before RoPE), θ = 10^6
        return Qwen3ForCausalLM, Qwen3ForCausalLM(Qwen3Config(hidden_size=args.d_model, intermediate_size=3 * args.d_model,
                                                              num_hidden_layers=args.layers, num_attention_heads=4,
                                                              num_key_value_heads=2, head_dim=args.d_model // 4,
                                                              max_position_embeddings=1024, tie_word_embeddings=False, **ids))
    raise ValueError(f"--models: unknown model {name!r} (mamba, llama, qwen3)")


def train_one(name: str, args, train, held, out: Path) -> dict:
    """Trains one model through its converted form, writes it back, saves and checks the folder."""
    from seqmix.interop import from_transformers

    torch.manual_seed(args.seed)
    cls, orig = build(name, args)
    conv = from_transformers(orig).train()
    opt = torch.optim.AdamW(conv.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(args.seed)   # the same batches for every model
    gv = torch.Generator().manual_seed(args.seed + 1)
    T, B = args.seq_len, args.batch_size
    val_batches = []
    for _ in range(4):  # a fixed held-out set: 4 batches
        i = torch.randint(0, len(held) - T - 1, (B,), generator=gv)
        x = torch.stack([held[j:j + T + 1] for j in i.tolist()])
        val_batches.append((x[:, :-1], x[:, 1:]))

    def batch(src):
        i = torch.randint(0, len(src) - T - 1, (B,), generator=g)
        x = torch.stack([src[j:j + T + 1] for j in i.tolist()])
        return x[:, :-1], x[:, 1:]

    def val_loss():
        conv.eval()
        with torch.no_grad():
            loss = sum(float(F.cross_entropy(conv(input_ids=xs, use_cache=False).logits.flatten(0, 1), ys.flatten()))
                       for xs, ys in val_batches) / len(val_batches)
        conv.train()
        return loss

    title = f"{cls.__name__} d={args.d_model} x{args.layers} (bytes)"
    t0, step, budget = time.perf_counter(), 0, args.minutes * 60
    v0 = val_loss()
    print(f"training {title} converted to seqmix mixers, {sum(q.numel() for q in conv.parameters()):,} parameters; "
          f"val loss {v0:.3f} (ln 256 = {math.log(256):.3f})", flush=True)
    losses = []
    while (args.steps is None and time.perf_counter() - t0 < budget) or (args.steps is not None and step < args.steps):
        lr = args.lr * min(1.0, (step + 1) / 20)
        for grp in opt.param_groups:
            grp["lr"] = lr
        x, y = batch(train)
        loss = F.cross_entropy(conv(input_ids=x, use_cache=False).logits.flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(conv.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % 50 == 0:
            print(f"  step {step}: train loss {sum(losses[-50:]) / 50:.3f} (mean of 50), val loss {val_loss():.3f}, "
                  f"{step * B * T / (time.perf_counter() - t0):,.0f} tokens/s", flush=True)
    secs = time.perf_counter() - t0
    v = val_loss()
    tail = losses[-min(50, len(losses)):] or [float("nan")]
    print(f"trained {title}: {step} steps ({step * B * T:,} tokens) in {secs:.0f}s: train loss {sum(tail) / len(tail):.3f} "
          f"(mean of the last {len(tail)}), val loss {v0:.3f} -> {v:.3f} ({v / math.log(2):.2f} bits/byte)", flush=True)

    conv.eval()
    write_back(conv, orig)
    folder = out / f"{name}-small"
    orig.save_pretrained(folder)
    # the saved folder is transformers' checkpoint of the trained model: loaded and converted again, the same logits
    again = from_transformers(cls.from_pretrained(folder, local_files_only=True).eval())
    ids = held[:256].unsqueeze(0)
    with torch.no_grad():
        a, b = conv(input_ids=ids, use_cache=False).logits, again(input_ids=ids, use_cache=False).logits
        c = orig.eval()(input_ids=ids, use_cache=False).logits if name in ("llama", "qwen3") else None
    err = float((a - b).abs().max() / a.abs().max())
    msg = f"saved {folder} ({cls.__name__}); reloaded and converted: max logit error {err:.1e} of the scale"
    if c is not None:  # transformers' own SDPA path on the written-back weights, too (cheap for attention)
        msg += f"; transformers' own forward: {float((a - c).abs().max() / a.abs().max()):.1e}"
    print(msg, flush=True)
    return dict(model=cls.__name__, folder=folder, steps=step, seconds=secs, val0=v0, val=v, train=sum(tail) / len(tail))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/interop_example", help="output folder (default runs/interop_example)")
    p.add_argument("--models", default="mamba,llama", help="comma-separated: mamba, llama, qwen3 (default mamba,llama)")
    p.add_argument("--minutes", type=float, default=3.0, help="training time per model (default 3)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps per model (default: --minutes)")
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-show", action="store_true", help="do not run `seqmix show --hf` at the end")
    args = p.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = torch.tensor(list(CORPUS.read_bytes()), dtype=torch.long)
    split = int(0.9 * len(data))
    train, held = data[:split], data[split:]

    results = [train_one(name.strip(), args, train, held, out) for name in args.models.split(",") if name.strip()]
    print("\n| model | steps | tokens | time (s) | val loss before | train loss (last 50) | val loss after | bits/byte |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['steps']} | {r['steps'] * args.batch_size * args.seq_len:,} | {r['seconds']:.0f} | "
              f"{r['val0']:.3f} | {r['train']:.3f} | {r['val']:.3f} | {r['val'] / math.log(2):.2f} |")

    start = held[:4000].tolist().index(ord("\n"), 1000) + 1
    chunk = bytes(held[start:start + 256].tolist())   # whole lines of the held-out part, at most 256 bytes (show's T)
    para = chunk[:chunk.rindex(b"\n")].decode("utf-8", "replace")
    (out / "paragraph.txt").write_text(para, encoding="utf-8")
    hf = [a for r in results for a in ("--hf", str(r["folder"]))]
    text = ["--text-file", str(out / "paragraph.txt")]
    cmds = [["show", *hf, *text, "--layers", "all", "--out", str(out / "show")],
            ["show", *hf, *text, "--report", "--out", str(out / "report")]]
    for c in cmds:
        print("\nseqmix " + " ".join(c), flush=True)
        if not args.no_show:
            subprocess.run([sys.executable, "-m", "seqmix", *c], check=True)


if __name__ == "__main__":
    main()
