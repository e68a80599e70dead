// A few rows through one linear layer, the way a decode step needs it: out (R, N) = h (R, K) @ W.T with
// W (N, K) read once from memory, one warp per output column n (a row of W), R <= 8 rows of h at once.
// Fused around the product (compile-time switches):
//   NORM      h = rmsnorm(x) * g (one row: each warp computes its rstd itself, x is small and in L1/L2;
//             several rows: warp r computes row r's the same way, and the block stages h)
//   SWIGLU    W is (2F, K), gate rows then up rows; out (R, F) = silu(gate) * up
//   RESIDUAL  out = res + product (the residual stream after a block)
// With bf16 weights (W_BF16) h is rounded to bf16 before the product, and the gate and up sums are rounded
// to bf16 before SwiGLU, as the unfused bf16 path rounds them (products accumulate in float32 either way).
// Defines: ROWS (R), VEC_ITERS (16-byte pieces of a W row per lane), W_BF16, X_BF16 (x's storage),
// NORM, SWIGLU, RESIDUAL, STAGED (several rows: the block norms and rounds h once into shared memory, R K
// floats, or bf16 with bf16 weights; one row: no staging and no block barrier). x's rows, W's rows and g
// are read in aligned 16-byte (or 8-byte) pieces. Launch: blockDim 256 (8 warps, 8 columns), grid
// ceil(columns / 8).
#include "common.cuh"
#include "decode_linear.cuh"

typedef storage<W_BF16>::type w_t;
typedef storage<X_BF16>::type x_t;
#define W_PER_VEC (W_BF16 ? 8 : 4)  // weights in 16 bytes

// The W_PER_VEC weights of one 16-byte piece as floats.
__device__ __forceinline__ void unpack(const uint4 v, float* f) {
#if W_BF16
    unpack_bf16x8(v, f);
#else
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
#endif
}

// The operand as the product sees it: rounded to bf16 when the weights are.
__device__ __forceinline__ float operand(float h) {
#if W_BF16
    return bf16_to_float(float_to_bf16(h));
#else
    return h;
#endif
}

// The W_PER_VEC activations of row r at k0 as floats: one 16-byte load (8 bf16 or 4 float32) or two.
__device__ __forceinline__ void load_x(const x_t* x, size_t at, float* f) {
#if X_BF16 && W_PER_VEC == 8
    unpack_bf16x8(*reinterpret_cast<const uint4*>(x + at), f);
#elif X_BF16
    const uint2 v = *reinterpret_cast<const uint2*>(x + at);
    f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
#else
#pragma unroll
    for (int i = 0; i < W_PER_VEC / 4; i++) {
        const float4 v = reinterpret_cast<const float4*>(x + at)[i];
        f[4 * i] = v.x, f[4 * i + 1] = v.y, f[4 * i + 2] = v.z, f[4 * i + 3] = v.w;
    }
#endif
}

// rstd of row r of x (K values), the same in every lane: each lane sums the squares of the pieces the
// product reads, in order, then the warp adds them. One rule for both paths, so one row and several give
// the same bits (a speculative step's rows then decode as a plain step's row does).
__device__ __forceinline__ float row_rstd(const x_t* x, int r, int K, int lane, float eps) {
    float ss = 0.0f;
#pragma unroll
    for (int it = 0; it < VEC_ITERS; it++) {  // every load in flight at once
        const int k0 = (it * 32 + lane) * W_PER_VEC;
        if (k0 < K) {
            float xf[W_PER_VEC];
            load_x(x, (size_t)r * K + k0, xf);
#pragma unroll
            for (int j = 0; j < W_PER_VEC; j++) ss = fmaf(xf[j], xf[j], ss);
        }
    }
    return rsqrtf(warp_sum(ss) / K + eps);
}

// The dot products of W row `n` (pieces held in `w`) with the R rows of h, summed over the warp; every
// load is unrolled (K <= VEC_ITERS pieces of the warp), so they are all in flight at once.
__device__ __forceinline__ void dot_rows(const uint4* w, const x_t* x, const float* g, const float* rstd, int K,
                                         int lane, float* acc) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
#pragma unroll
    for (int it = 0; it < VEC_ITERS; it++) {
        const int k0 = (it * 32 + lane) * W_PER_VEC;
        if (k0 < K) {
            float wf[W_PER_VEC], gf[W_PER_VEC];
            unpack(w[it], wf);
#if NORM
#pragma unroll
            for (int i = 0; i < W_PER_VEC / 4; i++) {
                const float4 v = reinterpret_cast<const float4*>(g + k0)[i];
                gf[4 * i] = v.x, gf[4 * i + 1] = v.y, gf[4 * i + 2] = v.z, gf[4 * i + 3] = v.w;
            }
#endif
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float xf[W_PER_VEC];
                load_x(x, (size_t)r * K + k0, xf);
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < W_PER_VEC; j++) {
#if NORM
                    xf[j] = xf[j] * rstd[r] * gf[j];
#endif
                    s = fmaf(operand(xf[j]), wf[j], s);
                }
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = warp_sum(acc[r]);
}

#if STAGED
typedef storage<W_BF16>::type h_t;  // bf16 weights: the operand, rounded to bf16, is exact in bf16

// Four activations of x at `at` (a multiple of 4) as floats.
__device__ __forceinline__ void load_x4(const x_t* x, size_t at, float* f) {
#if X_BF16
    const uint2 v = *reinterpret_cast<const uint2*>(x + at);
    f[0] = __uint_as_float(v.x << 16), f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16), f[3] = __uint_as_float(v.y & 0xffff0000u);
#else
    const float4 v = *reinterpret_cast<const float4*>(x + at);
    f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
#endif
}

__device__ __forceinline__ void store_h4(h_t* hs, int at, const float* f) {
#if W_BF16
    const unsigned lo = float_to_bf16(f[0]) | ((unsigned)float_to_bf16(f[1]) << 16);
    const unsigned hi = float_to_bf16(f[2]) | ((unsigned)float_to_bf16(f[3]) << 16);
    *reinterpret_cast<uint2*>(hs + at) = make_uint2(lo, hi);
#else
    *reinterpret_cast<float4*>(hs + at) = make_float4(f[0], f[1], f[2], f[3]);
#endif
}

// The block's operand rows h (R, K) into shared memory, normed (NORM) and rounded as the product takes
// them, so each warp's dot products only read them (more rows: the per-warp norm would repeat R times).
__device__ __forceinline__ void stage_rows(h_t* hs, const x_t* x, const float* g, int K, float eps) {
#if NORM
    __shared__ float rstd[ROWS];  // warp r norms row r (ROWS <= 8 warps), as the one-row path does
    if ((threadIdx.x >> 5) < ROWS) {
        const float v = row_rstd(x, threadIdx.x >> 5, K, threadIdx.x & 31, eps);
        if ((threadIdx.x & 31) == 0) rstd[threadIdx.x >> 5] = v;
    }
    __syncthreads();
#endif
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        for (int k = threadIdx.x * 4; k < K; k += 1024) {
            float f[4];
            load_x4(x, (size_t)r * K + k, f);
#if NORM
            const float4 gv = *reinterpret_cast<const float4*>(g + k);
            const float gf[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
            for (int j = 0; j < 4; j++) f[j] = f[j] * rstd[r] * gf[j];  // (x rstd) g, as the one-row path
#endif
            store_h4(hs, r * K + k, f);
        }
    }
    __syncthreads();
}

// dot_rows with h staged in shared memory (already normed and rounded).
__device__ __forceinline__ void dot_rows_staged(const uint4* w, const h_t* hs, int K, int lane, float* acc) {
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
#pragma unroll
    for (int it = 0; it < VEC_ITERS; it++) {
        const int k0 = (it * 32 + lane) * W_PER_VEC;
        if (k0 < K) {
            float wf[W_PER_VEC];
            unpack(w[it], wf);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float hf[W_PER_VEC];
                const uint4 v = *reinterpret_cast<const uint4*>(hs + r * K + k0);  // 16 bytes either way
#if W_BF16
                unpack_bf16x8(v, hf);
#else
                hf[0] = __uint_as_float(v.x), hf[1] = __uint_as_float(v.y);
                hf[2] = __uint_as_float(v.z), hf[3] = __uint_as_float(v.w);
#endif
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < W_PER_VEC; j++) s = fmaf(hf[j], wf[j], s);
                acc[r] += s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = warp_sum(acc[r]);
}
#endif

// Row n of W (K weights) into this lane's pieces: all loads issued before any is used.
__device__ __forceinline__ void load_row(const w_t* W, size_t n, int K, int lane, uint4* w) {
    const uint4* row = reinterpret_cast<const uint4*>(W + n * K);
#pragma unroll
    for (int it = 0; it < VEC_ITERS; it++) {
        const int piece = it * 32 + lane;
        w[it] = piece * W_PER_VEC < K ? __ldg(row + piece) : make_uint4(0, 0, 0, 0);
    }
}

// out (R, columns) from x (R, K), W (N, K); g (K,) the norm's weight; res (R, columns) the stream.
extern "C" __global__ void __launch_bounds__(256) decode_linear(float* out, const x_t* x, const w_t* W,
                                                                const float* g, const float* res, int K,
                                                                int columns, float eps) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * 8 + (threadIdx.x >> 5);  // this warp's output column
    const bool active = n < columns;
#if !STAGED
    if (!active) return;
#endif
    uint4 w[VEC_ITERS];
    if (active) load_row(W, n, K, lane, w);
#if SWIGLU
    uint4 wu[VEC_ITERS];
    if (active) load_row(W, (size_t)columns + n, K, lane, wu);  // the up row, F rows below the gate row
#endif
    float acc[ROWS];
#if STAGED
    extern __shared__ __align__(16) unsigned char staged_bytes[];
    h_t* hs = reinterpret_cast<h_t*>(staged_bytes);  // (R, K)
    stage_rows(hs, x, g, K, eps);                    // every thread of the block takes part
    if (!active) return;
    dot_rows_staged(w, hs, K, lane, acc);
#if SWIGLU
    float up[ROWS];
    dot_rows_staged(wu, hs, K, lane, up);
#endif
#else
    float rstd[ROWS];
#if NORM
#pragma unroll
    for (int r = 0; r < ROWS; r++) rstd[r] = row_rstd(x, r, K, lane, eps);
#endif
    dot_rows(w, x, g, rstd, K, lane, acc);
#if SWIGLU
    float up[ROWS];
    dot_rows(wu, x, g, rstd, K, lane, up);
#endif
#endif
    if (lane >= ROWS) return;
    // lane r writes row r (every lane holds every row's sum); a constant index keeps acc in registers
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (r != lane) continue;
#if SWIGLU
        const float u = up[r];
#else
        const float u = 0.0f;
#endif
        const size_t at = (size_t)r * columns + n;
        out[at] = decode_output<W_BF16>(acc[r], u, res, at);
    }
}
