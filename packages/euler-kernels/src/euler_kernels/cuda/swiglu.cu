// SwiGLU gate: out = silu(gate) * up, with silu(g) = g * sigmoid(g).
// Each body is a template over the storage type (float32, or bf16 as unsigned short); math is float32.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void swiglu_forward_body(T* out, const T* gate, const T* up, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = load_act(gate, i);
        store_act(out, i, g / (1.0f + __expf(-g)) * load_act(up, i));
    }
}

// dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))); dup = dout * silu(g)
template <typename T>
__device__ __forceinline__ void swiglu_backward_body(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                                     long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = load_act(gate, i), d = load_act(dout, i), sig = 1.0f / (1.0f + __expf(-g));
        store_act(dgate, i, d * load_act(up, i) * sig * (1.0f + g * (1.0f - sig)));
        store_act(dup, i, d * g * sig);
    }
}

extern "C" __global__ void swiglu_forward(float* out, const float* gate, const float* up, long long n) {
    swiglu_forward_body(out, gate, up, n);
}

extern "C" __global__ void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                           const float* up, long long n) {
    swiglu_backward_body(dgate, dup, dout, gate, up, n);
}

// bf16 storage: gate and up as the bf16 GEMMs wrote them, out and the gradients rounded to bf16 (they
// are the next bf16 GEMM's operands); 2 bytes per element each way instead of 4.
extern "C" __global__ void swiglu_forward_bf16(unsigned short* out, const unsigned short* gate,
                                               const unsigned short* up, long long n) {
    swiglu_forward_body(out, gate, up, n);
}

extern "C" __global__ void swiglu_backward_bf16(unsigned short* dgate, unsigned short* dup,
                                                const unsigned short* dout, const unsigned short* gate,
                                                const unsigned short* up, long long n) {
    swiglu_backward_body(dgate, dup, dout, gate, up, n);
}
