"""Language-model evaluation of a trained run: perplexity and bits per byte on a split, loss
by position, and length generalization (docs/lm.md, "Length generalization").

    from seqmix.analysis.trained import load_run
    from seqmix.analysis.lm import evaluate_lm, length_generalization, plot_length_generalization
    config, model = load_run("runs/<id>")
    evaluate_lm(config, model, split="test")          # {"loss", "ppl", "bpb", "accuracy", "windows", ...}
    lg = length_generalization(config, model)         # ppl at 1×, 2×, 4× the training context
    plot_length_generalization(lg, "length.png")

Length generalization evaluates the same tokens (the first ``max_tokens`` of the split) cut
into contiguous windows of k·T for k in ``multiples`` (T = the training context), so the
figures differ only by the context each token sees. The B'MOJO and SSM papers' claim is
that recurrent models keep (or improve) their perplexity past T; attention with learned
absolute positions cannot even be run there: its position table has T rows. seqmix's
choice: such a model is reported as not evaluated at k·T > max_seq_len, with the reason
(no silent wrap-around or extrapolated table); train attention with ``positions="none"``
(causal attention without position embeddings, "NoPE") to measure its extrapolation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .._plotting import save_figure


def _corpus(config):
    from ..data.text import CorpusConfig

    if not isinstance(config.data, CorpusConfig):
        raise ValueError(f"argument 'config': run {config.run_id} is not a language-modelling run (its data is a synthetic task set)")
    return config.data


def _windows(config, split: str, seq_len: int | None, batch_size: int | None = None):
    from ..data.text import build_corpus

    return build_corpus(_corpus(config), split, seq_len=seq_len, batch_size=batch_size)


def evaluate_lm(config, model, *, split: str = "val", seq_len: int | None = None, max_batches: int | None = None,
                batch_size: int | None = None) -> dict:
    """Loss, perplexity, bits per byte and next-token accuracy of ``model`` on contiguous
    windows of ``split`` — the trainer's own evaluation (:meth:`seqmix.train.Trainer.evaluate`)."""
    from ..train.trainer import Trainer

    w = _windows(config, split, seq_len, batch_size)
    _check_length(model, w.seq_len)
    ev = Trainer(config, progress=False).evaluate(model, w, max_batches=max_batches)
    n = w.num_windows() if max_batches is None else min(w.num_windows(), max_batches * w.batch_size)
    return {**ev, "split": split, "seq_len": w.seq_len, "windows": n, "tokens": n * w.seq_len}


def _check_length(model, T: int) -> None:
    if model.pos is not None and T > model.pos.num_embeddings:
        raise ValueError(f"seq_len: {T} tokens exceed the model's learned position table (max_seq_len = "
                         f"{model.pos.num_embeddings}); a model with learned absolute positions cannot be evaluated past "
                         "its training context (train it with positions='none' to measure extrapolation)")


def position_losses(model, windows, *, max_windows: int | None = None, precision: str = "fp32") -> np.ndarray:
    """Mean next-token loss (nats) at each position 0 … T−1 over contiguous windows [T]."""
    from ..train.trainer import autocast

    _check_length(model, windows.seq_len)
    device = next(model.parameters()).device
    total = torch.zeros(windows.seq_len, dtype=torch.float64)
    n = 0
    was = model.training
    model.eval()
    with torch.no_grad():
        for b in windows.batches():
            if max_windows is not None and n >= max_windows:
                break
            x, y = b.inputs.to(device), b.labels.to(device)
            if max_windows is not None:
                x, y = x[: max_windows - n], y[: max_windows - n]
            with autocast(precision, device):
                logits = model(x)
            loss = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")  # [B, T]
            total += loss.double().sum(0).cpu()
            n += x.shape[0]
    model.train(was)
    if n == 0:
        raise ValueError("position_losses: the split has no window of this length")
    return (total / n).numpy()


def length_generalization(config, model, *, split: str = "val", multiples=(1, 2, 4), max_tokens: int | None = None,
                          bins: int = 64) -> dict:
    """Perplexity at k·T for k in ``multiples`` on the same tokens, with the loss by position
    (module docstring). Returns {"seq_len": T, "bytes_per_token", "results": [{k, seq_len, ppl,
    bpb, loss, windows, positions: [..], position_loss: [..]} or {k, seq_len, error}]}."""
    multiples = list(multiples)
    if not multiples or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in multiples):
        raise ValueError(f"argument --lengths: expected context multiples that are integers >= 1 (such as 1,2,4), got "
                         f"{','.join(map(str, multiples)) or 'none'}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"argument --max-tokens: expected an integer >= 1, got {max_tokens}")
    data = _corpus(config)
    T = data.seq_len
    kmax = max(multiples)
    base = _windows(config, split, T)
    n_avail = len(base.tokens) - 1
    span = (n_avail // (kmax * T)) * kmax * T
    if span == 0:
        raise ValueError(f"multiples: the {split!r} split has {n_avail + 1} tokens, fewer than {kmax}×{T} + 1")
    if max_tokens is not None:
        span = min(span, max(kmax * T, (max_tokens // (kmax * T)) * kmax * T))
    out = []
    for k in multiples:
        L = k * T
        row = {"k": k, "seq_len": L}
        try:
            w = _windows(config, split, L, batch_size=max(1, data.eval_batch_size or data.batch_size) // k or 1)
            pl = position_losses(model, w, max_windows=span // L, precision=config.train.precision)
        except ValueError as e:
            row["error"] = str(e)
            out.append(row)
            continue
        loss = float(pl.mean())
        edges = np.linspace(0, L, min(bins, L) + 1).astype(int)
        row.update({
            "loss": loss, "ppl": math.exp(min(loss, 700.0)), "bpb": loss / math.log(2) / base.bytes_per_token,
            "windows": span // L, "tokens": span,
            "positions": [int((a + b + 1) // 2) for a, b in zip(edges[:-1], edges[1:])],  # 1-based centres
            "position_loss": [float(pl[a:b].mean()) for a, b in zip(edges[:-1], edges[1:])],
        })
        out.append(row)
    return {"run_id": config.run_id, "label": config.name, "split": split, "seq_len": T,
            "bytes_per_token": base.bytes_per_token, "results": out}


def plot_length_generalization(results: dict | list[dict], path: str | Path) -> Path:
    """Loss by position (one line per run and context multiple), the training context marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results if isinstance(results, list) else [results]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    T = runs[0]["seq_len"]
    for i, lg in enumerate(runs):
        color = f"C{i % 10}"
        for r in lg["results"]:
            if "error" in r:
                continue
            ax.plot(r["positions"], r["position_loss"], color=color, alpha=0.35 + 0.65 * (r["k"] == max(x["k"] for x in lg["results"])),
                    label=f"{lg['label']} {r['k']}×T: ppl {r['ppl']:.2f}")
    ax.axvline(T, color="k", ls="--", lw=1)
    ax.text(T, ax.get_ylim()[1], " training context T", va="top", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in the window")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title("Length generalization: loss by position at 1×, 2×, 4× the training context", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path, dpi=110, argument="--plot")


__all__ = ["evaluate_lm", "length_generalization", "plot_length_generalization", "position_losses"]
