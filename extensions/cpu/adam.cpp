// The decode and the Adam/AdamW step in one pass: the averaged sparse update (sorted unique flat
// indices, their summed values) or a dense gradient goes straight into the step over the parameter
// and its two moments, with no dense zero-fill, scatter and re-read of a gradient in between. Twin:
// the sparse decode into .grad, then torch's fused CPU Adam/AdamW step (`fused: true`, amsgrad off,
// not maximizing; aten/src/ATen/native/cpu/FusedAdamKernel.cpp), bit for bit, with its float
// constants (each rounded once from the double it computes):
//   Adam:  g = fma(p, wd, g)     AdamW: p = p*(1 - lr*wd)
//   m = fma(1-b1, g - m, m)      (torch's lerp; 1-b1 >= 0.5: fma(1-b1 - 1, g - m, g))
//   v = fma((1-b2)*g, g, v*b2)
//   p = p + (-lr/bc1 * m) / (sqrt(v)/sqrt(bc2) + eps)
// where g is 0 at every index the update does not carry (the twin's zero-filled decode). The fmas
// are where torch's compiler contracted its expressions (measured with torch 2.13: tests/unit/
// test_fused_adam.py); its scalar tail, the last n % 8 elements, contracts v differently,
// fma(v, b2, ((1-b2)*g)*g): the last `fma_tail` elements do so here too.

#include "common.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace compbench_cpu {
namespace {

struct AdamConsts {
  float neg_step, wd, decay, c1, b2, c2, bc2_sqrt, eps;
};

// One rule per instantiation, so the loop has no branch and vectorizes. Zero: the gradient is 0 on
// [lo, hi); Fma: torch's scalar tail; Small: 1-b1 < 0.5 (torch's lerp picks its base).
template <bool Decoupled, bool Decay, bool Small, bool Fma, bool Zero>
inline void adam_range(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                       const float* __restrict__ grad, int64_t lo, int64_t hi, const AdamConsts& c) {
  int64_t i = lo;
#if defined(__AVX2__) && defined(__FMA__)
  // 8 lanes with the scalar loop's operations (sqrt and division correctly rounded in both): the
  // compiler does not vectorize std::sqrt itself (errno), and the scalar loop is 5x slower than torch's.
  if (!Fma) {
    const __m256 neg_step = _mm256_set1_ps(c.neg_step), wd = _mm256_set1_ps(c.wd);
    const __m256 decay = _mm256_set1_ps(c.decay), c1 = _mm256_set1_ps(Small ? c.c1 : c.c1 - 1.f);
    const __m256 b2 = _mm256_set1_ps(c.b2), c2 = _mm256_set1_ps(c.c2);
    const __m256 bc2_sqrt = _mm256_set1_ps(c.bc2_sqrt), eps = _mm256_set1_ps(c.eps);
    for (; i + 8 <= hi; i += 8) {
      __m256 g = Zero ? _mm256_setzero_ps() : _mm256_loadu_ps(grad + i);
      __m256 pv = _mm256_loadu_ps(p + i);
      if (Decay) {
        if (Decoupled) {
          pv = _mm256_mul_ps(pv, decay);
        } else {
          g = _mm256_fmadd_ps(pv, wd, g);
        }
      }
      const __m256 mo = _mm256_loadu_ps(m + i);
      const __m256 mv = _mm256_fmadd_ps(c1, _mm256_sub_ps(g, mo), Small ? mo : g);
      _mm256_storeu_ps(m + i, mv);
      const __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(c2, g), g, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
      _mm256_storeu_ps(v + i, vv);
      const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2_sqrt), eps);
      _mm256_storeu_ps(p + i, _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(neg_step, mv), denom)));
    }
  }
#endif
  for (; i < hi; ++i) {
    float g = Zero ? 0.f : grad[i];
    float pv = p[i];
    if (Decay) {
      if (Decoupled) {
        pv = pv * c.decay;
      } else {
        g = std::fma(pv, c.wd, g);
      }
    }
    const float mv = Small ? std::fma(c.c1, g - m[i], m[i]) : std::fma(c.c1 - 1.f, g - m[i], g);
    m[i] = mv;
    const float cg = c.c2 * g;
    float vv = v[i] * c.b2;
    vv = Fma ? std::fma(v[i], c.b2, cg * g) : std::fma(cg, g, vv);
    v[i] = vv;
    const float denom = std::sqrt(vv) / c.bc2_sqrt + c.eps;
    p[i] = pv + (c.neg_step * mv) / denom;
  }
}

}  // namespace

// In place on p, exp_avg and exp_avg_sq. `grad` is either a dense fp32 gradient of p's size (then
// indices/values are ignored) or empty: the sparse update (indices int64 ascending and unique, values
// fp32). `step`: the step count after this step's increment (torch's state["step"]).
void adam_step(at::Tensor& p, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& grad,
               const at::Tensor& indices, const at::Tensor& values, double lr, double beta1, double beta2,
               double eps, double weight_decay, double step, bool decoupled, int64_t fma_tail) {
  check_flat_f32(p, "adam_step");
  check_flat_f32(exp_avg, "adam_step");
  check_flat_f32(exp_avg_sq, "adam_step");
  const int64_t n = p.numel();
  TORCH_CHECK(exp_avg.numel() == n && exp_avg_sq.numel() == n, "adam_step: moment and parameter sizes differ");
  const bool dense = grad.numel() > 0;
  if (dense) {
    check_flat_f32(grad, "adam_step");
    TORCH_CHECK(grad.numel() == n, "adam_step: grad and parameter sizes differ");
  } else {
    TORCH_CHECK(indices.device().is_cpu() && indices.scalar_type() == at::kLong && indices.is_contiguous(),
                "adam_step: indices must be contiguous CPU int64");
    check_flat_f32(values, "adam_step");
    TORCH_CHECK(values.numel() == indices.numel(), "adam_step: indices and values sizes differ");
  }
  // torch's constants: doubles, each rounded to float where its loop uses it.
  const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
  const double c1d = 1 - beta1;
  AdamConsts c{static_cast<float>(-(lr / bc1)), static_cast<float>(weight_decay),
               static_cast<float>(1 - lr * weight_decay), static_cast<float>(c1d),
               static_cast<float>(beta2), static_cast<float>(1 - beta2),
               static_cast<float>(std::sqrt(bc2)), static_cast<float>(eps)};
  float* pp = p.data_ptr<float>();
  float* pm = exp_avg.data_ptr<float>();
  float* pv = exp_avg_sq.data_ptr<float>();
  const float* pg = dense ? grad.data_ptr<float>() : nullptr;
  const int64_t k = dense ? 0 : indices.numel();
  const int64_t* idx = dense ? nullptr : indices.data_ptr<int64_t>();
  const float* val = dense ? nullptr : values.data_ptr<float>();
  for (int64_t j = 0; j < k; ++j) TORCH_CHECK(0 <= idx[j] && idx[j] < n, "adam_step: index ", idx[j], " out of range");
  const int64_t tail_from = n - std::min(n, std::max<int64_t>(0, fma_tail));
  auto run = [&](auto decoupled_, auto decay_, auto small_) {
    constexpr bool D = decltype(decoupled_)::value, W = decltype(decay_)::value, S = decltype(small_)::value;
    auto range = [&](int64_t lo, int64_t hi, const float* g, auto zero_) {
      constexpr bool Z = decltype(zero_)::value;
      const int64_t cut = std::max(lo, std::min(hi, tail_from));
      adam_range<D, W, S, false, Z>(pp, pm, pv, g, lo, cut, c);
      adam_range<D, W, S, true, Z>(pp, pm, pv, g, cut, hi, c);
    };
    at::parallel_for(0, n, 32768, [&](int64_t i0, int64_t i1) {
      if (dense) {
        range(i0, i1, pg, std::false_type{});
        return;
      }
      // The carried entries of this range (indices sorted: a binary search finds the first); the
      // gradient is 0 between them, its value at them.
      int64_t j = std::lower_bound(idx, idx + k, i0) - idx, pos = i0;
      for (; j < k && idx[j] < i1; ++j) {
        range(pos, idx[j], nullptr, std::true_type{});
        range(idx[j], idx[j] + 1, val + j - idx[j], std::false_type{});  // a one-element gradient
        pos = idx[j] + 1;
      }
      range(pos, i1, nullptr, std::true_type{});
    });
  };
  with_bool(decoupled, [&](auto a) {
    with_bool(weight_decay != 0.0, [&](auto b) { with_bool(std::abs(c1d) < 0.5, [&](auto s) { run(a, b, s); }); });
  });
}

}  // namespace compbench_cpu
