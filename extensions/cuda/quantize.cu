// Stochastic quantizers with the counter-based random stream of common.cuh: no generator state,
// every element draws U = cb_uniform(seed, i). Rounding is spelled with __fadd_rn/__fmul_rn so
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

// TernGrad, packed: q = +1 if x > U*s, -1 if x < -U*s, else 0 (keeps sign(x)*s with probability
// min(|x|, s)/s); code = q & 3 (0, 1, 3), four per byte. *s is read from device memory.
extern "C" __global__ void terngrad_codes(const float* __restrict__ x, long long n,
                                          const float* __restrict__ s, unsigned int seed,
                                          unsigned char* __restrict__ out, long long nbytes) {
    const float sv = *s;
    CB_FOR_EACH(j, nbytes) {
        unsigned int b = 0;
        for (int t = 0; t < 4; ++t) {
            long long i = j * 4 + t;
            if (i < n) {
                float thr = __fmul_rn(cb_uniform(seed, i), sv);
                int q = (x[i] > thr) - (x[i] < -thr);
                b |= ((unsigned int)q & 3u) << (2 * t);
            }
        }
        out[j] = (unsigned char)b;
    }
}
