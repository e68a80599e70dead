// Cross-entropy fused with log-softmax, one block per row of V logits.
// Forward saves only the log-sum-exp per row; backward recomputes softmax from it and writes the
// gradient straight into dlogits, so no second full-size probability buffer exists.
#include "common.cuh"

// Merge two running (max, sum of exp(x - max)) pairs into the first.
__device__ __forceinline__ void merge_max_sum(float& m, float& s, float m2, float s2) {
    const float m_new = fmaxf(m, m2);
    s = (m == -INFINITY ? 0.0f : s * __expf(m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * __expf(m2 - m_new));
    m = m_new;
}

// Merge every thread's (max, sum) of the block's row (shuffles within a warp, shared memory across warps),
// then thread 0 writes lse[row] and the weighted nll of the target.
template <typename In>
__device__ __forceinline__ void finish_row(float* nll, float* lse, const In* l, const long long* targets,
                                           const float* weight, size_t row, float m, float s) {
    __shared__ float warp_m[32], warp_s[32];
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(FULL_MASK, m, offset), s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        merge_max_sum(m, s, m2, s2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) merge_max_sum(m, s, warp_m[w], warp_s[w]);
        const float row_lse = m + logf(s);
        lse[row] = row_lse;
        nll[row] = weight[row] > 0.0f ? weight[row] * (row_lse - load_act(l, targets[row])) : 0.0f;
    }
}

// weight (N,): the row's loss weight (mask * (target != ignore)); nll (N,) = weight * (lse - logit[target]).
// One pass over the logits: each thread keeps a running max and sum (online softmax), then the pairs are
// merged across the warp with shuffles and across warps through shared memory.
extern "C" __global__ void cross_entropy_forward(float* nll, float* lse, const float* logits,
                                                 const long long* targets, const float* weight, int V) {
    const size_t row = blockIdx.x;
    const float* l = logits + row * V;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = l[i];
        if (v > m) {
            s = s * __expf(m - v) + 1.0f;
            m = v;
        } else {
            s += __expf(v - m);
        }
    }
    finish_row(nll, lse, l, targets, weight, row, m, s);
}

// dlogits = scale * weight * (softmax - onehot(target)); scale = dloss / sum(weight), read on device.
extern "C" __global__ void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                                  const long long* targets, const float* weight,
                                                  const float* scale, int V) {
    const size_t row = blockIdx.x;
    const float w = weight[row] * scale[0];
    const long long target = targets[row];
    const float row_lse = lse[row];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float p = w == 0.0f ? 0.0f : __expf(logits[row * V + i] - row_lse);
        dlogits[row * V + i] = w * (p - (i == target ? 1.0f : 0.0f));
    }
}

// Vectorised variants for V % 4 == 0: float4 loads and stores (four bf16 in 8 bytes for bf16 logits), four
// logits per step of the online pass.
template <typename In>
__device__ __forceinline__ void cross_entropy_forward_vec_body(float* nll, float* lse, const In* logits,
                                                               const long long* targets, const float* weight, int V) {
    const size_t row = blockIdx.x;
    const In* l = logits + row * V;
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
        const float4 v = load4(l, i);
        const float m_new = fmaxf(fmaxf(m, fmaxf(v.x, v.y)), fmaxf(v.z, v.w));
        s = (m == -INFINITY ? 0.0f : s * __expf(m - m_new)) + __expf(v.x - m_new) + __expf(v.y - m_new) +
            __expf(v.z - m_new) + __expf(v.w - m_new);
        m = m_new;
    }
    finish_row(nll, lse, l, targets, weight, row, m, s);
}

extern "C" __global__ void cross_entropy_forward_vec(float* nll, float* lse, const float* logits,
                                                     const long long* targets, const float* weight, int V) {
    cross_entropy_forward_vec_body(nll, lse, logits, targets, weight, V);
}

// bf16 logits (a bf16 head product, as autocast's): the same pass, each logit widened to float32.
extern "C" __global__ void cross_entropy_forward_vec_in16(float* nll, float* lse, const unsigned short* logits,
                                                          const long long* targets, const float* weight, int V) {
    cross_entropy_forward_vec_body(nll, lse, logits, targets, weight, V);
}

// dlogits is float32, or bf16 (unsigned short) when it only feeds the head's bf16 matrix products. Each
// element is read by the thread that writes it, so dlogits may be the logits themselves (same type).
template <typename In, typename Out>
__device__ __forceinline__ void cross_entropy_backward_vec_body(Out* dlogits, const In* logits, const float* lse,
                                                                const long long* targets, const float* weight,
                                                                const float* scale, int V) {
    const size_t row = blockIdx.x;
    const float w = weight[row] * scale[0];
    const long long target = targets[row];
    const float row_lse = lse[row];
    const In* l = logits + row * V;
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
        float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (w != 0.0f) {
            const float4 v = load4(l, i);
            p = make_float4(__expf(v.x - row_lse), __expf(v.y - row_lse), __expf(v.z - row_lse), __expf(v.w - row_lse));
        }
        const long long c = 4 * (long long)i;
        store4(dlogits, row * (V / 4) + i,
               make_float4(w * (p.x - (c == target ? 1.0f : 0.0f)), w * (p.y - (c + 1 == target ? 1.0f : 0.0f)),
                           w * (p.z - (c + 2 == target ? 1.0f : 0.0f)), w * (p.w - (c + 3 == target ? 1.0f : 0.0f))));
    }
}

extern "C" __global__ void cross_entropy_backward_vec(float* dlogits, const float* logits, const float* lse,
                                                      const long long* targets, const float* weight,
                                                      const float* scale, int V) {
    cross_entropy_backward_vec_body(dlogits, logits, lse, targets, weight, scale, V);
}

extern "C" __global__ void cross_entropy_backward_vec_bf16(unsigned short* dlogits, const float* logits,
                                                           const float* lse, const long long* targets,
                                                           const float* weight, const float* scale, int V) {
    cross_entropy_backward_vec_body(dlogits, logits, lse, targets, weight, scale, V);
}

// bf16 logits in, bf16 dlogits out (may be the logits' own buffer: the backward then holds no second array).
extern "C" __global__ void cross_entropy_backward_vec_in16(unsigned short* dlogits, const unsigned short* logits,
                                                           const float* lse, const long long* targets,
                                                           const float* weight, const float* scale, int V) {
    cross_entropy_backward_vec_body(dlogits, logits, lse, targets, weight, scale, V);
}
