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
constexpr int SPLIT_THREADS = 128;  // a split block's threads (the launcher's _THREADS)
constexpr int VEC = D % 4 == 0 ? 4 : 2;  // floats per cache load (D is even)
constexpr int PER_THREAD = (SLOTS * D / VEC + SPLIT_THREADS - 1) / SPLIT_THREADS;  // cache loads a thread

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
    return d < HALF ? x[d] * c[d] - x[d + HALF] * s[d] : x[d] * c[d - HALF] + x[d - HALF] * s[d - HALF];
}

// Block (split, kv head, b): the T new tokens of row b at positions p .. p + T - 1 against slots
// start .. start + n - 1 of the cache; query row r = g * T + t is query head kvh * G + g of new token t,
// which sees the slots up to p + t.
extern "C" __global__ void decode_attention_split(float* part_acc, float* part_ml, float* k_cache, float* v_cache,
                                                  const float* qkv, const float* cos_table,
                                                  const float* sin_table, const long long* pos, int hq, int hkv,
                                                  int S, int T, float scale) {
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, splits = gridDim.x;
    const int G = hq / hkv, R = G * T, start = split * SLOTS;
    const long long p = pos[b], last = p + T - 1;
    if (start > last) return;  // the reduce reads only splits 0..(p + t) / SLOTS of token t
    const int n = (int)min((long long)SLOTS, last - start + 1);  // slots start .. start + n - 1

    extern __shared__ float smem[];
    float* ks = smem;               // (SLOTS, KPAD)
    float* vs = ks + SLOTS * KPAD;  // (SLOTS, D)
    float* qs = vs + SLOTS * D;     // (R, D) rotated, times scale
    float* ps = qs + R * D;         // (R, SLOTS) scores, then exp(score - m)

    const int width = (hq + 2 * hkv) * D;  // one new token's q heads, then k heads, then v heads
    const float* rows = qkv + (size_t)b * T * width;
    for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
        const int r = i / D, g = r / T, t = r % T;
        const float* c = cos_table + (size_t)(p + t) * HALF;
        const float* s = sin_table + (size_t)(p + t) * HALF;
        qs[i] = rotated(rows + (size_t)t * width + (size_t)(kvh * G + g) * D, i % D, c, s) * scale;
    }
    const size_t base = ((size_t)(b * hkv + kvh) * S + start) * D;  // slot `start` of this head's cache
    // the n cached slots, VEC floats a piece, every load of a thread issued before any is stored
    float kr[PER_THREAD][VEC], vr[PER_THREAD][VEC];
#pragma unroll
    for (int u = 0; u < PER_THREAD; u++) {
        const int e = (threadIdx.x + u * SPLIT_THREADS) * VEC;  // element e of the (n, D) slots
        if (e < n * D) {
            load_vec(k_cache + base + e, kr[u]);
            load_vec(v_cache + base + e, vr[u]);
        }
    }
#pragma unroll
    for (int u = 0; u < PER_THREAD; u++) {
        const int e = (threadIdx.x + u * SPLIT_THREADS) * VEC, j = e / D, d = e % D;
        if (e < n * D) {
#pragma unroll
            for (int i = 0; i < VEC; i++) ks[j * KPAD + d + i] = kr[u][i], vs[e + i] = vr[u][i];
        }
    }
    __syncthreads();
    // the new tokens' slots in this block (slot p + t holds new token t): the rotated key and the value
    // replace what the cache held there, in shared memory and in the cache
    const int first = (int)max(0LL, p - start), count = max(0, n - first);  // slots first .. n - 1 are new
    for (int i = threadIdx.x; i < count * D; i += blockDim.x) {
        const int j = first + i / D, d = i % D;
        const long long t = start + j - p;
        const float* x = rows + (size_t)t * width;
        const float* c = cos_table + (size_t)(p + t) * HALF;
        const float* s = sin_table + (size_t)(p + t) * HALF;
        const float kv = rotated(x + (size_t)(hq + kvh) * D, d, c, s);
        const float vv = x[(size_t)(hq + hkv + kvh) * D + d];
        k_cache[base + (size_t)j * D + d] = kv;
        v_cache[base + (size_t)j * D + d] = vv;
        ks[j * KPAD + d] = kv;
        vs[j * D + d] = vv;
    }
    __syncthreads();

    for (int i = threadIdx.x; i < R * n; i += blockDim.x) {  // score of query row r against slot j
        const int r = i / n, j = i % n;
        float dot = 0.0f;
#pragma unroll 16
        for (int d = 0; d < D; d++) dot += qs[r * D + d] * ks[j * KPAD + d];
        ps[r * SLOTS + j] = start + j <= p + r % T ? dot : -INFINITY;  // token t sees slots up to p + t
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < R; r += warps) {  // one warp per query row: m, l, and the exps
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, ps[r * SLOTS + j]);
        for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, offset));
        float l = 0.0f;
        for (int j = lane; j < n; j += 32) {
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

    for (int i = threadIdx.x; i < R * D; i += blockDim.x) {  // sum_j exp(score_j - m) v_j, per row and d
        const int r = i / D, d = i % D, g = r / T, t = r % T;
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += ps[r * SLOTS + j] * vs[j * D + d];
        part_acc[((((size_t)(b * hq + kvh * G + g) * T + t) * splits + split)) * D + d] = acc;
    }
}

// One block of D threads per (b, query head, new token t): merge the partials of splits 0..(p + t) / SLOTS
// (float32, or bf16 for the bf16 product after it).
template <typename Out>
__device__ __forceinline__ void reduce_body(Out* out, const float* part_acc, const float* part_ml,
                                            const long long* pos, int hq, int T, int splits) {
    const int bht = blockIdx.x, d = threadIdx.x;  // bht = (b * hq + h) * T + t
    const int used = (int)((pos[bht / (hq * T)] + bht % T) / SLOTS) + 1;
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
