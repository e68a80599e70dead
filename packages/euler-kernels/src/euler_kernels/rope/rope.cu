// Rotary position embedding with the rotate-half pairing (x[i], x[i + D/2]), as in HF Llama.
// x, out (B, T, H, D) with each token's H x D values packed; consecutive tokens x_stride (out_stride) values
// apart (H * D when contiguous; more when the heads are columns of a wider row, as q and k are of the joint
// q/k/v product's rows); cos, sin (P, D/2); query t sits at position offset + t. out may be x (in place:
// each value is read before the same thread writes it).
// Forward rotates each pair by +angle; backward rotates the gradient by -angle (the transpose).
// The body is a template over the pairs per thread and the storage types of x and out (float32, or bf16 as
// unsigned short).
#include "common.cuh"

// N values from element i: one 16-byte access per eight (N = 8, i a multiple of 8), or one at a time.
template <int N, typename T>
__device__ __forceinline__ void load_run(const T* p, size_t i, float* v) {
    if (N == 8) {
        load_act8(p, i, v);
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) v[j] = load_act(p, i + j);
    }
}
template <int N, typename T>
__device__ __forceinline__ void store_run(T* p, size_t i, const float* v) {
    if (N == 8) {
        store_act8(p, i, v);
    } else {
#pragma unroll
        for (int j = 0; j < N; j++) store_act(p, i + j, v[j]);
    }
}

// Threads (x, y) of a block: y picks a (b, t, h) row of D values, x a run of PAIRS pairs within it, so the
// position t is found with one 32-bit division per row rather than per element (n_rows = B * T * H < 2^31).
// PAIRS = 8 (D % 16 == 0: every head size the presets use) moves eight values of each half and of each table
// row in 16-byte accesses; PAIRS = 1 takes any even D.
template <int PAIRS, typename In, typename Out>
__device__ __forceinline__ void rope_body(Out* out, const In* x, const float* cos_table, const float* sin_table,
                                          int n_rows, int T, int H, int D, int offset, float direction,
                                          long long x_stride, long long out_stride) {
    const int half = D / 2;
    for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < n_rows; row += gridDim.x * blockDim.y) {
        const int token = row / H, h = row - token * H, t = token % T;  // row = (b * T + t) * H + h
        const size_t table = (size_t)(offset + t) * half;
        const size_t base = (size_t)token * x_stride + (size_t)h * D, out_base = (size_t)token * out_stride + (size_t)h * D;
        for (int i = PAIRS * threadIdx.x; i < half; i += PAIRS * blockDim.x) {
            float c[PAIRS], s[PAIRS], x1[PAIRS], x2[PAIRS], y1[PAIRS], y2[PAIRS];
            load_run<PAIRS>(cos_table, table + i, c);
            load_run<PAIRS>(sin_table, table + i, s);
            load_run<PAIRS>(x, base + i, x1);
            load_run<PAIRS>(x, base + i + half, x2);
#pragma unroll
            for (int j = 0; j < PAIRS; j++) {
                const float2 y = rotate_pair(x1[j], x2[j], c[j], direction * s[j]);
                y1[j] = y.x, y2[j] = y.y;
            }
            store_run<PAIRS>(out, out_base + i, y1);
            store_run<PAIRS>(out, out_base + i + half, y2);
        }
    }
}

extern "C" __global__ void rope_rotate_vec8(float* out, const float* x, const float* cos_table,
                                            const float* sin_table, int n_rows, int T, int H, int D, int offset,
                                            float direction, long long x_stride, long long out_stride) {
    rope_body<8>(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction, x_stride, out_stride);
}

extern "C" __global__ void rope_rotate_bf16_vec8(unsigned short* out, const unsigned short* x,
                                                 const float* cos_table, const float* sin_table, int n_rows, int T,
                                                 int H, int D, int offset, float direction,
                                                 long long x_stride, long long out_stride) {
    rope_body<8>(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction, x_stride, out_stride);
}

extern "C" __global__ void rope_rotate_to_bf16_vec8(unsigned short* out, const float* x, const float* cos_table,
                                                    const float* sin_table, int n_rows, int T, int H, int D,
                                                    int offset, float direction, long long x_stride,
                                                    long long out_stride) {
    rope_body<8>(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction, x_stride, out_stride);
}

extern "C" __global__ void rope_rotate(float* out, const float* x, const float* cos_table, const float* sin_table,
                                       int n_rows, int T, int H, int D, int offset, float direction,
                                       long long x_stride, long long out_stride) {
    rope_body<1>(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction, x_stride, out_stride);
}

// bf16 -> bf16 (the forward of bf16 q and k)
extern "C" __global__ void rope_rotate_bf16(unsigned short* out, const unsigned short* x, const float* cos_table,
                                            const float* sin_table, int n_rows, int T, int H, int D,
                                            int offset, float direction, long long x_stride,
                                            long long out_stride) {
    rope_body<1>(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction, x_stride, out_stride);
}

// float32 -> bf16 (the backward: attention's float32 dq/dk rotated back, rounded for the bf16 GEMMs)
extern "C" __global__ void rope_rotate_to_bf16(unsigned short* out, const float* x, const float* cos_table,
                                               const float* sin_table, int n_rows, int T, int H, int D,
                                               int offset, float direction, long long x_stride,
                                            long long out_stride) {
    rope_body<1>(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction, x_stride, out_stride);
}
