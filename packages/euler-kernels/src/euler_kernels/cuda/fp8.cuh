// FP8 values for the kernels that make FP8 operands (fp8.cu's casts, and the producers that cast as they go
// with a delayed scale: swiglu.cu's *_fp8 kernels, fp8_scales.cu). The rules and their NumPy reference are
// in matmul/fp8_format.py.
#pragma once
#include "common.cuh"

// k of the scale 2^k for this amax (a float's pattern, common.cuh's abs_bits): the largest k with
// amax 2^k <= 0.875 2^max_exponent (the format's largest value: max_exponent 9 for e4m3, 16 for e5m2),
// from the exponents alone (frexp); 0 when amax is 0, inf or NaN; within [-126, 126].
__device__ __forceinline__ int fp8_scale_exponent(unsigned amax_bits, int max_exponent) {
    const float amax = __uint_as_float(amax_bits);
    if (!(amax > 0.0f) || amax_bits >= 0x7f800000u) return 0;  // 0, inf or NaN
    int e;
    const float m = frexpf(amax, &e);  // amax = m 2^e, m in [0.5, 1)
    const int k = max_exponent - e - (m > 0.875f ? 1 : 0);
    return min(max(k, -126), 126);  // 2^k stays a normal float
}

// Two floats rounded to fp8 (nearest even, saturating), packed: a in the high byte, b in the low one.
template <bool E5M2>
__device__ __forceinline__ unsigned short fp8x2(float a, float b) {
    unsigned short d;
    if (E5M2)
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(d) : "f"(a), "f"(b));
    else
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(a), "f"(b));
    return d;
}

template <bool E5M2>
__device__ __forceinline__ float fp8_largest() {
    return E5M2 ? 57344.0f : 448.0f;
}

#define FP8_TILE 64              // a block writes a 64 x 64 tile: 256 threads, 16 consecutive values of a row each
#define FP8_TILE_PITCH (FP8_TILE + 4)  // bytes per row of the shared tile (the padding spreads the transposed reads)

// One 64 x 64 tile of an FP8 tensor (rows, cols), row-major into out and transposed into out_t (cols, rows),
// either null to skip it. The tile starts at (blockIdx.y * 64, blockIdx.x * 64); thread t holds the scaled
// values v[0..15] of row t / 4, columns (t % 4) 16 .. + 15 of the tile (anything past rows or cols: 0, not
// written). Returns how many of the thread's values saturated (|v| beyond the format's largest).
// `shared` is FP8_TILE * FP8_TILE_PITCH bytes; the call synchronises the block when out_t is written.
// aligned: out and out_t start on 16 bytes (then whole 16-byte pieces are stored at once).
template <bool E5M2>
__device__ int store_fp8_tile(const float* v, long long rows, long long cols, int aligned, unsigned char* out,
                              unsigned char* out_t, unsigned char* shared) {
    const long long r0 = (long long)blockIdx.y * FP8_TILE, c0 = (long long)blockIdx.x * FP8_TILE;
    const int r = threadIdx.x / 4, c = (threadIdx.x % 4) * 16;
    const long long row = r0 + r, col = c0 + c;
    unsigned char q[16];
    int saturated = 0;
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
        const unsigned short p = fp8x2<E5M2>(v[j + 1], v[j]);
        q[j] = p & 0xff;
        q[j + 1] = p >> 8;
        saturated += (fabsf(v[j]) > fp8_largest<E5M2>()) + (fabsf(v[j + 1]) > fp8_largest<E5M2>());
    }
    if (out && row < rows) {
        if (aligned && col + 16 <= cols && cols % 16 == 0)
            *reinterpret_cast<uint4*>(out + row * cols + col) = *reinterpret_cast<const uint4*>(q);
        else
#pragma unroll
            for (int j = 0; j < 16; ++j)  // unrolled with fixed indices: q stays in registers
                if (col + j < cols) out[row * cols + col + j] = q[j];
    }
    if (!out_t) return saturated;
#pragma unroll
    for (int j = 0; j < 16; ++j) shared[r * FP8_TILE_PITCH + c + j] = q[j];
    __syncthreads();
    // transposed: this thread writes out_t row c0 + r, 16 values from the tile's rows c .. c + 15
    const long long t_row = c0 + r, t_col = r0 + c;
    if (t_row < cols) {
#pragma unroll
        for (int j = 0; j < 16; ++j) q[j] = shared[(c + j) * FP8_TILE_PITCH + r];
        if (aligned && t_col + 16 <= rows && rows % 16 == 0)
            *reinterpret_cast<uint4*>(out_t + t_row * rows + t_col) = *reinterpret_cast<const uint4*>(q);
        else
#pragma unroll
            for (int j = 0; j < 16; ++j)
                if (t_col + j < rows) out_t[t_row * rows + t_col + j] = q[j];
    }
    return saturated;
}

// Add every thread's count to *total (one atomic a block). Every thread of the block must call it.
__device__ __forceinline__ void block_count(int count, unsigned long long* total) {
    __shared__ int scratch[32];
    for (int offset = 16; offset > 0; offset >>= 1) count += __shfl_xor_sync(FULL_MASK, count, offset);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = count;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) count += scratch[w];
        if (count) atomicAdd(total, (unsigned long long)count);
    }
}
