// Threshold binary quantization (Strom 2015) with its residual update in the kernel, packed:
// R += g; q = +1 if R >= tau, -1 if R <= -tau, else 0; R -= tau*q (exact: q is -1, 0 or 1);
// code = q & 3, four per byte. Twin: compbench.compressors.tbq._threshold_quantize.
#include "common.cuh"

extern "C" __global__ void tbq_step(float* __restrict__ r, const float* __restrict__ g, long long n,
                                    float tau, unsigned char* __restrict__ out, long long nbytes) {
    CB_FOR_EACH(j, nbytes) {
        unsigned int b = 0;
        for (int t = 0; t < 4; ++t) {
            long long i = j * 4 + t;
            if (i < n) {
                float v = __fadd_rn(r[i], g[i]);
                int q = (v >= tau) - (v <= -tau);
                r[i] = __fsub_rn(v, tau * (float)q);
                b |= ((unsigned int)q & 3u) << (2 * t);
            }
        }
        out[j] = (unsigned char)b;
    }
}
