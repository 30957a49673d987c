// Shared by compbench's CPU kernels (extensions/cpu/*.cpp): the checks, the murmur3 hash of the
// counter-based streams (scalar and 8 AVX2 lanes) and every operator's declaration (ops.cpp
// registers them as torch.ops.compbench_cpu.*).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <tuple>

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

// select.cpp: the sparsifiers' scans.
at::Tensor dragonn_select(const at::Tensor& x, double threshold, int64_t slots, int64_t seed);
at::Tensor sampled_threshold(const at::Tensor& x, int64_t m, int64_t j, int64_t seed);
at::Tensor block_absmax(const at::Tensor& x);
// signs.cpp: 1-bit codes.
std::tuple<at::Tensor, at::Tensor> pack_signs(const at::Tensor& x);
std::tuple<at::Tensor, at::Tensor> onebit_pack(const at::Tensor& x);
at::Tensor signum_step(at::Tensor& m, const at::Tensor& g, double beta);
// quantize.cpp: scales and stochastic or thresholded codes.
at::Tensor absmax_var(const at::Tensor& x);
at::Tensor terngrad_codes(const at::Tensor& x, const at::Tensor& scale, int64_t seed);
std::tuple<at::Tensor, at::Tensor> qsgd_quantize(const at::Tensor& x, int64_t levels, int64_t bucket_size,
                                                 int64_t seed);
at::Tensor tbq_step(at::Tensor& r, const at::Tensor& g, double tau);
// decode.cpp: codes back to values.
at::Tensor decode_codes(const at::Tensor& packed, int64_t numel, int64_t bits, const at::Tensor& values,
                        at::Tensor& out);
at::Tensor qsgd_dequantize(const at::Tensor& codes, const at::Tensor& norms, int64_t levels, int64_t bucket_size,
                           at::Tensor& out);

// memory.cpp: error-feedback memories fused with the selection pass.
at::Tensor compensate_select(at::Tensor& a, at::Tensor& b, const at::Tensor& g, int64_t kind, double c0,
                             double c1, double scale, double threshold, int64_t slots, int64_t seed);
at::Tensor compensate_at(const at::Tensor& a, const at::Tensor& b, const at::Tensor& g, const at::Tensor& indices,
                         int64_t kind, double c0, double c1, double scale);
// optim.cpp: the sparse update straight into the optimizer step.
void sgd_step(at::Tensor& p, at::Tensor& buf, const at::Tensor& grad, const at::Tensor& indices,
              const at::Tensor& values, double lr, double weight_decay, double momentum, bool nesterov,
              bool first, bool dgc, int64_t fma_tail);

}  // namespace compbench_cpu
