// A speculative step's drafts from the drafting heads' logits (decode_draft.py): block (head m, row b)
// finds the R best tokens of z[b, m] (R = one more than the largest rank asked of head m, at most
// MAX_RANK) and writes each draft that head m makes: drafts[b, i] = its ranks[i]-th best. The best are
// ordered by logit, a tie by the smaller token id; NaN logits are never chosen. Launch: blockDim THREADS.
#include "common.cuh"

#define THREADS 256
#define MAX_RANK 4
#define NONE 0x7fffffff  // no token yet

// Whether (a, ia) comes before (b, ib): a larger logit, or the same logit and a smaller id.
__device__ __forceinline__ bool before(float a, int ia, float b, int ib) { return a > b || (a == b && ia < ib); }

// z (B, M, V); drafts (B, n); draft i is head (heads >> 4i & 15)'s guess of rank (ranks >> 4i & 15).
extern "C" __global__ void __launch_bounds__(THREADS) decode_draft(long long* drafts, const float* z, int M, int V,
                                                                   int n, unsigned long long heads,
                                                                   unsigned long long ranks) {
    const int m = blockIdx.x, b = blockIdx.y;  // m: head m + 1
    int want = 0;  // the ranks head m + 1 is asked for
    for (int i = 0; i < n; i++)
        if ((int)((heads >> (4 * i)) & 15) == m + 1) want = max(want, (int)((ranks >> (4 * i)) & 15) + 1);
    if (want == 0) return;
    // this thread's best `want` of its strided share, sorted
    float val[MAX_RANK];
    int idx[MAX_RANK];
#pragma unroll
    for (int r = 0; r < MAX_RANK; r++) val[r] = -INFINITY, idx[r] = NONE;
    const float* row = z + ((size_t)b * M + m) * V;
    for (int i = threadIdx.x; i < V; i += THREADS) {
        float x = row[i];
        int xi = i;
        if (!(x == x) || !before(x, xi, val[want - 1], idx[want - 1])) continue;  // NaN, or not among them
#pragma unroll
        for (int r = 0; r < MAX_RANK; r++) {  // insert: swap down the sorted list
            if (r < want && before(x, xi, val[r], idx[r])) {
                const float tv = val[r];
                const int ti = idx[r];
                val[r] = x, idx[r] = xi, x = tv, xi = ti;
            }
        }
    }
    __shared__ float warp_val[THREADS / 32];
    __shared__ int warp_idx[THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = 0; r < want; r++) {  // round r: the block's best of every thread's best left, taken
        float v = val[0];
        int vi = idx[0];
        for (int offset = 16; offset > 0; offset >>= 1) {
            const float ov = __shfl_xor_sync(FULL_MASK, v, offset);
            const int oi = __shfl_xor_sync(FULL_MASK, vi, offset);
            if (before(ov, oi, v, vi)) v = ov, vi = oi;
        }
        if (lane == 0) warp_val[warp] = v, warp_idx[warp] = vi;
        __syncthreads();
        v = warp_val[0], vi = warp_idx[0];
        for (int w = 1; w < THREADS / 32; w++)
            if (before(warp_val[w], warp_idx[w], v, vi)) v = warp_val[w], vi = warp_idx[w];
        __syncthreads();  // every thread has read the winners before the next round writes them
        if (idx[0] == vi && vi != NONE) {  // the winner's thread moves on to its next best
#pragma unroll
            for (int k = 0; k < MAX_RANK - 1; k++) val[k] = val[k + 1], idx[k] = idx[k + 1];
            val[MAX_RANK - 1] = -INFINITY, idx[MAX_RANK - 1] = NONE;
        }
        if (threadIdx.x == 0)
            for (int i = 0; i < n; i++)
                if ((int)((heads >> (4 * i)) & 15) == m + 1 && (int)((ranks >> (4 * i)) & 15) == r)
                    drafts[(size_t)b * n + i] = vi == NONE ? 0 : vi;
    }
}
