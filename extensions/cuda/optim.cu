// The decode and the SGD step in one pass (extensions/cpu/optim.cpp's sgd_step, bit for bit): each
// parameter element reads its gradient from a dense tensor (`dense`) or from the averaged sparse
// update (ascending unique flat indices and their values: a binary search; 0 where absent), then
//   DGC's SGD (dgc): d = p*wd; buf = d or buf*m + d; dec = nesterov ? fma(buf, m, d) : buf; g += dec
//   torch's SGD:      g = fma(p, wd, g); buf = g or buf*m + g (one fma from tail_from on);
//                     g = nesterov ? fma(buf, m, g) : buf
// and p = fma(g, -lr, p). sgd_sparse: no weight decay, no momentum: only the k carried entries.
// adam_step: extensions/cpu/adam.cpp's adam_step (torch's fused Adam/AdamW), bit for bit, with the
// float constants its host computes (kernels.ops.adam_step; c1 is 1-b1, or 1-b1 - 1 when not small).
#include "common.cuh"

// The first j in [0, k) with idx[j] >= i (k if none).
__device__ __forceinline__ long long cb_lower_bound(const long long* idx, long long k, long long i) {
    long long lo = 0, hi = k;
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if (idx[mid] < i) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// Element i of the gradient: grad[i] (dense), else its value in the sparse update (0 where absent).
__device__ __forceinline__ float cb_grad_at(int dense, const float* grad, const long long* idx,
                                            const float* vals, long long k, long long i) {
    if (dense) return grad[i];
    long long j = cb_lower_bound(idx, k, i);
    return (j < k && idx[j] == i) ? vals[j] : 0.0f;
}

extern "C" __global__ void sgd_step(float* __restrict__ p, float* __restrict__ buf,
                                    const float* __restrict__ grad, const long long* __restrict__ idx,
                                    const float* __restrict__ vals, long long k, long long n, int dense,
                                    float neg_lr, float wd, float m, int nesterov, int first, int dgc,
                                    int with_buf, long long tail_from) {
    CB_FOR_EACH(i, n) {
        float g = cb_grad_at(dense, grad, idx, vals, k, i);
        if (dgc) {
            if (wd != 0.0f) {
                float d = __fmul_rn(p[i], wd);
                float dec = d;
                if (with_buf) {
                    float bb = first ? d : __fadd_rn(__fmul_rn(buf[i], m), d);
                    buf[i] = bb;
                    dec = nesterov ? fmaf(bb, m, d) : bb;
                }
                g = __fadd_rn(g, dec);
            }
        } else {
            if (wd != 0.0f) g = fmaf(p[i], wd, g);
            if (with_buf) {
                float bb = g;
                if (!first) bb = i < tail_from ? __fadd_rn(__fmul_rn(buf[i], m), g) : fmaf(buf[i], m, g);
                buf[i] = bb;
                g = nesterov ? fmaf(bb, m, g) : bb;
            }
        }
        p[i] = fmaf(g, neg_lr, p[i]);
    }
}

extern "C" __global__ void sgd_sparse(float* __restrict__ p, const long long* __restrict__ idx,
                                      const float* __restrict__ vals, long long k, float neg_lr) {
    CB_FOR_EACH(j, k) {
        p[idx[j]] = fmaf(vals[j], neg_lr, p[idx[j]]);
    }
}

extern "C" __global__ void adam_step(float* __restrict__ p, float* __restrict__ m, float* __restrict__ v,
                                     const float* __restrict__ grad, const long long* __restrict__ idx,
                                     const float* __restrict__ vals, long long k, long long n, int dense,
                                     float neg_step, float wd, float decay, float c1, float b2, float c2,
                                     float bc2_sqrt, float eps, int with_decay, int decoupled, int small,
                                     long long tail_from) {
    CB_FOR_EACH(i, n) {
        float g = cb_grad_at(dense, grad, idx, vals, k, i);
        float pv = p[i];
        if (with_decay) {
            if (decoupled) {
                pv = __fmul_rn(pv, decay);
            } else {
                g = fmaf(pv, wd, g);
            }
        }
        const float mo = m[i];
        const float mv = fmaf(c1, __fsub_rn(g, mo), small ? mo : g);
        m[i] = mv;
        const float cg = __fmul_rn(c2, g);
        // torch's scalar tail contracts v*b2 + cg*g the other way round.
        const float vv = i < tail_from ? fmaf(cg, g, __fmul_rn(v[i], b2)) : fmaf(v[i], b2, __fmul_rn(cg, g));
        v[i] = vv;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vv), bc2_sqrt), eps);
        p[i] = __fadd_rn(pv, __fdiv_rn(__fmul_rn(neg_step, mv), denom));
    }
}
