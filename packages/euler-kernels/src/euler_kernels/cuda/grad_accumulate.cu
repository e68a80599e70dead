// A micro-batch's gradient weighted by its share of the loss, into the step's sum: dst = share * src, or
// dst += share * src. share is a device scalar (a captured step replays it with new values). One tensor
// per launch (written when tables could not be uploaded inside a capture; tables.upload now can, so a
// multi-tensor version over chunk_table's tables would take one launch: not done).
// The product is rounded before the sum (no fma), as NumPy computes it.
#include "common.cuh"

extern "C" __global__ void scale_into(float* dst, const float* src, const float* share, long long n) {
    const float w = share[0];
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x)
        dst[j] = __fmul_rn(w, src[j]);
}

extern "C" __global__ void scale_add_into(float* dst, const float* src, const float* share, long long n) {
    const float w = share[0];
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x)
        dst[j] = __fadd_rn(dst[j], __fmul_rn(w, src[j]));
}
