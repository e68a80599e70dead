// Muon's elementwise parts (the Newton-Schulz products are cuBLAS bf16 GEMMs, see muon_cuda.py).
// control = [grad_scale, apply, lr, bc1, bc2, norm] (step_control); hyper[lr_slot] = Muon's learning rate.
#include "common.cuh"

// Momentum as an average (buf += (1 - mu) (g - buf)), then Nesterov's look-ahead u = g + mu (buf - g)
// (or u = buf); g is the clipped gradient. apply = 0: the buffer stays as it was.
extern "C" __global__ void muon_momentum(float* update, float* buf, const float* grad, const float* control,
                                         float momentum, int nesterov, long long n) {
    if (control[1] == 0.0f) return;
    const float scale = control[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const float g = grad[i] * scale;
        const float b = buf[i] + (1.0f - momentum) * (g - buf[i]);
        buf[i] = b;
        update[i] = nesterov ? g + momentum * (b - g) : b;
    }
}

// p = p (1 - lr wd) - lr * shape_scale * o (decoupled decay, then the orthogonalised step); apply = 0: nothing.
extern "C" __global__ void muon_apply(float* param, const unsigned short* ortho, const float* control,
                                      const float* hyper, int lr_slot, float shape_scale, float weight_decay,
                                      long long n) {
    if (control[1] == 0.0f) return;
    const float lr = hyper[lr_slot];
    const float keep = 1.0f - lr * weight_decay, step = lr * shape_scale;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        param[i] = param[i] * keep - step * bf16_to_float(ortho[i]);
}
