"""B'MOJO and B'MOJO-F (seqmix.mixers.hybrid): the reductions, the innovation-selected memory
against a brute force, no gradient through the selection, every variant (Algorithm 1's
per-token reading, the literal rule, chunk lengths that do not divide the window) through
the contract's checks, the bounded decoding memory and bad configs.
(The contract suite, tests/test_contract.py, runs on bmojo and bmojo_f as well.)"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import seqmix
from seqmix.mixers.base import Cache
from seqmix.ops.eidetic import predictor_weights
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

SMALL = dict(d_model=16, n=8, heads=2, window=4, m_f=2, m_e=3, d_state=4, innovation_span=2)


def build(name="bmojo", dtype=torch.float64, **cfg):
    torch.manual_seed(0)
    return seqmix.build_mixer(name, **{**SMALL, **cfg}).to(dtype).eval()


def inputs(T, B=2, d=16, seed=1, dtype=torch.float64):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def copy_attention(src, dst):
    for name in ("W_qk", "W_v", "W_o"):
        getattr(dst, name).load_state_dict(getattr(src, name).state_dict())


# -- reductions ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
@pytest.mark.parametrize("window", [1, 3, 5])
def test_no_memory_is_sliding_window_attention(mode, window):
    m = build(m_f=0, m_e=0, window=window)
    ref = seqmix.build_mixer("softmax_attention", d_model=16, n=8, heads=2, window=window).double()
    copy_attention(m, ref)
    x = inputs(13)
    m.mode, ref.mode = mode, "parallel"
    assert max_abs(m(x), ref(x)) < F64_ATOL
    assert m.ssm is None and m.state_size(13) == ref.state_size(13)  # the same cache: the window's KV


@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_window_covering_the_sequence_is_full_attention(mode):
    """w >= L: a single chunk, whose memory is empty: full causal attention, memory or not."""
    T = 11
    m = build(window=T, m_f=2, m_e=3)
    ref = seqmix.build_mixer("softmax_attention", d_model=16, n=8, heads=2).double()
    copy_attention(m, ref)
    m.mode = mode
    x = inputs(T)
    assert max_abs(m(x), ref(x)) < F64_ATOL
    # while a shorter window with memory is not
    short = build(window=4, m_f=2, m_e=3)
    short.load_state_dict(m.state_dict())
    assert max_abs(short(x), ref(x)) > 1e-3


def test_bmojo_without_eidetic_memory_is_bmojo_f():
    x = inputs(17)
    torch.manual_seed(0)
    f = seqmix.build_mixer("bmojo_f", **{k: v for k, v in SMALL.items() if k != "m_e"}).double()  # the preset's m_e = 0
    b = build("bmojo", m_e=0)
    b.load_state_dict(f.state_dict())
    assert f.config.m_e == 0 and max_abs(b(x), f(x)) < F64_ATOL
    # with eidetic tokens the same weights give another output: the memory is used
    e = build("bmojo", m_e=3)
    e.load_state_dict(f.state_dict())  # the predictor is a fixed, non-learned buffer (not in the state dict)
    assert max_abs(e(x), f(x)) > 1e-3


# -- the memory ----------------------------------------------------------------------------


def brute_memory(m, x):
    """Per chunk, the fading positions and the top-m_e positions by ε over τ < s_c, recomputed
    from the SSM output with the predictor written out."""
    with torch.no_grad():
        y = m.ssm(x)
    c = m.config
    k = c.innovation_span
    w8 = predictor_weights(k, c.innovation_weights, c.innovation_decay)
    ypad = F.pad(y, (0, 0, k, 0))
    y_hat = sum(w8[j - 1] * ypad[:, k - j : k - j + x.shape[1]] for j in range(1, k + 1))
    eps = (y - y_hat).pow(2).mean(-1)
    out = []
    for b in range(x.shape[0]):
        rows = []
        for s in range(0, x.shape[1], m.chunk):
            order = sorted(range(s), key=lambda t: (-float(eps[b, t]), t))
            rows.append(sorted(order[: c.m_e]))
        out.append(rows)
    return out


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_eidetic_tokens_are_the_most_innovative(chunk_size):
    m = build(chunk_size=chunk_size, window=4, m_e=3)
    x = inputs(19)
    out = m._forward(x, state=None, mode="parallel", need_state=False)
    probs, G = out.extras["probs"], out.extras["G"]
    pos = out.extras["eid_pos"]  # [B, G, m_e]
    mem_ok = probs[..., : G * 5].unflatten(-1, (G, 5))[..., 2:].sum((1, 2)) > 0  # slots any query used
    expected = brute_memory(m, x)
    for b, g in itertools.product(range(2), range(G)):
        got = sorted(pos[b, g][mem_ok[b, g]].tolist())
        assert got == expected[b][g], (b, g)


def test_algorithm1_reading_attends_to_y_t_minus_w():
    """update='token', m_f = 1: token t's fading token is y_{t-w}; its eidetic memory includes itself."""
    w = 3
    m = build(update="token", m_f=1, m_e=2, window=w)
    x = inputs(10)
    phi = m.phi(x)  # maps 0..H-1: raw values, H..2H-1: fading values
    fade = phi[:, 2:]
    for t in range(10):
        cols = (fade[..., t, :].abs().sum((0, 1)) > 0).nonzero().flatten().tolist()
        assert cols == ([t - w] if t >= w else []), t


def test_no_gradient_through_the_selection():
    """With m_f = 0 the SSM enters only through the innovation test: it gets no gradient. The
    gathered eidetic tokens do (through W_k, W_v and x), and with m_f > 0 the SSM does."""
    x = inputs(17).requires_grad_(True)
    m = build(m_f=0, m_e=3)
    out = m(x)
    w = torch.randn_like(out)
    names, params = zip(*[(n, p) for n, p in m.named_parameters()])
    grads = torch.autograd.grad((out * w).sum(), params, allow_unused=True)
    for n, g in zip(names, grads):
        if n.startswith("ssm."):
            assert g is None or float(g.abs().max()) == 0, n
        else:
            assert g is not None and float(g.abs().max()) > 0, n
    # an eidetic token far outside the window still receives a gradient through its gathered value
    gx = torch.autograd.grad(m(x)[:, -1].sum(), x)[0]
    pos = m._forward(x.detach(), state=None, mode="parallel", need_state=False).extras["eid_pos"][:, -1]
    far = [int(p) for p in pos[0] if int(p) < 17 - 4]
    assert far and all(float(gx[0, p].abs().max()) > 0 for p in far)
    m_f = build(m_f=2, m_e=3)
    grads = torch.autograd.grad(m_f(x).sum(), list(m_f.ssm.parameters()), allow_unused=True)
    assert any(g is not None and float(g.abs().max()) > 0 for g in grads)


# -- every variant through the contract's checks --------------------------------------------

VARIANTS = [
    dict(),
    dict(chunk_size=3),  # does not divide the window: padded
    dict(chunk_size=1),
    dict(window=1, m_f=1),
    dict(m_f=5),  # more fading tokens than a chunk
    dict(selection="literal"),
    dict(update="token"),
    dict(update="token", selection="literal", m_f=1),
    dict(ssm_residual=True, innovation_error="cosine", innovation_weights="exponential"),
    dict(m_f=0, m_e=4, innovation_error="relative_l2"),
    dict(ssm_mode="chunk", ssm_chunk_size=4, innovation_error="l2"),
]


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_variant_contract(cfg):
    m = build(**cfg)
    T = 15
    x = inputs(T)
    m.mode = "parallel"
    y_ref = m(x)
    m.mode = "chunk"
    assert max_abs(m(x), y_ref) < F64_ATOL
    cache = Cache()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    assert max_abs(steps, y_ref) < F64_ATOL
    assert cache.floats() == 2 * m.state_size(T)
    for cut in (2, 7, 12):
        cache = Cache()
        y = torch.cat([m(x[:, :cut], cache=cache), m(x[:, cut:], cache=cache)], 1)
        assert max_abs(y, y_ref) < F64_ATOL, cut
    values, mixed = m.core(x)
    assert max_abs(torch.einsum("bmts,bsmp->btmp", m.phi(x), values), mixed) < F64_ATOL


def test_float32_modes_agree():
    m = build(dtype=torch.float32, chunk_size=3)
    x = inputs(23, dtype=torch.float32)
    m.mode = "parallel"
    a = m(x)
    m.mode = "chunk"
    assert rel_err(m(x), a) < F32_RTOL


def test_decoding_memory_is_bounded():
    """After any context the cache holds the window's KV, m_f + m_e memory tokens and the SSM state."""
    m = build(window=4, m_f=2, m_e=3)
    cache = Cache()
    x = inputs(40)
    sizes = []
    for t in range(40):
        m(x[:, t : t + 1], cache=cache)
        sizes.append(cache.floats())
    assert sizes[-1] == sizes[10] == 2 * m.state_size(None)
    br = m.state_breakdown()
    kv = m.n + m.d_model
    assert br["window_kv"] == kv * 3 and br["fading_kv"] == kv * 2 and br["eidetic_kv"] == kv * 3
    assert br["memory_axis"] == m.ssm.d_inner * 4 + kv * (4 + 2 + 3)


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [("window", 0), ("m_e", -1), ("m_f", -2), ("selection", "newest"), ("update", "async"), ("chunk_size", 5), ("innovation_span", 0)],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        seqmix.build_mixer("bmojo", **{**SMALL, field: value})


def test_update_token_with_a_chunk_length_is_refused():
    with pytest.raises(ValueError, match="chunk_size"):
        seqmix.build_mixer("bmojo", **{**SMALL, "update": "token", "chunk_size": 2})


@pytest.mark.parametrize("mode", ["chunk", "parallel"])
def test_segments_not_aligned_with_chunks_equal_one_pass(mode):
    """B'MOJO runs a long forward in segments (its class's auto_segment_len: the cache is bounded); a
    segment boundary inside a chunk (window 4, segments of 7) gives the one-pass outputs and gradients."""
    torch.manual_seed(0)
    cfg = dict(seqmix.mixers.base.mixer_entry("bmojo").cls.example_config(), mode=mode)
    whole = seqmix.build_mixer("bmojo", segment_len=0, **cfg).double()
    seg = seqmix.build_mixer("bmojo", segment_len=7, **cfg).double()
    seg.load_state_dict(whole.state_dict())
    x = torch.randn(2, 30, cfg["d_model"], dtype=torch.float64, requires_grad=True)
    y_seg, y_whole = seg(x), whole(x)
    assert max_abs(y_seg, y_whole) < F64_ATOL
    g_seg, = torch.autograd.grad(y_seg.square().sum(), x)
    g_whole, = torch.autograd.grad(y_whole.square().sum(), x)
    assert max_abs(g_seg, g_whole) < F64_ATOL
