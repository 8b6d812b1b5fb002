// spec_zoo::amx_linear(x [..., K] bf16, packed weight, N) -> y [..., N] bf16 = x @ weight^T on AMX.
//
// Batch-invariant by construction: rows go through the matrix engine in tiles of 16 (zero-padded),
// and one tile product (TDPBF16PS) computes every output element from its own row of x and column
// of the weight alone, accumulating over K chunk by chunk in increasing order into an fp32 tile.
// Which other rows share a tile, and how many there are, never changes that arithmetic, so a row is
// bit-identical for any M; the fp32 sum is rounded to bf16 once at the end (round to nearest even).
//
// The packed weight (`spec_zoo.runtime.amx_gemm.pack`) is [ceil(N / (16 G)), ceil(K / 32), G, 16, 16, 2]: a
// group of G column tiles, each chunk of 32 k's as the B tile's VNNI layout (16 rows of k pairs x 16
// columns x 2), so a group's weights are one contiguous stream, read from memory once per call.
// Built for this CPU (-march=native); without AMX-BF16 the op refuses (the Python side checks first).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SPEC_ZOO_AMX 1
#endif

namespace {

constexpr int64_t TILE_ROWS = 16, TILE_K = 32, TILE_N = 16, GROUP = 4;  // GROUP column tiles share an A tile

#ifdef SPEC_ZOO_AMX
struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0..3: the fp32 accumulators of GROUP column tiles; 4: x's chunk; 5..7: weight chunks
void configure() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = TILE_ROWS;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

bool request_tiles() {  // Linux hands a process AMX's tile state only when it asks
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

// y[0..16) x [16 G columns of group g] for one 16-row tile of x (xs: [16, Kp] bf16, zero-padded)
void group_tile(const c10::BFloat16* xs, int64_t Kp, const c10::BFloat16* w, int64_t chunks, float* out) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  constexpr int64_t tile = TILE_K * TILE_N;  // bf16 elements of one B tile
  for (int64_t c = 0; c < chunks; ++c) {
    const c10::BFloat16* wc = w + c * GROUP * tile;
    _tile_loadd(4, xs + c * TILE_K, Kp * 2);
    _tile_loadd(5, wc, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, wc + tile, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, wc + 2 * tile, 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, wc + 3 * tile, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out, GROUP * TILE_N * 4);
  _tile_stored(1, out + TILE_N, GROUP * TILE_N * 4);
  _tile_stored(2, out + 2 * TILE_N, GROUP * TILE_N * 4);
  _tile_stored(3, out + 3 * TILE_N, GROUP * TILE_N * 4);
}
#endif

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N) {
#ifndef SPEC_ZOO_AMX
  TORCH_CHECK(false, "amx_linear: this build has no AMX-BF16 (the CPU lacks it); use model.gemm=inductor");
  return x;
#else
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "amx_linear computes in bfloat16");
  static const bool granted = request_tiles();
  TORCH_CHECK(granted, "amx_linear: Linux refused this process AMX's tile state (arch_prctl)");
  const int64_t K = x.size(-1), chunks = (K + TILE_K - 1) / TILE_K, Kp = chunks * TILE_K;
  const int64_t groups = (N + GROUP * TILE_N - 1) / (GROUP * TILE_N);
  TORCH_CHECK(packed.dim() == 6 && packed.size(0) == groups && packed.size(1) == chunks && packed.size(2) == GROUP &&
                  packed.size(3) == TILE_K / 2 && packed.size(4) == TILE_N && packed.size(5) == 2,
              "amx_linear: the weight must be packed by spec_zoo.runtime.amx_gemm.pack");
  auto xs = x.reshape({-1, K});
  const int64_t M = xs.size(0), row_tiles = (M + TILE_ROWS - 1) / TILE_ROWS;
  // x zero-padded to whole tiles (rows and K): padding adds exact zeros to no real output
  auto xp = at::zeros({row_tiles * TILE_ROWS, Kp}, x.options());
  xp.narrow(0, 0, M).narrow(1, 0, K).copy_(xs);
  auto ws = packed.contiguous();
  auto y = at::empty({M, N}, x.options());
  const auto* xd = xp.data_ptr<c10::BFloat16>();
  const auto* wd = ws.data_ptr<c10::BFloat16>();
  auto* yd = y.data_ptr<c10::BFloat16>();
  const int64_t stride = chunks * GROUP * TILE_K * TILE_N;  // bf16 elements of one packed group
  // threads split the column groups: a thread owns whole outputs, so the split changes no sum
  at::parallel_for(0, groups, 4, [&](int64_t begin, int64_t end) {
    configure();
    float out[TILE_ROWS * GROUP * TILE_N];
    for (int64_t g = begin; g < end; ++g) {
      const int64_t n0 = g * GROUP * TILE_N, width = std::min<int64_t>(GROUP * TILE_N, N - n0);
      for (int64_t r = 0; r < row_tiles; ++r) {
        group_tile(xd + r * TILE_ROWS * Kp, Kp, wd + g * stride, chunks, out);
        const int64_t rows = std::min<int64_t>(TILE_ROWS, M - r * TILE_ROWS);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < width; ++j)
            yd[(r * TILE_ROWS + i) * N + n0 + j] = c10::BFloat16(out[i * GROUP * TILE_N + j]);
      }
    }
    _tile_release();
  });
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  return y.view(sizes);
#endif
}

bool amx_available() {
#ifdef SPEC_ZOO_AMX
  return request_tiles();
#else
  return false;
#endif
}

std::vector<int64_t> amx_layout() { return {GROUP, TILE_K, TILE_N}; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(spec_zoo, m) {
  m.def("amx_linear(Tensor x, Tensor packed, int N) -> Tensor");
  m.def("amx_available() -> bool", &amx_available);
  m.def("amx_layout() -> int[]", &amx_layout);
}

TORCH_LIBRARY_IMPL(spec_zoo, CPU, m) { m.impl("amx_linear", &amx_linear); }
