// A micro-batch's gradients weighted by its share of the loss, into the step's sums: dst = share * src, or
// dst += share * src, over every tensor of the list in one launch (chunking: chunk_range in common.cuh;
// dst and src have the same sizes, so one chunk table serves both). share is a device scalar (a captured
// step replays it with new values). The product is rounded before the sum (no fma), as NumPy computes it.
// src[t] is float32, or bf16 where src_bf16[t] is set (a micro-batch's bf16 weight gradients, train.bf16_grads).
#include "common.cuh"

extern "C" __global__ void scale_into_multi(float* const* dst, const void* const* src, const int* src_bf16,
                                            const int* chunk_tensor, const long long* chunk_start,
                                            const long long* sizes, const float* share, int accumulate) {
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const float w = share[0];
    float* d = dst[t];
    const GradRef s = grad_ref(src, src_bf16, t);
    if (accumulate)
        for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)
            d[j] = __fadd_rn(d[j], __fmul_rn(w, grad_at(s, j)));
    else
        for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) d[j] = __fmul_rn(w, grad_at(s, j));
}
