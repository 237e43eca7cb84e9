"""The Dynamical Systems Framework (DSF) object: a float64 theory object, not a fast path.

DSF paper (seed 000), eq. (11)-(12):

    h_i = Λ_i h_{i-1} + B_i u_i,        y_i = C_i h_i + D_i u_i,        h_{-1} = 0
    y = Φ u,   Φ[i, j] = C_i (Λ_i Λ_{i-1} ⋯ Λ_{j+1}) B_j  (j < i),   Φ[i, i] = C_i B_i + D_i

with a diagonal Λ_i (the DSF paper's assumption), or, beyond the paper, a
diagonal-plus-low-rank one, Λ_i = diag(lam_i) + U_i W_iᵀ (the delta-rule mixers: DeltaNet,
Gated DeltaNet, KDA), or a dense one (:meth:`DSF.from_dense`). The diagonal case keeps its
fast paths; the others step through the products of transitions explicitly.
Shapes (a leading batch dimension is always present):

    lam  [batch, T, N]           the diagonal of Λ_i, or its diagonal part (may exceed 1: attention's Λ does)
    U, W [batch, T, N, r]        the low-rank part of Λ_i (None: diagonal)
    B    [batch, T, N, d_in]
    C    [batch, T, d_out, N]
    D    [batch, T, d_out, d_in] or None

Time runs 0..T-1 (the paper's ambiguity A1). Everything is stored in float64 (or
complex128 for complex systems such as S4D, whose outputs are the real part,
``real_output=True``).

State layout of :meth:`DSF.from_recurrence` (the paper's channel-major layout,
dsf note §2.1): the op-level state of head h is S^h ∈ R^{K×V}; the DSF state is
h = vec over heads of vec(S^h), column-stacked, so entry (h, v, k) sits at index
(h·V + v)·K + k: each value channel owns K consecutive state entries. With this
layout B_i = I_V ⊗ k_i and C_i = I_V ⊗ q_iᵀ per head, as in the paper's (15b-c).
"""

from __future__ import annotations

import torch

from ._checks import check_tensor, fmt_shape

_WHERE = "DSF"


def _to64(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.complex128 if x.is_complex() else torch.float64)


def _key_log_decay(g, shape: tuple, name: str, where: str) -> torch.Tensor:
    """A key-wise log-decay [B, T, H, K] in float64 from ``g`` given per key [B, T, H, K], per
    head [B, T, H] (broadcast over K) or None (no decay: zeros)."""
    Bt, T, H, K = shape
    if g is None:
        return torch.zeros(Bt, T, H, K, dtype=torch.float64)
    g = _to64(g.detach())
    if g.shape not in ((Bt, T, H, K), (Bt, T, H)):
        raise ValueError(f"{where}: argument '{name}' must be [B, T, H, K] or [B, T, H], got {fmt_shape(g.shape)}")
    return g.unsqueeze(-1).expand(Bt, T, H, K) if g.dim() == 3 else g


class DSF:
    """A causal linear time-varying system (DSF eq. 11) with a diagonal transition, or a
    diagonal-plus-low-rank one Λ_i = diag(lam_i) + U_i W_iᵀ (``U``, ``W`` [batch, T, N, r])."""

    def __init__(self, lam, B, C, D=None, *, U=None, W=None, real_output: bool | None = None):
        lam = check_tensor("lam", lam, rank=(2, 3), layout="[batch, T, N]", complex_ok=True, where=_WHERE)
        B = check_tensor("B", B, rank=(3, 4), layout="[batch, T, N, d_in]", complex_ok=True, where=_WHERE)
        C = check_tensor("C", C, rank=(3, 4), layout="[batch, T, d_out, N]", complex_ok=True, where=_WHERE)
        if lam.dim() == 2:  # unbatched
            lam, B, C = lam.unsqueeze(0), B.unsqueeze(0), C.unsqueeze(0)
            D = D.unsqueeze(0) if D is not None else None
            U, W = (t.unsqueeze(0) if isinstance(t, torch.Tensor) and t.dim() == 3 else t for t in (U, W))
        bt, T, N = lam.shape
        if B.dim() != 4 or B.shape[:3] != (bt, T, N):
            raise ValueError(f"{_WHERE}: argument 'B' must have shape [batch, T, N, d_in] = [{bt}, {T}, {N}, ?], got {fmt_shape(B.shape)}")
        d_in = B.shape[-1]
        if C.dim() != 4 or C.shape[:2] != (bt, T) or C.shape[-1] != N:
            raise ValueError(f"{_WHERE}: argument 'C' must have shape [batch, T, d_out, N] = [{bt}, {T}, ?, {N}], got {fmt_shape(C.shape)}")
        d_out = C.shape[2]
        if D is not None:
            check_tensor("D", D, rank=4, layout="[batch, T, d_out, d_in]", complex_ok=True, where=_WHERE)
            if D.shape != (bt, T, d_out, d_in):
                raise ValueError(f"{_WHERE}: argument 'D' must have shape [batch, T, d_out, d_in] = {fmt_shape((bt, T, d_out, d_in))}, got {fmt_shape(D.shape)}")
        self.lam, self._B, self._C = _to64(lam), _to64(B), _to64(C)
        self._make_B = self._make_C = None
        self._set_low_rank(U, W)
        self._d_in, self._d_out = d_in, d_out
        self.D = _to64(D) if D is not None else None
        is_complex = any(t is not None and t.is_complex() for t in (self.lam, self._B, self._C, self.D))
        self.real_output = is_complex if real_output is None else real_output

    def _set_low_rank(self, U, W, *, make_UW=None, rank: int | None = None, eig=None):
        """Stores U, W (or a function building them on first access) and an optional exact
        eigenvalue function (a structured shortcut for :meth:`eigenvalues`)."""
        self._U = self._W = None
        self._make_UW, self._rank, self._eig = make_UW, rank, eig
        if (U is None) != (W is None):
            raise ValueError(f"{_WHERE}: arguments 'U' and 'W' (Λ_i = diag(lam_i) + U_i W_iᵀ) go together; got only one")
        if U is not None:
            bt, T, N = self.lam.shape
            for name, t in (("U", U), ("W", W)):
                check_tensor(name, t, rank=4, layout="[batch, T, N, r]", complex_ok=True, where=_WHERE)
                if t.shape[:3] != (bt, T, N) or t.shape != U.shape:
                    raise ValueError(
                        f"{_WHERE}: arguments 'U' and 'W' must both have shape [batch, T, N, r] = [{bt}, {T}, {N}, r], "
                        f"got {fmt_shape(U.shape)} and {fmt_shape(W.shape)}"
                    )
            self._U, self._W, self._rank = _to64(U), _to64(W), U.shape[-1]

    @property
    def is_diagonal(self) -> bool:
        """Whether Λ_i is diagonal (the DSF paper's form; then ``lam`` is all of it)."""
        return self._U is None and self._make_UW is None

    @property
    def U(self) -> torch.Tensor | None:
        """[batch, T, N, r]: Λ_i = diag(lam_i) + U_i W_iᵀ; None for a diagonal system."""
        if self._U is None and self._make_UW is not None:
            U, W = self._make_UW()
            self._U, self._W, self._make_UW = _to64(U), _to64(W), None
        return self._U

    @property
    def W(self) -> torch.Tensor | None:
        """[batch, T, N, r] (see :attr:`U`)."""
        self.U
        return self._W

    def transition(self) -> torch.Tensor:
        """The dense Λ_i [batch, T, N, N] (for inspection; O(T·N²) memory)."""
        L = torch.diag_embed(self.lam)
        if not self.is_diagonal:
            L = L.to(torch.promote_types(L.dtype, self.U.dtype)) + self.U @ self.W.transpose(-1, -2)
        return L

    def eigenvalues(self) -> torch.Tensor:
        """The eigenvalues of each Λ_i, [batch, T, N] (complex128 for a non-diagonal system; the
        diagonal itself for a diagonal one). Systems built by :meth:`from_delta_rule` use their
        block structure (K×K blocks); others the dense Λ_i."""
        if self.is_diagonal:
            return self.lam
        if self._eig is not None:
            return self._eig()
        return torch.linalg.eigvals(self.transition())

    def _apply(self, i: int, X: torch.Tensor) -> torch.Tensor:
        """Λ_i X for X [batch, N, m]."""
        Y = self.lam[:, i].unsqueeze(-1) * X
        if not self.is_diagonal:
            Y = Y + self.U[:, i] @ (self.W[:, i].transpose(-1, -2) @ X)
        return Y

    @classmethod
    def _deferred(cls, lam, make_B, make_C, *, d_in: int, d_out: int, complex_bc: bool, D=None) -> "DSF":
        """A system whose B and C are built on first access by ``make_B()`` / ``make_C()``
        (dense [batch, T, N, d_in] tensors can be large: ``dsf(x).lam`` alone stays cheap).
        ``complex_bc``: whether they will be complex (for ``real_output``)."""
        self = cls.__new__(cls)
        self.lam = _to64(lam)
        bt, T, _ = self.lam.shape
        if D is not None:
            check_tensor("D", D, rank=4, layout="[batch, T, d_out, d_in]", complex_ok=True, where=_WHERE)
            if D.shape != (bt, T, d_out, d_in):
                raise ValueError(f"{_WHERE}: argument 'D' must have shape [batch, T, d_out, d_in] = {fmt_shape((bt, T, d_out, d_in))}, got {fmt_shape(D.shape)}")
        self._B = self._C = None
        self._make_B, self._make_C = make_B, make_C
        self._set_low_rank(None, None)
        self._d_in, self._d_out = d_in, d_out
        self.D = _to64(D) if D is not None else None
        self.real_output = complex_bc or self.lam.is_complex() or (self.D is not None and self.D.is_complex())
        return self

    @property
    def B(self) -> torch.Tensor:
        """[batch, T, N, d_in] (built on first access for systems made by :meth:`from_recurrence`)."""
        if self._B is None:
            self._B, self._make_B = _to64(self._make_B()), None
        return self._B

    @property
    def C(self) -> torch.Tensor:
        """[batch, T, d_out, N] (built on first access for systems made by :meth:`from_recurrence`)."""
        if self._C is None:
            self._C, self._make_C = _to64(self._make_C()), None
        return self._C

    # -- sizes ------------------------------------------------------------------------

    @property
    def batch(self) -> int:
        return self.lam.shape[0]

    @property
    def T(self) -> int:
        return self.lam.shape[1]

    @property
    def N(self) -> int:
        """Hidden-state size N of the DSF (the paper's N = n·d for attention and SSMs)."""
        return self.lam.shape[2]

    @property
    def d_in(self) -> int:
        return self._d_in

    @property
    def d_out(self) -> int:
        return self._d_out

    def __repr__(self) -> str:
        kind = "complex" if self.lam.is_complex() else "real"
        lr = "" if self.is_diagonal else f", Λ = diag + rank {self._rank}"
        return f"DSF(batch={self.batch}, T={self.T}, N={self.N}, d_in={self.d_in}, d_out={self.d_out}, {kind}, D={'yes' if self.D is not None else 'no'}{lr})"

    # -- evaluation ----------------------------------------------------------------------

    def _out(self, y: torch.Tensor) -> torch.Tensor:
        return y.real if (self.real_output and y.is_complex()) else y

    def evaluate(self, u: torch.Tensor, h0: torch.Tensor | None = None, *, return_states: bool = False):
        """Runs the recurrence (11) on u [batch, T, d_in] (or [T, d_in]); returns y [batch, T, d_out]
        (and the states [batch, T, N] if ``return_states``)."""
        u = check_tensor("u", u, rank=(2, 3), layout="[batch, T, d_in]", complex_ok=True, where=f"{_WHERE}.evaluate")
        if u.dim() == 2:
            u = u.unsqueeze(0)
        if u.shape[1:] != (self.T, self.d_in) or u.shape[0] not in (1, self.batch):
            raise ValueError(
                f"{_WHERE}.evaluate: argument 'u' must have shape [batch, T, d_in] = [{self.batch}, {self.T}, {self.d_in}], got {fmt_shape(u.shape)}"
            )
        u = _to64(u).expand(self.batch, -1, -1)
        dt = u.dtype
        for t in (self.lam, self.B, self.C, self.D):
            if t is not None:
                dt = torch.promote_types(dt, t.dtype)
        if not self.is_diagonal:
            dt = torch.promote_types(dt, self.U.dtype)
        lam, Bm, Cm = self.lam.to(dt), self.B.to(dt), self.C.to(dt)
        Um = self.U.to(dt) if not self.is_diagonal else None
        Wm = self.W.to(dt).transpose(-1, -2) if not self.is_diagonal else None
        Dm = self.D.to(dt) if self.D is not None else None
        u = u.to(dt)
        h = torch.zeros(self.batch, self.N, dtype=dt, device=self.lam.device)
        if h0 is not None:
            h = h + _to64(h0)
        ys, hs = [], []
        for i in range(self.T):
            hn = lam[:, i] * h + (Bm[:, i] @ u[:, i].unsqueeze(-1)).squeeze(-1)
            if Um is not None:
                hn = hn + (Um[:, i] @ (Wm[:, i] @ h.unsqueeze(-1))).squeeze(-1)
            h = hn
            y = (Cm[:, i] @ h.unsqueeze(-1)).squeeze(-1)
            if Dm is not None:
                y = y + (Dm[:, i] @ u[:, i].unsqueeze(-1)).squeeze(-1)
            ys.append(y)
            hs.append(h)
        y = self._out(torch.stack(ys, 1))
        return (y, torch.stack(hs, 1)) if return_states else y

    def blocks(self) -> torch.Tensor:
        """Φ as blocks [batch, T, T, d_out, d_in]: Φ[:, i, j] = C_i (Λ_i ⋯ Λ_{j+1}) B_j for j <= i.

        The product of transitions is accumulated in the exact order Λ_{j+1}, Λ_{j+2}, …
        (no division, so Λ = 0 is fine). A non-diagonal Λ_i is applied to Λ_{i-1} ⋯ B_j as
        diag(lam_i) X + U_i (W_iᵀ X), never formed."""
        T = self.T
        out = torch.zeros(self.batch, T, T, self.d_out, self.d_in, dtype=torch.promote_types(self.C.dtype, self.B.dtype))
        if not self.is_diagonal:
            out = out.to(torch.promote_types(out.dtype, self.U.dtype))
            for j in range(T):
                X = self.B[:, j].to(out.dtype)  # [batch, N, d_in]
                for i in range(j, T):
                    if i > j:
                        X = self._apply(i, X)
                    out[:, i, j] = self.C[:, i] @ X
        ones = torch.ones_like(self.lam[:, :1])
        for j in range(T if self.is_diagonal else 0):
            # prods[:, i - j] = Λ_{j+1} ⋯ Λ_i (the empty product for i = j)
            prods = torch.cat([ones, torch.cumprod(self.lam[:, j + 1 :], dim=1)], dim=1)  # [batch, T-j, N]
            out[:, j:, j] = self.C[:, j:] @ (prods.unsqueeze(-1) * self.B[:, j].unsqueeze(1))
        if self.D is not None:
            idx = torch.arange(T)
            out[:, idx, idx] = out[:, idx, idx] + self.D
        return self._out(out)

    def phi(self) -> torch.Tensor:
        """The (T·d_out) × (T·d_in) block-lower-triangular map Φ of eq. (12), time-major
        (y stacked as [y_0; y_1; …]): [batch, T·d_out, T·d_in]."""
        b = self.blocks()
        return b.permute(0, 1, 3, 2, 4).reshape(self.batch, self.T * self.d_out, self.T * self.d_in)

    # -- Lemma 2 and composition -------------------------------------------------------

    def embed(self, N_bar: int, *, lam_extra=None, B_extra=None, seed: int = 0) -> "DSF":
        """Lemma 2 (DSF paper, Appendix D): a system of state size N_bar >= N reproducing this one.

        Λ' = diag(Λ, Λ̂), B' = [B; B̄], C' = [C, 0], D' = D. The added states evolve
        independently of the output; Λ̂ [batch, T, N_bar - N] and B̄ [batch, T, N_bar - N, d_in]
        default to random values (seeded) to show that they are arbitrary. The
        paper's lower-left block Λ̄ is taken as 0 to keep Λ' diagonal (its ambiguity A25).
        """
        if not isinstance(N_bar, int) or N_bar < self.N:
            raise ValueError(f"{_WHERE}.embed: argument 'N_bar' must be an integer >= N = {self.N}, got {N_bar!r}")
        extra = N_bar - self.N
        g = torch.Generator().manual_seed(seed)
        if lam_extra is None:
            lam_extra = torch.rand(self.batch, self.T, extra, generator=g, dtype=torch.float64)
        if B_extra is None:
            B_extra = torch.randn(self.batch, self.T, extra, self.d_in, generator=g, dtype=torch.float64)
        lam_extra, B_extra = _to64(torch.as_tensor(lam_extra)), _to64(torch.as_tensor(B_extra))
        if lam_extra.shape != (self.batch, self.T, extra) or B_extra.shape != (self.batch, self.T, extra, self.d_in):
            raise ValueError(
                f"{_WHERE}.embed: 'lam_extra' must be [batch, T, N_bar - N] = {fmt_shape((self.batch, self.T, extra))} and "
                f"'B_extra' [batch, T, N_bar - N, d_in] = {fmt_shape((self.batch, self.T, extra, self.d_in))}, "
                f"got {fmt_shape(lam_extra.shape)} and {fmt_shape(B_extra.shape)}"
            )
        C_extra = torch.zeros(self.batch, self.T, self.d_out, extra, dtype=self.C.dtype)
        U = W = None
        if not self.is_diagonal:  # the added states do not feed the low-rank part: zero rows
            U, W = (torch.cat([t, t.new_zeros(self.batch, self.T, extra, t.shape[-1])], -2) for t in (self.U, self.W))
        return DSF(
            torch.cat([self.lam, lam_extra.to(self.lam.dtype)], -1),
            torch.cat([self.B, B_extra.to(self.B.dtype)], -2),
            torch.cat([self.C, C_extra], -1),
            self.D,
            U=U, W=W,
            real_output=self.real_output,
        )

    def compose(self, in_proj: torch.Tensor | None = None, out_proj: torch.Tensor | None = None) -> "DSF":
        """Absorbs linear maps around the system: u = in_proj · x and y' = out_proj · y.

        in_proj [d_in, d_x] gives B' = B · in_proj (e.g. the W_V of DSF eq. 15b);
        out_proj [d_y, d_out] gives C' = out_proj · C (an output projection W_O)."""
        B, C, D = self.B, self.C, self.D
        if in_proj is not None:
            W = _to64(in_proj.detach())
            if W.dim() != 2 or W.shape[0] != self.d_in:
                raise ValueError(f"{_WHERE}.compose: argument 'in_proj' must be [d_in={self.d_in}, d_x], got {fmt_shape(W.shape)}")
            B = B @ W.to(torch.promote_types(W.dtype, B.dtype))
            D = D @ W.to(torch.promote_types(W.dtype, D.dtype)) if D is not None else None
        if out_proj is not None:
            W = _to64(out_proj.detach())
            if W.dim() != 2 or W.shape[1] != self.d_out:
                raise ValueError(f"{_WHERE}.compose: argument 'out_proj' must be [d_y, d_out={self.d_out}], got {fmt_shape(W.shape)}")
            C = W.to(torch.promote_types(W.dtype, C.dtype)) @ C
            D = W.to(torch.promote_types(W.dtype, D.dtype)) @ D if D is not None else None
        return DSF(self.lam, B, C, D, U=self.U, W=self.W, real_output=self.real_output)

    # -- converters to and from the op-level form ---------------------------------------------

    @classmethod
    def from_recurrence(cls, q, k, value_dim: int, gk=None, gv=None, *, scale: float = 1.0, D=None) -> "DSF":
        """The DSF of ``linear_recurrence`` (zero initial state): input v, output o.

        q, k [B, T, H, K]; gk [B, T, H, K] or [B, T, H] or None; gv [B, T, H, V] or None;
        value_dim = V. The input u_t is v_t flattened over heads ([B, T, H·V], head-major)
        and the output is o_t flattened the same way. Log-decays may be positive here
        (Λ > 1 is allowed in the theory object). State layout: see the module docstring.
        Optional D [B, T, H·V, H·V] adds a skip term.
        """
        where = f"{_WHERE}.from_recurrence"
        check_tensor("q", q, rank=4, layout="[B, T, H, K]", complex_ok=True, where=where)
        check_tensor("k", k, rank=4, layout="[B, T, H, K]", complex_ok=True, where=where)
        if k.shape != q.shape:
            raise ValueError(f"{where}: argument 'k' must have the shape of q {fmt_shape(q.shape)}, got {fmt_shape(k.shape)}")
        Bt, T, H, K = q.shape
        V = int(value_dim)
        q, k = _to64(q.detach()), _to64(k.detach())
        logk = _key_log_decay(gk, (Bt, T, H, K), "gk", where)
        logv = torch.zeros(Bt, T, H, V, dtype=torch.float64)
        if gv is not None:
            gv = _to64(gv.detach())
            if gv.shape != (Bt, T, H, V):
                raise ValueError(f"{where}: argument 'gv' must be [B, T, H, V] = {fmt_shape((Bt, T, H, V))}, got {fmt_shape(gv.shape)}")
            logv = gv
        # entry (h, v, k) at index (h·V + v)·K + k
        lam = (logv.unsqueeze(-1) + logk.unsqueeze(-2)).exp().reshape(Bt, T, H * V * K)
        eye_h = torch.eye(H, dtype=torch.float64)
        eye_v = torch.eye(V, dtype=torch.float64)

        def make_B():  # B[t, (h, v, k), (h', v')] = k[t, h, k] δ_hh' δ_vv'
            return torch.einsum("btha,hg,vw->bthvagw", k, eye_h.to(k.dtype), eye_v.to(k.dtype)).reshape(Bt, T, H * V * K, H * V)

        def make_C():  # C[t, (h', v'), (h, v, k)] = scale · q[t, h, k] δ_hh' δ_vv'
            return torch.einsum("btha,hg,vw->btgwhva", q * scale, eye_h.to(q.dtype), eye_v.to(q.dtype)).reshape(Bt, T, H * V, H * V * K)

        # B and C are dense [batch, T, N, H·V] Kronecker products: built on first use, so that
        # reading Λ (dsf(x).lam, Mixer.decays) costs O(T·N) at any width
        return cls._deferred(lam, make_B, make_C, d_in=H * V, d_out=H * V, complex_bc=q.is_complex() or k.is_complex(), D=D)

    @classmethod
    def from_dense(cls, Lam, B, C, D=None, *, real_output: bool | None = None) -> "DSF":
        """A system with a dense transition Lam [batch, T, N, N] (stored as 0 + Lam · Iᵀ, so every
        method of the diagonal-plus-low-rank form applies unchanged)."""
        Lam = check_tensor("Lam", Lam, rank=4, layout="[batch, T, N, N]", complex_ok=True, where=f"{_WHERE}.from_dense")
        if Lam.shape[-1] != Lam.shape[-2]:
            raise ValueError(f"{_WHERE}.from_dense: argument 'Lam' must be square in its last two dimensions [batch, T, N, N], got {fmt_shape(Lam.shape)}")
        bt, T, N, _ = Lam.shape
        eye = torch.eye(N, dtype=torch.float64).expand(bt, T, N, N)
        return cls(torch.zeros(bt, T, N, dtype=torch.float64), B, C, D, U=Lam, W=eye, real_output=real_output)

    @classmethod
    def from_delta_rule(cls, q, k, beta, value_dim: int, g=None, *, scale: float = 1.0, a=None, b=None) -> "DSF":
        """The DSF of ``seqmix.ops.delta_rule`` (zero initial state): input v, output o.

        q, k [B, T, H, K]; beta [B, T, H]; g (log α) [B, T, H], [B, T, H, K] or None;
        value_dim = V. Layout as :meth:`from_recurrence` (entry (h, v, k) at (h·V + v)·K + k).
        Per head and value channel the state is one column of S, and the delta rule's
        transition is the K×K block M_i = (I − β_i k_iᵀk_i) Diag(α_i) = Diag(α_i) − (β_i k_i)ᵀ(α_i ⊙ k_i):

            lam_i = α_i,   U_i = −I_V ⊗ β_i k_iᵀ,   W_i = I_V ⊗ (α_i ⊙ k_i)ᵀ   (rank H·V),
            B_i = I_V ⊗ β_i k_iᵀ,   C_i = scale · I_V ⊗ q_i.

        So Λ_i is block diagonal with H·V blocks, identical over the V channels of a head.
        :meth:`eigenvalues` uses the blocks: for a scalar α (or none) the closed form α (K − 1 times)
        and α(1 − β‖k‖²); for a key-wise α, ``torch.linalg.eigvals`` of each K×K block.

        With the general rank-one pair a, b [B, T, H, K] of ``delta_rule`` (either may be None: −βk, k)
        the block is M_i = (I + a_iᵀb_i) Diag(α_i): U_i = I_V ⊗ a_iᵀ, W_i = I_V ⊗ (α_i ⊙ b_i)ᵀ (RWKV-7, Comba).
        """
        where = f"{_WHERE}.from_delta_rule"
        check_tensor("q", q, rank=4, layout="[B, T, H, K]", where=where)
        check_tensor("k", k, rank=4, layout="[B, T, H, K]", where=where)
        if k.shape != q.shape:
            raise ValueError(f"{where}: argument 'k' must have the shape of q {fmt_shape(q.shape)}, got {fmt_shape(k.shape)}")
        Bt, T, H, K = q.shape
        V = int(value_dim)
        check_tensor("beta", beta, rank=3, layout="[B, T, H]", where=where)
        if beta.shape != (Bt, T, H):
            raise ValueError(f"{where}: argument 'beta' must be [B, T, H] = {fmt_shape((Bt, T, H))}, got {fmt_shape(beta.shape)}")
        for name, t in (("a", a), ("b", b)):
            if t is not None and tuple(t.shape) != (Bt, T, H, K):
                raise ValueError(f"{where}: argument '{name}' must be [B, T, H, K] = {fmt_shape((Bt, T, H, K))}, got {fmt_shape(t.shape)}")
        tied = a is None and b is None
        q, k, beta = _to64(q.detach()), _to64(k.detach()), _to64(beta.detach())
        logk = _key_log_decay(g, (Bt, T, H, K), "g", where)
        alpha = logk.exp()
        bk = beta.unsqueeze(-1) * k
        ra = -bk if a is None else _to64(a.detach())
        rb = k if b is None else _to64(b.detach())
        system = cls.from_recurrence(q, bk, V, logk, scale=scale)
        eye_h, eye_v = torch.eye(H, dtype=torch.float64), torch.eye(V, dtype=torch.float64)

        def kron(x):  # [B, T, H, K] -> [B, T, H·V·K, H·V]: x[t, h, k] δ_hh' δ_vv' (as B of from_recurrence)
            return torch.einsum("btha,hg,vw->bthvagw", x, eye_h, eye_v).reshape(Bt, T, H * V * K, H * V)

        def make_UW():
            return kron(ra), kron(alpha * rb)

        scalar_alpha = tied and (g is None or g.dim() == 3)

        def eig():
            if scalar_alpha:  # α(I − β kᵀk) is symmetric: α (K − 1 times) and α(1 − β‖k‖²) along k, exactly
                a = alpha[..., :1]
                along = a * (1 - beta.unsqueeze(-1) * (k * k).sum(-1, keepdim=True))
                ev = torch.cat([a.expand(Bt, T, H, K - 1), along], -1).to(torch.complex128)
            else:
                M = torch.diag_embed(alpha) + ra.unsqueeze(-1) * (alpha * rb).unsqueeze(-2)  # [B, T, H, K, K]
                ev = torch.linalg.eigvals(M)
            ev = torch.gather(ev, -1, torch.argsort(ev.abs(), dim=-1, descending=True, stable=True))  # by magnitude: smooth trajectories
            return ev.unsqueeze(3).expand(Bt, T, H, V, K).reshape(Bt, T, H * V * K)

        system._set_low_rank(None, None, make_UW=make_UW, rank=H * V, eig=eig)
        return system

    @classmethod
    def from_separable(cls, q_feat, k_feat, eta, value_dim: int) -> "DSF":
        """Separable attention (DSF eq. 13-15, the corrected 15b of Appendix B), per head.

        q_feat = φ(q), k_feat = ψ(k): [B, T, H, n]; eta: [B, T, H] (> 0), the normalizer η_i.
            Λ_i = (η_{i-1} / η_i) I,   B_i = (1/η_i) I_V ⊗ ψ(k_i),   C_i = I_V ⊗ φ(q_i)ᵀ
        with η_{-1} = 1 (it multiplies h_{-1} = 0). Input: the values v (W_V u, see :meth:`compose`);
        the map is Φ[i, j] = φ(q_i)ᵀψ(k_j)/η_i per head (Appendix G for several heads).
        """
        where = f"{_WHERE}.from_separable"
        eta = _to64(eta.detach())
        if eta.shape != q_feat.shape[:3]:
            raise ValueError(f"{where}: argument 'eta' must be [B, T, H] = {fmt_shape(q_feat.shape[:3])}, got {fmt_shape(eta.shape)}")
        if bool((eta <= 0).any()):
            raise ValueError(f"{where}: argument 'eta' (the normalizer) must be > 0")
        log_eta = eta.log()
        log_prev = torch.cat([torch.zeros_like(log_eta[:, :1]), log_eta[:, :-1]], dim=1)
        return cls.from_recurrence(q_feat, _to64(k_feat.detach()) / eta.unsqueeze(-1), value_dim, gk=log_prev - log_eta)

    def to_recurrence(self, heads: int, key_dim: int, *, atol: float = 1e-10) -> dict:
        """Inverse of :meth:`from_recurrence` for systems of that structure.

        Returns dict(q [B,T,H,K], k [B,T,H,K], gk [B,T,H,K], gv [B,T,H,V]) (log-decays, factored
        so that gv[..., 0] = 0). Raises ValueError if B, C or Λ do not have the Kronecker structure.
        """
        where = f"{_WHERE}.to_recurrence"
        H, K = heads, key_dim
        if not self.is_diagonal:
            raise ValueError(f"{where}: the system's Λ_i is not diagonal; a linear recurrence has a diagonal one")
        if self.N % (H * K) or self.d_in != self.d_out or self.d_in * K != self.N or self.d_in % H:
            raise ValueError(
                f"{where}: a system with N={self.N}, d_in={self.d_in}, d_out={self.d_out} is not of the form "
                f"N = H·V·K, d_in = d_out = H·V for heads={H}, key_dim={K}"
            )
        if self.D is not None:
            raise ValueError(f"{where}: the system has a D term; the recurrence form has none")
        V = self.d_in // H
        Bt, T = self.batch, self.T
        Bm = self.B.reshape(Bt, T, H, V, K, H, V)
        Cm = self.C.reshape(Bt, T, H, V, H, V, K)
        k = torch.diagonal(Bm[:, :, :, 0, :, :, 0], dim1=2, dim2=4).permute(0, 1, 3, 2)  # [Bt,T,H,K]
        q = torch.diagonal(Cm[:, :, :, 0, :, 0, :], dim1=2, dim2=3).permute(0, 1, 3, 2)
        log_lam = self.lam.log().reshape(Bt, T, H, V, K)
        gk = log_lam[:, :, :, 0, :]
        gv = log_lam[:, :, :, :, 0] - log_lam[:, :, :, :1, 0]
        rebuilt = DSF.from_recurrence(q, k, V, gk, gv)
        for name, a, b in (("B", rebuilt.B, self.B), ("C", rebuilt.C, self.C), ("lam", rebuilt.lam, self.lam)):
            if not torch.allclose(a, b, atol=atol, rtol=0):
                raise ValueError(f"{where}: '{name}' does not have the Kronecker structure of a linear recurrence")
        return dict(q=q, k=k, gk=gk, gv=gv)
