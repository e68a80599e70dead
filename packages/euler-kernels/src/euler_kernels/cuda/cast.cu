// float32 -> bfloat16 (round to nearest even, NaN stays a quiet NaN), stored as the 16-bit pattern.
// The bf16 matmul path rounds operands with this, then multiplies them on the bf16 tensor cores.
#include "common.cuh"

extern "C" __global__ void float_to_bf16_kernel(unsigned short* out, const float* x, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = float_to_bf16(x[i]);
}
