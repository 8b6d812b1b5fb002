// spec_zoo::skinny_linear(x [..., K], packed weight, N) -> y [..., N] = x @ weight^T, float32.
//
// Batch-invariant by construction: every output y[m, n] is reduced over K the same way whatever
// the row count. It keeps LANES partial sums (lane l takes k = l, l + LANES, ... in increasing
// order, one fused multiply-add each), adds them in one fixed pairwise tree (`hsum`), then adds the
// K % LANES tail in order. Which rows and weight rows share a register tile changes only which
// sums run side by side, never the arithmetic of one sum, so a row is bit-identical for any M.
//
// The ISA is chosen when this file is compiled (-march=native): AVX-512 (16 lanes, register tiles of
// up to 4 rows x 6 weight rows), AVX2 + FMA (8 lanes, 4 x 3), or a portable scalar path (2 x 2).
// Each block of weight rows is read from memory once per call and reused from L1 for every group of rows.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <array>
#include <vector>
#include <cmath>
#include <utility>

#include "simd.h"

namespace {

using namespace spec_zoo_simd;

// One register tile: rows x[0..mr) against weight rows j = 0..nr of a packed block (`w` points
// at row j = 0 of chunk 0; chunk c of row j lies at w + c * NB * LANES + j * LANES),
// y[i][j] = <x_i, w_j>.
template <int mr, int nr>
void tile(const float* x, int64_t ldx, const float* w, int64_t K, float* y, int64_t ldy) {
  constexpr int64_t chunk = NB * LANES;
  Vec acc[mr][nr];
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) acc[i][j] = vzero();
  const int64_t body = K / LANES;
  for (int64_t c = 0; c < body; ++c) {
    Vec wv[nr];
    for (int j = 0; j < nr; ++j) {
      wv[j] = vload(w + c * chunk + j * LANES);
#if defined(__AVX512F__) || defined(__AVX2__)
      asm("" : "+x"(wv[j]));  // weights and x in registers: 3 + 4 loads per 12 FMAs, not 15 or 16
#endif
    }
    for (int i = 0; i < mr; ++i) {
      Vec xv = vload(x + i * ldx + c * LANES);
#if defined(__AVX512F__) || defined(__AVX2__)
      asm("" : "+x"(xv));
#endif
      for (int j = 0; j < nr; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t k = body * LANES; k < K; ++k)
        s = std::fma(x[i * ldx + k], w[body * chunk + j * LANES + k - body * LANES], s);
      y[i * ldy + j] = s;
    }
}

using TileFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);

template <int mr, std::size_t... n>
constexpr std::array<TileFn, NB> tile_row(std::index_sequence<n...>) {
  return {&tile<mr, int(n) + 1>...};
}
template <std::size_t... m>
constexpr std::array<std::array<TileFn, NB>, MR> tile_table(std::index_sequence<m...>) {
  return {tile_row<int(m) + 1>(std::make_index_sequence<NB>())...};
}
constexpr auto kTiles = tile_table(std::make_index_sequence<MR>());

// packed: the weight [N, K] laid out by `spec_zoo.runtime.skinny_gemm.pack` as [ceil(N / NB), ceil(K / LANES),
// NB, LANES] (zero-padded): a block's chunks are one contiguous stream, whatever K's stride.
at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "skinny_linear computes in float32");
  const int64_t K = x.size(-1);
  TORCH_CHECK(packed.dim() == 4 && packed.size(0) == (N + NB - 1) / NB && packed.size(1) == (K + LANES - 1) / LANES &&
                  packed.size(2) == NB && packed.size(3) == LANES,
              "skinny_linear: the weight must be packed by spec_zoo.runtime.skinny_gemm.pack for this build");
  auto xs = x.reshape({-1, K}).contiguous();
  auto ws = packed.contiguous();
  const int64_t M = xs.size(0), block = packed.size(1) * NB * LANES;
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  auto y = at::empty({M, N}, x.options());
  const float* xp = xs.data_ptr<float>();
  const float* wp = ws.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // rows in ceil(M / MR) groups as even as can be (5 rows: 3 + 2, not 4 + 1): a small group has
  // few independent FMA chains and runs latency-bound; which group a row is in changes no sum
  const int64_t groups = (M + MR - 1) / MR;
  // threads split the weight blocks: a thread owns whole outputs, so the split changes no sum;
  // each block (NB weight rows, one contiguous stream) is read from memory once, then from L1
  // for every further group of rows
  at::parallel_for(0, packed.size(0), 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t nr = std::min<int64_t>(NB, N - b * NB);
      for (int64_t g = 0, m0 = 0; g < groups; ++g) {
        const int64_t mr = M / groups + (g < M % groups ? 1 : 0);
        kTiles[mr - 1][nr - 1](xp + m0 * K, K, wp + b * block, K, yp + m0 * N + b * NB, N);
        m0 += mr;
      }
    }
  });
  return y.view(sizes);
}

std::vector<int64_t> skinny_layout() { return {LANES, NB}; }

std::string skinny_isa() { return kIsa; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(spec_zoo, m) {
  m.def("skinny_linear(Tensor x, Tensor packed, int N) -> Tensor");
  m.def("skinny_layout() -> int[]", &skinny_layout);
  m.def("skinny_isa() -> str", &skinny_isa);
}

TORCH_LIBRARY_IMPL(spec_zoo, CPU, m) { m.impl("skinny_linear", &skinny_linear); }
