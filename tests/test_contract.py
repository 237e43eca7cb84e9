"""The contract suite: every registered mixer gets these tests the moment it is registered.

DESIGN.md, "The tests every mixer gets for free". The checks themselves are the library's
(``seqmix.contract``, what ``seqmix.check_mixer`` runs on a researcher's own mixer): each test here
runs one of them on every registered name. Each mixer is built from its registry entry's
``example_config()`` (small sizes, several heads, a chunk size that makes the test lengths span
several chunks).
"""

from __future__ import annotations

import pytest
import torch

import seqmix
from seqmix import contract
from seqmix.contract import BATCH, inputs, lengths, make  # noqa: F401  (the suite's builders, used by other tests)

ENTRIES = seqmix.list_mixers()
NAMES = [e.name for e in ENTRIES]


def run(check, name, *args):
    """One contract check; a check that does not apply to the mixer is a skip."""
    try:
        check(name, *args)
    except contract.CheckSkipped as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", NAMES)
def test_registry_entry_is_complete(name):
    run(contract.check_registry_entry, name)


@pytest.mark.parametrize("name", NAMES)
def test_modes_agree_float64(name):
    run(contract.check_modes_agree_float64, name)


@pytest.mark.parametrize("name", NAMES)
def test_modes_agree_float32(name):
    run(contract.check_modes_agree_float32, name)


@pytest.mark.parametrize("name", NAMES)
def test_step_decoding_equals_forward(name):
    run(contract.check_step_decoding, name)


@pytest.mark.parametrize("name", NAMES)
def test_the_mixer_pickles(name):
    run(contract.check_pickles, name)


@pytest.mark.parametrize("name", NAMES)
def test_split_and_carry_equals_one_pass(name):
    run(contract.check_split_and_carry, name)


@pytest.mark.parametrize("name", NAMES)
def test_segmented_forward_equals_one_pass(name):
    """segment_len: a forward longer than it runs in segments that carry the state (the split-and-carry
    above, done by the mixer itself), uneven last segment included; outputs and gradients as one pass,
    with and without a cache, and the cache holds the same state afterwards (decoding continues alike)."""
    run(contract.check_segmented_forward, name)


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
    run(contract.check_phi, name)


@pytest.mark.parametrize("name", NAMES)
def test_dsf_reproduces_core(name):
    run(contract.check_dsf, name)


@pytest.mark.parametrize("name", NAMES)
def test_causality(name):
    run(contract.check_causality, name)


@pytest.mark.parametrize("name", NAMES)
def test_state_size_counts_the_cache(name):
    run(contract.check_state_size, name)


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_value_error(name):
    run(contract.check_bad_input, name)


def test_unknown_mixer_lists_known_names():
    with pytest.raises(ValueError, match="linear_attention"):
        seqmix.build_mixer("no_such_mixer")


# -- mixed precision (docs/scale.md) ------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision_autocast(name, dtype):
    """Forward and backward under autocast: finite, and within MP_RTOL / MP_GRAD_RTOL of float32
    (the T = 512 figures at the default config: bench/scale.py)."""
    run(contract.check_mixed_precision_autocast, name, dtype)


@pytest.mark.parametrize("name", NAMES)
def test_mixed_precision_bf16_parameters(name):
    """mixer.to(bfloat16) on bf16 input runs forward and backward with finite gradients, and
    matches float32 on the same (rounded) weights and input within MP_RTOL: the decays,
    states, complex systems and FFTs inside run in float32/complex64 whatever the parameters."""
    run(contract.check_mixed_precision_bf16_parameters, name)