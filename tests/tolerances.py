"""Every numerical tolerance of the test suite, stated once (DESIGN.md), and the mode
comparison that uses them."""

import torch

# the contract's tolerances, measures and mode comparison live in the library, so that the suite and
# seqmix.check_mixer are one code: F64_ATOL, F32_RTOL, MP_RTOL, MP_GRAD_RTOL, FP16_LOSS_SCALE
from seqmix.contract import (  # noqa: F401  (re-exported for the tests)
    F32_RTOL, F64_ATOL, FP16_LOSS_SCALE, MP_GRAD_RTOL, MP_RTOL, assert_modes_agree_f64, forward_and_grads, max_abs,
    mixed_forward_and_grads, rel_err,
)

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

def assert_fused_step_agrees(fused, general, x, prefill: int, steps: int, in_place: bool, dtype) -> None:
    """A mixer's fused decoding step against the same mixer on its general path (``general``: a copy with the fused
    step off): ``steps`` decoding steps of x [B, prefill + steps, d] after a prefill of ``prefill`` tokens (0: from no
    state), the states updated in place (``seqmix.ops.states_in_place``) or not; the outputs and every state entry
    agree within F64_ATOL (float64) or F32_RTOL (float32). bfloat16: within BF16_MODE_RTOL (a product and a sum fused
    as one op may round one bf16 step apart), or, where the two bf16 paths fall further apart, the fused step no
    further from the float64 run of the same weights and input than the general path."""
    import contextlib

    from seqmix.mixers.base import Cache
    from seqmix.ops import states_in_place

    ctx = states_in_place if in_place else contextlib.nullcontext
    import copy

    models = [(fused, x), (general, x)]
    if dtype == torch.bfloat16:  # the float64 run of the same weights: what both bf16 paths are measured against
        models.append((copy.deepcopy(general).double(), x.double()))
    runs = []
    with torch.no_grad():
        for m, xm in models:
            c = Cache()
            if prefill:
                m(xm[:, :prefill], cache=c)
            state, ys = c.get(m), []
            with ctx():
                for t in range(prefill, prefill + steps):
                    y, state = m.decode_step(xm[:, t:t + 1], state)
                    ys.append(y)
                    state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()}
            runs.append((torch.cat(ys, 1), state))
    (y_f, s_f), (y_g, s_g) = runs[:2]
    assert set(s_f) == set(s_g)
    pairs = [(y_f, y_g, runs[2][0] if len(runs) > 2 else None)]
    pairs += [(s_f[k], s_g[k], runs[2][1][k] if len(runs) > 2 else None) for k in s_g]
    for a, b, ref in pairs:
        if not torch.is_tensor(b):  # (a count: RoPE's position)
            assert a == b
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        if dtype == torch.float64:
            assert max_abs(a, b) < F64_ATOL
        elif dtype == torch.float32:
            assert rel_err(a, b) < F32_RTOL
        else:
            if rel_err(a, b) >= BF16_MODE_RTOL:  # the two bf16 paths apart: the fused one must be the closer to float64
                err_f, err_g = rel_err(a.double(), ref.double()), rel_err(b.double(), ref.double())
                assert err_f <= err_g, (rel_err(a, b), err_f, err_g)


#: 2 ranks × batch b against 1 process × batch 2b (tests/test_distributed.py): relative error of
#: each step's training loss and each evaluation's loss, float32 (gradients are summed in
#: another order by the all-reduce, and Adam carries the differences on)
DIST_RTOL = 1e-4

#: a seqmix mixer given a transformers module's weights (tests/test_real_mixers.py): max|y - y_hf| / max|y_hf|.
#: float32: 1e-5 of the output scale; float64: where transformers computes in the input dtype
REAL_F32_RTOL = 1e-5
REAL_F64_RTOL = 1e-12
