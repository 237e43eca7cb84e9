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

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from ..ops import linear_recurrence
from ..ops.attention import kv_cache_trim
from ..ops.eidetic import eidetic_select, heap_push, innovation, predictor_weights
from ..ops.memory_attention import chunked_memory_attention, n_chunks
from .attention import AttentionConfig, _Attention
from .base import AUTO_SEGMENT_LEN, MixOut, register, register_preset
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
