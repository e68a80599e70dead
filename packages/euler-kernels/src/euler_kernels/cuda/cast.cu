// float32 -> bfloat16 (round to nearest even, NaN stays a quiet NaN), stored as the 16-bit pattern.
// The bf16 matmul path rounds operands with this, then multiplies them on the bf16 tensor cores.
#include "common.cuh"

extern "C" __global__ void float_to_bf16_kernel(unsigned short* out, const float* x, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = float_to_bf16(x[i]);
}

// x (rows, cols) C order into out's rows, out_stride values apart (columns of a wider bf16 matrix).
extern "C" __global__ void float_to_bf16_rows(unsigned short* out, long long out_stride, const float* x, long long cols,
                                              long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long row = i / cols;
        out[row * out_stride + (i - row * cols)] = float_to_bf16(x[i]);
    }
}

// Many tensors in one launch (the weights of a bf16 step): outs[t][j] = bf16(ins[t][j]), one block per chunk.
extern "C" __global__ void float_to_bf16_multi(unsigned short* const* outs, const float* const* ins,
                                               const int* chunk_tensor, const long long* chunk_start,
                                               const long long* sizes) {
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const float* in = ins[t];
    unsigned short* out = outs[t];
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) out[j] = float_to_bf16(in[j]);
}
