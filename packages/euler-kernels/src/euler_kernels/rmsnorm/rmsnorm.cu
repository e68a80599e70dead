// RMSNorm, fused: out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), per row of C.
// The general kernels take one warp per row (the row's sums need only shuffles); the vectorised ones below share
// a row among a team of warps.
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
// Vectorised variants for C = 128 * ROW_F4 (compiled with -DROW_F4=C/128 -DROW_TEAM=warps per row, a power of
// two): a row is shared by a team of ROW_TEAM warps, so that each thread keeps few (ROW_PIECES) float4 pieces
// of the row and of the weight in registers: x and dout are read from memory exactly once.
#define ROW_C (128 * ROW_F4)
#define ROW_THREADS (32 * ROW_TEAM)
#define ROW_PIECES ((ROW_F4 + ROW_TEAM - 1) / ROW_TEAM)

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

// Piece j of team member t is the row's float4 number t + ROW_THREADS * j (past the row's end for the last
// pieces when ROW_TEAM does not divide ROW_F4).
__device__ __forceinline__ bool piece_in_row(int t, int j) {
    return ROW_F4 % ROW_TEAM == 0 || t + ROW_THREADS * j < ROW_C / 4;
}

// The sum of v over the row's team. The team's warps meet through shared memory, its slots alternating
// with the parity of the team's row count, so one named barrier (id 1 + team, the team's threads) per row
// is enough.
__device__ __forceinline__ float team_sum(float v, int parity) {
    v = warp_sum(v);
#if ROW_TEAM > 1
    __shared__ float partial[2][32];  // [row parity][warp of the block]
    const int warp = threadIdx.x >> 5, first = warp - warp % ROW_TEAM;
    if ((threadIdx.x & 31) == 0) partial[parity][warp] = v;
    named_barrier_sync(1 + warp / ROW_TEAM, ROW_THREADS);
    v = 0.0f;
#pragma unroll
    for (int m = 0; m < ROW_TEAM; m++) v += partial[parity][first + m];
#endif
    return v;
}

// amax (null: not wanted) is raised to the largest |value| of out as stored, for the FP8 cast that takes out.
template <typename Out, bool ADD>
__device__ __forceinline__ void rmsnorm_forward_vec_body(Out* out, float* rstd, const float* x, const float* weight,
                                                         const float* branch, float* sum, int N, float eps,
                                                         unsigned* amax) {
    unsigned bits = 0;
    const int t = threadIdx.x % ROW_THREADS, teams = blockDim.x / ROW_THREADS;
    const float4* weight4 = reinterpret_cast<const float4*>(weight);
    float4 w[ROW_PIECES];
#pragma unroll
    for (int j = 0; j < ROW_PIECES; j++)
        if (piece_in_row(t, j)) w[j] = weight4[t + ROW_THREADS * j];
    int parity = 0;
    for (int row = blockIdx.x * teams + threadIdx.x / ROW_THREADS; row < N; row += gridDim.x * teams, parity ^= 1) {
        const size_t row4 = (size_t)row * (ROW_C / 4);
        float4 xv[ROW_PIECES];
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < ROW_PIECES; j++) {
            if (!piece_in_row(t, j)) continue;
            const size_t i4 = row4 + t + ROW_THREADS * j;
            xv[j] = reinterpret_cast<const float4*>(x)[i4];
            if (ADD) {  // the residual connection: x + branch is normalised, and kept
                const float4 b = reinterpret_cast<const float4*>(branch)[i4];
                xv[j] = make_float4(xv[j].x + b.x, xv[j].y + b.y, xv[j].z + b.z, xv[j].w + b.w);
                reinterpret_cast<float4*>(sum)[i4] = xv[j];
            }
            ss += dot4(xv[j], xv[j]);
        }
        const float r = rsqrtf(team_sum(ss, parity) / ROW_C + eps);
        if (t == 0) rstd[row] = r;
#pragma unroll
        for (int j = 0; j < ROW_PIECES; j++) {
            if (!piece_in_row(t, j)) continue;
            const float4 o =
                make_float4(xv[j].x * r * w[j].x, xv[j].y * r * w[j].y, xv[j].z * r * w[j].z, xv[j].w * r * w[j].w);
            store4(out, row4 + t + ROW_THREADS * j, o);
            if (amax) bits = max_stored_bits4(bits, out, o);
        }
    }
    if (amax) block_amax(bits, amax);
}

extern "C" __global__ void rmsnorm_forward_vec(float* out, float* rstd, const float* x, const float* weight, int N,
                                               float eps) {
    rmsnorm_forward_vec_body<float, false>(out, rstd, x, weight, nullptr, nullptr, N, eps, nullptr);
}

extern "C" __global__ void rmsnorm_forward_vec_bf16(unsigned short* out, float* rstd, const float* x,
                                                    const float* weight, int N, float eps, unsigned* amax) {
    rmsnorm_forward_vec_body<unsigned short, false>(out, rstd, x, weight, nullptr, nullptr, N, eps, amax);
}

extern "C" __global__ void rmsnorm_forward_vec_add(float* out, float* rstd, const float* x, const float* weight,
                                                   const float* branch, float* sum, int N, float eps) {
    rmsnorm_forward_vec_body<float, true>(out, rstd, x, weight, branch, sum, N, eps, nullptr);
}

extern "C" __global__ void rmsnorm_forward_vec_add_bf16(unsigned short* out, float* rstd, const float* x,
                                                        const float* weight, const float* branch, float* sum, int N,
                                                        float eps, unsigned* amax) {
    rmsnorm_forward_vec_body<unsigned short, true>(out, rstd, x, weight, branch, sum, N, eps, amax);
}

// r * (g w - x c), each step rounded on its own: no multiply-add is contracted, so every variant of the
// kernel below (with or without the residual add, the bf16 copy, the maximum) gives dx the same bits.
__device__ __forceinline__ float norm_grad(float r, float g, float w, float x, float c) {
    return __fmul_rn(r, __fsub_rn(__fmul_rn(g, w), __fmul_rn(x, c)));
}

// dweight is summed in registers per thread over its team's rows, then over the block's teams in shared
// memory, then added to global memory once per block (atomics: no update is lost). COPY16: dx is also
// written rounded to bf16 (into dx16), for the bf16 products that take it next; amax (null: not wanted) is
// raised to dx16's largest |value|, for the FP8 cast that takes it. G: dout's storage, float32 or bf16 (the
// bf16 products' sum of gradients); a bf16 dout gives the bits of the float32 kernel on its values.
template <bool ADD, bool COPY16, typename G>
__device__ __forceinline__ void rmsnorm_backward_vec_body(float* dx, unsigned short* dx16, float* dweight,
                                                          const G* dout, const float* x, const float* weight,
                                                          const float* rstd, const float* add, int N,
                                                          unsigned* amax) {
    unsigned bits = 0;
    __shared__ float dw_block[ROW_C];
    for (int i = threadIdx.x; i < ROW_C; i += blockDim.x) dw_block[i] = 0.0f;
    const int t = threadIdx.x % ROW_THREADS, teams = blockDim.x / ROW_THREADS;
    const float4* weight4 = reinterpret_cast<const float4*>(weight);
    float4 w[ROW_PIECES], dw[ROW_PIECES];
#pragma unroll
    for (int j = 0; j < ROW_PIECES; j++) {
        if (piece_in_row(t, j)) w[j] = weight4[t + ROW_THREADS * j];
        dw[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    int parity = 0;
    for (int row = blockIdx.x * teams + threadIdx.x / ROW_THREADS; row < N; row += gridDim.x * teams, parity ^= 1) {
        const size_t row4 = (size_t)row * (ROW_C / 4);
        const float r = rstd[row];
        float4 gv[ROW_PIECES], xv[ROW_PIECES], av[ROW_PIECES];
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < ROW_PIECES; j++) {
            if (!piece_in_row(t, j)) continue;
            gv[j] = load4(dout, row4 + t + ROW_THREADS * j);
            xv[j] = reinterpret_cast<const float4*>(x)[row4 + t + ROW_THREADS * j];
            // the residual gradient is loaded with the row, not after the team's sum: its latency overlaps
            if (ADD) av[j] = reinterpret_cast<const float4*>(add)[row4 + t + ROW_THREADS * j];
            dot += gv[j].x * w[j].x * xv[j].x + gv[j].y * w[j].y * xv[j].y + gv[j].z * w[j].z * xv[j].z +
                   gv[j].w * w[j].w * xv[j].w;
        }
        const float c = r * r * team_sum(dot, parity) / ROW_C;  // rstd^2 * mean(g w x)
#pragma unroll
        for (int j = 0; j < ROW_PIECES; j++) {
            if (!piece_in_row(t, j)) continue;
            const size_t i4 = row4 + t + ROW_THREADS * j;
            const float4 g4 = gv[j], x4 = xv[j], wj = w[j];
            float4 dj = make_float4(norm_grad(r, g4.x, wj.x, x4.x, c), norm_grad(r, g4.y, wj.y, x4.y, c),
                                    norm_grad(r, g4.z, wj.z, x4.z, c), norm_grad(r, g4.w, wj.w, x4.w, c));
            if (ADD) dj = make_float4(av[j].x + dj.x, av[j].y + dj.y, av[j].z + dj.z, av[j].w + dj.w);
            reinterpret_cast<float4*>(dx)[i4] = dj;
            if (COPY16) store4(dx16, i4, dj);
            if (COPY16 && amax) bits = max_stored_bits4(bits, dx16, dj);
            dw[j].x += g4.x * x4.x * r;
            dw[j].y += g4.y * x4.y * r;
            dw[j].z += g4.z * x4.z * r;
            dw[j].w += g4.w * x4.w * r;
        }
    }
    __syncthreads();  // dw_block is zeroed
#pragma unroll
    for (int j = 0; j < ROW_PIECES; j++) {
        if (!piece_in_row(t, j)) continue;
        const int col = 4 * (t + ROW_THREADS * j);
        atomicAdd(&dw_block[col], dw[j].x);
        atomicAdd(&dw_block[col + 1], dw[j].y);
        atomicAdd(&dw_block[col + 2], dw[j].z);
        atomicAdd(&dw_block[col + 3], dw[j].w);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROW_C; i += blockDim.x) atomicAdd(&dweight[i], dw_block[i]);
    if (COPY16 && amax) block_amax(bits, amax);
}

extern "C" __global__ void rmsnorm_backward_vec(float* dx, float* dweight, const float* dout, const float* x,
                                                const float* weight, const float* rstd, int N) {
    rmsnorm_backward_vec_body<false, false, float>(dx, nullptr, dweight, dout, x, weight, rstd, nullptr, N, nullptr);
}

extern "C" __global__ void rmsnorm_backward_vec_add(float* dx, float* dweight, const float* dout, const float* x,
                                                    const float* weight, const float* rstd, const float* add, int N) {
    rmsnorm_backward_vec_body<true, false, float>(dx, nullptr, dweight, dout, x, weight, rstd, add, N, nullptr);
}

extern "C" __global__ void rmsnorm_backward_vec_copy16(float* dx, unsigned short* dx16, float* dweight,
                                                       const float* dout, const float* x, const float* weight,
                                                       const float* rstd, int N, unsigned* amax) {
    rmsnorm_backward_vec_body<false, true, float>(dx, dx16, dweight, dout, x, weight, rstd, nullptr, N, amax);
}

extern "C" __global__ void rmsnorm_backward_vec_add_copy16(float* dx, unsigned short* dx16, float* dweight,
                                                           const float* dout, const float* x, const float* weight,
                                                           const float* rstd, const float* add, int N,
                                                           unsigned* amax) {
    rmsnorm_backward_vec_body<true, true, float>(dx, dx16, dweight, dout, x, weight, rstd, add, N, amax);
}

// The same four with a bf16 dout (the sum of bf16 products' gradients that feeds the norm).
extern "C" __global__ void rmsnorm_backward_vec_g16(float* dx, float* dweight, const unsigned short* dout,
                                                    const float* x, const float* weight, const float* rstd, int N) {
    rmsnorm_backward_vec_body<false, false, unsigned short>(dx, nullptr, dweight, dout, x, weight, rstd, nullptr, N,
                                                            nullptr);
}

extern "C" __global__ void rmsnorm_backward_vec_add_g16(float* dx, float* dweight, const unsigned short* dout,
                                                        const float* x, const float* weight, const float* rstd,
                                                        const float* add, int N) {
    rmsnorm_backward_vec_body<true, false, unsigned short>(dx, nullptr, dweight, dout, x, weight, rstd, add, N,
                                                           nullptr);
}

extern "C" __global__ void rmsnorm_backward_vec_copy16_g16(float* dx, unsigned short* dx16, float* dweight,
                                                           const unsigned short* dout, const float* x,
                                                           const float* weight, const float* rstd, int N,
                                                           unsigned* amax) {
    rmsnorm_backward_vec_body<false, true, unsigned short>(dx, dx16, dweight, dout, x, weight, rstd, nullptr, N,
                                                           amax);
}

extern "C" __global__ void rmsnorm_backward_vec_add_copy16_g16(float* dx, unsigned short* dx16, float* dweight,
                                                               const unsigned short* dout, const float* x,
                                                               const float* weight, const float* rstd,
                                                               const float* add, int N, unsigned* amax) {
    rmsnorm_backward_vec_body<true, true, unsigned short>(dx, dx16, dweight, dout, x, weight, rstd, add, N, amax);
}
#endif
