// RMSNorm, fused: out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), per row of C.
// One warp per row: the row's sums need only shuffles, never a block-wide barrier.
#include "common.cuh"

// x, out (N, C); rstd (N,) is saved for the backward pass. Rows are strided over all warps of the grid.
// Out is float32, or bf16 (unsigned short) when it only feeds bf16 matrix products.
// ADD (a residual connection fused in front): the row normalised is x + branch, also written to `sum`.
template <typename Out, bool ADD>
__device__ __forceinline__ void rmsnorm_forward_body(Out* out, float* rstd, const float* x, const float* weight,
                                                     const float* branch, float* sum, int N, int C, float eps) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const size_t base = (size_t)row * C;
        float ss = 0.0f;
        for (int i = lane; i < C; i += 32) {
            const float v = ADD ? x[base + i] + branch[base + i] : x[base + i];
            if (ADD) sum[base + i] = v;
            ss += v * v;
        }
        const float r = rsqrtf(warp_sum(ss) / C + eps);
        if (lane == 0) rstd[row] = r;
        const float* xr = ADD ? sum : x;  // the row again, from L1/L2 (this thread wrote its own elements)
        for (int i = lane; i < C; i += 32) store_act(out, base + i, xr[base + i] * r * weight[i]);
    }
}

extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int N,
                                           int C, float eps) {
    rmsnorm_forward_body<float, false>(out, rstd, x, weight, nullptr, nullptr, N, C, eps);
}

extern "C" __global__ void rmsnorm_forward_bf16(unsigned short* out, float* rstd, const float* x,
                                                const float* weight, int N, int C, float eps) {
    rmsnorm_forward_body<unsigned short, false>(out, rstd, x, weight, nullptr, nullptr, N, C, eps);
}

extern "C" __global__ void rmsnorm_forward_add(float* out, float* rstd, const float* x, const float* weight,
                                               const float* branch, float* sum, int N, int C, float eps) {
    rmsnorm_forward_body<float, true>(out, rstd, x, weight, branch, sum, N, C, eps);
}

extern "C" __global__ void rmsnorm_forward_add_bf16(unsigned short* out, float* rstd, const float* x,
                                                    const float* weight, const float* branch, float* sum, int N,
                                                    int C, float eps) {
    rmsnorm_forward_body<unsigned short, true>(out, rstd, x, weight, branch, sum, N, C, eps);
}

// dx_i = rstd * (g_i w_i - x_i * rstd^2 * mean_j(g_j w_j x_j)), one warp per row; dweight = sum over rows
// of g * x * rstd, summed per block in shared memory, then added once per block with atomics (no update
// is lost; the order of the adds varies run to run).
// ADD: dx = add + (the above), the residual branch's gradient summed in the same pass.
template <bool ADD>
__device__ __forceinline__ void rmsnorm_backward_body(float* dx, float* dweight, const float* dout, const float* x,
                                                      const float* weight, const float* rstd, const float* add,
                                                      int N, int C) {
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
            const float d = r * (g[i] * weight[i] - xr[i] * r * r * mean_gwx);
            dx[(size_t)row * C + i] = ADD ? add[(size_t)row * C + i] + d : d;
            atomicAdd(&dw_block[i], g[i] * xr[i] * r);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(&dweight[i], dw_block[i]);
}

extern "C" __global__ void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                                            const float* weight, const float* rstd, int N, int C) {
    rmsnorm_backward_body<false>(dx, dweight, dout, x, weight, rstd, nullptr, N, C);
}

extern "C" __global__ void rmsnorm_backward_add(float* dx, float* dweight, const float* dout, const float* x,
                                                const float* weight, const float* rstd, const float* add, int N,
                                                int C) {
    rmsnorm_backward_body<true>(dx, dweight, dout, x, weight, rstd, add, N, C);
}

#ifdef ROW_F4
// Vectorised variants for C = 128 * ROW_F4 (compiled with -DROW_F4=C/128): each lane keeps its ROW_F4
// float4 pieces of the row in registers, so x and dout are read from memory exactly once. Rows wider than
// 1024 (ROW_F4 > 8) would not fit in registers with the weight beside them: there the weight is read per row
// (from L1) and the backward reads the row's dout and x twice (the second time from L1/L2).
#define ROW_C (128 * ROW_F4)
#define ROW_KEPT (ROW_F4 <= 8)

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

template <typename Out, bool ADD>
__device__ __forceinline__ void rmsnorm_forward_vec_body(Out* out, float* rstd, const float* x, const float* weight,
                                                         const float* branch, float* sum, int N, float eps) {
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float4* weight4 = reinterpret_cast<const float4*>(weight);
    float4 w[ROW_F4];
#pragma unroll
    for (int j = 0; j < ROW_F4; j++)
        if (ROW_KEPT) w[j] = weight4[lane + 32 * j];
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const size_t row4 = (size_t)row * (ROW_C / 4);
        float4 xv[ROW_F4];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < ROW_F4; j++) {
            xv[j] = reinterpret_cast<const float4*>(x)[row4 + lane + 32 * j];
            if (ADD) {  // the residual connection: x + branch is normalised, and kept
                const float4 b = reinterpret_cast<const float4*>(branch)[row4 + lane + 32 * j];
                xv[j] = make_float4(xv[j].x + b.x, xv[j].y + b.y, xv[j].z + b.z, xv[j].w + b.w);
                reinterpret_cast<float4*>(sum)[row4 + lane + 32 * j] = xv[j];
            }
            ss += dot4(xv[j], xv[j]);
        }
        const float r = rsqrtf(warp_sum(ss) / ROW_C + eps);
        if (lane == 0) rstd[row] = r;
#pragma unroll
        for (int j = 0; j < ROW_F4; j++) {
            const float4 wj = ROW_KEPT ? w[j] : __ldg(weight4 + lane + 32 * j);
            store4(out, row4 + lane + 32 * j,
                   make_float4(xv[j].x * r * wj.x, xv[j].y * r * wj.y, xv[j].z * r * wj.z, xv[j].w * r * wj.w));
        }
    }
}

extern "C" __global__ void rmsnorm_forward_vec(float* out, float* rstd, const float* x, const float* weight, int N,
                                               float eps) {
    rmsnorm_forward_vec_body<float, false>(out, rstd, x, weight, nullptr, nullptr, N, eps);
}

extern "C" __global__ void rmsnorm_forward_vec_bf16(unsigned short* out, float* rstd, const float* x,
                                                    const float* weight, int N, float eps) {
    rmsnorm_forward_vec_body<unsigned short, false>(out, rstd, x, weight, nullptr, nullptr, N, eps);
}

extern "C" __global__ void rmsnorm_forward_vec_add(float* out, float* rstd, const float* x, const float* weight,
                                                   const float* branch, float* sum, int N, float eps) {
    rmsnorm_forward_vec_body<float, true>(out, rstd, x, weight, branch, sum, N, eps);
}

extern "C" __global__ void rmsnorm_forward_vec_add_bf16(unsigned short* out, float* rstd, const float* x,
                                                        const float* weight, const float* branch, float* sum, int N,
                                                        float eps) {
    rmsnorm_forward_vec_body<unsigned short, true>(out, rstd, x, weight, branch, sum, N, eps);
}

// dweight is summed in registers per lane over the warp's rows, then over the block's warps in shared
// memory, then added to global memory once per block (atomics: no update is lost).
template <bool ADD>
__device__ __forceinline__ void rmsnorm_backward_vec_body(float* dx, float* dweight, const float* dout,
                                                          const float* x, const float* weight, const float* rstd,
                                                          const float* add, int N) {
    __shared__ float dw_block[ROW_C];
    for (int i = threadIdx.x; i < ROW_C; i += blockDim.x) dw_block[i] = 0.0f;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float4* weight4 = reinterpret_cast<const float4*>(weight);
    float4 w[ROW_F4], dw[ROW_F4];
#pragma unroll
    for (int j = 0; j < ROW_F4; j++) {
        if (ROW_KEPT) w[j] = weight4[lane + 32 * j];
        dw[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    for (int row = blockIdx.x * warps + (threadIdx.x >> 5); row < N; row += gridDim.x * warps) {
        const float4* gr = reinterpret_cast<const float4*>(dout + (size_t)row * ROW_C);
        const float4* xr = reinterpret_cast<const float4*>(x + (size_t)row * ROW_C);
        const float r = rstd[row];
        float4 gv[ROW_F4], xv[ROW_F4];
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < ROW_F4; j++) {
            const float4 g4 = gr[lane + 32 * j], x4 = xr[lane + 32 * j];
            const float4 wj = ROW_KEPT ? w[j] : __ldg(weight4 + lane + 32 * j);
            if (ROW_KEPT) gv[j] = g4, xv[j] = x4;
            dot += g4.x * wj.x * x4.x + g4.y * wj.y * x4.y + g4.z * wj.z * x4.z + g4.w * wj.w * x4.w;
        }
        const float c = r * r * warp_sum(dot) / ROW_C;  // rstd^2 * mean(g w x)
        float4* d = reinterpret_cast<float4*>(dx + (size_t)row * ROW_C);
#pragma unroll
        for (int j = 0; j < ROW_F4; j++) {
            const float4 g4 = ROW_KEPT ? gv[j] : gr[lane + 32 * j], x4 = ROW_KEPT ? xv[j] : xr[lane + 32 * j];
            const float4 wj = ROW_KEPT ? w[j] : __ldg(weight4 + lane + 32 * j);
            float4 dj = make_float4(r * (g4.x * wj.x - x4.x * c), r * (g4.y * wj.y - x4.y * c),
                                    r * (g4.z * wj.z - x4.z * c), r * (g4.w * wj.w - x4.w * c));
            if (ADD) {
                const float4 a = reinterpret_cast<const float4*>(add + (size_t)row * ROW_C)[lane + 32 * j];
                dj = make_float4(a.x + dj.x, a.y + dj.y, a.z + dj.z, a.w + dj.w);
            }
            d[lane + 32 * j] = dj;
            dw[j].x += g4.x * x4.x * r;
            dw[j].y += g4.y * x4.y * r;
            dw[j].z += g4.z * x4.z * r;
            dw[j].w += g4.w * x4.w * r;
        }
    }
    __syncthreads();  // dw_block is zeroed
#pragma unroll
    for (int j = 0; j < ROW_F4; j++) {
        const int col = 4 * (lane + 32 * j);
        atomicAdd(&dw_block[col], dw[j].x);
        atomicAdd(&dw_block[col + 1], dw[j].y);
        atomicAdd(&dw_block[col + 2], dw[j].z);
        atomicAdd(&dw_block[col + 3], dw[j].w);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROW_C; i += blockDim.x) atomicAdd(&dweight[i], dw_block[i]);
}

extern "C" __global__ void rmsnorm_backward_vec(float* dx, float* dweight, const float* dout, const float* x,
                                                const float* weight, const float* rstd, int N) {
    rmsnorm_backward_vec_body<false>(dx, dweight, dout, x, weight, rstd, nullptr, N);
}

extern "C" __global__ void rmsnorm_backward_vec_add(float* dx, float* dweight, const float* dout, const float* x,
                                                    const float* weight, const float* rstd, const float* add, int N) {
    rmsnorm_backward_vec_body<true>(dx, dweight, dout, x, weight, rstd, add, N);
}
#endif
