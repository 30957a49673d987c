// Error-feedback memories fused with DRAGONN's selection: one pass that updates the memory's state
// and, when `slots` > 0, writes every compensated element with |v| >= threshold into slot
// murmur3(index, seed) % slots (atomicMax: the largest index wins, as dragonn.cu). kind 0: residual
// r = fma(g, gamma, r*beta); kind 1: dgc u = u*m + g'; v += u; kind 2: dgc nesterov
// u = (u + g')*m; v = (v + u) + g' (g' = g*scale when clipped). Twin: extensions/cpu/memory.cpp's
// compensate_select (itself bit for bit memory/residual.py's and memory/dgc.py's `compensate`);
// the CPU pass's block maxima and strided sample (DGC's) are not written here: on CUDA the
// selection reads the compensated tensor itself. With `check`, *nonfinite = 1 when an element of the raw
// gradient g is NaN or +-Inf (as extensions/cpu/memory.cpp's).
#include "common.cuh"

__device__ __forceinline__ float cb_compensate(float* a, float* b, const float* g, long long i, int kind,
                                               float c0, float c1, float scale, int scaled, int decay,
                                               int write) {
    float gi = g[i];
    if (kind == 0) {
        float r = a[i];
        if (decay) r = __fmul_rn(r, c0);
        r = fmaf(gi, c1, r);
        if (write) a[i] = r;
        return r;
    }
    if (scaled) gi = __fmul_rn(gi, scale);
    float u = a[i], v = b[i];
    if (kind == 1) {
        u = __fadd_rn(__fmul_rn(u, c0), gi);
        v = __fadd_rn(v, u);
    } else {
        u = __fmul_rn(__fadd_rn(u, gi), c0);
        v = __fadd_rn(__fadd_rn(v, u), gi);
    }
    if (write) {
        a[i] = u;
        b[i] = v;
    }
    return v;
}

extern "C" __global__ void compensate_select(float* __restrict__ a, float* __restrict__ b,
                                             const float* __restrict__ g, long long n, int kind, float c0,
                                             float c1, float scale, int scaled, int decay, float threshold,
                                             unsigned int seed, int* __restrict__ table, unsigned int slots,
                                             int* __restrict__ nonfinite, int check) {
    CB_FOR_EACH(i, n) {
        if (check && cb_nonfinite(fabsf(g[i]))) *nonfinite = 1;  // the raw gradient, as the CPU's
        float v = cb_compensate(a, b, g, i, kind, c0, c1, scale, scaled, decay, 1);
        if (slots && fabsf(v) >= threshold) {
            atomicMax(&table[cb_murmur3_32((unsigned int)i, seed) % slots], (int)i);
        }
    }
}

// The compensated values at `k` flat indices, the state untouched (a threshold's samples).
extern "C" __global__ void compensate_at(const float* __restrict__ a, const float* __restrict__ b,
                                         const float* __restrict__ g, const long long* __restrict__ idx,
                                         long long k, int kind, float c0, float c1, float scale, int scaled,
                                         int decay, float* __restrict__ out) {
    CB_FOR_EACH(j, k) {
        out[j] = cb_compensate((float*)a, (float*)b, g, idx[j], kind, c0, c1, scale, scaled, decay, 0);
    }
}
