// compbench's CPU hot paths as torch operators (torch.ops.compbench_cpu.*), each one pass over the
// gradient. Built by `make setup` (compbench.kernels.cpu); the pure-torch/numpy code they replace is
// their twin, fallback and test oracle (tests/unit/test_cpu_kernels.py).
//
// Threads: ATen's parallel_for, i.e. torch's own OpenMP pool, so torch.set_num_threads (compbench's
// `threads` setting) governs these kernels too. Results never depend on the number of threads: the
// DRAGONN table keeps the largest index per slot (per-range tables merged by max), sums are taken per fixed chunk and
// added in chunk order.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <queue>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// Elements per block of the threshold scans: 4 cache lines, whose maximum is one vector reduction;
// a block below the threshold is skipped, one that reaches it is re-read from L1.
constexpr int64_t kBlock = 64;
// Bytes of packed signs per chunk of pack_signs (131072 elements): the unit of parallel work and of
// the fixed summation order.
constexpr int64_t kSignChunkBytes = 16384;

void check_flat_f32(const at::Tensor& x, const char* op) {
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

// Largest abs over p[0..m); NaN elements are ignored (they never pass a threshold either).
inline float absmax(const float* p, int64_t m) {
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

// int64 table of `slots` entries: slot murmur3_32(i, seed) % slots holds the largest i with
// abs(x_i) >= threshold, -1 if none (twin: compressors.dragonn._select's CPU path; CUDA: dragonn.cu).
// Each scanned range fills its own table with plain stores (its indices increase, so the last
// write is the largest), then the tables are merged by max: the same table at any number of
// threads. Not an atomic max on one shared table: a locked compare-exchange per passing element
// drains the memory pipeline, a full miss on the table each (~100 ns: 2.3 ms at k = 25k), where
// plain stores retire without waiting.
at::Tensor dragonn_select(const at::Tensor& x, double threshold, int64_t slots, int64_t seed) {
  check_flat_f32(x, "dragonn_select");
  TORCH_CHECK(slots > 0, "dragonn_select: slots=", slots, " must be positive");
  TORCH_CHECK(x.numel() < (int64_t{1} << 32), "dragonn_select: hashes 32-bit indices; split the tensor");
  const float* p = x.data_ptr<float>();
  const float thr = static_cast<float>(threshold);
  const uint32_t s = static_cast<uint32_t>(seed);
  const uint64_t m = static_cast<uint64_t>(slots);
  const int64_t n = x.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::mutex lock;
  at::Tensor table;  // the merged tables of the ranges scanned so far
  at::parallel_for(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    at::Tensor mine = at::full({slots}, -1, x.options().dtype(at::kLong));
    int64_t* t = mine.data_ptr<int64_t>();
    auto pass = [&](int64_t i) { t[murmur3_32(static_cast<uint32_t>(i), s) % m] = i; };
    for (int64_t b = b0; b < b1; ++b) {
      int64_t lo = b * kBlock;
      const int64_t hi = std::min(n, lo + kBlock);
#if defined(__AVX2__)
      // One mask of abs(x) >= thr per 8 lanes (ordered compare: NaN never passes), OR-ed over the
      // block: a block with none is skipped after its one read; set bits name the passing elements.
      const __m256 sign = _mm256_set1_ps(-0.f), vt = _mm256_set1_ps(thr);
      unsigned masks[kBlock / 8];
      unsigned any = 0;
      const int64_t whole = (hi - lo) / 8;
      for (int64_t v = 0; v < whole; ++v) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p + lo + 8 * v));
        masks[v] = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ)));
        any |= masks[v];
      }
      if (any) {
        for (int64_t v = 0; v < whole; ++v) {
          for (unsigned bits = masks[v]; bits; bits &= bits - 1) pass(lo + 8 * v + __builtin_ctz(bits));
        }
      }
      lo += 8 * whole;  // the tail of a partial last block
#endif
      for (int64_t i = lo; i < hi; ++i) {
        if (std::fabs(p[i]) >= thr) pass(i);
      }
    }
    const std::lock_guard<std::mutex> guard(lock);
    if (!table.defined()) {
      table = mine;
    } else {
      int64_t* out = table.data_ptr<int64_t>();
      for (int64_t j = 0; j < slots; ++j) out[j] = std::max(out[j], t[j]);
    }
  });
  return table.defined() ? table : at::full({slots}, -1, x.options().dtype(at::kLong));  // n == 0
}

// Sample i of sampled_threshold: element (murmur3_32(i, seed) * n) >> 32, uniform over [0, n) up to
// n / 2^32 (0.6% at n = 25M); twin: compressors.dragonn.sample_indices.
inline int64_t sample_index(uint32_t i, uint32_t seed, uint64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(murmur3_32(i, seed)) * n) >> 32);
}

// numpy's order for np.partition: NaN above every number.
inline bool below(float a, float b) { return a < b || (!std::isnan(a) && std::isnan(b)); }

struct Above {  // std::priority_queue with Above keeps its smallest element (in numpy's order) on top
  bool operator()(float a, float b) const { return below(b, a); }
};

// 1-element fp32: the j-th largest of abs(x[sample_index(i)]) over i < m (NaN largest), i.e. the
// threshold of DRAGONN's sampled top-k, in one pass over the samples: each chunk keeps its j largest
// in a heap (a random sample rarely enters it), the chunks' heaps are merged. The gathers are
// prefetched a batch ahead: they are cache misses at random places of the gradient.
at::Tensor sampled_threshold(const at::Tensor& x, int64_t m, int64_t j, int64_t seed) {
  check_flat_f32(x, "sampled_threshold");
  const int64_t n = x.numel();
  TORCH_CHECK(n > 0 && n < (int64_t{1} << 32), "sampled_threshold: needs 0 < numel < 2^32, got ", n);
  TORCH_CHECK(0 < m && m < (int64_t{1} << 32) && 0 < j && j <= m, "sampled_threshold: needs 0 < j <= m < 2^32");
  const float* p = x.data_ptr<float>();
  const uint32_t s = static_cast<uint32_t>(seed);
  constexpr int64_t kChunk = 65536, kAhead = 64;  // prefetch distance: ~64 misses in flight
  const int64_t chunks = (m + kChunk - 1) / kChunk;
  std::vector<std::vector<float>> tops(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    int64_t ring[kAhead];
    for (int64_t c = c0; c < c1; ++c) {
      std::priority_queue<float, std::vector<float>, Above> heap;
      const int64_t begin = c * kChunk, end = std::min(m, begin + kChunk);
      auto draw = [&](int64_t i) {
        const int64_t at = sample_index(static_cast<uint32_t>(i), s, static_cast<uint64_t>(n));
        __builtin_prefetch(p + at);
        ring[i % kAhead] = at;
      };
      for (int64_t i = begin; i < std::min(end, begin + kAhead); ++i) draw(i);
      for (int64_t i = begin; i < end; ++i) {
        const float v = std::fabs(p[ring[i % kAhead]]);
        if (i + kAhead < end) draw(i + kAhead);
        if (static_cast<int64_t>(heap.size()) < j) {
          heap.push(v);
        } else if (below(heap.top(), v)) {
          heap.pop();
          heap.push(v);
        }
      }
      auto& out = tops[static_cast<size_t>(c)];
      for (; !heap.empty(); heap.pop()) out.push_back(heap.top());
    }
  });
  std::vector<float> all;
  for (const auto& t : tops) all.insert(all.end(), t.begin(), t.end());
  // The j-th largest of the union of every chunk's j largest is the j-th largest of all samples.
  std::nth_element(all.begin(), all.begin() + (j - 1), all.end(), [](float a, float b) { return below(b, a); });
  return at::full({1}, all[static_cast<size_t>(j - 1)], x.options());
}

// fp32, n / 64 entries: the largest abs of each whole block of 64 elements, NaN ignored (the tail of
// n % 64 elements has no entry). sparse.AbsIndex's summary; twin: amax(abs) of the rows.
at::Tensor block_absmax(const at::Tensor& x) {
  check_flat_f32(x, "block_absmax");
  const int64_t blocks = x.numel() / kBlock;
  at::Tensor out = at::empty({blocks}, x.options());
  const float* p = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) o[b] = absmax(p + b * kBlock, kBlock);
  });
  return out;
}

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

// (uint8 bits of x < 0, fp32 [mean of the negative elements, mean of the others], 0 for an empty
// side): 1-bit SGD's step in one read. NaN counts with the non-negatives and makes both means NaN,
// as the twin's clamped sums do. Twin: compressors.onebit._onebit.
std::tuple<at::Tensor, at::Tensor> onebit_pack(const at::Tensor& x) {
  check_flat_f32(x, "onebit_pack");
  const int64_t n = x.numel(), nbytes = (n + 7) / 8, whole = n / 8;
  const int64_t chunks = (nbytes + kSignChunkBytes - 1) / kSignChunkBytes;
  at::Tensor packed = at::empty({nbytes}, x.options().dtype(at::kByte));
  const float* p = x.data_ptr<float>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  struct Sums { double neg = 0, pos = 0; int64_t count = 0; };  // count: negative elements
  std::vector<Sums> partial(static_cast<size_t>(chunks));
  // The two sides keep NaN: min/max_ps return their second operand (x) when either is NaN.
  auto neg_part = [](float v) { return std::isnan(v) || v < 0.f ? v : 0.f; };
  auto pos_part = [](float v) { return std::isnan(v) || v >= 0.f ? v : 0.f; };
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t first = c * kSignChunkBytes, last = std::min(whole, first + kSignChunkBytes);
      Sums sums;
      int64_t i = first;
#if defined(__AVX2__)
      // Per chunk, in registers: four fp64 lanes per side and half (a fixed order at any threads).
      const __m256 zero = _mm256_setzero_ps();
      __m256d n0 = _mm256_setzero_pd(), n1 = n0, p0 = n0, p1 = n0;
      for (; i < last; ++i) {
        const __m256 v = _mm256_loadu_ps(p + 8 * i);
        const unsigned bits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_LT_OQ)));
        const __m256 lo = _mm256_min_ps(zero, v), hi = _mm256_max_ps(zero, v);
        n0 = _mm256_add_pd(n0, _mm256_cvtps_pd(_mm256_castps256_ps128(lo)));
        n1 = _mm256_add_pd(n1, _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)));
        p0 = _mm256_add_pd(p0, _mm256_cvtps_pd(_mm256_castps256_ps128(hi)));
        p1 = _mm256_add_pd(p1, _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1)));
        sums.count += __builtin_popcount(bits);
        out[i] = static_cast<uint8_t>(bits);
      }
      alignas(32) double l[8];
      _mm256_store_pd(l, _mm256_add_pd(n0, n1));
      _mm256_store_pd(l + 4, _mm256_add_pd(p0, p1));
      sums.neg = (l[0] + l[1]) + (l[2] + l[3]);
      sums.pos = (l[4] + l[5]) + (l[6] + l[7]);
#endif
      for (; i < last; ++i) {
        unsigned bits = 0;
        for (int j = 0; j < 8; ++j) {
          const float v = p[8 * i + j];
          bits |= static_cast<unsigned>(v < 0.f) << j;
          sums.neg += neg_part(v);
          sums.pos += pos_part(v);
        }
        sums.count += __builtin_popcount(bits);
        out[i] = static_cast<uint8_t>(bits);
      }
      if (whole < nbytes && first <= whole && whole < first + kSignChunkBytes) {  // a partial last byte
        unsigned bits = 0;
        for (int64_t k = 8 * whole; k < n; ++k) {
          bits |= static_cast<unsigned>(p[k] < 0.f) << (k - 8 * whole);
          sums.neg += neg_part(p[k]);
          sums.pos += pos_part(p[k]);
        }
        sums.count += __builtin_popcount(bits);
        out[whole] = static_cast<uint8_t>(bits);
      }
      partial[static_cast<size_t>(c)] = sums;
    }
  });
  Sums total;
  for (const Sums& s : partial) {
    total.neg += s.neg;
    total.pos += s.pos;
    total.count += s.count;
  }
  const int64_t n_pos = n - total.count;
  at::Tensor means = at::empty({2}, x.options());
  float* mean = means.data_ptr<float>();
  mean[0] = static_cast<float>(total.neg / static_cast<double>(std::max<int64_t>(total.count, 1)));
  mean[1] = static_cast<float>(total.pos / static_cast<double>(std::max<int64_t>(n_pos, 1)));
  return {packed, means};
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

// Decodes packed codes of `bits` = 1 or 2 bits (code j of byte i at bits bits*j..) into out[0, numel):
// out = values[code], `values` fp32 with 2^bits entries; returns out. Each byte's row of 8 / bits
// floats comes from a 256-row table built per call (8 KB / 4 KB: stays in L1), so the pass is
// the speed of writing out. Twin: packing.decode_bits / decode_2bit (a torch row gather).
at::Tensor decode_codes(const at::Tensor& packed, int64_t numel, int64_t bits, const at::Tensor& values,
                        at::Tensor& out) {
  TORCH_CHECK(bits == 1 || bits == 2, "decode_codes: bits must be 1 or 2, got ", bits);
  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.is_contiguous(),
              "decode_codes: packed must be contiguous CPU uint8");
  const int64_t per = 8 / bits;
  TORCH_CHECK(packed.numel() * per >= numel, "decode_codes: ", packed.numel(), " bytes hold fewer than ", numel, " codes");
  TORCH_CHECK(values.numel() == (int64_t{1} << bits), "decode_codes: needs ", int64_t{1} << bits, " values");
  check_flat_f32(out, "decode_codes");
  TORCH_CHECK(out.numel() >= numel, "decode_codes: out has ", out.numel(), " elements, needs ", numel);
  const at::Tensor v = values.to(at::kFloat).contiguous();
  const float* val = v.data_ptr<float>();
  std::vector<float> table(static_cast<size_t>(256 * per));
  const unsigned mask = (1u << bits) - 1u;
  for (int b = 0; b < 256; ++b) {
    for (int64_t j = 0; j < per; ++j) table[static_cast<size_t>(b * per + j)] = val[(static_cast<unsigned>(b) >> (bits * j)) & mask];
  }
  const uint8_t* in = packed.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  const float* rows = table.data();
  const int64_t whole = numel / per;
  // A row's width known at compile time: one 32- or 16-byte move per byte, not a memcpy call.
  auto rows_of = [&](auto width) {
    constexpr int64_t w = decltype(width)::value;
    at::parallel_for(0, whole, 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) std::memcpy(o + i * w, rows + in[i] * w, sizeof(float) * w);
    });
  };
  if (bits == 1) {
    rows_of(std::integral_constant<int64_t, 8>{});
  } else {
    rows_of(std::integral_constant<int64_t, 4>{});
  }
  for (int64_t k = whole * per; k < numel; ++k) o[k] = rows[in[whole] * per + (k - whole * per)];
  return out;
}

// Bytes of 2-bit codes per unit of parallel work in the ternary kernels (65536 elements).
constexpr int64_t kCodeChunkBytes = 16384;

// The 2-bit code of a ternary value: +1 -> 1, -1 -> 3 (int8 -1 & 3), 0 -> 0.
inline unsigned ternary_code(int q) { return static_cast<unsigned>(q) & 3u; }

#if defined(__AVX2__)
// Bit j of m moved to bit 2j: two 8-lane compare masks become 16 bits of packed 2-bit codes.
struct Spread {
  uint16_t v[256];
  constexpr Spread() : v() {
    for (int m = 0; m < 256; ++m) {
      unsigned out = 0;
      for (int j = 0; j < 8; ++j) out |= ((m >> j) & 1u) << (2 * j);
      v[m] = static_cast<uint16_t>(out);
    }
  }
};
constexpr Spread kSpread;

// Two bytes of codes from 8-lane masks of "+1" and "-1": code bit 0 = nonzero, bit 1 = negative.
inline uint16_t codes_from_masks(unsigned pos, unsigned neg) {
  return static_cast<uint16_t>(kSpread.v[pos | neg] | (kSpread.v[neg] << 1));
}

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

// Fills `out` with the 2-bit codes of elements [0, n), in parallel chunks of whole bytes: `vec8(i)`
// gives the two bytes of elements i..i+7 (AVX2) where all eight are inside the tensor, `one(i)` the
// code of element i for the rest.
template <typename Vec8, typename One>
void ternary_pass(int64_t n, uint8_t* out, Vec8 vec8, One one) {
  const int64_t nbytes = (n + 3) / 4;
  at::parallel_for(0, (nbytes + kCodeChunkBytes - 1) / kCodeChunkBytes, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b1 = std::min(nbytes, (c + 1) * kCodeChunkBytes);
      int64_t b = c * kCodeChunkBytes;
#if defined(__AVX2__)
      for (; b + 2 <= b1 && 4 * b + 8 <= n; b += 2) {
        const uint16_t two = vec8(4 * b);
        out[b] = static_cast<uint8_t>(two & 0xFF);
        out[b + 1] = static_cast<uint8_t>(two >> 8);
      }
#endif
      for (; b < b1; ++b) {
        unsigned bits = 0;
        for (int t = 0; t < 4 && 4 * b + t < n; ++t) bits |= one(4 * b + t) << (2 * t);
        out[b] = static_cast<uint8_t>(bits);
      }
    }
  });
}

// uint8: 2-bit TernGrad codes, 4 per byte (code i at bits 2*(i % 4)): +1 (code 1) where
// x > U_i * s, -1 (code 3) where x < -U_i * s, else 0, with U_i = (murmur3_32(i, seed) >> 8) * 2^-24,
// the counter-based stream of the CUDA kernel (quantize.cu), so CPU and GPU send the same codes.
// Twin: kernels.twins.terngrad_codes.
at::Tensor terngrad_codes(const at::Tensor& x, const at::Tensor& scale, int64_t seed) {
  check_flat_f32(x, "terngrad_codes");
  TORCH_CHECK(scale.numel() == 1, "terngrad_codes: scale must have one element");
  TORCH_CHECK(x.numel() < (int64_t{1} << 32), "terngrad_codes: counts 32-bit indices; split the tensor");
  const int64_t n = x.numel();
  at::Tensor packed = at::empty({(n + 3) / 4}, x.options().dtype(at::kByte));
  const float* p = x.data_ptr<float>();
  const float sv = scale.to(at::kFloat).item<float>();
  const uint32_t s = static_cast<uint32_t>(seed);
  constexpr float kU24 = 5.9604644775390625e-08f;  // 2^-24
  auto one = [&](int64_t i) {
    const float thr = static_cast<float>(murmur3_32(static_cast<uint32_t>(i), s) >> 8) * kU24 * sv;
    return ternary_code((p[i] > thr) - (p[i] < -thr));
  };
#if defined(__AVX2__)
  const __m256 vs = _mm256_set1_ps(sv), vu = _mm256_set1_ps(kU24), sign = _mm256_set1_ps(-0.f);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  auto vec8 = [&](int64_t i) {
    const __m256i key = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), lanes);
    // (h >> 8) < 2^24 converts exactly; u * 2^-24 * s in the scalar order (both products rounded).
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(murmur3_32x8(key, s), 8)), vu);
    const __m256 thr = _mm256_mul_ps(u, vs);
    const __m256 v = _mm256_loadu_ps(p + i);
    const unsigned pos = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, thr, _CMP_GT_OQ)));
    const unsigned neg = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_xor_ps(thr, sign), _CMP_LT_OQ)));
    return codes_from_masks(pos, neg);
  };
#else
  auto vec8 = [](int64_t) { return uint16_t{0}; };
#endif
  ternary_pass(n, packed.data_ptr<uint8_t>(), vec8, one);
  return packed;
}

// QSGD in one read: per bucket of `bucket_size` elements the L2 norm (fp64 sum of squares, the
// bucket then re-read from L1), scale = levels / norm (0 for an all-zero bucket), and the uint8
// offset-binary codes floor(clamp((U_i + levels) + x_i * scale, 0, 2 levels)), U_i the counter-based
// stream of terngrad_codes (quantize.cu): the CUDA kernel's codes for the same norms. Returns
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

// QSGD's decode in one pass: out[i] = (codes[i] - levels) * (norm[bucket] / levels), fp32 with
// the twin's roundings (the step norm / levels, then a subtraction and a product). Returns out.
// Twin: compressors.qsgd._dequantize.
at::Tensor qsgd_dequantize(const at::Tensor& codes, const at::Tensor& norms, int64_t levels, int64_t bucket_size,
                           at::Tensor& out) {
  TORCH_CHECK(codes.device().is_cpu() && codes.scalar_type() == at::kByte && codes.is_contiguous(),
              "qsgd_dequantize: codes must be contiguous CPU uint8");
  check_flat_f32(norms, "qsgd_dequantize");
  check_flat_f32(out, "qsgd_dequantize");
  const int64_t n = codes.numel();
  TORCH_CHECK(bucket_size > 0 && norms.numel() == (n + bucket_size - 1) / bucket_size && out.numel() >= n,
              "qsgd_dequantize: sizes of codes, norms and out disagree");
  const uint8_t* c = codes.data_ptr<uint8_t>();
  const float* nm = norms.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float lv = static_cast<float>(levels);
  const int64_t buckets = norms.numel();
  at::parallel_for(0, buckets, std::max<int64_t>(1, 65536 / bucket_size), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float step = nm[b] / lv;
      const int64_t hi = std::min(n, (b + 1) * bucket_size);
      for (int64_t i = b * bucket_size; i < hi; ++i) o[i] = (static_cast<float>(c[i]) - lv) * step;
    }
  });
  return out;
}

// TBQ's step with the residual update in one pass: R += g; code +1 where R >= tau, -1 where
// R <= -tau (R -= tau * q), else 0; returns the packed 2-bit codes. Twin: kernels.twins.tbq_step.
at::Tensor tbq_step(at::Tensor& r, const at::Tensor& g, double tau) {
  check_flat_f32(r, "tbq_step");
  check_flat_f32(g, "tbq_step");
  TORCH_CHECK(r.numel() == g.numel(), "tbq_step: residual and gradient sizes differ");
  const int64_t n = r.numel();
  at::Tensor packed = at::empty({(n + 3) / 4}, r.options().dtype(at::kByte));
  float* rp = r.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  const float t32 = static_cast<float>(tau);
  auto one = [&](int64_t i) {
    const float v = rp[i] + gp[i];
    const int q = (v >= t32) - (v <= -t32);
    rp[i] = v - t32 * static_cast<float>(q);
    return ternary_code(q);
  };
#if defined(__AVX2__)
  const __m256 vt = _mm256_set1_ps(t32), vnt = _mm256_set1_ps(-t32);
  auto vec8 = [&](int64_t i) {
    const __m256 v = _mm256_add_ps(_mm256_loadu_ps(rp + i), _mm256_loadu_ps(gp + i));
    const __m256 up = _mm256_cmp_ps(v, vt, _CMP_GE_OQ), down = _mm256_cmp_ps(v, vnt, _CMP_LE_OQ);
    // R - tau*q: minus tau where +1, plus tau where -1 (tau*q is exact, so is the scalar order).
    const __m256 step = _mm256_or_ps(_mm256_and_ps(up, vt), _mm256_and_ps(down, vnt));
    _mm256_storeu_ps(rp + i, _mm256_sub_ps(v, step));
    return codes_from_masks(static_cast<unsigned>(_mm256_movemask_ps(up)),
                            static_cast<unsigned>(_mm256_movemask_ps(down)));
  };
#else
  auto vec8 = [](int64_t) { return uint16_t{0}; };
#endif
  ternary_pass(n, packed.data_ptr<uint8_t>(), vec8, one);
  return packed;
}

}  // namespace

TORCH_LIBRARY(compbench_cpu, m) {
  m.def("dragonn_select(Tensor x, float threshold, int slots, int seed) -> Tensor", &dragonn_select);
  m.def("block_absmax(Tensor x) -> Tensor", &block_absmax);
  m.def("sampled_threshold(Tensor x, int m, int j, int seed) -> Tensor", &sampled_threshold);
  m.def("pack_signs(Tensor x) -> (Tensor, Tensor)", &pack_signs);
  m.def("absmax_var(Tensor x) -> Tensor", &absmax_var);
  m.def("decode_codes(Tensor packed, int numel, int bits, Tensor values, Tensor(a!) out) -> Tensor(a!)", &decode_codes);
  m.def("terngrad_codes(Tensor x, Tensor scale, int seed) -> Tensor", &terngrad_codes);
  m.def("tbq_step(Tensor(a!) r, Tensor g, float tau) -> Tensor", &tbq_step);
  m.def("onebit_pack(Tensor x) -> (Tensor, Tensor)", &onebit_pack);
  m.def("signum_step(Tensor(a!) m, Tensor g, float beta) -> Tensor", &signum_step);
  m.def("qsgd_dequantize(Tensor codes, Tensor norms, int levels, int bucket_size, Tensor(a!) out) -> Tensor(a!)",
        &qsgd_dequantize);
  m.def("qsgd_quantize(Tensor x, int levels, int bucket_size, int seed) -> (Tensor, Tensor)", &qsgd_quantize);
}
