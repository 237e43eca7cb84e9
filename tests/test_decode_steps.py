"""The fused decoding steps of the op families (seqmix.ops: the general form's recurrence, the delta rule, the
selective scan, the sliding window's softmax) against their reference steps, LoLCATs attention's step against
its general path, and the in-place state writes of
``states_in_place``: float64 tight, float32 relative (tests/tolerances.py)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

from seqmix.ops import (
    delta_rule_step, recurrence_step, selective_scan, selective_scan_step, states_in_place, window_softmax,
    window_softmax_step,
)

# the op modules (seqmix.ops exports functions under the names of two of them)
dr = importlib.import_module("seqmix.ops.delta_rule")
rec = importlib.import_module("seqmix.ops.recurrence")
ss = importlib.import_module("seqmix.ops.selective_scan")

B, H, K, V, D, N = 2, 3, 4, 5, 6, 4


def _close(a, b, dtype):
    if dtype == torch.float64:
        assert max_abs(a, b) < F64_ATOL
    else:
        assert rel_err(a, b) < F32_RTOL


def _rand(*shape, dtype, g=None, complex_=False):
    t = torch.randn(*shape, dtype=dtype, generator=g)
    return torch.complex(t, torch.randn(*shape, dtype=dtype, generator=g)) if complex_ else t


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("decay", ["key", "head", "value", "both", "none"])
@pytest.mark.parametrize("delayed", [False, True])
def test_recurrence_fused_step_equals_reference(dtype, decay, delayed):
    g = torch.Generator().manual_seed(0)
    q, k = _rand(B, H, K, dtype=dtype, g=g), _rand(B, H, K, dtype=dtype, g=g)
    v, S = _rand(B, H, V, dtype=dtype, g=g), _rand(B, H, K, V, dtype=dtype, g=g)
    gk = {"key": -torch.rand(B, H, K, dtype=dtype, generator=g), "head": -torch.rand(B, H, dtype=dtype, generator=g),
          "both": -torch.rand(B, H, K, dtype=dtype, generator=g)}.get(decay)
    gv = -torch.rand(B, H, V, dtype=dtype, generator=g) if decay in ("value", "both") else None
    ak = None if gk is None else (gk.exp() if gk.dim() == 3 else gk.exp().unsqueeze(-1))
    o_ref, S_ref = rec._step(S, q, k, v, ak, gv.exp() if gv is not None else None, 0.5, delayed)
    S0 = S.clone()
    o, S_new = rec.fused_step(S, q, k, v, gk, gv, 0.5, delayed, in_place=False)
    _close(o, o_ref, dtype)
    _close(S_new, S_ref, dtype)
    assert torch.equal(S, S0), "out of place: the given state is left as it is"
    o2, S2 = rec.fused_step(S, q, k, v, gk, gv, 0.5, delayed, in_place=True)
    assert S2 is S, "in place: the returned state is the given buffer"
    _close(o2, o_ref, dtype)
    _close(S2, S_ref, dtype)


def test_recurrence_fused_step_complex():
    """Complex q, k, decays (S4D, LRU, the rotary general form): the same update."""
    g = torch.Generator().manual_seed(1)
    q, k = _rand(B, H, K, dtype=torch.float64, g=g, complex_=True), _rand(B, H, K, dtype=torch.float64, g=g, complex_=True)
    v, S = _rand(B, H, V, dtype=torch.float64, g=g, complex_=True), _rand(B, H, K, V, dtype=torch.float64, g=g, complex_=True)
    gk = torch.complex(-torch.rand(B, H, K, dtype=torch.float64, generator=g), torch.randn(B, H, K, dtype=torch.float64, generator=g))
    o_ref, S_ref = rec._step(S, q, k, v, gk.exp(), None, 1.0)
    o, S_new = rec.fused_step(S.clone(), q, k, v, gk, None, 1.0, in_place=True)
    assert max_abs(o, o_ref) < F64_ATOL and max_abs(S_new, S_ref) < F64_ATOL


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("decay", ["head", "key", "none"])
@pytest.mark.parametrize("pair", [False, True])
def test_delta_rule_fused_step_equals_reference(dtype, decay, pair):
    g = torch.Generator().manual_seed(2)
    q, k = _rand(B, H, K, dtype=dtype, g=g), torch.nn.functional.normalize(_rand(B, H, K, dtype=dtype, g=g), dim=-1)
    v, S = _rand(B, H, V, dtype=dtype, g=g), _rand(B, H, K, V, dtype=dtype, g=g)
    beta = torch.rand(B, H, dtype=dtype, generator=g)
    lg = {"head": -torch.rand(B, H, dtype=dtype, generator=g), "key": -torch.rand(B, H, K, dtype=dtype, generator=g)}.get(decay)
    a = _rand(B, H, K, dtype=dtype, g=g) * 0.3 if pair else None
    b = _rand(B, H, K, dtype=dtype, g=g) * 0.3 if pair else None
    ad = None if lg is None else (lg.exp().unsqueeze(-1) if lg.dim() == 2 else lg.exp())
    o_ref, S_ref = dr._step(S, q, k, v, beta, ad, 0.7, a, b)
    S0 = S.clone()
    o, S_new = dr.fused_step(S, q, k, v, beta, lg, 0.7, a, b, in_place=False)
    _close(o, o_ref, dtype)
    _close(S_new, S_ref, dtype)
    assert torch.equal(S, S0)
    o2, S2 = dr.fused_step(S, q, k, v, beta, lg, 0.7, a, b, in_place=True)
    assert S2 is S
    _close(o2, o_ref, dtype)
    _close(S2, S_ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("per_channel", [False, True])
def test_selective_scan_fused_step_equals_reference(dtype, per_channel):
    g = torch.Generator().manual_seed(3)
    x, delta = _rand(B, D, dtype=dtype, g=g), torch.rand(B, D, dtype=dtype, generator=g)
    A = -torch.rand(D, N, dtype=dtype, generator=g)
    Bm = _rand(B, D, N, dtype=dtype, g=g) if per_channel else _rand(B, N, dtype=dtype, g=g)
    Cm = _rand(B, D, N, dtype=dtype, g=g) if per_channel else _rand(B, N, dtype=dtype, g=g)
    Dv, h = _rand(D, dtype=dtype, g=g), _rand(B, D, N, dtype=dtype, g=g)
    Bx = Bm.unsqueeze(1) if Bm.dim() == 3 else Bm.unsqueeze(1).unsqueeze(2)
    Cx = Cm.unsqueeze(1) if Cm.dim() == 3 else Cm.unsqueeze(1).unsqueeze(2)
    a = torch.exp(delta.unsqueeze(-1) * A).unsqueeze(1)  # [B, 1, D, N]
    y_ref, h_ref = ss._scan_reference(a, (delta * x).unsqueeze(-1).unsqueeze(1) * Bx, Cx, h)
    y_ref = y_ref[:, 0] + Dv * x
    h0 = h.clone()
    y, h_new = ss.fused_step(h, x, delta, A, Bm, Cm, Dv, in_place=False)
    _close(y, y_ref, dtype)
    _close(h_new, h_ref, dtype)
    assert torch.equal(h, h0)
    y2, h2 = ss.fused_step(h, x, delta, A, Bm, Cm, Dv, in_place=True)
    assert h2 is h
    _close(y2, y_ref, dtype)
    _close(h2, h_ref, dtype)


def test_selective_scan_step_equals_one_token_scan():
    """selective_scan_step (Δ = softplus(delta + bias) computed as the scan computes it) equals a one-token
    selective_scan from the same state (its reference mode)."""
    g = torch.Generator().manual_seed(4)
    x, pre = torch.randn(B, 1, D, dtype=torch.float64, generator=g), torch.randn(B, 1, D, dtype=torch.float64, generator=g)
    A, bias = -torch.rand(D, N, dtype=torch.float64, generator=g), torch.randn(D, dtype=torch.float64, generator=g)
    Bm, Cm = torch.randn(B, 1, N, dtype=torch.float64, generator=g), torch.randn(B, 1, N, dtype=torch.float64, generator=g)
    Dv, h = torch.randn(D, dtype=torch.float64, generator=g), torch.randn(B, D, N, dtype=torch.float64, generator=g)
    y_ref, h_ref = selective_scan(x, pre, A, Bm, Cm, Dv, initial_state=h, output_final_state=True, mode="reference",
                                  delta_bias=bias, delta_softplus=True, backend="torch")
    y, h_new = selective_scan_step(x[:, 0], pre[:, 0], A, Bm[:, 0], Cm[:, 0], Dv, state=h, delta_bias=bias, delta_softplus=True)
    assert max_abs(y, y_ref[:, 0]) < F64_ATOL and max_abs(h_new, h_ref) < F64_ATOL
    assert h_new is not h, "outside states_in_place the state is a new tensor"


def test_states_in_place_writes_the_given_state_and_only_where_allowed():
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(B, H, K, generator=g), torch.randn(B, H, K, generator=g), torch.randn(B, H, V, generator=g)
    gk, S = -torch.rand(B, H, generator=g), torch.randn(B, H, K, V, generator=g)
    o_ref, S_ref = recurrence_step(q, k, v, gk, state=S)
    assert S_ref is not S
    with states_in_place():
        o, S_new = recurrence_step(q, k, v, gk, state=S.clone())
        assert rel_err(o, o_ref) < F32_RTOL and rel_err(S_new, S_ref) < F32_RTOL
        S_mine = S.clone()
        assert recurrence_step(q, k, v, gk, state=S_mine)[1] is S_mine
        beta = torch.rand(B, H, generator=g)
        S_mine = S.clone()
        assert delta_rule_step(q, torch.nn.functional.normalize(k, dim=-1), v, beta, gk, S_mine)[1] is S_mine
        # a state of another dtype than the step's compute dtype, or one autograd records: a new tensor
        S32 = S.clone()  # float64 inputs: the step computes in float64
        out = recurrence_step(q.double(), k.double(), v.double(), gk.double(), state=S32)[1]
        assert out is not S32 and out.dtype == torch.float64
        Sg = S.clone().requires_grad_()
        out = recurrence_step(q, k, v, gk, state=Sg)[1]
        assert out is not Sg and out.requires_grad
    S_after = S.clone()
    assert recurrence_step(q, k, v, gk, state=S_after)[1] is not S_after, "the context is closed again"


def test_step_ops_still_check_their_arguments():
    """The public steps keep their argument checks (check_shapes=False is for a caller that built the inputs)."""
    q, k, v = torch.randn(B, H, K), torch.randn(B, H, K), torch.randn(B, H + 1, V)
    with pytest.raises(ValueError, match="'v'"):
        recurrence_step(q, k, v)
    with pytest.raises(ValueError, match="'v'"):
        delta_rule_step(q, k, v, torch.rand(B, H))


@pytest.mark.parametrize("name", ["mamba", "mamba2", "gated_deltanet", "rwkv6", "retnet", "gla"])
def test_a_prefills_state_keeps_no_activations_alive(name):
    """After a prefill through a Cache, the state's tensors own storages of their own size: none is a view of the
    prefill's activations (a conv window's last inputs, a token shift's last input), which would keep the whole
    call's input alive and grow the decoding state's memory with the prompt."""
    from seqmix import Cache, build_mixer, mixer_entry

    m = build_mixer(name, **mixer_entry(name).example_config()).eval()
    sizes = []
    for T in (16, 64):
        cache = Cache()
        with torch.no_grad():
            m(torch.randn(2, T, m.d_model), cache=cache)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in cache._tensors()}
        sizes.append(sum(storages.values()))
        assert sizes[-1] <= cache.nbytes() + 64 * len(storages), (T, sizes[-1], cache.nbytes())
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_window_softmax_step_equals_the_parallel_window(dtype):
    """window_softmax_step: one query against its full window's w keys = window_softmax's parallel mode on the same
    keys (num, den, m)."""
    g = torch.Generator().manual_seed(0)
    w = 7
    q, k, v = _rand(B, 1, H, K, dtype=dtype, g=g), _rand(B, w, H, K, dtype=dtype, g=g), _rand(B, w, H, V, dtype=dtype, g=g)
    got = window_softmax_step(q, k, v)
    want = window_softmax(q, k, v, window=w, mode="parallel")
    for a, b in zip(got, want):
        assert a.shape == b.shape
        _close(a, b, dtype)


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lolcats_step_equals_its_general_path_before_and_after_the_window_fills(dtype, in_place, monkeypatch):
    """LoLCATs attention's decoding step (LolcatsAttention._step, counted) after a one-token prefill against the
    general path that the reference mode runs, token after token, outputs and states: while the window (3) is not
    full (tokens 1 and 2: nothing leaves it for the linear state, the softmax reads the tokens seen) and once it is;
    inside states_in_place its linear state is the same buffer, written in place."""
    import contextlib
    from seqmix.mixers.base import build_mixer as build

    torch.manual_seed(0)
    m = build("lolcats", d_model=16, n=8, heads=2, window=3, window_factor=0.6, affine_window_factor=True).to(dtype).eval()
    x = torch.randn(2, 12, 16, dtype=dtype)
    calls, orig = [], type(m)._step
    monkeypatch.setattr(type(m), "_step", lambda self, *a: calls.append(1) or orig(self, *a))
    with torch.no_grad():
        slow = m._forward(x[:, :1], state=None, mode="recurrent", need_state=True).state
        fast = {k: v.clone() if torch.is_tensor(v) else v for k, v in slow.items()}
        for t in range(1, 12):  # the window (3) is full from t = 3 on
            S_before = fast["S"]
            with states_in_place() if in_place else contextlib.nullcontext():
                out_fast = m._forward(x[:, t:t + 1], state=fast, mode="step", need_state=True)
            assert (out_fast.state["S"] is S_before) == in_place
            out_slow = m._forward(x[:, t:t + 1], state=slow, mode="recurrent", need_state=True)  # the general path
            _close(out_fast.y, out_slow.y, dtype)
            for key in ("S", "k", "v"):
                _close(out_fast.state[key], out_slow.state[key], dtype)
            fast, slow = out_fast.state, out_slow.state
    assert fast["pos"] == slow["pos"] == 12 and len(calls) == 11  # the fast path at every step after the prefill
    # a state whose window ring is not the window's w keys: the general path, which refuses it
    bad = dict(m._forward(x[:, :2], state=None, mode="recurrent", need_state=True).state)
    bad["k"], bad["v"] = bad["k"][:, 1:], bad["v"][:, 1:]
    with torch.no_grad(), pytest.raises(ValueError, match="key_valid|k"):
        m._forward(x[:, 2:3], state=bad, mode="step", need_state=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_liger_step_equals_its_reference_mode_before_and_after_the_window_fills(dtype, monkeypatch):
    """Liger attention's decoding step (the fused window step at every token, counted: its slots before position 0
    masked until the window of 3 is full at the third token) against its reference mode ("recurrent") from a
    one-token prefill, token after token, outputs and states."""
    import seqmix.ops.window_attention as wa
    from seqmix.mixers.base import build_mixer

    calls, op = [], wa._full_window_step
    monkeypatch.setattr(wa, "_full_window_step", lambda *a: calls.append(1) or op(*a))
    torch.manual_seed(0)
    m = build_mixer("liger_attention", **{**build_mixer("liger_attention").example_config(), "window": 3}).to(dtype).eval()
    x = torch.randn(2, 10, m.config.d_model, dtype=dtype)
    with torch.no_grad():
        fast = slow = m._forward(x[:, :1], state=None, mode="recurrent", need_state=True).state
        for t in range(1, 10):
            a = m._forward(x[:, t:t + 1], state=fast, mode="step", need_state=True)
            b = m._forward(x[:, t:t + 1], state=slow, mode="recurrent", need_state=True)
            _close(a.y, b.y, dtype)
            for key in ("S", "k", "v"):
                _close(a.state[key], b.state[key], dtype)
            fast, slow = a.state, b.state
    assert len(calls) == 9  # every step (the window, 2 cached + the new token, is full from t = 2 on)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("invalid", [0, 4, 5])
def test_window_softmax_routes_one_query_to_its_fused_step(dtype, invalid, monkeypatch):
    """window_softmax's chunk mode at T = 1 (R + 1 = 9 keys, window 6) runs the fused step on the last 6 keys and
    equals the parallel mode (the reference, which never takes that route): every key valid (key_valid None), and
    the first ``invalid`` slots marked invalid (a cache ring before position 0: 4 leaves one of the 6 masked, 5 two)."""
    import seqmix.ops.window_attention as wa

    calls, op = [], wa._full_window_step
    monkeypatch.setattr(wa, "_full_window_step", lambda q, k, v, valid=None: calls.append(k.shape[1]) or op(q, k, v, valid))
    g = torch.Generator().manual_seed(3)
    q, k, v = _rand(B, 1, H, K, dtype=dtype, g=g), _rand(B, 9, H, K, dtype=dtype, g=g), _rand(B, 9, H, V, dtype=dtype, g=g)
    valid = None if not invalid else torch.arange(9) >= invalid
    got = window_softmax(q, k, v, window=6, key_valid=valid, mode="chunk")
    assert calls == [6]
    want = window_softmax(q, k, v, window=6, key_valid=valid, mode="parallel")
    assert calls == [6]
    for a, b in zip(got, want):
        _close(a, b, dtype)


def test_window_softmax_step_under_autocast_computes_in_float32():
    """Under bf16 autocast the fused window step computes in float32 (as window_softmax does), and refuses a q of
    several tokens by name."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*shape, generator=g) for shape in ((B, 1, H, K), (B, 6, H, K), (B, 6, H, V)))
    want = window_softmax(q, k, v, window=6, mode="parallel")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = window_softmax_step(q, k, v)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and rel_err(a, b) < F32_RTOL
    with pytest.raises(ValueError, match="argument 'q' must hold one query"):
        window_softmax_step(torch.randn(B, 2, H, K), k, v)


def test_delta_rule_step_trains_through_its_fused_step():
    """delta_rule_step with inputs that require grad (a recurrent reference trained through its steps): the
    gradients equal the reference step's, and the given state is left as it was."""
    g = torch.Generator().manual_seed(2)
    ins = [torch.randn(*shape, dtype=torch.float64, generator=g) for shape in ((B, H, K), (B, H, K), (B, H, V))]
    beta = torch.rand(B, H, dtype=torch.float64, generator=g)
    gk = -torch.rand(B, H, K, dtype=torch.float64, generator=g)
    S0 = torch.randn(B, H, K, V, dtype=torch.float64, generator=g)
    grads = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_(True) for t in (*ins, beta, gk, S0)]
        q, k, v, b, gl, S = leaves
        S_in = S.detach().clone()
        if fused:
            o, S1 = delta_rule_step(q, k, v, b, gl, S)
        else:
            o, S1 = dr._step(S, q, k, v, b, gl.exp(), 1.0)
        ((o ** 2).sum() + S1.sum()).backward()
        assert torch.equal(S.detach(), S_in)
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert max_abs(a, b) < F64_ATOL


def test_layer_constants_and_rope_tables_are_kept_and_rebuilt_as_their_tensors_say():
    """Mixer.layer_constant keeps a value while its tensors keep their versions, computes it anew after an in-place
    change and on every call for an inference tensor (no version counter); RotaryTable keeps its table and rebuilds
    one made in inference mode for a call outside it (an inference tensor cannot be saved for backward)."""
    from seqmix.mixers.base import build_mixer as build
    from seqmix.ops.rotary import RotaryTable

    m = build("gla", d_model=16, heads=2)
    calls = []
    fn = lambda: calls.append(1) or torch.ones(2)  # noqa: E731
    p = torch.zeros(3)
    with torch.no_grad():
        a, b = m.layer_constant("c", fn, p), m.layer_constant("c", fn, p)
        assert a is b and len(calls) == 1
        p.add_(1.0)
        m.layer_constant("c", fn, p)
        assert len(calls) == 2
        with torch.inference_mode():
            q = torch.zeros(3)
        m.layer_constant("d", fn, q), m.layer_constant("d", fn, q)
        assert len(calls) == 4
    table = RotaryTable()
    with torch.inference_mode():
        c1, _ = table(0, 4, 8, device="cpu", dtype=torch.float32)
        c2, _ = table(1, 4, 8, device="cpu", dtype=torch.float32)
        assert c1.is_inference() and c2._base is c1._base  # kept: slices of one table
    c3, _ = table(0, 4, 8, device="cpu", dtype=torch.float32)
    assert not c3.is_inference() and torch.equal(c3, c1)  # rebuilt outside inference mode, the same numbers
    c4, _ = table(2, 3, 8, device="cpu", dtype=torch.float32)
    assert c4._base is c3._base


def test_layers_of_the_same_rope_settings_share_one_table():
    """Every layer that rotates with the same base and scaling slices one RotaryTable (a model keeps one table, not one
    per layer), copies and pickles join it, other settings get their own, and it is freed with the last layer."""
    import copy
    import gc
    import pickle
    import weakref

    from seqmix.mixers.base import Cache, build_mixer
    from seqmix.mixers.layers import rope_table
    from seqmix.ops.rotary import RotaryTable

    cfg = dict(d_model=16, heads=2, rope=True)
    a, b = build_mixer("softmax_attention", **cfg), build_mixer("softmax_attention", **cfg)
    other = build_mixer("softmax_attention", **cfg, rope_theta=500000.0)
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        for m in (a, b, other):
            m(x, cache=Cache())
    table = a.__dict__["_rope_table"]
    assert b.__dict__["_rope_table"] is table and other.__dict__["_rope_table"] is not table
    assert rope_table(a, a.config.rope_theta) is table
    assert copy.deepcopy(a).__dict__["_rope_table"] is table and pickle.loads(pickle.dumps(b)).__dict__["_rope_table"] is table
    with torch.no_grad():  # the shared table (grown by the other layers) gives the numbers of a table of its own
        fresh = build_mixer("softmax_attention", **cfg)
        fresh.load_state_dict(a.state_dict())
        fresh.__dict__["_rope_table"] = RotaryTable(a.config.rope_theta)
        b(torch.randn(1, 300, 16), cache=Cache())
        torch.testing.assert_close(a(x), fresh(x), rtol=0, atol=0)
        assert fresh.__dict__["_rope_table"] is not table
    ref = weakref.ref(table)
    del a, b, fresh, table
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,config,params,kept", [
    ("rwkv4", dict(bonus=True, token_shift=True, normalizer=True), ("w", "u"), {"fixed decay", "bonus weight"}),
    ("rg_lru_block", dict(gate_blocks=2), ("Lambda",), {"rg_lru log a"}),
])
def test_steps_follow_a_change_of_their_kept_layer_constants(dtype, name, config, params, kept):
    """Layer constants of the general form's steps (RWKV-4's fixed decay −e^w and bonus scale·e^u, the RG-LRU's
    −c·softplus(−Λ)) are kept between calls without autograd: after an in-place change of their parameters, a prefill
    and a decoding step equal a fresh copy's full pass (no constant kept)."""
    import copy

    from seqmix.mixers.base import Cache, build_mixer

    torch.manual_seed(0)
    m = build_mixer(name, d_model=8, **config).to(dtype).eval()
    x = torch.randn(2, 6, 8, dtype=dtype)

    def prefill_then_step(mixer):
        c = Cache()
        mixer(x[:, :5], cache=c)
        return mixer.decode_step(x[:, 5:], c.get(mixer))[0]

    with torch.no_grad():
        before = prefill_then_step(m)  # the constants kept
        assert kept <= set(m.__dict__["_layer_constants"])
        for p in params:
            getattr(m, p).mul_(-0.5).add_(0.3)
        after = prefill_then_step(m)
        fresh = copy.deepcopy(m)
        fresh.__dict__.pop("_layer_constants")
        expected = fresh(x)[:, 5:]
    _close(after, expected, dtype)
    assert max_abs(before, after) > 1e-4  # (the change matters)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_max_stabilizer_step_equals_the_recurrent_mode_token_by_token(dtype):
    from seqmix.ops import max_stabilizer, max_stabilizer_step

    g = torch.Generator().manual_seed(0)
    T = 40
    log_f = torch.nn.functional.logsigmoid(3 * torch.randn(B, T, H, generator=g, dtype=dtype))
    log_i = 5 * torch.randn(B, T, H, generator=g, dtype=dtype)
    m0 = torch.randn(B, H, generator=g, dtype=dtype)
    ref = max_stabilizer(log_f, log_i, m0, mode="recurrent")
    m = m0
    for t in range(T):
        lf, li, m1 = max_stabilizer_step(log_f[:, t:t + 1], log_i[:, t:t + 1], m.unsqueeze(1))
        for got, want in zip((lf, li, m1), ref):
            assert got.shape == (B, 1, H) and got.dtype == dtype
            _close(got, want[:, t:t + 1], dtype)
        m = m1[:, 0]


@pytest.mark.parametrize("name,config", [("rg_lru", {}), ("rg_lru_block", {"gate_blocks": 2}),
                                         ("rwkv4", dict(bonus=True, token_shift=True, normalizer=True))])
def test_layer_constants_made_in_inference_mode_or_another_dtype_are_not_reused(name, config):
    """A layer constant kept from an inference-mode call is not handed to a later call with autograd (frozen
    parameters, an input that needs a gradient: the constant is saved for backward), nor one of float32 to the same
    parameters after ``.double()`` (Module.to keeps their ids and versions)."""
    import copy

    from seqmix.mixers.base import Cache, build_mixer

    torch.manual_seed(0)
    m = build_mixer(name, d_model=8, **config).eval().requires_grad_(False)
    x = torch.randn(2, 5, 8)
    with torch.inference_mode():
        c = Cache()
        m(x[:, :4], cache=c)
        m.decode_step(x[:, 4:], c.get(m))
    xg = x.clone().requires_grad_()
    c = Cache()
    m(xg[:, :4], cache=c)
    y, _ = m.decode_step(xg[:, 4:], c.get(m))
    (m(xg).sum() + y.sum()).backward()
    assert xg.grad is not None and torch.isfinite(xg.grad).all()
    with torch.no_grad():
        m(x)  # float32 constants kept
        m.double()
        fresh = copy.deepcopy(m)
        fresh.__dict__.pop("_layer_constants", None)
        assert max_abs(m(x.double()), fresh(x.double())) < F64_ATOL


def test_project_is_the_linear_layer_and_keeps_hooks_and_subclasses():
    """seqmix.mixers.layers.project: a plain nn.Linear's F.linear (the same numbers as calling it), and the module
    called as it is where it has a hook of its own, a global hook is registered, or it is a subclass (LoRA-like)."""
    from seqmix.mixers.layers import project

    torch.manual_seed(0)
    lin = nn.Linear(6, 5)
    u = torch.randn(3, 6, dtype=torch.float64)
    lin = lin.double()
    assert torch.equal(project(lin, u), lin(u))
    seen = []
    h = lin.register_forward_hook(lambda m, a, out: seen.append("own") or out * 2)
    assert torch.equal(project(lin, u), 2 * F.linear(u, lin.weight, lin.bias)) and seen == ["own"]
    h.remove()
    g = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: seen.append("global") or out + 1)
    try:
        assert torch.equal(project(lin, u), F.linear(u, lin.weight, lin.bias) + 1) and seen[-1] == "global"
    finally:
        g.remove()

    class Doubled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    d = Doubled(6, 5).double()
    assert torch.equal(project(d, u), 2 * F.linear(u, d.weight, d.bias))
    assert torch.equal(project(lin, u), lin(u))  # no hook left: the plain path again


def test_project_of_grouped_rows_equals_the_module_and_keeps_hooks():
    """project on a GroupedRows (a student's k or v kept at the teacher's kv heads): its stored Linear's F.linear with
    the rows gathered, the numbers of calling the module and of the expanded Linear; a hook on the GroupedRows or on
    its stored Linear, or a stored Linear that is a subclass, runs the module call."""
    from seqmix.mixers.layers import GroupedRows, project

    torch.manual_seed(0)
    g = GroupedRows(6, [[4, 2, 3], [1, 1, 2]]).double()
    u = torch.randn(3, 6, dtype=torch.float64)
    dense = F.linear(u, g.expanded_weight(), g.bias)
    assert torch.equal(project(g, u), g(u)) and torch.allclose(project(g, u), dense, rtol=0, atol=1e-12)
    assert project(g, u).shape == (3, 14)
    from unittest import mock

    with mock.patch.object(GroupedRows, "forward", side_effect=AssertionError("module called")), \
            mock.patch.object(nn.Linear, "forward", side_effect=AssertionError("module called")):
        assert torch.equal(project(g, u), g.gather(F.linear(u, g.proj.weight, g.proj.bias)))  # no module call
    seen = []
    glob = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: seen.append(type(m).__name__) or out)
    try:
        assert torch.equal(project(g, u), g(u)) and "GroupedRows" in seen  # a global hook: the module call
    finally:
        glob.remove()
    h = g.proj.register_forward_pre_hook(lambda m, a: (a[0] * 2,))
    assert torch.allclose(project(g, u), F.linear(2 * u, g.expanded_weight(), g.bias), rtol=0, atol=1e-12)
    h.remove()
    orig = g.proj.forward
    g.proj.forward = lambda x: 3 * orig(x)  # (accelerate replaces an instance's forward: not a hook, still honoured)
    assert torch.allclose(project(g, u), 3 * dense, rtol=0, atol=1e-12)
    del g.proj.forward
    for target in (g, g.proj):
        h = target.register_forward_hook(lambda m, a, out: out * 2)
        assert torch.equal(project(g, u), g(u))
        assert torch.allclose(project(g, u), 2 * dense, rtol=0, atol=1e-12)
        h.remove()

    class Doubled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    d = Doubled(6, g.proj.out_features).double()
    d.load_state_dict(g.proj.state_dict())
    g.proj = d
    assert torch.allclose(project(g, u), 2 * dense, rtol=0, atol=1e-12)
