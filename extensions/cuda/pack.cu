// Bit-packed wire codes (compbench.compressors.packing): code i lives at bits
// [b*(i % (8/b)), ...) of byte i*b/8, little-endian within the byte. One thread per packed byte
// for packing (no atomics), one per element for decoding. Twins: packing's torch paths.
#include "common.cuh"

// bit i = (x[i] < 0): signsgd / efsignsgd signs. NaN and -0.0 are not negative.
extern "C" __global__ void pack_signs(const float* __restrict__ x, long long n,
                                      unsigned char* __restrict__ out, long long nbytes) {
    CB_FOR_EACH(j, nbytes) {
        unsigned int b = 0;
        for (int t = 0; t < 8; ++t) {
            long long i = j * 8 + t;
            if (i < n && x[i] < 0.0f) b |= 1u << t;
        }
        out[j] = (unsigned char)b;
    }
}

// bit i = (mask[i] != 0) for a bool / uint8 mask: onebit, signum.
extern "C" __global__ void pack_bits(const unsigned char* __restrict__ mask, long long n,
                                     unsigned char* __restrict__ out, long long nbytes) {
    CB_FOR_EACH(j, nbytes) {
        unsigned int b = 0;
        for (int t = 0; t < 8; ++t) {
            long long i = j * 8 + t;
            if (i < n && mask[i]) b |= 1u << t;
        }
        out[j] = (unsigned char)b;
    }
}

// out[i] = bit i set ? *one : *zero (scalars read from device memory: no host sync).
extern "C" __global__ void decode_bits(const unsigned char* __restrict__ packed, long long n,
                                       const float* __restrict__ one, const float* __restrict__ zero,
                                       float* __restrict__ out) {
    const float a = *one, b = *zero;
    CB_FOR_EACH(i, n) { out[i] = ((packed[i >> 3] >> (i & 7)) & 1u) ? a : b; }
}

// Four 2-bit codes (uint8 in 0..3) per byte: terngrad, tbq, qsgd with levels=1.
extern "C" __global__ void pack_2bit(const unsigned char* __restrict__ codes, long long n,
                                     unsigned char* __restrict__ out, long long nbytes) {
    CB_FOR_EACH(j, nbytes) {
        unsigned int b = 0;
        for (int t = 0; t < 4; ++t) {
            long long i = j * 4 + t;
            if (i < n) b |= (codes[i] & 3u) << (2 * t);
        }
        out[j] = (unsigned char)b;
    }
}

// out[i] = values[code i] (a 4-entry table in device memory).
extern "C" __global__ void decode_2bit(const unsigned char* __restrict__ packed, long long n,
                                       const float* __restrict__ values, float* __restrict__ out) {
    CB_FOR_EACH(i, n) { out[i] = values[(packed[i >> 2] >> (2 * (i & 3))) & 3u]; }
}
