// Error-feedback memories fused with the sparsifiers' selection pass: one read of the gradient and
// the memory's state, one write of the state, and in the same pass either the per-block maxima of
// the compensated tensor (dgc, topk: sparse.AbsIndex's summary) or DRAGONN's hashed selection
// table. Twin: the unfused torch path (memory/dgc.py and memory/residual.py's `compensate`, then
// select.cpp's block_absmax or dragonn_select on the result), bit for bit:
//   kind 0, residual:  r = r*beta (when beta != 1); r = fma(g, gamma, r)    (torch's add_ with alpha)
//   kind 1, dgc:       g' = g*scale (when clipped); u = u*m + g'; v = v + u
//   kind 2, dgc (nesterov):  u = (u + g')*m; v = (v + u) + g'
// each operation rounded on its own (-ffp-contract=off), as torch's in-place ops are.

#include "common.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>

namespace compbench_cpu {
namespace {

struct Params {
  float c0, c1, scale;
  bool scaled, decay;
};

// The compensated values of elements [lo, hi) into out[0, hi - lo), the state written back when
// `Write`. One kind and one `Extra` (residual: decay; dgc: clipped) per instantiation: the loop has
// no branch and vectorizes.
template <int Kind, bool Extra, bool Write>
inline void compensate_range(const Params& q, float* __restrict__ a, float* __restrict__ b,
                             const float* __restrict__ g, int64_t lo, int64_t hi, float* __restrict__ out) {
  const float c0 = q.c0, c1 = q.c1, scale = q.scale;
  for (int64_t i = lo; i < hi; ++i) {
    float gi = g[i];
    if (Kind == 0) {
      float r = a[i];
      if (Extra) r = r * c0;
      r = std::fma(gi, c1, r);
      if (Write) a[i] = r;
      out[i - lo] = r;
      continue;
    }
    if (Extra) gi = gi * scale;
    float u = a[i], v = b[i];
    if (Kind == 1) {
      u = u * c0;
      u = u + gi;
      v = v + u;
    } else {
      u = u + gi;
      u = u * c0;
      v = v + u;
      v = v + gi;
    }
    if (Write) {
      a[i] = u;
      b[i] = v;
    }
    out[i - lo] = v;
  }
}

// Calls f(std::integral_constant<int, Kind>, std::bool_constant<Extra>) for the runtime kind (Extra:
// residual's decay, dgc's clipping).
template <typename F>
inline void with_kind(int64_t kind, const Params& q, F&& f) {
  if (kind == 0) {
    with_bool(q.decay, [&](auto extra) { f(std::integral_constant<int, 0>{}, extra); });
  } else if (kind == 1) {
    with_bool(q.scaled, [&](auto extra) { f(std::integral_constant<int, 1>{}, extra); });
  } else {
    with_bool(q.scaled, [&](auto extra) { f(std::integral_constant<int, 2>{}, extra); });
  }
}

template <bool Write>
inline void compensate_any(int64_t kind, const Params& q, float* a, float* b, const float* g, int64_t lo,
                           int64_t hi, float* out) {
  with_kind(kind, q, [&](auto k, auto extra) {
    compensate_range<decltype(k)::value, decltype(extra)::value, Write>(q, a, b, g, lo, hi, out);
  });
}

Params make(int64_t kind, double c0, double c1, double scale) {
  TORCH_CHECK(kind >= 0 && kind <= 2, "compensate: kind must be 0 (residual), 1 (dgc) or 2 (dgc nesterov)");
  return Params{static_cast<float>(c0), static_cast<float>(c1), static_cast<float>(scale), scale != 1.0,
                kind == 0 && c0 != 1.0};
}

void check_state(const at::Tensor& a, const at::Tensor& b, const at::Tensor& g, int64_t kind) {
  check_flat_f32(a, "compensate");
  check_flat_f32(g, "compensate");
  TORCH_CHECK(a.numel() == g.numel(), "compensate: state and gradient sizes differ");
  if (kind != 0) {
    check_flat_f32(b, "compensate");
    TORCH_CHECK(b.numel() == g.numel(), "compensate: state and gradient sizes differ");
  }
}

}  // namespace

// Updates the memory in place (a = residual or momentum u, b = velocity v; b unused for kind 0) and
// selects from the compensated tensor in the same pass: slots == 0 returns the fp32 maxima of
// abs over each whole block of 64 (NaN ignored; select.cpp's block_absmax of the result), slots > 0
// DRAGONN's selected int64 indices (select.cpp's dragonn_select of the result with threshold and seed).
// With slots == 0 the pass also writes a strided sample of the result (DGC's threshold samples,
// otherwise a second, strided read of it): samples[t] = result[sample_start + t * sample_stride]
// for t < samples.numel(). `nonfinite` (common.h's NonFinite): set when an element of the raw
// gradient `g` (not the compensated value) is NaN or +-Inf, tested on each block of g just read.
at::Tensor compensate_select(at::Tensor& a, at::Tensor& b, const at::Tensor& g, int64_t kind, double c0,
                             double c1, double scale, double threshold, int64_t slots, int64_t seed,
                             at::Tensor& samples, int64_t sample_start, int64_t sample_stride,
                             at::Tensor& nonfinite) {
  check_state(a, b, g, kind);
  const NonFinite nf(nonfinite, "compensate_select");
  const bool check = nf.on();
  const int64_t count = samples.numel();
  TORCH_CHECK(count == 0 || slots == 0, "compensate_select: samples are written with slots == 0 only");
  check_strided_sample(samples, sample_start, sample_stride, g.numel(), "compensate_select");
  float* sp = count > 0 ? samples.data_ptr<float>() : nullptr;
  const Params q = make(kind, c0, c1, scale);
  float* pa = a.data_ptr<float>();
  float* pb = kind == 0 ? nullptr : b.data_ptr<float>();
  const float* pg = g.data_ptr<float>();
  const int64_t n = g.numel(), blocks = (n + kBlock - 1) / kBlock, whole = n / kBlock;
  if (slots == 0) {
    at::Tensor out = at::empty({whole}, g.options());
    float* o = out.data_ptr<float>();
    at::parallel_for(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
      bool bad = false;
      with_kind(kind, q, [&](auto k, auto extra) {
        for (int64_t blk = b0; blk < b1; ++blk) {
          const int64_t lo = blk * kBlock, hi = std::min(n, lo + kBlock);
          float vals[kBlock];
          compensate_range<decltype(k)::value, decltype(extra)::value, true>(q, pa, pb, pg, lo, hi, vals);
          if (check) bad |= any_nonfinite(pg + lo, hi - lo);  // g's block just read: in L1
          if (blk < whole) o[blk] = abs_max(vals, hi - lo);
          if (sp != nullptr) gather_strided(vals, lo, hi, sample_start, sample_stride, count, sp);
        }
      });
      nf.report(bad);
    });
    return out;
  }
  TORCH_CHECK(slots > 0, "compensate_select: slots=", slots, " must be >= 0");
  TORCH_CHECK(n < (int64_t{1} << 32), "compensate_select: hashes 32-bit indices; split the tensor");
  const float thr = static_cast<float>(threshold);
  const uint32_t s = static_cast<uint32_t>(seed);
  const uint64_t m = static_cast<uint64_t>(slots);
  std::mutex lock;
  at::Tensor table;
  // As dragonn_select: per-range tables of plain stores (indices increase: the last is the
  // largest), merged by max, so the table does not depend on the number of threads.
  at::parallel_for(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    at::Tensor mine = at::full({slots}, -1, g.options().dtype(at::kLong));
    int64_t* t = mine.data_ptr<int64_t>();
    bool bad = false;
    with_kind(kind, q, [&](auto k, auto extra) {
      float vals[kBlock];
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t lo = blk * kBlock, hi = std::min(n, lo + kBlock);
        compensate_range<decltype(k)::value, decltype(extra)::value, true>(q, pa, pb, pg, lo, hi, vals);
        if (check) bad |= any_nonfinite(pg + lo, hi - lo);
        bool any = false;  // most blocks have no element above the threshold: one vector test each
        for (int64_t i = 0; i < hi - lo; ++i) any |= std::fabs(vals[i]) >= thr;
        if (!any) continue;
        for (int64_t i = 0; i < hi - lo; ++i) {
          if (std::fabs(vals[i]) >= thr) t[murmur3_32(static_cast<uint32_t>(lo + i), s) % m] = lo + i;
        }
      }
    });
    nf.report(bad);
    merge_by_max(table, mine, lock);
  });
  return table.defined() ? filled_slots(table) : at::empty({0}, g.options().dtype(at::kLong));
}

// The compensated values at flat int64 `indices` (DRAGONN's threshold samples, needed before its
// fused pass), state untouched: the very arithmetic of compensate_select, so a threshold sampled
// here equals one sampled afterwards.
at::Tensor compensate_at(const at::Tensor& a, const at::Tensor& b, const at::Tensor& g, const at::Tensor& indices,
                         int64_t kind, double c0, double c1, double scale) {
  check_state(a, b, g, kind);
  TORCH_CHECK(indices.device().is_cpu() && indices.scalar_type() == at::kLong && indices.is_contiguous(),
              "compensate_at: indices must be contiguous CPU int64");
  const Params q = make(kind, c0, c1, scale);
  float* pa = const_cast<float*>(a.data_ptr<float>());  // read only: write=false
  float* pb = kind == 0 ? nullptr : const_cast<float*>(b.data_ptr<float>());
  const float* pg = g.data_ptr<float>();
  const int64_t n = g.numel(), k = indices.numel();
  const int64_t* idx = indices.data_ptr<int64_t>();
  at::Tensor out = at::empty({k}, g.options());
  float* o = out.data_ptr<float>();
  for (int64_t j = 0; j < k; ++j) {
    TORCH_CHECK(0 <= idx[j] && idx[j] < n, "compensate_at: index ", idx[j], " out of range");
  }
  constexpr int64_t kAhead = 32;  // random samples are cache misses: keep ~32 of them in flight
  at::parallel_for(0, k, 16384, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      if (j + kAhead < j1) {
        const int64_t ahead = idx[j + kAhead];
        __builtin_prefetch(pg + ahead);
        __builtin_prefetch(pa + ahead);
        if (pb) __builtin_prefetch(pb + ahead);
      }
      compensate_any<false>(kind, q, pa, pb, pg, idx[j], idx[j] + 1, o + j);
    }
  });
  return out;
}

}  // namespace compbench_cpu
