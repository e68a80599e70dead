// Embedding backward: dweight[token] += dout[row], a scatter-add over rows that may share a token.
// atomicAdd makes every update land (plain += from two threads would lose one).

extern "C" __global__ void embedding_backward(float* dweight, const float* dout, const long long* tokens,
                                              long long n_rows, int C) {
    const long long n = n_rows * C;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / C;
        atomicAdd(&dweight[tokens[row] * C + (i % C)], dout[i]);
    }
}
