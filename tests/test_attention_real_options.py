"""softmax attention's options on the scores (soft-capping, ALiBi, sinks) and RoPE's frequency scalings, in
the op (``seqmix.ops.softmax_attention``, ``attention_probs``, ``attention_decode``, ``rotary``) and in the
``softmax_attention`` mixer: every mode and the decoding step against an explicit loop written from the
definitions, the map Φ, the meta device, bad input. (Their exactness against transformers' models:
tests/test_interop_transformers.py.)"""

from __future__ import annotations


import pytest
import torch

import seqmix
from seqmix import Cache
from seqmix.ops import (
    alibi_slopes, attention_decode, attention_probs, rope_frequencies, rotary, rotary_reference, softmax_attention,
)
from tolerances import F64_ATOL, assert_modes_agree_f64, max_abs

META = torch.device("meta")


def reference(q, k, v, *, scale, window=None, softcap=None, alibi=None, sinks=None):
    """The definition, one query and head at a time: s_ij = cap(scale·q_iᵀk_j) − m_h (i − j) over the visible
    j (j <= i, i − j < window), o_i = Σ_j e^{s_ij} v_j / (e^{z_h} + Σ_j e^{s_ij}). q [B, T, H, K], k, v with
    Hkv heads; float64."""
    B, T, H, _ = q.shape
    G = H // k.shape[2]
    o = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                js = [j for j in range(i + 1) if window is None or i - j < window]
                s = torch.stack([scale * (q[b, i, h] @ k[b, j, h // G]) for j in js])
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                if alibi is not None:
                    s = s - alibi[h] * torch.tensor([i - j for j in js], dtype=torch.float64)
                e = torch.exp(s - s.max())
                den = e.sum() + (torch.exp(sinks[h] - s.max()) if sinks is not None else 0.0)
                o[b, i, h] = sum(e[n] * v[b, j, h // G] for n, j in enumerate(js)) / den
    return o


OPTIONS = {
    "softcap": dict(softcap=1.5),
    "alibi": dict(alibi=True),
    "sinks": dict(sinks=True),
    "all+window": dict(softcap=2.0, alibi=True, sinks=True, window=4),
}


def _tensors(opts, H=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    if opts.get("alibi"):
        out["alibi"] = alibi_slopes(H, dtype=torch.float64)
    if opts.get("sinks"):
        out["sinks"] = torch.randn(H, generator=g, dtype=torch.float64)
    if "softcap" in opts:
        out["softcap"] = opts["softcap"]
    return out


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_op_equals_the_definition_in_every_mode_and_the_decoding_step(name):
    opts = OPTIONS[name]
    g = torch.Generator().manual_seed(1)
    B, T, H, Hkv, K = 2, 9, 4, 2, 5
    q, k, v = (torch.randn(B, T, h, K, generator=g, dtype=torch.float64) * 1.5 for h in (H, Hkv, Hkv))
    extra = _tensors(opts, H)
    want = reference(q, k, v, scale=0.4, window=opts.get("window"), **extra)
    for mode in ("parallel", "sdpa"):
        o = softmax_attention(q, k, v, scale=0.4, window=opts.get("window"), mode=mode, **extra)
        assert max_abs(o, want) < F64_ATOL, f"{name}, mode {mode}"
    P = attention_probs(q, k, scale=0.4, window=opts.get("window"), **extra)
    assert max_abs(torch.einsum("bhts,bshv->bthv", P, v.repeat_interleave(2, 2)), want) < F64_ATOL
    if "sinks" in extra:  # the sink takes the rest of each row
        assert float(P.sum(-1).max()) < 1.0
    w = opts.get("window") or T
    for i in range(T):  # the decoding read: the keys the query sees, its own last
        lo = max(0, i - w + 1)
        o = attention_decode(q[:, i], k[:, lo:i + 1], v[:, lo:i + 1], scale=0.4, **extra)
        assert max_abs(o, want[:, i]) < F64_ATOL, f"{name}: step {i}"


MLA = dict(head_dim=6, kv_lora_rank=5, qk_rope_head_dim=2, v_head_dim=3, q_lora_rank=7, rope=True)


def _mixer(**cfg):
    torch.manual_seed(0)
    kv = {} if "kv_lora_rank" in cfg else {"kv_heads": 2}
    m = seqmix.build_mixer("softmax_attention", d_model=16, heads=4, **kv, **cfg).double()
    with torch.no_grad():
        if m.sinks is not None:
            m.sinks.normal_()
    return m


@pytest.mark.parametrize("name", list(OPTIONS) + ["yarn", "longrope", "mla", "mla_sinks_window"])
def test_the_mixer_decodes_splits_and_keeps_its_map(name):
    cfg = dict(OPTIONS.get(name, {}))
    if name == "yarn":
        cfg.update(rope=True, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    if name.startswith("mla"):  # MLA: the cache holds the latent pair (r + R floats per token)
        cfg.update(MLA, **(dict(sinks=True, window=4) if name == "mla_sinks_window" else {}))
    if name == "longrope":  # one frequency set for every call (seq_len below L throughout): position-only
        cfg.update(rope=True, rope_scaling={"type": "longrope", "original_max_position_embeddings": 64,
                                            "short_factor": [1.0, 2.0], "long_factor": [3.0, 5.0]})
    m = _mixer(**cfg)
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    y = assert_modes_agree_f64(m, x, name)
    with torch.no_grad():
        cache = Cache()
        steps = torch.cat([m(x[:, :4], cache=cache)] + [m(x[:, t:t + 1], cache=cache) for t in range(4, 11)], 1)
        assert max_abs(steps, y) < F64_ATOL, f"{name}: prefill then steps"
        assert cache.floats() == 2 * m.state_size(11)
        values, mixed = m.core(x)
        assert max_abs(torch.einsum("bmts,bsmp->btmp", m.phi(x), values), mixed) < F64_ATOL, f"{name}: phi"
    if name in OPTIONS:
        with pytest.raises(ValueError, match="dsf.*(softcap|alibi|sinks|window)"):
            m.dsf(x)


def test_the_options_change_the_output():
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    base = _mixer()(x)
    for name, opts in OPTIONS.items():
        assert max_abs(_mixer(**opts)(x), base) > 1e-3, name


def test_alibi_slopes_are_blooms():
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")
    for H in (1, 4, 6, 8, 12):
        alibi = bloom.build_alibi_tensor(torch.ones(1, 3), H, torch.float64)  # [H, 1, 3] = m_h·j
        assert max_abs(alibi[:, 0, 1], alibi_slopes(H, dtype=torch.float64)) < 1e-7, H
    assert max_abs(alibi_slopes(8, dtype=torch.float64), torch.tensor([2.0 ** -i for i in range(1, 9)], dtype=torch.float64)) == 0


@pytest.mark.parametrize("scaling", [
    {"type": "linear", "factor": 3.0},
    {"type": "dynamic", "factor": 2.0, "max_position_embeddings": 4},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    {"type": "longrope", "original_max_position_embeddings": 4, "factor": 8.0, "short_factor": [1.0, 1.5, 2.0, 3.0],
     "long_factor": [1.0, 2.0, 4.0, 8.0]},
], ids=lambda s: s["type"])
def test_rotary_with_a_scaling_equals_its_reference(scaling):
    x = torch.randn(2, 9, 3, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    pos = torch.arange(9)
    a = rotary(x, pos, rotary_dim=8, theta=100.0, scaling=scaling, seq_len=9)
    assert max_abs(a, rotary_reference(x, pos, rotary_dim=8, theta=100.0, scaling=scaling, seq_len=9)) < 1e-12
    assert max_abs(a, rotary(x, pos, rotary_dim=8, theta=100.0)) > 1e-3  # the scaling acts
    assert torch.equal(a[..., 8:], x[..., 8:])  # partial rotary: the rest unchanged
    _, factor = rope_frequencies(8, 100.0, scaling, seq_len=9)
    norms = a[..., :8].norm(dim=-1) / x[..., :8].norm(dim=-1)  # a rotation times the attention factor
    assert max_abs(norms, torch.full_like(norms, factor)) < 1e-12


def test_mla_is_a_softmax_over_the_latent():
    """q^hᵀk_j^h = (W_kb^hᵀ q_nope^h)ᵀ c_j + q_pe^hᵀ k_pe,j: the scores from the latent alone equal the mixer's."""
    m = _mixer(**MLA)
    x = torch.randn(1, 7, 16, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        q, lat, k_pe = m._qkv(x)
        K, R, V, H = 6, 2, 3, 4
        W_kb = m.W_kvb.weight.view(H, K - R + V, 5)[:, : K - R]  # [H, K − R, r]
        s = torch.einsum("thn,hnr,sr->hts", q[0, ..., : K - R], W_kb, lat[0, :, 0]) + torch.einsum("thp,sp->hts", q[0, ..., K - R:], k_pe[0, :, 0])
        mask = torch.ones(7, 7, dtype=torch.bool).tril()
        assert max_abs(torch.softmax(s.masked_fill(~mask, float("-inf")), -1), m.phi(x)[0]) < F64_ATOL


def test_the_options_run_on_meta():
    m = seqmix.build_mixer("softmax_attention", d_model=16, heads=4, kv_heads=2, softcap=2.0, alibi=True, sinks=True, window=4,
                           rope=True, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}).to(META)
    params = [p for p in m.parameters()]
    for mode in m.modes:
        m.mode = mode
        x = torch.randn(2, 9, 16, device=META, requires_grad=True)
        y = m(x)
        assert y.device.type == "meta"
        assert all(g is None or g.device.type == "meta" for g in torch.autograd.grad(y.sum(), [x, *params], allow_unused=True))
    cache = Cache()
    with torch.no_grad():
        m(torch.randn(2, 5, 16, device=META), cache=cache)
        assert m(torch.randn(2, 1, 16, device=META), cache=cache).device.type == "meta"
    m = seqmix.build_mixer("softmax_attention", d_model=16, heads=4, **MLA).to(META)
    y = m(torch.randn(2, 9, 16, device=META, requires_grad=True))
    assert y.device.type == "meta" and all(g.device.type == "meta" for g in torch.autograd.grad(y.sum(), list(m.parameters())))
    cache = Cache()
    with torch.no_grad():
        m(torch.randn(2, 5, 16, device=META), cache=cache)
        assert m(torch.randn(2, 1, 16, device=META), cache=cache).device.type == "meta"


def test_bad_options_are_named():
    q = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="'softcap'"):
        softmax_attention(q, q, q, softcap=0.0)
    with pytest.raises(ValueError, match="'alibi'.*\\[2\\]"):
        softmax_attention(q, q, q, alibi=torch.ones(3))
    with pytest.raises(ValueError, match="'sinks'"):
        attention_probs(q, q, sinks=torch.ones(2, 1))
    with pytest.raises(ValueError, match="'scaling'.*'type'"):
        rotary(q, torch.arange(3), scaling={"type": "ntk"})
    with pytest.raises(ValueError, match="'scaling'.*missing \\['factor'\\]"):
        rotary(q, torch.arange(3), scaling={"type": "linear"})
    with pytest.raises(ValueError, match="'long_factor'"):
        rotary(q, torch.arange(3), scaling={"type": "longrope", "original_max_position_embeddings": 4, "short_factor": [1.0, 1.0],
                                            "long_factor": [1.0]})
    with pytest.raises(ValueError, match="rope_scaling.*rope = False"):
        seqmix.build_mixer("softmax_attention", d_model=16, heads=4, rope_scaling={"type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match="softcap"):
        seqmix.build_mixer("softmax_attention", d_model=16, heads=4, softcap=-1.0)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        seqmix.build_mixer("softmax_attention", d_model=16, heads=4, head_dim=6, kv_lora_rank=5, qk_rope_head_dim=3)
    with pytest.raises(ValueError, match="kv_heads.*MLA"):
        seqmix.build_mixer("softmax_attention", d_model=16, heads=4, kv_heads=2, **MLA)
    with pytest.raises(ValueError, match="set kv_lora_rank"):
        seqmix.build_mixer("softmax_attention", d_model=16, heads=4, q_lora_rank=4)
