// QSGD's stochastic quantizer (TernGrad's is generated: compll/specs/terngrad.py) with the
// counter-based random stream of common.cuh: no generator state, every element draws
// U = cb_uniform(seed, i). Rounding is spelled with __fadd_rn/__fmul_rn so
// that nvcc cannot contract it into an FMA: the torch twins (compbench.kernels.twins) do the same
// separately rounded operations and match bit for bit.
#include "common.cuh"

// QSGD offset-binary codes: code = floor(clamp((U + s) + x * scale[bucket], 0, 2s)) with
// scale = s / ||bucket||_2 (0 for an all-zero bucket), computed by torch beforehand.
extern "C" __global__ void qsgd_codes(const float* __restrict__ x, long long n,
                                      const float* __restrict__ scale, long long bucket_size,
                                      float levels, unsigned int seed,
                                      unsigned char* __restrict__ codes) {
    const float top = 2.0f * levels;
    CB_FOR_EACH(i, n) {
        float v = __fadd_rn(__fadd_rn(cb_uniform(seed, i), levels), __fmul_rn(x[i], scale[i / bucket_size]));
        v = fminf(fmaxf(v, 0.0f), top);
        codes[i] = (unsigned char)v;  // v >= 0: truncation is the floor
    }
}
