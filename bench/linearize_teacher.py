"""The bench teacher of bench/linearize.py: a Llama- or Qwen3-architecture transformers model trained here
on Tiny Shakespeare bytes through seqmix's one Trainer, saved as a transformers checkpoint folder.

    python bench/linearize_teacher.py --out runs/lin_teacher --tokens 1200000          # the bench's size
    python bench/linearize_teacher.py --family qwen3 --out runs/lin_teacher_qwen3 --tokens 600000
    python bench/linearize_teacher.py --out /tmp/t --tokens 20000 --d-model 32 --layers 2   # a smoke run

The model is trained as transformers' own LlamaForCausalLM / Qwen3ForCausalLM (SDPA attention, RoPE,
GQA, SwiGLU; Qwen3 adds its per-head RMSNorm of q and k); the trainer sees it through
seqmix.interop.train.HFCausalLM. Prints the validation loss it measured.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace


FAMILIES = ("llama", "qwen3")


def teacher_config(d_model: int, layers: int, heads: int, kv_heads: int, vocab: int = 256, max_len: int = 2048,
                   family: str = "llama"):
    from transformers import LlamaConfig, Qwen3Config

    kw = dict(vocab_size=vocab, hidden_size=d_model, intermediate_size=3 * d_model, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_len,
              tie_word_embeddings=True, attn_implementation="sdpa")
    if family == "qwen3":  # Qwen3's own defaults would give 128-wide heads: the head width is d_model / heads here too
        return Qwen3Config(**kw, head_dim=d_model // heads, attention_bias=False)
    return LlamaConfig(**kw)


def model_class(family: str):
    from transformers import LlamaForCausalLM, Qwen3ForCausalLM

    return {"llama": LlamaForCausalLM, "qwen3": Qwen3ForCausalLM}[family]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--family", choices=FAMILIES, default="llama", help="the teacher's architecture (default llama)")
    p.add_argument("--tokens", type=int, default=1_600_000)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)

    import torch
    from seqmix.data import CorpusConfig
    from seqmix.interop import convert_module
    from seqmix.interop.train import HFCausalLM
    from seqmix.models import ModelConfig
    from seqmix.train import Trainer
    from seqmix.train.checkpoint import read_checkpoint
    from seqmix.train.config import TrainConfig, make_run_config

    class TeacherLM(HFCausalLM):
        """transformers' own Llama for the trainer; ``blocks``: its attention as seqmix mixers (the
        FLOP estimate and state sizes read them; the forward is transformers')."""

        @property
        def blocks(self):
            return [SimpleNamespace(mixer=convert_module(layer.self_attn, self.hf.config).mixer) for layer in self.hf.model.layers]

    hcfg = teacher_config(a.d_model, a.layers, a.heads, a.kv_heads, family=a.family)
    cls = model_class(a.family)
    out = Path(a.out)
    run = make_run_config(
        experiment="linearize-teacher", label=f"{a.family} teacher",
        data=CorpusConfig(corpus="tinyshakespeare", tokenizer="byte", seq_len=a.seq_len, batch_size=a.batch_size),
        model=ModelConfig(mixer="softmax_attention", d_model=a.d_model, n_layers=a.layers, vocab_size=256, positions="none"),
        train=TrainConfig(lr=a.lr, max_tokens=a.tokens, weight_decay=0.1, early_stop=None, eval_batches=16, threads=a.threads,
                          min_lr=0.1),
        tags={"heads": a.heads, "kv_heads": a.kv_heads}, init_from_hf=f"bench-teacher:{a.d_model}x{a.layers}" + ("" if a.family == "llama" else f":{a.family}"))

    def build(_):
        torch.manual_seed(0)
        return TeacherLM(cls(hcfg), run.model)

    t0 = time.perf_counter()
    result = Trainer(run, run_dir=out / "run", model_builder=build, progress=False, maps=False, tensorboard=False).fit()
    model = build(run)
    model.load_state_dict(read_checkpoint(out / "run" / "checkpoint.pt", keys=("run_id", "model"))["model"])
    model.hf.eval().save_pretrained(str(out / "model"))
    info = {"tokens": result.tokens, "val_loss": result.history[-1]["loss"], "val_bpb": result.history[-1].get("bpb"),
            "seconds": time.perf_counter() - t0, "config": {k: getattr(a, k) for k in vars(a)}}
    (out / "teacher.json").write_text(json.dumps(info, indent=1))
    print(f"teacher: {result.tokens} tokens, val loss {info['val_loss']:.4f} nats ({info['val_bpb']:.4f} bits/byte), "
          f"{info['seconds']:.0f} s -> {out / 'model'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
