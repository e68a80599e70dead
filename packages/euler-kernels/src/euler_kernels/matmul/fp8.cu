// FP8 operands of the FP8 matrix products (gemm_fp8.py): the absolute maximum of a tensor, then the tensor
// scaled by a power of two and rounded to e4m3 or e5m2 (nearest even, saturating at the format's largest
// finite value), row-major, transposed, or both.
//
// Scale: 2^k with k the largest integer such that amax * 2^k <= the format's largest value, from the
// exponents alone (frexp), so the scaled value x * 2^k is exact and only the fp8 rounding errs;
// scale_inv = 2^-k is what the product multiplies back. amax 0, inf or NaN gives k 0.
// fp8_format.py holds the NumPy reference of the same rule, bit for bit.
#include "common.cuh"
#include "fp8.cuh"

#ifndef FP8_E5M2
#define FP8_E5M2 0  // 0: e4m3 (largest 448 = 0.875 * 2^9), 1: e5m2 (largest 57344 = 0.875 * 2^16)
#endif
#if FP8_E5M2
#define FP8_MAX_EXPONENT 16
#else
#define FP8_MAX_EXPONENT 9
#endif

// amax is kept as the bit pattern of a non-negative float (common.cuh's abs_bits and block_amax).
template <typename T>
__device__ void amax_body(const T* x, long long n, int aligned, unsigned* amax_bits) {
    unsigned bits = 0;  // the largest |value|'s pattern
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long n8 = aligned ? n / 8 : 0;  // 8 values a 16-byte (bf16) or two 16-byte (float32) loads
    float v[8];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += stride) {
        load_act8(x, (size_t)i * 8, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) bits = max(bits, abs_bits(v[j]));
    }
    for (long long i = n8 * 8 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        bits = max(bits, abs_bits(load_act(x, (size_t)i)));
    block_amax(bits, amax_bits);  // one atomic a block: thousands of warps' atomics on one address queue
}

extern "C" __global__ void amax_f32(const float* x, long long n, int aligned, unsigned* amax_bits) {
    amax_body(x, n, aligned, amax_bits);
}
extern "C" __global__ void amax_bf16(const unsigned short* x, long long n, int aligned, unsigned* amax_bits) {
    amax_body(x, n, aligned, amax_bits);
}

// k of the scale 2^k for this amax (see the header); the same rule as fp8_format.py's scale_exponent.
__device__ __forceinline__ int scale_exponent(unsigned amax_bits) {
    return fp8_scale_exponent(amax_bits, FP8_MAX_EXPONENT);
}

// Two floats rounded to fp8 (nearest even, saturating), packed: a in the high byte, b in the low one.
__device__ __forceinline__ unsigned short to_fp8x2(float a, float b) { return fp8x2<FP8_E5M2>(a, b); }

// x (rows, cols) -> out (rows, cols) and/or out_t (cols, rows), fp8 bytes of x * 2^k; scale_inv = 2^-k; in
// fp8.cuh's 64 x 64 tiles (FP8_TILE): 256 threads, 16 consecutive values of one row each.
// Grid: (ceil(cols / 64), ceil(rows / 64)). A null out or out_t is not written. aligned: x, out and out_t
// start on 16 bytes (then rows of a multiple of 16 values are read and written 16 bytes at a time).
template <typename T>
__device__ void cast_body(const T* x, long long rows, long long cols, int aligned, const unsigned* amax_bits,
                          unsigned char* out, unsigned char* out_t, float* scale_inv) {
    __shared__ unsigned char tile[FP8_TILE * FP8_TILE_PITCH];
    const int k = scale_exponent(*amax_bits);
    const float scale = ldexpf(1.0f, k);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = ldexpf(1.0f, -k);
    const long long r0 = (long long)blockIdx.y * FP8_TILE, c0 = (long long)blockIdx.x * FP8_TILE;
    const int r = threadIdx.x / 4, c = (threadIdx.x % 4) * 16;  // this thread's row and first column
    const long long row = r0 + r, col = c0 + c;
    unsigned char q[16];
    if (aligned && row < rows && col + 16 <= cols && cols % 16 == 0) {  // whole: 16-byte-aligned loads and stores
        float v[16];
        load_act8(x, (size_t)(row * cols + col), v);
        load_act8(x, (size_t)(row * cols + col + 8), v + 8);
#pragma unroll
        for (int j = 0; j < 16; j += 2) {
            const unsigned short p = to_fp8x2(v[j + 1] * scale, v[j] * scale);
            q[j] = p & 0xff;
            q[j + 1] = p >> 8;
        }
        if (out) *reinterpret_cast<uint4*>(out + row * cols + col) = *reinterpret_cast<const uint4*>(q);
    } else {  // the ragged edge: one value at a time
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const bool inside = row < rows && col + j < cols;
            q[j] = inside ? (unsigned char)(to_fp8x2(0.0f, load_act(x, (size_t)(row * cols + col + j)) * scale) & 0xff)
                          : 0;
            if (inside && out) out[row * cols + col + j] = q[j];
        }
    }
    if (!out_t) return;
#pragma unroll
    for (int j = 0; j < 16; ++j) tile[r * FP8_TILE_PITCH + c + j] = q[j];
    __syncthreads();
    // transposed: this thread writes out_t row (c0 + r), 16 values from x's rows r0 + c ... r0 + c + 15
    const long long t_row = c0 + r, t_col = r0 + c;
    if (t_row >= cols) return;
#pragma unroll
    for (int j = 0; j < 16; ++j) q[j] = tile[(c + j) * FP8_TILE_PITCH + r];
    if (aligned && t_col + 16 <= rows && rows % 16 == 0) {
        *reinterpret_cast<uint4*>(out_t + t_row * rows + t_col) = *reinterpret_cast<const uint4*>(q);
    } else {
        for (int j = 0; j < 16 && t_col + j < rows; ++j) out_t[t_row * rows + t_col + j] = q[j];
    }
}

extern "C" __global__ void cast_fp8_f32(const float* x, long long rows, long long cols, int aligned,
                                        const unsigned* amax_bits, unsigned char* out, unsigned char* out_t,
                                        float* scale_inv) {
    cast_body(x, rows, cols, aligned, amax_bits, out, out_t, scale_inv);
}
extern "C" __global__ void cast_fp8_bf16(const unsigned short* x, long long rows, long long cols, int aligned,
                                         const unsigned* amax_bits, unsigned char* out, unsigned char* out_t,
                                         float* scale_inv) {
    cast_body(x, rows, cols, aligned, amax_bits, out, out_t, scale_inv);
}
