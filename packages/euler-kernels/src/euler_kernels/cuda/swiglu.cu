// SwiGLU gate: out = silu(gate) * up, with silu(g) = g * sigmoid(g).

extern "C" __global__ void swiglu_forward(float* out, const float* gate, const float* up, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + __expf(-g)) * up[i];
    }
}

// dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))); dup = dout * silu(g)
extern "C" __global__ void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                           const float* up, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = gate[i], sig = 1.0f / (1.0f + __expf(-g));
        dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
        dup[i] = dout[i] * g * sig;
    }
}
