// Quantizers: TernGrad's scale, QSGD's bucket norms and codes (from the CUDA kernels' counter-based
// stream). TernGrad's codes and TBQ's step are generated from CompLL specs (compll/specs/).

#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace compbench_cpu {

// fp64 [max abs(x), population variance of x] in one read: TernGrad's scale and clipping bound.
// Per chunk of 16384 elements (re-read from cache for the squares) the sum and the squared
// deviations from the chunk's own mean, merged in chunk order with Chan's formula: a constant
// tensor has variance exactly 0, as torch.std gives (sum(x^2)/n - mean^2 would leave rounding
// noise). Any NaN makes both NaN, as aminmax and std do. Twin: compressors.terngrad._scale.
at::Tensor absmax_var(const at::Tensor& x) {
  check_flat_f32(x, "absmax_var");
  constexpr int64_t kChunk = 16384;
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float* p = x.data_ptr<float>();
  struct Part { double amax = 0, mean = 0, m2 = 0; bool nan = false; };
  std::vector<Part> parts(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk), len = hi - lo;
      Part& part = parts[static_cast<size_t>(c)];
      double sum = 0.0;
      float amax = 0.f;
      bool nan = false;
      int64_t i = lo;
#if defined(__AVX2__)
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
      __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
      for (; i + 8 <= hi; i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        vmax = _mm256_max_ps(_mm256_andnot_ps(sign, v), vmax);
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
      }
      alignas(32) float m8[8];
      alignas(32) double l[4];
      _mm256_store_ps(m8, vmax);
      for (float m : m8) amax = std::max(amax, m);
      nan = _mm256_movemask_ps(vnan) != 0;
      _mm256_store_pd(l, _mm256_add_pd(s0, s1));
      sum = (l[0] + l[1]) + (l[2] + l[3]);
#endif
      for (; i < hi; ++i) {
        amax = std::max(amax, std::fabs(p[i]));
        nan = nan || std::isnan(p[i]);
        sum += p[i];
      }
      const double mean = sum / static_cast<double>(len);
      double m2 = 0.0;
      i = lo;
#if defined(__AVX2__)
      const __m256d vmean = _mm256_set1_pd(mean);
      __m256d q0 = _mm256_setzero_pd(), q1 = _mm256_setzero_pd();
      for (; i + 8 <= hi; i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        const __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vmean);
        const __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vmean);
        q0 = _mm256_add_pd(q0, _mm256_mul_pd(d0, d0));
        q1 = _mm256_add_pd(q1, _mm256_mul_pd(d1, d1));
      }
      _mm256_store_pd(l, _mm256_add_pd(q0, q1));
      m2 = (l[0] + l[1]) + (l[2] + l[3]);
#endif
      for (; i < hi; ++i) {
        const double d = static_cast<double>(p[i]) - mean;
        m2 += d * d;
      }
      part = {amax, mean, m2, nan};
    }
  });
  double amax = 0.0, mean = 0.0, m2 = 0.0;
  int64_t seen = 0;
  bool nan = false;
  for (int64_t c = 0; c < chunks; ++c) {
    const Part& part = parts[static_cast<size_t>(c)];
    const int64_t len = std::min(n, (c + 1) * kChunk) - c * kChunk, total = seen + len;
    const double delta = part.mean - mean;
    mean += delta * static_cast<double>(len) / static_cast<double>(total);
    m2 += part.m2 + delta * delta * static_cast<double>(seen) * static_cast<double>(len) / static_cast<double>(total);
    seen = total;
    amax = std::max(amax, part.amax);
    nan = nan || part.nan;
  }
  const double qnan = std::numeric_limits<double>::quiet_NaN();
  at::Tensor out = at::empty({2}, x.options().dtype(at::kDouble));
  double* o = out.data_ptr<double>();
  o[0] = nan ? qnan : amax;
  o[1] = nan ? qnan : (n ? m2 / static_cast<double>(n) : qnan);
  return out;
}

// QSGD in one read: per bucket of `bucket_size` elements the L2 norm (fp64 sum of squares, the
// bucket then re-read from L1), scale = levels / norm (0 for an all-zero bucket), and the uint8
// offset-binary codes floor(clamp((U_i + levels) + x_i * scale, 0, 2 levels)), U_i the counter-based
// stream (murmur3_32(i, seed) >> 8) * 2^-24 of quantize.cu: the CUDA kernel's codes for the same norms. Returns
// (codes, fp32 norms). Twin: kernels.twins.bucket_norms and qsgd_codes.
std::tuple<at::Tensor, at::Tensor> qsgd_quantize(const at::Tensor& x, int64_t levels, int64_t bucket_size,
                                                 int64_t seed) {
  check_flat_f32(x, "qsgd_quantize");
  TORCH_CHECK(bucket_size > 0 && 0 < levels && levels <= 127, "qsgd_quantize: needs bucket_size > 0, 1 <= levels <= 127");
  TORCH_CHECK(x.numel() < (int64_t{1} << 32), "qsgd_quantize: counts 32-bit indices; split the tensor");
  const int64_t n = x.numel(), buckets = (n + bucket_size - 1) / bucket_size;
  at::Tensor codes = at::empty({n}, x.options().dtype(at::kByte));
  at::Tensor norms = at::empty({buckets}, x.options());
  const float* p = x.data_ptr<float>();
  uint8_t* out = codes.data_ptr<uint8_t>();
  float* np_ = norms.data_ptr<float>();
  const uint32_t s = static_cast<uint32_t>(seed);
  const float lv = static_cast<float>(levels), top = static_cast<float>(2 * levels);
  constexpr float kU24 = 5.9604644775390625e-08f;  // 2^-24
  // Two roundings, (U + s) and x * scale, then their sum (FLAGS keep the compiler from fusing them).
  auto one = [&](int64_t i, float scale) {
    const float u = static_cast<float>(murmur3_32(static_cast<uint32_t>(i), s) >> 8) * kU24;
    const float v = std::min(std::max((u + lv) + p[i] * scale, 0.f), top);  // NaN: 0
    return static_cast<uint8_t>(static_cast<int>(v));
  };
  const int64_t grain = std::max<int64_t>(1, 65536 / bucket_size);
  at::parallel_for(0, buckets, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * bucket_size, hi = std::min(n, lo + bucket_size);
      int64_t i = lo;
      double sq = 0.0;
#if defined(__AVX2__)
      __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
      for (; i + 8 <= hi; i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), c = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        acc0 = _mm256_add_pd(acc0, _mm256_mul_pd(a, a));
        acc1 = _mm256_add_pd(acc1, _mm256_mul_pd(c, c));
      }
      alignas(32) double lanes[4];
      _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
      sq = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
      for (; i < hi; ++i) sq += static_cast<double>(p[i]) * p[i];
      const float norm = static_cast<float>(std::sqrt(sq));
      np_[b] = norm;
      const float scale = norm > 0.f ? lv / norm : 0.f;
      i = lo;
#if defined(__AVX2__)
      const __m256 vl = _mm256_set1_ps(lv), vtop = _mm256_set1_ps(top), vscale = _mm256_set1_ps(scale);
      const __m256 vu = _mm256_set1_ps(kU24), zero = _mm256_setzero_ps();
      const __m256i lanes8 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      // Byte 0 of each 32-bit lane, gathered into the low 4 bytes of each 128-bit half.
      const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
      for (; i + 8 <= hi; i += 8) {
        const __m256i key = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), lanes8);
        const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(murmur3_32x8(key, s), 8)), vu);
        __m256 v = _mm256_add_ps(_mm256_add_ps(u, vl), _mm256_mul_ps(_mm256_loadu_ps(p + i), vscale));
        v = _mm256_min_ps(_mm256_max_ps(v, zero), vtop);  // max_ps(NaN, 0) is 0
        const __m256i q = _mm256_shuffle_epi8(_mm256_cvttps_epi32(v), pick);
        const uint32_t low = static_cast<uint32_t>(_mm256_extract_epi32(q, 0));
        const uint32_t high = static_cast<uint32_t>(_mm256_extract_epi32(q, 4));
        std::memcpy(out + i, &low, 4);
        std::memcpy(out + i + 4, &high, 4);
      }
#endif
      for (; i < hi; ++i) out[i] = one(i, scale);
    }
  });
  return {codes, norms};
}

}  // namespace compbench_cpu
