// Rotary position embedding with the rotate-half pairing (x[i], x[i + D/2]), as in HF Llama.
// x, out (B, T, H, D); cos, sin (P, D/2); query t sits at position offset + t.
// Forward rotates each pair by +angle; backward rotates the gradient by -angle (the transpose).
// The body is a template over the storage types of x and out (float32, or bf16 as unsigned short).
#include "common.cuh"

// Threads (x, y) of a block: y picks a (b, t, h) row of D values, x the pairs within it, so the position t
// is found with one 32-bit division per row rather than per element (n_rows = B * T * H < 2^31).
template <typename In, typename Out>
__device__ __forceinline__ void rope_body(Out* out, const In* x, const float* cos_table, const float* sin_table,
                                          int n_rows, int T, int H, int D, int offset, float direction) {
    const int half = D / 2;
    for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < n_rows; row += gridDim.x * blockDim.y) {
        const int t = (row / H) % T;  // row = (b * T + t) * H + h
        const float* c_row = cos_table + (size_t)(offset + t) * half;
        const float* s_row = sin_table + (size_t)(offset + t) * half;
        const size_t base = (size_t)row * D;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            const float c = c_row[i], s = direction * s_row[i];
            const float x1 = load_act(x, base + i), x2 = load_act(x, base + i + half);
            const float2 y = rotate_pair(x1, x2, c, s);
            store_act(out, base + i, y.x);
            store_act(out, base + i + half, y.y);
        }
    }
}

// Eight pairs per thread in 16-byte loads and stores (D % 16 == 0: every head size the presets use): eight
// float32 or bf16 values of each half, and eight of each table row.
__device__ __forceinline__ void load8(const float* p, size_t i, float* v) {
    const float4 a = *reinterpret_cast<const float4*>(p + i), b = *reinterpret_cast<const float4*>(p + i + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const unsigned short* p, size_t i, float* v) {
    const uint4 u = *reinterpret_cast<const uint4*>(p + i);
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) v[2 * j] = __uint_as_float(w[j] << 16), v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
}
__device__ __forceinline__ void store8(float* p, size_t i, const float* v) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(unsigned short* p, size_t i, const float* v) {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) w[j] = float_to_bf16(v[2 * j]) | ((unsigned)float_to_bf16(v[2 * j + 1]) << 16);
    *reinterpret_cast<uint4*>(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

// Threads (x, y): y picks a (b, t, h) row, x a group of eight pairs within it.
template <typename In, typename Out>
__device__ __forceinline__ void rope_body_vec8(Out* out, const In* x, const float* cos_table,
                                               const float* sin_table, int n_rows, int T, int H, int D, int offset,
                                               float direction) {
    const int half = D / 2;
    for (int row = blockIdx.x * blockDim.y + threadIdx.y; row < n_rows; row += gridDim.x * blockDim.y) {
        const int t = (row / H) % T;  // row = (b * T + t) * H + h
        const size_t table = (size_t)(offset + t) * half, base = (size_t)row * D;
        for (int i = 8 * threadIdx.x; i < half; i += 8 * blockDim.x) {
            float c[8], s[8], x1[8], x2[8], y1[8], y2[8];
            load8(cos_table, table + i, c);
            load8(sin_table, table + i, s);
            load8(x, base + i, x1);
            load8(x, base + i + half, x2);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 y = rotate_pair(x1[j], x2[j], c[j], direction * s[j]);
                y1[j] = y.x, y2[j] = y.y;
            }
            store8(out, base + i, y1);
            store8(out, base + i + half, y2);
        }
    }
}

extern "C" __global__ void rope_rotate_vec8(float* out, const float* x, const float* cos_table,
                                            const float* sin_table, int n_rows, int T, int H, int D, int offset,
                                            float direction) {
    rope_body_vec8(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction);
}

extern "C" __global__ void rope_rotate_bf16_vec8(unsigned short* out, const unsigned short* x,
                                                 const float* cos_table, const float* sin_table, int n_rows, int T,
                                                 int H, int D, int offset, float direction) {
    rope_body_vec8(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction);
}

extern "C" __global__ void rope_rotate_to_bf16_vec8(unsigned short* out, const float* x, const float* cos_table,
                                                    const float* sin_table, int n_rows, int T, int H, int D,
                                                    int offset, float direction) {
    rope_body_vec8(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction);
}

extern "C" __global__ void rope_rotate(float* out, const float* x, const float* cos_table, const float* sin_table,
                                       int n_rows, int T, int H, int D, int offset, float direction) {
    rope_body(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction);
}

// bf16 -> bf16 (the forward of bf16 q and k)
extern "C" __global__ void rope_rotate_bf16(unsigned short* out, const unsigned short* x, const float* cos_table,
                                            const float* sin_table, int n_rows, int T, int H, int D,
                                            int offset, float direction) {
    rope_body(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction);
}

// float32 -> bf16 (the backward: attention's float32 dq/dk rotated back, rounded for the bf16 GEMMs)
extern "C" __global__ void rope_rotate_to_bf16(unsigned short* out, const float* x, const float* cos_table,
                                               const float* sin_table, int n_rows, int T, int H, int D,
                                               int offset, float direction) {
    rope_body(out, x, cos_table, sin_table, n_rows, T, H, D, offset, direction);
}
