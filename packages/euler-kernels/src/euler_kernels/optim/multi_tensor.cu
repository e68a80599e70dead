// Multi-tensor kernels: one launch covers every parameter tensor (chunking: see chunk_range in common.cuh).
#include "common.cuh"

// One AdamW element update: decoupled weight decay, bias correction; g already scaled by the clip factor.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g, float decay, float lr,
                                              float beta1, float beta2, float eps, float bc1, float bc2) {
    m = beta1 * m + (1.0f - beta1) * g;
    v = beta2 * v + (1.0f - beta2) * g * g;
    const float update = (m / bc1) / (sqrtf(v / bc2) + eps);
    p = p - lr * (update + decay * p);
}

// AdamW's constants of one launch: clip factor, lr, betas, eps, bias corrections.
struct AdamWScalars {
    float gs, lr, beta1, beta2, eps, bc1, bc2;
};

// AdamW over elements [begin, end) of one tensor (begin a multiple of 4): four elements a thread (one
// 16-byte load and store per array, 8 bytes for bf16) where p, m, v and g are aligned to that, then the
// tail one at a time; copy (nullptr: none) gets the updated weights rounded to bf16 in the same pass (the
// next step's copy).
__device__ __forceinline__ void adamw_chunk(float* p, float* m, float* v, GradRef g, unsigned short* copy,
                                            long long begin, long long end, float decay, const AdamWScalars& s) {
    const size_t bits = reinterpret_cast<size_t>(p) | reinterpret_cast<size_t>(m) | reinterpret_cast<size_t>(v);
    const size_t g_align = g.bf16 ? 7 : 15;
    const bool vec = (bits & 15) == 0 && (reinterpret_cast<size_t>(g.p) & g_align) == 0 &&
                     (reinterpret_cast<size_t>(copy) & 7) == 0;
    const long long vec_end = vec ? begin + ((end - begin) & ~3LL) : begin;
    for (long long j = begin + 4 * threadIdx.x; j < vec_end; j += 4 * blockDim.x) {
        const size_t j4 = j / 4;
        float4 pj = load4(p, j4), mj = load4(m, j4), vj = load4(v, j4);
        const float4 gj = grad4(g, j4);
        adamw_element(pj.x, mj.x, vj.x, gj.x * s.gs, decay, s.lr, s.beta1, s.beta2, s.eps, s.bc1, s.bc2);
        adamw_element(pj.y, mj.y, vj.y, gj.y * s.gs, decay, s.lr, s.beta1, s.beta2, s.eps, s.bc1, s.bc2);
        adamw_element(pj.z, mj.z, vj.z, gj.z * s.gs, decay, s.lr, s.beta1, s.beta2, s.eps, s.bc1, s.bc2);
        adamw_element(pj.w, mj.w, vj.w, gj.w * s.gs, decay, s.lr, s.beta1, s.beta2, s.eps, s.bc1, s.bc2);
        store4(p, j4, pj);
        store4(m, j4, mj);
        store4(v, j4, vj);
        if (copy != nullptr) store4(copy, j4, pj);
    }
    for (long long j = vec_end + threadIdx.x; j < end; j += blockDim.x) {
        adamw_element(p[j], m[j], v[j], grad_at(g, j) * s.gs, decay, s.lr, s.beta1, s.beta2, s.eps, s.bc1, s.bc2);
        if (copy != nullptr) copy[j] = float_to_bf16(p[j]);
    }
}

// AdamW over every tensor; grad_scale (device scalar) is the clipping factor, the rest come from the host.
extern "C" __global__ void adamw_multi(float* const* params, float* const* ms, float* const* vs,
                                       const void* const* grads, const int* grad_bf16, const float* weight_decay,
                                       const int* chunk_tensor, const long long* chunk_start,
                                       const long long* sizes, const float* grad_scale, float lr, float beta1,
                                       float beta2, float eps, float bias_correction1, float bias_correction2) {
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const AdamWScalars s{grad_scale[0], lr, beta1, beta2, eps, bias_correction1, bias_correction2};
    adamw_chunk(params[t], ms[t], vs[t], grad_ref(grads, grad_bf16, t), nullptr, begin, end, weight_decay[t], s);
}

// The same update with everything that changes per step read from the device (a CUDA graph replays it):
// control = [grad_scale, apply, lr, bias_correction1, bias_correction2, norm], written by step_control;
// copies[t] (nullptr: none) is tensor t's bf16 copy, rewritten from the updated weights.
extern "C" __global__ void adamw_multi_ctl(float* const* params, float* const* ms, float* const* vs,
                                           const void* const* grads, const int* grad_bf16,
                                           const float* weight_decay,
                                           const int* chunk_tensor, const long long* chunk_start,
                                           const long long* sizes, unsigned short* const* copies,
                                           const float* control, float beta1, float beta2, float eps) {
    if (control[1] == 0.0f) return;  // a non-finite loss or gradient: leave weights, moments and copies alone
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const AdamWScalars s{control[0], control[2], beta1, beta2, eps, control[3], control[4]};
    adamw_chunk(params[t], ms[t], vs[t], grad_ref(grads, grad_bf16, t), copies[t], begin, end, weight_decay[t], s);
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

// Sum of squares of every element of every tensor (float32, or bf16 where bf16[t] is set): one double per
// chunk in partials[chunk] (no atomics on one address, which would serialise thousands of blocks), summed
// by sum_partials.
extern "C" __global__ void sum_squares_multi(double* partials, const void* const* tensors, const int* bf16,
                                             const int* chunk_tensor, const long long* chunk_start,
                                             const long long* sizes) {
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    const GradRef g = grad_ref(tensors, bf16, t);
    double acc = 0.0;
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {
        const double x = grad_at(g, j);
        acc += x * x;
    }
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
