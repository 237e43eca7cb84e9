"""The Mesa layer (von Oswald et al. 2025, "MesaNet: Sequence Modeling by Locally Optimal Test-Time
Training"): online regularized least squares, solved for every query.

    H_t = γ_t H_{t-1} + β_t k_tᵀ k_t          ∈ R^{K×K}   (the keys' Gram matrix)
    G_t = γ_t G_{t-1} + β_t k_tᵀ v_t          ∈ R^{K×V}   (keys against values)
    q̃_t = (H_t + Diag(λ))⁻¹ q_t,   o_t = q̃_t G_t                      (paper eq. 5-7, row convention)

o_t is the prediction at q_t of the ridge regression of v on k over the (decayed, β-weighted) past.
As a DSF it is linear in v: G is :func:`~seqmix.ops.linear_recurrence`'s state (Λ_t = γ_t I,
B_t = β_t k_t) and the readout C_t = q̃_t = q_tᵀ(H_t + Diag λ)⁻¹ depends on the keys through H_t —
an input-dependent readout, not a new transition. λ [H, K] > 0 is a diagonal regularizer (the
paper's λI generalized per channel as flash-linear-attention does).

Shapes: q, k [B, T, H, K]; v [B, T, H, V]; beta [B, T, H]; g [B, T, H] (log γ <= 0) or None;
lamb [H, K]; state (G [B, H, K, V], H [B, H, K, K]).

The solve is a choice (``solver``):

* ``exact``: ``torch.linalg.solve`` per step (the reference solve);
* ``cg``: ``cg_steps`` steps of conjugate gradient (the paper's approximate solve; 30 in fla's
  layer), started from 0 (``cg_init="zero"``, fla's chunked training kernel) or from the Jacobi
  guess q / (diag H + λ) (``"jacobi"``, fla's one-step decoding kernel); the denominators carry
  ``cg_eps`` (fla: 1e-5; it also damps the last steps, so a converged CG sits ~eps away from
  the exact solve); a zero denominator gives a zero step, not 0/0.

Gradients (``backward``; chunk and parallel modes). "manual" (the default): the CG's gradient is
autograd's through its steps (the same computation as the forward) with one change of bookkeeping
(:class:`_CGSolve`): the gradient reaching H_t from the s-th step's product H_t p_s is the rank-one
du_s p_sᵀ, which autograd forms and adds as one [.., K, K] tensor per step; here the steps' p_s and
du_s stay K-vectors and Σ_s du_s p_sᵀ is one batched matmul at the end. The Gram matrices' gradient
is their recurrence's adjoint, written by hand (:class:`_GramChunks`). "autograd": plain autograd
through everything; float64 tests tie the two.

Modes (the same numbers for a given solver; tests tie each to ``recurrent``):

* ``recurrent``: the reference loop: update H and G, solve, read out (plain autograd).
* ``chunk``: every H_t chunkwise (:func:`gram_states`: within a chunk of C tokens
  H_t = e^{Γ_t} H_start + Σ_{s <= t} e^{Γ_t − Γ_s} β_s k_sᵀk_s, one [C, C] @ [C, K²] matmul of the
  decay mask against the outer products, chunks linked by a scan over their K×K start states), all
  solves at once (batched over t), then the output by ``linear_recurrence`` with q̃ as the query, in
  that mode. Memory O(T·K²) per head for the H_t of one call (the mixer runs a long forward in
  segments of its ``segment_len``: without gradients, one segment's H_t at a time). For the
  backward, per token and head, the "manual" gradients keep H_t (K² floats) and the CG's graph of
  K-vectors (about 3 per step); plain autograd keeps the outer products besides, and forms a K×K
  gradient per CG step.
* ``parallel``: the same with one chunk of T tokens (a [T, T] decay mask: memory O(T²)).
* ``step``: one token (T == 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_choice, check_finite, check_positive_int, check_shape, check_tensor, reads_values
from .autograd import first_order
from .precision import full_precision
from .recurrence import _check_qkv, _compute_dtype, _exp_where, linear_recurrence

MODES = ("recurrent", "chunk", "parallel", "step")
SOLVERS = ("exact", "cg")
CG_INITS = ("zero", "jacobi")
BACKWARDS = ("manual", "autograd")
GRAM_CHUNK = 64  # C of the Gram matrices' chunk form where chunk_size is None
_WHERE = "mesa_net"


def _div(a, b):
    """a / b, and 0 where b == 0 (a converged CG with cg_eps = 0: 0/0)."""
    nz = b != 0
    return torch.where(nz, a / torch.where(nz, b, torch.ones_like(b)), torch.zeros_like(a))


def _cg(Hm, q, lamb, steps, init, eps, taps=None):
    """``steps`` steps of CG on (Hm + Diag lamb) x = q, batched: Hm [N, K, K], q and lamb [N, K].

    ``taps`` (a dict, for :class:`_CGSolve`, Hm detached): every product Hm p and its p are recorded
    in taps["mv"] (and the Jacobi start's diag Hm, as a leaf, in taps["diag"]), so that autograd gives
    the adjoint of each product without differentiating through Hm."""

    def matvec(p):
        Hp = torch.bmm(Hm, p.unsqueeze(-1)).squeeze(-1)
        if taps is not None:
            taps["mv"].append((Hp, p))
        return Hp + lamb * p

    if init == "jacobi":
        d = torch.diagonal(Hm, dim1=-2, dim2=-1)
        if taps is not None:
            d = taps["diag"] = d.detach().clone().requires_grad_(True)
        x = q / (d + lamb)
        r = q - matvec(x)
    else:
        x = torch.zeros_like(q)
        r = q
    p = r
    delta = (r * r).sum(-1, keepdim=True)
    for _ in range(steps):
        Ap = matvec(p)
        alpha = _div(delta, (p * Ap).sum(-1, keepdim=True) + eps)
        x = x + alpha * p
        r = r - alpha * Ap
        delta_new = (r * r).sum(-1, keepdim=True)
        p = r + _div(delta_new, delta + eps) * p
        delta = delta_new
    return x


class _CGSolve(torch.autograd.Function):
    """x = CG(Hm, q, lamb) (:func:`_cg`) with autograd's gradient, dHm gathered (module docstring).

    Forward: the CG steps run with autograd on q and lamb only (Hm detached; each product
    u_s = Hm p_s recorded); that graph — K-vectors per step, and Hm itself, which the products
    read — is kept for the backward. Backward: autograd through it gives dq, dlamb and du_s (the
    products as inputs of ``torch.autograd.grad``), and dHm = Σ_s du_s p_sᵀ (+ Diag d(diag Hm) for
    the Jacobi start) in one bmm [N, K, S] @ [N, S, K]: the sum autograd forms step by step."""

    @staticmethod
    def forward(ctx, Hm, q, lamb, steps, init, eps):
        with torch.enable_grad():
            q_, lamb_ = q.detach().requires_grad_(True), lamb.detach().requires_grad_(True)
            taps = {"mv": [], "diag": None}
            x = _cg(Hm.detach(), q_, lamb_, steps, init, eps, taps)
        ctx.graph = (x, q_, lamb_, taps)
        return x.detach()

    @staticmethod
    @first_order("MesaNet's chunkwise Gram matrices", "backward='autograd'")
    def backward(ctx, dx):
        if ctx.graph is None:
            raise RuntimeError("mesa_solve: a second backward through the same CG solve (retain_graph=True) is not supported "
                               "with backward='manual', whose graph the first backward frees; use backward='autograd'")
        x, q_, lamb_, taps = ctx.graph
        ctx.graph = None  # the graph is freed by this backward (as autograd frees its own)
        us = [u for u, _ in taps["mv"]] + ([taps["diag"]] if taps["diag"] is not None else [])
        want_H = ctx.needs_input_grad[0]
        grads = torch.autograd.grad(x, [q_, lamb_] + (us if want_H else []), dx, allow_unused=True)
        dq, dlamb = grads[0], grads[1]
        dH = None
        if want_H:
            du = [torch.zeros_like(u) if gu is None else gu for u, gu in zip(us, grads[2:])]  # du_s (, d diag Hm)
            ps = [p.detach() for _, p in taps["mv"]]
            dH = torch.bmm(torch.stack(du[: len(ps)], -1), torch.stack(ps, -2))  # Σ_s du_s p_sᵀ [N, K, K]
            if taps["diag"] is not None:
                dH.diagonal(dim1=-2, dim2=-1).add_(du[-1])
        return dH, dq, dlamb, None, None, None


def mesa_solve(Hm, q, lamb, *, solver: str = "cg", cg_steps: int = 30, cg_init: str = "zero", cg_eps: float = 1e-5,
               backward: str = "manual"):
    """q̃ = (Hm + Diag(lamb))⁻¹ q. Hm [..., K, K] (symmetric), q [..., K] (Hm's leading dims), lamb
    broadcast to q ([H, K] against q [..., H, K]). ``backward``: the CG's gradient, "manual" (dHm
    gathered: :class:`_CGSolve`; autograd's while torch.compile traces) or "autograd" (through the steps);
    the same numbers up to rounding."""
    if solver == "exact":
        A = Hm + torch.diag_embed(lamb.expand_as(q))
        return torch.linalg.solve(A, q.unsqueeze(-1)).squeeze(-1)
    K = q.shape[-1]
    H3 = Hm.reshape(-1, K, K)  # one copy at most (where Hm is not contiguous), not one per step
    q2, l2 = q.reshape(-1, K), lamb.expand_as(q).reshape(-1, K)
    grad = torch.is_grad_enabled() and (Hm.requires_grad or q.requires_grad or lamb.requires_grad)
    # torch.compile cannot trace _CGSolve (its forward keeps an autograd graph for its backward): there the
    # gradient is autograd's through the steps, the same numbers up to rounding
    if backward == "manual" and grad and cg_steps > 0 and not torch.compiler.is_compiling():
        x = _CGSolve.apply(H3, q2, l2, cg_steps, cg_init, cg_eps)
    else:
        x = _cg(H3, q2, l2, cg_steps, cg_init, cg_eps)
    return x.view(q.shape)


def _check(q, k, v, beta, g, lamb, state, check_values):
    Bt, T, H, K, V = _check_qkv(q, k, v, _WHERE)
    check_shape("beta", beta, (Bt, T, H), "[B, T, H]", _WHERE)
    if g is not None:
        check_shape("g", g, (Bt, T, H), "[B, T, H]", _WHERE)
    check_tensor("lamb", lamb, rank=2, layout="[H, K]", where=_WHERE)
    check_shape("lamb", lamb, (H, K), "[H, K]", _WHERE)
    if state is not None:
        if not (isinstance(state, (tuple, list)) and len(state) == 2):
            raise ValueError(f"{_WHERE}: argument 'initial_state' must be a pair (G [B, H, K, V], H [B, H, K, K]) or None")
        check_shape("initial_state[0] (G)", state[0], (Bt, H, K, V), "[B, H, K, V]", _WHERE)
        check_shape("initial_state[1] (H)", state[1], (Bt, H, K, K), "[B, H, K, K]", _WHERE)
    if check_values and reads_values(q):
        for name, t in (("q", q), ("k", k), ("v", v), ("beta", beta), ("g", g), ("lamb", lamb)):
            if t is not None:
                check_finite(name, t, _WHERE)
        if float(lamb.detach().min()) <= 0:
            raise ValueError(f"{_WHERE}: argument 'lamb' (the regularizer λ) must be > 0, got a minimum of {float(lamb.detach().min()):.4g}")
        if g is not None and float(g.detach().max()) > 0:
            raise ValueError(f"{_WHERE}: argument 'g' holds log-decays and must be <= 0; got a maximum of {float(g.detach().max()):.4g}")
    return Bt, T, H, K, V


def _recurrent(q, k, v, beta, g, lamb, G, Hm, solve):
    outs = []
    gs = g.unbind(1) if g is not None else (None,) * q.shape[1]
    for q_t, k_t, v_t, b_t, g_t in zip(q.unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1), gs):
        bk = (b_t.unsqueeze(-1) * k_t).unsqueeze(-1)  # [B, H, K, 1]
        if g_t is not None:
            gam = g_t.exp()[..., None, None]
            Hm, G = gam * Hm, gam * G
        Hm = Hm + bk * k_t.unsqueeze(-2)
        G = G + bk * v_t.unsqueeze(-2)
        qt = solve(Hm, q_t)
        outs.append((qt.unsqueeze(-2) @ G).squeeze(-2))
    return torch.stack(outs, 1), G, Hm


def _chunk_decay(g, C, dtype, device):
    """From g [B, H, n·C] (padded): Γ [B, H, n, C], the log-decays summed from each chunk's first token
    (inclusive; None without g), and the causal decay mask M [.., C, C], M[t, s] = e^{Γ_t − Γ_s} for s <= t."""
    causal = torch.ones(C, C, dtype=torch.bool, device=device).tril()
    if g is None:
        return None, causal.to(dtype)
    Gc = g.reshape(*g.shape[:-1], -1, C).cumsum(-1)
    return Gc, _exp_where(Gc.unsqueeze(-1) - Gc.unsqueeze(-2), causal)


def _pad_t(x, dim, pad):
    """x zero-padded by ``pad`` entries at the end of dimension ``dim`` (counted from the end)."""
    return F.pad(x, (0, 0) * (-dim - 1) + (0, pad)) if pad else x


def _gram_chunks(k, beta, g, H0, C):
    """Every H_t, head-major: [B, H, T, K, K] (contiguous), and H_T [B, H, K, K].

    Per chunk of C tokens (the tail zero-padded), with Γ_t = Σ_{r <= t} log γ_r from the chunk's
    first token: H_t = Σ_{s <= t} e^{Γ_t − Γ_s} β_s k_sᵀk_s + e^{Γ_t} H_start (paper eq. 5 unrolled),
    the sum as one matmul M [C, C] @ P [C, K²] (M the causal decay mask, P the outer products);
    H_start of the next chunk is this chunk's last H_t."""
    Bt, T, H, K = k.shape
    n = -(-T // C)
    pad = n * C - T
    kt = _pad_t(k.transpose(1, 2), -2, pad)  # [B, H, n·C, K]
    bk = _pad_t((beta.unsqueeze(-1) * k).transpose(1, 2), -2, pad)
    Gc, M = _chunk_decay(_pad_t(g.transpose(1, 2), -1, pad) if g is not None else None, C, k.dtype, k.device)
    P = (bk.unsqueeze(-1) * kt.unsqueeze(-2)).reshape(Bt, H, n, C, K * K)  # β_s k_sᵀk_s
    Hc = M @ P  # [B, H, n, C, K²]: each chunk's own contribution
    if H0 is not None or n > 1:
        S = H0.reshape(Bt, H, K * K) if H0 is not None else Hc.new_zeros(Bt, H, K * K)
        starts = []
        for c in range(n):  # the state entering each chunk: a scan over n chunks of K² elementwise updates
            starts.append(S)
            S = Hc[:, :, c, -1] + (Gc[:, :, c, -1:].exp() * S if Gc is not None else S)
        start = torch.stack(starts, 2).unsqueeze(3)  # [B, H, n, 1, K²]
        Hc = Hc + (Gc.exp().unsqueeze(-1) * start if Gc is not None else start)
    H_all = Hc.view(Bt, H, n * C, K, K)
    H_all = H_all[:, :, :T].contiguous() if pad else H_all
    return H_all, H_all[:, :, -1].clone()  # a copy: the state carried on must not hold H_all's storage


class _GramChunks(torch.autograd.Function):
    """:func:`_gram_chunks` with a hand-written backward (``backward="manual"``): the adjoint of
    H_t = γ_t H_{t-1} + β_t k_tᵀk_t runs backwards, λ_t = dH_t + γ_{t+1} λ_{t+1} (in the same chunk
    form: Mᵀ @ dH within a chunk, a reverse scan over the chunks), and

        d(β_t k_t) = λ_t k_t,   dk_t ∋ λ_tᵀ(β_t k_t),   dβ_t = k_t · λ_t k_t,
        dg_t = γ_t ⟨λ_t, H_{t-1}⟩,   dH_0 = γ_1 λ_1.

    Keeps k, β, g and the output H_all (which the CG's graph keeps anyway), not the outer products."""

    @staticmethod
    def forward(ctx, k, beta, g, H0, C):
        H_all, H_T = _gram_chunks(k, beta, g, H0, C)
        ctx.C = C
        ctx.save_for_backward(k, beta, g, H0, H_all)
        return H_all, H_T

    @staticmethod
    @first_order("MesaNet's conjugate-gradient solve", "backward='autograd'")
    def backward(ctx, dH_all, dH_T):
        k, beta, g, H0, H_all = ctx.saved_tensors
        C = ctx.C
        Bt, T, H, K = k.shape
        n = -(-T // C)
        pad = n * C - T
        D = dH_all if dH_all is not None else H_all.new_zeros(H_all.shape)
        if dH_T is not None:
            D = D.clone()
            D[:, :, -1] += dH_T
        D = _pad_t(D.reshape(Bt, H, T, K * K), -2, pad).reshape(Bt, H, n, C, K * K)
        Gc, M = _chunk_decay(_pad_t(g.transpose(1, 2), -1, pad) if g is not None else None, C, k.dtype, k.device)
        lam = M.transpose(-1, -2) @ D  # λ within each chunk [B, H, n, C, K²]
        E = None  # γ λ at the first token of the chunk after: what flows into a chunk from its right
        if H0 is not None or n > 1:
            E = lam.new_zeros(Bt, H, K * K)
            carries = [None] * n
            for c in reversed(range(n)):
                carries[c] = E
                if Gc is not None:
                    first = lam[:, :, c, 0] + (Gc[:, :, c, -1:] - Gc[:, :, c, :1]).exp() * E  # λ at the chunk's first token
                    E = Gc[:, :, c, :1].exp() * first
                else:
                    E = lam[:, :, c, 0] + E
            carry = torch.stack(carries, 2).unsqueeze(3)  # [B, H, n, 1, K²]
            lam = lam + ((Gc[..., -1:] - Gc).exp().unsqueeze(-1) * carry if Gc is not None else carry)
        lam = lam.view(Bt, H, n * C, K * K)[:, :, :T]
        kt, bk = k.transpose(1, 2), (beta.unsqueeze(-1) * k).transpose(1, 2)  # [B, H, T, K]
        L3 = lam.reshape(-1, K, K)
        u = torch.bmm(L3, kt.reshape(-1, K, 1)).view(Bt, H, T, K)  # λ_t k_t = d(β_t k_t)
        w = torch.bmm(bk.reshape(-1, 1, K), L3).view(Bt, H, T, K)  # λ_tᵀ β_t k_t
        dbeta = (kt * u).sum(-1).transpose(1, 2)
        dk = (beta.transpose(1, 2).unsqueeze(-1) * u + w).transpose(1, 2)
        dg = None
        if g is not None:
            Hf = H_all.view(Bt, H, T, K * K)
            dots = torch.empty(Bt, H, T, dtype=lam.dtype, device=lam.device)  # ⟨λ_t, H_{t-1}⟩
            dots[:, :, 1:] = (lam[:, :, 1:] * Hf[:, :, :-1]).sum(-1)
            dots[:, :, 0] = (lam[:, :, 0] * H0.reshape(Bt, H, K * K)).sum(-1) if H0 is not None else 0
            dg = (g.transpose(1, 2).exp() * dots).transpose(1, 2)
        dH0 = E.view(Bt, H, K, K) if (H0 is not None and ctx.needs_input_grad[3]) else None
        return dk, dbeta, dg, dH0, None


def _gram_loop(k, beta, g, H0):
    """The reference: H_t = γ_t H_{t-1} + β_t k_tᵀk_t, token by token. [B, H, T, K, K] and H_T."""
    Bt, T, H, K = k.shape
    Hm = H0 if H0 is not None else k.new_zeros(Bt, H, K, K)
    out = []
    gs = g.unbind(1) if g is not None else (None,) * T
    for k_t, b_t, g_t in zip(k.unbind(1), beta.unbind(1), gs):
        if g_t is not None:
            Hm = g_t.exp()[..., None, None] * Hm
        Hm = Hm + (b_t.unsqueeze(-1) * k_t).unsqueeze(-1) * k_t.unsqueeze(-2)
        out.append(Hm)
    return torch.stack(out, 2), Hm


def _gram(k, beta, g, H0, mode, chunk_size, backward="manual"):
    if mode == "recurrent":
        return _gram_loop(k, beta, g, H0)
    C = k.shape[1] if mode == "parallel" else (chunk_size or GRAM_CHUNK)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (k, beta, g, H0))
    if backward == "manual" and grad:
        return _GramChunks.apply(k, beta, g, H0, C)
    return _gram_chunks(k, beta, g, H0, C)


def gram_states(k, beta, g=None, *, initial_state=None, mode="chunk", chunk_size=None, backward="manual"):
    """Every H_t [B, T, H, K, K] = γ_t H_{t-1} + β_t k_tᵀk_t (paper eq. 5) and H_T [B, H, K, K]: mode
    "recurrent" (the loop), "chunk" (chunks of ``chunk_size``, default 64: :func:`_gram_chunks`) or
    "parallel" (one chunk); ``backward`` "manual" (:class:`_GramChunks`) or "autograd". Returns
    (H_all, H_T); H_all is a view of a head-major tensor."""
    check_choice("mode", mode, ("recurrent", "chunk", "parallel"), "gram_states")
    check_choice("backward", backward, BACKWARDS, "gram_states")
    H_all, H_T = _gram(k, beta, g, initial_state, mode, chunk_size, backward)
    return H_all.transpose(1, 2), H_T


def mesa_readout(q, k, beta, g, lamb, *, initial_state=None, solver="cg", cg_steps=30, cg_init="zero", cg_eps=1e-5,
                 backward="manual", mode="parallel", chunk_size=None):
    """q̃_t = (H_t + Diag λ)⁻¹ q_t for every t [B, T, H, K] (the DSF readout C_t), and H_T."""
    H_all, H_T = _gram(k, beta, g, initial_state, mode, chunk_size, backward)  # [B, H, T, K, K]
    qt = mesa_solve(H_all, q.transpose(1, 2), lamb.unsqueeze(1), solver=solver, cg_steps=cg_steps, cg_init=cg_init,
                    cg_eps=cg_eps, backward=backward)
    return qt.transpose(1, 2), H_T


@full_precision
def mesa_net(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    lamb: torch.Tensor,
    *,
    solver: str = "cg",
    cg_steps: int = 30,
    cg_init: str = "zero",
    cg_eps: float = 1e-5,
    backward: str = "manual",
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    mode: str = "auto",
    chunk_size: int | None = None,
    check_values: bool = True,
):
    """o_t = q_t (H_t + Diag λ)⁻¹ G_t (module docstring).

    ``backward`` (chunk and parallel modes): "manual" (default), the hand-written gradients of the
    Gram matrices (:class:`_GramChunks`), of the CG (:class:`_CGSolve`) and of the output recurrence
    (``linear_recurrence``'s ``chunk_backward``); "autograd": autograd through all three (the same
    numbers up to rounding; tests tie them). The "recurrent" reference always uses autograd.

    Returns (o [B, T, H, V], (G_T, H_T) or None)."""
    check_choice("mode", mode, MODES + ("auto",), _WHERE)
    check_choice("solver", solver, SOLVERS, _WHERE)
    check_choice("cg_init", cg_init, CG_INITS, _WHERE)
    check_choice("backward", backward, BACKWARDS, _WHERE)
    check_positive_int("cg_steps", cg_steps, _WHERE, minimum=0)
    Bt, T, H, K, V = _check(q, k, v, beta, g, lamb, initial_state, check_values)
    if mode == "step" and T != 1:
        raise ValueError(f"{_WHERE}: mode 'step' takes one token (T == 1), got T = {T}; use 'recurrent' or 'chunk'")
    out_dtype = q.dtype
    dt = _compute_dtype(q, k, v, beta, g, lamb)
    q, k, v, beta, lamb = q.to(dt), k.to(dt), v.to(dt), beta.to(dt), lamb.to(dt)
    g = g.to(dt) if g is not None else None
    G0 = initial_state[0].to(dt) if initial_state is not None else None
    H0 = initial_state[1].to(dt) if initial_state is not None else None
    if mode == "auto":
        mode = "recurrent" if T == 1 else ("parallel" if T <= (chunk_size or GRAM_CHUNK) else "chunk")
    if mode in ("recurrent", "step"):
        G0 = G0 if G0 is not None else q.new_zeros(Bt, H, K, V)
        H0 = H0 if H0 is not None else q.new_zeros(Bt, H, K, K)
        o, G, Hm = _recurrent(q, k, v, beta, g, lamb, G0, H0,
                              lambda A, x: mesa_solve(A, x, lamb, solver=solver, cg_steps=cg_steps, cg_init=cg_init,
                                                      cg_eps=cg_eps, backward="autograd"))
    else:
        qt, Hm = mesa_readout(q, k, beta, g, lamb, initial_state=H0, solver=solver, cg_steps=cg_steps, cg_init=cg_init,
                              cg_eps=cg_eps, backward=backward, mode=mode, chunk_size=chunk_size)
        o, G = linear_recurrence(qt, beta.unsqueeze(-1) * k, v, g, initial_state=G0, output_final_state=True, mode=mode,
                                 chunk_size=chunk_size, check_values=False, chunk_backward=backward, backend="torch")
    return o.to(out_dtype), ((G, Hm) if output_final_state else None)
