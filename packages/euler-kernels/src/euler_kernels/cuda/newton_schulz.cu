// Newton-Schulz's elementwise parts in bf16 (its products are cuBLAS bf16 GEMMs, see cuda/newton_schulz.py).
#include "common.cuh"

// x / max(||x||_F, eps), rounded to bf16: the Newton-Schulz iteration's start (sum_squares: float64 (1,)).
extern "C" __global__ void ns_normalize_bf16(unsigned short* out, const float* x, const double* sum_squares,
                                             float eps, long long n) {
    const float inv = 1.0f / fmaxf((float)sqrt(sum_squares[0]), eps);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = float_to_bf16(x[i] * inv);
}

// out = bf16(alpha * x + beta * y): x a bf16 matrix, y a float32 product of the same shape.
extern "C" __global__ void ns_combine_bf16(unsigned short* out, const unsigned short* x, const float* y, float alpha,
                                           float beta, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = float_to_bf16(alpha * bf16_to_float(x[i]) + beta * y[i]);
}
