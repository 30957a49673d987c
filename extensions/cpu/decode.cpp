// Codes back to values, one pass each: 1- and 2-bit codes through a table, QSGD's offset-binary codes.

#include "common.h"

#include <algorithm>
#include <cstring>
#include <tuple>
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

// Every rank's sparse payload averaged, kept sparse: `indices` (int32 or int64, flat, the ranks'
// payloads one after another) and `values` (fp32, already divided by the number of ranks) ->
// (int64 coordinates [len(shape), u] of the u distinct indices in ascending order, fp32 sums [u]).
// Duplicates are summed in payload order from 0, as index_add_ does. The entries are sorted by
// (index, position in the payload): one counting pass and one scatter into buckets of the indices'
// high bits (about 4 entries a bucket), then each bucket sorted on its own (insertion sort; a
// crowded bucket, indices bunched in one region, by std::sort). Then each run of equal indices is
// added up in order, and unravelled with reciprocals instead of integer divisions. Twin:
// compressors.sparse.sparse_average's torch path (unique, index_add_, unravel_index). One thread:
// the payloads are small (k per rank); for 2 x 14.9k random indices of a 4096x4096 tensor this
// kernel took 0.40 ms here with three 11-bit radix passes and 64-bit divisions, torch.unique 1.2 ms.
std::tuple<at::Tensor, at::Tensor> sparse_average(const at::Tensor& indices, const at::Tensor& values,
                                                  at::IntArrayRef shape) {
  check_flat_f32(values, "sparse_average");
  TORCH_CHECK(indices.device().is_cpu() && indices.is_contiguous() && indices.dim() == 1 &&
                  (indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong),
              "sparse_average: indices must be contiguous 1-D CPU int32 or int64");
  const int64_t m = indices.numel();
  TORCH_CHECK(values.numel() == m, "sparse_average: ", m, " indices but ", values.numel(), " values");
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  TORCH_CHECK(numel < (int64_t{1} << 32), "sparse_average: sorts 32-bit indices; split the tensor");
  std::vector<uint32_t> key(static_cast<size_t>(m));
  const bool narrow = indices.scalar_type() == at::kInt;
  const int32_t* i32 = narrow ? indices.data_ptr<int32_t>() : nullptr;
  const int64_t* i64 = narrow ? nullptr : indices.data_ptr<int64_t>();
  for (int64_t i = 0; i < m; ++i) {
    const int64_t v = narrow ? i32[i] : i64[i];
    TORCH_CHECK(0 <= v && v < numel, "sparse_average: index ", v, " outside the tensor's ", numel,
                " elements");
    key[static_cast<size_t>(i)] = static_cast<uint32_t>(v);
  }
  const int key_bits = numel > 1 ? 64 - __builtin_clzll(static_cast<uint64_t>(numel - 1)) : 0;
  int bucket_bits = 0;
  while (bucket_bits < std::min(key_bits, 20) && (int64_t{4} << bucket_bits) < m) ++bucket_bits;
  const int shift = key_bits - bucket_bits;
  const size_t buckets = size_t{1} << bucket_bits;
  std::vector<uint32_t> begin(buckets + 1, 0);
  for (uint32_t k : key) ++begin[(static_cast<uint64_t>(k) >> shift) + 1];
  for (size_t b = 1; b <= buckets; ++b) begin[b] += begin[b - 1];
  // (index << 32 | position): unique, ordered by index, then by position in the payload
  std::vector<uint64_t> item(key.size());
  std::vector<uint32_t> next(begin.begin(), begin.end() - 1);
  for (size_t i = 0; i < key.size(); ++i) {
    item[next[static_cast<uint64_t>(key[i]) >> shift]++] = (static_cast<uint64_t>(key[i]) << 32) | i;
  }
  for (size_t b = 0; b < buckets; ++b) {
    uint64_t* lo = item.data() + begin[b];
    uint64_t* hi = item.data() + begin[b + 1];
    if (hi - lo > 32) {
      std::sort(lo, hi);
      continue;
    }
    for (uint64_t* p = lo + 1; p < hi; ++p) {
      const uint64_t v = *p;
      uint64_t* q = p;
      for (; q > lo && *(q - 1) > v; --q) *q = *(q - 1);
      *q = v;
    }
  }
  const float* v = values.data_ptr<float>();
  std::vector<uint32_t> unique;
  std::vector<float> sums;
  unique.reserve(item.size());
  sums.reserve(item.size());
  for (size_t i = 0; i < item.size();) {
    const uint32_t k = static_cast<uint32_t>(item[i] >> 32);
    float sum = 0.0f;
    for (; i < item.size() && static_cast<uint32_t>(item[i] >> 32) == k; ++i) sum += v[item[i] & 0xFFFFFFFFu];
    unique.push_back(k);
    sums.push_back(sum);
  }
  const int64_t u = static_cast<int64_t>(unique.size()), dims = static_cast<int64_t>(shape.size());
  at::Tensor coords = at::empty({std::max<int64_t>(dims, 1), u}, indices.options().dtype(at::kLong));
  int64_t* c = coords.data_ptr<int64_t>();
  // rest / shape[d] as rest * (1 / shape[d]) in double, off by at most one and corrected (rest < 2^32)
  std::vector<double> inverse(static_cast<size_t>(std::max<int64_t>(dims, 1)));
  for (int64_t d = 1; d < dims; ++d) inverse[static_cast<size_t>(d)] = 1.0 / static_cast<double>(shape[d]);
  for (int64_t t = 0; t < u; ++t) {  // unravel: the last dimension varies fastest
    uint64_t rest = unique[static_cast<size_t>(t)];
    for (int64_t d = dims - 1; d >= 1; --d) {
      const uint64_t size = static_cast<uint64_t>(shape[d]);
      uint64_t q = static_cast<uint64_t>(static_cast<double>(rest) * inverse[static_cast<size_t>(d)]);
      if (q * size > rest) --q;
      if ((q + 1) * size <= rest) ++q;
      c[d * u + t] = static_cast<int64_t>(rest - q * size);
      rest = q;
    }
    c[t] = static_cast<int64_t>(rest);
  }
  at::Tensor out = at::empty({u}, values.options());
  std::copy(sums.begin(), sums.end(), out.data_ptr<float>());
  return {coords, out};
}

}  // namespace compbench_cpu
