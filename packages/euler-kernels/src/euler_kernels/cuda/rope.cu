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
            store_act(out, base + i, x1 * c - x2 * s);
            store_act(out, base + i + half, x2 * c + x1 * s);
        }
    }
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
