"""The gated / position-encoding variants of softmax attention: fox, stickbreaking,
path_attention. The contract suite covers the default configs; here: each op's modes against a
reference written out from the paper's definition (loops over i and j), continuation from a
cache in every mode, the mixers' options (FoX Pro, stick-breaking's remainder and
attend_current, PaTH's gate/conv/rank), limits where a variant reduces to softmax attention,
and flash-linear-attention's naive references where fla imports (optional extra 'reference':
tests skip without it; tests/fla_ref.py loads the naive files by path, no triton needed)."""

from __future__ import annotations

import math

from types import SimpleNamespace

import pytest
from fla_ref import fla_naive
import torch
import torch.nn.functional as F

import seqmix
from seqmix import Cache
from seqmix.ops.forgetting import forgetting_attention, forgetting_keys, forgetting_probs
from seqmix.ops.path import householder, path_attention, path_scores
from seqmix.ops.stickbreaking import stickbreaking_attention, stickbreaking_probs
from tolerances import F32_RTOL, F64_ATOL, max_abs, rel_err

B, H, K, V = 2, 3, 4, 5


def rand(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def qkv(Tq, Tk=None, dtype=torch.float64, seed=0):
    Tk = Tq if Tk is None else Tk
    return rand(B, Tq, H, K, dtype=dtype, seed=seed), rand(B, Tk, H, K, dtype=dtype, seed=seed + 1), rand(B, Tk, H, V, dtype=dtype, seed=seed + 2)


def unit(w):
    return w / w.norm(dim=-1, keepdim=True)


# ------------------------------------------------------------------------------------------
# references written out from the papers' definitions
# ------------------------------------------------------------------------------------------


def fox_reference(q, k, v, log_f, scale, window=None):
    """o_i = Σ_j softmax_j(s q_iᵀk_j + Σ_{l=j+1..i} log f_l) v_j, loops over i and j (Tq = Tk)."""
    T = q.shape[1]
    o = torch.zeros(*q.shape[:3], v.shape[-1], dtype=q.dtype)
    for i in range(T):
        js = [j for j in range(i + 1) if window is None or i - j < window]
        logits = torch.stack([scale * (q[:, i] * k[:, j]).sum(-1) + log_f[:, j + 1 : i + 1].sum(1) for j in js], -1)
        p = torch.softmax(logits, -1)
        o[:, i] = sum(p[..., n, None] * v[:, j] for n, j in enumerate(js))
    return o


def sb_reference(q, k, v, scale, attend_current=False, remainder="current"):
    """A_ij = β_ij Π_{j<l<i} (1 − β_il), literal products of probabilities (Tq = Tk)."""
    T = q.shape[1]
    beta = torch.sigmoid(scale * torch.einsum("bihk,bjhk->bhij", q, k))
    o = torch.zeros(B, T, H, v.shape[-1], dtype=q.dtype)
    for i in range(T):
        last = i if attend_current else i - 1
        total = torch.zeros(B, H, dtype=q.dtype)
        for j in range(last + 1):
            a = beta[:, :, i, j].clone()
            for l in range(j + 1, last + 1):
                a = a * (1 - beta[:, :, i, l])
            total = total + a
            o[:, i] += a[..., None] * v[:, j]
        if remainder == "current":
            o[:, i] += (1 - total)[..., None] * v[:, i]
    return o


def path_reference(q, k, v, w, beta, scale, c=None, gate_scaled=True):
    """score(i, j) = q_iᵀ H_i ⋯ H_{j+1} k_j with the key carried vector by vector (Tq = Tk)."""
    T = q.shape[1]
    o = torch.zeros(B, T, H, v.shape[-1], dtype=q.dtype)
    for i in range(T):
        logits = []
        for j in range(i + 1):
            kj = k[:, j]
            for t in range(j + 1, i + 1):  # k_j ← H_t k_j
                kj = kj - beta[:, t, :, None] * (kj * w[:, t]).sum(-1, keepdim=True) * w[:, t]
            s = (q[:, i] * kj).sum(-1)
            if c is not None:
                s = (s + c[:, i] - c[:, j]) * scale if gate_scaled else s * scale + c[:, i] - c[:, j]
            else:
                s = s * scale
            logits.append(s)
        p = torch.softmax(torch.stack(logits, -1), -1)
        o[:, i] = sum(p[..., j, None] * v[:, j] for j in range(i + 1))
    return o


# ------------------------------------------------------------------------------------------
# ops: every mode against the written-out reference, and continuation from a cache
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("mode", ["parallel", "sdpa"])
def test_forgetting_op_matches_reference(mode, window):
    T = 11
    q, k, v = qkv(T)
    log_f = F.logsigmoid(rand(B, T, H, seed=5) + 1)
    ref = fox_reference(q, k, v, log_f, 0.5, window)
    o = forgetting_attention(q, k, v, log_f.cumsum(1), scale=0.5, window=window, mode=mode)
    assert max_abs(o, ref) < F64_ATOL
    probs = forgetting_probs(q, k, log_f.cumsum(1), scale=0.5, window=window)
    assert max_abs(torch.einsum("bhij,bjhv->bihv", probs, v), ref) < F64_ATOL
    if window is not None:  # the window is seen: without it the output differs
        assert max_abs(forgetting_attention(q, k, v, log_f.cumsum(1), scale=0.5, mode=mode), ref) > 1e-3


@pytest.mark.parametrize("mode", ["parallel", "sdpa"])
def test_forgetting_op_continues_from_prefix(mode):
    """Queries as the last Tq of Tk keys = the rows of the full computation; c rebased by a constant changes nothing."""
    T, Tq = 13, 5
    q, k, v = qkv(T)
    c = F.logsigmoid(rand(B, T, H, seed=5)).cumsum(1)
    full = forgetting_attention(q, k, v, c, mode="parallel")
    part = forgetting_attention(q[:, -Tq:], k, v, c + 7.0, mode=mode)
    assert max_abs(part, full[:, -Tq:]) < F64_ATOL


def test_forgetting_with_no_forgetting_is_softmax_attention():
    q, k, v = qkv(9)
    o = forgetting_attention(q, k, v, torch.zeros(B, 9, H, dtype=torch.float64), mode="parallel")
    assert max_abs(o, seqmix.ops.softmax_attention(q, k, v, mode="parallel")) < F64_ATOL
    assert forgetting_keys(k.bfloat16(), torch.zeros(B, 9, H, dtype=torch.bfloat16)).dtype == torch.float32  # c is never half


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("remainder", ["current", "drop"])
@pytest.mark.parametrize("mode", ["parallel", "chunk"])
def test_stickbreaking_op_matches_reference(mode, remainder, attend_current):
    T = 10
    q, k, v = qkv(T)
    ref = sb_reference(q, k, v, 0.7, attend_current, remainder)
    o = stickbreaking_attention(q, k, v, scale=0.7, attend_current=attend_current, remainder=remainder, mode=mode, chunk_size=3)
    assert max_abs(o, ref) < F64_ATOL
    A = stickbreaking_probs(q, k, scale=0.7, attend_current=attend_current, remainder=remainder)
    assert max_abs(torch.einsum("bhij,bjhv->bihv", A, v), ref) < F64_ATOL
    assert torch.triu(A, 1).abs().max() == 0
    if remainder == "current":  # the stick is used up: every row sums to 1
        assert max_abs(A.sum(-1), torch.ones_like(A.sum(-1))) < F64_ATOL


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_stickbreaking_chunk_continues_from_prefix(chunk_size):
    """Cached keys before the queries (not a whole number of blocks), forward and gradients."""
    T, Tq = 17, 6
    q, k, v = (t.requires_grad_() for t in qkv(T))
    full = stickbreaking_attention(q, k, v, mode="parallel")[:, -Tq:]
    part = stickbreaking_attention(q[:, -Tq:], k, v, mode="chunk", chunk_size=chunk_size)
    assert max_abs(part, full) < F64_ATOL
    g = torch.autograd.grad(full.sum(), (q, k, v))
    g2 = torch.autograd.grad(part.sum(), (q, k, v))
    assert max(max_abs(a, b) for a, b in zip(g, g2)) < F64_ATOL


def test_stickbreaking_remainder_is_returned():
    q, k, v = qkv(8)
    o, r = stickbreaking_attention(q, k, v, remainder="drop", return_remainder=True)
    A = stickbreaking_probs(q, k, remainder="drop")
    assert max_abs(r, 1 - A.sum(-1).transpose(1, 2)) < F64_ATOL
    assert max_abs(r[:, 0], torch.ones_like(r[:, 0])) == 0  # the first query sees no key


@pytest.mark.parametrize("gate", [None, "scaled", "unscaled"])
@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_path_op_matches_reference(mode, gate):
    T = 9
    q, k, v = qkv(T)
    w, beta = unit(rand(B, T, H, K, seed=7)), 2 * torch.sigmoid(rand(B, T, H, seed=8))
    c = F.logsigmoid(rand(B, T, H, seed=9)).cumsum(1) if gate else None
    ref = path_reference(q, k, v, w, beta, 0.5, c, gate == "scaled")
    o = path_attention(q, k, v, w, beta, c=c, scale=0.5, gate_scaled=gate == "scaled", mode=mode, chunk_size=4)
    assert max_abs(o, ref) < F64_ATOL


def test_path_chunk_gradients_match_reference_mode():
    T = 11
    q, k, v = (t.requires_grad_() for t in qkv(T))
    w = unit(rand(B, T, H, K, seed=7)).requires_grad_()
    beta = (2 * torch.sigmoid(rand(B, T, H, seed=8))).requires_grad_()
    args = (q, k, v, w, beta)
    outs = {m: path_attention(*args, mode=m, chunk_size=4) for m in ("parallel", "recurrent", "chunk")}
    weight = rand(*outs["parallel"].shape, seed=3)
    grads = {m: torch.autograd.grad((o * weight).sum(), args) for m, o in outs.items()}
    for m in ("recurrent", "chunk"):
        assert max_abs(outs[m], outs["parallel"]) < F64_ATOL
        assert max(max_abs(a, b) for a, b in zip(grads[m], grads["parallel"])) < F64_ATOL, m


@pytest.mark.parametrize("mode", ["parallel", "recurrent", "chunk"])
def test_path_carried_keys_and_continuation(mode):
    """The carried keys are H_{T−1} ⋯ H_{j+1} k_j (explicit matrices); a continuation from them
    (the cache) equals the rows of one pass, in every mode and for chunk lengths that do not
    divide the segment."""
    T, cut = 14, 5
    q, k, v = qkv(T)
    w, beta = unit(rand(B, T, H, K, seed=7)), 2 * torch.sigmoid(rand(B, T, H, seed=8))
    full, keys = path_attention(q, k, v, w, beta, mode="parallel", output_final_keys=True)
    Hm = householder(w, beta)  # [B, T, H, K, K]
    for j in (0, 6, T - 1):
        kj = k[:, j]
        for t in range(j + 1, T):
            kj = (Hm[:, t] @ kj[..., None])[..., 0]
        assert max_abs(keys[:, j], kj) < F64_ATOL
    _, cached = path_attention(q[:, :cut], k[:, :cut], v[:, :cut], w[:, :cut], beta[:, :cut], mode=mode, chunk_size=4, output_final_keys=True)
    k2 = torch.cat([cached, k[:, cut:]], 1)
    o2, keys2 = path_attention(q[:, cut:], k2, v, w[:, cut:], beta[:, cut:], mode=mode, chunk_size=4, output_final_keys=True)
    assert max_abs(o2, full[:, cut:]) < F64_ATOL
    assert max_abs(keys2, keys) < F64_ATOL


def test_path_without_reflections_is_softmax_attention():
    """β = 0: every H_t = I, PaTH is softmax attention (the scores of all three modes)."""
    q, k, v = qkv(10)
    w, beta = unit(rand(B, 10, H, K, seed=7)), torch.zeros(B, 10, H, dtype=torch.float64)
    ref = seqmix.ops.softmax_attention(q, k, v, mode="parallel")
    for mode in ("parallel", "recurrent", "chunk"):
        assert max_abs(path_attention(q, k, v, w, beta, mode=mode, chunk_size=3), ref) < F64_ATOL


def test_path_scores_bf16_computed_in_float32():
    q, k, _ = qkv(12, dtype=torch.bfloat16)
    w, beta = unit(rand(B, 12, H, K, seed=7)).bfloat16(), (2 * torch.sigmoid(rand(B, 12, H, seed=8))).bfloat16()
    S, keys = path_scores(q, k, w, beta, mode="chunk", chunk_size=4, output_final_keys=True)
    S64, _ = path_scores(q.double(), k.double(), w.double(), beta.double(), mode="parallel")
    assert S.dtype == keys.dtype == torch.float32
    assert rel_err(S, S64) < 1e-5


def test_ops_bad_input_names_the_argument():
    q, k, v = qkv(6)
    c = torch.zeros(B, 6, H, dtype=torch.float64)
    with pytest.raises(ValueError, match="'c'"):
        forgetting_attention(q, k, v, c[:, :3])
    with pytest.raises(ValueError, match="mode"):
        forgetting_attention(q, k, v, c, mode="chunk")
    with pytest.raises(ValueError, match="remainder"):
        stickbreaking_attention(q, k, v, remainder="keep")
    with pytest.raises(ValueError, match="chunk_size"):
        stickbreaking_attention(q, k, v, mode="chunk", chunk_size=0)
    with pytest.raises(ValueError, match="'k'"):
        stickbreaking_attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="'beta'"):
        path_attention(q, k, v, q, c[..., :1])
    with pytest.raises(ValueError, match="'w'"):
        path_attention(q, k, v, q[:, :2], c)
    with pytest.raises(ValueError, match="'q'"):
        path_attention(q.clone().fill_(float("nan")), k, v, q, c)


# ------------------------------------------------------------------------------------------
# mixers: options beyond the contract's example configs
# ------------------------------------------------------------------------------------------


def build(name, dtype=torch.float64, **cfg):
    torch.manual_seed(0)
    entry = seqmix.mixer_entry(name)
    m = seqmix.build_mixer(name, **{**entry.example_config(), **cfg})
    with torch.no_grad():  # norm weights away from their init of ones, so a test can see them
        for pname, p in m.named_parameters():
            if "norm" in pname:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return m.to(dtype).eval()


def x_of(m, T, dtype=torch.float64, seed=1):
    return torch.randn(B, T, m.d_model, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def check_mixer(m, T=13):
    """Every mode = the reference (outputs and input gradients), step decoding and a split
    with a carried cache = one pass in every mode, phi reproduces the core, the cache holds
    state_size floats."""
    x = x_of(m, T).requires_grad_()
    m.mode = m.reference_mode
    y = m(x)
    g = torch.autograd.grad(y.pow(2).sum(), x)[0]
    for mode in m.modes:
        m.mode = mode
        y2 = m(x)
        assert max_abs(y2, y) < F64_ATOL, mode
        assert max_abs(torch.autograd.grad(y2.pow(2).sum(), x)[0], g) < F64_ATOL, mode
        for cut in (1, 6):
            cache = Cache()
            with torch.no_grad():
                ys = torch.cat([m(x[:, :cut], cache=cache), m(x[:, cut:], cache=cache)], 1)
            assert max_abs(ys, y) < F64_ATOL, (mode, cut)
    m.mode = m.reference_mode
    cache = Cache()
    with torch.no_grad():
        steps = torch.cat([m(x[:, t : t + 1], cache=cache) for t in range(T)], 1)
    assert max_abs(steps, y) < F64_ATOL
    assert cache.floats() == B * m.state_size(seq_len=T)
    with torch.no_grad():
        values, mixed = m.core(x)
        assert max_abs(torch.einsum("bmts,bsmp->btmp", m.phi(x), values), mixed) < F64_ATOL
    return y


FOX_OPTIONS = [
    {"window": 4},
    {"rope": True},
    {"qk_norm": True, "k_shift": True, "v_shift": True, "output_gate": True, "output_norm": True},  # Pro
    {"k_shift": True, "window": 3, "forget_bias": False},
]


@pytest.mark.parametrize("cfg", FOX_OPTIONS, ids=lambda c: "+".join(c))
def test_fox_options(cfg):
    y = check_mixer(build("fox", **cfg))
    assert max_abs(y, build("fox")(x_of(build("fox"), 13))) > 1e-3  # the option is seen


def test_fox_pro_matches_written_out_block():
    """FoX Pro written out from its definition: shifted k, v, per-head qk RMSNorm, the forget
    bias, per-head output RMSNorm, σ gate, W_o."""
    m = build("fox", qk_norm=True, k_shift=True, v_shift=True, output_gate=True, output_norm=True)
    T = 9
    x = x_of(m, T)
    Hh, Kh, Vh = m.heads, m.head_qk, m.head_v

    def rms(z, wt, eps=1e-6):
        return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + eps) * wt

    q, k = (x @ m.W_qk.weight.T).split([Hh * Kh, Hh * Kh], -1)
    v = x @ m.W_v.weight.T
    q, k, v = q.view(B, T, Hh, Kh), k.view(B, T, Hh, Kh), v.view(B, T, Hh, Vh)

    def shift(z, W):
        a = torch.sigmoid(x @ W.weight.T)[..., None]
        prev = torch.cat([torch.zeros_like(z[:, :1]), z[:, :-1]], 1)
        return a * prev + (1 - a) * z

    k, v = shift(k, m.W_kshift), shift(v, m.W_vshift)
    q = rms(q, m.q_norm.weight.view(Hh, Kh))
    k = rms(k, m.k_norm.weight.view(Hh, Kh))
    log_f = F.logsigmoid(x @ m.W_f.weight.T + m.W_f.bias)
    o = fox_reference(q, k, v, log_f, 1 / math.sqrt(Kh))
    o = rms(o, m.out_norm.weight.view(Hh, Vh)) * torch.sigmoid(x @ m.W_g.weight.T).view(B, T, Hh, Vh)
    y = o.flatten(2) @ m.W_o.weight.T
    assert max_abs(m(x), y) < F64_ATOL


def test_fox_with_open_forget_gate_is_softmax_attention():
    """f_t ≡ 1 (w_f = 0, b_f large): FoX is softmax attention with the same weights."""
    m = build("fox")
    with torch.no_grad():
        m.W_f.weight.zero_()
        m.W_f.bias.fill_(60.0)  # log σ(60) ≈ −1e-26
    s = seqmix.build_mixer("softmax_attention", **seqmix.mixer_entry("fox").example_config()).double()
    s.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("W_f")})
    x = x_of(m, 12)
    assert max_abs(m(x), s(x)) < F64_ATOL


def test_fox_cache_stores_cumulative_log_forget_gate():
    m = build("fox")
    x = x_of(m, 7)
    cache = Cache()
    with torch.no_grad():
        m(x, cache=cache)
    kv = cache.get(m)["kv"]
    log_f = F.logsigmoid(m.W_f(x))
    assert kv.keys.shape[-1] == m.head_qk + 1
    assert max_abs(-kv.keys[..., -1], log_f.cumsum(1)) < F64_ATOL


@pytest.mark.parametrize("cfg", [{"attend_current": True}, {"remainder": "drop", "attend_current": True}, {"chunk_size": 5}],
                         ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()))
def test_stickbreaking_options(cfg):
    check_mixer(build("stickbreaking", **cfg))


@pytest.mark.parametrize("cfg", [
    {"forget_gate": False},
    {"gate_scaled": False},
    {"conv_size": None, "w_rank": None},
    {"qk_norm": True, "chunk_size": 5},
    {"beta_scale": 1.0, "conv_size": 4},
], ids=lambda c: "+".join(f"{k}={v}" for k, v in c.items()))
def test_path_options(cfg):
    check_mixer(build("path_attention", **cfg))


def test_path_cache_holds_carried_keys():
    """After a prefix, the cache's "k" are the keys carried to the last position: the next
    step's scores read them directly (q_tᵀ H_t k_j^{(t−1)})."""
    m = build("path_attention", forget_gate=False)
    T = 8
    x = x_of(m, T)
    cache = Cache()
    with torch.no_grad():
        m(x, cache=cache)
        q, k, v, w, beta, _, _ = m._parts(x, None)
        _, keys = path_scores(q, k, w, beta, mode="parallel", output_final_keys=True)
    st = cache.get(m)
    assert set(st) == {"k", "v", "conv"}
    assert max_abs(st["k"], keys) < F64_ATOL
    assert st["conv"].shape == (B, m.heads * m.head_qk, m.config.conv_size - 1)


def test_path_w_is_unit_and_beta_in_range():
    m = build("path_attention")
    with torch.no_grad():
        _, _, _, w, beta, _, _ = m._parts(x_of(m, 10), None)
    norm = w.norm(dim=-1)  # w / sqrt(Σw² + ε): 1 up to ε / (2Σw²)
    assert float(norm.max()) <= 1 and float(norm.min()) > 0.99
    assert float(beta.min()) > 0 and float(beta.max()) < 2


@pytest.mark.parametrize("name", ["fox", "stickbreaking", "path_attention"])
def test_float32_modes_and_bf16_parameters(name):
    """float32: modes within F32_RTOL of the reference; bf16 parameters: the cache's decay /
    carried keys stay float32 (the precision rule), decoding matches the forward pass."""
    m = build(name, torch.float32)
    x = x_of(m, 21, torch.float32)
    m.mode = m.reference_mode
    y = m(x)
    for mode in m.modes:
        m.mode = mode
        assert rel_err(m(x), y) < F32_RTOL
    mb = build(name, torch.bfloat16)
    xb = x.bfloat16()
    with torch.no_grad():
        yb = mb(xb)
        cache = Cache()
        steps = torch.cat([mb(xb[:, t : t + 1], cache=cache) for t in range(xb.shape[1])], 1)
    st = cache.get(mb)
    if name == "fox":
        assert st["kv"].keys.dtype == torch.float32
    if name == "path_attention":
        assert st["k"].dtype == torch.float32 and st["c"].dtype == torch.float32
    assert rel_err(steps.float(), yb.float()) < 3e-2


# ------------------------------------------------------------------------------------------
# flash-linear-attention's naive references (optional extra 'reference'; tests/fla_ref.py)
# ------------------------------------------------------------------------------------------


FLA_T = 37  # not a multiple of fla's chunk (8 below) nor of ours


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("window", [None, 6])
def test_fox_matches_fla_naive(window):
    fla = SimpleNamespace(naive_forgetting_attn=fla_naive("ops/forgetting_attn/naive.py", "naive_forgetting_attn"))
    q, k, v = qkv(FLA_T, dtype=torch.float32)
    v = rand(B, FLA_T, H, K, dtype=torch.float32, seed=4)
    g = F.logsigmoid(rand(B, FLA_T, H, dtype=torch.float32, seed=5) + 2)
    ref = fla.naive_forgetting_attn(q, k, v, g, window_size=window)
    for mode in ("parallel", "sdpa"):
        assert rel_err(forgetting_attention(q, k, v, g.cumsum(1), window=window, mode=mode), ref) < F32_RTOL


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("attend_current", [False, True])
def test_stickbreaking_matches_fla_naive(attend_current):
    fla = SimpleNamespace(naive_stickbreaking_attn=fla_naive("ops/stickbreaking_attn/naive.py", "naive_stickbreaking_attn"))
    q, k, v = qkv(FLA_T)  # fla's naive keeps float64
    o_ref, r_ref = fla.naive_stickbreaking_attn(q, k, v, attend_current=attend_current)
    for mode in ("parallel", "chunk"):
        o, r = stickbreaking_attention(q, k, v, attend_current=attend_current, remainder="drop", mode=mode, chunk_size=8, return_remainder=True)
        assert max_abs(o, o_ref) < F64_ATOL and max_abs(r, r_ref) < F64_ATOL
    o = stickbreaking_attention(q, k, v, attend_current=attend_current)  # the remainder to the own value: o + r v
    assert max_abs(o, o_ref + r_ref[..., None] * v) < F64_ATOL


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("gate", [False, True])
def test_path_matches_fla_naive(gate):
    fla = SimpleNamespace(naive_path_attn=fla_naive("ops/path_attn/naive.py", "naive_path_attn"))
    q, k, _ = qkv(FLA_T, dtype=torch.float32)
    v = rand(B, FLA_T, H, K, dtype=torch.float32, seed=4)
    w = unit(rand(B, FLA_T, H, K, dtype=torch.float32, seed=7))
    beta = 2 * torch.sigmoid(rand(B, FLA_T, H, dtype=torch.float32, seed=8))
    g = F.logsigmoid(rand(B, FLA_T, H, dtype=torch.float32, seed=9) + 2) if gate else torch.zeros(B, FLA_T, H)
    ref = fla.naive_path_attn(q, k, v, w, beta, g, K**-0.5, chunk_size=8)  # fla scales the gate bias too
    for mode in ("parallel", "recurrent", "chunk"):
        o = path_attention(q, k, v, w, beta, c=g.cumsum(1) if gate else None, gate_scaled=True, mode=mode, chunk_size=16)
        assert rel_err(o, ref) < F32_RTOL, mode
