// Multi-tensor kernels: one launch covers every parameter tensor (chunking: see chunk_range in common.cuh).
#include "common.cuh"

// One AdamW element update: decoupled weight decay, bias correction; g already scaled by the clip factor.
__device__ __forceinline__ void adamw_element(float* p, float* m, float* v, float g, float decay, float lr,
                                              float beta1, float beta2, float eps, float bc1, float bc2) {
    const float mj = beta1 * *m + (1.0f - beta1) * g;
    const float vj = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mj;
    *v = vj;
    const float update = (mj / bc1) / (sqrtf(vj / bc2) + eps);
    *p = *p - lr * (update + decay * *p);
}

// AdamW over every tensor; grad_scale (device scalar) is the clipping factor, the rest come from the host.
extern "C" __global__ void adamw_multi(float* const* params, float* const* ms, float* const* vs,
                                       const float* const* grads, const float* weight_decay,
                                       const int* chunk_tensor, const long long* chunk_start,
                                       const long long* sizes, const float* grad_scale, float lr, float beta1,
                                       float beta2, float eps, float bias_correction1, float bias_correction2) {
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const float gs = grad_scale[0], decay = weight_decay[t];
    float *p = params[t], *m = ms[t], *v = vs[t];
    const float* g = grads[t];
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)
        adamw_element(p + j, m + j, v + j, g[j] * gs, decay, lr, beta1, beta2, eps, bias_correction1,
                      bias_correction2);
}

// The same update with everything that changes per step read from the device (a CUDA graph replays it):
// control = [grad_scale, apply, lr, bias_correction1, bias_correction2, norm], written by step_control.
extern "C" __global__ void adamw_multi_ctl(float* const* params, float* const* ms, float* const* vs,
                                           const float* const* grads, const float* weight_decay,
                                           const int* chunk_tensor, const long long* chunk_start,
                                           const long long* sizes, const float* control, float beta1,
                                           float beta2, float eps) {
    if (control[1] == 0.0f) return;  // a non-finite loss or gradient: leave weights and moments alone
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const float gs = control[0], lr = control[2], bc1 = control[3], bc2 = control[4], decay = weight_decay[t];
    float *p = params[t], *m = ms[t], *v = vs[t];
    const float* g = grads[t];
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x)
        adamw_element(p + j, m + j, v + j, g[j] * gs, decay, lr, beta1, beta2, eps, bc1, bc2);
}

// Per-step control on the device, from the gradients' sum of squares and the loss:
// hyper = [lr, bias_correction1, bias_correction2, enable] from the host (enable 0: a dry run);
// control as adamw_multi_ctl reads it; apply = enable and the loss and norm are finite.
extern "C" __global__ void step_control(float* control, const double* sum_squares, const float* loss,
                                        const float* hyper, float max_norm) {
    const float norm = (float)sqrt(sum_squares[0]);
    const bool finite = isfinite(norm) && isfinite(loss[0]);
    control[0] = max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
    control[1] = finite && hyper[3] != 0.0f ? 1.0f : 0.0f;
    control[2] = hyper[0];
    control[3] = hyper[1];
    control[4] = hyper[2];
    control[5] = norm;
}

// Sum of squares of every element of every tensor: one double per chunk in partials[chunk] (no atomics
// on one address, which would serialise thousands of blocks), summed by sum_partials.
extern "C" __global__ void sum_squares_multi(double* partials, const float* const* tensors,
                                             const int* chunk_tensor, const long long* chunk_start,
                                             const long long* sizes) {
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    double acc = 0.0;
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) acc += (double)tensors[t][j] * tensors[t][j];
    const double s = block_sum_double(acc);
    if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

// out[0] = sum of partials[0..n), in one block, in a fixed order (the result is the same every run).
extern "C" __global__ void sum_partials(double* out, const double* partials, int n) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
    const double s = block_sum_double(acc);
    if (threadIdx.x == 0) out[0] = s;
}

// Clipping factor on the device: min(1, max_norm / (norm + 1e-6)), from the sum of squares.
extern "C" __global__ void clip_factor(float* factor, float* norm_out, const double* sum_squares,
                                       float max_norm) {
    const float norm = (float)sqrt(sum_squares[0]);
    norm_out[0] = norm;
    factor[0] = max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
}
