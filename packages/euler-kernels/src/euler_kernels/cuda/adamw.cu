// Multi-tensor kernels: one launch covers every parameter tensor. Tensors are passed as arrays of
// device pointers; the work is cut into chunks that never straddle two tensors, one block per chunk:
// chunk_tensor[c] names the tensor and chunk_start[c] the first element of chunk c.

#define CHUNK 8192

__device__ __forceinline__ void chunk_range(const int* chunk_tensor, const long long* chunk_start,
                                            const long long* sizes, int* t, long long* begin, long long* end) {
    *t = chunk_tensor[blockIdx.x];
    *begin = chunk_start[blockIdx.x];
    *end = min(*begin + CHUNK, sizes[*t]);
}

// AdamW with decoupled weight decay and bias correction; grad_scale (device scalar) is the clipping factor.
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
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) {
        const float gj = g[j] * gs;
        const float mj = beta1 * m[j] + (1.0f - beta1) * gj;
        const float vj = beta2 * v[j] + (1.0f - beta2) * gj * gj;
        m[j] = mj;
        v[j] = vj;
        const float update = (mj / bias_correction1) / (sqrtf(vj / bias_correction2) + eps);
        p[j] = p[j] - lr * (update + decay * p[j]);
    }
}

// Sum of squares of every element of every tensor, accumulated in double into out[0].
extern "C" __global__ void sum_squares_multi(double* out, const float* const* tensors, const int* chunk_tensor,
                                             const long long* chunk_start, const long long* sizes) {
    __shared__ double scratch[32];
    int t;
    long long begin, end;
    chunk_range(chunk_tensor, chunk_start, sizes, &t, &begin, &end);
    double acc = 0.0;
    for (long long j = begin + threadIdx.x; j < end; j += blockDim.x) acc += (double)tensors[t][j] * tensors[t][j];
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
