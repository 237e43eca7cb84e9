"""Hybrid mixers: B'MOJO and B'MOJO-F (B'MOJO paper §3, Algorithm 1, App. B.2; bmojo note §4),
and the Mamba variants of the paper's App. E (Strip Mamba, Bilinear Mamba).

B'MOJO (``bmojo``) mixes four memories in one softmax attention, per layer:

* short-term eidetic: the last w raw tokens (a sliding window);
* fading: m_f outputs y of a Mamba block run over the whole sequence ("fading tokens"):
  y = Mamba(u), the SSM's summary of everything before them;
* long-term eidetic: the raw tokens u_τ whose SSM output was hardest to predict (the
  innovation test, ``seqmix.ops.eidetic``), at most m_e of them, chosen without gradient;
* (the paper's "in-storage" retrieval memory is not specified by it and not built here).

Efficient form (§3.3, App. B.2): the sequence is cut into chunks of c = w tokens; chunk g's
memory is the m_f fading tokens y_{s_g - m_f} .. y_{s_g - 1} and the m_e eidetic tokens
argtop_{m_e} {ε_τ : τ < s_g} (s_g the chunk's first position); each chunk prefixed by its
memory, then sliding-window attention with window K = w + m_f + m_e
(``seqmix.ops.chunked_memory_attention``): every raw token sees its last w raw tokens and its
own chunk's m = m_f + m_e memory tokens:

    out_t = W_o · Σ_{keys j of t} softmax_j(s · q_tᵀ k_j) v_j,
    keys of t = {u_{t-w+1..t}} ∪ {y_{s_g-m_f..s_g-1}} ∪ {u_τ : τ ∈ I_g},    q, k, v = W_q·, W_k·, W_v·

with the same (tied) projections for raw, fading and eidetic tokens and no positional encoding.
B'MOJO-F (``bmojo_f``) is the same layer with m_e = 0. Special cases: m_f = m_e = 0 is
sliding-window attention, w >= T is full causal attention.

Algorithm 1 read literally (``update="token"``): the memory is refreshed at every token: the
fading tokens of token t are the m_f SSM outputs just older than its window,
y_{t-w-m_f+1} .. y_{t-w} (Algorithm 1's y_{t-w} for m_f = 1), and its eidetic memory is M_t,
updated with u_t itself before the output (τ <= t). ``selection="literal"`` takes Algorithm 1's
insertion rule without eviction (see ``seqmix.ops.eidetic``).

Decoding and carried state (the Cache entry of a layer; ``pos`` is the next position):

    S, conv        the Mamba block's SSM state [B, d_inner, N, 1] and conv state [B, d_inner, d_conv-1]
    k, v           ring buffer of the last min(t, w-1) raw keys/values [B, R, H, K|V]
    eps            their innovation scores [B, R] (update "chunk", m_e > 0: the current chunk's
                   candidates are in the ring)
    y              the last P SSM outputs [B, P, d] (the predictor's span k and the fading tokens)
    fade_k, fade_v the current chunk's fading tokens [B, m_f, H, K|V] (update "chunk")
    eid_k, eid_v   the eidetic memory [B, m_e, H, K|V], with eid_eps [B, m_e] (floats) and
                   eid_pos, eid_valid (int and bool, not counted as floats)

A call continues exactly where the previous one ended (chunks are aligned at absolute
positions): one T == 1 step runs the same computation as a whole sequence (the parallel
attention over the ring and the memory; at a chunk boundary the new memory is
top-m_e(memory ∪ the chunk's candidates), with update "token" the streaming heap push).

Choices where the paper is silent (bmojo note §11; docs/bmojo.md lists all):

* fading token = the SSM's (Mamba block's) output, projected by the same W_k, W_v;
  ``update="chunk"`` takes the m_f outputs before the chunk (App. B.2), ``"token"`` the m_f
  outputs just older than the window (Algorithm 1's y_{t-w});
* innovation: ε_t = (1/d)‖y_t - ŷ_t‖² with ŷ_t a uniform average of y_{t-1..t-k}, k = 4, no
  gradient; other errors and exponential weights are options;
* eidetic memory: bounded top-m_e over every earlier position (a token may be in the window and
  in memory at once), ties to the earlier token; empty slots are masked;
* w raw tokens including the current one (Algorithm 1's u_{t-w:t} has w + 1; K = w + m needs w);
* output: the attention only (Algorithm 1's out_t = Attn(...)); ``ssm_residual=True`` adds y;
* scale 1/sqrt(n/heads) (the paper's eq. (10) omits it).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..dsf import DSF
from ..ops import linear_recurrence, recurrence_map, recurrence_step, window_softmax
from ..ops.attention import kv_cache_trim
from ..ops.eidetic import eidetic_select, heap_push, innovation, predictor_weights
from ..ops.memory_attention import chunked_memory_attention, n_chunks
from ..ops.precision import upcast
from .attention import AttentionConfig, SeparableAttention, SeparableAttentionConfig, _Attention
from .base import AUTO_SEGMENT_LEN, MixOut, register, register_preset
from .layers import check_rope_fields, rope_rotate
from .linear_attention import LIGER_GLA, GeneralForm, GeneralFormConfig
from .ssm import S6, S6Config

# ------------------------------------------------------------------------------------------
# B'MOJO
# ------------------------------------------------------------------------------------------


class BmojoConfig(AttentionConfig):
    scale: float | Literal["sqrt", "none"] = Field("sqrt", description="multiplies qᵀk: 'sqrt' = 1/sqrt(n/heads), 'none' = 1, or a number > 0")
    window: int = Field(512, ge=1, description="w: raw tokens each token attends to (itself included)")
    m_f: int = Field(1, ge=0, description="fading tokens (SSM outputs) per chunk")
    m_e: int = Field(32, ge=0, description="eidetic tokens (innovation-selected past inputs) per chunk; 0 = B'MOJO-F")
    chunk_size: int | None = Field(
        None, ge=1, description="chunk length c <= window: memory refreshed every c tokens (None: c = window, the paper)"
    )
    update: Literal["chunk", "token"] = Field(
        "chunk", description="'chunk': memory summarizes everything before the chunk (App. B.2); 'token': Algorithm 1, refreshed every token"
    )
    selection: Literal["topk", "literal"] = Field(
        "topk", description="eidetic rule: 'topk' (bounded heap, evicts the least innovative) or 'literal' (Algorithm 1, no eviction, capped at m_e)"
    )
    innovation_span: int = Field(4, ge=1, description="k: the predictor averages y_{t-1..t-k}")
    innovation_weights: Literal["uniform", "exponential"] = Field("uniform", description="predictor weights c_j: uniform or ∝ decay^(j-1)")
    innovation_decay: float = Field(0.5, gt=0, le=1, description="λ of the exponential predictor weights")
    innovation_error: Literal["l2sq", "l2", "relative_l2", "cosine"] = Field("l2sq", description="error(y_t, ŷ_t) of the innovation test")
    ssm_residual: bool = Field(False, description="add the SSM output y to the layer output (Algorithm 1: no)")
    d_state: int = Field(16, gt=0, description="SSM state size N per channel (the Mamba block)")
    expand: int = Field(2, gt=0, description="d_inner = expand·d_model of the Mamba block")
    d_conv: int = Field(4, gt=0, description="short-conv width of the Mamba block")
    dt_rank: int | None = Field(None, gt=0, description="rank of the Mamba block's Δ projection (None: ceil(d_model/16))")
    ssm_mode: Literal["recurrent", "chunk"] = Field("recurrent", description="mode of the Mamba block's scan")
    ssm_chunk_size: int = Field(64, gt=0, description="chunk length of the Mamba block's chunk mode")

    @model_validator(mode="after")
    def _chunk(self):
        if self.chunk_size is not None and self.chunk_size > self.window:
            raise ValueError(
                f"chunk_size = {self.chunk_size} must be <= window = {self.window}: in the interleaved sequence a token late "
                f"in a longer chunk is farther than K = window + m_f + m_e from its chunk's memory tokens"
            )
        if self.update == "token" and self.chunk_size not in (None, 1):
            raise ValueError(f"update = 'token' refreshes the memory at every token; chunk_size must be None or 1, got {self.chunk_size}")
        return self


@register("bmojo", description="B'MOJO: sliding-window attention + fading (Mamba) tokens + innovation-selected eidetic tokens")
class Bmojo(_Attention):
    """B'MOJO (Zancato et al. 2024), §3, Algorithm 1, App. B.2; the module docstring has the equations.

    Modes: "parallel" (the explicit-mask reference: every chunk's memory and every raw key in one
    masked softmax) and "chunk" (the paper's: chunks prefixed by their memory tokens, sliding
    window K = w + m_f + m_e, one batched SDPA); both share the SSM, the innovation test and the
    selection (``eidetic_select``: a doubling scan over chunks). Decoding: module docstring.

    Maps of phi(x): 2·heads, [B, 2·heads, T, T]: maps 0..H-1 act on the raw values v_s = W_v u_s
    (the window and the eidetic tokens: an eidetic slot holding u_τ adds its weight at column τ),
    maps H..2H-1 on the fading values W_v y_s (a fading slot holding y_s adds its weight at
    column s); the attention output is the sum of the two. finite_state = False (softmax).
    State per sequence: SSM + conv, the window's KV and the memory (see ``state_breakdown``).
    """

    family = "hybrid"
    modes = ("parallel", "chunk")
    reference_mode = "parallel"
    state_formula = "d_inner·(d_state + d_conv - 1) + (n + d)·(min(L, w-1) + m_f + m_e) + bookkeeping (state_breakdown)"
    map_unit = "head × stream (raw values, fading values)"
    finite_state = False
    #: its cache is bounded (window, memory slots, SSM) although its DSF is not finite, so a long forward
    #: runs in segments like a finite-state mixer's (whole-sequence fwd+bwd per token grew 1.8× from
    #: 512 to 16k, in the selective scan's backward over the whole sequence)
    auto_segment_len = AUTO_SEGMENT_LEN
    Config = BmojoConfig

    def __init__(self, config: BmojoConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.window = c.window
        self.chunk = 1 if c.update == "token" else (c.chunk_size or c.window)
        self.m_f, self.m_e = c.m_f, c.m_e
        self.ssm = None
        if self.m_f or self.m_e or c.ssm_residual:
            self.ssm = S6(
                S6Config(
                    d_model=c.d_model, d_state=c.d_state, expand=c.expand, block=True, d_conv=c.d_conv,
                    dt_rank=c.dt_rank, chunk_size=c.ssm_chunk_size,
                )
            )
        if self.m_e:
            self.register_buffer("predictor", predictor_weights(c.innovation_span, c.innovation_weights, c.innovation_decay, torch.float32), persistent=False)
        span = c.innovation_span if self.m_e else 0
        fading = (self.window - 1 + self.m_f if c.update == "token" else self.m_f) if self.m_f else 0
        #: P: SSM outputs kept for the predictor and the fading tokens
        self.y_keep = max(span, fading)

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "window": 4, "m_f": 2, "m_e": 3, "d_state": 4, "innovation_span": 2}

    # -- parametrization -------------------------------------------------------------------

    def _kv(self, x):
        """Keys and values of memory tokens with the raw tokens' projections: [..., H, K], [..., H, V]."""
        Wk = self.W_qk.weight[self.n :]
        bk = self.W_qk.bias[self.n :] if self.W_qk.bias is not None else None
        k = F.linear(x, Wk, bk)
        return k.unflatten(-1, (self.heads, self.head_qk)), self.W_v(x).unflatten(-1, (self.heads, self.head_v))

    # -- forward ---------------------------------------------------------------------------

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        Bt, T, d = x.shape
        w, ch, m_f, m_e = self.window, self.chunk, self.m_f, self.m_e
        H, K, V = self.heads, self.head_qk, self.head_v
        pos0 = state["pos"] if state else 0
        step = mode == "step"
        attn_mode = "parallel" if step else ("chunk" if mode == "auto" else mode)
        token = c.update == "token"
        dt, dev = x.dtype, x.device

        # 1. the SSM over the raw sequence (fading memory) and the innovation scores
        y = ssm_state = eps = None
        P = self.y_keep
        if self.ssm is not None:
            ssm_in = {"S": state["S"], "conv": state["conv"]} if state else None
            out = self.ssm._forward(x, state=ssm_in, mode="step" if step else c.ssm_mode, need_state=need_state)
            y, ssm_state = out.y, out.state
        y_prev = state["y"] if state and P else x.new_zeros(Bt, P, d)  # positions pos0 - P .. pos0 - 1
        y_ext = torch.cat([y_prev, y], 1) if y is not None else None
        if m_e:
            k_span = self.predictor.shape[0]
            eps, _ = innovation(y, self.predictor, error=c.innovation_error, state=y_prev[:, P - k_span :].transpose(1, 2))

        # 2. raw tokens, with the cached window
        q, k, v = self._qkv(x)
        k_all, v_all = (torch.cat([state["k"], k], 1), torch.cat([state["v"], v], 1)) if state else (k, v)
        R = k_all.shape[1] - T
        eps_all = torch.cat([state["eps"], eps], 1) if (state and m_e and not token) else eps

        # 3. memory blocks: chunk g = pos0//ch + g (update "token": g = the token pos0 + g)
        c0 = pos0 // ch
        G = n_chunks(pos0, T, ch)
        ar = torch.arange(G, device=dev)
        starts = (c0 + ar) * ch if not token else pos0 + ar - w + 1  # the fading tokens end just before
        fade_k = x.new_zeros(Bt, G, m_f, H, K)
        fade_v = x.new_zeros(Bt, G, m_f, H, V)
        fade_ok = torch.zeros(Bt, G, m_f, dtype=torch.bool, device=dev)
        fade_pos = starts.unsqueeze(1) - m_f + torch.arange(m_f, device=dev)  # [G, m_f] absolute positions
        if m_f:
            idx = (fade_pos - (pos0 - P)).clamp(min=0)
            fade_k, fade_v = self._kv(y_ext[:, idx.flatten()].view(Bt, G, m_f, d))
            fade_ok = (fade_pos >= 0).expand(Bt, G, m_f).clone()
            if state and not token:  # the current chunk began before this call: its fading tokens are cached
                fade_k, fade_v = fade_k.clone(), fade_v.clone()
                fade_k[:, 0], fade_v[:, 0] = state["fade_k"], state["fade_v"]
        eid = self._eidetic(state, k_all, v_all, eps_all, R, pos0, T, G, step, dt, dev) if m_e else None
        if eid is not None:
            eid_k, eid_v, eid_ok = eid["k"], eid["v"], eid["ok"]
        else:
            eid_k, eid_v = x.new_zeros(Bt, G, 0, H, K), x.new_zeros(Bt, G, 0, H, V)
            eid_ok = torch.zeros(Bt, G, 0, dtype=torch.bool, device=dev)
        mem_k, mem_v = torch.cat([fade_k, eid_k], 2), torch.cat([fade_v, eid_v], 2)
        mem_ok = torch.cat([fade_ok, eid_ok], 2)

        # 4. the attention (one call into the op) and the readout
        want_core = attn_mode == "parallel" and state is None
        res = chunked_memory_attention(
            q, k_all, v_all, mem_k, mem_v, window=w, chunk=ch, start=pos0, mem_valid=mem_ok,
            scale=1.0, mode=attn_mode, return_probs=want_core, check_values=False,
        )
        o, probs = res if want_core else (res, None)
        out = self._readout(o)
        if c.ssm_residual:
            out = out + y

        values = mixed = None
        extras = {}
        if want_core:  # the two streams of phi: raw values (window + eidetic) and fading values
            m = m_f + m_e
            p_mem = probs[..., : G * m].unflatten(-1, (G, m))
            o_fade = torch.einsum("bhtgi,bgihv->bthv", p_mem[..., :m_f], fade_v.to(probs.dtype)).to(o.dtype)
            values = torch.cat([v, self._kv(y)[1] if m_f else torch.zeros_like(v)], 2)
            mixed = torch.cat([o - o_fade, o_fade], 2)
            extras = {"probs": probs, "fade_pos": fade_pos, "eid_pos": eid["pos"] if eid is not None else None, "G": G}

        new_state = None
        if need_state:
            new_state = self._next_state(state, ssm_state, k_all, v_all, eps_all, y_ext, fade_k, fade_v, eid, pos0, T, G)
        return MixOut(out, new_state, values=values, mixed=mixed, extras=extras)

    def _eidetic(self, state, k_all, v_all, eps_all, R, pos0, T, G, step, dt, dev):
        """The eidetic memory of every group (and the one to carry): the selection over the
        candidates since the first group began, started from the cached memory."""
        c = self.config
        Bt, H, K, V, m_e, ch = k_all.shape[0], self.heads, self.head_qk, self.head_v, self.m_e, self.chunk
        token = c.update == "token"
        if state:
            init = {n: state[f"eid_{n}"] for n in ("k", "v", "eps", "pos", "valid")}
        else:
            init = {
                "k": k_all.new_zeros(Bt, m_e, H, K), "v": v_all.new_zeros(Bt, m_e, H, V), "eps": k_all.new_zeros(Bt, m_e),
                "pos": torch.zeros(Bt, m_e, dtype=torch.long, device=dev), "valid": torch.zeros(Bt, m_e, dtype=torch.bool, device=dev),
            }
        if token and step:  # Algorithm 1 at one token: the streaming heap
            slot, ins = heap_push(init["eps"], init["pos"], init["valid"], eps_all[:, -1], torch.full((Bt,), pos0, device=dev), rule=c.selection)
            hot = F.one_hot(slot, m_e).bool() & ins.unsqueeze(-1)  # [B, m_e]
            new = {
                "k": torch.where(hot[..., None, None], k_all[:, -1:], init["k"]),
                "v": torch.where(hot[..., None, None], v_all[:, -1:], init["v"]),
                "eps": torch.where(hot, eps_all[:, -1:], init["eps"]),
                "pos": torch.where(hot, pos0, init["pos"]),
                "valid": init["valid"] | hot,
            }
            return {**{n: t.unsqueeze(1) for n, t in (("k", new["k"]), ("v", new["v"]))}, "ok": new["valid"].unsqueeze(1),
                    "pos": new["pos"].unsqueeze(1), "carry": new}
        rolled = not token and (pos0 + T) % ch == 0
        if G == 1 and not token and not rolled:  # inside one chunk: its memory is the cached one
            ok = init["valid"].unsqueeze(1)
            return {"k": init["k"].unsqueeze(1), "v": init["v"].unsqueeze(1), "ok": ok, "pos": init["pos"].unsqueeze(1), "carry": init}
        # candidates: from the first group's start (update "chunk": the ring's part of the chunk)
        n_pre = 0 if token else pos0 - (pos0 // ch) * ch
        first = pos0 - n_pre
        size = 1 if token else ch
        n_pad = G * size
        cand_k, cand_v, cand_eps = k_all[:, R - n_pre :], v_all[:, R - n_pre :], eps_all[:, eps_all.shape[1] - n_pre - T :]
        n = n_pre + T
        pad = n_pad - n
        cand_k, cand_v = F.pad(cand_k, (0, 0, 0, 0, 0, pad)), F.pad(cand_v, (0, 0, 0, 0, 0, pad))
        cand_eps = F.pad(cand_eps, (0, pad))
        cand_ok = (torch.arange(n_pad, device=dev) < n).expand(Bt, n_pad)
        cand_pos = (first + torch.arange(n_pad, device=dev)).expand(Bt, n_pad)
        ids, vis = eidetic_select(
            cand_eps, cand_ok, m_e, group_size=size, init_eps=init["eps"], init_pos=init["pos"], init_valid=init["valid"], rule=c.selection
        )  # [B, G+1, m_e]
        pool_k, pool_v = torch.cat([init["k"], cand_k], 1), torch.cat([init["v"], cand_v], 1)
        pool_eps, pool_pos = torch.cat([init["eps"], cand_eps], 1), torch.cat([init["pos"], cand_pos], 1)

        def gather(pool, sel):  # pool [B, m_e + n_pad, ...], sel [B, g, m_e] -> [B, g, m_e, ...]
            flat = sel.flatten(1)
            idx = flat.view(*flat.shape, *([1] * (pool.dim() - 2))).expand(-1, -1, *pool.shape[2:])
            return pool.gather(1, idx).view(*sel.shape, *pool.shape[2:])

        use = ids[:, 1:] if token else ids[:, :G]  # token t reads M_t (after its own push); chunk g reads P_g
        use_ok = vis[:, 1:] if token else vis[:, :G]
        res = {"k": gather(pool_k, use), "v": gather(pool_v, use), "ok": use_ok, "pos": gather(pool_pos, use)}
        last = ids.shape[1] - 1 if (token or rolled) else G - 1  # the memory to carry
        sel = ids[:, last : last + 1]
        res["carry"] = {
            "k": gather(pool_k, sel)[:, 0], "v": gather(pool_v, sel)[:, 0], "eps": gather(pool_eps, sel)[:, 0],
            "pos": gather(pool_pos, sel)[:, 0], "valid": vis[:, last],
        }
        return res

    def _next_state(self, state, ssm_state, k_all, v_all, eps_all, y_ext, fade_k, fade_v, eid, pos0, T, G):
        c = self.config
        w, ch, m_f, m_e, P = self.window, self.chunk, self.m_f, self.m_e, self.y_keep
        pos1 = pos0 + T
        k_c, v_c = kv_cache_trim(k_all, v_all, w)
        st = {"pos": pos1, "k": k_c, "v": v_c}
        if ssm_state is not None:
            st["S"], st["conv"] = ssm_state["S"], ssm_state["conv"]
        if P:
            st["y"] = y_ext[:, y_ext.shape[1] - P :]
        if m_e and c.update == "chunk":
            st["eps"] = eps_all[:, eps_all.shape[1] - k_c.shape[1] :]
        if m_f and c.update == "chunk":
            if pos1 % ch == 0:  # the next token starts a chunk: its fading tokens are y_{pos1-m_f..pos1-1}
                Pn = y_ext.shape[1]
                st["fade_k"], st["fade_v"] = self._kv(y_ext[:, Pn - m_f :])
            else:
                st["fade_k"], st["fade_v"] = fade_k[:, G - 1], fade_v[:, G - 1]
        if m_e:
            carry = eid["carry"]
            for name in ("k", "v", "eps", "pos", "valid"):
                st[f"eid_{name}"] = carry[name]
        return st

    # -- DSF view --------------------------------------------------------------------------

    def phi(self, x):
        """[B, 2·heads, T, T]: the attention weights each token gives to the raw values (maps
        0..H-1: window and eidetic slots, an eidetic slot counted at its source position) and to
        the fading values W_v y_s (maps H..2H-1, at the fading token's source position s)."""
        self.check_input(x)
        out = self._forward(x, state=None, mode="parallel", need_state=False)
        probs, G = out.extras["probs"], out.extras["G"]
        Bt, H, T, _ = probs.shape
        m_f, m_e = self.m_f, self.m_e
        m = m_f + m_e
        raw = probs[..., G * m :].clone()
        p_mem = probs[..., : G * m].unflatten(-1, (G, m))
        fade = torch.zeros_like(raw)
        if m_f:
            src = out.extras["fade_pos"].clamp(min=0)  # [G, m_f]; empty slots have weight 0
            fade.scatter_add_(-1, src.flatten().expand(Bt, H, T, G * m_f), p_mem[..., :m_f].flatten(-2))
        if m_e:
            src = out.extras["eid_pos"].flatten(1)  # [B, G·m_e]
            raw.scatter_add_(-1, src[:, None, None, :].expand(Bt, H, T, -1), p_mem[..., m_f:].flatten(-2))
        return torch.cat([raw, fade], 1)

    # -- memory ----------------------------------------------------------------------------

    def state_breakdown(self, seq_len: int | None = None) -> dict:
        """Floats per sequence held in the Cache after ``seq_len`` tokens, by part (None: the bound).

        ssm: the Mamba block's state and conv state; window_kv: the ring of min(L, w-1) raw
        keys/values; fading_kv, eidetic_kv: the memory tokens' keys/values; bookkeeping: the
        innovation scores (ring and memory) and the SSM outputs kept for the predictor and the
        fading tokens. ``memory_axis`` is the paper's x-axis of Fig. 2 (bmojo note §7.2): SSM
        state + keys/values of w + m_f + m_e tokens (the current token's included)."""
        c = self.config
        kv = self.n + self.d_model
        R = self.window - 1 if seq_len is None else min(seq_len, self.window - 1)
        chunk_update = c.update == "chunk"
        parts = {
            "ssm": self.ssm.state_size() if self.ssm is not None else 0,
            "window_kv": kv * R,
            "fading_kv": kv * self.m_f if chunk_update else 0,
            "eidetic_kv": kv * self.m_e,
            "bookkeeping": self.m_e + (R if (self.m_e and chunk_update) else 0) + self.y_keep * self.d_model,
        }
        parts["total"] = sum(parts.values())
        ssm_core = self.ssm.d_inner * c.d_state if self.ssm is not None else 0
        parts["memory_axis"] = ssm_core + kv * (self.window + self.m_f + self.m_e)
        return parts

    def state_size(self, seq_len: int | None = None) -> int:
        return self.state_breakdown(seq_len)["total"]


register_preset(
    "bmojo_f", Bmojo,
    description="B'MOJO-F: sliding-window attention whose keys/values are extended by m_f fading (Mamba) tokens",
    defaults={"m_e": 0},
    example={"m_e": 0},
)


# ------------------------------------------------------------------------------------------
# App. E: Strip Mamba and Bilinear Mamba
# ------------------------------------------------------------------------------------------


class StripMambaConfig(S6Config):
    dt_bias: bool = Field(False, description="a bias inside Δ's softplus (the implementation has one; eq. 25 does not)")
    output_projection: bool = Field(False, description="an output projection d_in -> d_model (eq. 25 maps d_in -> d_in without one)")

    @model_validator(mode="after")
    def _bare(self):
        if self.block:
            raise ValueError("block = True does not fit strip_mamba: eq. (25) is the bare SSM (no in_proj, conv or gate); use 'mamba'")
        return self


@register("strip_mamba", description="Strip Mamba (B'MOJO App. E, eq. 25): Mamba's SSM as an explicit input-dependent recurrence")
class StripMamba(S6):
    """Mamba's SSM "stripped" of the continuous-time narrative (B'MOJO paper App. E, eq. 25):

        Δ(u_t) = softplus(P_Δup P_Δdown u_t) ∈ R^{d_in},  B(u_t) = P_B u_t ∈ R^N,  C(u_t) = P_C u_t ∈ R^N
        x_t = exp(Diag(Δ(u_t)) A) ⊙ x_{t-1} + Diag(Δ(u_t)) u_t u_tᵀ P_Bᵀ           x_t ∈ R^{d_in × N}
        y_t = x_t P_Cᵀ u_t + D ⊙ u_t                                                (bilinear in x_t and u_t)

    with A = -exp(A_log) ∈ R^{d_in × N}. This is S6 on the raw input (P_Δdown, P_B, P_C are the
    three parts of x_proj, P_Δup is dt_proj), run by the same ops, minus what eq. (25) leaves
    out: no dt bias and no output projection by default (both options). Errata applied (bmojo
    note §11.20): B(u_t), C(u_t) ∈ R^N (printed R^{d_in}), the skip is D ⊙ u_t (printed + D).
    Time convention: x_t includes u_t (the implementation's; eq. (25)'s x_{t+1}/x_t indices are
    loose, App. C.2 notes Mamba is not strictly causal; ``seqmix.analysis.strictly_causal``
    converts). Maps and DSF: those of S6, [B, d_in, T, T].
    """

    family = "hybrid"  # (the brief's grouping: B'MOJO and its App. E variants)
    Config = StripMambaConfig

    def __init__(self, config: StripMambaConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        if not self.config.dt_bias:
            del self.dt_bias
            self.register_buffer("dt_bias", torch.zeros(self.d_inner))
        if not self.config.output_projection:
            self.out_proj = nn.Identity()

    def strip_parameters(self) -> dict:
        """The parameters in eq. (25)'s names: P_Δdown [R, d_in], P_Δup [d_in, R], P_B, P_C [N, d_in], A [d_in, N], D [d_in]."""
        R, N = self.dt_rank, self.config.d_state
        W = self.x_proj.weight
        return {"P_dt_down": W[:R], "P_dt_up": self.dt_proj.weight, "P_B": W[R : R + N], "P_C": W[R + N :], "A": self.A, "D": self.D}


class BilinearMambaConfig(S6Config):
    min_decay: float = Field(1e-4, gt=0, lt=1, description="floor of the first-order transition 1 + ΔA (stable only while ΔA > -1)")


@register("bilinear_mamba", description="Bilinear Mamba (B'MOJO App. E.1): S6 with the first-order transition 1 + ΔA")
class BilinearMamba(S6):
    """Bilinear Mamba (B'MOJO paper App. E.1): Mamba's transition exp(Diag(Δ_t) A) replaced by its
    first-order Taylor expansion, which makes the system bilinear in the state and a feature map
    of u_t (eq. 26):

        x_t = (1 + Diag(Δ_t) A) ⊙ x_{t-1} + Diag(Δ_t) u_t u_tᵀ P_Bᵀ
            = x_{t-1} + Diag([P_Δ u_t]_+) (A ⊙ x_{t-1} + u_t u_tᵀ P_Bᵀ),     [·]_+ = softplus
        y_t = x_t P_Cᵀ u_t + D ⊙ u_t

    The paper's further rewriting in the coordinates P_Δ^† u_t is not rigorous (a pseudo-inverse;
    bmojo note §11.20) and is not used. 1 + ΔA is a decay in (0, 1] only while ΔA > -1: it is
    clamped to [min_decay, 1] (documented choice). Everything else is S6's (Δ with its bias,
    out_proj; ``block=True`` gives the Mamba block). Modes "recurrent" and "chunk" both run
    ``linear_recurrence`` (q = C, k = ΔB, v = x, log-decay log(1 + ΔA)), and "auto" its auto mode
    (its "scan" at these small states); maps and DSF as S6's.
    """

    family = "hybrid"
    Config = BilinearMambaConfig

    def _recurrence(self, x, delta, b, c):
        q, k, v, gk = super()._recurrence(x, delta, b, c)
        decay = (1 + gk).clamp(min=self.config.min_decay, max=1.0)  # gk = Δ·A: 1 + ΔA, the first-order exp(ΔA)
        return q, k, v, decay.log()

    def _forward(self, u, *, state, mode, need_state):
        x, z, delta, b, c, conv = self._inputs(u, state.get("conv") if state else None, need_state)
        q, k, v, gk = self._recurrence(x, delta, b, c)
        o, S = linear_recurrence(
            q, k, v, gk, initial_state=state["S"] if state else None, output_final_state=need_state,
            mode=mode, chunk_size=self.config.chunk_size, check_values=False,
        )
        y_core = o[..., 0] + self.D * x
        y = y_core * F.silu(z) if z is not None else y_core
        new_state = None
        if need_state:
            new_state = {"S": S, "conv": conv} if self.config.block else {"S": S}
        return MixOut(self.out_proj(y), new_state, values=x.unsqueeze(-1), mixed=y_core.unsqueeze(-1))


# ------------------------------------------------------------------------------------------
# window + linear hybrids: LoLCATs attention, Liger attention
# ------------------------------------------------------------------------------------------
#
# Both put softmax over each token's last w tokens beside a linear recurrence in one layer; they differ in
# how the two parts meet (LoLCATs: one normalization over both, the linear part over the tokens before the
# window; Liger: a weighted sum of the two normalized outputs, the linear part over every token). The window
# is one op (seqmix.ops.window_softmax: the window's numerator, denominator and stabilizer), its cache one
# ring of tokens (_window_keys), its DSF one realization (window_dsf).


def _window_mode(mode: str) -> str:
    """The window op's mode under a mixer mode: the explicit matrix for the references, the blocks otherwise
    (a decoding step: the op's fused step)."""
    return "parallel" if mode in ("recurrent", "parallel") else "chunk"


def _window_keys(state: dict | None, k: torch.Tensor, v: torch.Tensor, R: int, pos0: int):
    """The key sequence a window over x's tokens reads: the R tokens before them from the cache (zeros before
    position 0, marked invalid), then x's own. k [B, T, H, K], v [B, T, H, V] -> (k_ext [B, R + T, H, K],
    v_ext [B, R + T, H, V], valid [R + T] bool, or None where every slot holds a token: pos0 >= R). The cache's
    ring is k_ext[:, T:], v_ext[:, T:]."""
    if state is not None and R:
        k_prev, v_prev = state["k"].to(k.dtype), state["v"].to(v.dtype)
    else:
        k_prev, v_prev = k.new_zeros(k.shape[0], R, *k.shape[2:]), v.new_zeros(v.shape[0], R, *v.shape[2:])
    return torch.cat([k_prev, k], 1), torch.cat([v_prev, v], 1), _slots_valid(R, k.shape[1], pos0, k.device)


def _slots_valid(R: int, T: int, pos0: int, device) -> torch.Tensor | None:
    """Which of R cached slots and T new tokens hold a token ([R + T] bool: slot i is position pos0 − R + i, valid
    where >= 0), or None where every one does (pos0 >= R)."""
    return None if pos0 >= R else torch.arange(R + T, device=device) >= R - pos0


def _window_lam(window: int, log_decay: torch.Tensor | None, shape: tuple, value_dim: int, device=None) -> torch.Tensor:
    """The diagonal of Λ_t of :func:`window_dsf`, [B, T, H·V·(w + F)]: 0 on the window's shift register, the
    linear part's decay exp(log α) (or 1) on its F states, per head h and value channel (layout there)."""
    B, T, H, F = shape
    f64 = dict(dtype=torch.float64, device=device)
    lin = torch.ones(B, T, H, F, **f64) if log_decay is None else log_decay.detach().double().exp().expand(B, T, H, F)
    diag = torch.cat([torch.zeros(B, T, H, window, **f64), lin], -1)  # [B, T, H, w + F]
    return diag.unsqueeze(3).expand(B, T, H, value_dim, window + F).reshape(B, T, -1)


def window_dsf(band: torch.Tensor, cq: torch.Tensor, ck: torch.Tensor, log_decay: torch.Tensor | None = None, *,
               value_dim: int, delayed: bool) -> DSF:
    """The exact finite-state DSF of a window + linear map (input: the values u, output: the mixed values).

    Per head h and value channel the state is [r; S]: a shift register r of the last w inputs (r_t[s] = u_{t−s})
    and the linear part's F states S. band [B, H, T, w]: the weight of u_{t−s} in row t (s = 0 .. w − 1, zero
    where t − s < 0); cq [B, T, H, F]: the linear part's readout of S_t; ck [B, T, H, F]: its write key;
    log_decay [B, T, H, F] (or [B, T, H]) or None: its decay. ``delayed`` (LoLCATs: the linear part covers the
    tokens before the window): S_t = S_{t−1} + ck_t r_{t−1}[w − 1] with r_{t−1}[w − 1] = u_{t−w} (ck_t the key of
    that token); else (Liger) S_t = diag(α_t) S_{t−1} + ck_t u_t. So

        Λ_t = [[Shift, 0], [ck_t e_{w−1}ᵀ (delayed), diag(α_t)]],   B_t = [e_0; ck_t (not delayed)],   C_t = [band_t; cq_t]

    block lower triangular: its eigenvalues are its diagonal (0 on the register, α_t on S). Layout: state index
    ((h·V + v)·(w + F) + i) (each value channel owns a block, as :meth:`DSF.from_recurrence`); Λ_t dense
    [N, N] with N = H·V·(w + F), a float64 theory object (O(T·N²) memory)."""
    B, H, T, w = band.shape
    F = cq.shape[-1]
    V = value_dim
    if delayed and not w:
        raise ValueError("window_dsf: argument 'delayed' needs a window (w >= 1): the delayed token is the one leaving it")
    P = w + F
    f64 = dict(dtype=torch.float64, device=band.device)
    M = torch.zeros(B, T, H, P, P, **f64)
    idx = torch.arange(1, w, device=band.device)
    M[..., idx, idx - 1] = 1.0  # the register shifts by one slot
    if delayed:
        M[..., w:, w - 1] = ck.detach().double()  # the token leaving the window enters S
    Bv = torch.zeros(B, T, H, P, **f64)
    if w:
        Bv[..., 0] = 1.0
    if not delayed:
        Bv[..., w:] = ck.detach().double()
    Cv = torch.cat([band.detach().double().transpose(1, 2), cq.detach().double()], -1)  # [B, T, H, P]
    lam = _window_lam(w, log_decay, (B, T, H, F), V, band.device)
    eye_h, eye_v = torch.eye(H, **f64), torch.eye(V, **f64)
    N = H * V * P
    U = torch.einsum("bthij,hg,uv->bthuigvj", M, eye_h, eye_v).reshape(B, T, N, N)  # off the diagonal (M's diagonal is 0)
    Bm = torch.einsum("bthi,hg,uv->bthuigv", Bv, eye_h, eye_v).reshape(B, T, N, H * V)
    Cm = torch.einsum("bthi,hg,uv->btgvhui", Cv, eye_h, eye_v).reshape(B, T, H * V, N)
    return DSF(lam, Bm, Cm, U=U, W=torch.eye(N, **f64).expand(B, T, N, N))


def _bands(phi: torch.Tensor, window: int) -> torch.Tensor:
    """[B, M, T, T] -> [B, M, T, w]: entry (t, s) = phi[t, t − s] for s < w (0 where t − s < 0)."""
    T = phi.shape[-1]
    cols = [torch.nn.functional.pad(phi.diagonal(offset=-s, dim1=-2, dim2=-1), (min(s, T), 0))[..., :T] for s in range(window)]
    return torch.stack(cols, -1) if cols else phi.new_zeros(*phi.shape[:-1], 0)


class LolcatsConfig(SeparableAttentionConfig):
    window: int = Field(64, ge=0, description="w: softmax over each token's last w tokens (itself included), the linear map over the "
                        "tokens before them, one normalization (LoLCATs eq. 7; the paper: 64); 0: no softmax part (linear attention)")
    window_factor: float = Field(0.1, gt=0, lt=1, description="γ at init: the weight of the window's softmax terms, γ_h = σ(ρ_h) per "
                                 "head, learnt (LoLCATs' init_window_factor: logit 0.1)")
    affine_window_factor: bool = Field(False, description="weight the linear terms by 1 − γ_h instead of 1 (LoLCATs' "
                                       "affine_attention_factors; off in the paper's configs)")

    @model_validator(mode="after")
    def _joint(self):
        if self.normalizer != "row_sum":
            raise ValueError(f"normalizer must be 'row_sum': the window's softmax terms and the linear terms share one normalization "
                             f"(LoLCATs eq. 7), got {self.normalizer!r}")
        return self


@register(
    "lolcats",
    description="LoLCATs attention (Zhang et al. 2025, eq. 7): sliding-window softmax + Hedgehog linear attention before the window, "
    "one normalization, learnt window factor γ per head",
    defaults={"feature_map": "hedgehog", "normalizer": "row_sum", "scale": "sqrt"},
)
class LolcatsAttention(SeparableAttention):
    """LoLCATs attention (Zhang et al. 2025, "LoLCATs: On Low-Rank Linearizing of Large Language Models", §3.3.1 eq. 7;
    HazyResearch/lolcats, linear_window_attention_sw.py): per head, with s_ti = q_tᵀk_i (q scaled: scale 'sqrt' is
    eq. 7's 1/√d),

        y_t = [Σ_{i=t−w+1..t} γ exp(s_ti − c_t) v_i + λ φ(q_t)ᵀ Σ_{j<=t−w} ψ(k_j) v_jᵀ]
              / [Σ_{i=t−w+1..t} γ exp(s_ti − c_t) + λ φ(q_t)ᵀ Σ_{j<=t−w} ψ(k_j)],      c_t = max_i s_ti

    γ_h = σ(ρ_h) a learnt factor per head (init ``window_factor``), λ = 1 (or 1 − γ_h: ``affine_window_factor``); φ, ψ,
    RoPE and the rest are separable attention's (Hedgehog by default). Special cases: w >= T is softmax attention
    (whatever γ: the linear sum is empty); w = 0 is linear attention with the row-sum normalizer.

    Modes: "recurrent" (the reference: the linear part token by token, the window as its explicit matrix), "chunk"
    (the linear part chunked, the window in blocks), "parallel" (both explicit). The linear part runs on the
    token that leaves the window at each step (ψ(k_{t−w}), v_{t−w}), so its state holds exactly j <= t − w.
    Decoding: O(w + state) per token (softmax over the w cached tokens, one feature map for the token leaving).

    Maps of phi(x): one per head, [B, heads, T, T], the normalized map above (band of width w plus the linear
    map below it). DSF (:func:`window_dsf`, exact): per value channel a w-slot shift register feeding the
    linear state; Λ_t block lower triangular, eigenvalues 0 (register) and 1. State per sequence: the window's
    keys and values (w tokens, before position 0 zeros) and the linear state (n_φ × (V + 1) per head).
    """

    family = "hybrid"
    modes = ("recurrent", "chunk", "parallel")
    reference_mode = "recurrent"
    state_formula = "heads·(w·(K + V) + n_φ·(V + 1)): the window's keys and values and the linear state"
    diagonal_transition = False
    Config = LolcatsConfig

    def __init__(self, config: LolcatsConfig | None = None, **kwargs):
        super().__init__(config, **kwargs)
        c = self.config
        self.window = c.window
        self.window_logit = nn.Parameter(torch.full((self.heads,), math.log(c.window_factor / (1 - c.window_factor))))

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "n": 8, "heads": 2, "chunk_size": 8, "window": 5}

    def window_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(γ [H], λ [H]): the weights of the softmax terms and of the linear terms."""
        gamma = torch.sigmoid(upcast(self.window_logit))
        return gamma, (1 - gamma if self.config.affine_window_factor else torch.ones_like(gamma))

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        T, V, w = x.shape[1], self.head_v, self.window
        pos0 = state["pos"] if state else 0
        if mode == "step" and T == 1 and w and state and state["k"].shape[1] == w:  # (else the general path, which checks it)
            return self._step(x, state, pos0)
        q, k, v = self._rotated(x, pos0)
        fq = self._query_features(q)
        if w:  # the token leaving the window at step t sits w positions back: the first T of the window's key sequence
            k_ext, v_ext, valid = _window_keys(state, k, v, w, pos0)
            fk_out = self._key_features(k_ext[:, :T])
            if valid is not None:
                fk_out = fk_out * valid[:T, None, None].to(fq.dtype)
            v_out = v_ext[:, :T]
        else:
            fk_out, v_out = self._key_features(k), v
        o_lin, S = linear_recurrence(
            fq, fk_out, torch.cat([v_out, torch.ones_like(v_out[..., :1])], -1),  # the last column: Σ ψ(k_j)
            initial_state=state["S"] if state else None, output_final_state=need_state, mode=mode,
            chunk_size=c.chunk_size, check_values=False,
        )
        o_lin = upcast(o_lin)
        num, den = o_lin[..., :V], o_lin[..., V]
        if w:
            gamma, lam = self.window_factors()
            s_num, s_den, _ = window_softmax(q, k_ext, v_ext, window=w, key_valid=valid, mode=_window_mode(mode),
                                             chunk_size=c.chunk_size, check_values=False)
            num = gamma.view(-1, 1) * s_num + lam.view(-1, 1) * num
            den = gamma * s_den + lam * den
        o = (num / den.unsqueeze(-1)).to(v.dtype)
        new = None
        if need_state:
            new = {"S": S, "pos": pos0 + T}
            if w:
                new["k"], new["v"] = k_ext[:, T:].clone(), v_ext[:, T:].clone()
        return MixOut(self._readout(o), new, values=v, mixed=o)

    def _step(self, x, state, pos0):
        """One decoding token after a prefill: the same numbers as the general path (the contract's step tests tie
        them) in fewer ops — the token leaving the window, ψ(k_{t−w}) ⊗ [v_{t−w}, 1], added to the linear state and
        read by the general form's fused step (:func:`~seqmix.ops.recurrence_step`: in place inside
        :func:`~seqmix.ops.states_in_place`), φ(q_t) and ψ(k_{t−w}) as one batched map, the window's softmax by the
        op's fused step (:func:`~seqmix.ops.window_softmax_step`) over the window's valid keys, the window's new keys
        and values made by one concatenation each, and eq. 7's two sums joined with the factors divided by λ
        (y = (r·num_w + num_l) / (r·den_w + den_l), r = γ/λ a layer constant: λ > 0). While the window is not full
        (pos0 < w: a prompt shorter than the window) the token leaving it lies before position 0: nothing is written
        to the linear state (ψ = 0, as the general path's mask) and the softmax masks the slots before position 0
        (the op's ``key_valid``, as the general path's)."""
        V, w = self.head_v, self.window
        q, k, v = self._rotated(x, pos0)
        k_old, v_old = state["k"], state["v"]
        if k_old.dtype != k.dtype or v_old.dtype != v.dtype:
            k_old, v_old = k_old.to(k.dtype), v_old.to(v.dtype)
        if pos0 >= w:
            fq, fk = self._qk_features(q, k_old[:, :1])  # [B, 1, H, n_φ]
        else:  # the leaving slot holds no token: no write (the general path masks its ψ to 0)
            fq = self._query_features(q)
            fk = torch.zeros_like(fq)
        # S ← S + ψ(k_{t−w}) [v_{t−w}, 1]ᵀ, o = φ(q_t) S: the op's fused step (float32 or wider, autocast off; in place
        # inside states_in_place), its read in the features' dtype as linear_recurrence returns it
        o_lin, S = recurrence_step(fq[:, 0], fk[:, 0], torch.constant_pad_nd(v_old[:, 0], (0, 1), 1.0), None, None, state["S"],
                                   check_values=False, check_shapes=False)
        o_lin = upcast(o_lin)  # [B, H, V + 1]
        k_win, v_win = torch.cat([k_old[:, 1:], k], 1), torch.cat([v_old[:, 1:], v], 1)
        s_num, s_den, _ = window_softmax(q, k_win, v_win, window=w, key_valid=_slots_valid(w - 1, 1, pos0, q.device),
                                         mode="chunk", check_values=False, check_shapes=False)  # the op's fused step
        r = self.layer_constant("window ratio", self._window_ratio, self.window_logit)  # [H, 1]
        num = torch.addcmul(o_lin[..., :V], s_num[:, 0], r)
        den = torch.addcmul(o_lin[..., V:], s_den.transpose(1, 2), r)
        o = (num / den).unsqueeze(1)
        if o.dtype != v.dtype:
            o = o.to(v.dtype)
        return MixOut(self._readout(o), {"S": S, "pos": pos0 + 1, "k": k_win, "v": v_win}, values=v, mixed=o)

    def _window_ratio(self) -> torch.Tensor:
        """r = γ/λ [H, 1]: the softmax terms' factor when eq. 7's numerator and denominator are divided by λ (> 0)."""
        gamma, lam = self.window_factors()
        return (gamma / lam).unsqueeze(-1)

    # -- DSF view --------------------------------------------------------------------------

    def _maps(self, x):
        """(the map before its normalization [B, H, T, T], φ(q) [B, T, H, n_φ], ψ(k) [B, T, H, n_φ])."""
        q, k, v = self._rotated(x)
        fq, fk = self._query_features(q), self._key_features(k)
        T, w = x.shape[1], self.window
        gamma, lam = self.window_factors()
        t = torch.arange(T, device=x.device)
        below = (t.view(-1, 1) - t.view(1, -1)) >= w  # the linear map's part: j <= t − w
        M = lam.view(-1, 1, 1) * recurrence_map(fq, fk, check_values=False) * below
        if w:
            p = window_softmax(q, k, v, window=w, mode="parallel", return_weights=True, check_values=False)[3]
            M = M + gamma.view(-1, 1, 1) * p
        return M, fq, fk

    def phi(self, x):
        """[B, heads, T, T]: eq. 7's map, γ exp(s_ti − c_t) on the band of width w and λ φ(q_t)ᵀψ(k_j) below it, divided by
        the row sums."""
        self.check_input(x)
        M = self._maps(x)[0]
        return M / M.sum(-1, keepdim=True)

    def dsf(self, x):
        """The exact realization of :func:`window_dsf` (input v, output the mixed values): the band of phi(x) on the
        register, C_t's linear part λ φ(q_t) / Z_t (Z_t the row sum), the write key ψ(k_{t−w}) of the token leaving
        the window."""
        self.check_input(x)
        M, fq, fk = self._maps(x)
        Z = M.sum(-1)  # [B, H, T]
        w = self.window
        _, lam = self.window_factors()
        cq = lam.view(-1, 1) * fq / Z.transpose(1, 2).unsqueeze(-1)
        ck = torch.nn.functional.pad(fk, (0, 0, 0, 0, w, 0))[:, : x.shape[1]] if w else fk
        return window_dsf(_bands(M / Z.unsqueeze(-1), w), cq, ck, value_dim=self.head_v, delayed=w > 0)

    def decays(self, x):
        """The diagonal of Λ_t (= dsf(x).lam): 0 on the window's register, 1 on the linear state."""
        self.check_input(x)
        return _window_lam(self.window, None, (x.shape[0], x.shape[1], self.heads, self.n_features), self.head_v, x.device)

    def state_size(self, seq_len: int | None = None) -> int:
        return self.heads * (self.window * (self.head_qk + self.head_v) + self.n_features * (self.head_v + 1))


class LigerAttentionConfig(GeneralFormConfig):
    window: int = Field(64, ge=1, description="w: the sliding window's softmax over each token's last w tokens (itself included; "
                        "Liger: 64)")
    window_weight: float = Field(0.5, ge=0, description="β: y = α·(gated recurrence) + β·(sliding-window softmax) (Liger: 0.5)")
    linear_weight: float = Field(0.5, ge=0, description="α (see window_weight; Liger: 0.5)")
    rope_theta: float | None = Field(None, gt=1, description="RoPE base of the window's q and k (Llama's rotate-half pairs); None: "
                                     "no rotation (linearize sets the teacher's; the recurrence runs without RoPE)")
    rope_scaling: dict | None = Field(None, description="the window's RoPE frequency scaling (softmax attention's field: 'type' in "
                                      "linear, dynamic, yarn, llama3, longrope; seqmix.ops.rotary); None = rope_theta^(-2j/K)")

    @model_validator(mode="after")
    def _window_fits(self):
        if self.query != "proj" or self.key != "proj" or self.shared_qk:
            raise ValueError(f"the window's softmax reads the projections x W_Q, x W_K of every head: needs query = key = 'proj' and "
                             f"shared_qk = False, got query = {self.query!r}, key = {self.key!r}, shared_qk = {self.shared_qk}")
        extras = [name for name, on in (("normalizer", self.normalizer), ("bonus", self.bonus), ("rotary", self.rotary),
                                        ("skip", self.skip != "none"), ("self_aug", self.self_aug),
                                        ("input_gate", self.input_gate != "none"), ("value = 'lru'", self.complex_values)) if on]
        if extras:
            raise ValueError(f"{extras[0]}: Liger attention's gated recurrence is the plain general form (q_t S_t, a real state); "
                             f"{', '.join(extras)} do not combine with the window")
        check_rope_fields(self.rope_theta is not None, self.rope_scaling, self.head_k, "rope_theta")
        return self


@register(
    "liger_attention",
    description="Liger attention (Lan et al. 2025, §3.3): 0.5·(Liger's key-pooled gated recurrence) + 0.5·(sliding-window softmax, w 64)",
    defaults={**LIGER_GLA, "window": 64},
)
class LigerAttention(GeneralForm):
    """Liger attention (Lan et al. 2025, "Liger: Linearizing Large Language Models to Gated Recurrent Structures",
    §3.3; fla-org's LigerGatedLinearAttention): an intra-layer hybrid of the gated recurrence and sliding-window
    softmax attention on the same projections,

        o_t = α · q̃_t S_t + β · Σ_{i=t−w+1..t} softmax_i(q_tᵀ k_i / √K) v_i,      y_t = W_O o_t

    with S_t = diag(α_t) S_{t−1} + k̃_tᵀ v_t the general form's recurrence (Liger-GLA: q̃ = softmax(x W_Q), k̃ = softmax(x W_K)
    per head, α_t = σ(x W_K)^{1/16}: the ``liger_gla`` preset's parameter functions) and q, k = x W_Q, x W_K rotated by RoPE
    (``rope_theta``) for the window only; α = β = 1/2, w = 64 in the paper. Each part keeps its own normalization (the
    recurrence none, the window its softmax).

    Modes: the general form's; the window runs as its explicit matrix in "recurrent" and "parallel" and in blocks in
    "chunk". Maps of phi(x): one per head, α·(the recurrence's map) + β·(the window's softmax band). DSF
    (:func:`window_dsf`, exact): per value channel a w-slot shift register beside the recurrence's states; Λ_t =
    blockdiag(Shift, diag(α_t)). State per sequence: the recurrence's, plus the last w − 1 tokens' keys and values.
    """

    family = "hybrid"
    state_formula = "H·d_k'·d_v' + (w − 1)·(d_k + d_v) (+ the general form's conv / token-shift states)"
    diagonal_transition = False
    Config = LigerAttentionConfig

    @classmethod
    def example_config(cls) -> dict:
        return {"d_model": 16, "heads": 2, "chunk_size": 8, "window": 5, "rope_theta": 10000.0}

    def _window_qk(self, P, start: int):
        """The window's q (scaled 1/√K), k [B, T, H, K]: the projections before the feature map, rotated by RoPE."""
        q, k = P.q_proj * self.K**-0.5, P.k_proj
        c = self.config
        return (q, k) if c.rope_theta is None else rope_rotate(self, c.rope_theta, start, q, k, scaling=c.rope_scaling)

    def _forward(self, x, *, state, mode, need_state):
        c = self.config
        T, w = x.shape[1], c.window
        pos0 = state["pos"] if state else 0
        P = self._params(x, state, need_state)
        o_lin, S = self._core(P, state.get("S") if state else None, mode, need_state)
        q, k = self._window_qk(P, pos0)
        k_ext, v_ext, valid = _window_keys(state, k, P.v, w - 1, pos0)  # a decoding step: the op's fused step
        num, den, _ = window_softmax(q, k_ext, v_ext, window=w, key_valid=valid, mode=_window_mode(mode),
                                     chunk_size=c.chunk_size, check_values=False)
        o = (c.linear_weight * upcast(o_lin) + c.window_weight * num / den.unsqueeze(-1)).to(P.v.dtype)
        y = self._readout(o, P, x)
        new = None
        if need_state:
            new = {"S": S, **P.state, "pos": pos0 + T, "k": k_ext[:, T:].clone(), "v": v_ext[:, T:].clone()}
        return MixOut(y, new, values=P.v, mixed=o)

    # -- DSF view --------------------------------------------------------------------------

    def _window_probs(self, x, P):
        """[B, H, T, T]: the window's softmax weights."""
        q, k = self._window_qk(P, 0)
        _, den, _, p = window_softmax(q, k, P.v, window=self.config.window, mode="parallel", return_weights=True, check_values=False)
        return p / den.transpose(1, 2).unsqueeze(-1)

    def phi(self, x):
        """[B, H, T, T]: α·(the recurrence's map, LinAttMap) + β·(the window's softmax weights)."""
        c = self.config
        A = super().phi(x)
        P = self._params(x, None, False)
        return c.linear_weight * A + c.window_weight * self._window_probs(x, P)

    def dsf(self, x):
        """The exact realization of :func:`window_dsf` (input v, output the mixed values): β·(the window's weights) on
        the register, the recurrence's B_t = k̃_t, C_t = α·scale·q̃_t and decay beside it."""
        self.check_input(x)
        c = self.config
        P = self._params(x, None, False)
        band = _bands(c.window_weight * self._window_probs(x, P), c.window)
        gk = P.gk if P.gk is None or P.gk.dim() == 4 else P.gk.unsqueeze(-1)
        return window_dsf(band, c.linear_weight * self._scale * P.q, P.k, gk, value_dim=self.V, delayed=False)

    def decays(self, x):
        """The diagonal of Λ_t (= dsf(x).lam): 0 on the window's register, α_t on the recurrence's states."""
        self.check_input(x)
        P = self._params(x, None, False)
        gk = P.gk if P.gk is None or P.gk.dim() == 4 else P.gk.unsqueeze(-1)
        return _window_lam(self.config.window, gk, (x.shape[0], x.shape[1], self.H, self.K), self.V, x.device)

    def state_size(self, seq_len: int | None = None) -> int:
        return super().state_size(seq_len) + (self.config.window - 1) * self.H * (self.K + self.V)
