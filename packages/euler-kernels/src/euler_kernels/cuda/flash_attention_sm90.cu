// FlashAttention on Hopper (sm_90a): the products on wgmma (warpgroup MMA), fp32 accumulation.
//
// Same contract as flash_attention_bf16.cu: q (B, T, Hq, D), k, v (B, S, Hkv, D) bf16 bit patterns,
// out (B, T, Hq, D) bf16 and lse (B, Hq, T) float32 (natural log of the scaled scores' sum of exponentials);
// query t sits at key position S - T + t; query head h reads kv head h / (Hq / Hkv) (no K/V copies).
//
// Forward: persistent and warp-specialised. One block per SM walks the (BM-query tile, query head, batch)
// work items blockIdx.x, + gridDim.x, ..., the tiles that see the most keys first. Warpgroup 0 is the
// producer: one thread copies Q and the K, V tiles (BN keys) with TMA into the 128-byte swizzled layout of
// wgmma.cuh, KV_STAGES buffers each, running ahead into the next work item while the consumers finish this
// one. Warpgroups 1 and 2 consume, 64 query rows each: per tile S = Q K^T (64 x BN, operands from shared
// memory) is issued with P V of the tile before (P from registers), the online softmax of S runs while
// P V is on the tensor cores, and each buffer is handed back on its "empty" barrier as soon as its last
// product has finished. No block-wide barrier after the start: K, V and Q each have their own full/empty
// barriers (tma.cuh), so the two consumers drift apart freely.
#include "common.cuh"
#include "flash_common.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define PANELS (HEAD_DIM / 64)     // 128-byte panels per row of D bf16
#define BM 128                     // query rows per work item: 64 per consumer warpgroup
#define BN 128                     // keys per tile
#define KV_STAGES 2                // buffers of K and of V
#define FWD_NT 384                 // producer warpgroup + 2 consumer warpgroups
#define Q_BYTES (BM * HEAD_DIM * 2)
#define KV_BYTES (BN * HEAD_DIM * 2)

// Copy ROWS rows of D bf16 (global row stride `stride` elements, from row `row0`) into a swizzled tile at
// shared address `tile`, THREADS threads taking part; rows at or past `limit` are zero-filled (backward).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_tile_swizzled(unsigned tile, const bf16_t* src, int row0, int limit,
                                                   size_t stride) {
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte pieces per row
    static_assert(ROWS * CHUNKS % THREADS == 0, "every thread copies the same number of pieces");
#pragma unroll
    for (int j = 0; j < ROWS * CHUNKS / THREADS; j++) {
        const int i = threadIdx.x + j * THREADS, r = i / CHUNKS, c = i % CHUNKS;
        const bool valid = row0 + r < limit;
        const unsigned dst = tile + (c / 8) * (ROWS * 128) + r * 128 + (((c % 8) ^ (r & 7)) << 4);
        const bf16_t* from = src + (size_t)(valid ? row0 + r : 0) * stride + c * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(from),
                     "r"(valid ? 16 : 0));
    }
}

// ROWS rows (one position each) of head `head`, batch `b` from row `row0`, all panels, into a swizzled tile
__device__ __forceinline__ void tma_rows(unsigned tile, int rows, const TensorMap* map, int head, int row0,
                                         int b, unsigned bar) {
#pragma unroll
    for (int p = 0; p < PANELS; p++) tma_load_4d(tile + p * rows * 128, map, p * 64, head, row0, b, bar);
}

// S (64 x BN) = Q (this warpgroup's 64 rows) K^T over the head dimension, in 16-wide k-steps
__device__ __forceinline__ void scores(float* s, unsigned q_rows, unsigned k_tile) {
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
        const unsigned step = (kk % 4) * 32;  // bytes along the row inside a panel
        const u64 a = smem_desc(q_rows + (kk / 4) * (BM * 128) + step, 16, 1024);
        const u64 b = smem_desc(k_tile + (kk / 4) * (BN * 128) + step, 16, 1024);
        wgmma_ss_n128(s, a, b, kk > 0);
    }
}

// O (64 x D) += P (64 x BN, registers) V (BN x D), 16 keys per k-step
__device__ __forceinline__ void add_pv(float* o, const unsigned (*p)[4], unsigned v_tile) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        const u64 b = smem_desc(v_tile + kk * 16 * 128, BN * 128, 1024);
#if HEAD_DIM == 64
        wgmma_rs_n64(o, p[kk], b, 1);
#else
        wgmma_rs_n128(o, p[kk], b, 1);
#endif
    }
}

// Turns between the backward's two warpgroups (PINGPONG 1, measured as no gain): they take turns to issue
// their products. Warpgroup w waits on named barrier 1 + w (128 of its threads + 128 arrivals of the
// other) and passes the turn by arriving on the other's; with PINGPONG 0 the turns are no-ops.
#ifndef PINGPONG
#define PINGPONG 0
#endif
__device__ __forceinline__ void turn_wait(int wg) {
    if (PINGPONG) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
}
__device__ __forceinline__ void turn_pass(int wg) {
    if (PINGPONG) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
}
// warpgroup 1 starts by giving warpgroup 0 its first turn; warpgroup 0 takes the last pass back at the end
__device__ __forceinline__ void turn_start(int wg) {
    if (wg == 1) turn_pass(wg);
}
__device__ __forceinline__ void turn_end(int wg) {
    if (wg == 0) turn_wait(wg);
}

// Online softmax of one S tile (raw scores, rows g, g + 8 of this warp): masks keys past S or past each row's
// position, updates the running max m and sum l, writes the unnormalised P in bf16 as the A operand of
// P V (k-step j = keys 16j .. 16j + 15) and returns in alpha the factor by which O must be rescaled.
__device__ __forceinline__ void softmax_tile(float* s, unsigned (*p)[4], float* m, float* l, float* alpha,
                                             bool mask, int k0, int S, bool causal, int pos0, int pos1,
                                             float sl2) {
    const int t = threadIdx.x % 4;
    if (mask) {
#pragma unroll
        for (int i = 0; i < BN / 2; i++) {
            const int key = k0 + (i / 4) * 8 + 2 * t + (i & 1);
            if (key >= S || (causal && key > ((i & 2) ? pos1 : pos0))) s[i] = -INFINITY;
        }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < BN / 2; i++) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float m_new[2];
    update_running_max(m, l, mx, sl2, m_new, alpha);
#pragma unroll
    for (int i = 0; i < BN / 2; i += 2) {
        const int r = (i >> 1) & 1;
        const float p0 = fast_exp2(fmaf(s[i], sl2, -m_new[r]));
        const float p1 = fast_exp2(fmaf(s[i + 1], sl2, -m_new[r]));
        l[r] += p0 + p1;
        p[i / 8][(i / 2) % 4] = pack_bf16(p0, p1);
    }
}

// A work item: BM query rows q0.. of head h, batch b, and the K/V tiles they see (causal: none past the item)
struct WorkItem {
    int q0, h, b, n_tiles;
};
__device__ __forceinline__ WorkItem work_item(int w, int T, int S, int Hq, int B, bool causal) {
    const int per_tile = Hq * B, n_qt = (T + BM - 1) / BM;
    WorkItem item;
    item.q0 = (n_qt - 1 - w / per_tile) * BM;  // the last query tiles see the most keys under a causal mask
    item.h = (w % per_tile) % Hq;              // neighbouring items: the heads that share a kv head
    item.b = (w % per_tile) / Hq;
    const int kv_end = causal ? min(S, S - T + min(item.q0 + BM, T)) : S;
    item.n_tiles = (kv_end + BN - 1) / BN;
    return item;
}

// The shared memory of the forward: Q, KV_STAGES K and V tiles (1024-aligned), then the barriers
struct ForwardSmem {
    unsigned q, k, v;                           // tiles
    unsigned q_full, q_empty;                   // barriers (8 bytes each)
    unsigned k_full, k_empty, v_full, v_empty;  // first of KV_STAGES barriers each
};
__device__ __forceinline__ ForwardSmem forward_smem(unsigned base) {
    ForwardSmem m;
    m.q = base;
    m.k = m.q + Q_BYTES;
    m.v = m.k + KV_STAGES * KV_BYTES;
    m.q_full = m.v + KV_STAGES * KV_BYTES;
    m.q_empty = m.q_full + 8;
    m.k_full = m.q_empty + 8;
    m.k_empty = m.k_full + 8 * KV_STAGES;
    m.v_full = m.k_empty + 8 * KV_STAGES;
    m.v_empty = m.v_full + 8 * KV_STAGES;
    return m;
}
#define CONSUMER_WARPS 8  // arrivals that hand a buffer back: lane 0 of each consumer warp

// The producer (one thread): Q of each work item, then its K and V tiles, each into the next buffer once
// the consumers have handed it back. `n` counts K/V tiles over all items: buffer n % KV_STAGES, use n / KV_STAGES.
__device__ void produce(const ForwardSmem& sm, const TensorMap* q_map, const TensorMap* k_map,
                        const TensorMap* v_map, int T, int S, int Hq, int Hkv, int B, bool causal) {
    const int n_work = (T + BM - 1) / BM * Hq * B;
    int n = 0, items = 0;
    for (int w = blockIdx.x; w < n_work; w += gridDim.x, items++) {
        const WorkItem it = work_item(w, T, S, Hq, B, causal);
        const int hk = it.h / (Hq / Hkv);
        mbar_wait(sm.q_empty, (items & 1) ^ 1);
        mbar_expect_tx(sm.q_full, Q_BYTES);
        tma_rows(sm.q, BM, q_map, it.h, it.q0, it.b, sm.q_full);
        for (int j = 0; j < it.n_tiles; j++, n++) {
            const int stage = n % KV_STAGES;
            const unsigned parity = ((n / KV_STAGES) & 1) ^ 1;
            mbar_wait(sm.k_empty + 8 * stage, parity);
            mbar_expect_tx(sm.k_full + 8 * stage, KV_BYTES);
            tma_rows(sm.k + stage * KV_BYTES, BN, k_map, hk, j * BN, it.b, sm.k_full + 8 * stage);
            mbar_wait(sm.v_empty + 8 * stage, parity);
            mbar_expect_tx(sm.v_full + 8 * stage, KV_BYTES);
            tma_rows(sm.v + stage * KV_BYTES, BN, v_map, hk, j * BN, it.b, sm.v_full + 8 * stage);
        }
    }
}

// lane 0 of each warp hands a buffer back once the warpgroup's products that read it have finished
__device__ __forceinline__ void release(unsigned bar) {
    if (threadIdx.x % 32 == 0) mbar_arrive(bar);
}

// A consumer warpgroup (cw = 0, 1: query rows 64 cw .. of each item)
__device__ void consume(const ForwardSmem& sm, bf16_t* out, float* lse, int cw, int T, int S, int Hq, int B,
                        float scale, bool causal) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n_work = (T + BM - 1) / BM * Hq * B, offset = S - T, row0 = cw * 64 + warp * 16;
    const float sl2 = scale * LOG2E;  // scores -> log2 units
    const unsigned q_rows = sm.q + cw * 64 * 128;  // this warpgroup's 64 query rows
    int n = 0, items = 0;  // K/V tiles and items consumed so far (the producer's count)
    for (int w = blockIdx.x; w < n_work; w += gridDim.x, items++) {
        const WorkItem it = work_item(w, T, S, Hq, B, causal);
        float o[HEAD_DIM / 2];                // O accumulator (accumulator layout of wgmma.cuh)
        float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (log2 units)
        float l[2] = {0.0f, 0.0f};            // this thread's share of the running sums (quad-summed at the end)
        float alpha[2];
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 2; i++) o[i] = 0.0f;
        // positions of rows g and g + 8; padding rows (t >= T) borrow the last real one
        const int pos0 = offset + min(it.q0 + row0 + g, T - 1), pos1 = offset + min(it.q0 + row0 + g + 8, T - 1);
        // mask only tiles that reach past S or past this warp's first position (warp-uniform)
        auto needs_mask = [&](int k0) { return k0 + BN > S || (causal && k0 + BN - 1 > offset + it.q0 + row0); };
        auto full = [&](unsigned bars, int j) { mbar_wait(bars + 8 * ((n + j) % KV_STAGES), ((n + j) / KV_STAGES) & 1); };
        auto empty = [&](unsigned bars, int j) { return bars + 8 * ((n + j) % KV_STAGES); };
        auto tile = [&](unsigned tiles, int j) { return tiles + ((n + j) % KV_STAGES) * KV_BYTES; };
        float s[BN / 2];         // raw scores: rows g, g + 8 of this warp; keys 8j + 2t, + 1
        unsigned p[BN / 16][4];  // P of the tile whose P V is next, bf16 A operand
        unsigned p2[BN / 16][4];

        mbar_wait(sm.q_full, items & 1);
        // Tile 0: S and its softmax into p. Then tile j >= 1: S of tile j is issued with P V of tile j - 1
        // (p_prev); waiting for all but the newest group waits for S only, and tile j's softmax fills
        // p_next while P V runs. The two P buffers alternate (a copy would let the compiler merge them
        // and wait for P V before the softmax).
        full(sm.k_full, 0);
        wgmma_fence();
        scores(s, q_rows, tile(sm.k, 0));
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs<BN / 2>(s);
        release(empty(sm.k_empty, 0));
        if (it.n_tiles == 1) release(sm.q_empty);
        softmax_tile(s, p, m, l, alpha, needs_mask(0), 0, S, causal, pos0, pos1, sl2);
        auto step = [&](int j, unsigned (&p_prev)[BN / 16][4], unsigned (&p_next)[BN / 16][4]) {
            full(sm.k_full, j);
            full(sm.v_full, j - 1);
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_prev);
            wgmma_fence();
            scores(s, q_rows, tile(sm.k, j));
            wgmma_commit();
            add_pv(o, p_prev, tile(sm.v, j - 1));
            wgmma_commit();
            wgmma_wait<1>();  // S of tile j
            fence_regs<BN / 2>(s);
            release(empty(sm.k_empty, j));
            if (j == it.n_tiles - 1) release(sm.q_empty);  // the item's last use of Q
            softmax_tile(s, p_next, m, l, alpha, needs_mask(j * BN), j * BN, S, causal, pos0, pos1, sl2);
            fence_regs<BN / 16>(p_next);  // the softmax is done before the wait below
            fence_regs<2>(alpha);
            wgmma_wait<0>();  // P V of tile j - 1
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_prev);
            release(empty(sm.v_empty, j - 1));
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 2; i++) o[i] *= alpha[(i >> 1) & 1];
        };
        auto last_pv = [&](unsigned (&p_last)[BN / 16][4]) {  // P V of the last tile
            const int j = it.n_tiles - 1;
            full(sm.v_full, j);
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_last);
            wgmma_fence();
            add_pv(o, p_last, tile(sm.v, j));
            wgmma_commit();
            wgmma_wait<0>();
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_last);
            release(empty(sm.v_empty, j));
        };
        int j = 1;
        for (; j + 1 < it.n_tiles; j += 2) {
            step(j, p, p2);
            step(j + 1, p2, p);
        }
        if (j < it.n_tiles) {  // an even number of tiles: one step left, then the last P V from p2
            step(j, p, p2);
            last_pv(p2);
        } else {
            last_pv(p);
        }
        n += it.n_tiles;

        const size_t q_stride = (size_t)Hq * HEAD_DIM;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int tq = it.q0 + row0 + g + 8 * r;
            const float sum = quad_sum(l[r]);  // all lanes take part in the shuffle
            if (tq >= T) continue;
            const float inv = 1.0f / sum;
            bf16_t* orow = out + ((size_t)it.b * T + tq) * q_stride + it.h * HEAD_DIM;
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 8; i++)
                *reinterpret_cast<unsigned*>(orow + i * 8 + 2 * t) =
                    pack_bf16(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
            if (t == 0) lse[((size_t)it.b * Hq + it.h) * T + tq] = (m[r] + log2f(sum)) * LN2;
        }
    }
}

extern "C" __global__ void __launch_bounds__(FWD_NT, 1)
flash_attention_forward_sm90(bf16_t* out, float* lse, const __grid_constant__ TensorMap q_map,
                             const __grid_constant__ TensorMap k_map, const __grid_constant__ TensorMap v_map,
                             int T, int S, int Hq, int Hkv, float scale, int causal, int B) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const ForwardSmem sm = forward_smem((smem_u32(smem_raw) + 1023u) & ~1023u);  // the swizzle repeats every 1024 bytes
    if (threadIdx.x == 0) {
        mbar_init(sm.q_full, 1);
        mbar_init(sm.q_empty, CONSUMER_WARPS);
        for (int i = 0; i < KV_STAGES; i++) {
            mbar_init(sm.k_full + 8 * i, 1);
            mbar_init(sm.k_empty + 8 * i, CONSUMER_WARPS);
            mbar_init(sm.v_full + 8 * i, 1);
            mbar_init(sm.v_empty + 8 * i, CONSUMER_WARPS);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {  // the producer warpgroup: 24 registers a thread are enough to issue copies
        regs_release<24>();
        if (threadIdx.x == 0) produce(sm, &q_map, &k_map, &v_map, T, S, Hq, Hkv, B, causal);
    } else {
        regs_claim<240>();
        consume(sm, out, lse, threadIdx.x / 128 - 1, T, S, Hq, B, scale, causal);
    }
}

// --- backward -------------------------------------------------------------------------------------------
// One block per (BK-key tile, kv head, batch), two warpgroups; warpgroup w owns keys 64w .. 64w + 63 of the
// tile and keeps their dK, dV accumulators in registers over every (query head of the group, BQ-query tile)
// that sees them (no atomics for dK, dV). Per query tile, with Q, dO, lse and delta double-buffered:
//   S^T = K Q^T, dP^T = V dO^T        (64 keys x BQ queries each; A and B K-major from shared memory)
//   P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta)                   (registers, fp32, then bf16)
//   dV += P^T dO, dK += dS^T Q         (A from registers, B = dO, Q read MN-major)
//   dQ += dS K                         (dS^T through shared memory, read M-major; warpgroup w computes
//                                       head-dimension half w of dQ over all BK keys; atomics into dq)
// delta = rowsum(dout * out) comes from flash_attention_delta_bf16 (flash_attention_bf16.cu). The scores'
// scale is applied once, to dK at the end and to dQ as it is added.
#define BK 128                       // keys per backward block
#define BQ 64                        // queries per backward tile
#define BWD_NT 256
#ifndef BWD_ABLATE
#define BWD_ABLATE 0                 // timing experiments only: 1 leaves out the dQ atomics, 2 all of dQ
#endif
#define K_BYTES (BK * HEAD_DIM * 2)
#define QT_BYTES (BQ * HEAD_DIM * 2)
#define DST_BYTES (BK * BQ * 2)
#ifndef DQ_MODE
#define DQ_MODE 0                    // dQ into dq: 0 float4 atomics from registers, 1 bulk reductions from smem
#endif
#define DQ_LD (HEAD_DIM + 4)         // row stride (floats) of the dQ staging tile: 16 bytes of padding
#define DQ_BYTES (BQ * DQ_LD * 4)

// Stage query tile `it` of the block's loop: head h = first + it / n_q, rows i0 = q_first + (it % n_q) BQ
__device__ __forceinline__ void load_query_tile(unsigned qs, unsigned dos, float* lse_s, float* delta_s,
                                                const bf16_t* q, const bf16_t* dout, const float* lse,
                                                const float* delta, int b, int h, int i0, int T, int Hq) {
    const size_t stride = (size_t)Hq * HEAD_DIM, head = ((size_t)b * T * Hq + h) * HEAD_DIM;
    load_tile_swizzled<BQ, BWD_NT>(qs, q + head, i0, T, stride);
    load_tile_swizzled<BQ, BWD_NT>(dos, dout + head, i0, T, stride);
    if (threadIdx.x < 2 * BQ) {  // one float each of lse (threads 0..63) and delta (64..127)
        const int r = threadIdx.x % BQ;
        const bool valid = i0 + r < T;
        const float* src = (threadIdx.x < BQ ? lse : delta) + ((size_t)b * Hq + h) * T + (valid ? i0 + r : 0);
        float* dst = (threadIdx.x < BQ ? lse_s : delta_s) + r;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                     "r"(valid ? 4 : 0));
    }
}

extern "C" __global__ void __launch_bounds__(BWD_NT, 1)
flash_attention_backward_sm90(float* dq, float* dk, float* dv, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                              const bf16_t* dout, const float* lse, const float* delta, int T, int S, int Hq,
                              int Hkv, float scale, int causal) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned Ks = base, Vs = Ks + K_BYTES, Qs = Vs + K_BYTES, dOs = Qs + 2 * QT_BYTES;
    const unsigned dSt = dOs + 2 * QT_BYTES;  // dS^T (BK keys, BQ queries) bf16, swizzled
    const unsigned dQs = dSt + DST_BYTES;  // 2 x dQ (BQ, DQ_LD) float32, staged for the bulk reductions
    float* lse_s = reinterpret_cast<float*>(smem_raw + (dQs + 2 * DQ_BYTES - smem_u32(smem_raw)));  // 2 x BQ
    float* delta_s = lse_s + 2 * BQ;                                                               // 2 x BQ
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int n0 = blockIdx.x * BK, hk = blockIdx.y, b = blockIdx.z, G = Hq / Hkv, offset = S - T;
    const size_t kv_stride = (size_t)Hkv * HEAD_DIM;
    const float sl2 = scale * LOG2E;
    // causal: query tiles before the first one whose last query sees key n0 see none of this block
    const int q_first = causal ? max(0, n0 - offset) / BQ * BQ : 0;
    const int n_q = q_first < T ? (T - q_first + BQ - 1) / BQ : 0, total = G * n_q;
    const int kr0 = n0 + wg * 64 + warp * 16 + g;  // this thread's key rows kr0 and kr0 + 8
    const int lr0 = wg * 64 + warp * 16 + g;       // ... as rows of the block's tiles

    load_tile_swizzled<BK, BWD_NT>(Ks, k + (size_t)b * S * kv_stride + hk * HEAD_DIM, n0, S, kv_stride);
    load_tile_swizzled<BK, BWD_NT>(Vs, v + (size_t)b * S * kv_stride + hk * HEAD_DIM, n0, S, kv_stride);
    if (total > 0) load_query_tile(Qs, dOs, lse_s, delta_s, q, dout, lse, delta, b, hk * G, q_first, T, Hq);
    cp_async_commit();

    float dk_acc[HEAD_DIM / 2], dv_acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; i++) dk_acc[i] = dv_acc[i] = 0.0f;

    turn_start(wg);
    for (int it = 0; it < total; it++) {
        const int st = it % 2, h = hk * G + it / n_q, i0 = q_first + (it % n_q) * BQ;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // tile `it` is in; every warpgroup is done with tile it - 1 and its dS^T
        if (it + 1 < total) {
            const int nt = it + 1;
            load_query_tile(Qs + (st ^ 1) * QT_BYTES, dOs + (st ^ 1) * QT_BYTES, lse_s + (st ^ 1) * BQ,
                            delta_s + (st ^ 1) * BQ, q, dout, lse, delta, b, hk * G + nt / n_q,
                            q_first + (nt % n_q) * BQ, T, Hq);
        }
        cp_async_commit();
        const unsigned qt = Qs + st * QT_BYTES, dot = dOs + st * QT_BYTES;
        const float* lse_t = lse_s + st * BQ;
        const float* delta_t = delta_s + st * BQ;

        float s[BQ / 2], dp[BQ / 2];  // S^T, dP^T: key rows g, g + 8 of this warp; queries 8j + 2t, + 1
        turn_wait(wg);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            const unsigned step = (kk / 4) * (BK * 128) + wg * 64 * 128 + (kk % 4) * 32;
            const unsigned qstep = (kk / 4) * (BQ * 128) + (kk % 4) * 32;
            wgmma_ss_n64(s, smem_desc(Ks + step, 16, 1024), smem_desc(qt + qstep, 16, 1024), kk > 0);
        }
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            const unsigned step = (kk / 4) * (BK * 128) + wg * 64 * 128 + (kk % 4) * 32;
            const unsigned qstep = (kk / 4) * (BQ * 128) + (kk % 4) * 32;
            wgmma_ss_n64(dp, smem_desc(Vs + step, 16, 1024), smem_desc(dot + qstep, 16, 1024), kk > 0);
        }
        wgmma_commit();
        turn_pass(wg);
        wgmma_wait<0>();
        fence_regs<BQ / 2>(s);
        fence_regs<BQ / 2>(dp);

        // a causal tile needs the mask where this warp's last key is later than the tile's first query
        const bool masked = causal && n0 + wg * 64 + warp * 16 + 15 > offset + i0;
        unsigned pf[BQ / 16][4], df[BQ / 16][4];  // P^T, dS^T as A operands (k = queries 16j .. 16j + 15)
#pragma unroll
        for (int i = 0; i < BQ / 2; i += 2) {
            const int c = (i / 4) * 8 + 2 * t, row = (i & 2) ? 8 : 0, kr = kr0 + row;
            float p0 = fast_exp2(fmaf(s[i], sl2, -lse_t[c] * LOG2E));
            float p1 = fast_exp2(fmaf(s[i + 1], sl2, -lse_t[c + 1] * LOG2E));
            if (masked) {
                if (kr > offset + i0 + c) p0 = 0.0f;
                if (kr > offset + i0 + c + 1) p1 = 0.0f;
            }
            const unsigned ds = pack_bf16(p0 * (dp[i] - delta_t[c]), p1 * (dp[i + 1] - delta_t[c + 1]));
            pf[i / 8][(i / 2) % 4] = pack_bf16(p0, p1);
            df[i / 8][(i / 2) % 4] = ds;
            const int lr = lr0 + row;  // dS^T row lr, queries c, c + 1 (one panel: BQ = 64)
            const unsigned at = dSt + lr * 128 + ((((c / 8) ^ (lr & 7))) << 4) + (c % 8) * 2;
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(ds));
        }

        fence_regs<HEAD_DIM / 2>(dv_acc);
        fence_regs<HEAD_DIM / 2>(dk_acc);
        fence_regs<BQ / 16>(pf);
        fence_regs<BQ / 16>(df);
        turn_wait(wg);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {  // dV += P^T dO, dK += dS^T Q over queries 16kk .. + 15
            const u64 bo = smem_desc(dot + kk * 16 * 128, BQ * 128, 1024);
            const u64 bq = smem_desc(qt + kk * 16 * 128, BQ * 128, 1024);
#if HEAD_DIM == 64
            wgmma_rs_n64(dv_acc, pf[kk], bo, 1);
            wgmma_rs_n64(dk_acc, df[kk], bq, 1);
#else
            wgmma_rs_n128(dv_acc, pf[kk], bo, 1);
            wgmma_rs_n128(dk_acc, df[kk], bq, 1);
#endif
        }
        wgmma_commit();
        turn_pass(wg);

#if BWD_ABLATE == 2
        wgmma_wait<0>();
        fence_regs<HEAD_DIM / 2>(dv_acc);
        fence_regs<HEAD_DIM / 2>(dk_acc);
        fence_regs<BQ / 16>(pf);
        fence_regs<BQ / 16>(df);
        continue;
#endif
        fence_proxy_async();  // this thread's dS^T stores, for the tensor cores
        __syncthreads();      // ... and every thread's
        float dq_acc[HEAD_DIM / 4];  // dQ (BQ queries, head-dimension half wg): rows g, g + 8 of this warp
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {  // keys 16kk .. + 15 of both warpgroups
            const u64 a = smem_desc(dSt + kk * 16 * 128, BQ * 128, 1024);
#if HEAD_DIM == 64
            const u64 bk = smem_desc(Ks + kk * 16 * 128 + wg * 64, BK * 128, 1024);  // columns 32 wg ..
            wgmma_ss_tt_n32(dq_acc, a, bk, kk > 0);
#else
            const u64 bk = smem_desc(Ks + wg * (BK * 128) + kk * 16 * 128, BK * 128, 1024);  // panel wg
            wgmma_ss_tt_n64(dq_acc, a, bk, kk > 0);
#endif
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs<HEAD_DIM / 4>(dq_acc);
        fence_regs<HEAD_DIM / 2>(dv_acc);
        fence_regs<HEAD_DIM / 2>(dk_acc);
        fence_regs<BQ / 16>(pf);
        fence_regs<BQ / 16>(df);
#if DQ_MODE == 0
        // dQ: float4 atomics; lanes t and t ^ 1 swap halves so that each holds 4 adjacent columns of one row
        const bool even = (t & 1) == 0;
        const int tq = i0 + warp * 16 + g + (even ? 0 : 8);
        float* row = dq + (((size_t)b * T + tq) * Hq + h) * HEAD_DIM + wg * (HEAD_DIM / 2) + 2 * (t & ~1);
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 16; j++) {
            // even t keeps row g and gets the partner's row g columns; odd t keeps row g + 8
            const float give0 = even ? dq_acc[4 * j + 2] : dq_acc[4 * j + 0];
            const float give1 = even ? dq_acc[4 * j + 3] : dq_acc[4 * j + 1];
            const float got0 = __shfl_xor_sync(FULL_MASK, give0, 1), got1 = __shfl_xor_sync(FULL_MASK, give1, 1);
            const float4 add = even ? make_float4(dq_acc[4 * j], dq_acc[4 * j + 1], got0, got1)
                                    : make_float4(got0, got1, dq_acc[4 * j + 2], dq_acc[4 * j + 3]);
            if (tq < T && BWD_ABLATE == 0)
                atomicAdd(reinterpret_cast<float4*>(row + 8 * j),
                          make_float4(add.x * scale, add.y * scale, add.z * scale, add.w * scale));
        }
#else
        // dQ tile -> shared memory (scaled) -> 64 threads add its rows to dq with bulk reductions, which run
        // asynchronously while the block goes on (two staging buffers, alternating)
        const unsigned dqt = dQs + st * DQ_BYTES;
#pragma unroll
        for (int r = 0; r < 2 && BWD_ABLATE == 0; r++) {
            const int col = wg * (HEAD_DIM / 2) + 2 * t;
            const unsigned row = dqt + (warp * 16 + g + 8 * r) * (DQ_LD * 4) + col * 4;
#pragma unroll
            for (int j = 0; j < HEAD_DIM / 16; j++)
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(row + 32 * j),
                             "f"(dq_acc[4 * j + 2 * r] * scale), "f"(dq_acc[4 * j + 2 * r + 1] * scale));
        }
        fence_proxy_async();
        __syncthreads();
        if (threadIdx.x < BQ && i0 + threadIdx.x < T && BWD_ABLATE == 0) {  // thread r: row r of the tile
            const float* to = dq + (((size_t)b * T + i0 + threadIdx.x) * Hq + h) * HEAD_DIM;
            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(to),
                         "r"(dqt + threadIdx.x * (DQ_LD * 4)), "n"(HEAD_DIM * 4)
                         : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        }
        // the previous tile's reductions must have read the other buffer before the next tile writes it
        if (threadIdx.x < BQ) asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
#endif
    }
    turn_end(wg);
#if DQ_MODE == 1
    if (threadIdx.x < BQ) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // dq reductions done
#endif
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int kr = kr0 + 8 * r;
        if (kr >= S) continue;
        const size_t at = (((size_t)b * S + kr) * Hkv + hk) * HEAD_DIM + 2 * t;
#pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; j++) {
            *reinterpret_cast<float2*>(dk + at + 8 * j) =
                make_float2(dk_acc[4 * j + 2 * r] * scale, dk_acc[4 * j + 2 * r + 1] * scale);
            *reinterpret_cast<float2*>(dv + at + 8 * j) = make_float2(dv_acc[4 * j + 2 * r], dv_acc[4 * j + 2 * r + 1]);
        }
    }
}
