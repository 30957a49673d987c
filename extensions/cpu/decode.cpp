// Codes back to values, one pass each: 1- and 2-bit codes through a table, QSGD's offset-binary codes.

#include "common.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace compbench_cpu {

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

}  // namespace compbench_cpu
