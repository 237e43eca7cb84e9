"""Helpers shared by the interop tests (tests/test_interop*.py): transformers' models converted to
seqmix mixers and compared with the original. Tiny random models, token ids, the logit bound
(INTEROP_RTOL), and the checks every family runs (logits in every mode, greedy generation step by step,
the mixers' step-mode calls, a few training steps)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from seqmix.interop import InteropMixer, from_transformers, seqmix_mixers
from tolerances import max_abs

#: converted vs original logits, float32: max abs error <= INTEROP_RTOL x the logits' scale
#: (max |logit|): conversion is exact up to float32 rounding of a different summation order
INTEROP_RTOL = 2e-4

VOCAB = 64


def ids(batch=2, T=21, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (batch, T), generator=g)  # no pad / eos token


def convert(m, **kw):
    """from_transformers(m, **kw) with chunk_size 8 wherever a mixer has one (T = 21 spans three
    chunks, the last one partial)."""
    c = from_transformers(m, **kw)
    for mx in seqmix_mixers(c).values():
        if "chunk_size" in type(mx.config).model_fields:
            mx.config.chunk_size = 8
    return c


def randomize(m, *, gain: float = 1.5, moved: tuple[str, ...] = (), add_vectors: bool = False,
              rule: Callable | None = None):
    """Every weight of ``m`` random (one generator, seed 1, parameters in order; tied ones once):
    embeddings N(0, 1); parameters whose name holds one of ``moved`` moved by 0.3 N(0, 1); norm weights
    moved by 0.2 N(0, 1); other vectors 0.3 N(0, 1) (moved by that with ``add_vectors``); matrices
    ``gain`` N(0, 1/fan_in). ``rule(name, p, r)`` handles a parameter first where it returns True.
    Returns ``m`` in eval mode."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if rule is not None and rule(name, p, r):
                continue
            if "embed" in name:
                p.copy_(r)
            elif any(k in name for k in moved):
                p.add_(0.3 * r)
            elif "norm" in name:
                p.add_(0.2 * r)
            elif p.dim() == 1:
                p.add_(0.3 * r) if add_vectors else p.copy_(0.3 * r)
            else:
                p.copy_(gain * r / math.sqrt(p.shape[-1]))
    return m.eval()


def converted(m, make=from_transformers):
    """``make(m)`` (from_transformers by default), checked: a new model of m's class, m's modules and
    weights untouched."""
    before = {k: v.clone() for k, v in m.state_dict().items()}
    classes = {p: type(x) for p, x in m.named_modules()}
    c = make(m)
    assert type(c) is type(m) and c is not m
    assert {p: type(x) for p, x in m.named_modules()} == classes
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())
    return c


def assert_refused(m, match: str) -> None:
    """from_transformers(m, inplace=True) raises a ValueError matching ``match`` and leaves m untouched
    (no mixer converted, even inplace)."""
    with pytest.raises(ValueError, match=match):
        from_transformers(m, inplace=True)
    assert not any(isinstance(x, InteropMixer) for x in m.modules())


def scale_err(a, b) -> float:
    """max|a - b| / max|b| over the finite entries (generate's scores hold -inf where a token is
    masked: those must be -inf in both)."""
    fin = torch.isfinite(b)
    assert torch.equal(fin, torch.isfinite(a)), "non-finite entries differ"
    a, b = a[fin], b[fin]
    return max_abs(a, b) / float(b.abs().max())


def unchanged(a, b) -> bool:
    """The two models' state dicts are equal, entry by entry."""
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def set_mode(c, mode: str) -> None:
    """``mode`` on every mixer that has it (a hybrid's other mixers run "auto")."""
    for mx in seqmix_mixers(c).values():
        mx.mode = mode if mode in mx.modes else "auto"


def all_modes(c) -> list[str]:
    return ["auto"] + sorted({mode for mx in seqmix_mixers(c).values() for mode in mx.modes})


class Recorder:
    """Measured errors (max |logit error| / max |logit|) by key, the largest kept; printed by ``pytest -s``."""

    def __init__(self, label: str):
        self.label, self.measured = label, {}

    def __call__(self, key: str, err: float) -> float:
        self.measured[key] = max(self.measured.get(key, 0.0), err)
        print(f"\n[{self.label}] {key}: {err:.3g}")
        return err


def _keep(key: str, err: float) -> float:
    return err


def assert_logits_equal_in_every_mode(m, c, x, name: str, record: Callable = _keep) -> None:
    """Every mode of every converted mixer (a hybrid's other mixers run "auto"), with and without
    transformers' cache object in the call, equals the original's logits to INTEROP_RTOL."""
    with torch.no_grad():
        ref = m(x, use_cache=False).logits
        assert float(ref.abs().max()) > 1.0  # the weights matter: not a near-uniform model
        for mode in all_modes(c):
            set_mode(c, mode)
            err = record(f"{name} float32 {mode}", scale_err(c(x, use_cache=False).logits, ref))
            assert err <= INTEROP_RTOL, f"{name}, mode {mode}: logits differ by {err:.3g} of their scale"
            assert scale_err(c(x, use_cache=True).logits, ref) <= INTEROP_RTOL, f"{name}, mode {mode}, with a cache"


def spy_on(model, monkeypatch):
    """Records (path, T, mode, state given) of every call into each converted mixer's forward pass."""
    calls = []
    for path, mx in seqmix_mixers(model).items():
        def spy(x, *, state, mode, need_state, _orig=mx._forward, _path=path):
            calls.append((_path, x.shape[1], mode, state is not None))
            return _orig(x, state=state, mode=mode, need_state=need_state)
        monkeypatch.setattr(mx, "_forward", spy)
    return calls


def assert_generate_equals(m, c, prompt, new: int, monkeypatch, name: str, record: Callable = _keep,
                           fresh_prefill: bool = True) -> None:
    """Greedy generation of ``new`` tokens: the converted model's sequences equal the original's and
    its scores agree to INTEROP_RTOL at every step. Each mixer runs one prefill of the prompt (from no
    state, or with ``fresh_prefill=False`` from any state but not as a step), then one decoding step
    (T == 1, mode "step", from its state) per generated token: the prefix is never run again."""
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, output_scores=True, return_dict_in_generate=True,
              attention_mask=torch.ones_like(prompt))
    ref = m.generate(prompt, **kw)
    calls = spy_on(c, monkeypatch)
    out = c.generate(prompt, **kw)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores) == new
    for t, (a, b) in enumerate(zip(out.scores, ref.scores)):
        err = record(f"{name} generate", scale_err(a, b))
        assert err <= INTEROP_RTOL, f"{name}: step {t} scores differ by {err:.3g}"
    for path in seqmix_mixers(c):
        mine = [(T, mode, has) for p, T, mode, has in calls if p == path]
        assert mine[0][0] == prompt.shape[1], f"{path}: {mine[0]}"
        if fresh_prefill:
            assert mine[0][2] is False, f"{path}: {mine[0]}"
        else:
            assert mine[0][1] != "step", f"{path}: {mine[0]}"
        assert mine[1:] == [(1, "step", True)] * (new - 1), f"{path}: {mine}"


def prefill_and_step(models, x, make_cache, positions: bool = False) -> list:
    """Each model's cache (``make_cache(model)``) after a prefill of x[:, :11] and one step on x[:, 11]
    (with ``positions``, position_ids passed: some hybrids start every call without them at 0)."""
    caches = []
    for model in models:
        cache = make_cache(model)
        for a, b in ((0, 11), (11, 12)):
            kw = {"position_ids": torch.arange(a, b)[None]} if positions else {}
            model(x[:, a:b], cache=cache, use_cache=True, **kw)
        caches.append(cache)
    return caches


def fine_tune(c, monkeypatch, steps: int = 12, **call_kw) -> tuple[list[float], set[str]]:
    """AdamW (lr 3e-3) on a fixed batch for ``steps`` steps; after the first backward pass every
    parameter of every converted mixer has a non-zero gradient. Returns the losses and the modes the
    mixers ran in."""
    calls = spy_on(c, monkeypatch)
    batch = ids(batch=4, T=24, seed=3)
    opt = torch.optim.AdamW(c.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        loss = c(batch, labels=batch, **call_kw).loss
        opt.zero_grad()
        loss.backward()
        if step == 0:
            for path, mx in seqmix_mixers(c).items():
                for name, p in mx.named_parameters():
                    assert p.grad is not None and float(p.grad.abs().max()) > 0, f"{path}.{name}: no gradient"
        opt.step()
        losses.append(loss.item())
    return losses, {mode for _, _, mode, _ in calls}


def assert_beam_search_equal(m, c, new: int = 5) -> None:
    """Beam search (3 beams, reordering the cache) generates the same tokens in both models."""
    prompt = ids(T=5)
    kw = dict(max_new_tokens=new, min_new_tokens=new, num_beams=3, do_sample=False, attention_mask=torch.ones_like(prompt))
    assert torch.equal(c.generate(prompt, **kw), m.generate(prompt, **kw))
