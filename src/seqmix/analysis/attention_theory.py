"""Theory tools for the attention family (DSF paper §3.2, §4.1-4.2; Lemma 1, Lemma 2; Appendix H).

    lemma1_study(mixer, x, orders)        softmax vs its degree-P Taylor-feature separable attention:
                                          max map / output error and the state size for each P
    lemma2_check(mixer, x, extra)         DSF.embed (Lemma 2) reproduces a finite-state mixer exactly
    eta_telescoping_error(mixer, x)       Π_{k=j+1}^{i} Λ_k B_j == (I_V ⊗ ψ(k_j)) W_V / η_i  (dsf note §8.3; relative error)
    normalized_attention_variants(...)    normalized attention with exp / softplus / sigmoid η, same weights
    normalization_study(x, ...)           a side-by-side summary of those variants (Table 2's comparison)

Everything runs in float64 on small inputs: these are checks of identities, not fast paths.
"""

from __future__ import annotations

import torch

from .._checks import check_positive_int
from ..dsf import DSF
from ..mixers import Mixer, build_mixer, list_mixers
from ..mixers.attention import INPUT_NORMALIZERS, SeparableAttention, SoftmaxAttention
from ..ops import recurrence_map, taylor_feature_dim

#: the largest feature tensors lemma1_study builds (bytes)
LEMMA1_MAX_BYTES = 2 * 2**30


def _bytes(n: float) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


# ------------------------------------------------------------------------------------------
# Lemma 1: softmax as the limit of Taylor-feature separable attention
# ------------------------------------------------------------------------------------------


def taylor_study_bytes(mixer: SoftmaxAttention, batch: int, T: int, order: int) -> int:
    """Bytes (float64) of the Taylor features φ_P(q), φ_P(k), their prefix sums and the map."""
    feats = batch * T * mixer.heads * taylor_feature_dim(mixer.head_qk, order)
    return 8 * (4 * feats + 2 * batch * mixer.heads * T * T)


def lemma1_study(mixer: SoftmaxAttention, x: torch.Tensor, orders=range(0, 7), *, max_bytes: int = LEMMA1_MAX_BYTES) -> list[dict]:
    """Lemma 1 measured: softmax attention vs the degree-P Taylor-feature separable attention.

    For each P in ``orders``: the Taylor map Φ_P[i, j] = φ_P(q_i)ᵀφ_P(k_j) / η_i with
    φ_P = concat_{p<=P} x^{⊗p}/sqrt(p!) and η_i = φ_P(q_i)ᵀ Σ_{j<=i} φ_P(k_j) (the same
    features as ``mixer.dsf(x, taylor_order=P)``), compared with the softmax map phi(x).

    Returns one dict per P: order, features_per_head (Σ_p K^p), state_size (floats of the
    recurrent state per sequence, heads·Σ_p K^p·(V + 1)), dsf_N (the DSF state size,
    d_model·Σ_p K^p), map_error (max |Φ_P - Φ_softmax|), output_error (max |Φ_P v - Φ v|).

    The state grows combinatorially: Σ_{p<=P} K^p = (K^{P+1} - 1)/(K - 1) features per head
    (the monomial basis of eq. 24 would need C(K+P, P)); softmax itself needs P = ∞.
    The error shrinks only once P exceeds the size of the scores s·qᵀk (the Taylor series'
    remainder is ~|qᵀk|^{P+1}/(P+1)!), so use inputs of moderate norm.
    Raises ValueError naming 'taylor_order' when an order would need more than ``max_bytes``.
    """
    if not isinstance(mixer, SoftmaxAttention):
        raise ValueError(f"lemma1_study: argument 'mixer' must be a softmax attention mixer, got {type(mixer).__name__}")
    mixer.check_input(x)
    if mixer.config.window is not None:
        raise ValueError(f"lemma1_study: Lemma 1 is about full causal softmax attention; the mixer has window = {mixer.config.window}")
    orders = list(orders)
    for P in orders:
        if isinstance(P, bool) or not isinstance(P, int) or P < 0:
            raise ValueError(f"lemma1_study: argument 'orders' must hold integers >= 0 (taylor_order), got {P!r}")
        need = taylor_study_bytes(mixer, x.shape[0], x.shape[1], P)
        if need > max_bytes:
            raise ValueError(
                f"lemma1_study: taylor_order = {P} is too large for memory: its features need {_bytes(need)} "
                f"({taylor_feature_dim(mixer.head_qk, P)} per head), more than max_bytes = {_bytes(max_bytes)}"
            )
    with torch.no_grad():
        values, mixed = mixer.core(x)
        phi = mixer.phi(x)
        rows = []
        for P in orders:
            fq, fk, eta = mixer.separable_parts(x, taylor_order=P)
            A = recurrence_map(fq, fk, check_values=False) / eta.transpose(1, 2).unsqueeze(-1)
            out = torch.einsum("bhts,bshv->bthv", A, values)
            n_P = taylor_feature_dim(mixer.head_qk, P)
            rows.append(dict(
                order=P,
                features_per_head=n_P,
                state_size=mixer.heads * n_P * (mixer.head_v + 1),
                dsf_N=mixer.d_model * n_P,
                map_error=float((A - phi).abs().max()),
                output_error=float((out - mixed).abs().max()),
            ))
    return rows


# ------------------------------------------------------------------------------------------
# Lemma 2: a larger state recovers a smaller one
# ------------------------------------------------------------------------------------------


def finite_state_attention_mixers() -> list[str]:
    """Registered names of the attention family with an exact finite-state DSF."""
    return [e.name for e in list_mixers() if e.family == "attention" and e.cls.finite_state]


def lemma2_check(mixer: Mixer, x: torch.Tensor, extra: int = 7, *, seed: int = 0) -> dict:
    """Lemma 2 (Appendix D) on a mixer: its DSF embedded into N + extra states
    (``DSF.embed``: random extra Λ̂, B̄, zero C columns) reproduces the mixer's core output.

    Returns dict(N, N_bar, error = max |embedded.evaluate(values) - mixed|,
    error_small = the same for the un-embedded system, extra_state_norm = max |h| of the
    added states, to show that they are not trivially zero)."""
    check_positive_int("extra", extra, "lemma2_check", minimum=0)
    if not mixer.finite_state:
        raise ValueError(f"lemma2_check: argument 'mixer' ({mixer.registry_name}) has no finite-state DSF")
    with torch.no_grad():
        values, mixed = mixer.core(x)
        system = mixer.dsf(x)
        big = system.embed(system.N + extra, seed=seed)
        B, T, M, P = values.shape
        u, y = values.reshape(B, T, M * P), mixed.reshape(B, T, M * P)
        y_big, h_big = big.evaluate(u, return_states=True)
        return dict(
            N=system.N,
            N_bar=big.N,
            error=float((y_big - y).abs().max()),
            error_small=float((system.evaluate(u) - y).abs().max()),
            extra_state_norm=float(h_big[..., system.N:].abs().max()) if extra else 0.0,
        )


# ------------------------------------------------------------------------------------------
# the telescoping of η (dsf note §4.3, §8.3)
# ------------------------------------------------------------------------------------------


def transition_products(system: DSF) -> torch.Tensor:
    """[batch, T, T, N, d_in]: entry (i, j) = (Λ_i ⋯ Λ_{j+1}) B_j for j <= i, 0 above the diagonal:
    the blocks of the same system read out with C_i = I_N (DSF.blocks multiplies the
    transitions in order, without division)."""
    eye = torch.eye(system.N, dtype=system.C.dtype).expand(system.batch, system.T, system.N, system.N)
    return DSF(system.lam, system.B, eye, real_output=False).blocks()


def eta_telescoping_error(mixer: Mixer, x: torch.Tensor, system: DSF | None = None, **dsf_kwargs) -> float:
    """Max |Π_{k=j+1}^{i} Λ_k B_j - (I_V ⊗ ψ(k_j)) W_V / η_i| over j <= i, relative to the largest entry of
    the right side (feature maps of different scales, ReBased's squares among them, compare alike).

    In separable attention η is a scalar per head, so the transitions telescope:
    Π Λ_k = η_j/η_i and B_j = (I_V ⊗ ψ(k_j)) W_V / η_j leave 1/η_i (DSF paper §4.2).
    The left side is read from ``mixer.dsf(x)`` (or ``system``, e.g. a deliberately wrong
    one); the right side is built from ``mixer.separable_parts(x)`` with an unnormalized
    Kronecker input matrix. W_V is included when the mixer has no bias (projections=True).
    ``dsf_kwargs`` go to dsf and separable_parts (e.g. taylor_order for softmax attention)."""
    if not hasattr(mixer, "separable_parts"):
        raise ValueError(f"eta_telescoping_error: argument 'mixer' ({type(mixer).__name__}) is not a separable attention")
    projections = not mixer.config.bias
    with torch.no_grad():
        fq, fk, eta = mixer.separable_parts(x, **dsf_kwargs)
        if system is None:
            system = mixer.dsf(x, projections=projections, **dsf_kwargs)
        lhs = transition_products(system)
        raw = DSF.from_recurrence(fq, fk, value_dim=mixer.head_v)  # B_j = I_V ⊗ ψ(k_j), no η
        if projections:
            raw = raw.compose(in_proj=mixer.W_v.weight)
        # η per state: head h owns states [h·V·n, (h+1)·V·n)
        eta_state = eta.double().repeat_interleave(raw.N // mixer.heads, dim=-1)  # [b, T, N]
        rhs = raw.B.unsqueeze(1) / eta_state.unsqueeze(2).unsqueeze(-1)  # [b, i, j, N, d]
        causal = torch.ones(system.T, system.T, dtype=torch.bool).tril().view(1, system.T, system.T, 1, 1)
        zero = torch.zeros((), dtype=lhs.dtype)
        err = torch.where(causal, lhs - rhs, zero).abs().max()
        return float(err / torch.where(causal, rhs, zero).abs().max().clamp_min(1e-300))


# ------------------------------------------------------------------------------------------
# the normalization study (Appendix H, Table 2)
# ------------------------------------------------------------------------------------------


def normalized_attention_variants(normalizers=INPUT_NORMALIZERS, *, seed: int = 0, base: str = "normalized_attention", **config) -> dict[str, SeparableAttention]:
    """The same normalized attention (eq. 22) with each η of ``normalizers`` (by name: 'exp'
    (22), 'softplus' (29), 'sigmoid' (30)), all with identical weights (W_qk, W_v, W_o, W_η):
    only the normalization function differs, as in the paper's Table 2."""
    names = list(normalizers)
    bad = [n for n in names if n not in INPUT_NORMALIZERS]
    if not names or bad:
        raise ValueError(
            f"normalized_attention_variants: argument 'normalizers' must name some of {', '.join(INPUT_NORMALIZERS)}; got unknown {bad or names!r}"
        )
    torch.manual_seed(seed)
    first = build_mixer(base, normalizer=names[0], **config)
    out = {names[0]: first}
    for name in names[1:]:
        m = build_mixer(base, normalizer=name, **config)
        m.load_state_dict(first.state_dict())
        out[name] = m
    return out


def normalization_study(x: torch.Tensor, normalizers=INPUT_NORMALIZERS, *, seed: int = 0, **config) -> list[dict]:
    """For each normalizer: the range of η, the largest transition max_i Λ_i = η_{i-1}/η_i (Λ > 1
    is possible: attention is not stable by construction, §4.2), and the output norm.
    x: [batch, T, d_model]; the mixers are float64 copies of :func:`normalized_attention_variants`."""
    rows = []
    for name, m in normalized_attention_variants(normalizers, seed=seed, d_model=x.shape[-1], **config).items():
        m = m.double()
        xd = x.double()
        with torch.no_grad():
            _, _, eta = m.separable_parts(xd)
            lam = m.dsf(xd).lam
            y = m(xd)
        rows.append(dict(
            normalizer=name,
            eta_min=float(eta.min()),
            eta_max=float(eta.max()),
            lambda_max=float(lam.max()),
            lambda_min=float(lam.min()),
            output_rms=float(y.pow(2).mean().sqrt()),
        ))
    return rows
