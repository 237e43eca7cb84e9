"""Random selective-scan operands shared by the scan tests (tests/test_selective_scan.py, tests/test_cpp_scan.py)."""

import torch


def make(B=2, T=13, D=3, N=4, per_channel=False, dtype=torch.float64, seed=0, B_channels=None, C_channels=None):
    """x, delta [B, T, D]; A [D, N] (< 0); B, C [B, T, N] or per channel [B, T, D, N] (``per_channel`` for
    both, ``B_channels`` / ``C_channels`` for each); D [D]; h0 [B, D, N]. All leaves with grad, drawn in
    float64 and cast to ``dtype``."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)

    x = r(B, T, D)
    delta = (torch.rand(B, T, D, generator=g, dtype=torch.float64) * 0.5).to(dtype).requires_grad_(True)
    A = (-torch.rand(D, N, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_(True)
    b_ch = per_channel if B_channels is None else B_channels
    c_ch = per_channel if C_channels is None else C_channels
    Bm = r(*((B, T, D, N) if b_ch else (B, T, N)))
    Cm = r(*((B, T, D, N) if c_ch else (B, T, N)))
    return dict(x=x, delta=delta, A=A, B=Bm, C=Cm, D=r(D), h0=r(B, D, N))
