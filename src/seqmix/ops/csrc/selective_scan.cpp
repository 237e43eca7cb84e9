// Mamba's selective scan (S6) on CPU: a fused forward and backward, one pass over time per
// channel with the state h[N] in a small per-thread buffer (L1), the loops over n vectorized
// (seqmix.ops.cpp_scan compiles this file on first use).
//
// Per batch b, channel d and state n (Mamba eqs. 2a/2b with the zero-order-hold decay and the
// Euler input, DSF eq. 19 with a diagonal Λ_t):
//
//     h_t[n] = exp(Δ_t A[d, n]) h_(t-1)[n] + Δ_t x_t B_t[n]
//     y_t    = Σ_n C_t[n] h_t[n] + D[d] x_t
//
// Shapes (contiguous, one dtype: float32 or float64): x, delta, y [B, T, D]; A [D, N];
// B, C [B, T, N] (shared by the channels) or [B, T, D, N] (per channel); D [D] or none;
// h0, hT [B, D, N]; states [B, n_chunks, D, N], the state entering each chunk of L steps
// (keep = 1), or every state hs [B, D, T + 1, N] (h_(-1) = h0 first) with every decay
// as [B, D, T, N], as = exp(Δ_t A) (keep = 2).
//
// The kernels are instantiated for N = 8 and N = 16 as compile-time constants (S6's and Mamba's
// usual d_state) beside any N: the same arithmetic in the same order (the loop over n is one or
// two whole vectors, no remainder, no trip-count logic), about 25% faster at N = 8 (issue 27).
//
// Work units: (b, block of kBlock channels), run in parallel with at::parallel_for. Inside a
// unit the chunks are walked in time order (forward) or reverse (backward) and, per chunk, each
// channel of the block in turn, so that the rows of x, delta, B, C of a chunk stay in cache.
//
// Backward of one chunk, per channel: recompute a_t = exp(Δ_t A) and the states from the kept
// boundary state (buffers of L·N) -- or, when the forward kept every state and decay (keep = 2:
// small scans, where the recompute is about as costly as the forward itself), read them there --
// then the adjoint backwards in time, with the carry
// g = dL/dh_t reaching step t from the right (a_(t+1) G_(t+1)):
//     G_t = dy_t C_t + g;     dC_t += dy_t h_t;     du_t = Σ_n G_t B_t;     dB_t += G_t u_t;
//     q_t = G_t h_(t-1) a_t;  dΔ_t = Σ_n q_t A + du_t x_t;  dA += q_t Δ_t;  g <- a_t G_t;
//     dx_t = du_t Δ_t + dy_t D;  dD += dy_t x_t;  dh0 = g after the first step.
// The sums over channels (dB, dC when shared) and over the batch (dA, dD) are written per unit
// (partial buffers [B, T, n_blocks, N], [B, D, N], [B, D]) and reduced by the caller.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kBlock = 32;  // channels per work unit

// exp(x) for float32 as plain arithmetic, so that the loops over n vectorize (std::exp does
// not without -ffast-math). Range reduction x = k ln2 + r, |r| <= ln2 / 2, then the Cephes
// degree-6 polynomial for e^r (about 1 ulp) scaled by 2^k through the exponent bits.
inline float exp_s(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float k = x * 1.44269504088896341f;
  k = (k + 12582912.0f) - 12582912.0f;  // round to nearest (1.5 · 2^23)
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof(s));
  return p * s;
}

inline double exp_s(double x) { return std::exp(x); }

// Work units per task of at::parallel_for: at least ~32k (t, d, n) elements each (torch's own
// grain), so that a tiny scan runs on the calling thread instead of paying a fork-join.
inline int64_t grain_units(int64_t T, int64_t D, int64_t N) {
  const int64_t per_unit = std::max<int64_t>(1, T * std::min(kBlock, D) * N);
  return std::max<int64_t>(1, 32768 / per_unit);
}

struct Dims {
  int64_t Bt, T, D, N, L, nC, nblk;
  int64_t bT, bD, cT, cD;  // strides of B and of C over (b, t) rows and over channels (0: shared)
};

Dims make_dims(const at::Tensor& x, const at::Tensor& A, const at::Tensor& Bm, const at::Tensor& Cm, int64_t L) {
  Dims m;
  m.Bt = x.size(0);
  m.T = x.size(1);
  m.D = x.size(2);
  m.N = A.size(1);
  m.L = L;
  m.nC = (m.T + L - 1) / L;
  m.nblk = (m.D + kBlock - 1) / kBlock;
  m.bT = Bm.dim() == 4 ? m.D * m.N : m.N;
  m.bD = Bm.dim() == 4 ? m.N : 0;
  m.cT = Cm.dim() == 4 ? m.D * m.N : m.N;
  m.cD = Cm.dim() == 4 ? m.N : 0;
  return m;
}

// ---------------------------------------------------------------------------------------------
// one step of one channel: loops over n, vectorized (restrict pointers, no control flow)
// ---------------------------------------------------------------------------------------------

// h <- exp(Δ A) h + u B (in place); returns Σ_n C h.
template <typename S>
inline S step_forward(const S* __restrict Ad, const S* __restrict Bp, const S* __restrict Cp,
                      S* __restrict h, const S dt, const S u, const int64_t N) {
  S acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t n = 0; n < N; ++n) {
    const S hn = exp_s(dt * Ad[n]) * h[n] + u * Bp[n];
    h[n] = hn;
    acc += Cp[n] * hn;
  }
  return acc;
}

// step_forward writing the new state to hnext and the decay to a (keep = 2): the same
// arithmetic, expression by expression, so y, the states and the gradients are the same bits.
template <typename S>
inline S step_forward_keep(const S* __restrict Ad, const S* __restrict Bp, const S* __restrict Cp,
                           const S* __restrict hprev, S* __restrict hnext, S* __restrict a,
                           const S dt, const S u, const int64_t N) {
  S acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t n = 0; n < N; ++n) {
    const S an = exp_s(dt * Ad[n]);
    const S hn = an * hprev[n] + u * Bp[n];
    a[n] = an;
    hnext[n] = hn;
    acc += Cp[n] * hn;
  }
  return acc;
}

// a = exp(Δ A), hnext = a hprev + u B.
template <typename S>
inline void step_recompute(const S* __restrict Ad, const S* __restrict Bp, const S* __restrict hprev,
                           S* __restrict hnext, S* __restrict a, const S dt, const S u, const int64_t N) {
#pragma omp simd
  for (int64_t n = 0; n < N; ++n) {
    const S an = exp_s(dt * Ad[n]);
    a[n] = an;
    hnext[n] = an * hprev[n] + u * Bp[n];
  }
}

// One step of the adjoint (file header): updates g, dA, dB, dC in place; returns du, dd = Σ_n q A.
template <typename S>
inline void step_adjoint(const S* __restrict Ad, const S* __restrict Bp, const S* __restrict Cp,
                         const S* __restrict hprev, const S* __restrict hcur, const S* __restrict a,
                         S* __restrict g, S* __restrict dAj, S* __restrict dBp, S* __restrict dCp,
                         const S dt, const S u, const S dyv, const int64_t N, S& du_out, S& dd_out) {
  S du = 0, dd = 0;
#pragma omp simd reduction(+ : du, dd)
  for (int64_t n = 0; n < N; ++n) {
    const S G = dyv * Cp[n] + g[n];
    dCp[n] += dyv * hcur[n];
    du += G * Bp[n];
    dBp[n] += G * u;
    const S q = G * hprev[n] * a[n];
    dd += q * Ad[n];
    dAj[n] += q * dt;
    g[n] = a[n] * G;
  }
  du_out = du;
  dd_out = dd;
}

// ---------------------------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------------------------

template <typename S, int64_t NC>
void forward_kernel(const S* x, const S* dl, const S* A, const S* Bm, const S* Cm, const S* Dv,
                    const S* h0, S* y, S* hT, S* states, S* hs, S* as, const Dims m) {
  at::parallel_for(0, m.Bt * m.nblk, grain_units(m.T, m.D, m.N), [&](int64_t lo, int64_t hi) {
    const int64_t N = NC > 0 ? NC : m.N;  // a constant in the instances for N = 8 and 16 (see the file header)
    std::vector<S> hbuf(kBlock * N);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / m.nblk, d0 = (unit % m.nblk) * kBlock;
      const int64_t nd = std::min(kBlock, m.D - d0);
      for (int64_t j = 0; j < nd; ++j)
        for (int64_t n = 0; n < N; ++n)
          hbuf[j * N + n] = h0 ? h0[(b * m.D + d0 + j) * N + n] : S(0);
      if (hs)  // every state kept: the channel's rows of hs are its state buffer, h_(-1) = h0 first
        for (int64_t j = 0; j < nd; ++j)
          std::memcpy(hs + (b * m.D + d0 + j) * (m.T + 1) * N, &hbuf[j * N], N * sizeof(S));
      for (int64_t c = 0; c < m.nC; ++c) {
        const int64_t t0 = c * m.L, t1 = std::min(m.T, t0 + m.L);
        for (int64_t j = 0; j < nd; ++j) {
          const int64_t d = d0 + j;
          S* h = &hbuf[j * N];
          if (states) std::memcpy(states + ((b * m.nC + c) * m.D + d) * N, h, N * sizeof(S));
          const S* Ad = A + d * N;
          const S Dd = Dv ? Dv[d] : S(0);
          if (hs) {
            S* hrow = hs + ((b * m.D + d) * (m.T + 1) + t0) * N;
            S* arow = as + ((b * m.D + d) * m.T + t0) * N;
            for (int64_t t = t0; t < t1; ++t, hrow += N, arow += N) {
              const int64_t bt = b * m.T + t, r = bt * m.D + d;
              const S dt = dl[r], xv = x[r];
              y[r] = step_forward_keep(Ad, Bm + bt * m.bT + d * m.bD, Cm + bt * m.cT + d * m.cD, hrow, hrow + N, arow,
                                       dt, dt * xv, N) + Dd * xv;
            }
            continue;
          }
          for (int64_t t = t0; t < t1; ++t) {
            const int64_t bt = b * m.T + t, r = bt * m.D + d;
            const S dt = dl[r], xv = x[r];
            y[r] = step_forward(Ad, Bm + bt * m.bT + d * m.bD, Cm + bt * m.cT + d * m.cD, h, dt, dt * xv, N) + Dd * xv;
          }
        }
      }
      if (hT)
        for (int64_t j = 0; j < nd; ++j)
          std::memcpy(hT + (b * m.D + d0 + j) * N, hs ? hs + ((b * m.D + d0 + j) * (m.T + 1) + m.T) * N : &hbuf[j * N],
                      N * sizeof(S));
    }
  });
}

// ---------------------------------------------------------------------------------------------
// backward
// ---------------------------------------------------------------------------------------------

template <typename S, int64_t NC>
void backward_kernel(const S* x, const S* dl, const S* A, const S* Bm, const S* Cm, const S* Dv,
                     const S* states, const S* hs, const S* as, const S* dy, const S* dhT,
                     S* dx, S* ddl, S* dA_part, S* dB, S* dC, S* dD_part, S* dh0,
                     bool shared_B, bool shared_C, const Dims m) {
  at::parallel_for(0, m.Bt * m.nblk, grain_units(m.T, m.D, m.N), [&](int64_t lo, int64_t hi) {
    const int64_t N = NC > 0 ? NC : m.N;
    const int64_t Lmax = std::min(m.L, m.T);
    std::vector<S> carry(kBlock * N), dAacc(kBlock * N), hb(hs ? 0 : (Lmax + 1) * N), ab(hs ? 0 : Lmax * N);
    // rows of dB / dC: shared -> the partial buffers [B, T, nblk, N], else [B, T, D, N]
    const int64_t sBT = shared_B ? m.nblk * N : m.D * N, sCT = shared_C ? m.nblk * N : m.D * N;
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / m.nblk, blk = unit % m.nblk, d0 = blk * kBlock;
      const int64_t nd = std::min(kBlock, m.D - d0);
      S dDacc[kBlock];
      for (int64_t j = 0; j < nd; ++j) {
        dDacc[j] = 0;
        for (int64_t n = 0; n < N; ++n) {
          carry[j * N + n] = dhT[(b * m.D + d0 + j) * N + n];
          dAacc[j * N + n] = 0;
        }
      }
      for (int64_t c = m.nC - 1; c >= 0; --c) {
        const int64_t t0 = c * m.L, l = std::min(m.T, t0 + m.L) - t0;
        for (int64_t j = 0; j < nd; ++j) {
          const int64_t d = d0 + j;
          const S* Ad = A + d * N;
          const S Dd = Dv ? Dv[d] : S(0);
          // the chunk's states and decays: hp[i] = h_(t0+i-1), hp[i+1] = h_(t0+i), ap[i] = a_(t0+i)
          const S* hp;
          const S* ap;
          if (hs) {  // kept by the forward
            hp = hs + ((b * m.D + d) * (m.T + 1) + t0) * N;
            ap = as + ((b * m.D + d) * m.T + t0) * N;
          } else {  // recomputed from the chunk's boundary state
            S* hw = hb.data();
            S* aw = ab.data();
            std::memcpy(hw, states + ((b * m.nC + c) * m.D + d) * N, N * sizeof(S));
            for (int64_t i = 0; i < l; ++i) {
              const int64_t t = t0 + i, r = (b * m.T + t) * m.D + d;
              const S dt = dl[r];
              step_recompute(Ad, Bm + (b * m.T + t) * m.bT + d * m.bD, hw + i * N, hw + (i + 1) * N,
                             aw + i * N, dt, dt * x[r], N);
            }
            hp = hw;
            ap = aw;
          }
          // the adjoint, backwards over the chunk
          S* g = &carry[j * N];
          S* dAj = &dAacc[j * N];
          S dDj = 0;
          for (int64_t i = l - 1; i >= 0; --i) {
            const int64_t t = t0 + i, bt = b * m.T + t, r = bt * m.D + d;
            const S dt = dl[r], xv = x[r], dyv = dy[r];
            S du, dd;
            step_adjoint(Ad, Bm + bt * m.bT + d * m.bD, Cm + bt * m.cT + d * m.cD, hp + i * N, hp + (i + 1) * N, ap + i * N, g, dAj,
                         dB + bt * sBT + (shared_B ? blk : d) * N, dC + bt * sCT + (shared_C ? blk : d) * N,
                         dt, dt * xv, dyv, N, du, dd);
            ddl[r] = dd + du * xv;
            dx[r] = du * dt + dyv * Dd;
            dDj += dyv * xv;
          }
          dDacc[j] += dDj;
        }
      }
      for (int64_t j = 0; j < nd; ++j) {
        const int64_t bd = b * m.D + d0 + j;
        std::memcpy(dh0 + bd * N, &carry[j * N], N * sizeof(S));
        std::memcpy(dA_part + bd * N, &dAacc[j * N], N * sizeof(S));
        dD_part[bd] = dDacc[j];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// entry points
// ---------------------------------------------------------------------------------------------

void check_inputs(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A,
                  const at::Tensor& Bm, const at::Tensor& Cm) {
  for (const at::Tensor* t : {&x, &delta, &A, &Bm, &Cm}) {
    TORCH_CHECK(t->device().is_cpu(), "seqmix selective_scan (cpp): CPU tensors only");
    TORCH_CHECK(t->is_contiguous(), "seqmix selective_scan (cpp): contiguous tensors only");
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), "seqmix selective_scan (cpp): one dtype for all inputs");
  }
  TORCH_CHECK(x.dim() == 3 && delta.sizes() == x.sizes(), "x, delta must be [B, T, D]");
  TORCH_CHECK(A.dim() == 2 && A.size(0) == x.size(2), "A must be [D, N]");
}

template <typename S>
const S* ptr_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr<S>() : nullptr;
}

// keep: 0 = nothing for a backward, 1 = the states entering each chunk, 2 = every state and decay.
// Returns (y [B, T, D], hT [B, D, N], states: [B, n_chunks, D, N] (keep 1), hs [B, D, T + 1, N]
// (keep 2) or an empty tensor, decays: as [B, D, T, N] (keep 2) or an empty tensor).
std::vector<at::Tensor> scan_forward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A,
                                     const at::Tensor& Bm, const at::Tensor& Cm,
                                     const c10::optional<at::Tensor>& Dv, const c10::optional<at::Tensor>& h0,
                                     int64_t L, int64_t keep) {
  check_inputs(x, delta, A, Bm, Cm);
  TORCH_CHECK(L >= 1, "chunk length must be >= 1");
  TORCH_CHECK(keep >= 0 && keep <= 2, "keep must be 0, 1 or 2");
  const Dims m = make_dims(x, A, Bm, Cm, L);
  auto y = at::empty_like(x);
  auto hT = at::empty({m.Bt, m.D, m.N}, x.options());
  auto states = keep == 1   ? at::empty({m.Bt, m.nC, m.D, m.N}, x.options())
                : keep == 2 ? at::empty({m.Bt, m.D, m.T + 1, m.N}, x.options())
                            : at::empty({0}, x.options());
  auto decays = keep == 2 ? at::empty({m.Bt, m.D, m.T, m.N}, x.options()) : at::empty({0}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "seqmix_selective_scan_forward", [&] {
    auto run = [&](auto kernel) {
      kernel(x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
             Bm.data_ptr<scalar_t>(), Cm.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(Dv),
             ptr_or_null<scalar_t>(h0), y.data_ptr<scalar_t>(), hT.data_ptr<scalar_t>(),
             keep == 1 ? states.data_ptr<scalar_t>() : nullptr, keep == 2 ? states.data_ptr<scalar_t>() : nullptr,
             keep == 2 ? decays.data_ptr<scalar_t>() : nullptr, m);
    };
    if (m.N == 8) run(forward_kernel<scalar_t, 8>);
    else if (m.N == 16) run(forward_kernel<scalar_t, 16>);
    else run(forward_kernel<scalar_t, 0>);
  });
  return {y, hT, states, decays};
}

// states, decays: what scan_forward kept (keep 1: decays empty; keep 2: hs and as).
// Returns (dx, ddelta [B, T, D], dA per batch [B, D, N], dB, dC (per channel: [B, T, D, N];
// shared: per block of channels [B, T, n_blocks, N]), dD per batch [B, D], dh0 [B, D, N]).
std::vector<at::Tensor> scan_backward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A,
                                      const at::Tensor& Bm, const at::Tensor& Cm,
                                      const c10::optional<at::Tensor>& Dv, const at::Tensor& states,
                                      const at::Tensor& decays, const at::Tensor& dy, const at::Tensor& dhT, int64_t L) {
  check_inputs(x, delta, A, Bm, Cm);
  const Dims m = make_dims(x, A, Bm, Cm, L);
  const bool all = decays.numel() > 0;
  if (all) {
    TORCH_CHECK(states.is_contiguous() && states.numel() == m.Bt * m.D * (m.T + 1) * m.N, "states (every state): wrong size");
    TORCH_CHECK(decays.is_contiguous() && decays.numel() == m.Bt * m.D * m.T * m.N, "decays: wrong size");
    TORCH_CHECK(states.scalar_type() == x.scalar_type() && decays.scalar_type() == x.scalar_type(), "states, decays: x's dtype");
  } else {
    TORCH_CHECK(states.is_contiguous() && states.numel() == m.Bt * m.nC * m.D * m.N, "states: wrong size");
  }
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes(), "dy must be [B, T, D]");
  TORCH_CHECK(dhT.is_contiguous() && dhT.numel() == m.Bt * m.D * m.N, "dhT must be [B, D, N]");
  const bool shared_B = Bm.dim() == 3, shared_C = Cm.dim() == 3;
  auto opt = x.options();
  auto dx = at::empty_like(x), ddl = at::empty_like(x);
  auto dA_part = at::empty({m.Bt, m.D, m.N}, opt), dD_part = at::empty({m.Bt, m.D}, opt);
  auto dh0 = at::empty({m.Bt, m.D, m.N}, opt);
  auto dB = shared_B ? at::zeros({m.Bt, m.T, m.nblk, m.N}, opt) : at::zeros_like(Bm);
  auto dC = shared_C ? at::zeros({m.Bt, m.T, m.nblk, m.N}, opt) : at::zeros_like(Cm);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "seqmix_selective_scan_backward", [&] {
    auto run = [&](auto kernel) {
      kernel(x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
                      Bm.data_ptr<scalar_t>(), Cm.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(Dv),
                      all ? nullptr : states.data_ptr<scalar_t>(), all ? states.data_ptr<scalar_t>() : nullptr,
                      all ? decays.data_ptr<scalar_t>() : nullptr, dy.data_ptr<scalar_t>(), dhT.data_ptr<scalar_t>(),
                      dx.data_ptr<scalar_t>(), ddl.data_ptr<scalar_t>(), dA_part.data_ptr<scalar_t>(),
                      dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(), dD_part.data_ptr<scalar_t>(),
                      dh0.data_ptr<scalar_t>(), shared_B, shared_C, m);
    };
    if (m.N == 8) run(backward_kernel<scalar_t, 8>);
    else if (m.N == 16) run(backward_kernel<scalar_t, 16>);
    else run(backward_kernel<scalar_t, 0>);
  });
  return {dx, ddl, dA_part, dB, dC, dD_part, dh0};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("forward", &scan_forward, "selective scan forward (CPU)");
  mod.def("backward", &scan_backward, "selective scan backward (CPU)");
  mod.attr("BLOCK") = kBlock;
}
