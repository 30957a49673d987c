// DRAGONN selection in one pass over the gradient: every element with |x| >= threshold writes its
// index into slot murmur3(index, seed) % slots of an int32 table filled with -1 beforehand.
// atomicMax makes the largest index win every collision: the same table as the torch twin
// (compbench.compressors.dragonn._select, scatter_reduce "amax"), whatever the thread order.
// Indices are int32 (the wire format): n < 2^31. With `check`, *nonfinite = 1 when an element is NaN
// or +-Inf (cb_nonfinite; the trainer's non-finite check folded into this pass, compbench.codec.finite).
#include "common.cuh"

extern "C" __global__ void dragonn_select(const float* __restrict__ x, long long n, float threshold,
                                          unsigned int seed, int* __restrict__ table,
                                          unsigned int slots, int* __restrict__ nonfinite, int check) {
    CB_FOR_EACH(i, n) {
        float a = fabsf(x[i]);
        if (check && cb_nonfinite(a)) *nonfinite = 1;
        if (a >= threshold) {
            unsigned int slot = cb_murmur3_32((unsigned int)i, seed) % slots;
            atomicMax(&table[slot], (int)i);
        }
    }
}
