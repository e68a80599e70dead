// Cross-entropy fused with log-softmax, one block per row of V logits.
// Forward saves only the log-sum-exp per row; backward recomputes softmax from it and writes the
// gradient straight into dlogits, so no second full-size probability buffer exists.
#include "common.cuh"

// weight (N,): the row's loss weight (mask * (target != ignore)); nll (N,) = weight * (lse - logit[target])
extern "C" __global__ void cross_entropy_forward(float* nll, float* lse, const float* logits,
                                                 const long long* targets, const float* weight, int V) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const float* l = logits + row * V;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, l[i]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += __expf(l[i] - m);
    const float row_lse = m + logf(block_sum(s, scratch));
    if (threadIdx.x == 0) {
        lse[row] = row_lse;
        nll[row] = weight[row] > 0.0f ? weight[row] * (row_lse - l[targets[row]]) : 0.0f;
    }
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
