// Shared by compbench's CPU kernels (extensions/cpu/*.cpp): the checks and the murmur3 hash of the
// counter-based streams (scalar and 8 AVX2 lanes). Each kernel is one pass over the gradient, a torch
// operator (torch.ops.compbench_cpu.*) declared and registered by the unit generated from
// src/compbench/kernels/table.py; its pure-torch/numpy twin is its fallback and test oracle.
//
// Threads: ATen's parallel_for, i.e. torch's own OpenMP pool, so torch.set_num_threads (compbench's
// `threads` setting) governs these kernels too. Results never depend on the number of threads: the
// DRAGONN table keeps the largest index per slot (per-range tables merged by max), sums are taken
// per fixed chunk and added in chunk order.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <tuple>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace compbench_cpu {

// Elements per block of the threshold scans: 4 cache lines, whose maximum is one vector reduction;
// a block below the threshold is skipped, one that reaches it is re-read from L1.
constexpr int64_t kBlock = 64;

inline void check_flat_f32(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "compbench_cpu.", op, " takes a contiguous CPU fp32 tensor, got ", x.scalar_type(),
              x.is_contiguous() ? "" : " (not contiguous)", " on ", x.device());
}

inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// MurmurHash3_x86_32 of one 4-byte little-endian key (compressors/dragonn.py: murmur3_32).
inline uint32_t murmur3_32(uint32_t key, uint32_t seed) {
  uint32_t k = key * 0xCC9E2D51u;
  k = rotl32(k, 15) * 0x1B873593u;
  uint32_t h = rotl32(seed ^ k, 13) * 5u + 0xE6546B64u;
  h ^= 4u;  // length in bytes
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

#if defined(__AVX2__)
inline __m256i rotl8x32(__m256i x, int r) {
  return _mm256_or_si256(_mm256_slli_epi32(x, r), _mm256_srli_epi32(x, 32 - r));
}

// murmur3_32 of 8 consecutive keys at once (the scalar murmur3_32 above, lane by lane).
inline __m256i murmur3_32x8(__m256i key, uint32_t seed) {
  __m256i k = _mm256_mullo_epi32(key, _mm256_set1_epi32(static_cast<int>(0xCC9E2D51u)));
  k = _mm256_mullo_epi32(rotl8x32(k, 15), _mm256_set1_epi32(static_cast<int>(0x1B873593u)));
  __m256i h = rotl8x32(_mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(seed)), k), 13);
  h = _mm256_add_epi32(_mm256_mullo_epi32(h, _mm256_set1_epi32(5)), _mm256_set1_epi32(static_cast<int>(0xE6546B64u)));
  h = _mm256_xor_si256(h, _mm256_set1_epi32(4));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85EBCA6Bu)));
  h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
  h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xC2B2AE35u)));
  return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}
#endif

// Largest abs over p[0..m); NaN elements are ignored (they never pass a threshold either), in
// vectors (a scalar max reduction does not vectorize: its NaN rule is not associative for the
// compiler). block_absmax (select.cpp) and the fused memory pass (memory.cpp) take it.
inline float abs_max(const float* p, int64_t m) {
  float hi = 0.f;
  int64_t j = 0;
#if defined(__AVX2__)
  // max_ps(a, b) returns b when a is NaN: NaN elements drop out, as in the scalar loop.
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 h0 = _mm256_setzero_ps(), h1 = _mm256_setzero_ps();
  for (; j + 16 <= m; j += 16) {
    h0 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p + j)), h0);
    h1 = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p + j + 8)), h1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(h0, h1));
  for (float v : lanes) hi = v > hi ? v : hi;
#endif
  for (; j < m; ++j) {
    const float a = std::fabs(p[j]);
    hi = a > hi ? a : hi;
  }
  return hi;
}

// The non-finite check folded into a pass that reads the gradient anyway (the trainer's
// on_nonfinite=raise check then skips what a kernel checked: compbench.codec.finite). A kernel's
// `nonfinite` argument is an int32 tensor of 0 elements (no check) or 1, set to 1 when an element
// read is NaN or +-Inf and never cleared here (the trainer zeroes it once per step). Each range of a
// parallel_for keeps its own bool and stores once at its end (a relaxed atomic store of the same
// value: no order needed), so the flag does not depend on the number of threads.
class NonFinite {
 public:
  NonFinite(at::Tensor& flag, const char* op) {
    TORCH_CHECK(flag.numel() <= 1, op, ": nonfinite takes 0 elements (no check) or 1");
    if (flag.numel() == 1) {
      TORCH_CHECK(flag.device().is_cpu() && flag.scalar_type() == at::kInt, op,
                  ": nonfinite must be a CPU int32 tensor");
      flag_ = flag.data_ptr<int32_t>();
    }
  }
  bool on() const { return flag_ != nullptr; }
  void report(bool seen) const {
    if (seen && flag_ != nullptr) __atomic_store_n(flag_, 1, __ATOMIC_RELAXED);
  }

 private:
  int32_t* flag_ = nullptr;
};

// Whether p[0..m) holds a NaN or +-Inf: !(|x| <= FLT_MAX), true for both (an unordered compare),
// in vectors. Called on a block the pass has just read (in L1: no extra memory traffic).
inline bool any_nonfinite(const float* p, int64_t m) {
  int64_t j = 0;
  unsigned bad = 0;
#if defined(__AVX2__)
  const __m256 sign = _mm256_set1_ps(-0.f), big = _mm256_set1_ps(FLT_MAX);
  for (; j + 8 <= m; j += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p + j));
    bad |= static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ)));
  }
#endif
  for (; j < m; ++j) bad |= !(std::fabs(p[j]) <= FLT_MAX);
  return bad != 0;
}

// A strided sample gathered by a pass that already reads the tensor (DGC's threshold samples,
// otherwise a second, strided read): samples[t] = x[start + t * stride] for t < count. The pass
// checks the layout once (`check_strided_sample`), then hands over each block of values it holds,
// x[lo..hi) in vals[0..hi-lo).
inline void check_strided_sample(const at::Tensor& samples, int64_t start, int64_t stride, int64_t n,
                                 const char* op) {
  if (samples.numel() == 0) return;
  check_flat_f32(samples, op);
  TORCH_CHECK(start >= 0 && stride > 0 && start + (samples.numel() - 1) * stride < n, op,
              ": the strided sample leaves the tensor");
}

inline void gather_strided(const float* vals, int64_t lo, int64_t hi, int64_t start, int64_t stride,
                           int64_t count, float* samples) {
  if (hi <= start) return;
  // the first sample at or after lo, then every stride-th up to hi
  int64_t t = lo <= start ? 0 : (lo - start + stride - 1) / stride;
  for (int64_t i = start + t * stride; i < hi && t < count; i += stride, ++t) samples[t] = vals[i - lo];
}

// DRAGONN's slot tables: each scanned range fills its own (`mine`, -1 where empty), then they are
// merged into `table` by max under `lock`, so the result is the same at any number of threads.
inline void merge_by_max(at::Tensor& table, const at::Tensor& mine, std::mutex& lock) {
  const std::lock_guard<std::mutex> guard(lock);
  if (!table.defined()) {
    table = mine;
    return;
  }
  int64_t* out = table.data_ptr<int64_t>();
  const int64_t* t = mine.data_ptr<int64_t>();
  for (int64_t j = 0; j < table.numel(); ++j) out[j] = std::max(out[j], t[j]);
}

// What a DRAGONN table sends: the indices in its filled slots, in slot order (empty slots hold -1).
// One pass over the slots here instead of a boolean mask's in torch (~0.15 ms at 67k slots).
inline at::Tensor filled_slots(const at::Tensor& table) {
  const int64_t* t = table.data_ptr<int64_t>();
  const int64_t slots = table.numel();
  int64_t count = 0;
  for (int64_t j = 0; j < slots; ++j) count += t[j] >= 0;
  at::Tensor out = at::empty({count}, table.options());
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t j = 0; j < slots; ++j) {
    if (t[j] >= 0) *o++ = t[j];
  }
  return out;
}

// The kernels' declarations and registrations are generated from src/compbench/kernels/table.py.


// Calls f(std::true_type{}) or f(std::false_type{}): a runtime flag as a compile-time one, so each
// instantiation of a kernel's loop has no branch on it (optim.cpp, adam.cpp).
template <typename F>
inline void with_bool(bool b, F&& f) {
  if (b) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace compbench_cpu
