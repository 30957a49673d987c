// Shared device helpers of compbench's kernels. NVRTC compiles each .cu on its own (CuPy passes
// -I extensions/cuda), so this header holds only inline device functions and macros, no includes:
// NVRTC has no standard headers, and the host shim of tests/unit/test_kernel_logic_host.py
// compiles the same text with g++.
#pragma once

// Grid-stride loop over [0, n): any launch size covers any n (the loader caps the grid).
#define CB_FOR_EACH(i, n)                                                             \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);   \
         i += (long long)blockDim.x * gridDim.x)

__device__ __forceinline__ unsigned int cb_rotl32(unsigned int x, int r) {
    return (x << r) | (x >> (32 - r));
}

// MurmurHash3_x86_32 of one 4-byte little-endian key (DRAGONN's slot hash; also the counter-based
// random stream below). Twin: compbench.compressors.dragonn.murmur3_32.
__device__ __forceinline__ unsigned int cb_murmur3_32(unsigned int key, unsigned int seed) {
    unsigned int k = key * 0xcc9e2d51u;
    k = cb_rotl32(k, 15);
    k *= 0x1b873593u;
    unsigned int h = seed ^ k;
    h = cb_rotl32(h, 13);
    h = h * 5u + 0xe6546b64u;
    h ^= 4u;  // length in bytes
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

// Whether |x| = `a` is NaN or +-Inf: !(a <= FLT_MAX) (true for NaN too: an unordered compare), as the CPU kernels test
// (extensions/cpu/common.h's any_nonfinite). Every writer stores the same 1 and nothing clears it in
// a kernel, so the order of the writes does not matter (no atomic needed).
__device__ __forceinline__ bool cb_nonfinite(float a) {
    return !(a <= 3.402823466e+38f);
}

// Counter-based U[0, 1): element i's draw depends only on (seed, i), so any thread order gives the
// same numbers and the torch twin (compbench.kernels.twins.counter_uniform) reproduces them bit for
// bit. 24 random bits, like torch's and numpy's float32 generators. The index is taken mod 2^32.
__device__ __forceinline__ float cb_uniform(unsigned int seed, long long i) {
    return (float)(cb_murmur3_32((unsigned int)i, seed) >> 8) * 5.9604644775390625e-08f;  // 2^-24
}
