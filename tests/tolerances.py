"""Every numerical tolerance of the test suite, stated once (DESIGN.md)."""

#: max abs error between two modes of an op or a mixer, in float64 (outputs and gradients are O(1))
F64_ATOL = 1e-9
#: relative error between two modes in float32: max|a - b| / max|b|
F32_RTOL = 1e-4
#: DSF identities (Lemma 2 embedding, converters) in float64
DSF_ATOL = 1e-12


def max_abs(a, b) -> float:
    return float((a - b).detach().abs().max())


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (the float32 measure)."""
    a, b = a.detach(), b.detach()
    den = float(b.abs().max())
    return float((a - b).abs().max()) / max(den, 1e-30)
