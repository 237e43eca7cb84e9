"""Stage 1, attention transfer: every student learns its own teacher layer, all layers at once.

The teacher is frozen. One teacher forward per batch gives every chosen layer's input x_l and
output y_l (hooks on the teacher's attention modules); student l trains on its own loss
(LoLCATs' layer-wise attention transfer; MOHAWK's matrix orientation for Φ):

    match="output"   L_l = mean ‖student_l(x_l) − y_l‖²                           (LoLCATs)
    match="phi"      L_l = mean over (batch, head, query i) of Σ_j (Φ_s[i, j] − Φ_t[i, j])²
                     on chunks of at most ``phi_len`` tokens (each chunk its own sequence)  (MOHAWK)
    match="both"     the sum of the two
    match="block"    L_l = mean ‖block_l(x_l) − y_l‖² with x_l, y_l the input and output of the teacher's whole
                     decoder layer l (attention, MLP, norms, residuals) and block_l the linearized model's
                     layer l fed the teacher's x_l: each block trained on its own (MOHAWK's hidden-state
                     alignment, stage 2)

With "phi" the layers' losses are backpropagated one layer at a time, so at most one layer's maps
([B, heads, T, T] of teacher and student) exist at once. The optimizer, its parameter groups and
the learning-rate schedule are the trainer's (``seqmix.train.optim``).

The transfer residual of layer l (what ``layers="auto:K"`` ranks) is the relative output error
‖student_l(x_l) − y_l‖² / ‖y_l‖² on held-out batches (or the Φ error with match="phi").
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..interop import InteropMixer, convert_module
from ..train.checkpoint import read_checkpoint
from ..train.optim import lr_at, param_groups
from .api import attention_layers, students
from .recipes import MATCHES

__all__ = ["MATCHES", "TRAINABLE", "capture", "phi_loss", "transfer", "residuals", "block_path"]



def block_path(attention_path: str) -> str:
    """The decoder layer that holds an attention module: "model.layers.3.self_attn" -> "model.layers.3"."""
    found = re.search(r"(?:^|\.)layers\.\d+(?=\.)", attention_path + ".")
    if found is None:
        raise ValueError(f"linearize: match 'block': the attention module {attention_path!r} is not inside a 'layers.N' decoder layer")
    return attention_path[: found.end()]


class capture:
    """Context manager: hooks on the teacher's attention modules at ``layers`` (``level="attention"``)
    or on the decoder layers that hold them (``level="block"``) that record, for each forward, the
    module's input hidden states ``inputs[l]`` [B, T, d], its output ``outputs[l]``, and its call's
    other arguments ``calls[l]`` = (args after the hidden states, kwargs) to call another module alike."""

    def __init__(self, teacher: nn.Module, layers: Iterable[int], level: str = "attention"):
        paths = attention_layers(teacher)
        self.modules = {l: teacher.get_submodule(block_path(paths[l]) if level == "block" else paths[l]) for l in layers}
        self.inputs: dict[int, torch.Tensor] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.calls: dict[int, tuple[tuple, dict]] = {}
        self.handles = []

    def __enter__(self):
        for l, m in self.modules.items():
            def pre(mod, args, kwargs, l=l):
                if "hidden_states" in kwargs:
                    self.inputs[l] = kwargs["hidden_states"]
                    self.calls[l] = (args, {k: v for k, v in kwargs.items() if k != "hidden_states"})
                else:
                    self.inputs[l] = args[0]
                    self.calls[l] = (args[1:], dict(kwargs))

            def post(mod, args, kwargs, out, l=l):
                self.outputs[l] = out[0] if isinstance(out, tuple) else out

            self.handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            self.handles.append(m.register_forward_hook(post, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()


def _chunks(x: torch.Tensor, phi_len: int) -> torch.Tensor:
    """[B, T, d] -> [B·ceil(T/phi_len), ≤ phi_len, d]: non-overlapping chunks as sequences (the last
    chunk dropped when shorter than the others and there are several)."""
    B, T, d = x.shape
    if T <= phi_len:
        return x
    n = T // phi_len
    return x[:, : n * phi_len].reshape(B * n, phi_len, d)


def phi_loss(student_map: torch.Tensor, teacher_map: torch.Tensor) -> torch.Tensor:
    """Σ_j (Φ_s[i, j] − Φ_t[i, j])², averaged over batch, heads and query rows i; maps [B, H, T, T]."""
    if student_map.shape != teacher_map.shape:
        raise ValueError(f"linearize: argument 'match' = 'phi': the student's maps {list(student_map.shape)} do not pair "
                         f"with the teacher's {list(teacher_map.shape)} (one map per teacher head is needed)")
    return (student_map.float() - teacher_map.float()).pow(2).sum(-1).mean()


def _teacher_mixers(teacher: nn.Module, layers) -> dict[int, nn.Module]:
    """The teacher's attention at ``layers`` as seqmix softmax attention mixers (their Φ)."""
    paths = attention_layers(teacher)
    out = {}
    for l in layers:
        m = teacher.get_submodule(paths[l])
        out[l] = (m.mixer if isinstance(m, InteropMixer) else convert_module(m, teacher.config, path=paths[l]).mixer).eval()
    return out


def _blocks(model: nn.Module, layers) -> dict[int, nn.Module]:
    """The decoder layers of ``model`` that hold the attention modules at ``layers``."""
    paths = attention_layers(model)
    return {l: model.get_submodule(block_path(paths[l])) for l in layers}


def _student_output(adapter, block, cap, l: int, match: str) -> torch.Tensor:
    """The student's side of layer l on the captured batch: the student mixer on the teacher's attention
    input, or (``match="block"``) the linearized decoder layer on the teacher's decoder-layer input."""
    x = cap.inputs[l].detach()
    if match != "block":
        return adapter.mixer(x)
    args, kwargs = cap.calls[l]
    out = block(x, *args, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _layer_losses(studs, tmix, cap, match: str, phi_len: int, backward: bool, blocks=None) -> dict[int, torch.Tensor]:
    """Each student layer's loss on the captured batch (backpropagated layer by layer when ``backward``)."""
    out = {}
    for l, adapter in studs.items():
        x, y = cap.inputs[l].detach(), cap.outputs[l].detach()
        loss = x.new_zeros((), dtype=torch.float32)
        if match in ("output", "both", "block"):
            loss = loss + F.mse_loss(_student_output(adapter, blocks and blocks[l], cap, l, match).float(), y.float())
        if match in ("phi", "both"):
            xc = _chunks(x, phi_len)
            with torch.no_grad():
                t_map = tmix[l].phi(xc)
            loss = loss + phi_loss(adapter.mixer.phi(xc), t_map)
        if backward:
            loss.backward()  # frees this layer's graph (and maps) before the next layer's
        out[l] = loss.detach()
    return out


def residuals(model: nn.Module, teacher: nn.Module, batches: list[torch.Tensor], *, match: str = "output",
              phi_len: int = 512) -> dict[int, float]:
    """{layer: transfer residual} of the students of ``model`` on ``batches`` (token ids [B, T]):
    the relative output error Σ‖s(x) − y‖² / Σ‖y‖² ("output", "both"; "block": of the decoder layer's
    output), or the Φ error ("phi")."""
    if match not in MATCHES:
        raise ValueError(f"linearize: argument 'match' must be one of {', '.join(MATCHES)}, got {match!r}")
    studs = students(model)
    tmix = _teacher_mixers(teacher, studs) if match == "phi" else None
    blocks = _blocks(model, studs) if match == "block" else None
    num = {l: 0.0 for l in studs}
    den = {l: 0.0 for l in studs}
    was = {l: a.training for l, a in studs.items()}
    with torch.no_grad():
        for ids in batches:
            with capture(teacher, studs, level="block" if match == "block" else "attention") as cap:
                teacher(input_ids=ids, use_cache=False)
            for l, a in studs.items():
                a.eval()
                x, y = cap.inputs[l], cap.outputs[l]
                if match == "phi":
                    xc = _chunks(x, phi_len)
                    num[l] += float(phi_loss(a.mixer.phi(xc), tmix[l].phi(xc))) * ids.shape[0]
                    den[l] += ids.shape[0]
                else:
                    num[l] += float((_student_output(a, blocks and blocks[l], cap, l, match).float() - y.float()).pow(2).sum())
                    den[l] += float(y.float().pow(2).sum())
    for l, a in studs.items():
        a.train(was[l])
    return {l: num[l] / max(den[l], 1e-30) for l in studs}


TRAINABLE = ("all", "new", "block")


def _freeze_copied(studs, teacher: nn.Module) -> list:
    """Stage 1 with ``trainable="new"``: the student weights the init table copied from the teacher are
    frozen — whole tensors by ``requires_grad = False``, row blocks of a packed projection (Mamba-2's
    in_proj) by a gradient mask — so only the new parameters train (LoLCATs' stage 1). Returns the hook
    handles (removed after stage 1)."""
    from .init import copied_rows, teacher_weights

    tmix = _teacher_mixers(teacher, studs)
    handles = []
    for l, adapter in studs.items():
        params = dict(adapter.mixer.named_parameters())
        for name, blocks in copied_rows(adapter.mixer, teacher_weights(tmix[l])).items():
            p = params[name]
            if any(b is None for b in blocks):
                p.requires_grad_(False)
                continue
            mask = torch.ones_like(p)
            for a, b in blocks:
                mask[a:b] = 0
            handles.append(p.register_hook(lambda g, mask=mask: g * mask.to(g.dtype)))
    return handles


#: what stage 1's progress file holds (tensors, containers and numbers only: read back with weights_only=True)
_PROGRESS_KEYS = ("key", "steps", "step", "students", "optimizer", "history")


def _save_progress(path: Path, blob: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)  # atomic: a run killed while saving keeps the previous file


def transfer(model: nn.Module, teacher: nn.Module, batch: Callable[[int], torch.Tensor], *, steps: int, match: str = "output",
             lr: float = 1e-3, warmup: float = 0.1, weight_decay: float = 0.0, grad_clip: float | None = 1.0,
             phi_len: int = 512, trainable: str = "all", precision: str = "fp32",
             on_step: Callable[[int, dict], None] | None = None, log_every: int = 10,
             checkpoint: str | Path | None = None, save_every: int = 50, key: str = "") -> list[dict]:
    """Trains the students of the linearized ``model`` to match ``teacher`` for ``steps`` steps.
    ``batch(m)`` returns the token ids [B, T] of step m (moved to the students' device). Only the
    students' parameters change (the teacher is frozen; the rest of ``model`` is not touched):
    all of them (``trainable="all"``) or only those the init table did not copy from the teacher
    (``"new"``: feature maps, decays, gates, norms, convolutions — LoLCATs' stage 1); or
    (``"block"``) the whole decoder layers that hold the students (their MLPs and norms too).
    ``match``: one of :data:`MATCHES` (module docstring). ``precision``:
    the autocast dtype of the forwards ("fp32", "bf16", "fp16"; the losses are float32).

    ``checkpoint``: a file where the progress (the students, the optimizer, the history) is saved
    every ``save_every`` steps and at the end; a call that finds it (with the same ``key``) resumes
    after its last saved step, so a killed run loses at most ``save_every`` steps. Returns the history,
    one record per step ({"step", "loss", "layers": {l: loss}, "lr", "seconds"}); ``on_step(step,
    record)`` is called every ``log_every`` steps (the losses are read on the host only then)."""
    from ..train.distributed import check_precision
    from ..train.trainer import autocast

    if match not in MATCHES:
        raise ValueError(f"linearize: argument 'match' must be one of {', '.join(MATCHES)}, got {match!r}")
    if trainable not in TRAINABLE:
        raise ValueError(f"linearize: argument 'trainable' must be one of {', '.join(TRAINABLE)}, got {trainable!r}")
    if steps < 0:
        raise ValueError(f"linearize: argument 'steps' must be >= 0, got {steps}")
    if phi_len < 1:
        raise ValueError(f"linearize: argument 'phi_len' must be >= 1, got {phi_len}")
    if save_every < 1:
        raise ValueError(f"linearize: argument 'save_every' must be >= 1, got {save_every}")
    studs = students(model)
    if not studs:
        raise ValueError("linearize: argument 'model' holds no student (linearize it first)")
    blocks = _blocks(model, studs) if "block" in (match, trainable) else None
    # what trains: the students ("all", "new"), or the whole decoder layers that hold them ("block")
    holder = nn.ModuleList(blocks.values() if trainable == "block" else [a.mixer for a in studs.values()])
    trained = {id(p) for p in holder.parameters()}
    # the rest of a block that only carries the gradient to its student: no gradient kept for it
    carried = [p for b in (blocks or {}).values() for p in b.parameters() if id(p) not in trained and p.requires_grad]
    device = next(holder.parameters()).device
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"linearize: argument 'precision' of stage 1 must be fp32 or bf16 (fp16 would need gradient scaling), "
                         f"got {precision!r}")
    check_precision(precision, device)
    teacher.eval()  # frozen: its forwards run under no_grad
    tmix = _teacher_mixers(teacher, studs) if match in ("phi", "both") else None
    for p in holder.parameters():
        p.requires_grad_(True)
        p.grad = None
    handles = _freeze_copied(studs, teacher) if trainable == "new" else []
    if trainable == "new" and not any(p.requires_grad for p in holder.parameters()):
        for p in holder.parameters():
            p.requires_grad_(True)
        raise ValueError(f"linearize: argument 'trainable' = 'new': the students "
                         f"({', '.join(sorted({a.mixer.registry_name for a in studs.values()}))}) have no parameter the init "
                         "table did not copy from the teacher (nothing to train): use 'all'")
    for p in carried:
        p.requires_grad_(False)
    for m in (holder if trainable == "block" else studs.values()):
        m.train()
    opt = torch.optim.AdamW(param_groups(holder, weight_decay), lr=lr)
    history, pending = [], []
    layers = list(studs)
    start = 0
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and ckpt.is_file():
        blob = read_checkpoint(ckpt, map_location=device, keys=_PROGRESS_KEYS)  # weights_only: a planted file runs nothing
        if blob.get("key") == key and blob.get("steps") == steps:
            holder.load_state_dict(blob["students"])
            opt.load_state_dict(blob["optimizer"])
            start, history = int(blob["step"]), list(blob["history"])

    def flush():  # the host reads the losses only here (every log_every steps), not in every step
        for m1, t, cur, secs in pending:
            vals = dict(zip(layers, t.tolist()))
            rec = {"step": m1, "loss": sum(vals.values()) / len(vals), "layers": vals, "lr": cur, "seconds": secs}
            if not all(math.isfinite(v) for v in vals.values()):
                raise ValueError(f"linearize: stage 1 diverged at step {m1} (loss {rec['loss']}): lower the transfer lr ({lr})")
            history.append(rec)
        pending.clear()

    def save(step: int):
        _save_progress(ckpt, {"key": key, "steps": steps, "step": step, "students": holder.state_dict(),
                              "optimizer": opt.state_dict(), "history": history})

    try:
        for m in range(start, steps):
            t0 = time.perf_counter()
            cur = lr_at(m, total=steps, lr=lr, warmup=warmup)
            for g in opt.param_groups:
                g["lr"] = cur
            ids = batch(m).to(device)
            with torch.no_grad(), autocast(precision, device):
                with capture(teacher, studs, level="block" if match == "block" else "attention") as cap:
                    teacher(input_ids=ids, use_cache=False)
            opt.zero_grad(set_to_none=True)
            with autocast(precision, device):
                losses = _layer_losses(studs, tmix, cap, match, phi_len, backward=True, blocks=blocks)
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(holder.parameters(), grad_clip)
            opt.step()
            pending.append((m + 1, torch.stack([losses[l] for l in layers]), cur, time.perf_counter() - t0))
            logged = (m + 1) % log_every == 0 or m + 1 == steps
            saved = ckpt is not None and ((m + 1) % save_every == 0 or m + 1 == steps)
            if logged or saved:
                flush()
            if saved:
                save(m + 1)
            if logged and on_step is not None and history:
                on_step(history[-1]["step"], history[-1])
    finally:
        for h in handles:
            h.remove()
        for p in [*holder.parameters(), *carried]:  # the frozen copies ("new") are trainable again for stage 2
            p.requires_grad_(True)
    for m in (holder if trainable == "block" else studs.values()):
        m.eval()
    return history
