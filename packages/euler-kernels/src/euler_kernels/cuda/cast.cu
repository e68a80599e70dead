// float32 -> bfloat16, round to nearest even (NaN stays a quiet NaN), stored as the 16-bit pattern.
// The bf16 matmul path rounds both operands with this, then multiplies them on the bf16 tensor cores.

__device__ __forceinline__ unsigned short float_to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN: keep it quiet
    u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 bits dropped
    return (unsigned short)(u >> 16);
}

extern "C" __global__ void float_to_bf16_kernel(unsigned short* out, const float* x, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = float_to_bf16(x[i]);
}
