// Threshold compaction (exact top-k candidates, sparse.AbsIndex): the indices of every element with
// |x| >= threshold, in arbitrary order, written to out[0 .. cap) through one atomic counter. The
// counter ends at the total number of passing elements even when it exceeds cap, so the caller
// can launch again with a larger buffer. Twin: torch.nonzero(x.abs() >= threshold) (sorted).
#include "common.cuh"

extern "C" __global__ void compact_abs_ge(const float* __restrict__ x, long long n, float threshold,
                                          long long* __restrict__ out,
                                          unsigned long long* __restrict__ count, long long cap) {
    CB_FOR_EACH(i, n) {
        if (fabsf(x[i]) >= threshold) {
            unsigned long long pos = atomicAdd(count, 1ULL);
            if (pos < (unsigned long long)cap) out[pos] = i;
        }
    }
}
