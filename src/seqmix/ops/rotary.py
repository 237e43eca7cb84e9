"""Rotary position embedding (RoPE; Su et al. 2021, RoFormer, eq. 34) as a pure op.

Each query or key vector of a head is cut into pairs of channels; the pair j of a token at
absolute position p is rotated by the angle p·θ_j, θ_j = theta^(-2j/R):

    (a, b)  ->  (a cos pθ_j − b sin pθ_j,  a sin pθ_j + b cos pθ_j)        j = 0 .. R/2 − 1

so q_pᵀ k_s depends on p − s only. R = ``rotary_dim`` (even, ≤ the head width K); channels
R .. K − 1 pass unchanged (partial rotary: GPT-NeoX's rotary_pct, RecurrentGemma's
partial_rotary_factor = 0.5, Qwen3-Next's 0.25 — the rotated channels are the first R).

Which channels form a pair (``interleaved``):

* ``False`` (default; GPT-NeoX, Llama, Qwen, Gemma in transformers: ``rotate_half``): channel
  j pairs with channel j + R/2 (the rotated part is split in two halves);
* ``True`` (GPT-J, the RoFormer paper, Mesh-TensorFlow): channel 2j pairs with 2j + 1.

The two are the same rotation up to a fixed permutation of the channels, so a checkpoint
trained with one needs its q and k projection rows permuted to run with the other.

Frequency scaling (``scaling``, a dict with a ``type``): the context-extension variants of RoPE
change the frequencies θ_j (and some multiply the rotated channels by a constant a, the
*attention factor*: the rotated part of qᵀk is then scaled by a²). With f = ``factor``, L =
``original_max_position_embeddings``, θ_j = theta^(-2j/R) the default frequencies:

* ``linear`` (position interpolation, Chen et al. 2023): θ_j / f — positions divided by f.
* ``dynamic`` (NTK-aware, dynamic): the base grows with the sequence, theta' = theta·(f·n/M −
  (f − 1))^(R/(R−2)) for n = max(seq_len, M) tokens, M = ``max_position_embeddings``; n is the
  length of the call's positions (its last position + 1), so short sequences keep the default.
* ``yarn`` (Peng et al. 2023): per pair a blend γ_j θ_j + (1 − γ_j) θ_j / f, γ_j a linear ramp
  over the pairs between the correction dimensions of ``beta_fast`` and ``beta_slow`` rotations
  in L tokens (``truncate``: rounded out); a = ``attention_factor`` or 0.1·ln f + 1 (with
  ``mscale`` / ``mscale_all_dim``: their ratio of that form).
* ``llama3`` (Llama 3.1): wavelengths 2π/θ_j above L/``low_freq_factor`` get θ_j / f, below
  L/``high_freq_factor`` keep θ_j, between a smooth blend ((L/λ − l)/(h − l)).
* ``longrope`` (Phi-3, Ding et al. 2024): θ_j / e_j with e = ``short_factor`` (R/2 numbers) while
  the sequence has at most L tokens and e = ``long_factor`` beyond; a = ``attention_factor`` or
  sqrt(1 + ln f / ln L) (1 for f <= 1).

:func:`rope_frequencies` returns (θ [R/2], a); tests tie each type to transformers' own
``ROPE_INIT_FUNCTIONS``.

Angles are computed in float32 (float64 for float64 inputs), the rotation too; the result is
cast back to x's dtype. Shapes: x [B, T, H, K]; positions [T] or [B, T] (integers).

:func:`rotary_reference` is the obviously-correct loop over pairs that the tests tie
:func:`rotary` to.
"""

from __future__ import annotations

import json
import math
import weakref

import torch

from .._checks import check_tensor

_WHERE = "rotary"


def _check(x, positions, rotary_dim, theta, where):
    check_tensor("x", x, rank=4, layout="[B, T, H, K]", where=where)
    K = x.shape[-1]
    R = K if rotary_dim is None else rotary_dim
    if isinstance(R, bool) or not isinstance(R, int) or R < 2 or R % 2 or R > K:
        raise ValueError(f"{where}: argument 'rotary_dim' must be an even integer in [2, K = {K}] (channels rotated in pairs), got {rotary_dim!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(f"{where}: argument 'theta' (the RoPE base) must be a number > 1, got {theta!r}")
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point or positions.dim() not in (1, 2) \
            or positions.shape[-1] != x.shape[1] or (positions.dim() == 2 and positions.shape[0] not in (1, x.shape[0])):
        got = f"{list(positions.shape)} {positions.dtype}" if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(f"{where}: argument 'positions' must be an integer tensor [T] or [B, T] with T = {x.shape[1]}, got {got}")
    return R


#: the frequency scalings and the fields each reads (required, then optional with its default)
ROPE_SCALINGS: dict[str, tuple[tuple[str, ...], dict]] = {
    "linear": (("factor",), {}),
    "dynamic": (("factor", "max_position_embeddings"), {}),
    "yarn": (("factor", "original_max_position_embeddings"),
             dict(beta_fast=32.0, beta_slow=1.0, attention_factor=None, mscale=None, mscale_all_dim=None, truncate=True)),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), {}),
    "longrope": (("long_factor", "short_factor", "original_max_position_embeddings"), dict(factor=None, attention_factor=None)),
}


def check_rope_scaling(scaling: dict | None, rotary_dim: int | None = None, where: str = _WHERE) -> dict | None:
    """``scaling`` with its defaults filled in (a new dict), or None; ValueError naming 'scaling' and
    the field for an unknown type, a missing or unknown field, or a value out of range."""
    if scaling is None:
        return None
    if not isinstance(scaling, dict) or scaling.get("type") not in ROPE_SCALINGS:
        got = scaling.get("type") if isinstance(scaling, dict) else type(scaling).__name__
        raise ValueError(f"{where}: argument 'scaling' must be None or a dict with 'type' in {sorted(ROPE_SCALINGS)}, got {got!r}")
    kind = scaling["type"]
    required, optional = ROPE_SCALINGS[kind]
    missing = [k for k in required if scaling.get(k) is None]
    unknown = sorted(set(scaling) - {"type", *required, *optional})
    if missing or unknown:
        raise ValueError(f"{where}: argument 'scaling' of type {kind!r} needs the fields {list(required)} (optional: "
                         f"{sorted(optional)}); missing {missing}, unknown {unknown}")
    out = {**optional, **scaling}
    for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings", "max_position_embeddings",
              "beta_fast", "beta_slow", "attention_factor"):
        v = out.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise ValueError(f"{where}: argument 'scaling' field {k!r} must be a finite number > 0, got {v!r}")
    if kind == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise ValueError(f"{where}: argument 'scaling' field 'high_freq_factor' must exceed 'low_freq_factor', got "
                         f"{out['high_freq_factor']} and {out['low_freq_factor']}")
    if kind == "longrope":
        for k in ("long_factor", "short_factor"):
            v = out[k] = tuple(float(e) for e in out[k])
            if (rotary_dim is not None and len(v) != rotary_dim // 2) or not all(math.isfinite(e) and e > 0 for e in v):
                raise ValueError(f"{where}: argument 'scaling' field {k!r} must hold R/2 = {None if rotary_dim is None else rotary_dim // 2} "
                                 f"finite numbers > 0 (one per rotated pair), got {len(v)}")
    return out


def rope_frequencies(rotary_dim: int, theta: float = 10000.0, scaling: dict | None = None, *, seq_len: int | None = None,
                     device=None, dtype=torch.float32) -> tuple[torch.Tensor, float]:
    """(θ [R/2], a): the frequencies of the R/2 rotated pairs and the attention factor of ``scaling``
    (module docstring; None: θ_j = theta^(-2j/R), a = 1). ``seq_len``: the number of positions of the
    call (their last + 1), read by ``dynamic`` and ``longrope`` only."""
    R = rotary_dim
    sc = check_rope_scaling(scaling, R)
    kind = None if sc is None else sc["type"]
    base = float(theta)
    if kind == "dynamic":
        M, f = sc["max_position_embeddings"], sc["factor"]
        n = M if seq_len is None else max(int(seq_len), M)
        base = base * (f * n / M - (f - 1)) ** (R / (R - 2))
    j = torch.arange(0, R, 2, device=device, dtype=dtype if kind is None else torch.float64)
    inv_freq = 1.0 / (base ** (j / R))
    a = 1.0
    if kind == "linear":
        inv_freq = inv_freq / sc["factor"]
    elif kind == "llama3":
        f, lo, hi, L = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"], sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (L / wavelen - lo) / (hi - lo)  # 0 at wavelength L/lo, 1 at L/hi
        blended = (1 - smooth) * inv_freq / f + smooth * inv_freq
        inv_freq = torch.where(wavelen > L / lo, inv_freq / f, torch.where(wavelen < L / hi, inv_freq, blended))
    elif kind == "yarn":
        f, L = sc["factor"], sc["original_max_position_embeddings"]

        def dim_of(rotations):  # the pair index (in channels) that turns `rotations` times in L tokens
            return R * math.log(L / (rotations * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = dim_of(sc["beta_fast"]), dim_of(sc["beta_slow"])
        if sc["truncate"]:
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, R - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(R // 2, device=device, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        inv_freq = inv_freq / f * ramp + inv_freq * (1 - ramp)  # γ_j = 1 - ramp: high frequencies kept

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        a = sc["attention_factor"]
        if a is None:
            a = mscale(f, sc["mscale"]) / mscale(f, sc["mscale_all_dim"]) if sc["mscale"] and sc["mscale_all_dim"] else mscale(f)
    elif kind == "longrope":
        L = sc["original_max_position_embeddings"]
        e = sc["long_factor"] if seq_len is not None and seq_len > L else sc["short_factor"]
        inv_freq = inv_freq / torch.tensor(e, device=device, dtype=torch.float64)
        a = sc["attention_factor"]
        if a is None:
            f = sc["factor"]
            a = 1.0 if f is None or f <= 1 else math.sqrt(1 + math.log(f) / math.log(L))
    return inv_freq.to(dtype), float(a)


def rotary_angles(positions: torch.Tensor, rotary_dim: int, theta: float = 10000.0, dtype=torch.float32, *,
                  scaling: dict | None = None, seq_len: int | None = None) -> torch.Tensor:
    """p·θ_j: [..., R/2] for positions [...] (θ_j = theta^(-2j/R), j = 0 .. R/2 − 1, or the
    frequencies of ``scaling``: :func:`rope_frequencies`)."""
    inv_freq, _ = rope_frequencies(rotary_dim, theta, scaling, seq_len=seq_len, device=positions.device, dtype=dtype)
    return positions.to(dtype).unsqueeze(-1) * inv_freq


def rotary_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float = 10000.0, dtype=torch.float32, *,
                   scaling: dict | None = None, seq_len: int | None = None, interleaved: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation of :func:`apply_rotary` at positions [...]: (c, s) [..., R], channel i holding
    a·cos pθ_j and ∓a·sin pθ_j of its pair j (− for the first channel of the pair, + for the second;
    θ_j and the attention factor a of ``scaling``: :func:`rope_frequencies`), in ``dtype``."""
    inv_freq, att = rope_frequencies(rotary_dim, theta, scaling, seq_len=seq_len, device=positions.device, dtype=dtype)
    ang = positions.to(dtype).unsqueeze(-1) * inv_freq
    cos, sin = ang.cos(), ang.sin()
    if att != 1.0:
        cos, sin = cos * att, sin * att
    if interleaved:  # pairs (2j, 2j + 1)
        return cos.repeat_interleave(2, dim=-1), torch.stack((-sin, sin), dim=-1).flatten(-2)
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)  # pairs (j, j + R/2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = False) -> torch.Tensor:
    """x [B, T, H, K] with its first R = cos.shape[-1] channels rotated pair by pair, (a, b) ->
    (a cos − b sin, b cos + a sin): x ⊙ c + x̃ ⊙ s with x̃ each channel's partner in its pair (the
    halves swapped, or the neighbours for ``interleaved``) and (c, s) of :func:`rotary_cos_sin`,
    broadcasting against [B, T, 1, R]; computed in c's dtype, cast back to x's."""
    R = cos.shape[-1]
    xr = x if R == x.shape[-1] else x[..., :R]
    if xr.dtype != cos.dtype:
        xr = xr.to(cos.dtype)
    partner = xr.unflatten(-1, (R // 2, 2)).flip(-1).flatten(-2) if interleaved else xr.roll(R // 2, dims=-1)
    # (a product and a sum: one addcmul instead gave a last-bit difference between two copies of one model,
    # tests/test_grouped_rows.py's exact save / load)
    rot = xr * cos + partner * sin
    if rot.dtype != x.dtype:
        rot = rot.to(x.dtype)
    return rot if R == x.shape[-1] else torch.cat((rot, x[..., R:]), dim=-1)


def rotary(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    rotary_dim: int | None = None,
    theta: float = 10000.0,
    interleaved: bool = False,
    scaling: dict | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """Rotates the first ``rotary_dim`` channels of every head of x by its token's position.

    Args:
        x: [B, T, H, K] queries or keys.
        positions: [T] or [B, T] absolute positions (integers) of the T tokens.
        rotary_dim: R, even, ≤ K (default K: full rotary).
        theta: the base of the frequencies θ_j = theta^(-2j/R).
        interleaved: pairs (2j, 2j+1) (GPT-J) instead of (j, j + R/2) (GPT-NeoX / Llama).
        scaling: a frequency scaling (module docstring) or None.
        seq_len: the number of positions the call covers (``dynamic`` / ``longrope``; default the
            largest position + 1 is not read from the tensor: pass it).

    Returns:
        [B, T, H, K], x's dtype (the rotated channels times the attention factor of ``scaling``).
    """
    R = _check(x, positions, rotary_dim, theta, _WHERE)
    dt = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = rotary_cos_sin(positions, R, theta, dt, scaling=scaling, seq_len=seq_len, interleaved=interleaved)  # [(B,) T, R]
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    return apply_rotary(x, cos.unsqueeze(2), sin.unsqueeze(2), interleaved=interleaved)


class RotaryTable:
    """The rotation of :func:`rotary_cos_sin` at the positions 0 .. N − 1, kept between calls: a layer
    that rotates T tokens at positions start .. start + T − 1 (a decoding step: one) slices it instead
    of computing frequencies, angles, cosines and sines per call. The table grows by doubling; its
    entries are the same elementwise arithmetic as a fresh computation, so a slice equals one bit for bit.

    Not tabulated (computed per call): the scalings whose frequencies depend on the call's length
    (``dynamic``, ``longrope``), the ``meta`` device, and calls while torch.compile traces (the
    table is Python state). One table per (R, pairing, device, dtype); a table built in inference
    mode is rebuilt for a call outside it (an inference tensor cannot be saved for a backward pass).
    """

    MIN_POSITIONS = 256

    def __init__(self, theta: float = 10000.0, scaling: dict | None = None):
        self.theta = theta
        self.scaling = scaling
        self.static = scaling is None or scaling.get("type") not in ("dynamic", "longrope")
        self._tables: dict = {}

    def __call__(self, start: int, T: int, rotary_dim: int, *, device, dtype, seq_len: int | None = None,
                 interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(c, s) [T, 1, R] at the positions start .. start + T − 1 (:func:`apply_rotary`'s rotation,
        broadcasting against [B, T, H, R])."""
        end = start + T
        kw = dict(scaling=self.scaling, interleaved=interleaved)
        if not self.static or torch.compiler.is_compiling() or torch.device(device).type == "meta":
            cos, sin = rotary_cos_sin(torch.arange(start, end, device=device), rotary_dim, self.theta, dtype, seq_len=seq_len, **kw)
            return cos.unsqueeze(1), sin.unsqueeze(1)
        key = (rotary_dim, interleaved, str(device), dtype)
        table = self._tables.get(key)  # (cos, sin, whether they are inference tensors: known when built)
        if table is None or table[0].shape[0] < end or (table[2] and not torch.is_inference_mode_enabled()):
            n = max(end, self.MIN_POSITIONS, 2 * table[0].shape[0] if table is not None else 0)
            cos, sin = rotary_cos_sin(torch.arange(n, device=device), rotary_dim, self.theta, dtype, **kw)
            table = self._tables[key] = (cos.unsqueeze(1), sin.unsqueeze(1), cos.is_inference())
        return table[0][start:end], table[1][start:end]

    def __reduce__(self):  # copies and pickles carry the settings, not the tables, and join the process's shared table
        return (RotaryTable.shared, (self.theta, self.scaling))

    @classmethod
    def shared(cls, theta: float = 10000.0, scaling: dict | None = None) -> RotaryTable:
        """The process's one table of RoPE at base ``theta`` with ``scaling``: every layer that rotates with the same
        settings slices the same cos / sin (a model's L layers keep one table, not L: at 128k positions and R = 128
        a table is 128 MiB). Held by its users (weakly here): freed with the last layer that holds it."""
        key = (float(theta), json.dumps(scaling, sort_keys=True, default=repr))
        table = _SHARED_TABLES.get(key)
        if table is None:
            table = _SHARED_TABLES[key] = cls(theta, scaling)
        return table


#: (theta, scaling as JSON) -> the RotaryTable of RotaryTable.shared, while a layer holds it
_SHARED_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def rotary_reference(x, positions, *, rotary_dim=None, theta=10000.0, interleaved=False, scaling=None, seq_len=None):
    """The reference: a loop over the R/2 channel pairs, each rotated as a complex number
    (a + ib)·e^{ipθ_j}, in float64 (θ_j and the attention factor from :func:`rope_frequencies`)."""
    R = _check(x, positions, rotary_dim, theta, "rotary_reference")
    inv_freq, att = rope_frequencies(R, theta, scaling, seq_len=seq_len, dtype=torch.float64)
    pos = positions.to(torch.float64)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    out = x.to(torch.float64).clone()
    for j in range(R // 2):
        ia, ib = (2 * j, 2 * j + 1) if interleaved else (j, j + R // 2)
        theta_j = inv_freq[j].item()
        z = torch.complex(out[..., ia], out[..., ib]) * torch.polar(torch.full_like(pos, att), pos * theta_j).unsqueeze(-1)
        out[..., ia], out[..., ib] = z.real, z.imag
    return out.to(x.dtype)
