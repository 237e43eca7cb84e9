"""The contract suite: every registered mixer gets these tests the moment it is registered.

DESIGN.md, "The tests every mixer gets for free". Each mixer is built from its
registry entry's ``example_config()`` (small sizes, several heads, a chunk size
that makes the test lengths span several chunks).
"""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix.mixers.base import Cache
from tolerances import (
    F32_RTOL, F64_ATOL, MP_GRAD_RTOL, MP_RTOL, assert_modes_agree_f64, forward_and_grads, max_abs, mixed_forward_and_grads, rel_err,
)

ENTRIES = seqmix.list_mixers()
NAMES = [e.name for e in ENTRIES]
BATCH = 2


def make(name: str, dtype=torch.float64, **overrides):
    entry = seqmix.mixer_entry(name)
    torch.manual_seed(0)
    m = seqmix.build_mixer(name, **{**entry.example_config(), **overrides}).to(dtype).eval()
    return m


def lengths(m) -> list[int]:
    """A multiple of the chunk size and a length that is not one (both > one chunk)."""
    c = getattr(m.config, "chunk_size", 8) or 8
    return [2 * c, 2 * c + 3]


def inputs(m, T, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, T, m.d_model, generator=g, dtype=dtype)


def other_modes(m):
    return [mode for mode in m.modes if mode != m.reference_mode]


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_is_complete(name):
    entry = seqmix.mixer_entry(name)
    m = make(name)
    assert entry.family and entry.modes and entry.state_formula
    assert m.reference_mode in m.modes
    assert m.registry_name == name


@pytest.mark.parametrize("name", NAMES)
def test_modes_agree_float64(name):
    m = make(name)
    if len(m.modes) < 2:
        pytest.skip(f"{name} has a single mode {m.modes}; nothing to compare")
    for T in lengths(m):
        assert_modes_agree_f64(m, inputs(m, T), f"{name}, T={T}")


@pytest.mark.parametrize("name", NAMES)
def test_modes_agree_float32(name):
    m = make(name, torch.float32)
    if len(m.modes) < 2:
        pytest.skip(f"{name} has a single mode {m.modes}; nothing to compare")
    T = lengths(m)[1]
    x = inputs(m, T, torch.float32)
    y_ref, g_ref = forward_and_grads(m, x, m.reference_mode)
    for mode in other_modes(m):
        y, g = forward_and_grads(m, x, mode)
        assert y.dtype == torch.float32
        assert rel_err(y, y_ref) < F32_RTOL, f"{name}: mode {mode}"
        for a, b in zip(g, g_ref):
            if a is not None:
                assert rel_err(a, b) < F32_RTOL, f"{name}: gradient of mode {mode}"


@pytest.mark.parametrize("name", NAMES)
def test_step_decoding_equals_forward(name):
    m = make(name)
    T = lengths(m)[1]
    x = inputs(m, T)
    m.mode = m.reference_mode
    y_full = m(x)
    cache = Cache()
    steps = [m(x[:, t : t + 1], cache=cache) for t in range(T)]
    assert max_abs(torch.cat(steps, 1), y_full) < F64_ATOL


@pytest.mark.parametrize("name", NAMES)
def test_split_and_carry_equals_one_pass(name):
    m = make(name)
    T = lengths(m)[1]
    x = inputs(m, T)
    m.mode = m.reference_mode
    y_full = m(x)
    for mode in m.modes:
        m.mode = mode
        for cut in (1, T // 2, T - 2):
            cache = Cache()
            y = torch.cat([m(x[:, :cut], cache=cache), m(x[:, cut:], cache=cache)], 1)
            assert max_abs(y, y_full) < F64_ATOL, f"{name}: mode {mode}, split at {cut}"


@pytest.mark.parametrize("name", NAMES)
def test_segmented_forward_equals_one_pass(name):
    """segment_len: a forward longer than it runs in segments that carry the state (the split-and-carry
    above, done by the mixer itself), uneven last segment included; outputs and gradients as one pass,
    with and without a cache, and the cache holds the same state afterwards (decoding continues alike)."""
    m = make(name)
    if m.uses_context:
        with pytest.raises(ValueError, match="segment_len = 5 cannot be used by a mixer that reads the per-forward context"):
            make(name, segment_len=5)
        return
    T = lengths(m)[1]
    L = max(1, T // 3 + 1)  # 3 segments, the last one shorter
    seg = make(name, segment_len=L)
    assert seg.segment_len == L
    whole = make(name, segment_len=0)
    assert whole.segment_len is None
    for a in (seg, whole):
        a.mode = m.reference_mode
    x = inputs(m, T).requires_grad_(True)
    y_seg, y_whole = seg(x), whole(x)
    assert max_abs(y_seg, y_whole) < F64_ATOL
    g = torch.randn(y_seg.shape, generator=torch.Generator().manual_seed(3), dtype=y_seg.dtype)
    gx_seg, *gp_seg = torch.autograd.grad((y_seg * g).sum(), [x, *seg.parameters()], allow_unused=True)
    gx_whole, *gp_whole = torch.autograd.grad((y_whole * g).sum(), [x, *whole.parameters()], allow_unused=True)
    assert max_abs(gx_seg, gx_whole) < F64_ATOL
    for u, v in zip(gp_seg, gp_whole):
        assert (u is None) == (v is None) and (u is None or max_abs(u, v) < F64_ATOL)
    c_seg, c_whole = Cache(), Cache()
    with torch.no_grad():
        assert max_abs(seg(x, cache=c_seg), whole(x, cache=c_whole)) < F64_ATOL
        nxt = inputs(m, 1, seed=7)
        assert max_abs(seg(nxt, cache=c_seg), whole(nxt, cache=c_whole)) < F64_ATOL


def test_segment_len_default_follows_the_state():
    """None: the class's auto_segment_len where it sets one, else AUTO_SEGMENT_LEN where the state is finite (no
    per-forward context read, no FFT mode), else never."""
    from seqmix.mixers.base import AUTO_SEGMENT_LEN

    assert seqmix.build_mixer("gla", d_model=16).segment_len == AUTO_SEGMENT_LEN
    assert seqmix.build_mixer("softmax_attention", d_model=16).segment_len is None
    assert seqmix.build_mixer("s4d", d_model=16).segment_len is None  # an FFT mode: one long convolution
    # B'MOJO's DSF is not finite (softmax), but its cache is bounded: its class sets the automatic length
    assert seqmix.build_mixer("bmojo", d_model=16).segment_len == AUTO_SEGMENT_LEN
    assert seqmix.build_mixer("bmojo", d_model=16, segment_len=0).segment_len is None
    assert seqmix.build_mixer("softmax_attention", d_model=16, segment_len=64).segment_len == 64
    assert seqmix.build_mixer("gla", d_model=16, segment_len=0).segment_len is None
    with pytest.raises(ValueError, match="segment_len"):
        seqmix.build_mixer("gla", d_model=16, segment_len=-1)


@pytest.mark.parametrize("name", NAMES)
def test_phi_reproduces_core(name):
    m = make(name)
    x = inputs(m, lengths(m)[1])
    values, mixed = m.core(x)
    phi = m.phi(x)
    assert phi.shape == (BATCH, values.shape[2], x.shape[1], x.shape[1])
    assert max_abs(torch.einsum("bmts,bsmp->btmp", phi, values), mixed) < F64_ATOL
    # the core is the forward pass's own: with random values the check above would fail
    assert torch.triu(phi, diagonal=1).abs().max() == 0, "phi must be causal"


@pytest.mark.parametrize("name", NAMES)
def test_dsf_reproduces_core(name):
    m = make(name)
    if not m.finite_state:
        pytest.skip(f"{name} has no finite-state DSF (documented in its class)")
    x = inputs(m, lengths(m)[0])
    values, mixed = m.core(x)
    system = m.dsf(x)
    B, T, M, P = values.shape
    assert max_abs(system.evaluate(values.reshape(B, T, M * P)), mixed.reshape(B, T, M * P)) < F64_ATOL
    # Φ of the DSF, block by block, is phi(x) ⊗ I_P
    blocks = system.blocks()  # [B, T, T, M·P, M·P]
    expected = torch.einsum("bmts,pq,mn->btsmpnq", m.phi(x), torch.eye(P, dtype=x.dtype), torch.eye(M, dtype=x.dtype))
    assert max_abs(blocks, expected.reshape(B, T, T, M * P, M * P)) < F64_ATOL


@pytest.mark.parametrize("name", NAMES)
def test_causality(name):
    m = make(name)
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
                assert max_abs(y2[:, :t], y[:, :t]) < F64_ATOL, f"{name}: mode {mode} leaks the future at t={t}"
            assert max_abs(y2[:, t], y[:, t]) > 1e-6, f"{name}: mode {mode} ignores x[{t}]"


@pytest.mark.parametrize("name", NAMES)
def test_state_size_counts_the_cache(name):
    m = make(name)
    T = lengths(m)[1]
    cache = Cache()
    m(inputs(m, T), cache=cache)
    assert cache.floats() == BATCH * m.state_size(seq_len=T)


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_value_error(name):
    m = make(name)
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
        with pytest.raises(ValueError, match="'x'"):
            m(x)
    with pytest.raises(ValueError, match="mode"):
        m.mode = "no-such-mode"
    unsupported = [md for md in ("recurrent", "chunk", "parallel", "fft", "convolution") if md not in m.modes]
    for md in unsupported[:1]:
        with pytest.raises(ValueError, match="mode"):
            m.mode = md
    with pytest.raises(ValueError, match="not_a_field"):
        seqmix.build_mixer(name, not_a_field=1)
    with pytest.raises(ValueError, match="d_model"):
        seqmix.build_mixer(name, d_model=0)


def test_unknown_mixer_lists_known_names():
    with pytest.raises(ValueError, match="linear_attention"):
        seqmix.build_mixer("no_such_mixer")


# -- mixed precision (issue 15, docs/scale.md) ------------------------------------------------


def mp_length(m) -> int:
    """Several chunks long, within the filter/kernel length of the example config."""
    return min(4 * (getattr(m.config, "chunk_size", 8) or 8) + 3, getattr(m.config, "l_max", None) or 1 << 30)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision_autocast(name, dtype):
    """Forward and backward under autocast: finite, and within MP_RTOL / MP_GRAD_RTOL of float32
    (the T = 512 figures at the default config: bench/scale.py)."""
    m = make(name, torch.float32).train()
    x = inputs(m, mp_length(m), torch.float32)
    y_ref, g_ref = mixed_forward_and_grads(m, x)
    y, g = mixed_forward_and_grads(m, x, dtype)
    assert torch.isfinite(y).all(), f"{name}: non-finite output under autocast {dtype}"
    assert rel_err(y, y_ref) < MP_RTOL[dtype], f"{name}: output under autocast {dtype}, rel. error {rel_err(y, y_ref):.3g}"
    for i, (a, b) in enumerate(zip(g, g_ref)):
        if b is None or float(b.abs().max()) == 0:
            continue
        assert a is not None and torch.isfinite(a).all(), f"{name}: gradient {i} missing or non-finite under {dtype}"
        assert rel_err(a, b) < MP_GRAD_RTOL[dtype], f"{name}: gradient {i} under {dtype}, rel. error {rel_err(a, b):.3g}"


@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision_bf16_parameters(name):
    """mixer.to(bfloat16) on bf16 input runs forward and backward with finite gradients, and
    matches float32 on the same (rounded) weights and input within MP_RTOL: the decays,
    states, complex systems and FFTs inside run in float32/complex64 whatever the parameters."""
    m = make(name, torch.bfloat16).train()
    ref = make(name, torch.bfloat16).float().train()
    x = inputs(m, mp_length(m), torch.float32).bfloat16()
    y_ref, _ = mixed_forward_and_grads(ref, x.float())
    y, g = mixed_forward_and_grads(m, x)
    assert rel_err(y, y_ref) < MP_RTOL[torch.bfloat16], f"{name}: bf16 parameters, rel. error {rel_err(y, y_ref):.3g}"
    assert all(a is None or torch.isfinite(a).all() for a in g), f"{name}: non-finite gradient with bf16 parameters"
