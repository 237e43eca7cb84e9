"""The Mixer contract as checks anyone can run (DESIGN.md, "The tests every mixer gets for free").

    import seqmix
    seqmix.check_mixer("my_gla")              # every check below; ContractError names the first that fails
    seqmix.check_mixer("my_gla", heads=4)     # at another config (over the entry's example config)
    seqmix.check_mixer("my_gla", checks=["phi", "causality"])

Each check builds the registered mixer from its entry's ``example_config()`` (overridden by the
keyword arguments), with ``torch.manual_seed(0)``, in float64 unless it says otherwise, and runs it
on a batch of :data:`BATCH` random inputs at the lengths of :func:`lengths` (a multiple of the chunk
size and one that is not). tests/test_contract.py runs these very functions over the registry, so
a researcher's own mixer is held to exactly the suite the built-in ones pass.

    registry     the entry has a family, modes and a state formula; the reference mode is a mode
    modes_f64    every mode equals the reference mode, output and gradients, within F64_ATOL
    modes_f32    the same in float32, relative error within F32_RTOL
    step         decoding token by token through a Cache equals the full forward
    split        two calls carried through a Cache equal one pass, in every mode
    segments     a forward run in segments (``segment_len``) equals one pass, gradients and cache too
    phi          phi(x) applied to the core's values reproduces its output, and is causal
    dsf          dsf(x) evaluated reproduces the core output, and its blocks are phi(x) ⊗ I
                 (skipped for a mixer without a finite-state DSF)
    causality    changing x[t] never changes y[<t], and does change y[t], in every mode
    state_size   the cache holds BATCH · state_size(T) floats
    bad_input    wrong rank, width, dtype, type, NaN, an empty sequence, an unknown mode, an unknown
                 config field and d_model = 0 each raise a ValueError naming the argument
    pickles      a pickle round trip after a forward with a cache gives the same output and decoding step
                 (torch.save of a model, a spawned process: no lambda or nested function among its attributes)
    autocast     forward and backward under bfloat16 and float16 autocast stay within MP_RTOL /
                 MP_GRAD_RTOL of float32
    bf16_params  mixer.to(bfloat16) runs forward and backward and stays within MP_RTOL of float32

Tolerances are stated here once; tests/tolerances.py takes them from this module.
"""

from __future__ import annotations

from typing import Callable

import torch

from .debug import host_reads
from .mixers.base import Cache, Mixer, build_mixer, mixer_entry

#: max abs error between two modes of an op or a mixer, in float64 (outputs and gradients are O(1))
F64_ATOL = 1e-9
#: relative error between two modes in float32: max|a - b| / max|b|
F32_RTOL = 1e-4
#: mixed precision: relative error max|y - y32| / max|y32| of a mixer's output under autocast (or
#: with half parameters) against float32. bf16 keeps 8 significant bits (2⁻⁹ ≈ 2e-3 per rounding):
#: 3e-2 is the bound at T = 512 with the default config (measured worst: 0.017, metala with
#: bf16 parameters). fp16 keeps 11 bits, 8x finer.
MP_RTOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
#: the same for the gradients (w.r.t. x and every parameter), relative to each gradient's max:
#: a gradient sums T·B products of rounded terms, hence the looser bound (measured worst at the
#: example configs: bf16 0.037, hyena's filter.freq; fp16 0.005, dsf_ssd's A_log)
MP_GRAD_RTOL = {torch.bfloat16: 1e-1, torch.float16: 2e-2}
#: the fixed loss scale of the float16 checks (what torch.amp.GradScaler does dynamically):
#: without it, small gradients (Mamba's dt_proj) underflow float16
FP16_LOSS_SCALE = 2.0**10
#: the batch of every check
BATCH = 2
#: the device the checks build their mixers and inputs on (:func:`use_device`; pytest ``--device``)
_DEVICE = [torch.device("cpu")]


def use_device(device) -> None:
    """Runs the checks that follow on ``device`` ("cpu", "cuda", "cuda:1", ...): the mixers and inputs of
    :func:`make` and :func:`inputs` are moved there (the random draws stay on the CPU, so every device
    sees the same numbers). The test suite's ``pytest --device cuda`` calls it."""
    try:
        _DEVICE[0] = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"use_device: argument 'device' must be a torch device such as cpu or cuda, got {device!r}") from None


def device() -> torch.device:
    """The device of the checks (:func:`use_device`)."""
    return _DEVICE[0]


class ContractError(AssertionError):
    """A mixer breaks the contract; the message names the mixer, the check and what differed."""


class CheckSkipped(Exception):
    """A check that does not apply to the mixer (one mode only; no finite-state DSF); the message says why."""


def _require(ok, message: str) -> None:
    if not ok:
        raise ContractError(message)


# ------------------------------------------------------------------------------------------
# measures and helpers
# ------------------------------------------------------------------------------------------


def max_abs(a, b) -> float:
    return float((a - b).detach().abs().max())


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (the float32 measure)."""
    a, b = a.detach(), b.detach()
    den = float(b.abs().max())
    return float((a - b).abs().max()) / max(den, 1e-30)


def forward_and_grads(m, x, mode):
    """Output and gradients (w.r.t. x and every parameter) of a random projection of the output."""
    m.mode = mode
    x = x.clone().requires_grad_(True)
    y = m(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype).to(y.device)
    params = [p for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * w).sum(), [x, *params], allow_unused=True)
    return y.detach(), grads


def mixed_forward_and_grads(m, x, dtype=None):
    """Output (float32) and gradients of a mean-scaled random projection of m(x) (a loss of
    the size training uses: a sum would overflow float16 gradients), under
    ``torch.autocast(x.device.type, dtype)`` when ``dtype`` is given; float16 scales the loss
    by FP16_LOSS_SCALE and the gradients back."""
    x = x.clone().requires_grad_(True)
    if dtype is None:
        y = m(x)
    else:
        with torch.autocast(x.device.type, dtype=dtype):
            y = m(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y.device)
    params = [p for p in m.parameters() if p.requires_grad]
    scale = FP16_LOSS_SCALE if dtype == torch.float16 else 1.0
    grads = torch.autograd.grad((y.float() * w).mean() * scale, [x, *params], allow_unused=True)
    return y.detach().float(), [g.float() / scale if g is not None else None for g in grads]


def assert_modes_agree_f64(m, x, where: str = ""):
    """Every mode of mixer m equals its reference mode on x (float64): outputs and gradients
    within F64_ATOL. Returns the reference output."""
    y_ref, g_ref = forward_and_grads(m, x, m.reference_mode)
    for mode in m.modes:
        if mode == m.reference_mode:
            continue
        y, g = forward_and_grads(m, x, mode)
        _require(max_abs(y, y_ref) < F64_ATOL, f"{where}: mode {mode} vs {m.reference_mode}, max abs error {max_abs(y, y_ref):.3g}")
        for i, (a, b) in enumerate(zip(g, g_ref)):
            if a is None or b is None:
                _require(a is None and b is None, f"{where}: gradient {i} missing in one mode")
                continue
            _require(max_abs(a, b) < F64_ATOL, f"{where}: gradient {i} of mode {mode}, max abs error {max_abs(a, b):.3g}")
    m.mode = m.reference_mode
    return y_ref


def make(name: str, dtype=torch.float64, **overrides) -> Mixer:
    """The registered mixer ``name`` at its example config (with ``overrides``), seed 0, in eval mode."""
    entry = mixer_entry(name)
    torch.manual_seed(0)
    return build_mixer(name, **{**entry.example_config(), **overrides}).to(device=device(), dtype=dtype).eval()


def lengths(m) -> list[int]:
    """A multiple of the chunk size and a length that is not one (both > one chunk)."""
    c = getattr(m.config, "chunk_size", 8) or 8
    return [2 * c, 2 * c + 3]


def inputs(m, T, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, T, m.d_model, generator=g, dtype=dtype).to(device())


def mp_length(m) -> int:
    """Several chunks long, within the filter/kernel length of the example config."""
    return min(4 * (getattr(m.config, "chunk_size", 8) or 8) + 3, getattr(m.config, "l_max", None) or 1 << 30)


def _other_modes(m):
    return [mode for mode in m.modes if mode != m.reference_mode]


def _raises(fn, match: str, what: str) -> None:
    """fn() raises a ValueError whose message contains ``match``."""
    try:
        fn()
    except ValueError as e:
        _require(match in str(e), f"{what}: the ValueError does not name {match!r}: {e}")
        return
    raise ContractError(f"{what}: no ValueError raised")


# ------------------------------------------------------------------------------------------
# the checks: each takes the registered name and config overrides
# ------------------------------------------------------------------------------------------


def check_registry_entry(name: str, **overrides) -> None:
    entry = mixer_entry(name)
    m = make(name, **overrides)
    _require(entry.family and entry.modes and entry.state_formula, f"{name}: the class needs family, modes and state_formula")
    _require(m.reference_mode in m.modes, f"{name}: reference_mode {m.reference_mode!r} is not one of modes {m.modes}")
    _require(m.registry_name == name, f"{name}: registry_name is {m.registry_name!r}")


def check_modes_agree_float64(name: str, **overrides) -> None:
    m = make(name, **overrides)
    if len(m.modes) < 2:
        raise CheckSkipped(f"{name} has a single mode {m.modes}; nothing to compare")
    for T in lengths(m):
        assert_modes_agree_f64(m, inputs(m, T), f"{name}, T={T}")


def check_modes_agree_float32(name: str, **overrides) -> None:
    m = make(name, torch.float32, **overrides)
    if len(m.modes) < 2:
        raise CheckSkipped(f"{name} has a single mode {m.modes}; nothing to compare")
    x = inputs(m, lengths(m)[1], torch.float32)
    y_ref, g_ref = forward_and_grads(m, x, m.reference_mode)
    for mode in _other_modes(m):
        y, g = forward_and_grads(m, x, mode)
        _require(y.dtype == torch.float32, f"{name}: mode {mode} returns {y.dtype} on float32 input")
        _require(rel_err(y, y_ref) < F32_RTOL, f"{name}: mode {mode}, rel. error {rel_err(y, y_ref):.3g} in float32")
        for i, (a, b) in enumerate(zip(g, g_ref)):
            if a is not None:
                _require(rel_err(a, b) < F32_RTOL, f"{name}: gradient {i} of mode {mode}, rel. error {rel_err(a, b):.3g} in float32")


def check_step_decoding(name: str, **overrides) -> None:
    m = make(name, **overrides)
    T = lengths(m)[1]
    x = inputs(m, T)
    m.mode = m.reference_mode
    y_full = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    _require(max_abs(steps, y_full) < F64_ATOL, f"{name}: step decoding differs from the forward by {max_abs(steps, y_full):.3g}")


def check_pickles(name: str, **overrides) -> None:
    """The mixer pickles and loads back exactly (what torch.save of a model and a copy sent to a spawned process
    need): after a forward with a cache (its kept constants and tables made), a pickle round trip in memory gives a
    mixer with the same output and the same decoding step from the saved state."""
    import pickle

    m = make(name, **overrides)
    T = lengths(m)[1]
    x = inputs(m, T + 1)
    cache = Cache()
    y = m(x[:, :T], cache=cache)
    step = m(x[:, T:], cache=cache)
    try:
        data = pickle.dumps(m)
    except Exception as e:  # (pickling's own errors: AttributeError, PicklingError, TypeError)
        raise ContractError(f"{name}: the mixer does not pickle ({type(e).__name__}: {e}); keep lambdas and nested functions "
                            "out of its attributes (module-level functions, functools.partial)") from None
    m2 = pickle.loads(data)  # (bytes this check made itself, in memory: no file is read)
    cache2 = Cache()
    _require(max_abs(m2(x[:, :T], cache=cache2), y) == 0, f"{name}: the loaded mixer's output differs from the saved one's")
    _require(max_abs(m2(x[:, T:], cache=cache2), step) == 0, f"{name}: the loaded mixer's decoding step differs")


def check_split_and_carry(name: str, **overrides) -> None:
    m = make(name, **overrides)
    T = lengths(m)[1]
    x = inputs(m, T)
    m.mode = m.reference_mode
    y_full = m(x)
    for mode in m.modes:
        m.mode = mode
        for cut in (1, T // 2, T - 2):
            cache = Cache()
            y = torch.cat([m(x[:, :cut], cache=cache), m(x[:, cut:], cache=cache)], 1)
            _require(max_abs(y, y_full) < F64_ATOL, f"{name}: mode {mode}, split at {cut}: error {max_abs(y, y_full):.3g}")


def check_segmented_forward(name: str, **overrides) -> None:
    """segment_len: a forward longer than it runs in segments that carry the state (the split-and-carry
    above, done by the mixer itself), uneven last segment included; outputs and gradients as one pass,
    with and without a cache, and the cache holds the same state afterwards (decoding continues alike)."""
    m = make(name, **overrides)
    if m.uses_context:
        _raises(lambda: make(name, **{**overrides, "segment_len": 5}),
                "segment_len = 5 cannot be used by a mixer that reads the per-forward context", f"{name}: segment_len with context")
        return
    T = lengths(m)[1]
    L = max(1, T // 3 + 1)  # 3 segments, the last one shorter
    seg = make(name, **{**overrides, "segment_len": L})
    _require(seg.segment_len == L, f"{name}: segment_len = {L} reads back as {seg.segment_len}")
    whole = make(name, **{**overrides, "segment_len": 0})
    _require(whole.segment_len is None, f"{name}: segment_len = 0 reads back as {whole.segment_len}")
    for a in (seg, whole):
        a.mode = m.reference_mode
    x = inputs(m, T).requires_grad_(True)
    y_seg, y_whole = seg(x), whole(x)
    _require(max_abs(y_seg, y_whole) < F64_ATOL, f"{name}: segmented forward differs by {max_abs(y_seg, y_whole):.3g}")
    g = torch.randn(y_seg.shape, generator=torch.Generator().manual_seed(3), dtype=y_seg.dtype).to(y_seg.device)
    gx_seg, *gp_seg = torch.autograd.grad((y_seg * g).sum(), [x, *seg.parameters()], allow_unused=True)
    gx_whole, *gp_whole = torch.autograd.grad((y_whole * g).sum(), [x, *whole.parameters()], allow_unused=True)
    _require(max_abs(gx_seg, gx_whole) < F64_ATOL, f"{name}: segmented gradient w.r.t. x differs")
    for i, (u, v) in enumerate(zip(gp_seg, gp_whole)):
        _require((u is None) == (v is None) and (u is None or max_abs(u, v) < F64_ATOL), f"{name}: segmented gradient of parameter {i}")
    c_seg, c_whole = Cache(), Cache()
    with torch.no_grad():
        _require(max_abs(seg(x, cache=c_seg), whole(x, cache=c_whole)) < F64_ATOL, f"{name}: segmented forward with a cache")
        nxt = inputs(m, 1, seed=7)
        _require(max_abs(seg(nxt, cache=c_seg), whole(nxt, cache=c_whole)) < F64_ATOL, f"{name}: decoding after a segmented forward")


def check_phi(name: str, **overrides) -> None:
    m = make(name, **overrides)
    x = inputs(m, lengths(m)[1])
    values, mixed = m.core(x)
    phi = m.phi(x)
    shape = (BATCH, values.shape[2], x.shape[1], x.shape[1])
    _require(tuple(phi.shape) == shape, f"{name}: phi(x) has shape {tuple(phi.shape)}, expected [batch, maps, T, T] = {shape}")
    err = max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed)
    _require(err < F64_ATOL, f"{name}: phi(x) applied to the values misses the core output by {err:.3g}")
    _require(torch.triu(phi, diagonal=1).abs().max() == 0, f"{name}: phi must be causal (zero above the diagonal)")


def check_dsf(name: str, **overrides) -> None:
    m = make(name, **overrides)
    if not m.finite_state:
        raise CheckSkipped(f"{name} has no finite-state DSF (documented in its class)")
    x = inputs(m, lengths(m)[0])
    values, mixed = m.core(x)
    system = m.dsf(x)
    B, T, M, P = values.shape
    err = max_abs(system.evaluate(values.reshape(B, T, M * P)), mixed.reshape(B, T, M * P))
    _require(err < F64_ATOL, f"{name}: dsf(x) evaluated misses the core output by {err:.3g}")
    # Φ of the DSF, block by block, is phi(x) ⊗ I_P
    blocks = system.blocks()  # [B, T, T, M·P, M·P]
    expected = torch.einsum("bmts,pq,mn->btsmpnq", m.phi(x), torch.eye(P, dtype=x.dtype), torch.eye(M, dtype=x.dtype))
    _require(max_abs(blocks, expected.reshape(B, T, T, M * P, M * P)) < F64_ATOL, f"{name}: the blocks of dsf(x) are not phi(x) ⊗ I")


def check_causality(name: str, **overrides) -> None:
    m = make(name, **overrides)
    T = lengths(m)[1]
    x = inputs(m, T)
    for mode in m.modes:
        m.mode = mode
        y = m(x)
        for t in (0, T // 2, T - 1):
            x2 = x.clone()
            x2[:, t] += torch.randn_like(x2[:, t])
            y2 = m(x2)
            if t:  # (not exactly 0: FFT modes and adaptive tiling round differently after any change)
                _require(max_abs(y2[:, :t], y[:, :t]) < F64_ATOL, f"{name}: mode {mode} leaks the future at t={t}")
            _require(max_abs(y2[:, t], y[:, t]) > 1e-6, f"{name}: mode {mode} ignores x[{t}]")


def check_state_size(name: str, **overrides) -> None:
    m = make(name, **overrides)
    T = lengths(m)[1]
    cache = Cache()
    m(inputs(m, T), cache=cache)
    _require(cache.floats() == BATCH * m.state_size(seq_len=T),
             f"{name}: the cache holds {cache.floats()} floats, BATCH · state_size(T) = {BATCH * m.state_size(seq_len=T)}")


def check_bad_input(name: str, **overrides) -> None:
    m = make(name, **overrides)
    d = m.d_model
    bad = {
        "rank": torch.randn(4, d, dtype=torch.float64),
        "width": torch.randn(2, 5, d + 1, dtype=torch.float64),
        "NaN": torch.full((2, 5, d), float("nan"), dtype=torch.float64),
        "dtype": torch.ones(2, 5, d, dtype=torch.long),
        "empty": torch.randn(2, 0, d, dtype=torch.float64),
        "type": [[0.0] * d],
    }
    for what, x in bad.items():
        x = x.to(device()) if isinstance(x, torch.Tensor) else x
        with host_reads("always"):  # the NaN check reads the input: off the CPU only on request (seqmix.debug)
            _raises(lambda: m(x), "'x'", f"{name}: input with a bad {what}")

    def set_mode(value):
        m.mode = value

    _raises(lambda: set_mode("no-such-mode"), "mode", f"{name}: an unknown mode")
    unsupported = [md for md in ("recurrent", "chunk", "parallel", "fft", "convolution") if md not in m.modes]
    for md in unsupported[:1]:
        _raises(lambda: set_mode(md), "mode", f"{name}: the mode {md!r} it does not have")
    _raises(lambda: build_mixer(name, not_a_field=1), "not_a_field", f"{name}: an unknown config field")
    _raises(lambda: build_mixer(name, d_model=0), "d_model", f"{name}: d_model = 0")


def check_mixed_precision_autocast(name: str, dtype: torch.dtype, **overrides) -> None:
    """Forward and backward under autocast: finite, and within MP_RTOL / MP_GRAD_RTOL of float32
    (the T = 512 figures at the default config: bench/scale.py)."""
    m = make(name, torch.float32, **overrides).train()
    x = inputs(m, mp_length(m), torch.float32)
    y_ref, g_ref = mixed_forward_and_grads(m, x)
    y, g = mixed_forward_and_grads(m, x, dtype)
    _require(torch.isfinite(y).all(), f"{name}: non-finite output under autocast {dtype}")
    _require(rel_err(y, y_ref) < MP_RTOL[dtype], f"{name}: output under autocast {dtype}, rel. error {rel_err(y, y_ref):.3g}")
    for i, (a, b) in enumerate(zip(g, g_ref)):
        if b is None or float(b.abs().max()) == 0:
            continue
        _require(a is not None and torch.isfinite(a).all(), f"{name}: gradient {i} missing or non-finite under {dtype}")
        _require(rel_err(a, b) < MP_GRAD_RTOL[dtype], f"{name}: gradient {i} under {dtype}, rel. error {rel_err(a, b):.3g}")


def check_mixed_precision_bf16_parameters(name: str, **overrides) -> None:
    """mixer.to(bfloat16) on bf16 input runs forward and backward with finite gradients, and
    matches float32 on the same (rounded) weights and input within MP_RTOL: the decays,
    states, complex systems and FFTs inside run in float32/complex64 whatever the parameters."""
    m = make(name, torch.bfloat16, **overrides).train()
    ref = make(name, torch.bfloat16, **overrides).float().train()
    x = inputs(m, mp_length(m), torch.float32).bfloat16()
    y_ref, _ = mixed_forward_and_grads(ref, x.float())
    y, g = mixed_forward_and_grads(m, x)
    _require(rel_err(y, y_ref) < MP_RTOL[torch.bfloat16], f"{name}: bf16 parameters, rel. error {rel_err(y, y_ref):.3g}")
    _require(all(a is None or torch.isfinite(a).all() for a in g), f"{name}: non-finite gradient with bf16 parameters")


#: the checks of :func:`check_mixer`, in order: name -> function(name, **overrides)
CHECKS: dict[str, Callable[..., None]] = {
    "registry": check_registry_entry,
    "modes_f64": check_modes_agree_float64,
    "modes_f32": check_modes_agree_float32,
    "step": check_step_decoding,
    "split": check_split_and_carry,
    "segments": check_segmented_forward,
    "phi": check_phi,
    "dsf": check_dsf,
    "causality": check_causality,
    "state_size": check_state_size,
    "bad_input": check_bad_input,
    "pickles": check_pickles,
    "autocast_bf16": lambda name, **kw: check_mixed_precision_autocast(name, torch.bfloat16, **kw),
    "autocast_fp16": lambda name, **kw: check_mixed_precision_autocast(name, torch.float16, **kw),
    "bf16_params": check_mixed_precision_bf16_parameters,
}


def check_mixer(mixer: str | Mixer, *, checks=None, **overrides) -> dict[str, str]:
    """Runs the contract checks (module docstring) on a registered mixer; returns {check: "passed" or
    "skipped: why"} and raises :class:`ContractError` at the first check that fails.

    ``mixer``: a registered name, or a built mixer (its registered name at its config: the checks
    build their own copies, in float64 and the other dtypes they test, from seed 0). ``checks``: names
    of :data:`CHECKS` (default: all). ``overrides``: config fields over the entry's example config."""
    if isinstance(mixer, Mixer):
        name = mixer.registry_name
        overrides = {**mixer.config.model_dump(exclude={"mode"}), **overrides}
    elif isinstance(mixer, str):
        name = mixer
    else:
        raise ValueError(f"check_mixer: argument 'mixer' must be a registered name or a Mixer, got {type(mixer).__name__}")
    mixer_entry(name)  # an unknown name: the ValueError listing the registered ones
    selected = list(CHECKS) if checks is None else list(checks)
    unknown = [c for c in selected if c not in CHECKS]
    if unknown:
        raise ValueError(f"check_mixer: argument 'checks' has unknown names {unknown}; expected some of {list(CHECKS)}")
    report = {}
    for check in selected:
        try:
            CHECKS[check](name, **overrides)
        except CheckSkipped as e:
            report[check] = f"skipped: {e}"
        except ContractError as e:
            raise ContractError(f"check_mixer({name!r}): check {check!r} failed: {e}") from None
        else:
            report[check] = "passed"
    return report


__all__ = [
    "BATCH", "CHECKS", "CheckSkipped", "ContractError", "F32_RTOL", "F64_ATOL", "FP16_LOSS_SCALE", "MP_GRAD_RTOL", "MP_RTOL",
    "check_mixer", "device", "make", "inputs", "lengths", "max_abs", "rel_err", "use_device",
]
