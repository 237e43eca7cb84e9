// Mamba's selective scan (S6) on CPU: a fused forward and backward, vectorized across channels
// (seqmix.ops.cpp_scan compiles this file on first use).
//
// Per batch b, channel d and state n (Mamba eqs. 2a/2b with the zero-order-hold decay and the
// Euler input, DSF eq. 19 with a diagonal Λ_t):
//
//     h_t[n] = exp(Δ_t A[d, n]) h_(t-1)[n] + Δ_t x_t B_t[n]
//     y_t    = Σ_n C_t[n] h_t[n] + D[d] x_t
//
// Δ_t is either delta itself or, Mamba's delta_bias / delta_softplus (selective_scan_fn; the CUDA
// kernel applies them when it loads delta), computed here for groups of kGroup steps ahead of them
// (Lanes::activate, read by load_step):
//     z_t = delta_t + delta_bias,    Δ_t = softplus(z_t) = log(1 + exp(z_t))  (or Δ_t = z_t without softplus)
// with PyTorch's threshold (F.softplus, beta 1, threshold 20; mamba_ssm's kernel uses the same 20):
// Δ = z for z > 20; σ(z) = softplus'(z) is the logistic function (1 above the threshold, as torch's
// softplus_backward). The backward evaluates them again, once: for a whole chunk before its
// recompute, which the adjoint then reads too (or, with every state kept, in the adjoint): the same
// bits as the forward's Δ. Keeping Δ and σ from the forward instead ([B, T, D] each) measured no
// faster at B 16, T 32, d 64, n 8 (within the noise) and about 12% slower forward + backward at
// (8, 512, 512, 16) (two fresh 8 MiB tensors written and read back). The backward returns the gradient w.r.t. z (the pre-activation
// delta), dz = dΔ · σ(z), and d(delta_bias) = Σ_(b, t) dz, per batch [B, D] (reduced by the caller).
//
// Shapes (contiguous, one dtype: float32 or float64): x, delta, y [B, T, D]; A [D, N]; delta_bias [D] or none;
// B, C [B, T, N] (shared by the channels) or [B, T, D, N] (per channel); D [D] or none;
// h0, hT [B, D, N]. What the forward keeps for the backward (internal to cpp_scan) is laid out
// per work unit, the lanes of its block innermost (channels padded to whole blocks), so that a
// unit reads its own contiguous stretch: states [B, n_blocks, n_chunks, N, kBlock], the state
// entering each chunk of L steps (keep = 1), or every state hs [B, n_blocks, T + 1, N, kBlock]
// (h_(-1) = h0 first) with every decay as [B, n_blocks, T, Na, kBlock], as = exp(Δ_t A)
// (keep = 2). Na = 1 when every row of A is constant over n (below), else N.
//
// Loop structure (a per-channel loop with the loop over n vectorized is instruction-bound,
// ~40-50 instructions per (t, channel) step at N = 8, most of them the horizontal sum over n for y
// and the per-channel scalar work):
//   work unit = (b, block of kBlock channels), run in parallel with at::parallel_for;
//   inside a unit: t (forward: in order; backward: chunks from the last, t reversed inside),
//     then n, then the kBlock channels of the block as the innermost loop, the SIMD lanes
//     (kBlock = 32: four AVX2 vectors of float32, eight of float64; plain `omp simd` loops of a
//     fixed trip count that the compiler vectorizes). The state of the block, [N][kBlock], stays
//     in L1; y_t, du_t, dΔ_t accumulate per lane over n (no horizontal sums); the only sums across
//     lanes are dB_t, dC_t when B, C are shared (one per (t, n) per block instead of a
//     read-modify-write per channel). B_t[n], C_t[n] shared are broadcast; per channel they are
//     transposed into [N][kBlock] buffers per step.
//   A partial last block (D not a multiple of kBlock) runs the same full-width loops on lanes
//   copied into zero-padded buffers (Δ = x = dy = 0, A = 0 there: the padded lanes stay 0 and
//   add 0 to the sums across lanes); only its first nd lanes are written out.
//   float32's exp is exp_s (plain arithmetic: it vectorizes); float64's is std::exp, scalar calls
//   (the loops of the update and of the adjoint still vectorize).
//   The kernels are also instantiated for N = 8 and N = 16 as compile-time constants (S6's and
//   Mamba's usual d_state; template argument NC, 0 for any N): the loops over n unroll, about 6%
//   faster forward and 7-11% backward (the same arithmetic in the same order).
//
// Against a per-channel kernel (channels outer, n vectorized): the decays and states are the same
// bits; y, du, dΔ, dB, dC sum in another order (over n per lane, over the lanes by the compiler's
// reduction), a difference of rounding only (float32: about 1e-7 relative; float64: 1e-16).
//
// The decays a = exp(Δ A) of a step are computed first, as Na rows of kBlock lanes, and the
// update reads row n (or row 0): when A[d, n] does not depend on n (dsf_ssd's scalar A, passed as
// A.expand(D, N)), checked bit for bit on entry (same_over_n), exp runs once per (t, d) instead
// of N times and gives the very same values.
//
// Backward of one chunk: the states and decays of the chunk are recomputed from the kept
// boundary state by the forward's step (buffers of (L + 1)·N·kBlock) -- or, when the forward kept
// every state and decay (keep = 2: small scans, where the recompute is about as costly as the
// forward itself), read there -- then the adjoint backwards in time, with the carry
// g = dL/dh_t reaching step t from the right (a_(t+1) G_(t+1)):
//     G_t = dy_t C_t + g;     dC_t += dy_t h_t;     du_t = Σ_n G_t B_t;     dB_t += G_t u_t;
//     q_t = G_t h_(t-1) a_t;  dΔ_t = Σ_n q_t A + du_t x_t;  dA += q_t Δ_t;  g <- a_t G_t;
//     dx_t = du_t Δ_t + dy_t D;  dD += dy_t x_t;  dh0 = g after the first step;
//     with delta_bias / delta_softplus: dz_t = dΔ_t σ(z_t) is written for delta, d(delta_bias) += dz_t.
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

constexpr int64_t kBlock = 32;  // channels per work unit: the lanes of every inner loop

// exp(x) for float32 as plain arithmetic, so that the loops vectorize (std::exp does not
// without -ffast-math). Range reduction x = k ln2 + r, |r| <= ln2 / 2, then the Cephes
// degree-6 polynomial for e^r (about 1 ulp) scaled by 2^k through the exponent bits.
inline float exp_s(float x) {
  // the clamp to [-87, 88] (NaN passes): both tests on the input, then two selects (vectorized:
  // two compares and two blends; a select nested in the other's else compiles to nine instructions)
  const bool hi = x > 88.0f, lo = x < -87.0f;
  x = hi ? 88.0f : x;
  x = lo ? -87.0f : x;
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

// log(1 + e) for float32 e in [0, 1] as plain arithmetic (it vectorizes), accurate for small e too:
// e · P(e) with P a degree-9 polynomial fitted here to log(1 + e) / e on [0, 1] (weighted least squares
// on Chebyshev nodes iterated toward the minimax relative error; fit error 4.7e-9 relative, evaluated
// in float32 within 1.9e-7 of log1p over [0, 1] and at e = 2^-k down to 2^-99). No division (2 atanh(e / (2 + e))
// by its series spends more time in its division than this in its polynomial); P(0) = 1 keeps
// log(1 + e) = e to rounding for tiny e (softplus of a very negative z).
inline float log1p_unit(float e) {
  float p = -3.244021209e-03f;
  p = p * e + 1.985144429e-02f;
  p = p * e + -5.695949867e-02f;
  p = p * e + 1.060365140e-01f;
  p = p * e + -1.530559063e-01f;
  p = p * e + 1.967593879e-01f;
  p = p * e + -2.495413423e-01f;
  p = p * e + 3.332996368e-01f;
  p = p * e + -4.999990165e-01f;
  p = p * e + 1.0f;
  return e * p;
}

inline double log1p_unit(double e) { return std::log1p(e); }

// PyTorch's softplus threshold (F.softplus(z, beta=1, threshold=20)): softplus(z) = z above it
constexpr double kSoftplusThreshold = 20.0;

// softplus(z) = max(z, 0) + log(1 + exp(-|z|)) (no overflow for large z, no cancellation for very
// negative z: then it is exp(z) to rounding), z itself above the threshold; with e = exp(-|z|) also
// σ(z) = softplus'(z) = 1 / (1 + e) for z >= 0, e / (1 + e) below (1 above the threshold, as torch's
// softplus_backward). Plain arithmetic in float32 (exp_s, log1p_unit): the loops over lanes vectorize.
template <typename S>
inline S softplus_s(S z, S& sig) {
  const S e = exp_s(-std::abs(z));
  const bool above = z > S(kSoftplusThreshold);
  sig = above ? S(1) : (z >= S(0) ? S(1) : e) / (S(1) + e);
  const S sp = std::max(z, S(0)) + log1p_unit(e);
  return above ? z : sp;
}

// Work units per task of at::parallel_for: at least ~32k (t, d, n) elements each (torch's own
// grain), so that a tiny scan runs on the calling thread instead of paying a fork-join.
inline int64_t grain_units(int64_t T, int64_t D, int64_t N) {
  const int64_t per_unit = std::max<int64_t>(1, T * std::min(kBlock, D) * N);
  return std::max<int64_t>(1, 32768 / per_unit);
}

// Whether every row of A [D, N] is constant over n, bit for bit (then exp(Δ A[d, n]) is the
// same value for every n and is computed once).
template <typename S>
bool same_over_n(const S* A, int64_t D, int64_t N) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 1; n < N; ++n)
      if (std::memcmp(A + d * N + n, A + d * N, sizeof(S)) != 0) return false;
  return true;
}

struct Dims {
  int64_t Bt, T, D, N, L, nC, nblk;
  int64_t Na;  // rows of decays per step: 1 when A is constant over n, else N
  int act;     // Δ from delta: 0 = delta itself, 1 = delta + delta_bias, 2 = softplus(delta + delta_bias)
};

Dims make_dims(const at::Tensor& x, const at::Tensor& A, int64_t L, bool uniform_A, int act) {
  Dims m;
  m.act = act;
  m.Bt = x.size(0);
  m.T = x.size(1);
  m.D = x.size(2);
  m.N = A.size(1);
  m.L = L;
  m.nC = (m.T + L - 1) / L;
  m.nblk = (m.D + kBlock - 1) / kBlock;
  m.Na = uniform_A && m.N > 0 ? 1 : m.N;
  return m;
}

// The lanes of one block: src itself when the block is full, else its first nd values copied
// into pad (whose other lanes are 0).
template <typename S>
inline const S* lanes(const S* src, S* pad, int64_t nd) {
  if (nd == kBlock) return src;
  std::memcpy(pad, src, nd * sizeof(S));
  return pad;
}

// A unit walks t with a stride of D channels: a step's lanes of x, Δ (dy, and the outputs) are
// a few cache lines used once, too far apart at large D for the hardware prefetcher (at B 8,
// T 512, d 512 about a quarter of the backward's samples sat on those loads). Each step asks
// for the lines of the step kAhead later in its direction of time (and, in the backward, for the
// kept states and decays of that step).
constexpr int64_t kAhead = 2;

template <typename S>
inline void prefetch_lanes(const S* p, int64_t count) {
  for (int64_t k = 0; k < count * int64_t(sizeof(S)); k += 64) __builtin_prefetch(reinterpret_cast<const char*>(p) + k);
}

// [nd][N] rows of a per-channel B or C (channels d0..) -> [N][kBlock] lanes (the others stay 0).
template <typename S>
inline void transpose_in(const S* src, S* dst, int64_t nd, int64_t N) {
  for (int64_t j = 0; j < nd; ++j)
    for (int64_t n = 0; n < N; ++n) dst[n * kBlock + j] = src[j * N + n];
}

// ---------------------------------------------------------------------------------------------
// one step of one block: n outside, the kBlock lanes (channels) inside, vectorized
// ---------------------------------------------------------------------------------------------

// Forward step. SB / SC: B, C shared (Bp[n] broadcast over the lanes) or per channel (Bp[n][j]).
// The Na decay rows a[n][j] = exp(Δ[j] A[n][j]) are written to a; then
// hn[n][j] = a[n or 0][j] hp[n][j] + u[j] B[n] (a, hp, hn: rows of kBlock lanes), and with
// WithY y[j] = Σ_n C[n] hn[n][j], per lane in order of n. The recompute of the backward is the
// same function without y: the same a and h bits as the forward's.
template <typename S, bool SB, bool SC, bool WithY>
inline void block_step(const S* __restrict At, const S* __restrict dt, const S* __restrict u,
                       const S* __restrict Bp, const S* __restrict Cp,
                       const S* __restrict hp, S* __restrict hn, S* __restrict a, const int64_t N,
                       const int64_t Na, S* __restrict y) {
  for (int64_t n = 0; n < Na; ++n) {
    const S* An = At + n * kBlock;
    S* an = a + n * kBlock;
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) an[j] = exp_s(dt[j] * An[j]);
  }
  if (WithY)
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) y[j] = 0;
  const int64_t a_step = Na == 1 ? 0 : kBlock;
  for (int64_t n = 0; n < N; ++n) {
    const S* an = a + n * a_step;
    const S* hpn = hp + n * kBlock;
    S* hnn = hn + n * kBlock;
    const S* Bn = SB ? Bp + n : Bp + n * kBlock;
    const S* Cn = SC ? Cp + n : Cp + n * kBlock;
    const S Bs = SB ? *Bn : S(0);
    const S Cs = SC && WithY ? *Cn : S(0);
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) {
      const S h = an[j] * hpn[j] + u[j] * (SB ? Bs : Bn[j]);
      hnn[j] = h;
      if (WithY) y[j] += (SC ? Cs : Cn[j]) * h;
    }
  }
}

// Adjoint step (file header), rows as in block_step (hp = h_(t-1), hc = h_t, a = a_t: Na rows).
// Updates g, dA [N][kBlock] in place; writes du, dd (= Σ_n q A) [kBlock]; dB, dC: shared -> the
// sum over the lanes per n (dBo[n]), per channel -> [N][kBlock].
template <typename S, bool SB, bool SC>
inline void block_adjoint(const S* __restrict At, const int64_t Na, const S* __restrict dt, const S* __restrict u,
                          const S* __restrict dy, const S* __restrict Bp, const S* __restrict Cp,
                          const S* __restrict hp, const S* __restrict hc, const S* __restrict a,
                          S* __restrict g, S* __restrict dA,
                          S* __restrict du, S* __restrict dd, S* __restrict dBo, S* __restrict dCo, const int64_t N) {
#pragma omp simd
  for (int64_t j = 0; j < kBlock; ++j) {
    du[j] = 0;
    dd[j] = 0;
  }
  const int64_t a_step = Na == 1 ? 0 : kBlock;
  for (int64_t n = 0; n < N; ++n) {
    const S* an = a + n * a_step;
    const S* An = At + n * a_step;
    const S* hpn = hp + n * kBlock;
    const S* hcn = hc + n * kBlock;
    S* gn = g + n * kBlock;
    S* dAn = dA + n * kBlock;
    const S* Bn = SB ? Bp + n : Bp + n * kBlock;
    const S* Cn = SC ? Cp + n : Cp + n * kBlock;
    S* dBn = SB ? dBo + n : dBo + n * kBlock;
    S* dCn = SC ? dCo + n : dCo + n * kBlock;
    const S Bs = SB ? *Bn : S(0), Cs = SC ? *Cn : S(0);
    S sB = 0, sC = 0;
#pragma omp simd reduction(+ : sB, sC)
    for (int64_t j = 0; j < kBlock; ++j) {
      const S G = dy[j] * (SC ? Cs : Cn[j]) + gn[j];
      const S pC = dy[j] * hcn[j];
      const S pB = G * u[j];
      if (SC) sC += pC; else dCn[j] = pC;
      if (SB) sB += pB; else dBn[j] = pB;
      du[j] += G * (SB ? Bs : Bn[j]);
      const S q = G * hpn[j] * an[j];
      dd[j] += q * An[j];
      dAn[j] += q * dt[j];
      gn[j] = an[j] * G;
    }
    if (SB) *dBn = sB;
    if (SC) *dCn = sC;
  }
}

// Steps whose Δ (and σ) are computed together, ahead of the steps that use them, with delta_bias /
// softplus. Computed inside each step (as x, u are), softplus's dependency chain (exp_s, the log1p
// polynomial, σ's division: on the order of 100 cycles) lengthened every step's critical path, as the
// step's own work is too long for the out-of-order window to reach the next step's Δ: +44 µs on a
// 170 µs forward at B 16, T 32, d 64, n 8 (AVX-512), where the same softplus over 32k independent values
// took 21 µs. In groups of kGroup steps the evaluations are independent of each other and overlap.
constexpr int64_t kGroup = 16;

// per-thread buffers of a work unit: the lanes of the current step and the block's constants
template <typename S>
struct Lanes {
  std::vector<S> buf;
  S *dt, *x, *dy, *u, *y, *du, *dd, *Dd, *dD, *z, *bias, *sig, *dbias, *At, *Bs, *Cs;
  S *dtg, *sgg;  // Δ and σ of a group of steps (activate), [kGroup][kBlock] each
  int act;  // Dims::act
  Lanes(int64_t N, int act) : buf((13 + 3 * N + 2 * kGroup) * kBlock), act(act) {
    S* p = buf.data();
    for (S** q : {&dt, &x, &dy, &u, &y, &du, &dd, &Dd, &dD, &z, &bias, &sig, &dbias}) *q = p, p += kBlock;
    At = p, p += N * kBlock;
    Bs = p, p += N * kBlock;
    Cs = p, p += N * kBlock;
    dtg = p, p += kGroup * kBlock;
    sgg = p;
  }
  // zeroes every lane (the padding of a partial block), then the block's A (transposed, Na rows), D and
  // delta_bias; σ = dΔ/dz = 1 in sig (without softplus: the backward always multiplies by a σ)
  void start(const S* A, const S* Dv, const S* dbias_in, int64_t d0, int64_t nd, int64_t N, int64_t Na) {
    std::fill(buf.begin(), buf.end(), S(0));
    std::fill(sig, sig + kBlock, S(1));
    for (int64_t j = 0; j < nd; ++j) {
      for (int64_t n = 0; n < Na; ++n) At[n * kBlock + j] = A[(d0 + j) * N + n];
      Dd[j] = Dv ? Dv[d0 + j] : S(0);
      bias[j] = dbias_in ? dbias_in[d0 + j] : S(0);
    }
  }
  // Δ of cnt consecutive steps (delta's rows r_first + i·D), into rows i of dto, from z = delta +
  // delta_bias: z (act 1) or softplus(z) (act 2, and σ(z) into rows i of sgo when Sig). The padded
  // lanes of a partial block keep Δ = 0 (softplus(0) would be log 2 there).
  template <bool Sig>
  void activate(const S* dl, int64_t r_first, int64_t D, int64_t cnt, int64_t nd, S* dto, S* sgo) {
    for (int64_t i = 0; i < cnt; ++i) {
      const S* zr = lanes(dl + r_first + i * D, z, nd);
      S* di = dto + i * kBlock;
      S* si = sgo + i * kBlock;
      if (act == 1) {
#pragma omp simd
        for (int64_t j = 0; j < kBlock; ++j) di[j] = zr[j] + bias[j];
      } else {
#pragma omp simd
        for (int64_t j = 0; j < kBlock; ++j) {
          S sg;
          di[j] = softplus_s(zr[j] + bias[j], sg);
          if (Sig) si[j] = sg;
        }
        for (int64_t j = nd; j < kBlock; ++j) di[j] = 0;
      }
    }
  }
  // a step's inputs, shared by the forward and the adjoint: Δ and x lanes (dt, xv), u = Δ x, and a
  // per-channel B or C transposed into lanes (SB / SC false); r0 is the step's first channel's row.
  // Δ is delta's lanes themselves (act 0), or the step's row dta of dtg (activate).
  template <bool SB, bool SC>
  void load_step(const S* dl, const S* x, const S* Bm, const S* Cm, int64_t r0, int64_t nd, int64_t N,
                 const S* dta, const S*& dtv, const S*& xv) {
    dtv = act == 0 ? lanes(dl + r0, dt, nd) : dta;
    xv = lanes(x + r0, this->x, nd);
#pragma omp simd
    for (int64_t j = 0; j < kBlock; ++j) u[j] = dtv[j] * xv[j];
    if (!SB) transpose_in(Bm + r0 * N, Bs, nd, N);
    if (!SC) transpose_in(Cm + r0 * N, Cs, nd, N);
  }
};

// ---------------------------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------------------------

template <typename S, bool SB, bool SC, int64_t NC>
void forward_kernel(const S* x, const S* dl, const S* A, const S* Bm, const S* Cm, const S* Dv, const S* dbias,
                    const S* h0, S* y, S* hT, S* states, S* hs, S* as, const Dims m) {
  at::parallel_for(0, m.Bt * m.nblk, grain_units(m.T, m.D, m.N), [&](int64_t lo, int64_t hi) {
    const int64_t N = NC > 0 ? NC : m.N, Na = m.Na == 1 ? 1 : N, NW = N * kBlock;  // NC: see the file header
    Lanes<S> v(N, m.act);
    std::vector<S> hbuf(2 * NW), abuf(Na * kBlock);  // the state (two rows, alternating) and the decays, keep < 2
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / m.nblk, d0 = (unit % m.nblk) * kBlock;
      const int64_t nd = std::min(kBlock, m.D - d0);
      v.start(A, Dv, dbias, d0, nd, N, Na);
      // the state h_(t-1), [N][kBlock]: the unit's step t of hs (keep = 2), else one of the two in hbuf
      S* h = hs ? hs + unit * (m.T + 1) * NW : hbuf.data();
      S* a = as ? as + unit * m.T * Na * kBlock : abuf.data();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < kBlock; ++j)
          h[n * kBlock + j] = h0 && j < nd ? h0[(b * m.D + d0 + j) * N + n] : S(0);
      for (int64_t t = 0; t < m.T; ++t) {
        const int64_t bt = b * m.T + t, r0 = bt * m.D + d0;
        if (states && t % m.L == 0)
          std::memcpy(states + (unit * m.nC + t / m.L) * NW, h, NW * sizeof(S));
        if (t + kAhead < m.T) {
          const int64_t rp = r0 + kAhead * m.D;
          prefetch_lanes(dl + rp, nd), prefetch_lanes(x + rp, nd), prefetch_lanes(y + rp, nd);
        }
        const S *dt, *xv;
        const int64_t gi = t % kGroup;  // the step's row of the group's Δ (and σ)
        if (m.act && gi == 0) v.template activate<false>(dl, r0, m.D, std::min(kGroup, m.T - t), nd, v.dtg, v.sgg);
        v.template load_step<SB, SC>(dl, x, Bm, Cm, r0, nd, N, v.dtg + gi * kBlock, dt, xv);
        S* hn = hs ? h + NW : hbuf.data() + ((t + 1) & 1) * NW;
        block_step<S, SB, SC, true>(v.At, dt, v.u, SB ? Bm + bt * N : v.Bs, SC ? Cm + bt * N : v.Cs,
                                    h, hn, a, N, Na, v.y);
#pragma omp simd
        for (int64_t j = 0; j < nd; ++j) y[r0 + j] = v.y[j] + v.Dd[j] * xv[j];
        h = hn;
        if (as) a += Na * kBlock;
      }
      if (hT)
        for (int64_t j = 0; j < nd; ++j)
          for (int64_t n = 0; n < N; ++n) hT[(b * m.D + d0 + j) * N + n] = h[n * kBlock + j];
    }
  });
}

// ---------------------------------------------------------------------------------------------
// backward
// ---------------------------------------------------------------------------------------------

template <typename S, bool SB, bool SC, int64_t NC>
void backward_kernel(const S* x, const S* dl, const S* A, const S* Bm, const S* Cm, const S* Dv, const S* dbias,
                     const S* states, const S* hs, const S* as, const S* dy, const S* dhT,
                     S* dx, S* ddl, S* dA_part, S* dB, S* dC, S* dD_part, S* dh0, S* dbias_part, const Dims m) {
  at::parallel_for(0, m.Bt * m.nblk, grain_units(m.T, m.D, m.N), [&](int64_t lo, int64_t hi) {
    const int64_t N = NC > 0 ? NC : m.N, Na = m.Na == 1 ? 1 : N, NW = N * kBlock;  // NC: see the file header
    const int64_t Lmax = std::min(m.L, m.T);
    Lanes<S> v(N, m.act);
    // the carry g and dA as [N][kBlock]; dB, dC of a step per channel; a chunk's states and decays
    std::vector<S> g(NW), dAacc(NW), dBs(SB ? 0 : NW), dCs(SC ? 0 : NW);
    std::vector<S> hb(hs ? 0 : (Lmax + 1) * NW), ab(hs ? 0 : Lmax * Na * kBlock);
    // with delta_bias / softplus and the chunks recomputed: the chunk's Δ and σ, [Lmax][kBlock] each, evaluated
    // once by the recompute for the adjoint too (else the adjoint evaluates them, in groups of kGroup steps)
    const bool chunk_act = m.act && !hs;
    std::vector<S> dtc(chunk_act ? Lmax * kBlock : 0), sgc(chunk_act ? Lmax * kBlock : 0);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / m.nblk, blk = unit % m.nblk, d0 = blk * kBlock;
      const int64_t nd = std::min(kBlock, m.D - d0);
      v.start(A, Dv, dbias, d0, nd, N, Na);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < kBlock; ++j) {
          g[n * kBlock + j] = j < nd ? dhT[(b * m.D + d0 + j) * N + n] : S(0);
          dAacc[n * kBlock + j] = 0;
        }
      for (int64_t c = m.nC - 1; c >= 0; --c) {
        const int64_t t0 = c * m.L, l = std::min(m.T, t0 + m.L) - t0;
        // the chunk's states and decays: h_(t0+i-1) at hp + i·NW, a_(t0+i) at ap + i·Na·kBlock
        const S* hp;
        const S* ap;
        if (hs) {  // kept by the forward
          hp = hs + (unit * (m.T + 1) + t0) * NW;
          ap = as + (unit * m.T + t0) * Na * kBlock;
        } else {  // recomputed from the chunk's boundary state by the forward's step
          S* hw = hb.data();
          S* aw = ab.data();
          std::memcpy(hw, states + (unit * m.nC + c) * NW, NW * sizeof(S));
          if (chunk_act) v.template activate<true>(dl, (b * m.T + t0) * m.D + d0, m.D, l, nd, dtc.data(), sgc.data());
          for (int64_t i = 0; i < l; ++i) {
            const int64_t r0 = (b * m.T + t0 + i) * m.D + d0;
            if (i + kAhead < l) prefetch_lanes(dl + r0 + kAhead * m.D, nd), prefetch_lanes(x + r0 + kAhead * m.D, nd);
            const S *dt, *xv;
            v.template load_step<SB, true>(dl, x, Bm, Cm, r0, nd, N, dtc.data() + i * kBlock, dt, xv);  // C is not read: no transpose
            block_step<S, SB, true, false>(v.At, dt, v.u, SB ? Bm + (b * m.T + t0 + i) * N : v.Bs, v.Cs,
                                           hw + i * NW, hw + (i + 1) * NW, aw + i * Na * kBlock, N, Na, nullptr);
          }
          hp = hw;
          ap = aw;
        }
        // the adjoint, backwards over the chunk
        for (int64_t i = l - 1; i >= 0; --i) {
          const int64_t bt = b * m.T + t0 + i, r0 = bt * m.D + d0;
          if (t0 + i >= kAhead) {
            const int64_t rp = r0 - kAhead * m.D;
            prefetch_lanes(dl + rp, nd), prefetch_lanes(x + rp, nd), prefetch_lanes(dy + rp, nd);
            prefetch_lanes(dx + rp, nd), prefetch_lanes(ddl + rp, nd);
            if (hs)  // the unit's kept rows of step t - kAhead (in the previous chunk when i < kAhead)
              prefetch_lanes(hp + (i - kAhead) * NW, NW), prefetch_lanes(ap + (i - kAhead) * Na * kBlock, Na * kBlock);
          }
          const S *dt, *xv;
          // Δ and σ(z) of step i: the recompute's (chunk_act), or a group's evaluated here (backwards: at its
          // last step), or delta itself and v.sig's 1s (Lanes::start) without an activation
          const S *dta = nullptr, *sgv = v.sig;
          if (chunk_act) {
            dta = dtc.data() + i * kBlock;
            if (m.act == 2) sgv = sgc.data() + i * kBlock;
          } else if (m.act) {
            const int64_t g0 = i - i % kGroup;  // the first step of i's group
            if (i == l - 1 || i % kGroup == kGroup - 1)
              v.template activate<true>(dl, (b * m.T + t0 + g0) * m.D + d0, m.D, std::min(kGroup, l - g0), nd, v.dtg, v.sgg);
            dta = v.dtg + (i - g0) * kBlock;
            if (m.act == 2) sgv = v.sgg + (i - g0) * kBlock;
          }
          v.template load_step<SB, SC>(dl, x, Bm, Cm, r0, nd, N, dta, dt, xv);
          const S* dyv = lanes(dy + r0, v.dy, nd);
          S* dBo = SB ? dB + (bt * m.nblk + blk) * N : dBs.data();
          S* dCo = SC ? dC + (bt * m.nblk + blk) * N : dCs.data();
          block_adjoint<S, SB, SC>(v.At, Na, dt, v.u, dyv, SB ? Bm + bt * N : v.Bs, SC ? Cm + bt * N : v.Cs,
                                   hp + i * NW, hp + (i + 1) * NW, ap + i * Na * kBlock, g.data(), dAacc.data(),
                                   v.du, v.dd, dBo, dCo, N);
#pragma omp simd
          for (int64_t j = 0; j < nd; ++j) {
            const S dz = (v.dd[j] + v.du[j] * xv[j]) * sgv[j];  // dΔ · σ(z) (σ = 1 without softplus: the same bits)
            ddl[r0 + j] = dz;
            v.dbias[j] += dz;
            dx[r0 + j] = v.du[j] * dt[j] + dyv[j] * v.Dd[j];
            v.dD[j] += dyv[j] * xv[j];
          }
          for (int64_t j = 0; j < nd; ++j)  // per channel: [N][kBlock] -> the rows [nd][N]
            for (int64_t n = 0; n < N; ++n) {
              if (!SB) dB[(r0 + j) * N + n] = dBs[n * kBlock + j];
              if (!SC) dC[(r0 + j) * N + n] = dCs[n * kBlock + j];
            }
        }
      }
      for (int64_t j = 0; j < nd; ++j) {
        const int64_t bd = b * m.D + d0 + j;
        for (int64_t n = 0; n < N; ++n) {
          dh0[bd * N + n] = g[n * kBlock + j];
          dA_part[bd * N + n] = dAacc[n * kBlock + j];
        }
        dD_part[bd] = v.dD[j];
        if (dbias_part) dbias_part[bd] = v.dbias[j];
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

// delta_bias: [D] in x's dtype, or none; act (Dims::act) from it and delta_softplus
int check_activation(const at::Tensor& x, const c10::optional<at::Tensor>& bias, bool softplus) {
  const bool has = bias.has_value() && bias->defined();
  if (has) {
    TORCH_CHECK(bias->device().is_cpu() && bias->is_contiguous(), "seqmix selective_scan (cpp): delta_bias must be a contiguous CPU tensor");
    TORCH_CHECK(bias->scalar_type() == x.scalar_type(), "seqmix selective_scan (cpp): delta_bias must have x's dtype");
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(2), "delta_bias must be [D]");
  }
  return softplus ? 2 : has ? 1 : 0;
}

bool uniform_A(const at::Tensor& A) {
  bool u = false;
  AT_DISPATCH_FLOATING_TYPES(A.scalar_type(), "seqmix_selective_scan_uniform_A",
                             [&] { u = same_over_n(A.data_ptr<scalar_t>(), A.size(0), A.size(1)); });
  return u;
}

// the kernel instance for shared or per-channel B and C, and N = 8, 16 or any (file header)
#define SEQMIX_SCAN_BC_DISPATCH_N(KERNEL, SB, SC, RUN, NC) \
  if (SB && SC) RUN(KERNEL<scalar_t, true, true, NC>);     \
  else if (SB) RUN(KERNEL<scalar_t, true, false, NC>);     \
  else if (SC) RUN(KERNEL<scalar_t, false, true, NC>);     \
  else RUN(KERNEL<scalar_t, false, false, NC>)
#define SEQMIX_SCAN_BC_DISPATCH(KERNEL, SB, SC, RUN)                                \
  if (m.N == 8) { SEQMIX_SCAN_BC_DISPATCH_N(KERNEL, SB, SC, RUN, 8); }              \
  else if (m.N == 16) { SEQMIX_SCAN_BC_DISPATCH_N(KERNEL, SB, SC, RUN, 16); }       \
  else { SEQMIX_SCAN_BC_DISPATCH_N(KERNEL, SB, SC, RUN, 0); }

// keep: 0 = nothing for a backward, 1 = the states entering each chunk, 2 = every state and decay.
// delta_bias [D] or none, delta_softplus: Δ = softplus(delta + delta_bias) or delta + delta_bias (file header).
// Returns (y [B, T, D], hT [B, D, N], states: [B, n_blocks, n_chunks, N, kBlock] (keep 1), hs
// [B, n_blocks, T + 1, N, kBlock] (keep 2) or an empty tensor, decays: as [B, n_blocks, T, Na, kBlock]
// (keep 2) or an empty tensor).
std::vector<at::Tensor> scan_forward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A,
                                     const at::Tensor& Bm, const at::Tensor& Cm,
                                     const c10::optional<at::Tensor>& Dv, const c10::optional<at::Tensor>& h0,
                                     int64_t L, int64_t keep, const c10::optional<at::Tensor>& delta_bias,
                                     bool delta_softplus) {
  check_inputs(x, delta, A, Bm, Cm);
  TORCH_CHECK(L >= 1, "chunk length must be >= 1");
  TORCH_CHECK(keep >= 0 && keep <= 2, "keep must be 0, 1 or 2");
  const Dims m = make_dims(x, A, L, uniform_A(A), check_activation(x, delta_bias, delta_softplus));
  auto y = at::empty_like(x);
  auto hT = at::empty({m.Bt, m.D, m.N}, x.options());
  auto states = keep == 1   ? at::empty({m.Bt, m.nblk, m.nC, m.N, kBlock}, x.options())
                : keep == 2 ? at::empty({m.Bt, m.nblk, m.T + 1, m.N, kBlock}, x.options())
                            : at::empty({0}, x.options());
  auto decays = keep == 2 ? at::empty({m.Bt, m.nblk, m.T, m.Na, kBlock}, x.options()) : at::empty({0}, x.options());
  const bool SB = Bm.dim() == 3, SC = Cm.dim() == 3;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "seqmix_selective_scan_forward", [&] {
    auto run = [&](auto kernel) {
      kernel(x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
             Bm.data_ptr<scalar_t>(), Cm.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(Dv),
             ptr_or_null<scalar_t>(delta_bias), ptr_or_null<scalar_t>(h0), y.data_ptr<scalar_t>(), hT.data_ptr<scalar_t>(),
             keep == 1 ? states.data_ptr<scalar_t>() : nullptr, keep == 2 ? states.data_ptr<scalar_t>() : nullptr,
             keep == 2 ? decays.data_ptr<scalar_t>() : nullptr, m);
    };
    SEQMIX_SCAN_BC_DISPATCH(forward_kernel, SB, SC, run);
  });
  return {y, hT, states, decays};
}

// states, decays: what scan_forward kept (keep 1: decays empty; keep 2: hs and as); delta, delta_bias,
// delta_softplus: the forward's.
// Returns (dx, ddelta [B, T, D] (w.r.t. delta: dΔ · σ with softplus), dA per batch
// [B, D, N], dB, dC (per channel: [B, T, D, N]; shared: per block of channels [B, T, n_blocks, N]),
// dD per batch [B, D], dh0 [B, D, N], d(delta_bias) per batch [B, D] (an empty tensor without a bias)).
std::vector<at::Tensor> scan_backward(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& A,
                                      const at::Tensor& Bm, const at::Tensor& Cm,
                                      const c10::optional<at::Tensor>& Dv, const at::Tensor& states,
                                      const at::Tensor& decays, const at::Tensor& dy, const at::Tensor& dhT, int64_t L,
                                      const c10::optional<at::Tensor>& delta_bias, bool delta_softplus) {
  check_inputs(x, delta, A, Bm, Cm);
  const Dims m = make_dims(x, A, L, uniform_A(A), check_activation(x, delta_bias, delta_softplus));
  const bool has_bias = delta_bias.has_value() && delta_bias->defined();
  const bool all = decays.numel() > 0;
  if (all) {
    TORCH_CHECK(states.is_contiguous() && states.numel() == m.Bt * m.nblk * (m.T + 1) * m.N * kBlock, "states (every state): wrong size");
    TORCH_CHECK(decays.is_contiguous() && decays.numel() == m.Bt * m.nblk * m.T * m.Na * kBlock, "decays: wrong size");
    TORCH_CHECK(states.scalar_type() == x.scalar_type() && decays.scalar_type() == x.scalar_type(), "states, decays: x's dtype");
  } else {
    TORCH_CHECK(states.is_contiguous() && states.numel() == m.Bt * m.nblk * m.nC * m.N * kBlock, "states: wrong size");
    TORCH_CHECK(states.scalar_type() == x.scalar_type(), "states: x's dtype");
  }
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes(), "dy must be [B, T, D]");
  TORCH_CHECK(dhT.is_contiguous() && dhT.numel() == m.Bt * m.D * m.N, "dhT must be [B, D, N]");
  const bool SB = Bm.dim() == 3, SC = Cm.dim() == 3;
  auto opt = x.options();
  auto dx = at::empty_like(x), ddl = at::empty_like(x);
  auto dA_part = at::empty({m.Bt, m.D, m.N}, opt), dD_part = at::empty({m.Bt, m.D}, opt);
  auto dh0 = at::empty({m.Bt, m.D, m.N}, opt);
  auto dbias_part = has_bias ? at::empty({m.Bt, m.D}, opt) : at::empty({0}, opt);
  // every element is written by the kernel (shared: per block of channels; per channel: as B, C)
  auto dB = SB ? at::empty({m.Bt, m.T, m.nblk, m.N}, opt) : at::empty_like(Bm);
  auto dC = SC ? at::empty({m.Bt, m.T, m.nblk, m.N}, opt) : at::empty_like(Cm);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "seqmix_selective_scan_backward", [&] {
    auto run = [&](auto kernel) {
      kernel(x.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(),
             Bm.data_ptr<scalar_t>(), Cm.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(Dv),
             ptr_or_null<scalar_t>(delta_bias), all ? nullptr : states.data_ptr<scalar_t>(), all ? states.data_ptr<scalar_t>() : nullptr,
             all ? decays.data_ptr<scalar_t>() : nullptr, dy.data_ptr<scalar_t>(), dhT.data_ptr<scalar_t>(),
             dx.data_ptr<scalar_t>(), ddl.data_ptr<scalar_t>(), dA_part.data_ptr<scalar_t>(),
             dB.data_ptr<scalar_t>(), dC.data_ptr<scalar_t>(), dD_part.data_ptr<scalar_t>(),
             dh0.data_ptr<scalar_t>(), has_bias ? dbias_part.data_ptr<scalar_t>() : nullptr, m);
    };
    SEQMIX_SCAN_BC_DISPATCH(backward_kernel, SB, SC, run);
  });
  return {dx, ddl, dA_part, dB, dC, dD_part, dh0, dbias_part};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) {
  mod.def("forward", &scan_forward, "selective scan forward (CPU)");
  mod.def("backward", &scan_backward, "selective scan backward (CPU)");
  mod.attr("BLOCK") = kBlock;
}
