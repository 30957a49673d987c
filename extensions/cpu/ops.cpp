// compbench's CPU hot paths as torch operators (torch.ops.compbench_cpu.*), each one pass over the
// gradient, registered here (select.cpp, signs.cpp, quantize.cpp, decode.cpp, memory.cpp, optim.cpp). Built by `make setup`
// (compbench.kernels.cpu); the pure-torch/numpy code they replace is their twin, fallback and test
// oracle (tests/unit/test_cpu_kernels.py).
//
// Threads: ATen's parallel_for, i.e. torch's own OpenMP pool, so torch.set_num_threads (compbench's
// `threads` setting) governs these kernels too. Results never depend on the number of threads: the
// DRAGONN table keeps the largest index per slot (per-range tables merged by max), sums are taken
// per fixed chunk and added in chunk order.

#include <torch/library.h>

#include "common.h"

namespace compbench_cpu {

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
  m.def("compensate_select(Tensor(a!) a, Tensor(b!) b, Tensor g, int kind, float c0, float c1, float scale, "
        "float threshold, int slots, int seed) -> Tensor", &compensate_select);
  m.def("compensate_at(Tensor a, Tensor b, Tensor g, Tensor indices, int kind, float c0, float c1, float scale) "
        "-> Tensor", &compensate_at);
  m.def("sgd_step(Tensor(a!) p, Tensor(b!) buf, Tensor grad, Tensor indices, Tensor values, float lr, "
        "float weight_decay, float momentum, bool nesterov, bool first, bool dgc, int fma_tail) -> ()", &sgd_step);
}

}  // namespace compbench_cpu
