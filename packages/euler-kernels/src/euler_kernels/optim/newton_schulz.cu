// Newton-Schulz's elementwise parts in bf16 (its products are cuBLAS bf16 GEMMs, see newton_schulz_cuda.py).
// A stack of n matrices of `size` elements each is one launch: matrix m is x[m * size .. (m + 1) * size).
#include "common.cuh"

// partials[m * parts + p]: the sum of squares of part p of matrix m (grid (parts, n)), in a fixed order.
extern "C" __global__ void ns_sum_squares(double* partials, const float* x, long long size) {
    const long long m = blockIdx.y, part = (size + gridDim.x - 1) / gridDim.x;
    const long long begin = m * size + blockIdx.x * part;
    const long long end = m * size + min(size, (blockIdx.x + 1) * part);
    double acc = 0.0;
    for (long long i = begin + threadIdx.x; i < end; i += blockDim.x) acc += (double)x[i] * x[i];
    const double s = block_sum_double(acc);
    if (threadIdx.x == 0) partials[m * gridDim.x + blockIdx.x] = s;
}

// inv[m] = 1 / max(||x_m||_F, eps) from matrix m's `parts` partial sums (one thread per matrix).
extern "C" __global__ void ns_inverse_norms(float* inv, const double* partials, int parts, float eps, int n) {
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= n) return;
    double s = 0.0;
    for (int p = 0; p < parts; p++) s += partials[(long long)m * parts + p];
    inv[m] = 1.0f / fmaxf((float)sqrt(s), eps);
}

// x_m * inv[m], rounded to bf16: the Newton-Schulz iteration's start (total = n * size elements).
extern "C" __global__ void ns_normalize_bf16(unsigned short* out, const float* x, const float* inv, long long size,
                                             long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        out[i] = float_to_bf16(x[i] * inv[i / size]);
}

// out = bf16(alpha * x + beta * y): x a bf16 matrix, y a float32 product of the same shape.
extern "C" __global__ void ns_combine_bf16(unsigned short* out, const unsigned short* x, const float* y, float alpha,
                                           float beta, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = float_to_bf16(alpha * bf16_to_float(x[i]) + beta * y[i]);
}
