// The SIMD primitives spec-zoo's batch-invariant kernels share (skinny_gemm.cpp,
// attention_kernel.cpp). The ISA is chosen when a kernel is compiled (-march=native): AVX-512
// (16 lanes), AVX2 + FMA (8 lanes) or a portable scalar path; MR x NB is the GEMM's register tile.
// `hsum` adds a vector's lanes in one fixed pairwise tree, so a sum's bits never depend on which
// sums ran beside it.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace spec_zoo_simd {

#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
constexpr int LANES = 16, MR = 4, NB = 6;  // tiles of up to MR rows x NB weight rows
using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vload(const c10::BFloat16* p) {  // bf16 -> float is exact: the bf16 bits are the float's high half
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vbroadcast(float x) { return _mm512_set1_ps(x); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec vfloor(Vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline Vec vpow2(Vec n) {  // 2^n for integral n in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline Vec vkeep_ge(Vec a, float bound, Vec x) {  // x where a >= bound, else 0
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(bound), _CMP_GE_OQ), x);
}
inline float hsum(Vec v) {  // (i + i+8), then (i + i+4), (i + i+2), (i + i+1)
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
constexpr int LANES = 8, MR = 4, NB = 3;
using Vec = __m256;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vload(const c10::BFloat16* p) {  // bf16 -> float is exact: the bf16 bits are the float's high half
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vbroadcast(float x) { return _mm256_set1_ps(x); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vfloor(Vec a) { return _mm256_floor_ps(a); }
inline Vec vpow2(Vec n) {  // 2^n for integral n in [-126, 127]
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline Vec vkeep_ge(Vec a, float bound, Vec x) {  // x where a >= bound, else 0
  return _mm256_and_ps(_mm256_cmp_ps(a, _mm256_set1_ps(bound), _CMP_GE_OQ), x);
}
inline float hsum(Vec v) {  // (i + i+4), then (i + i+2), (i + i+1)
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
#else
constexpr const char* kIsa = "portable";
constexpr int LANES = 8, MR = 2, NB = 2;
struct Vec { float v[LANES]; };
inline Vec vzero() { return Vec{}; }
inline Vec vload(const float* p) { Vec r; for (int l = 0; l < LANES; ++l) r.v[l] = p[l]; return r; }
inline Vec vload(const c10::BFloat16* p) { Vec r; for (int l = 0; l < LANES; ++l) r.v[l] = float(p[l]); return r; }
inline Vec vfma(Vec a, Vec b, Vec c) { for (int l = 0; l < LANES; ++l) c.v[l] = std::fma(a.v[l], b.v[l], c.v[l]); return c; }
inline Vec vbroadcast(float x) { Vec r; for (int l = 0; l < LANES; ++l) r.v[l] = x; return r; }
inline void vstore(float* p, Vec v) { for (int l = 0; l < LANES; ++l) p[l] = v.v[l]; }
#define SPEC_ZOO_LANEWISE(name, expr) \
  inline Vec name(Vec a, Vec b) { Vec r; for (int l = 0; l < LANES; ++l) { float x = a.v[l], y = b.v[l]; r.v[l] = (expr); } return r; }
SPEC_ZOO_LANEWISE(vadd, x + y)
SPEC_ZOO_LANEWISE(vsub, x - y)
SPEC_ZOO_LANEWISE(vmul, x * y)
SPEC_ZOO_LANEWISE(vmax, x > y ? x : y)
#undef SPEC_ZOO_LANEWISE
inline Vec vfloor(Vec a) { for (int l = 0; l < LANES; ++l) a.v[l] = std::floor(a.v[l]); return a; }
inline Vec vpow2(Vec n) { for (int l = 0; l < LANES; ++l) n.v[l] = std::ldexp(1.f, int(n.v[l])); return n; }
inline Vec vkeep_ge(Vec a, float bound, Vec x) {
  for (int l = 0; l < LANES; ++l) x.v[l] = a.v[l] >= bound ? x.v[l] : 0.f;
  return x;
}
inline float hsum(Vec v) {
  for (int w = LANES / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) v.v[l] = v.v[l] + v.v[l + w];
  return v.v[0];
}
#endif

// exp(x) for x <= 0, lane by lane, in one fixed sequence of operations (Cephes' expf: x = n ln 2 + r,
// a degree-5 polynomial in r, times 2^n), so its bits depend on x alone; below -87 it is 0.
inline Vec vexp(Vec x) {
  const Vec lo = vbroadcast(-87.f);
  const Vec y = vmax(x, lo);
  const Vec n = vfloor(vfma(y, vbroadcast(1.44269504088896341f), vbroadcast(0.5f)));
  Vec r = vfma(n, vbroadcast(-0.693359375f), y);
  r = vfma(n, vbroadcast(2.12194440e-4f), r);
  Vec p = vbroadcast(1.9875691500e-4f);
  p = vfma(p, r, vbroadcast(1.3981999507e-3f));
  p = vfma(p, r, vbroadcast(8.3334519073e-3f));
  p = vfma(p, r, vbroadcast(4.1665795894e-2f));
  p = vfma(p, r, vbroadcast(1.6666665459e-1f));
  p = vfma(p, r, vbroadcast(5.0000001201e-1f));
  p = vadd(vfma(p, vmul(r, r), r), vbroadcast(1.f));
  return vkeep_ge(x, -87.f, vmul(p, vpow2(n)));
}

}  // namespace spec_zoo_simd
