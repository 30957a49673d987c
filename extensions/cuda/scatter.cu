// Sparse decode: out[idx[i]] += vals[i] for the concatenated (values, indices) of every rank, one
// launch; duplicate indices add (atomicAdd). The caller zero-fills `out` first. Twin: index_add_.
#include "common.cuh"

extern "C" __global__ void scatter_add(float* __restrict__ out, const int* __restrict__ idx,
                                       const float* __restrict__ vals, long long m) {
    CB_FOR_EACH(i, m) { atomicAdd(&out[idx[i]], vals[i]); }
}
