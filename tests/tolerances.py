"""Every numerical tolerance of the test suite, stated once (DESIGN.md), and the mode
comparison that uses them."""

import torch

#: max abs error between two modes of an op or a mixer, in float64 (outputs and gradients are O(1))
F64_ATOL = 1e-9
#: relative error between two modes in float32: max|a - b| / max|b|
F32_RTOL = 1e-4
#: two modes of an op that computes bfloat16 inputs in float32 and rounds its outputs and input
#: gradients to bfloat16 (the selective scan's modes): the float32 results differ by ~F32_RTOL, the
#: roundings by at most one bf16 step (2⁻⁸ ≈ 4e-3 of the value) each: max|a - b| / max|b|
BF16_MODE_RTOL = 1e-2
#: DSF identities (Lemma 2 embedding, converters) in float64
DSF_ATOL = 1e-12
#: a language model's validation loss under bf16 autocast vs float32 (relative)
BF16_LOSS_RTOL = 2e-2
#: the same loss summed in two orders (trainer evaluation vs a direct loop), float32
LOSS_RTOL = 1e-5


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
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=y.dtype)
    params = [p for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad((y * w).sum(), [x, *params], allow_unused=True)
    return y.detach(), grads


def assert_modes_agree_f64(m, x, where: str = ""):
    """Every mode of mixer m equals its reference mode on x (float64): outputs and gradients
    within F64_ATOL. Returns the reference output."""
    y_ref, g_ref = forward_and_grads(m, x, m.reference_mode)
    for mode in m.modes:
        if mode == m.reference_mode:
            continue
        y, g = forward_and_grads(m, x, mode)
        assert max_abs(y, y_ref) < F64_ATOL, f"{where}: mode {mode} vs {m.reference_mode}"
        for i, (a, b) in enumerate(zip(g, g_ref)):
            if a is None or b is None:
                assert a is None and b is None, f"{where}: gradient {i} missing in one mode"
                continue
            assert max_abs(a, b) < F64_ATOL, f"{where}: gradient {i} of mode {mode}"
    m.mode = m.reference_mode
    return y_ref


def assert_decodes_splits_and_maps(m, x, where: str = "", split: int = 5):
    """Float64 checks of a mixer on x [B, T, d]: step-by-step decoding through a Cache equals the
    full forward (reference mode) and the cache holds B·state_size(T) floats; in every mode, two
    calls split at ``split`` and carried through the cache equal one pass; phi(x) applied to the
    values and dsf(x) evaluated on them reproduce the core output."""
    from seqmix.mixers.base import Cache

    B, T, _ = x.shape
    m.mode = m.reference_mode
    y_full = m(x)
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    assert max_abs(steps, y_full) < F64_ATOL, f"{where}: step decoding"
    assert cache.floats() == B * m.state_size(T), f"{where}: cache floats"
    for mode in m.modes:
        m.mode = mode
        cache = Cache()
        y = torch.cat([m(x[:, :split], cache=cache), m(x[:, split:], cache=cache)], 1)
        assert max_abs(y, y_full) < F64_ATOL, f"{where}: split in mode {mode}"
    values, mixed = m.core(x)
    assert max_abs(torch.einsum("bmts,bsmp->btmp", m.phi(x), values), mixed) < F64_ATOL, f"{where}: phi"
    Bt, _, M, P = values.shape
    assert max_abs(m.dsf(x).evaluate(values.reshape(Bt, T, M * P)), mixed.reshape(Bt, T, M * P)) < F64_ATOL, f"{where}: dsf"

#: mixed precision (tests/test_contract.py, bench/scale.py): relative error max|y - y32| / max|y32|
#: of a mixer's output under autocast (or with half parameters) against float32. bf16 keeps 8
#: significant bits (2⁻⁹ ≈ 2e-3 per rounding): 3e-2 is issue 15's bound at T = 512 with the default
#: config (measured worst: 0.017, metala with bf16 parameters). fp16 keeps 11 bits, 8x finer.
MP_RTOL = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
#: the same for the gradients (w.r.t. x and every parameter), relative to each gradient's max:
#: a gradient sums T·B products of rounded terms, hence the looser bound (measured worst at the
#: example configs: bf16 0.037, hyena's filter.freq; fp16 0.005, dsf_ssd's A_log)
MP_GRAD_RTOL = {torch.bfloat16: 1e-1, torch.float16: 2e-2}


#: the fixed loss scale of the float16 checks (what torch.amp.GradScaler does dynamically):
#: without it, small gradients (Mamba's dt_proj) underflow float16
FP16_LOSS_SCALE = 2.0**10


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
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7))
    params = [p for p in m.parameters() if p.requires_grad]
    scale = FP16_LOSS_SCALE if dtype == torch.float16 else 1.0
    grads = torch.autograd.grad((y.float() * w).mean() * scale, [x, *params], allow_unused=True)
    return y.detach().float(), [g.float() / scale if g is not None else None for g in grads]

#: 2 ranks × batch b against 1 process × batch 2b (tests/test_distributed.py): relative error of
#: each step's training loss and each evaluation's loss, float32 (gradients are summed in
#: another order by the all-reduce, and Adam carries the differences on)
DIST_RTOL = 1e-4

#: a seqmix mixer given a transformers module's weights (tests/test_real_mixers.py): max|y - y_hf| / max|y_hf|.
#: float32: issue 25's 1e-5 of the output scale; float64: where transformers computes in the input dtype
REAL_F32_RTOL = 1e-5
REAL_F64_RTOL = 1e-12
