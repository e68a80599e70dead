// Rotary position embedding with the rotate-half pairing (x[i], x[i + D/2]), as in HF Llama.
// x, out (B, T, H, D); cos, sin (P, D/2); query t sits at position offset + t.
// Forward rotates each pair by +angle; backward rotates the gradient by -angle (the transpose).
// The body is a template over the storage types of x and out (float32, or bf16 as unsigned short).
#include "common.cuh"

template <typename In, typename Out>
__device__ __forceinline__ void rope_body(Out* out, const In* x, const float* cos_table, const float* sin_table,
                                          long long n_pairs, int T, int H, int D, int offset, float direction) {
    const int half = D / 2;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < n_pairs;
         p += (long long)gridDim.x * blockDim.x) {
        const int i = p % half;                    // index within the half
        const long long row = p / half;            // (b * T + t) * H + h
        const int t = (row / H) % T;
        const float c = cos_table[(size_t)(offset + t) * half + i];
        const float s = direction * sin_table[(size_t)(offset + t) * half + i];
        const size_t base = row * D;
        const float x1 = load_act(x, base + i), x2 = load_act(x, base + i + half);
        store_act(out, base + i, x1 * c - x2 * s);
        store_act(out, base + i + half, x2 * c + x1 * s);
    }
}

extern "C" __global__ void rope_rotate(float* out, const float* x, const float* cos_table, const float* sin_table,
                                       long long n_pairs, int T, int H, int D, int offset, float direction) {
    rope_body(out, x, cos_table, sin_table, n_pairs, T, H, D, offset, direction);
}

// bf16 -> bf16 (the forward of bf16 q and k)
extern "C" __global__ void rope_rotate_bf16(unsigned short* out, const unsigned short* x, const float* cos_table,
                                            const float* sin_table, long long n_pairs, int T, int H, int D,
                                            int offset, float direction) {
    rope_body(out, x, cos_table, sin_table, n_pairs, T, H, D, offset, direction);
}

// float32 -> bf16 (the backward: attention's float32 dq/dk rotated back, rounded for the bf16 GEMMs)
extern "C" __global__ void rope_rotate_to_bf16(unsigned short* out, const float* x, const float* cos_table,
                                               const float* sin_table, long long n_pairs, int T, int H, int D,
                                               int offset, float direction) {
    rope_body(out, x, cos_table, sin_table, n_pairs, T, H, D, offset, direction);
}
