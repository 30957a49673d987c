// The sparsifiers' scans: DRAGONN's hashed selection and sampled threshold, the per-block maxima
// behind the threshold compactions of sparse.AbsIndex (topk, dragonn; GradDrop and DGC have
// generated ones: compll/specs/graddrop.py, dgc.py).

#include "common.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <queue>
#include <vector>

namespace compbench_cpu {

// int64, the indices in the filled slots of a table of `slots` entries, in slot order: slot
// murmur3_32(i, seed) % slots holds the largest i with abs(x_i) >= threshold (twin:
// compressors.dragonn._select's CPU path; CUDA: dragonn.cu, which returns the whole table).
// Each scanned range fills its own table with plain stores (its indices increase, so the last
// write is the largest), then the tables are merged by max: the same table at any number of
// threads. Not an atomic max on one shared table: a locked compare-exchange per passing element
// drains the memory pipeline, a full miss on the table each (~100 ns: 2.3 ms at k = 25k), where
// plain stores retire without waiting. `nonfinite` (common.h's NonFinite): set when an element is
// NaN or +-Inf, tested on the vectors the threshold compare already holds.
at::Tensor dragonn_select(const at::Tensor& x, double threshold, int64_t slots, int64_t seed,
                          at::Tensor& nonfinite) {
  check_flat_f32(x, "dragonn_select");
  const NonFinite nf(nonfinite, "dragonn_select");
  const bool check = nf.on();
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
    unsigned bad = 0;  // this range saw a NaN or an infinity (`check` only)
    for (int64_t b = b0; b < b1; ++b) {
      int64_t lo = b * kBlock;
      const int64_t hi = std::min(n, lo + kBlock);
#if defined(__AVX2__)
      // One mask of abs(x) >= thr per 8 lanes (ordered compare: NaN never passes), OR-ed over the
      // block: a block with none is skipped after its one read; set bits name the passing elements.
      // With `check`, one more compare of the same vector: !(abs(x) <= FLT_MAX), unordered (NaN too).
      const __m256 sign = _mm256_set1_ps(-0.f), vt = _mm256_set1_ps(thr), big = _mm256_set1_ps(FLT_MAX);
      unsigned masks[kBlock / 8];
      unsigned any = 0;
      const int64_t whole = (hi - lo) / 8;
      for (int64_t v = 0; v < whole; ++v) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p + lo + 8 * v));
        masks[v] = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ)));
        any |= masks[v];
        if (check) bad |= static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ)));
      }
      if (any) {
        for (int64_t v = 0; v < whole; ++v) {
          for (unsigned bits = masks[v]; bits; bits &= bits - 1) pass(lo + 8 * v + __builtin_ctz(bits));
        }
      }
      lo += 8 * whole;  // the tail of a partial last block
#endif
      for (int64_t i = lo; i < hi; ++i) {
        const float a = std::fabs(p[i]);
        if (a >= thr) pass(i);
        if (check) bad |= !(a <= FLT_MAX);
      }
    }
    nf.report(bad != 0);
    merge_by_max(table, mine, lock);
  });
  return table.defined() ? filled_slots(table) : at::empty({0}, x.options().dtype(at::kLong));  // n == 0
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
// n % 64 elements has no entry). sparse.AbsIndex's summary; twin: amax(abs) of the rows. Given fp32
// `samples` (count elements), the same pass writes x[sample_start + t * sample_stride] into them for
// t < count: DGC's strided threshold sample, otherwise its own strided read of the tensor.
// `nonfinite` (common.h's NonFinite): set when an element (the tail's too) is NaN or +-Inf.
at::Tensor block_absmax(const at::Tensor& x, at::Tensor& samples, int64_t sample_start, int64_t sample_stride,
                        at::Tensor& nonfinite) {
  check_flat_f32(x, "block_absmax");
  const NonFinite nf(nonfinite, "block_absmax");
  const bool check = nf.on();
  const int64_t n = x.numel(), blocks = n / kBlock, count = samples.numel();
  check_strided_sample(samples, sample_start, sample_stride, n, "block_absmax");
  at::Tensor out = at::empty({blocks}, x.options());
  const float* p = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  float* sp = count > 0 ? samples.data_ptr<float>() : nullptr;
  at::parallel_for(0, (n + kBlock - 1) / kBlock, 4096, [&](int64_t b0, int64_t b1) {
    bool bad = false;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      if (b < blocks) o[b] = abs_max(p + lo, kBlock);
      if (check) bad |= any_nonfinite(p + lo, hi - lo);  // the block just read: in L1
      if (sp != nullptr) gather_strided(p + lo, lo, hi, sample_start, sample_stride, count, sp);
    }
    nf.report(bad);
  });
  return out;
}

// int64, ascending: the flat indices i with abs(x_i) >= threshold, reading only the blocks of 64 whose
// `block_max` (block_absmax of x) is not below the threshold (NaN maxima are read too) and the tail
// of n % 64 elements. sparse.AbsIndex.indices_ge's query; twin: its numpy path (the blocks taken,
// compared, flatnonzero). Fixed ranges of blocks keep their own lists, joined in order: the same
// result at any number of threads.
at::Tensor blocks_abs_ge(const at::Tensor& x, const at::Tensor& block_max, double threshold) {
  check_flat_f32(x, "blocks_abs_ge");
  check_flat_f32(block_max, "blocks_abs_ge");
  const int64_t n = x.numel(), blocks = n / kBlock;
  TORCH_CHECK(block_max.numel() == blocks, "blocks_abs_ge: block_max must have numel / 64 entries");
  const float* p = x.data_ptr<float>();
  const float* bm = block_max.data_ptr<float>();
  const float t = static_cast<float>(threshold);
  constexpr int64_t kRange = 16384;  // blocks per list
  const int64_t ranges = blocks / kRange + 1;  // the last one also takes the tail
  std::vector<std::vector<int64_t>> found(static_cast<size_t>(ranges));
  at::parallel_for(0, ranges, 1, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> hit;  // the range's blocks to re-read
    for (int64_t r = r0; r < r1; ++r) {
      auto& f = found[static_cast<size_t>(r)];
      hit.clear();
      const int64_t b1 = std::min(blocks, (r + 1) * kRange);
      for (int64_t b = r * kRange; b < b1; ++b) {
        if (!(bm[b] < t)) hit.push_back(b);  // a NaN maximum is re-read
      }
      // The blocks lie at random places: their loads are misses, so the next ones are prefetched
      // while this one is compared (a 64-bit mask, then its set bits in order).
      constexpr size_t kAhead = 8;
      const size_t h = hit.size();
      for (size_t j = 0; j < h; ++j) {
        if (j + kAhead < h) {
          const float* next = p + hit[j + kAhead] * kBlock;
          for (int64_t line = 0; line < kBlock; line += 16) __builtin_prefetch(next + line);
        }
        const int64_t base = hit[j] * kBlock;
        const float* q = p + base;
        uint64_t mask = 0;
        for (int64_t i = 0; i < kBlock; ++i) mask |= static_cast<uint64_t>(std::fabs(q[i]) >= t) << i;
        for (; mask; mask &= mask - 1) f.push_back(base + __builtin_ctzll(mask));
      }
      if (r == ranges - 1) {
        for (int64_t i = blocks * kBlock; i < n; ++i) {
          if (std::fabs(p[i]) >= t) f.push_back(i);
        }
      }
    }
  });
  int64_t total = 0;
  for (const auto& f : found) total += static_cast<int64_t>(f.size());
  at::Tensor out = at::empty({total}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (const auto& f : found) o = std::copy(f.begin(), f.end(), o);
  return out;
}

}  // namespace compbench_cpu
