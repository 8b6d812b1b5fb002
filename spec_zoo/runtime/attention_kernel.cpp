// spec_zoo::rowwise_attention(q [B, H, M, D], k, v [C, Hkv, T, D], mask [B or 1, 1, M or 1, S], draft_slots [M, N],
//                             draft_mask [M, N], scaling, softcap, row_cache [M] or None) -> out [B, H, M, D],
//                             float32 or bfloat16.
//
// The compiled runtime's attention as one kernel (the contract: `spec_zoo.runtime.compiled.rowwise_attention`).
// Inductor's loops for that formula re-read every key for every query row, one dependent accumulator
// chain per sum, so attention set the price of long contexts and of many scored rows. Here a block of
// keys is read into L1 once and used by every query row of its KV head (G query heads x M rows), and
// every sum of a row runs in one fixed order whatever the number of rows:
//  - a score <q, k> is LANES partial sums over D in increasing order, `hsum`, then the D tail in order;
//  - the softmax's max and denominator run over the prefix slots in slot order, then over the row's
//    draft path root first, each path key in the lane it takes once committed (`exponentiate_path`);
//    the output adds e * v (one lane per d) in the same order;
//  - a key whose additive mask is below -1e30, or whose weight e is exactly 0, is skipped: it would
//    add an exact 0, which changes no sum.
// So a row is bit-identical for any M, a tree node equals its path scored as a chain, and a draft row
// equals the row plain decoding scores once its path is committed (what makes speculative decoding's
// output plain decoding's, bit for bit).
// A packed batch of sequences (B = 1, `row_cache` given): row m reads cache entry row_cache[m] under its own
// mask row; each run of consecutive rows of one entry is one task, which changes no row's arithmetic, so a
// row of a batch is bit-identical to the same row scored alone.
// In bfloat16 the cache is read as it is stored (each bf16 widened to its exact float) and every
// sum above runs in float32; the output is rounded to bf16 once.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "simd.h"

namespace {

using namespace spec_zoo_simd;

constexpr float kMasked = -1e30f;   // an additive mask below this hides the key
constexpr int64_t kKeyBlock = 64;   // keys per block: 64 x D floats of K or V stay in L1 for every row
constexpr int kKeys = 4;            // scores computed side by side (independent FMA chains)

// out[t] = <q, k_t> for NK keys ldk elements apart; each the same arithmetic as NK = 1.
template <int NK, typename T>
inline void dots(const float* q, const T* k, int64_t ldk, int64_t D, float* out) {
  const int64_t body = D / LANES;
  Vec acc[NK];
  for (int t = 0; t < NK; ++t) acc[t] = vzero();
  for (int64_t c = 0; c < body; ++c) {
    const Vec qv = vload(q + c * LANES);
    for (int t = 0; t < NK; ++t) acc[t] = vfma(qv, vload(k + t * ldk + c * LANES), acc[t]);
  }
  for (int t = 0; t < NK; ++t) {
    float s = hsum(acc[t]);
    for (int64_t d = body * LANES; d < D; ++d) s = std::fma(q[d], float(k[t * ldk + d]), s);
    out[t] = s;
  }
}

inline float score(float dot, float scaling, float softcap, float mask) {
  float s = dot * scaling;
  if (softcap > 0.f) s = std::tanh(s / softcap) * softcap;
  return s + mask;
}

// acc[0..D) += e_j * v_j for the keys of one block, in key order, one FMA per lane (NV = D / LANES
// vectors held in registers; NV = 0: any D, through memory). Same arithmetic for every NV.
template <int NV, typename T>
inline void accumulate(float* acc, const float* e, const T* v, int64_t ldv, int64_t count, int64_t D) {
  if constexpr (NV > 0) {
    Vec a[NV];
    for (int c = 0; c < NV; ++c) a[c] = vload(acc + c * LANES);
    for (int64_t j = 0; j < count; ++j) {
      if (e[j] == 0.f) continue;
      const Vec w = vbroadcast(e[j]);
      for (int c = 0; c < NV; ++c) a[c] = vfma(w, vload(v + j * ldv + c * LANES), a[c]);
    }
    for (int c = 0; c < NV; ++c) vstore(acc + c * LANES, a[c]);
  } else {
    const int64_t body = D / LANES;
    for (int64_t j = 0; j < count; ++j) {
      if (e[j] == 0.f) continue;
      const Vec w = vbroadcast(e[j]);
      for (int64_t c = 0; c < body; ++c)
        vstore(acc + c * LANES, vfma(w, vload(v + j * ldv + c * LANES), vload(acc + c * LANES)));
      for (int64_t d = body * LANES; d < D; ++d) acc[d] = std::fma(e[j], float(v[j * ldv + d]), acc[d]);
    }
  }
}

// x[j] = exp(x[j] - top) where mask[j] >= kMasked, else 0, LANES at a time (a tail padded as
// masked: a lane's exp depends on its own input only); sums += the results, lane by lane.
inline void exponentiate(float* x, const float* mask, int64_t count, float top, Vec& sums) {
  const Vec t = vbroadcast(top);
  int64_t j = 0;
  for (; j + LANES <= count; j += LANES) {
    const Vec e = vkeep_ge(vload(mask + j), kMasked, vexp(vsub(vload(x + j), t)));
    sums = vadd(sums, e);
    vstore(x + j, e);
  }
  if (j < count) {
    const int64_t n = count - j;
    float xs[LANES], ms[LANES];
    for (int l = 0; l < LANES; ++l) {
      xs[l] = l < n ? x[j + l] : 0.f;
      ms[l] = l < n ? mask[j + l] : -std::numeric_limits<float>::infinity();
    }
    const Vec e = vkeep_ge(vload(ms), kMasked, vexp(vsub(vload(xs), t)));
    sums = vadd(sums, e);
    vstore(xs, e);
    for (int64_t l = 0; l < n; ++l) x[j + l] = xs[l];
  }
}

// The same for a row's draft path, root first: element i goes into lane (first + i) % LANES, the lane
// its key takes as prefix slot first + i once the path is committed (first: the prefix's visible
// length). So each lane adds the same numbers in the same order as plain decoding's row at that
// point, and the denominator's bits equal it (a lane filled with masked keys adds exact zeros).
inline void exponentiate_path(float* x, const float* mask, int64_t count, float top, int64_t first, Vec& sums) {
  const Vec t = vbroadcast(top);
  for (int64_t i = 0, lane = first % LANES; i < count; lane = 0) {
    float xs[LANES], ms[LANES];
    int64_t at[LANES];
    for (int l = 0; l < LANES; ++l) {
      xs[l] = 0.f;
      ms[l] = -std::numeric_limits<float>::infinity();
      at[l] = -1;
    }
    for (; lane < LANES && i < count; ++lane, ++i) {
      xs[lane] = x[i];
      ms[lane] = mask[i];
      at[lane] = i;
    }
    const Vec e = vkeep_ge(vload(ms), kMasked, vexp(vsub(vload(xs), t)));
    sums = vadd(sums, e);
    vstore(xs, e);
    for (int l = 0; l < LANES; ++l)
      if (at[l] >= 0) x[at[l]] = xs[l];
  }
}

template <typename T>
using AccumulateFn = void (*)(float*, const float*, const T*, int64_t, int64_t, int64_t);

template <typename T>
AccumulateFn<T> accumulator(int64_t D) {
  if (D % LANES) return &accumulate<0, T>;
  switch (D / LANES) {
    case 1: return &accumulate<1, T>;
    case 2: return &accumulate<2, T>;
    case 4: return &accumulate<4, T>;
    case 8: return &accumulate<8, T>;
    case 16: return &accumulate<16, T>;
    default: return &accumulate<0, T>;
  }
}

// Rows [first, first + count) of query batch b read cache entry `entry`.
struct Task {
  int64_t b, entry, first, count;
};

// T: the cache's element type (float or bf16); q, the masks and every sum are float32
template <typename T>
void attend(const float* qp, const T* kp, const T* vp, const float* pmp, int64_t mask_batches, int64_t mask_rows,
            const int64_t* sp, const float* dmp, float* op, const std::vector<Task>& tasks, int64_t H, int64_t Hkv,
            int64_t M, int64_t D, int64_t T_, int64_t span, int64_t N, float scale, float cap) {
  const int64_t G = H / Hkv;
  const AccumulateFn<T> add = accumulator<T>(D);
  // threads split (task, KV head) pairs: a thread owns whole rows, so the split changes no sum
  at::parallel_for(0, static_cast<int64_t>(tasks.size()) * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> prefix, drafts, total, acc;
    std::vector<int64_t> visible;
    for (int64_t job = begin; job < end; ++job) {
      const Task& task = tasks[job / Hkv];
      const int64_t b = task.b, kvh = job % Hkv, Mt = task.count, R = G * Mt;
      const T* keys = kp + (task.entry * Hkv + kvh) * T_ * D;
      const T* values = vp + (task.entry * Hkv + kvh) * T_ * D;
      // row r of the task: query head kvh * G + r / Mt, row m = first + r % Mt, under its mask row
      auto row_of = [&](int64_t r) { return task.first + r % Mt; };
      auto mask_of = [&](int64_t r) {
        return pmp + ((mask_batches == 1 ? 0 : b) * mask_rows + (mask_rows == 1 ? 0 : row_of(r))) * span;
      };
      auto qrow = [&](int64_t r) { return qp + ((b * H + kvh * G + r / Mt) * M + row_of(r)) * D; };
      // a row's prefix's visible length: its draft path's first key would be slot `visible`
      visible.assign(Mt, span);
      for (int64_t r = 0; r < Mt; ++r)
        while (visible[r] > 0 && mask_of(r)[visible[r] - 1] < kMasked) --visible[r];
      // keys past every row's visible prefix would add exact zeros: a short sequence packed beside a
      // long one reads its own prefix only
      const int64_t S = *std::max_element(visible.begin(), visible.end());
      prefix.resize(R * S), drafts.resize(R * N), total.resize(R), acc.assign(R * D, 0.f);
      // scores: a block of keys, then every row against it
      for (int64_t j0 = 0; j0 < S; j0 += kKeyBlock) {
        const int64_t j1 = std::min(S, j0 + kKeyBlock);
        for (int64_t r = 0; r < R; ++r) {
          float* s = prefix.data() + r * S;
          const float* row_mask = mask_of(r);
          int64_t j = j0;
          for (; j + kKeys <= j1; j += kKeys) dots<kKeys>(qrow(r), keys + j * D, D, D, s + j);
          for (; j < j1; ++j) dots<1>(qrow(r), keys + j * D, D, D, s + j);
          for (j = j0; j < j1; ++j) s[j] = score(s[j], scale, cap, row_mask[j]);
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const int64_t m = row_of(r);
        const float* row_mask = mask_of(r);
        float* s = prefix.data() + r * S;
        float* d = drafts.data() + r * N;
        for (int64_t i = 0; i < N; ++i) {
          dots<1>(qrow(r), keys + sp[m * N + i] * D, D, D, d + i);
          d[i] = score(d[i], scale, cap, dmp[m * N + i]);
        }
        // softmax: the max, then e = exp(s - max) (0 where masked) and their sum, lane-wise over
        // the prefix in slot order, then the path, then the lanes in one fixed tree
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < S; ++j)
          if (row_mask[j] >= kMasked) top = std::max(top, s[j]);
        for (int64_t i = 0; i < N; ++i)
          if (dmp[m * N + i] >= kMasked) top = std::max(top, d[i]);
        Vec sums = vzero();
        exponentiate(s, row_mask, S, top, sums);
        exponentiate_path(d, dmp + m * N, N, top, visible[r % Mt], sums);
        total[r] = hsum(sums);
      }
      // output: a block of values, then every row's e * v over it, in key order
      for (int64_t j0 = 0; j0 < S; j0 += kKeyBlock) {
        const int64_t count = std::min(S, j0 + kKeyBlock) - j0;
        for (int64_t r = 0; r < R; ++r)
          add(acc.data() + r * D, prefix.data() + r * S + j0, values + j0 * D, D, count, D);
      }
      for (int64_t r = 0; r < R; ++r) {
        const int64_t m = row_of(r);
        for (int64_t i = 0; i < N; ++i)  // the path's slots, root first (one key at a time: any slots)
          add(acc.data() + r * D, drafts.data() + r * N + i, values + sp[m * N + i] * D, D, 1, D);
        float* o = op + ((b * H + kvh * G + r / Mt) * M + m) * D;
        for (int64_t x = 0; x < D; ++x) o[x] = acc[r * D + x] / total[r];
      }
    }
  });
}

at::Tensor rowwise_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const at::Tensor& mask, const at::Tensor& draft_slots, const at::Tensor& draft_mask,
                             double scaling, double softcap, const std::optional<at::Tensor>& row_cache) {
  const auto dtype = query.scalar_type();
  TORCH_CHECK((dtype == at::kFloat || dtype == at::kBFloat16) && key.scalar_type() == dtype &&
                  value.scalar_type() == dtype,
              "spec_zoo::rowwise_attention computes in float32 or bfloat16 (query, key and value alike)");
  TORCH_CHECK(draft_slots.scalar_type() == at::kLong, "draft_slots must be int64");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.sizes() == key.sizes() && mask.dim() == 4 &&
                  draft_slots.dim() == 2 && draft_mask.sizes() == draft_slots.sizes(),
              "rowwise_attention: query [B, H, M, D], key/value [C, Hkv, T, D], mask [B, 1, M, S], "
              "draft_slots/draft_mask [M, N]");
  const int64_t B = query.size(0), H = query.size(1), M = query.size(2), D = query.size(3);
  const int64_t C = key.size(0), Hkv = key.size(1), T = key.size(2), S = mask.size(3), N = draft_slots.size(1);
  TORCH_CHECK(key.size(3) == D && Hkv > 0 && H % Hkv == 0, "rowwise_attention: head shapes");
  TORCH_CHECK(S <= T && draft_slots.size(0) == M && (mask.size(0) == 1 || mask.size(0) == B) &&
                  mask.size(1) == 1 && (mask.size(2) == 1 || mask.size(2) == M),
              "rowwise_attention: the mask spans at most the cache, one row of slots for all rows or per row");
  std::vector<Task> tasks;
  if (row_cache.has_value()) {  // a packed batch: runs of consecutive rows of one cache entry
    TORCH_CHECK(B == 1 && row_cache->scalar_type() == at::kLong && row_cache->dim() == 1 && row_cache->size(0) == M,
                "rowwise_attention: row_cache is [M] int64, for a query of one batch");
    auto rc = row_cache->contiguous();
    const int64_t* rcp = rc.data_ptr<int64_t>();
    for (int64_t m = 0; m < M; ++m) {
      TORCH_CHECK(0 <= rcp[m] && rcp[m] < C, "row_cache past the cache's entries");
      if (tasks.empty() || tasks.back().entry != rcp[m]) tasks.push_back({0, rcp[m], m, 0});
      ++tasks.back().count;
    }
  } else {
    TORCH_CHECK(C == B, "rowwise_attention: one cache entry per query batch (or row_cache)");
    for (int64_t b = 0; b < B; ++b) tasks.push_back({b, b, 0, M});
  }
  // the few query rows and the masks in float32; the cache as it is stored
  auto q = query.to(at::kFloat).contiguous(), k = key.contiguous(), v = value.contiguous();
  auto pm = mask.to(at::kFloat).contiguous(), dm = draft_mask.to(at::kFloat).contiguous();
  auto slots = draft_slots.contiguous();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < M * N; ++i) TORCH_CHECK(0 <= sp[i] && sp[i] < T, "draft_slots past the cache");
  auto out = at::empty({B, H, M, D}, q.options());
  const float scale = static_cast<float>(scaling), cap = static_cast<float>(softcap);
  const float *qp = q.data_ptr<float>(), *pmp = pm.data_ptr<float>(), *dmp = dm.data_ptr<float>();
  float* op = out.data_ptr<float>();
  if (dtype == at::kFloat)
    attend<float>(qp, k.data_ptr<float>(), v.data_ptr<float>(), pmp, mask.size(0), mask.size(2), sp, dmp, op, tasks,
                  H, Hkv, M, D, T, S, N, scale, cap);
  else
    attend<c10::BFloat16>(qp, k.data_ptr<c10::BFloat16>(), v.data_ptr<c10::BFloat16>(), pmp, mask.size(0),
                          mask.size(2), sp, dmp, op, tasks, H, Hkv, M, D, T, S, N, scale, cap);
  return dtype == at::kFloat ? out : out.to(dtype);
}

std::string attention_isa() { return kIsa; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(spec_zoo, m) {
  m.def("rowwise_attention(Tensor query, Tensor key, Tensor value, Tensor mask, Tensor draft_slots, "
        "Tensor draft_mask, float scaling, float softcap, Tensor? row_cache=None) -> Tensor");
  m.def("attention_isa() -> str", &attention_isa);
}

TORCH_LIBRARY_IMPL(spec_zoo, CPU, m) { m.impl("rowwise_attention", &rowwise_attention); }
