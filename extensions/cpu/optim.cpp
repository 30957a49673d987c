// The decode and the optimizer step in one pass: the averaged sparse update (sorted unique flat
// indices, their summed values) goes straight into the SGD step, with no dense zero-fill, scatter
// and re-read of a gradient in between (a dense gradient is taken too: the step is still one pass
// instead of torch's several). Twin: sparse.sparse_decode_all into the .grad, then train/optim.py's
// SGD.step (its `dgc` groups' decay term, then torch's SGD step, fused or not), bit for bit:
//   DGC's SGD (dgc = true; momentum on the decay term only, wd != 0):
//     d = p*wd;  buf = d (first step) or buf*m + d;  dec = nesterov ? fma(buf, m, d) : buf
//     g = g + dec;  p = fma(g, -lr, p)
//   torch's SGD (dgc = false; dampening 0):
//     d = fma(p, wd, g) (wd != 0, else g);  buf = d (first step) or buf*m + d  (m != 0)
//     dir = nesterov ? fma(buf, m, d) : buf  (m != 0, else d);  p = fma(dir, -lr, p)
// where g is 0 at every index the update does not carry (the twin's zero-filled decode). torch's
// fused CPU kernel (`fused: true`) rounds buf*m + g once, as an fma, in its scalar tail, the last
// n % (its vector width) elements, where its compiler contracted the expression: the last
// `fma_tail` elements do so here too (0 for torch's foreach step).

#include "common.h"

#include <algorithm>
#include <type_traits>

namespace compbench_cpu {
namespace {

// One rule per instantiation, so the loop has no branch and vectorizes. Zero: the gradient is 0 on
// [lo, hi) (between the carried entries of a sparse update); Fma: torch's fused scalar tail.
template <bool Dgc, bool Decay, bool Buf, bool Nesterov, bool First, bool Fma, bool Zero>
inline void sgd_range(float* __restrict__ p, float* __restrict__ buf, const float* __restrict__ grad,
                      int64_t lo, int64_t hi, float neg_lr, float wd, float m) {
  for (int64_t i = lo; i < hi; ++i) {
    float g = Zero ? 0.f : grad[i];
    if (Dgc) {
      if (Decay) {
        const float d = p[i] * wd;
        float dec = d;
        if (Buf) {
          float b = d;
          if (!First) {
            b = buf[i] * m;
            b = b + d;
          }
          buf[i] = b;
          dec = Nesterov ? std::fma(b, m, d) : b;
        }
        g = g + dec;
      }
    } else {
      if (Decay) g = std::fma(p[i], wd, g);
      if (Buf) {
        float b = g;
        if (!First) {
          if (Fma) {
            b = std::fma(buf[i], m, g);
          } else {
            b = buf[i] * m;
            b = b + g;
          }
        }
        buf[i] = b;
        g = Nesterov ? std::fma(b, m, g) : b;
      }
    }
    p[i] = std::fma(g, neg_lr, p[i]);
  }
}

}  // namespace

// In place on p (and buf when wd != 0 and momentum != 0). `grad` is either a dense fp32 gradient of
// p's size (then indices/values are ignored) or empty: the sparse update (indices int64 ascending
// and unique, values fp32). Without weight decay only the carried entries are touched (O(k)).
void sgd_step(at::Tensor& p, at::Tensor& buf, const at::Tensor& grad, const at::Tensor& indices,
              const at::Tensor& values, double lr, double weight_decay, double momentum, bool nesterov,
              bool first, bool dgc, int64_t fma_tail) {
  check_flat_f32(p, "sgd_step");
  const int64_t n = p.numel();
  const bool dense = grad.numel() > 0;
  if (dense) {
    check_flat_f32(grad, "sgd_step");
    TORCH_CHECK(grad.numel() == n, "sgd_step: grad and parameter sizes differ");
  } else {
    TORCH_CHECK(indices.device().is_cpu() && indices.scalar_type() == at::kLong && indices.is_contiguous(),
                "sgd_step: indices must be contiguous CPU int64");
    check_flat_f32(values, "sgd_step");
    TORCH_CHECK(values.numel() == indices.numel(), "sgd_step: indices and values sizes differ");
  }
  const bool decay = weight_decay != 0.0;
  // DGC's buffer is the decay term's momentum (none without decay); torch's, the gradient's.
  const bool with_buf = momentum != 0.0 && (decay || !dgc);
  if (with_buf) {
    check_flat_f32(buf, "sgd_step");
    TORCH_CHECK(buf.numel() == n, "sgd_step: buffer and parameter sizes differ");
  }
  float* pp = p.data_ptr<float>();
  float* pb = with_buf ? buf.data_ptr<float>() : nullptr;
  const float* pg = dense ? grad.data_ptr<float>() : nullptr;
  const int64_t k = dense ? 0 : indices.numel();
  const int64_t* idx = dense ? nullptr : indices.data_ptr<int64_t>();
  const float* val = dense ? nullptr : values.data_ptr<float>();
  const float neg_lr = static_cast<float>(-lr), wd = static_cast<float>(weight_decay);
  const float m = static_cast<float>(momentum);
  if (!dense && !decay && !with_buf) {  // p -= lr * g at the k carried entries; fma(0, -lr, p) == p
    at::parallel_for(0, k, 16384, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        TORCH_CHECK(0 <= idx[j] && idx[j] < n, "sgd_step: index ", idx[j], " out of range");
        pp[idx[j]] = std::fma(val[j], neg_lr, pp[idx[j]]);
      }
    });
    return;
  }
  const int64_t tail_from = n - std::min(n, std::max<int64_t>(0, fma_tail));
  auto run = [&](auto dgc_, auto decay_, auto buf_, auto nest_, auto first_) {
    constexpr bool D = decltype(dgc_)::value, W = decltype(decay_)::value, B = decltype(buf_)::value;
    constexpr bool N = decltype(nest_)::value, F = decltype(first_)::value;
    // [lo, hi) with a dense gradient, or zero where Zero; split where torch's scalar tail starts.
    auto range = [&](int64_t lo, int64_t hi, auto zero_) {
      constexpr bool Z = decltype(zero_)::value;
      const int64_t cut = std::max(lo, std::min(hi, tail_from));
      sgd_range<D, W, B, N, F, false, Z>(pp, pb, pg, lo, cut, neg_lr, wd, m);
      sgd_range<D, W, B, N, F, true, Z>(pp, pb, pg, cut, hi, neg_lr, wd, m);
    };
    at::parallel_for(0, n, 32768, [&](int64_t i0, int64_t i1) {
      if (dense) {
        range(i0, i1, std::false_type{});
        return;
      }
      // The carried entries of this range (indices sorted: a binary search finds the first); the
      // gradient is 0 between them, its value at them.
      int64_t j = std::lower_bound(idx, idx + k, i0) - idx, pos = i0;
      for (; j < k && idx[j] < i1; ++j) {
        range(pos, idx[j], std::true_type{});
        const float* v = val + j;  // a one-element dense gradient at idx[j]
        const int64_t at = idx[j];
        if (at >= tail_from) {
          sgd_range<D, W, B, N, F, true, false>(pp + at, pb ? pb + at : nullptr, v, 0, 1, neg_lr, wd, m);
        } else {
          sgd_range<D, W, B, N, F, false, false>(pp + at, pb ? pb + at : nullptr, v, 0, 1, neg_lr, wd, m);
        }
        pos = at + 1;
      }
      range(pos, i1, std::true_type{});
    });
  };
  with_bool(dgc, [&](auto a) {
    with_bool(decay, [&](auto b) {
      with_bool(with_buf, [&](auto c) {
        with_bool(nesterov, [&](auto d) { with_bool(first, [&](auto e) { run(a, b, c, d, e); }); });
      });
    });
  });
}

}  // namespace compbench_cpu
