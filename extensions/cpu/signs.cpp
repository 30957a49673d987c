// 1-bit codes with their scale in one pass: signsgd/efsignsgd (l1 sum), signum (the momentum
// update); onebit's is generated (compll/specs/onebit.py).

#include "common.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace compbench_cpu {
namespace {

// Bytes of packed signs per chunk (131072 elements): the unit of parallel work and of the fixed
// summation order.
constexpr int64_t kSignChunkBytes = 16384;

// One byte of sign bits (bit j = v[j] < 0; zero and NaN: 0) of 8 floats, and their abs added to
// `lane` (8 fp64 lanes, one per position).
inline unsigned sign_byte(const float* v, double* lane) {
#if defined(__AVX2__)
  const __m256 x = _mm256_loadu_ps(v);
  const unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ)));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.f), x);
  _mm256_storeu_pd(lane, _mm256_add_pd(_mm256_loadu_pd(lane), _mm256_cvtps_pd(_mm256_castps256_ps128(a))));
  _mm256_storeu_pd(lane + 4, _mm256_add_pd(_mm256_loadu_pd(lane + 4), _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1))));
  return bits;
#else
  unsigned bits = 0;
  for (int j = 0; j < 8; ++j) {
    bits |= static_cast<unsigned>(v[j] < 0.f) << j;
    lane[j] += std::fabs(v[j]);
  }
  return bits;
#endif
}

}  // namespace

// (uint8 bits, bit j of byte i = x[8i + j] < 0 (zero and NaN: 0), sum of abs(x) as a 1-element fp32
// tensor): the sign pass of signsgd/efsignsgd, one read. Twin: packing._pack_signs_numpy.
std::tuple<at::Tensor, at::Tensor> pack_signs(const at::Tensor& x) {
  check_flat_f32(x, "pack_signs");
  const int64_t n = x.numel(), nbytes = (n + 7) / 8, whole = n / 8;
  at::Tensor packed = at::empty({nbytes}, x.options().dtype(at::kByte));
  const float* p = x.data_ptr<float>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  const int64_t chunks = (nbytes + kSignChunkBytes - 1) / kSignChunkBytes;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t first = c * kSignChunkBytes, last = std::min(whole, first + kSignChunkBytes);
      // Eight independent fp64 lanes (one per bit position): vectorizable, and exact enough for a
      // sum of 131072 magnitudes.
      double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = first; i < last; ++i) out[i] = static_cast<uint8_t>(sign_byte(p + 8 * i, lane));
      double sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
      if (whole < nbytes && first <= whole && whole < first + kSignChunkBytes) {  // a partial last byte
        unsigned bits = 0;
        for (int64_t k = 8 * whole; k < n; ++k) {
          bits |= static_cast<unsigned>(p[k] < 0.f) << (k - 8 * whole);
          sum += std::fabs(p[k]);
        }
        out[whole] = static_cast<uint8_t>(bits);
      }
      partial[static_cast<size_t>(c)] = sum;
    }
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return {packed, at::full({1}, static_cast<float>(total), x.options())};
}

// Sign bits as pack_signs writes them, in parallel chunks of kSignChunkBytes bytes: `byte8(i)`
// returns the byte of elements 8i..8i+7 (all inside the tensor), `one(k)` the bit of element k
// (the partial last byte).
template <typename Byte8, typename One>
void sign_pass(int64_t n, uint8_t* out, Byte8 byte8, One one) {
  const int64_t nbytes = (n + 7) / 8, whole = n / 8;
  const int64_t chunks = (nbytes + kSignChunkBytes - 1) / kSignChunkBytes;
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t first = c * kSignChunkBytes, last = std::min(whole, first + kSignChunkBytes);
      for (int64_t i = first; i < last; ++i) out[i] = static_cast<uint8_t>(byte8(i));
      if (whole < nbytes && first <= whole && whole < first + kSignChunkBytes) {  // a partial last byte
        unsigned bits = 0;
        for (int64_t k = 8 * whole; k < n; ++k) bits |= one(k) << (k - 8 * whole);
        out[whole] = static_cast<uint8_t>(bits);
      }
    }
  });
}

// Signum's step: m = beta * m + (1 - beta) * g in place (torch's mul_ then add_ with alpha: a
// product rounded, then one fused multiply-add, as ATen's vectorized add does), and the packed bits
// of m < 0. One pass over m and g. Twin: compressors.signum._momentum_sign.
at::Tensor signum_step(at::Tensor& m, const at::Tensor& g, double beta) {
  check_flat_f32(m, "signum_step");
  check_flat_f32(g, "signum_step");
  TORCH_CHECK(m.numel() == g.numel(), "signum_step: momentum and gradient sizes differ");
  const int64_t n = m.numel();
  at::Tensor packed = at::empty({(n + 7) / 8}, m.options().dtype(at::kByte));
  float* mp = m.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  const float b = static_cast<float>(beta), a = static_cast<float>(1.0 - beta);
  auto one = [&](int64_t k) {
    mp[k] = std::fma(gp[k], a, mp[k] * b);
    return static_cast<unsigned>(mp[k] < 0.f);
  };
  sign_pass(n, packed.data_ptr<uint8_t>(),
    [&](int64_t i) {
#if defined(__AVX2__) && defined(__FMA__)
      float* q = mp + 8 * i;
      const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(gp + 8 * i), _mm256_set1_ps(a),
                                       _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_set1_ps(b)));
      _mm256_storeu_ps(q, v);
      return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ)));
#else
      unsigned bits = 0;
      for (int j = 0; j < 8; ++j) bits |= one(8 * i + j) << j;
      return bits;
#endif
    },
    one);
  return packed;
}

}  // namespace compbench_cpu
