// RMSNorm, fused: out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), per row of C.
#include "common.cuh"

// One block per row. x, out (N, C); rstd (N,) is saved for the backward pass.
extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                                           int C, float eps) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const float* xr = x + row * C;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) ss += xr[i] * xr[i];
    const float r = rsqrtf(block_sum(ss, scratch) / C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int i = threadIdx.x; i < C; i += blockDim.x) out[row * C + i] = xr[i] * r * weight[i];
}

// Each block walks `rows_per_block` rows: dx per row, and a partial dweight kept per thread column,
// added once per block with atomics (no update is lost; the order of the adds varies run to run).
// dx_i = rstd * (g_i w_i - x_i * rstd^2 * mean_j(g_j w_j x_j))
extern "C" __global__ void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                                            const float* weight, const float* rstd, int N, int C,
                                            int rows_per_block) {
    __shared__ float scratch[32];
    extern __shared__ float dw_partial[];  // (C,)
    for (int i = threadIdx.x; i < C; i += blockDim.x) dw_partial[i] = 0.0f;
    const int first = blockIdx.x * rows_per_block;
    const int last = min(N, first + rows_per_block);
    for (int row = first; row < last; row++) {
        const float* g = dout + (size_t)row * C;
        const float* xr = x + (size_t)row * C;
        const float r = rstd[row];
        float dot = 0.0f;
        for (int i = threadIdx.x; i < C; i += blockDim.x) dot += g[i] * weight[i] * xr[i];
        const float mean_gwx = block_sum(dot, scratch) / C;
        for (int i = threadIdx.x; i < C; i += blockDim.x) {
            dx[(size_t)row * C + i] = r * (g[i] * weight[i] - xr[i] * r * r * mean_gwx);
            dw_partial[i] += g[i] * xr[i] * r;  // each thread owns its own columns i
        }
    }
    for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(&dweight[i], dw_partial[i]);
}
