// Multi-tensor kernels: one launch covers every parameter tensor. Tensors are passed as arrays of
// device pointers plus prefix offsets (n_tensors + 1) of their element counts.

__device__ __forceinline__ int tensor_of(const long long* offsets, int n_tensors, long long i) {
    int lo = 0, hi = n_tensors - 1;  // binary search: offsets[t] <= i < offsets[t + 1]
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// AdamW with decoupled weight decay and bias correction; grad_scale (device scalar) is the clipping factor.
extern "C" __global__ void adamw_multi(float* const* params, float* const* ms, float* const* vs,
                                       const float* const* grads, const float* weight_decay,
                                       const long long* offsets, int n_tensors, const float* grad_scale,
                                       float lr, float beta1, float beta2, float eps,
                                       float bias_correction1, float bias_correction2) {
    const long long total = offsets[n_tensors];
    const float gs = grad_scale[0];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int t = tensor_of(offsets, n_tensors, i);
        const long long j = i - offsets[t];
        const float g = grads[t][j] * gs;
        const float m = beta1 * ms[t][j] + (1.0f - beta1) * g;
        const float v = beta2 * vs[t][j] + (1.0f - beta2) * g * g;
        ms[t][j] = m;
        vs[t][j] = v;
        const float p = params[t][j];
        const float update = (m / bias_correction1) / (sqrtf(v / bias_correction2) + eps);
        params[t][j] = p - lr * (update + weight_decay[t] * p);
    }
}

// Sum of squares of every element of every tensor, accumulated in double into out[0].
extern "C" __global__ void sum_squares_multi(double* out, const float* const* tensors,
                                             const long long* offsets, int n_tensors) {
    __shared__ double scratch[32];
    const long long total = offsets[n_tensors];
    double acc = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int t = tensor_of(offsets, n_tensors, i);
        const float g = tensors[t][i - offsets[t]];
        acc += (double)g * g;
    }
    for (int offset = 16; offset > 0; offset >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += scratch[w];
        atomicAdd(out, s);
    }
}

// Clipping factor on the device: min(1, max_norm / (norm + 1e-6)), from the sum of squares.
extern "C" __global__ void clip_factor(float* factor, float* norm_out, const double* sum_squares,
                                       float max_norm) {
    const float norm = (float)sqrt(sum_squares[0]);
    norm_out[0] = norm;
    factor[0] = max_norm > 0.0f && norm > max_norm ? max_norm / (norm + 1e-6f) : 1.0f;
}
