// decode_linear.cu's product for bf16 weights on the tensor cores: out (R, columns) = h (R, K) @ W.T, with
// the same fusions (NORM in front, SWIGLU or RESIDUAL after) and the same rounding (h and the gate/up sums
// to bf16, sums in float32), for up to 32 rows a launch. The CUDA-core kernel forms each row's dot products
// separately, so its time grows with every row; here one mma.sync m16n8k16 multiplies 16 weight rows by 8
// rows of h, so 32 rows cost about what one does: the weights are read once either way.
//
// A row's bits do not depend on the rows beside it (the decode step's rule: a speculative step's rows give
// what plain steps' single rows give): the mma computes each output element from its own row of A and
// column of B, and every sum runs in an order fixed by K alone:
//   K is cut into chunks of 32; warp w multiplies chunks w, w + 8, w + 16, ... in that order into its own
//   accumulator (two k-steps of 16 per chunk), then the 8 warps' sums are added in warp order.
//
// Fragments (g = lane / 4, t = lane % 4; layouts in flash_attention_bf16.cu's header). Within a chunk
// starting at k0 the mma's 16 k slots are a fixed permutation of the chunk's 32 k (a dot product does not
// care which slot a k sits in, as long as A and B agree), chosen so that each lane reads whole 16 bytes:
//   lane (g, t) loads W rows n0 + g and n0 + g + 8 at k0 + 8t .. k0 + 8t + 7 (wa, wb: 8 bf16 each) and h
//   row 8j + g at the same k (hv); k-step s takes the pieces (wa, wb, hv) .x/.y (s = 0) or .z/.w (s = 1):
//   A = {wa.x, wb.x, wa.y, wb.y}, B = {hv.x, hv.y}: slots 2t, 2t + 1 <- k0 + 8t + 4s + 0, 1 and
//   slots 2t + 8, 2t + 9 <- k0 + 8t + 4s + 2, 3, the same for A's rows and B's column.
// C (16 weight rows x 8 rows of h): c0, c1 (weight row g, h rows 8j + 2t, +1), c2, c3 (weight row g + 8).
//
// Block: 8 warps; it stages h (R rows, normed and rounded to bf16, zero rows up to a multiple of 8) in
// shared memory once, then takes tiles of 16 output columns (blockIdx.x, + gridDim.x, ...). The first
// tile's weights are loaded while h is staged, the next tile's while the warps' sums of this one are added.
// Defines: ROWS (R <= 32), CHUNKS (chunks per warp, ceil(K / 256)), HS (row stride of staged h in bf16:
// K, padded by 32 when K is a multiple of 64 so that the 8 rows one load phase reads fall in distinct
// banks), X_BF16, NORM, SWIGLU, RESIDUAL. K a multiple of 32; x, W, g 16-byte aligned.
// Shared memory: 8 NT HS bf16 (h) + 8 PARTS 16 8 NT float32 (the warps' sums; PARTS: 2 with SWIGLU, gate
// and up, else 1). Launch: blockDim 256.
#include "common.cuh"
#include "decode_linear.cuh"

#define WARPS 8
// pieces of h a lane loads before it stores any (x and g: 16 registers each), fewer beside many weights
#define STAGE_GROUP (SWIGLU || CHUNKS > 8 ? 2 : 4)
#define NT ((ROWS + 7) / 8)  // n-tiles of 8 rows of h
#define RS (8 * NT)          // staged rows, the last n-tile zero-padded
typedef storage<X_BF16>::type x_t;

// h (RS, K) into shared memory as bf16: (x rstd) g rounded (NORM), x rounded otherwise; rows past R zero.
// Warp w takes rows w, w + 8, ... (NT of them), lane l the pieces of 8 at l * 8 + 256 i (i < CHUNKS), so
// a row's rstd stays in its warp (no barrier). The norm's pass loads a piece of every row before it sums
// any; a row's sum of squares runs in the same order in whichever warp takes it: each lane over its pieces
// in order, then the warp's lanes (warp_sum). The loads are what a launch waits on, so every row's are in
// flight together (a first version issued them one after the other: docs/benchmarks/generate.md).
__device__ __forceinline__ void stage_rows(unsigned short* hs, const x_t* x, const float* g, int K, float eps) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if NORM
    float rstd[NT], ss[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) ss[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {  // a piece of every row in flight at once; each row's sum in order of i
        const int k = lane * 8 + 256 * i;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int r = warp + WARPS * j;
            if (r < ROWS && k < K) {
                float f[8];
                load_act8(x, (size_t)r * K + k, f);
#pragma unroll
                for (int q = 0; q < 8; q++) ss[j] = fmaf(f[q], f[q], ss[j]);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++) rstd[j] = rsqrtf(warp_sum(ss[j]) / K + eps);
#endif
    // the lane's NT CHUNKS pieces (row j = p / CHUNKS, chunk i = p % CHUNKS) in groups of STAGE_GROUP:
    // a group's loads are all issued before its stores
#pragma unroll
    for (int p0 = 0; p0 < NT * CHUNKS; p0 += STAGE_GROUP) {
        float f[STAGE_GROUP][8];
#if NORM
        float gf[STAGE_GROUP][8];
#endif
#pragma unroll
        for (int q = 0; q < STAGE_GROUP; q++) {
            const int p = p0 + q, r = warp + WARPS * (p / CHUNKS), k = lane * 8 + 256 * (p % CHUNKS);
#pragma unroll
            for (int e = 0; e < 8; e++) f[q][e] = 0.0f;
            if (p < NT * CHUNKS && r < ROWS && k < K) {
                load_act8(x, (size_t)r * K + k, f[q]);  // again: from L1, where the norm's pass left it
#if NORM
                load_act8(g, k, gf[q]);
#endif
            }
        }
#pragma unroll
        for (int q = 0; q < STAGE_GROUP; q++) {
            const int p = p0 + q, j = p / CHUNKS, r = warp + WARPS * j, k = lane * 8 + 256 * (p % CHUNKS);
            if (p >= NT * CHUNKS || k >= K) continue;
#if NORM
            if (r < ROWS) {
#pragma unroll
                for (int e = 0; e < 8; e++) f[q][e] = f[q][e] * rstd[j] * gf[q][e];
            }
#endif
            store_act8(hs, (size_t)r * HS + k, f[q]);
        }
    }
    __syncthreads();
}

// This lane's pieces of weight rows n and n + 8 (wa, wb) for each of its warp's chunks; zeros past the
// last column or chunk. Every load is issued before any is used.
__device__ __forceinline__ void load_weights(const unsigned short* W, int n, int rows_valid, int K, int warp,
                                             int lane, uint4* wa, uint4* wb) {
    const int g = lane >> 2, t = lane & 3;
    const unsigned short* ra = W + (size_t)(n + g) * K + 8 * t;
    const unsigned short* rb = ra + (size_t)8 * K;
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const int k0 = (warp + WARPS * i) * 32;
        wa[i] = k0 < K && g < rows_valid ? __ldg(reinterpret_cast<const uint4*>(ra + k0)) : zero;
        wb[i] = k0 < K && g + 8 < rows_valid ? __ldg(reinterpret_cast<const uint4*>(rb + k0)) : zero;
    }
}

// acc[j] (this lane's C fragment of n-tile j) = the warp's chunks of W rows (wa, wb) times h's rows.
__device__ __forceinline__ void multiply(const uint4* wa, const uint4* wb, const unsigned short* hs, int K,
                                         int warp, int lane, float (*acc)[4]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int i = 0; i < CHUNKS; i++) {
        const int k0 = (warp + WARPS * i) * 32;
        if (k0 >= K) break;  // a warp's chunks run in order; past K there are none
        const unsigned a0[4] = {wa[i].x, wb[i].x, wa[i].y, wb[i].y};
        const unsigned a1[4] = {wa[i].z, wb[i].z, wa[i].w, wb[i].w};
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const uint4 hv = *reinterpret_cast<const uint4*>(hs + (8 * j + g) * HS + k0 + 8 * t);
            mma_bf16(acc[j], a0, hv.x, hv.y);
            mma_bf16(acc[j], a1, hv.z, hv.w);
        }
    }
}

// This warp's C fragments into sums (PARTS, WARPS, 16, RS) at part p.
__device__ __forceinline__ void keep_sums(float* sums, int p, int warp, int lane, const float (*acc)[4]) {
    const int g = lane >> 2, t = lane & 3;
    float* s = sums + ((size_t)p * WARPS + warp) * 16 * RS;
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int r = 8 * j + 2 * t;
        s[g * RS + r] = acc[j][0], s[g * RS + r + 1] = acc[j][1];
        s[(g + 8) * RS + r] = acc[j][2], s[(g + 8) * RS + r + 1] = acc[j][3];
    }
}

// Part p's sum for weight row m (of the tile) and row r: the warps' sums added in warp order.
__device__ __forceinline__ float total(const float* sums, int p, int m, int r) {
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) y += sums[((size_t)(p * WARPS + w) * 16 + m) * RS + r];
    return y;
}

// out (R, columns) from x (R, K) (float32 or bf16), W (N, K) bf16; g (K,) the norm's weight; res (R,
// columns) the residual stream. columns = N, or N / 2 with SWIGLU (gate rows, then up rows).
extern "C" __global__ void __launch_bounds__(256) decode_linear_mma(float* out, const x_t* x,
                                                                    const unsigned short* W, const float* g,
                                                                    const float* res, int K, int columns,
                                                                    float eps) {
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    unsigned short* hs = reinterpret_cast<unsigned short*>(shared_bytes);       // (RS, HS)
    float* sums = reinterpret_cast<float*>(shared_bytes + (size_t)RS * HS * 2);  // (PARTS, WARPS, 16, RS)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int tiles = (columns + 15) / 16;
    if ((int)blockIdx.x >= tiles) return;

    uint4 wa[CHUNKS], wb[CHUNKS];  // the first tile's weights in flight while h is staged
    load_weights(W, blockIdx.x * 16, columns - blockIdx.x * 16, K, warp, lane, wa, wb);
#if SWIGLU
    uint4 ua[CHUNKS], ub[CHUNKS];  // the up rows, columns rows below the gate rows
    load_weights(W + (size_t)columns * K, blockIdx.x * 16, columns - blockIdx.x * 16, K, warp, lane, ua, ub);
#endif
    stage_rows(hs, x, g, K, eps);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int n0 = tile * 16, next = tile + gridDim.x;
        float acc[NT][4];
        multiply(wa, wb, hs, K, warp, lane, acc);
        keep_sums(sums, 0, warp, lane, acc);
#if SWIGLU
        multiply(ua, ub, hs, K, warp, lane, acc);
        keep_sums(sums, 1, warp, lane, acc);
#endif
        if (next < tiles) {  // the next tile's weights in flight while this one's sums are added
            load_weights(W, next * 16, columns - next * 16, K, warp, lane, wa, wb);
#if SWIGLU
            load_weights(W + (size_t)columns * K, next * 16, columns - next * 16, K, warp, lane, ua, ub);
#endif
        }
        __syncthreads();
        for (int i = threadIdx.x; i < 16 * ROWS; i += blockDim.x) {
            const int r = i / 16, m = i % 16, n = n0 + m;  // consecutive threads: consecutive columns
            if (n >= columns) continue;
            const float up = SWIGLU ? total(sums, 1, m, r) : 0.0f;
            const size_t at = (size_t)r * columns + n;
            out[at] = decode_output<true>(total(sums, 0, m, r), up, res, at);
        }
        __syncthreads();  // the sums are free for the next tile
    }
}
