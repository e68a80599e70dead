// Decode attention, flash-decoding style: a few new tokens per sequence against a static KV cache.
//
// qkv (B, T, (Hq + 2 Hkv) D) is the fused q/k/v projection of each sequence's T new tokens, RoPE not applied;
// the caches k, v (B, Hkv, S, D) hold S slots per sequence and head; pos (B,) is each sequence's position.
// New token t sits at position pos[b] + depth(t) and its key and value go to slot pos[b] + t: in a chain
// (tree == 0) depth(t) = t and token t sees the slots up to pos[b] + t; in a draft tree (draft_tree.py)
// `tree` packs each token's ancestor mask in its byte t (bit u: it sees new slot pos[b] + u), depth(t) is
// the mask's bits less one, and every token sees the slots before pos[b]. The split kernel rotates q and
// the new keys, writes the new keys and values into their slots, and attends: block (split, kv head, b)
// takes the SLOTS cache slots from split * SLOTS on (a block whose first slot is past pos[b] + T - 1
// returns at once, so one launch serves every length) and writes its partial softmax: the maximum score m,
// the sum of exp(score - m) l, and sum exp(score - m) v, for each of the G = Hq / Hkv query heads that
// share the kv head (GQA: K and V are read once for all of them) and each new token. The reduce kernel
// merges a head's partials into the output (B, T, Hq, D). The new slots are read from the new keys and
// values, never from the cache, so no block reads what another writes. float32 throughout; HEAD_DIM,
// SLOTS and THREADS are compile-time (-D). (common.cuh's CHUNK is the multi-tensor kernels' own.)
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef SLOTS
#define SLOTS 32
#endif
#ifndef THREADS
#define THREADS 128
#endif

constexpr int D = HEAD_DIM;
constexpr int HALF = D / 2;
constexpr int VEC = D % 4 == 0 ? 4 : 2;     // floats per cache load and per shared-memory read (D is even)
constexpr int KPAD = VEC == 4 ? D + 4 : D + 1;  // key rows padded: lanes reading 32 keys' same piece
constexpr int PER_THREAD = (SLOTS * D / VEC + THREADS - 1) / THREADS;  // cache pieces a thread loads

// VEC consecutive floats from a 4 VEC-byte aligned address.
__device__ __forceinline__ void load_vec(const float* p, float* f) {
    if constexpr (VEC == 4) {
        const float4 v = *reinterpret_cast<const float4*>(p);
        f[0] = v.x, f[1] = v.y, f[2] = v.z, f[3] = v.w;
    } else {
        const float2 v = *reinterpret_cast<const float2*>(p);
        f[0] = v.x, f[1] = v.y;
    }
}

// Element d of head vector x rotated by the angles whose cos and sin rows are c and s (rotate-half).
__device__ __forceinline__ float rotated(const float* x, int d, const float* c, const float* s) {
    return d < HALF ? rotate_pair(x[d], x[d + HALF], c[d], s[d]).x
                    : rotate_pair(x[d - HALF], x[d], c[d - HALF], s[d - HALF]).y;
}

// New token t's distance from pos[b], and whether it sees new slot pos[b] + u (u < T).
__device__ __forceinline__ int depth_of(unsigned long long tree, int t) {
    return tree ? __popc((unsigned)(tree >> (8 * t)) & 0xffu) - 1 : t;
}
__device__ __forceinline__ bool sees(unsigned long long tree, int t, int u) {
    return tree ? (tree >> (8 * t + u)) & 1ull : u <= t;
}

// Block (split, kv head, b): the T new tokens of row b against slots start .. start + n - 1 of the cache;
// query row r = g * T + t is query head kvh * G + g of new token t.
extern "C" __global__ void __launch_bounds__(THREADS)
    decode_attention_split(float* part_acc, float* part_ml, float* k_cache, float* v_cache, const float* qkv,
                           const float* cos_table, const float* sin_table, const long long* pos, int hq,
                           int hkv, int S, int T, float scale, unsigned long long tree) {
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
    const int G = hq / hkv, R = G * T, start = split * SLOTS;
    const long long p = pos[b], last = p + T - 1;
    if (start > last) return;  // the reduce reads only splits 0..(p + T - 1) / SLOTS
    const int n = (int)min((long long)SLOTS, last - start + 1);  // slots start .. start + n - 1

    extern __shared__ __align__(16) float smem[];
    float* ks = smem;               // (SLOTS, KPAD)
    float* vs = ks + SLOTS * KPAD;  // (SLOTS, D)
    float* qs = vs + SLOTS * D;     // (R, D) rotated, times scale
    float* ps = qs + R * D;         // (R, SLOTS) scores, then exp(score - m)

    const int width = (hq + 2 * hkv) * D;  // one new token's q heads, then k heads, then v heads
    const float* rows = qkv + (size_t)b * T * width;
    const size_t base = ((size_t)(b * hkv + kvh) * S + start) * D;  // slot `start` of this head's cache
    const int cached = (int)max(0LL, min((long long)n, p - start));  // slots 0..cached - 1 are old
    // the old slots, VEC floats a piece, every load of a thread issued before anything else
    float kr[PER_THREAD][VEC], vr[PER_THREAD][VEC];
#pragma unroll
    for (int u = 0; u < PER_THREAD; u++) {
        const int e = (threadIdx.x + u * THREADS) * VEC;  // element e of the (n, D) slots
        if (e < cached * D) {
            load_vec(k_cache + base + e, kr[u]);
            load_vec(v_cache + base + e, vr[u]);
        }
    }
    for (int i = threadIdx.x; i < R * D; i += THREADS) {
        const int r = i / D, g = r / T, t = r % T;
        const long long at = p + depth_of(tree, t);
        const float* c = cos_table + (size_t)at * HALF;
        const float* s = sin_table + (size_t)at * HALF;
        qs[i] = rotated(rows + (size_t)t * width + (size_t)(kvh * G + g) * D, i % D, c, s) * scale;
    }
#pragma unroll
    for (int u = 0; u < PER_THREAD; u++) {
        const int e = (threadIdx.x + u * THREADS) * VEC, j = e / D, d = e % D;
        if (e < cached * D) {
#pragma unroll
            for (int i = 0; i < VEC; i++) ks[j * KPAD + d + i] = kr[u][i], vs[e + i] = vr[u][i];
        }
    }
    // the new tokens' slots in this block (slot p + t holds new token t): the rotated key and the value,
    // in shared memory and in the cache
    for (int i = cached * D + threadIdx.x; i < n * D; i += THREADS) {
        const int j = i / D, d = i % D, t = (int)(start + j - p);
        const float* x = rows + (size_t)t * width;
        const long long at = p + depth_of(tree, t);
        const float kv = rotated(x + (size_t)(hq + kvh) * D, d, cos_table + at * HALF, sin_table + at * HALF);
        const float vv = x[(size_t)(hq + hkv + kvh) * D + d];
        k_cache[base + i] = kv;
        v_cache[base + i] = vv;
        ks[j * KPAD + d] = kv;
        vs[i] = vv;
    }
    __syncthreads();

    for (int i = threadIdx.x; i < R * SLOTS; i += THREADS) {  // score of query row r against slot j
        const int r = i / SLOTS, j = i % SLOTS, t = r % T;
        const long long slot = start + j;
        const bool seen = j < n && (slot < p || sees(tree, t, (int)(slot - p)));
        float dot = 0.0f;
        if (seen) {
            if constexpr (VEC == 4) {
#pragma unroll
                for (int d = 0; d < D; d += 4) {
                    const float4 q = *reinterpret_cast<const float4*>(qs + r * D + d);
                    const float4 k = *reinterpret_cast<const float4*>(ks + j * KPAD + d);
                    dot = fmaf(q.x, k.x, fmaf(q.y, k.y, fmaf(q.z, k.z, fmaf(q.w, k.w, dot))));
                }
            } else {
#pragma unroll 16
                for (int d = 0; d < D; d++) dot = fmaf(qs[r * D + d], ks[j * KPAD + d], dot);
            }
        }
        ps[i] = seen ? dot : -INFINITY;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31;
    for (int r = threadIdx.x >> 5; r < R; r += THREADS / 32) {  // one warp per query row: m, l, the exps
        float m = -INFINITY;
        for (int j = lane; j < SLOTS; j += 32) m = fmaxf(m, ps[r * SLOTS + j]);
        for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, offset));
        float l = 0.0f;
        for (int j = lane; j < SLOTS; j += 32) {
            const float e = m == -INFINITY ? 0.0f : expf(ps[r * SLOTS + j] - m);  // a row seeing no slot here
            ps[r * SLOTS + j] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            const int g = r / T, t = r % T;
            const size_t at = (((size_t)(b * hq + kvh * G + g) * T + t) * splits + split) * 2;
            part_ml[at] = m;
            part_ml[at + 1] = l;
        }
    }
    __syncthreads();

    for (int i = threadIdx.x; i < R * (D / VEC); i += THREADS) {  // sum_j exp(score_j - m) v_j: VEC d's
        const int r = i / (D / VEC), d = (i % (D / VEC)) * VEC, g = r / T, t = r % T;
        float acc[VEC] = {};
#pragma unroll 8
        for (int j = 0; j < n; j++) {
            float v[VEC];
            load_vec(vs + j * D + d, v);
            const float e = ps[r * SLOTS + j];
#pragma unroll
            for (int k = 0; k < VEC; k++) acc[k] = fmaf(e, v[k], acc[k]);
        }
        float* dst = part_acc + (((size_t)(b * hq + kvh * G + g) * T + t) * splits + split) * D + d;
#pragma unroll
        for (int k = 0; k < VEC; k++) dst[k] = acc[k];
    }
}

// One block of D threads per (b, query head, new token t): merge the partials of splits
// 0..(p + T - 1) / SLOTS (one that token t sees nothing of holds m = -inf, l = 0), into float32, or bf16
// for the bf16 product after it.
template <typename Out>
__device__ __forceinline__ void reduce_body(Out* out, const float* part_acc, const float* part_ml,
                                            const long long* pos, int hq, int T, int splits) {
    const int bht = blockIdx.x, d = threadIdx.x;  // bht = (b * hq + h) * T + t
    const int used = (int)((pos[bht / (hq * T)] + T - 1) / SLOTS) + 1;
    const float* ml = part_ml + (size_t)bht * splits * 2;
    float m = -INFINITY;
#pragma unroll 4
    for (int i = 0; i < used; i++) m = fmaxf(m, ml[2 * i]);
    float num = 0.0f, den = 0.0f;
#pragma unroll 4
    for (int i = 0; i < used; i++) {
        const float w = expf(ml[2 * i] - m);
        num += w * part_acc[((size_t)bht * splits + i) * D + d];
        den += w * ml[2 * i + 1];
    }
    // out is (B, T, Hq, D): token t's heads side by side, the next product's row
    const int t = bht % T, h = (bht / T) % hq, b = bht / (hq * T);
    store_act(out, (((size_t)b * T + t) * hq + h) * D + d, num / den);
}

extern "C" __global__ void decode_attention_reduce(float* out, const float* part_acc, const float* part_ml,
                                                   const long long* pos, int hq, int T, int splits) {
    reduce_body(out, part_acc, part_ml, pos, hq, T, splits);
}

extern "C" __global__ void decode_attention_reduce_bf16(unsigned short* out, const float* part_acc,
                                                        const float* part_ml, const long long* pos, int hq, int T,
                                                        int splits) {
    reduce_body(out, part_acc, part_ml, pos, hq, T, splits);
}
