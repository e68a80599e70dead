// RMSNorm, fused: out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), per row of C.
// One warp per row: the row's sums need only shuffles, never a block-wide barrier.
#include "common.cuh"

// x, out (N, C); rstd (N,) is saved for the backward pass. Rows are strided over all warps of the grid.
extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int N,
                                           int C, float eps) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const float* xr = x + (size_t)row * C;
        float ss = 0.0f;
        for (int i = lane; i < C; i += 32) ss += xr[i] * xr[i];
        const float r = rsqrtf(warp_sum(ss) / C + eps);
        if (lane == 0) rstd[row] = r;
        for (int i = lane; i < C; i += 32) out[(size_t)row * C + i] = xr[i] * r * weight[i];  // x from L1
    }
}

// dx_i = rstd * (g_i w_i - x_i * rstd^2 * mean_j(g_j w_j x_j)), one warp per row; dweight = sum over rows
// of g * x * rstd, summed per block in shared memory, then added once per block with atomics (no update
// is lost; the order of the adds varies run to run).
extern "C" __global__ void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                                            const float* weight, const float* rstd, int N, int C) {
    extern __shared__ float dw_block[];  // (C,)
    for (int i = threadIdx.x; i < C; i += blockDim.x) dw_block[i] = 0.0f;
    __syncthreads();
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const float* g = dout + (size_t)row * C;
        const float* xr = x + (size_t)row * C;
        const float r = rstd[row];
        float dot = 0.0f;
        for (int i = lane; i < C; i += 32) dot += g[i] * weight[i] * xr[i];
        const float mean_gwx = warp_sum(dot) / C;
        for (int i = lane; i < C; i += 32) {
            dx[(size_t)row * C + i] = r * (g[i] * weight[i] - xr[i] * r * r * mean_gwx);
            atomicAdd(&dw_block[i], g[i] * xr[i] * r);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(&dweight[i], dw_block[i]);
}
