// spec_zoo::quant_linear(x [..., K], codes, scales, lows, bits) -> y [..., N] = x @ W^T, float32, where W is
// stored at its own width: every group of 32 weights of a row as `bits`-bit codes q with one scale d and one
// low m, w = d * q + m (GGUF's Q4_1 is bits 4; Q8_0 is bits 8 with m = 0). The weights are dequantized in
// registers and never written out: a step reads a seventh of the float32 bytes.
//
// codes: bits 4, uint8 [N, K / 2], a group's 16 bytes holding weight b in the low nibble of byte b and weight
// b + 16 in its high nibble (GGUF's order; quant_linear on AVX-512 takes them in `lanes` order, see run4);
// bits 8, int8 [N, K]. scales, lows: float32 [N, K / 32], each d a
// float16 value, so d * q is exact in float32 and d * q + m rounds once: the weight's bits are those of the
// float32 dequantization (`spec_zoo.runtime.quant_gemm.dequantize`) whichever instruction computes it.
//
// Batch-invariant by construction, and the same sums as the skinny GEMM (skinny_gemm.cpp) over the
// dequantized weights: LANES partial sums (lane l takes k = l, l + LANES, ... in increasing order, one fused
// multiply-add each), added in `hsum`'s fixed tree. Which rows share a register tile changes no sum.
// At 4 bits AVX-512 looks each group's 16 possible weights up in one register (a permute per 16 weights, the
// codes in `lanes` order: see run4); AVX2, the portable path and 8 bits convert the codes and multiply-add.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "simd.h"

namespace {

using namespace spec_zoo_simd;

constexpr int GROUP = 32;              // weights per scale
constexpr int PER = GROUP / LANES;     // vectors per group
#if defined(__AVX512F__)
constexpr int NQ = 4;                  // weight rows per register tile
#else
constexpr int NQ = 2;
#endif

// The group's 32 weights as PER vectors (vector v holds k = v * LANES + l in lane l).
template <int bits>
inline void dequant(const uint8_t* c, float d, float m, Vec* w) {
#if defined(__AVX512F__)
  static_assert(bits == 8, "4-bit codes on AVX-512 go through run4");
  const __m512 dv = _mm512_set1_ps(d), mv = _mm512_set1_ps(m);
  for (int v = 0; v < PER; ++v)
    w[v] = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(c + v * LANES)))), dv, mv);
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
  if constexpr (bits == 4) {
    const __m128i raw = _mm_loadu_si128((const __m128i*)c), mask = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int v = 0; v < PER; ++v) w[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[v])), dv, mv);
  } else {
    for (int v = 0; v < PER; ++v)
      w[v] = _mm256_fmadd_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(c + v * LANES)))), dv, mv);
  }
#else
  for (int k = 0; k < GROUP; ++k) {
    const int q = bits == 4 ? (k < 16 ? c[k] & 15 : c[k - 16] >> 4) : int(int8_t(c[k]));
    w[k / LANES].v[k % LANES] = std::fma(float(q), d, m);
  }
#endif
}

#if defined(__AVX512F__)
// 4-bit codes on AVX-512 come in `lanes` order (spec_zoo.runtime.quant_gemm.kernel_codes): a run of four groups is 64
// bytes whose dword l holds, in nibble 2j and 2j + 1, group j's weights l and 16 + l; so one load, then one shift
// per 16 weights, gives a permute its indices (vpermps reads an index's low 4 bits). A run of two groups holds
// them in 16-bit lanes, a single group in byte lanes (GGUF's order). Each lane still sums k = l, l + 16, ... in
// increasing order: the same sums as the group-by-group path.
template <int run, int mr, int nr>
inline void run4(const float* x, int64_t ldx, const uint8_t* c, int64_t ldc, const float* d, const float* m,
                 int64_t ldg, int64_t g, Vec (&acc)[mr][nr]) {
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int j = 0; j < nr; ++j) {
    const uint8_t* cj = c + j * ldc + g * GROUP / 2;
    __m512i raw;
    if constexpr (run == 4) raw = _mm512_loadu_si512(cj);
    else if constexpr (run == 2) raw = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)cj));
    else raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)cj));
    __m512 table = iota;
    for (int s = 0; s < 2 * run; ++s) {  // group g + s / 2, its half s % 2
      const int64_t at = j * ldg + g + s / 2;
      if (s % 2 == 0) table = _mm512_fmadd_ps(iota, _mm512_set1_ps(d[at]), _mm512_set1_ps(m[at]));
      const __m512 w = _mm512_permutexvar_ps(s ? _mm512_srli_epi32(raw, 4 * s) : raw, table);
      for (int i = 0; i < mr; ++i)
        acc[i][j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i * ldx + (g + s / 2) * GROUP + s % 2 * 16), w, acc[i][j]);
    }
  }
}
#endif

// One register tile: rows x[0..mr) against weight rows j = 0..nr (codes row j at c + j * ldc, its
// scales and lows at d + j * ldg, m + j * ldg): y[i][j] = <x_i, w_j>.
template <int bits, int mr, int nr>
void tile(const float* x, int64_t ldx, const uint8_t* c, int64_t ldc, const float* d, const float* m,
          int64_t ldg, int64_t K, float* y, int64_t ldy) {
  Vec acc[mr][nr];
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) acc[i][j] = vzero();
#if defined(__AVX512F__)
  if constexpr (bits == 4) {
    const int64_t G = K / GROUP;
    int64_t g = 0;
    for (; g + 4 <= G; g += 4) run4<4>(x, ldx, c, ldc, d, m, ldg, g, acc);
    if (g + 2 <= G) run4<2>(x, ldx, c, ldc, d, m, ldg, g, acc), g += 2;
    if (g < G) run4<1>(x, ldx, c, ldc, d, m, ldg, g, acc);
  } else
#endif
  {
    for (int64_t g = 0; g < K / GROUP; ++g) {
      for (int j = 0; j < nr; ++j) {
        Vec w[PER];
        dequant<bits>(c + j * ldc + g * GROUP * bits / 8, d[j * ldg + g], m[j * ldg + g], w);
        for (int i = 0; i < mr; ++i)
          for (int v = 0; v < PER; ++v) acc[i][j] = vfma(vload(x + i * ldx + g * GROUP + v * LANES), w[v], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

using TileFn = void (*)(const float*, int64_t, const uint8_t*, int64_t, const float*, const float*, int64_t,
                        int64_t, float*, int64_t);

template <int bits, int mr, std::size_t... n>
constexpr std::array<TileFn, NQ> tile_row(std::index_sequence<n...>) {
  return {&tile<bits, mr, int(n) + 1>...};
}
template <int bits, std::size_t... r>
constexpr std::array<std::array<TileFn, NQ>, MR> tile_table(std::index_sequence<r...>) {
  return {tile_row<bits, int(r) + 1>(std::make_index_sequence<NQ>())...};
}
constexpr auto kTiles4 = tile_table<4>(std::make_index_sequence<MR>());
constexpr auto kTiles8 = tile_table<8>(std::make_index_sequence<MR>());

// Ask for [p, p + bytes) (clipped at end) in L2 ahead of its use: a weight block is short (a few cache lines
// per row), so the hardware's stream prefetchers start late on each of the several streams a tile reads.
constexpr int AHEAD = 4;  // blocks
inline void prefetch(const void* p, const void* end, int64_t bytes) {
  const char* from = static_cast<const char*>(p);
  const char* to = std::min(from + bytes, static_cast<const char*>(end));
  for (; from < to; from += 64) __builtin_prefetch(from, 0, 2);
}

// Both kernels' operands, checked, as [M, K] rows and contiguous weights; y the [M, N] output.
struct Operands {
  int64_t K, N, G, M, ldc;
  at::Tensor xs, cs, ds, ms, y;
  std::vector<int64_t> sizes;  // y's shape as x's batch dims

  Operands(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& lows,
           int64_t bits)
      : K(x.size(-1)), N(codes.size(0)), G(K / GROUP) {
    TORCH_CHECK(bits == 4 || bits == 8, "quant_linear: bits must be 4 or 8, not ", bits);
    TORCH_CHECK(x.scalar_type() == at::kFloat && scales.scalar_type() == at::kFloat &&
                    lows.scalar_type() == at::kFloat,
                "quant_linear computes in float32 (x, scales and lows)");
    TORCH_CHECK(codes.scalar_type() == (bits == 4 ? at::kByte : at::kChar),
                "quant_linear: codes are uint8 (bits 4) or int8 (bits 8)");
    TORCH_CHECK(K % GROUP == 0 && codes.dim() == 2 && codes.size(1) == K * bits / 8,
                "quant_linear: codes must be [N, ", K * bits / 8, "] for K = ", K, " (a multiple of 32)");
    TORCH_CHECK(scales.sizes() == lows.sizes() && scales.dim() == 2 && scales.size(0) == N && scales.size(1) == G,
                "quant_linear: scales and lows must be [N, K / 32]");
    xs = x.reshape({-1, K}).contiguous();
    cs = codes.contiguous();
    ds = scales.contiguous();
    ms = lows.contiguous();
    M = xs.size(0);
    ldc = K * bits / 8;
    y = at::empty({M, N}, x.options());
    sizes = x.sizes().vec();
    sizes.back() = N;
    xp = xs.data_ptr<float>();
    cp = static_cast<const uint8_t*>(cs.data_ptr());
    dp = ds.data_ptr<float>();
    mp = ms.data_ptr<float>();
    yp = y.data_ptr<float>();
  }
  const float* x() const { return xp; }
  const uint8_t* codes(int64_t n) const { return cp + n * ldc; }
  const float* scales(int64_t n) const { return dp + n * G; }
  const float* lows(int64_t n) const { return mp + n * G; }
  float* out(int64_t m, int64_t n) const { return yp + m * N + n; }

 private:  // raw pointers taken once: data_ptr checks its type on every call, and tiles are many and small
  const float* xp;
  const uint8_t* cp;
  const float *dp, *mp;
  float* yp;
};

// tile(m0, mr, n0, nr) over all of y: row groups of at most `rows` rows (as even as they split) by blocks of
// `block` weight rows. Threads split the blocks (a thread owns whole outputs: no sum changes); a block is
// asked for AHEAD blocks before its use, read from memory once, then from L1 for every further row group.
template <class Tile>
at::Tensor for_each_tile(const Operands& o, int rows, int block, const Tile& tile) {
  const int64_t groups = (o.M + rows - 1) / rows, blocks = (o.N + block - 1) / block;
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * block, nr = std::min<int64_t>(block, o.N - n0), next = n0 + AHEAD * block;
      prefetch(o.codes(next), o.codes(o.N), block * o.ldc);
      prefetch(o.scales(next), o.scales(o.N), block * o.G * 4);
      prefetch(o.lows(next), o.lows(o.N), block * o.G * 4);
      for (int64_t g = 0, m0 = 0; g < groups; ++g) {
        const int64_t mr = o.M / groups + (g < o.M % groups ? 1 : 0);
        tile(m0, mr, n0, nr);
        m0 += mr;
      }
    }
  });
  return o.y.view(o.sizes);
}

at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                        const at::Tensor& lows, int64_t bits) {
  const Operands o(x, codes, scales, lows, bits);
  const auto& tiles = bits == 4 ? kTiles4 : kTiles8;
  return for_each_tile(o, MR, NQ, [&](int64_t m0, int64_t mr, int64_t n0, int64_t nr) {
    tiles[mr - 1][nr - 1](o.x() + m0 * o.K, o.K, o.codes(n0), o.ldc, o.scales(n0), o.lows(n0), o.G, o.K,
                          o.out(m0, n0), o.N);
  });
}

// ---- int8 activations (a draft's arithmetic, not the target's) ---------------------------------------------
// quant_linear_q8 rounds every group of 32 inputs of a row to int8 with a scale of its own (dx = max|x| / 127,
// llama.cpp's Q8_1) and sums each group's codes as integers: y = sum_g d_g dx_g <q_g, qx_g> + m_g dx_g sum(qx_g).
// Integer dot products (VNNI, or AVX2's maddubs) do four to eight times the weights per instruction of float
// multiply-adds, so a step streams the codes near the core's bandwidth. The result is not the float32 sums'
// (the inputs are rounded); a row's bits still depend on that row alone, in a fixed order.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr int QG = 4;  // groups per step at 4 bits (a 64-byte load of codes); 2 at 8 bits
#define Q8_AVX512 1
#else
constexpr int QG = 1;
#endif
constexpr int QMR = 4, QNR = 4;  // register tile: rows of x by weight rows

// A row of x as int8 codes in the order the kernel reads them, padded with zero groups past a multiple of 16 (a
// step's 16-lane loads stay inside it):
// at 4 bits on AVX-512, each run of four groups as their first halves then their second halves (a code
// byte's low nibbles, then its high ones); otherwise group by group. dx: each group's scale; sx = dx * sum(qx).
struct Q8Rows {
  int64_t G, Gp;  // groups, and padded
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  Q8Rows(const float* x, int64_t M, int64_t K, int bits) : G(K / GROUP), Gp((K / GROUP + 15) / 16 * 16 + 16),
      q(M * Gp * GROUP, 0), dx(M * Gp, 0.f), sx(M * Gp, 0.f) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t g = 0; g < G; ++g) {
        const float* xs = x + i * K + g * GROUP;
        float amax = 0.f;
        for (int k = 0; k < GROUP; ++k) amax = std::max(amax, std::fabs(xs[k]));
        const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        int sum = 0;
        for (int k = 0; k < GROUP; ++k) {
          const int v = int(std::nearbyint(xs[k] * inv));
          sum += v;
          int64_t at = g * GROUP + k;
          if (bits == 4 && QG == 4) {  // run r = g / 4: [g0 k<16, g1 k<16, g2, g3 | g0 k>=16, ...]
            const int64_t r = g / 4, j = g % 4;
            at = r * 4 * GROUP + (k < 16 ? j * 16 + k : 64 + j * 16 + k - 16);
          }
          q[i * Gp * GROUP + at] = int8_t(v);
        }
        dx[i * Gp + g] = d;
        sx[i * Gp + g] = d * float(sum);
      }
  }
};

// y[i][j] for rows i < mr of x and weight rows j < nr: the integer dot products' part, then the lows' part.
template <int bits, int mr, int nr>
void tile_q8(const Q8Rows& xq, int64_t i0, const uint8_t* c, int64_t ldc, const float* d, const float* m, int64_t ldg,
             float* y, int64_t ldy) {
  const int64_t G = xq.G, Gp = xq.Gp;
  float dot[mr][nr], low[mr][nr];
#if defined(Q8_AVX512)
  constexpr int step = bits == 4 ? 4 : 2;  // groups per 64-byte load of codes
  const __m512i spread = bits == 4 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)
                                   : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 acc[mr][nr];
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; g += step) {
    const int live = int(std::min<int64_t>(step, G - g));
    const __mmask64 bytes = live == step ? ~__mmask64(0) : (__mmask64(1) << (live * GROUP * bits / 8)) - 1;
    const __mmask16 scales = __mmask16((1u << live) - 1);
    for (int j = 0; j < nr; ++j) {
      const __m512i raw = _mm512_maskz_loadu_epi8(bytes, c + j * ldc + g * GROUP * bits / 8);
      const __m512 dw = _mm512_maskz_loadu_ps(scales, d + j * ldg + g);
      for (int i = 0; i < mr; ++i) {
        const int8_t* qx = xq.q.data() + (i0 + i) * Gp * GROUP + g * GROUP;
        __m512i sum = _mm512_setzero_si512();
        if constexpr (bits == 4) {
          const __m512i mask = _mm512_set1_epi8(15);
          sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(raw, mask), _mm512_loadu_si512(qx));
          sum = _mm512_dpbusd_epi32(sum, _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask), _mm512_loadu_si512(qx + 64));
        } else {  // signed codes as q + 128 (unsigned); the lows' part takes the 128 back
          sum = _mm512_dpbusd_epi32(sum, _mm512_xor_si512(raw, _mm512_set1_epi8(char(0x80))), _mm512_loadu_si512(qx));
        }
        const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(xq.dx.data() + (i0 + i) * Gp + g));
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_permutexvar_ps(spread, scale), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      dot[i][j] = _mm512_reduce_add_ps(acc[i][j]);
      __m512 lows = _mm512_setzero_ps();
      for (int64_t g = 0; g < G; g += 16) {
        const __mmask16 live = __mmask16(G - g >= 16 ? 0xFFFF : (1u << (G - g)) - 1);
        __m512 mv = _mm512_maskz_loadu_ps(live, m + j * ldg + g);
        if constexpr (bits == 8) mv = _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(live, d + j * ldg + g), _mm512_set1_ps(128.f), mv);
        lows = _mm512_fmadd_ps(mv, _mm512_loadu_ps(xq.sx.data() + (i0 + i) * Gp + g), lows);
      }
      low[i][j] = _mm512_reduce_add_ps(lows);
    }
#else
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      const int8_t* qx = xq.q.data() + (i0 + i) * Gp * GROUP;
      const float* dx = xq.dx.data() + (i0 + i) * Gp;
      const float* sx = xq.sx.data() + (i0 + i) * Gp;
      const uint8_t* cj = c + j * ldc;
#if defined(__AVX2__) && defined(__FMA__)
      __m256 acc = _mm256_setzero_ps();
      const __m256i ones = _mm256_set1_epi16(1);
      for (int64_t g = 0; g < G; ++g) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(qx + g * GROUP));
        __m256i pairs;
        if constexpr (bits == 4) {
          const __m128i raw = _mm_loadu_si128((const __m128i*)(cj + g * 16)), mask = _mm_set1_epi8(15);
          const __m256i w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
          pairs = _mm256_maddubs_epi16(w, xv);
        } else {  // |w| times x with w's sign: no product leaves int16
          const __m256i w = _mm256_loadu_si256((const __m256i*)(cj + g * GROUP));
          pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), _mm256_set1_ps(d[j * ldg + g] * dx[g]),
                              acc);
      }
      const __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
      dot[i][j] = _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
#else
      float acc = 0.f;
      for (int64_t g = 0; g < G; ++g) {
        int sum = 0;
        for (int k = 0; k < GROUP; ++k) {
          const int q = bits == 4 ? (k < 16 ? cj[g * 16 + k] & 15 : cj[g * 16 + k - 16] >> 4)
                                  : int(int8_t(cj[g * GROUP + k]));
          sum += q * qx[g * GROUP + k];
        }
        acc = std::fma(float(sum), d[j * ldg + g] * dx[g], acc);
      }
      dot[i][j] = acc;
#endif
      float lows = 0.f;
      for (int64_t g = 0; g < G; ++g) lows = std::fma(m[j * ldg + g], sx[g], lows);
      low[i][j] = lows;
    }
#endif
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) y[i * ldy + j] = dot[i][j] + low[i][j];
}

using TileQ8Fn = void (*)(const Q8Rows&, int64_t, const uint8_t*, int64_t, const float*, const float*, int64_t,
                          float*, int64_t);

template <int bits, int mr, std::size_t... n>
constexpr std::array<TileQ8Fn, QNR> tile_q8_row(std::index_sequence<n...>) {
  return {&tile_q8<bits, mr, int(n) + 1>...};
}
template <int bits, std::size_t... r>
constexpr std::array<std::array<TileQ8Fn, QNR>, QMR> tile_q8_table(std::index_sequence<r...>) {
  return {tile_q8_row<bits, int(r) + 1>(std::make_index_sequence<QNR>())...};
}
constexpr auto kTilesQ8_4 = tile_q8_table<4>(std::make_index_sequence<QMR>());
constexpr auto kTilesQ8_8 = tile_q8_table<8>(std::make_index_sequence<QMR>());

at::Tensor quant_linear_q8(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                           const at::Tensor& lows, int64_t bits) {
  const Operands o(x, codes, scales, lows, bits);
  const Q8Rows xq(o.x(), o.M, o.K, int(bits));
  const auto& tiles = bits == 4 ? kTilesQ8_4 : kTilesQ8_8;
  return for_each_tile(o, QMR, QNR, [&](int64_t m0, int64_t mr, int64_t n0, int64_t nr) {
    tiles[mr - 1][nr - 1](xq, m0, o.codes(n0), o.ldc, o.scales(n0), o.lows(n0), o.G, o.out(m0, n0), o.N);
  });
}

// The float32 weights [N, K] of the codes quant_linear reads (w = d * q + m, the one rounding `dequantize`
// makes: d * q is exact), for a call whose rows are many (a prompt). At 4 bits on AVX-512 the codes are in
// `lanes` order (run4): a run of R groups' bytes as 16 x R, group j's byte b at b * R + j.
at::Tensor quant_weight(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& lows, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "quant_weight: bits must be 4 or 8, not ", bits);
  const int64_t N = codes.size(0), G = scales.size(1), K = G * GROUP, ldc = K * bits / 8;
  TORCH_CHECK(codes.size(1) == ldc && scales.sizes() == lows.sizes() && scales.size(0) == N,
              "quant_weight: codes [N, K * bits / 8], scales and lows [N, K / 32]");
  const at::Tensor cs = codes.contiguous(), ds = scales.contiguous(), ms = lows.contiguous();
  at::Tensor w = at::empty({N, K}, scales.options());
  const uint8_t* c = static_cast<const uint8_t*>(cs.data_ptr());
  const float *d = ds.data_ptr<float>(), *m = ms.data_ptr<float>();
  float* out = w.data_ptr<float>();
#if defined(__AVX512F__)
  constexpr bool lanes = true;
#else
  constexpr bool lanes = false;
#endif
  at::parallel_for(0, N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = c + n * ldc;
      for (int64_t g = 0; g < G;) {
        const int run = bits == 4 && lanes ? (g + 4 <= G ? 4 : g + 2 <= G ? 2 : 1) : 1;
        for (int j = 0; j < run; ++j) {
          const float dg = d[n * G + g + j], mg = m[n * G + g + j];
          float* o = out + n * K + (g + j) * GROUP;
          if (bits == 4) {
            const uint8_t* q = row + g * GROUP / 2 + j;
            for (int b = 0; b < GROUP / 2; ++b) {
              o[b] = std::fma(float(q[b * run] & 15), dg, mg);
              o[b + GROUP / 2] = std::fma(float(q[b * run] >> 4), dg, mg);
            }
          } else {
            const int8_t* q = reinterpret_cast<const int8_t*>(row) + (g + j) * GROUP;
            for (int k = 0; k < GROUP; ++k) o[k] = std::fma(float(q[k]), dg, mg);
          }
        }
        g += run;
      }
    }
  });
  return w;
}

std::string quant_isa() { return kIsa; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(spec_zoo, m) {
  m.def("quant_linear(Tensor x, Tensor codes, Tensor scales, Tensor lows, int bits) -> Tensor");
  m.def("quant_linear_q8(Tensor x, Tensor codes, Tensor scales, Tensor lows, int bits) -> Tensor");
  m.def("quant_weight(Tensor codes, Tensor scales, Tensor lows, int bits) -> Tensor");
  m.def("quant_isa() -> str", &quant_isa);
}

TORCH_LIBRARY_IMPL(spec_zoo, CPU, m) { m.impl("quant_linear", &quant_linear);
  m.impl("quant_linear_q8", &quant_linear_q8);
  m.impl("quant_weight", &quant_weight);
}
