"""The student init table: which student parameter takes which attention weight.

The DSF reads softmax attention and every q/k/v-like student the same way: the query is C_i
(what reads the state), the key is B_i (what writes it), the value is the input u_i and the
output projection follows the readout. So initialising a student from a trained attention layer
(Mamba-in-the-Llama's q→C, k→B, v→x; LoLCATs' copied q/k/v/o) is one table keyed by student
family (the registered mixer class), never code per mixer:

* a :class:`StudentInit` entry: how the teacher's sizes become the student's config (heads,
  widths) and its rows;
* a :class:`Take` row: the student parameter ``student`` (a name in its state dict) takes the
  teacher tensor ``teacher`` — ``"q"``, ``"k"``, ``"v"``, ``"o"`` in seqmix's layout (q, k: [H·K,
  d]; v: [H·V, d]; o: [d, H·V]; grouped kv heads repeated to H; ``"k_kv"``, ``"v_kv"``: k and v
  of the kv heads themselves, for a student that keeps them grouped) — into its row block ``rows``
  (packed projections: Mamba-2's in_proj = [z; x; B; C; dt]); ``teacher="identity_conv"`` sets a
  short convolution to the identity (its last tap 1), so the copied projections reach the
  recurrence unchanged (each of the convs a row names that the student has: the delta rule's three convs,
  its ``fused_conv``, or none with ``conv_size`` None).

Biases (Qwen2's q/k/v): a teacher with biases gives the student the config fields of its entry's
``bias`` (its projections biased), the teacher's biases fill the same rows as the weights, and every
other bias of those projections starts at 0. Decays, gates, norms (a teacher's qk-norm aside: below)
and feature maps keep their own init. A registered mixer is a valid student when its class has an
entry here and the built mixer has every parameter the rows name (so ``hgrn``, a GeneralForm without
W_q, is refused; ``softmax_attention`` itself is the teacher, never a student). Teacher RoPE: the separable (linear) attention
students take it (``rope=True`` at the teacher's θ and frequency scaling, ``rope_scaling``: the
feature maps act on the rotated q, k, as in LoLCATs), so an identity-feature student's scores are
exactly the teacher's logits; the students with a decay run without it (Mamba-in-the-Llama's
choice; RetNet keeps its own rotation at its own frequencies, B'MOJO has none): their decay carries
the position, and stage 1 trains them to do without RoPE.

Teacher qk-norm (Qwen3's per-head RMSNorm of q and k, weights γ): a student with a per-head qk-norm of
its own (the separable attentions and sliding-window attention: ``qk_norm="head"``, set by their
entries) takes the teacher's q, k rows as they are and γ into its norm weights (rows
``q_norm.weight``, ``k_norm.weight``), so it divides by each token's RMS as the teacher does; every
other student takes γ folded into its q and k rows (:meth:`Teacher.fold_qk_norm`) and no division.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from ..mixers.base import Mixer, build_mixer, mixer_entry
from ..mixers.layers import GroupedRows, group_rows
from ..ops import repeat_kv

__all__ = ["Take", "StudentInit", "STUDENTS", "Teacher", "teacher_weights", "student_init", "build_student", "valid_students",
           "copied_rows", "INITS"]


#: the registered name of the teacher's attention (a kept layer, never a student)
TEACHER = "softmax_attention"


@dataclass(frozen=True)
class Teacher:
    """The attention layer's sizes and weights in seqmix's layout, kv heads repeated to ``heads``.

    q, k: [heads·K, d]; v: [heads·V, d]; o: [d, heads·V]; K = V = head_dim."""

    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float | None
    q: torch.Tensor = field(repr=False)
    k: torch.Tensor = field(repr=False)
    v: torch.Tensor = field(repr=False)
    o: torch.Tensor = field(repr=False)
    rope_scaling: dict | None = None  # the teacher's RoPE scaling (Llama 3's "llama3", ...), None: plain RoPE
    # a per-head qk-norm's weights γ (Qwen3: q_h ← RMSNorm(q_h)·γ_q before RoPE), q_norm, k_norm [head_dim], None without
    # one; q and k above are the projection's rows before the norm
    q_norm: torch.Tensor | None = field(default=None, repr=False)
    k_norm: torch.Tensor | None = field(default=None, repr=False)
    qk_norm_eps: float = 1e-6
    # the projections' biases where the teacher has them (Qwen2's q/k/v), None where not: q_bias, k_bias [heads·K],
    # v_bias [heads·V] (kv heads repeated as the weights), o_bias [d]
    q_bias: torch.Tensor | None = field(default=None, repr=False)
    k_bias: torch.Tensor | None = field(default=None, repr=False)
    v_bias: torch.Tensor | None = field(default=None, repr=False)
    o_bias: torch.Tensor | None = field(default=None, repr=False)

    @property
    def has_bias(self) -> bool:
        return any(b is not None for b in (self.q_bias, self.k_bias, self.v_bias, self.o_bias))

    def fold_qk_norm(self) -> Teacher:
        """The teacher for a student without a qk-norm: γ_q, γ_k folded into each head's q and k rows (γ ⊙ q: the norm's
        weights; its division by each token's RMS has no row: Gated DeltaNet's L2 norm of q, k removes the scale again,
        the other students see γ ⊙ q unnormalised and stage 1 trains them to do without it). Itself without a qk-norm."""
        if self.q_norm is None:
            return self
        H, K = self.heads, self.head_dim
        q = (self.q.view(H, K, -1) * self.q_norm.view(1, K, 1)).reshape(H * K, -1)
        k = (self.k.view(H, K, -1) * self.k_norm.view(1, K, 1)).reshape(H * K, -1)
        return replace(self, q=q, k=k, q_norm=None, k_norm=None)

    def tensor(self, name: str, bias: bool = False) -> torch.Tensor | None:
        """The teacher tensor a :class:`Take` row names ("q", "k", "v", "o"; "k_kv", "v_kv": k, v of the kv heads
        themselves, [kv_heads·K, d] without the repeat; "q_norm", "k_norm": γ), or with ``bias`` its bias (None where
        the teacher has none)."""
        base, grouped = (name[:-3], True) if name.endswith("_kv") else (name, False)
        x = getattr(self, f"{base}_bias" if bias else base, None)
        if x is None or not grouped:
            return x
        return x.reshape(self.kv_heads, self.heads // self.kv_heads, -1)[:, 0].reshape(-1, *x.shape[1:])


@dataclass(frozen=True)
class Take:
    """One row: student parameter ``student`` (rows ``rows`` = (start, stop) of its first dimension,
    as functions of the teacher) takes teacher tensor ``teacher`` ("q", "k", "v", "o", "k_kv", "v_kv",
    "q_norm", "k_norm" or "identity_conv")."""

    student: str
    teacher: str
    rows: Callable[[Teacher], tuple[int, int]] | None = None


@dataclass(frozen=True)
class StudentInit:
    """The entry of one student family: ``config(teacher) -> dict`` (the student's sizes, which the
    user's mixer config may override except where the rows need them) and the rows."""

    config: Callable[[Teacher], dict]
    rows: tuple[Take, ...]
    why: str = ""
    #: the config fields that give the student's copied projections their biases (set where the teacher has
    #: biases; a bias the teacher lacks starts at 0, so the copy is still the teacher's map); None: the family
    #: has no biased projections, and a teacher with biases is refused
    bias: dict | None = None
    #: the family can keep the teacher's kv heads grouped (``group_kv``: its k and v rows tied per group, a
    #: :class:`~seqmix.mixers.layers.GroupedRows`); False where the mixer reads its projection's weight itself
    group_kv: bool = True


def _heads(t: Teacher) -> dict:
    return {"heads": t.heads}


def _rope(t: Teacher) -> dict:
    """The teacher's RoPE for a student that rotates by it: its base and frequency scaling ({} without RoPE)."""
    if not t.rope_theta:
        return {}
    return {"rope_theta": t.rope_theta, **({"rope_scaling": dict(t.rope_scaling)} if t.rope_scaling else {})}


def _qk_norm(t: Teacher) -> dict:
    """The teacher's per-head qk-norm for a student that has one ({} without)."""
    return {"qk_norm": "head", "qk_norm_eps": t.qk_norm_eps} if t.q_norm is not None else {}


def _separable(t: Teacher) -> dict:
    return {"heads": t.heads, "n": t.heads * t.head_dim, "scale": "sqrt", **({"rope": True, **_rope(t)} if t.rope_theta else {}),
            **_qk_norm(t)}


def _sliding_window(t: Teacher) -> dict:
    """The teacher's attention itself, cut to the preset's window: its heads, kv heads (kept grouped), head width, scale,
    RoPE and qk-norm."""
    return {"heads": t.heads, "kv_heads": t.kv_heads, "head_dim": t.head_dim, "scale": "sqrt",
            **({"rope": True, **_rope(t)} if t.rope_theta else {}), **_qk_norm(t)}


def _general_form(t: Teacher) -> dict:
    return {"heads": t.heads, "expand_k": t.heads * t.head_dim / t.d_model, "expand_v": t.heads * t.head_dim / t.d_model}


def _window_general_form(t: Teacher) -> dict:
    """The general form's sizes, and the teacher's RoPE for the sliding window of Liger attention (its recurrence runs without)."""
    return {**_general_form(t), **_rope(t)}


def _rwkv7(t: Teacher) -> dict:
    """RWKV-7's heads split d_model (r, k, v, o are d × d), with the teacher's RoPE on r and k (RADLADS); the value residual
    is off: it reads the first layer's values from the backbone's per-forward context, which transformers' layers around
    the students do not pass, so each student would be a first layer with its ν parameters unused."""
    if t.heads * t.head_dim != t.d_model:
        raise ValueError(f"linearize: argument 'mixer': RWKV-7's heads split d_model (heads·head size = d_model), the teacher has "
                         f"{t.heads} heads of {t.head_dim} = {t.heads * t.head_dim} for d_model = {t.d_model}")
    return {"heads": t.heads, "value_residual": False, **_rope(t)}


def _ssd_rows(t: Teacher, which: str) -> tuple[int, int]:
    """Mamba-2's in_proj = [z (D); x (D); B (G·N); C (G·N); dt (H)], D = H·V, G = H, N = K."""
    D, GN = t.heads * t.head_dim, t.heads * t.head_dim
    start = {"x": D, "B": 2 * D, "C": 2 * D + GN}[which]
    return start, start + (D if which == "x" else GN)


#: the rows of the attentions' packed parametrization (separable attention, LoLCATs, B'MOJO): [q; k] -> W_qk, v -> W_v, o -> W_o
_QK_PACKED = (Take("W_qk.weight", "q", lambda t: (0, t.heads * t.head_dim)),
              Take("W_qk.weight", "k", lambda t: (t.heads * t.head_dim, 2 * t.heads * t.head_dim)),
              Take("W_v.weight", "v"), Take("W_o.weight", "o"))
#: the rows of softmax attention's packed parametrization with its kv heads kept grouped: [q; k_kv] -> W_qk, v_kv -> W_v, o -> W_o
_QK_GROUPED = (Take("W_qk.weight", "q", lambda t: (0, t.heads * t.head_dim)),
               Take("W_qk.weight", "k_kv", lambda t: (t.heads * t.head_dim, (t.heads + t.kv_heads) * t.head_dim)),
               Take("W_v.weight", "v_kv"), Take("W_o.weight", "o"))
#: the rows of a teacher's per-head qk-norm, in a student with one of its own (its γ into the student's norm weights)
_QK_NORM = (Take("q_norm.weight", "q_norm"), Take("k_norm.weight", "k_norm"))
#: the teacher tensors that are a projection's rows (their biases go with them)
_PROJECTIONS = ("q", "k", "v", "o", "k_kv", "v_kv")
#: the rows of the general form's separate projections (GLA, RetNet, Liger, ...)
_QKV_SEPARATE = (Take("W_q.weight", "q"), Take("W_k.weight", "k"), Take("W_v.weight", "v"), Take("W_o.weight", "o"))

#: the init table: student family (registered mixer class name) -> its entry
STUDENTS: dict[str, StudentInit] = {
    # separable (linear) attention, DSF eq. 13-15: [q; k] -> W_qk, v -> W_v, o -> W_o
    "SeparableAttention": StudentInit(_separable, _QK_PACKED, "φ(q)ᵀψ(k)/η: q → C (through φ), k → B (through ψ), v → u",
                                      bias={"bias": True}),
    # LoLCATs attention (eq. 7): separable attention's rows; the window's softmax reads the same q, k (the teacher's, RoPE
    # included), so with the window covering the sequence the student is the teacher's attention
    "LolcatsAttention": StudentInit(_separable, _QK_PACKED, "softmax over the last w tokens + φ(q)ᵀψ(k) before them, one "
                                    "normalization: q → C, k → B, v → u; φ, ψ (Hedgehog: identity), γ at their own init", bias={"bias": True}),
    # sliding-window attention (the window + linear hybrids' control): the teacher's attention itself, cut to the window;
    # kv heads kept grouped (its KV cache is the teacher's, w − 1 tokens long). The teacher's own name, softmax_attention,
    # is not a student (student_init)
    "SoftmaxAttention": StudentInit(_sliding_window, _QK_GROUPED, "softmax over the last w tokens: q, k, v, o, RoPE and "
                                    "qk-norm the teacher's; nothing at its own init", bias={"bias": True}),
    # MetaLA's general form (GLA, RetNet, TransNormer, Liger-GLA, ...): separate W_q, W_k, W_v, W_o
    "GeneralForm": StudentInit(
        _general_form, _QKV_SEPARATE,
        "S_t = Λ_t S_{t-1} + k_tᵀv_t, o_t = q_t S_t: q → C, k → B, v → u; Λ_t (decay) at its own init (Liger's key-pooled "
        "gate: from the copied W_K)", bias={"bias": True}),
    # Liger attention: the general form's rows; its sliding window reads the same W_Q, W_K with the teacher's RoPE
    "LigerAttention": StudentInit(
        _window_general_form, _QKV_SEPARATE,
        "α·(gated recurrence) + β·(sliding-window softmax) on the same projections: q → C, k → B (and the gate), v → u",
        bias={"bias": True}),
    # the delta rule family (DeltaNet, Gated DeltaNet): W_q, W_k, W_v, W_o; the short convs at the identity
    "DeltaNet": StudentInit(
        lambda t: {"heads": t.heads, "expand_k": t.heads * t.head_dim / t.d_model, "expand_v": t.heads * t.head_dim / t.d_model},
        (Take("W_q.weight", "q"), Take("W_k.weight", "k"), Take("W_v.weight", "v"), Take("W_o.weight", "o"),
         Take("conv_q.weight", "identity_conv"), Take("conv_k.weight", "identity_conv"), Take("conv_v.weight", "identity_conv"),
         Take("conv.weight", "identity_conv")),  # (three convs, or fused_conv's one over [q; k; v], or none: conv_size None)
        "S_t = α_t(I − β_t k_tᵀk_t)S_{t-1} + β_t k_tᵀv_t (L2-normed q, k): q → C, k → B, v → u", bias={"qkv_bias": True}),
    # RWKV-7 (rwkv7, rad_rwkv7): the receptance r reads the state as the query does (RADLADS' weight transfer: q → r)
    "RWKV7": StudentInit(
        _rwkv7, (Take("W_r.weight", "q"), Take("W_k.weight", "k"), Take("W_v.weight", "v"), Take("W_o.weight", "o")),
        "S_t = S_{t-1}(Diag(w_t) − κ̂ᵀ(a ⊙ κ̂)) + k̃ᵀv, o_t = r_t S_t: q → r (C), k → k (B, through k̃), v → v; decay w, a, κ̂, "
        "the gate and the GroupNorm at their own init", bias={"qkv_bias": True}),
    # Mamba-2's block (SSD): in_proj's x ← v, B ← k, C ← q (Mamba-in-the-Llama), one B/C group per head
    "SSD": StudentInit(
        lambda t: {"headdim": t.head_dim, "d_state": t.head_dim, "groups": t.heads,
                   "d_inner": t.heads * t.head_dim},
        (Take("in_proj.weight", "v", lambda t: _ssd_rows(t, "x")), Take("in_proj.weight", "k", lambda t: _ssd_rows(t, "B")),
         Take("in_proj.weight", "q", lambda t: _ssd_rows(t, "C")), Take("out_proj.weight", "o"),
         Take("conv.weight", "identity_conv")),
        "h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t x_t, y_t = C_t h_t: q → C, k → B, v → x; A, Δ, D, the gate z at their own init",
        bias={"bias": True}),
    # B'MOJO (sliding-window softmax over the window + fading memory tokens): [q; k] -> W_qk, v, o
    "Bmojo": StudentInit(
        lambda t: {"heads": t.heads, "n": t.heads * t.head_dim}, _QK_PACKED,
        "softmax over the last `window` tokens and the fading (Mamba) memory tokens: the window's q, k, v, o are the teacher's",
        bias={"bias": True}, group_kv=False),  # (its memory tokens' keys read W_qk's weight rows themselves)
}


def teacher_weights(attention: Mixer) -> Teacher:
    """The :class:`Teacher` of a converted softmax attention mixer (``seqmix.interop``'s Llama, Qwen3, ...
    attention: W_qk = [q; k], W_v, W_o), kv heads repeated to the query heads. A per-head qk-norm
    (Qwen3: q_h ← RMSNorm(q_h)·γ_q) gives its weights γ (``q_norm``, ``k_norm``) beside the q and k rows
    (the module docstring: a student with a qk-norm takes them, the others take them folded)."""
    if attention.registry_name != TEACHER:
        raise ValueError(f"linearize: the teacher layer is a seqmix {attention.registry_name!r}, expected {TEACHER!r}")
    c = attention.config
    if c.qk_norm == "full" or c.output_gate or (c.qk_norm == "head" and c.qk_norm_kind != "rms"):
        raise ValueError("linearize: argument 'model': attention with a qk-norm over the whole projection (OLMo-2), a LayerNorm "
                         "as its qk-norm (Phi's qk_layernorm) or an output gate has no student row in the init table")
    H, Hkv, K, V = attention.heads, attention.kv_heads, attention.head_qk, attention.head_v
    if K != V:
        raise ValueError(f"linearize: argument 'model': query/key width {K} != value width {V} per head")
    d = c.d_model
    W = attention.W_qk.weight.detach()
    q, k = W[: H * K], W[H * K:]
    norm = {}
    if c.qk_norm == "head":  # Qwen3: RMSNorm(q_h)·γ_q per head, one γ [K] shared by the heads
        norm = {"q_norm": attention.q_norm.weight.detach().clone(), "k_norm": attention.k_norm.weight.detach().clone(),
                "qk_norm_eps": float(c.qk_norm_eps)}
    k = repeat_kv(k.view(Hkv, K, d), H // Hkv, dim=0).reshape(H * K, d)
    v = repeat_kv(attention.W_v.weight.detach().view(Hkv, V, d), H // Hkv, dim=0).reshape(H * V, d)
    if c.rope and (c.rotary_dim not in (None, K) or c.rope_interleaved):
        raise ValueError("linearize: argument 'model': partial or interleaved RoPE has no student row in the init table")
    theta = float(c.rope_theta) if c.rope else None
    biases = {}
    if attention.W_qk.bias is not None:  # Qwen2: q/k/v biases (a qk-norm would act after them: refused above for "full")
        if c.qk_norm == "head":
            raise ValueError("linearize: argument 'model': attention with q/k biases and a per-head qk-norm has no student row "
                             "in the init table")
        b = attention.W_qk.bias.detach()
        biases["q_bias"] = b[: H * K].clone()
        biases["k_bias"] = repeat_kv(b[H * K:].view(Hkv, K), H // Hkv, dim=0).reshape(H * K).clone()
    if attention.W_v.bias is not None:
        biases["v_bias"] = repeat_kv(attention.W_v.bias.detach().view(Hkv, V), H // Hkv, dim=0).reshape(H * V).clone()
    if isinstance(attention.W_o, torch.nn.Linear) and attention.W_o.bias is not None:
        biases["o_bias"] = attention.W_o.bias.detach().clone()
    return Teacher(d, H, Hkv, K, theta, q.clone(), k.clone(), v.clone(), attention.W_o.weight.detach().clone(),
                   rope_scaling=dict(c.rope_scaling) if c.rope and c.rope_scaling else None, **norm, **biases)


def valid_students() -> dict[str, str]:
    """{registered mixer name: its family} of every mixer the table can initialise from attention
    (its class has an entry and the built mixer has every parameter the rows name)."""
    from ..mixers.base import list_mixers

    t = Teacher(16, 2, 2, 8, 10000.0, *(torch.zeros(16, 16) for _ in range(4)))
    out = {}
    for e in list_mixers():
        if e.cls.__name__ not in STUDENTS:
            continue
        try:
            build_student(e.name, t, init="attention")
        except ValueError:
            continue
        out[e.name] = e.cls.__name__
    return out


def student_init(mixer: str) -> StudentInit:
    """The table entry of the registered mixer ``mixer`` (ValueError naming 'mixer' if none)."""
    entry = mixer_entry(mixer)
    if mixer == TEACHER:
        raise ValueError(f"linearize: argument 'mixer' = {TEACHER!r} is the teacher's own attention (seqmix.linearize keeps a "
                         "teacher layer under that name, never as a student); its windowed student is 'sliding_window_attention'")
    init = STUDENTS.get(entry.cls.__name__)
    if init is None:
        raise ValueError(f"linearize: argument 'mixer' = {mixer!r} ({entry.cls.__name__}) cannot take attention's q/k/v: the "
                         f"init table has the families {', '.join(sorted(STUDENTS))} (docs/linearize.md lists the students)")
    return init


#: the student inits: from the attention weights, the student's own, the host model's Linear init
INITS = ("attention", "random", "random_hf")


def build_student(mixer: str, teacher: Teacher, *, init: str = "attention", init_std: float = 0.02, group_kv: bool = False,
                  **overrides) -> Mixer:
    """The student mixer ``mixer`` sized from ``teacher`` (``overrides``: the user's config fields),
    its q/k/v/o rows copied from the teacher when ``init == "attention"``; ``"random"``: its own init;
    ``"random_hf"``: its own init with every Linear weight redrawn as transformers initialises the host
    model's (normal(0, ``initializer_range``), zero biases; :func:`seqmix.linearize.linearize` passes
    the host's ``initializer_range`` as ``init_std``). ``group_kv`` (a teacher with grouped-query attention):
    the projections that take k and v keep them at the teacher's kv heads (:func:`kv_segments`), so the student
    reads the teacher's k, v weight bytes rather than ``heads / kv_heads`` times them; the
    student computes the same function at init (the copied rows of a group are equal); in training the heads
    of a group share k and v, as the teacher's do (LoLCATs, Mamba-in-the-Llama and Liger keep GQA so)."""
    student = _build_student(mixer, teacher, init, init_std, overrides)
    if group_kv:
        group_rows(student, kv_segments(student, teacher))
    return student


def kv_segments(student: Mixer, teacher: Teacher) -> dict[str, list[list[int]]]:
    """{projection name: :class:`~seqmix.mixers.layers.GroupedRows` segments} that keep the teacher's kv heads in
    ``student`` (the init table's k and v rows as (heads, kv_heads, head width) blocks, the projection's other rows
    plain); {} for a teacher without GQA, a student that keeps them itself (sliding-window attention: its rows
    are the teacher's k_kv, v_kv) or one that reads its projection's weight rows itself (B'MOJO: one k and v per
    head; its entry's ``group_kv`` is False)."""
    entry = student_init(student.registry_name)
    H, Hkv = teacher.heads, teacher.kv_heads
    rows = [r for r in entry.rows if r.teacher in ("k", "v")]
    if Hkv == H or not rows:
        return {}
    if not entry.group_kv:  # (B'MOJO reads its weight rows itself: it keeps one k and v per head)
        return {}
    blocks: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        name = row.student.rsplit(".", 1)[0]
        n = student.get_submodule(name).out_features
        blocks.setdefault(name, []).append(row.rows(teacher) if row.rows else (0, n))
    out = {}
    for name, grouped in blocks.items():
        segs, at, n = [], 0, student.get_submodule(name).out_features
        for a, b in sorted(grouped):
            if a > at:
                segs.append([1, 1, a - at])
            if (b - a) != H * teacher.head_dim:  # (e.g. DeltaProduct's (n h k) rows: not one head-major block)
                raise ValueError(f"linearize: argument 'group_kv': {name} rows {a}..{b} are not {H} heads of "
                                 f"{teacher.head_dim} (the student's layout cannot keep the teacher's kv heads)")
            segs.append([H, Hkv, (b - a) // H])
            at = b
        if n > at:
            segs.append([1, 1, n - at])
        out[name] = segs
    return out


def _build_student(mixer: str, teacher: Teacher, init: str, init_std: float, overrides: dict) -> Mixer:
    if init not in INITS:
        raise ValueError(f"linearize: argument 'init' must be one of {', '.join(INITS)}, got {init!r}")
    entry = student_init(mixer)
    bias = {}
    if teacher.has_bias and init == "attention":
        if entry.bias is None:
            raise ValueError(f"linearize: argument 'mixer' = {mixer!r} has no biases in its projections, and the teacher's "
                             "attention has (q/k/v or output biases): the init table cannot copy them")
        bias = entry.bias
    cfg = {**entry.config(teacher), **bias, **overrides, "d_model": teacher.d_model}
    try:
        with torch.no_grad():
            student = build_mixer(mixer, **cfg)
    except ValueError as e:
        raise ValueError(f"linearize: argument 'mixer' = {mixer!r} with config {cfg}: {e}") from None
    params = dict(student.named_parameters())
    # (an identity conv row sets the conv the student has: its separate or fused convs, none without convs)
    missing = sorted({r.student for r in entry.rows if r.teacher != "identity_conv"} - set(params))
    if missing:
        raise ValueError(f"linearize: argument 'mixer' = {mixer!r} cannot take attention's q/k/v: it has no "
                         f"{', '.join(missing)} (a preset without those projections)")
    if init == "random_hf":
        with torch.no_grad():
            for sub in student.modules():
                if isinstance(sub, torch.nn.Linear):
                    sub.weight.normal_(0.0, init_std)
                    if sub.bias is not None:
                        sub.bias.zero_()
    if init != "attention":
        return student
    teacher, rows = _with_qk_norm(entry, teacher, params)
    with torch.no_grad():
        for row in rows:  # the biases of the copied projections start at 0 (the rows the table fills: below)
            b = params.get(_bias_name(row))
            if b is not None and row.teacher in _PROJECTIONS:
                b.zero_()
        for row in rows:
            p = params.get(row.student)
            if row.teacher == "identity_conv":  # [C, W]: the last tap (the current token) 1, the others 0
                if p is None:  # (a conv this student does not have)
                    continue
                p.zero_()
                p[:, -1] = 1.0
                bias = params.get(row.student.rsplit(".", 1)[0] + ".bias")
                if bias is not None:
                    bias.zero_()
                continue
            src = teacher.tensor(row.teacher)
            dst = p if row.rows is None else p[slice(*row.rows(teacher))]
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError(f"linearize: argument 'mixer' = {mixer!r}: {row.student} rows {row.rows(teacher) if row.rows else 'all'} "
                                 f"have shape {list(dst.shape)}, the teacher's {row.teacher} {list(src.shape)} (a config override "
                                 "changed the widths the table fills?)")
            dst.copy_(src.to(dst.dtype))
            if row.teacher in _PROJECTIONS:
                _copy_bias(params, row, teacher, mixer)
    return student


def _with_qk_norm(entry: StudentInit, teacher: Teacher, params: dict) -> tuple[Teacher, tuple[Take, ...]]:
    """The teacher and the rows for a student with parameters ``params``: a teacher's qk-norm goes into a student's own
    (its rows as they are, γ into q_norm.weight, k_norm.weight) or, for a student without one, folds into the rows."""
    if teacher.q_norm is None:
        return teacher, entry.rows
    if all(r.student in params for r in _QK_NORM):
        return teacher, entry.rows + _QK_NORM
    return teacher.fold_qk_norm(), entry.rows


def _copy_bias(params: dict, row: Take, teacher: Teacher, mixer: str) -> None:
    """The bias rows that go with a copied weight block: the teacher's bias of that projection where it has
    one, else 0 (a student bias the teacher lacks starts at 0: the copy is still the teacher's map). A
    teacher bias with no student bias to take it: ValueError naming 'mixer'."""
    bias = params.get(_bias_name(row))
    src = teacher.tensor(row.teacher, bias=True)
    if bias is None:
        if src is not None and bool(src.ne(0).any()):
            raise ValueError(f"linearize: argument 'mixer' = {mixer!r}: the teacher's {row.teacher} projection has a bias and "
                             f"the student's {row.student} has none (its config has no bias there)")
        return
    if src is not None:
        block = _bias_block(row, teacher)
        (bias if block is None else bias[slice(*block)]).copy_(src.to(bias.dtype))


def _bias_name(row: Take) -> str | None:
    """The bias parameter of the projection whose weight a row fills (None: the row is not a Linear's weight)."""
    return row.student[: -len("weight")] + "bias" if row.student.endswith(".weight") else None


def _bias_block(row: Take, teacher: Teacher) -> tuple[int, int] | None:
    """The block of that bias the row fills: the weight's output rows (W_o's: all of it)."""
    return None if row.rows is None or row.teacher == "o" else row.rows(teacher)


def copied_rows(mixer: Mixer, teacher: Teacher) -> dict[str, list[tuple[int, int] | None]]:
    """{student parameter name: the row blocks (start, stop) of it that ``init="attention"`` copies
    from the teacher's q/k/v/o (None: the whole tensor)} of the student ``mixer`` — the init table's
    rows, and the same rows of those projections' biases where the student has them; everything else in the student (feature maps, decays, gates, norms, the convolutions set to
    the identity) is new; a teacher's qk-norm weights γ, where the student has a qk-norm, are copied too. Stage 1's
    ``trainable="new"`` freezes exactly these rows."""
    entry = student_init(mixer.registry_name)
    out: dict[str, list[tuple[int, int] | None]] = {}
    params = dict(mixer.named_parameters())
    teacher, rows = _with_qk_norm(entry, teacher, params)
    for row in rows:
        if row.teacher in _PROJECTIONS + ("q_norm", "k_norm"):
            for name, block in ((row.student, row.rows(teacher) if row.rows else None), (_bias_name(row), _bias_block(row, teacher))):
                name, block = _stored(mixer, name, block)
                if name in params:  # (the projection's bias: the same output rows, where it has one)
                    out.setdefault(name, []).append(block)
    return out


def _stored(mixer: Mixer, name: str | None, block: tuple[int, int] | None) -> tuple[str | None, tuple[int, int] | None]:
    """The parameter and rows that hold output rows ``block`` of projection parameter ``name``: the same, or in a
    :class:`~seqmix.mixers.layers.GroupedRows` its stored Linear's (``W_k.weight`` -> ``W_k.proj.weight``)."""
    if name is None:
        return name, block
    module, _, leaf = name.rpartition(".")
    try:
        m = mixer.get_submodule(module) if module else mixer
    except AttributeError:
        return name, block
    if not isinstance(m, GroupedRows):
        return name, block
    if block is None:  # the whole tensor (frozen by requires_grad in stage 1, not by a gradient mask)
        return f"{module}.proj.{leaf}", None
    return f"{module}.proj.{leaf}", m.stored_block(*block)
