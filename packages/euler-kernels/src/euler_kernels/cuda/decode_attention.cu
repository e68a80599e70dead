// Decode attention, flash-decoding style: one new token per sequence against a static KV cache.
//
// qkv (B, (Hq + 2 Hkv) D) is the fused q/k/v projection of each sequence's newest token, RoPE not applied;
// the caches k, v (B, Hkv, S, D) hold S slots per sequence and head; pos (B,) is each sequence's position.
// The split kernel rotates q and the new key by the angles of pos[b], writes the new key and value into
// slot pos[b], and attends over slots 0..pos[b]: block (split, kv head, b) takes the SLOTS cache slots
// from split * SLOTS on (a block whose first slot is past pos[b] returns at once, so one launch serves every
// length) and writes its partial softmax: the maximum score m, the sum of exp(score - m) l, and
// sum exp(score - m) v, for each of the G = Hq / Hkv query heads that share the kv head (GQA: K and V
// are read once for all of them). The reduce kernel merges a head's partials into the output (B, Hq, D).
// Slot pos[b] is read from the new key and value, never from the cache, so no block reads what another
// writes. float32 throughout; HEAD_DIM and SLOTS are compile-time (-D). (common.cuh's CHUNK is the
// multi-tensor kernels' own.)
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef SLOTS
#define SLOTS 32
#endif

constexpr int D = HEAD_DIM;
constexpr int HALF = D / 2;
constexpr int KPAD = D + 1;  // key rows padded: the threads of a warp read 32 keys' same element

// Element d of head vector x rotated by the angles whose cos and sin rows are c and s (rotate-half).
__device__ __forceinline__ float rotated(const float* x, int d, const float* c, const float* s) {
    return d < HALF ? x[d] * c[d] - x[d + HALF] * s[d] : x[d] * c[d - HALF] + x[d - HALF] * s[d - HALF];
}

extern "C" __global__ void decode_attention_split(float* part_acc, float* part_ml, float* k_cache, float* v_cache,
                                                  const float* qkv, const float* cos_table,
                                                  const float* sin_table, const long long* pos, int hq, int hkv,
                                                  int S, float scale) {
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
    const int G = hq / hkv, start = split * SLOTS;
    const long long p = pos[b];
    if (start > p) return;  // the reduce reads only splits 0..p / SLOTS
    const int n = (int)min((long long)SLOTS, p - start + 1);  // slots start .. start + n - 1

    extern __shared__ float smem[];
    float* ks = smem;               // (SLOTS, KPAD)
    float* vs = ks + SLOTS * KPAD;  // (SLOTS, D)
    float* qs = vs + SLOTS * D;     // (G, D) rotated, times scale
    float* ps = qs + G * D;         // (G, SLOTS) scores, then exp(score - m)

    const float* row = qkv + (size_t)b * (hq + 2 * hkv) * D;  // q heads, then k heads, then v heads
    const float* c = cos_table + (size_t)p * HALF;
    const float* s = sin_table + (size_t)p * HALF;
    for (int i = threadIdx.x; i < G * D; i += blockDim.x)
        qs[i] = rotated(row + (size_t)(kvh * G + i / D) * D, i % D, c, s) * scale;
    const size_t base = ((size_t)(b * hkv + kvh) * S + start) * D;  // slot `start` of this head's cache
    const float* k_new = row + (size_t)(hq + kvh) * D;
    const float* v_new = row + (size_t)(hq + hkv + kvh) * D;
    for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
        const int j = i / D, d = i % D;
        float kv, vv;
        if (start + j == p) {  // the new token: rotate its key, and write both into its slot
            kv = rotated(k_new, d, c, s);
            vv = v_new[d];
            k_cache[base + i] = kv;
            v_cache[base + i] = vv;
        } else {
            kv = k_cache[base + i];
            vv = v_cache[base + i];
        }
        ks[j * KPAD + d] = kv;
        vs[i] = vv;
    }
    __syncthreads();

    for (int i = threadIdx.x; i < G * n; i += blockDim.x) {  // score of query head g against slot j
        const int g = i / n, j = i % n;
        float dot = 0.0f;
#pragma unroll 16
        for (int d = 0; d < D; d++) dot += qs[g * D + d] * ks[j * KPAD + d];
        ps[g * SLOTS + j] = dot;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int g = threadIdx.x >> 5; g < G; g += warps) {  // one warp per query head: m, l, and the exps
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, ps[g * SLOTS + j]);
        for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, offset));
        float l = 0.0f;
        for (int j = lane; j < n; j += 32) {
            const float e = expf(ps[g * SLOTS + j] - m);
            ps[g * SLOTS + j] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            const size_t at = ((size_t)(b * hq + kvh * G + g) * splits + split) * 2;
            part_ml[at] = m;
            part_ml[at + 1] = l;
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {  // sum_j exp(score_j - m) v_j, per head and d
        const int g = i / D, d = i % D;
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += ps[g * SLOTS + j] * vs[j * D + d];
        part_acc[((size_t)(b * hq + kvh * G + g) * splits + split) * D + d] = acc;
    }
}

// One block of D threads per (b, query head): merge the partials of splits 0..pos[b] / SLOTS.
extern "C" __global__ void decode_attention_reduce(float* out, const float* part_acc, const float* part_ml,
                                                   const long long* pos, int hq, int splits) {
    const int bh = blockIdx.x, d = threadIdx.x;
    const int used = (int)(pos[bh / hq] / SLOTS) + 1;
    const float* ml = part_ml + (size_t)bh * splits * 2;
    float m = -INFINITY;
    for (int i = 0; i < used; i++) m = fmaxf(m, ml[2 * i]);
    float num = 0.0f, den = 0.0f;
    for (int i = 0; i < used; i++) {
        const float w = expf(ml[2 * i] - m);
        num += w * part_acc[((size_t)bh * splits + i) * D + d];
        den += w * ml[2 * i + 1];
    }
    out[(size_t)bh * D + d] = num / den;
}
