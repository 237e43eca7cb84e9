"""Device-clean and sync-free (DESIGN.md, "Growing past toy tasks"): the `meta` contract.

torch's ``meta`` device follows an accelerator's device rules (a tensor made without ``device=``
lands on the CPU and the first op that mixes it in raises) and has no values (``.item()``,
``bool(t)``, a data-dependent shape raise). So whatever runs forward and backward on ``meta``
neither creates tensors off its input's device nor reads a value on the host: on a GPU it
never stalls the launch queue. Every registered mixer runs here in every mode it declares,
forward and backward, and decodes step by step through a Cache; so do the LM backbone (a
plain model and a hybrid pattern), the classifier, and a converted transformers model of each
interop group (recurrent, transformer, hybrid). All with default settings: the host-read
policy "auto" reads no value off the CPU (``seqmix.debug``). No mode needs to read a value.

The CPU side of the same policy: the value checks stay on by default, "never" switches them off,
and every mixer's modes still agree on the paths an accelerator takes (the chunk form's fixed
tiles, exact at any decay).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix import Cache
from seqmix._checks import HOST_READS_ENV, reads_values
from seqmix.debug import host_read_policy, host_reads
from seqmix.models import ModelConfig, build_model
from seqmix.models.classifier import SequenceClassifier
from seqmix.models.heads import ClassifierConfig
from seqmix.ops import linear_recurrence
from seqmix.ops import recurrence as rec
from test_contract import BATCH, NAMES, inputs, lengths, make
from tiny_models import tiny_config
from tolerances import F32_RTOL, F64_ATOL, assert_modes_agree_f64, max_abs, rel_err

META = torch.device("meta")


def _on_meta(t: torch.Tensor, what: str) -> None:
    assert t.device.type == "meta", f"{what} is on {t.device}, not on the input's device"


def _cache_on_meta(cache: Cache, what: str) -> None:
    def check(t):
        _on_meta(t, f"{what}: a cache tensor")
        return t

    cache.map_(check)


# ------------------------------------------------------------------------------------------
# every mixer, every mode, forward + backward and step decoding
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_every_mode_runs_forward_and_backward_on_meta(name):
    m = make(name, torch.float32).to(META).train()
    T = lengths(m)[1]
    params = [p for p in m.parameters() if p.requires_grad]
    for mode in m.modes:
        m.mode = mode
        x = torch.randn(BATCH, T, m.d_model, device=META, requires_grad=True)
        y = m(x)
        assert y.shape == x.shape, f"{name}, mode {mode}"
        _on_meta(y, f"{name}, mode {mode}: the output")
        grads = torch.autograd.grad(y.sum(), [x, *params], allow_unused=True)
        for g in grads:
            if g is not None:
                _on_meta(g, f"{name}, mode {mode}: a gradient")


@pytest.mark.parametrize("name", NAMES)
def test_step_decoding_runs_on_meta(name):
    m = make(name, torch.float32).to(META)
    m.mode = m.reference_mode
    T = lengths(m)[0]
    cache = Cache()
    with torch.no_grad():
        y = m(torch.randn(BATCH, T, m.d_model, device=META), cache=cache)  # prefill
        _on_meta(y, f"{name}: the prefill")
        for _ in range(3):
            y = m(torch.randn(BATCH, 1, m.d_model, device=META), cache=cache)
            _on_meta(y, f"{name}: a decoding step")
    assert len(cache) == 1, f"{name}: the cache holds no state after decoding"
    _cache_on_meta(cache, name)


# ------------------------------------------------------------------------------------------
# the backbone, the classifier, converted transformers models
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["gla", "gated_deltanet", "pattern:mamba_swa"])
def test_language_model_trains_and_decodes_on_meta(case):
    torch.manual_seed(0)
    model = build_model(tiny_config(case)).to(META).train()
    ids = torch.randint(0, 29, (2, 12)).to(META)
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    assert all(p.grad is None or p.grad.device.type == "meta" for p in model.parameters())
    cache = Cache()
    with torch.no_grad():
        model.hidden(ids, cache=cache)
        h = model.hidden(ids[:, :1], cache=cache, start=ids.shape[1])
    _on_meta(h, f"{case}: a decoding step")
    _cache_on_meta(cache, case)


def test_classifier_trains_on_meta():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_layers=2, vocab_size=29, mixer="s6", mixer_kwargs={"d_state": 4},
                      classifier=ClassifierConfig(num_classes=3, pooling="mean", bidirectional="sum"))
    model = SequenceClassifier(cfg).to(META).train()
    ids = torch.randint(1, 29, (2, 10)).to(META)
    logits = model(ids)
    assert logits.shape == (2, 3)
    F.cross_entropy(logits, torch.zeros(2, dtype=torch.long, device=META)).backward()
    assert all(p.grad is None or p.grad.device.type == "meta" for p in model.parameters())


def _interop_model(group: str):
    pytest.importorskip("transformers")
    if group == "transformer":
        from test_interop_attention import tiny
        return tiny("llama")
    if group == "recurrent":
        from test_interop import tiny
        return tiny("mamba2")
    from test_interop_hybrids import tiny
    return tiny("bamba")


@pytest.mark.parametrize("group", ["recurrent", "transformer", "hybrid"])
def test_converted_transformers_model_trains_and_decodes_on_meta(group):
    from seqmix.interop import from_transformers, seqmix_mixers

    model = from_transformers(_interop_model(group)).to(META).train()
    assert seqmix_mixers(model)
    ids = torch.randint(2, 20, (2, 9)).to(META)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert all(p.grad is None or p.grad.device.type == "meta" for p in model.parameters())
    with torch.no_grad():
        first = model(input_ids=ids, use_cache=True)
        step = model(input_ids=ids[:, :1], cache=first.past_key_values, use_cache=True)
    _on_meta(step.logits, f"{group}: a decoding step")


# ------------------------------------------------------------------------------------------
# the host-read policy
# ------------------------------------------------------------------------------------------


def test_value_checks_run_on_cpu_by_default_and_never_elsewhere(monkeypatch):
    monkeypatch.delenv(HOST_READS_ENV, raising=False)
    m = make("gla", torch.float32)
    x = inputs(m, 9, torch.float32)
    x[0, 3, 1] = float("nan")
    assert host_read_policy() == "auto"
    assert reads_values(x) and not reads_values(x.to(META))
    with pytest.raises(ValueError, match="argument 'x' contains non-finite values"):
        m(x)
    with host_reads("never"):
        y = m(x)  # nothing read: the NaN flows through instead of being named
    assert torch.isnan(y).any()
    with host_reads("always"):
        assert reads_values(x.to(META))
        with host_reads("never"):  # the innermost context wins
            assert not reads_values(x)
        assert host_read_policy() == "always"
    assert host_read_policy() == "auto"


def test_the_environment_variable_sets_the_policy(monkeypatch):
    monkeypatch.setenv(HOST_READS_ENV, "never")
    assert host_read_policy() == "never" and not reads_values(torch.zeros(1))
    with host_reads("auto"):  # a context wins over the variable
        assert reads_values(torch.zeros(1))
    monkeypatch.setenv(HOST_READS_ENV, "sometimes")
    with pytest.raises(ValueError, match=f"environment variable {HOST_READS_ENV}='sometimes': expected one of 'auto', 'always', 'never'"):
        host_read_policy()


def test_an_unknown_policy_is_named():
    with pytest.raises(ValueError, match="seqmix.debug.host_reads: unknown policy 'off'; expected one of 'auto', 'always', 'never'"):
        with host_reads("off"):
            pass


def test_the_decay_sign_check_is_a_host_read():
    q = k = v = torch.randn(1, 8, 2, 4)
    gk = torch.full((1, 8, 2, 4), 0.1)  # positive log-decays: a growing state
    with pytest.raises(ValueError, match="argument 'gk' holds log-decays and must be <= 0"):
        linear_recurrence(q, k, v, gk=gk, mode="chunk")
    with host_reads("never"):
        linear_recurrence(q, k, v, gk=gk, mode="chunk")  # not read, not refused


# ------------------------------------------------------------------------------------------
# the paths an accelerator takes, on the CPU
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_modes_agree_without_host_reads_float64(name):
    """The contract's float64 mode agreement on the paths taken where no value is read."""
    m = make(name)
    if len(m.modes) < 2:
        pytest.skip(f"{name} has a single mode {m.modes}; nothing to compare")
    with host_reads("never"):
        for T in lengths(m):
            assert_modes_agree_f64(m, inputs(m, T), f"{name}, T={T}, host reads off")


def test_tile_choice_reads_no_value_where_reads_are_off():
    C = 32
    weak = -0.01 * torch.rand(1, 2, 1, C, 4, dtype=torch.float64).cumsum(-2)
    assert rec._tile_size(C, None, weak) == C  # read on the CPU: one tile is safe
    assert rec._tile_size(C, None, None) == C  # no decay: nothing to read
    with host_reads("never"):
        assert rec._tile_size(C, None, weak) == rec._TILE
        assert rec._tile_size(C, None, None) == C


@pytest.mark.parametrize("decay", ["key", "value", "both", "head"])
@pytest.mark.parametrize("policy", ["auto", "never"])
def test_chunk_form_is_exact_at_strong_decays(decay, policy):
    """Log-decays of -10·U(0, 1) per step span hundreds over a chunk: the tiled form (fixed tiles
    without host reads, chosen ones with them) agrees with the recurrent reference, output, state and
    gradients, in float64 tightly and in float32 relatively."""
    B, T, H, K, V = 2, 45, 2, 8, 6
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, T, H, n, generator=g, dtype=torch.float64) for n in (K, K, V))
    gk = -10 * torch.rand(B, T, H, *(() if decay == "head" else (K,)), generator=g, dtype=torch.float64) if decay != "value" else None
    gv = -10 * torch.rand(B, T, H, V, generator=g, dtype=torch.float64) if decay in ("value", "both") else None
    S0 = torch.randn(B, H, K, V, generator=g, dtype=torch.float64)
    w = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)

    def run(mode, dtype):
        ins = [t.to(dtype).requires_grad_(True) if t is not None else None for t in (q, k, v, gk, gv, S0)]
        o, S = linear_recurrence(*ins[:3], gk=ins[3], gv=ins[4], initial_state=ins[5], mode=mode, chunk_size=16,
                                 output_final_state=True)
        grads = torch.autograd.grad((o * w.to(dtype)).sum() + S.sum(), [t for t in ins if t is not None])
        return o, S, grads

    with host_reads(policy):
        for dtype in (torch.float64, torch.float32):
            o_r, S_r, g_r = run("recurrent", torch.float64)
            o, S, gr = run("chunk", dtype)
            assert torch.isfinite(o).all() and all(torch.isfinite(a).all() for a in gr)
            if dtype == torch.float64:
                assert max_abs(o, o_r) < F64_ATOL and max_abs(S, S_r) < F64_ATOL
                assert all(max_abs(a, b) < F64_ATOL for a, b in zip(gr, g_r))
            else:
                assert rel_err(o.double(), o_r) < F32_RTOL and rel_err(S.double(), S_r) < F32_RTOL
                assert all(rel_err(a.double(), b) < 10 * F32_RTOL for a, b in zip(gr, g_r))
