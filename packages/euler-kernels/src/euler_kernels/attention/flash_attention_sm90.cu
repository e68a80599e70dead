// FlashAttention on Hopper (sm_90a): the products on wgmma (warpgroup MMA), fp32 accumulation.
//
// Same contract as flash_attention_bf16.cu: q (B, T, Hq, D), k, v (B, S, Hkv, D) bf16 bit patterns,
// out (B, T, Hq, D) bf16 and lse (B, Hq, T) float32 (natural log of the scaled scores' sum of exponentials);
// query t sits at key position S - T + t; query head h reads kv head h / (Hq / Hkv) (no K/V copies).
//
// Forward: persistent and warp-specialised. One block per SM walks the (query tile, query head(s), batch)
// work items blockIdx.x, + gridDim.x, ..., the tiles that see the most keys first.
// - Warpgroup 0 is the producer: one thread copies Q and the K, V tiles (BN keys) with TMA into the
//   128-byte swizzled layout of wgmma.cuh (Q_STAGES buffers of Q, KV_STAGES of K and of V), running ahead
//   into the next work items while the consumers finish this one. Each buffer has its own full and empty
//   barriers (tma.cuh); there is no block-wide barrier after the start.
// - Warpgroups 1 .. FWD_CONSUMERS consume, 64 query rows each (BM = 128 with two, 192 with three). Per
//   tile, S = Q K^T (64 x BN, operands from shared memory) is issued with P V of the tile before (P from
//   registers), then the online softmax of S; each buffer is handed back as soon as its last product has
//   finished. (In the SASS, ptxas places the wait for P V before the softmax's exponentials, at head_dim 64
//   and 128: a warpgroup's softmax does not run under its own P V; docs/benchmarks/attention_gpu.md.)
// - The consumers take turns to issue their products (turn_wait), so one's softmax runs under the others'
//   products: that is the overlap there is. At head_dim 64 a softmax takes as long as a warpgroup's
//   products, so three consumers (160 registers each, one P buffer) keep the tensor cores busier than two.
//   With FWD_GQA_PACK an item is 64 positions of three query heads that share a kv head (consumer c takes
//   head h + c), so no item is padding; the launcher's rule (forward_layout in flash_attention_sm90.py)
//   says which layout a shape gets.
// - A consumer writes its 64 rows of O in bf16 into a staging tile of its own (the out map's swizzled
//   layout), and one of its threads stores the tile with TMA while the warpgroup goes on to the next item:
//   whole 128-byte lines, no waits for registers.
#include "common.cuh"
#include "flash_common.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define PANELS (HEAD_DIM / 64)     // 128-byte panels per row of D bf16
#ifndef FWD_CONSUMERS
#define FWD_CONSUMERS 2            // consumer warpgroups: 3 lets each softmax run under two others' products
#endif
#define BM (64 * FWD_CONSUMERS)    // query rows a work item holds in Q's buffer: 64 per consumer warpgroup
#ifndef FWD_GQA_PACK
#define FWD_GQA_PACK 0             // 1: a work item is 64 positions of FWD_CONSUMERS query heads of one kv head
#endif
#if FWD_GQA_PACK
#define ITEM_ROWS 64               // positions per work item
#define ITEM_HEADS FWD_CONSUMERS   // query heads per work item, one a consumer
static_assert(HEAD_DIM == 64, "the packed Q buffer is one 128-byte panel a row: head_dim 64");
#else
#define ITEM_ROWS BM
#define ITEM_HEADS 1
#endif
#define BN 128                     // keys per tile
#ifndef KV_STAGES
#define KV_STAGES 2                // buffers of K and of V
#endif
#ifndef Q_STAGES
#define Q_STAGES 2                 // buffers of Q: the next item's lands while this one finishes
#endif
#define FWD_NT (128 * (1 + FWD_CONSUMERS))  // producer warpgroup + the consumer warpgroups
// registers a consumer thread claims (setmaxnreg): the producer's warpgroup keeps 24, 65,536 in all
#define FWD_CONSUMER_REGS (FWD_CONSUMERS == 2 ? 240 : 160)
#define Q_BYTES (BM * HEAD_DIM * 2)
#define KV_BYTES (BN * HEAD_DIM * 2)
#define O_BYTES (64 * HEAD_DIM * 2)  // a consumer's staging tile of O

// ROWS rows (one position each) of head `head`, batch `b` from row `row0`, all panels, into a swizzled tile
__device__ __forceinline__ void tma_rows(unsigned tile, int rows, const TensorMap* map, int head, int row0,
                                         int b, unsigned bar) {
#pragma unroll
    for (int p = 0; p < PANELS; p++) tma_load_4d(tile + p * rows * 128, map, p * 64, head, row0, b, bar);
}

// S (64 x BN) = Q (this warpgroup's 64 rows) K^T over the head dimension, in 16-wide k-steps
__device__ __forceinline__ void scores(float* s, unsigned q_rows, unsigned k_tile) {
    const u64 a0 = smem_desc(q_rows, 16, 1024), b0 = smem_desc(k_tile, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
        const unsigned step = (kk % 4) * 32;  // bytes along the row inside a panel
        const u64 a = desc_advance(a0, (kk / 4) * (BM * 128) + step);
        const u64 b = desc_advance(b0, (kk / 4) * (BN * 128) + step);
        wgmma_ss_n128(s, a, b, kk > 0);
    }
}

// O (64 x D) += P (64 x BN, registers) V (BN x D), 16 keys per k-step
__device__ __forceinline__ void add_pv(float* o, const unsigned (*p)[4], unsigned v_tile) {
    const u64 b0 = smem_desc(v_tile, BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        const u64 b = desc_advance(b0, kk * 16 * 128);
#if HEAD_DIM == 64
        wgmma_rs_n64(o, p[kk], b, 1);
#else
        wgmma_rs_n128(o, p[kk], b, 1);
#endif
    }
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

// A work item: ITEM_ROWS query positions q0.. of ITEM_HEADS heads h.. (which share a kv head), batch b, and
// the K/V tiles they see (causal: none past the item)
struct WorkItem {
    int q0, h, b, n_tiles;
};
__device__ __forceinline__ int work_items(int T, int Hq, int B) {
    return (T + ITEM_ROWS - 1) / ITEM_ROWS * (Hq / ITEM_HEADS) * B;
}
__device__ __forceinline__ WorkItem work_item(int w, int T, int S, int Hq, int B, bool causal) {
    const int groups = Hq / ITEM_HEADS, per_tile = groups * B, n_qt = (T + ITEM_ROWS - 1) / ITEM_ROWS;
    WorkItem item;
    item.q0 = (n_qt - 1 - w / per_tile) * ITEM_ROWS;  // the last query tiles see the most keys under a causal mask
    item.h = ((w % per_tile) % groups) * ITEM_HEADS;  // neighbouring items: the heads that share a kv head
    item.b = (w % per_tile) / groups;
    const int kv_end = causal ? min(S, S - T + min(item.q0 + ITEM_ROWS, T)) : S;
    item.n_tiles = (kv_end + BN - 1) / BN;
    return item;
}

// The shared memory of the forward: Q_STAGES Q tiles, KV_STAGES K and V tiles, two O staging tiles
// (1024-aligned), then the barriers (8 bytes each)
struct ForwardSmem {
    unsigned q, k, v, o;                        // tiles
    unsigned q_full, q_empty;                   // first of Q_STAGES barriers each
    unsigned k_full, k_empty, v_full, v_empty;  // first of KV_STAGES barriers each
};
__device__ __forceinline__ ForwardSmem forward_smem(unsigned base) {
    ForwardSmem m;
    m.q = base;
    m.k = m.q + Q_STAGES * Q_BYTES;
    m.v = m.k + KV_STAGES * KV_BYTES;
    m.o = m.v + KV_STAGES * KV_BYTES;
    m.q_full = m.o + FWD_CONSUMERS * O_BYTES;
    m.q_empty = m.q_full + 8 * Q_STAGES;
    m.k_full = m.q_empty + 8 * Q_STAGES;
    m.k_empty = m.k_full + 8 * KV_STAGES;
    m.v_full = m.k_empty + 8 * KV_STAGES;
    m.v_empty = m.v_full + 8 * KV_STAGES;
    return m;
}
#define CONSUMER_WARPS (4 * FWD_CONSUMERS)  // arrivals that hand a buffer back: lane 0 of each consumer warp
#ifndef FWD_PINGPONG
#define FWD_PINGPONG 1  // 1: the consumers take turns to issue their products (see turn_wait)
#endif

// Turns between the consumers: each issues its products only after the one before it (in a ring) has
// issued its own, so one warpgroup's softmax runs while the others' products occupy the tensor cores. All
// walk the same items and tiles, so their issue points pair up one to one. Consumer cw waits on named
// barrier TURN_BARRIER + cw, which the consumer before it arrives at (128 + 128 threads); the last consumer
// arrives once at the start so that consumer 0 goes first, and consumer 0 takes that extra arrival at the
// end. (Barrier 0 is __syncthreads, 1 + cw a consumer's own, for its staging tile.)
#define TURN_BARRIER (1 + FWD_CONSUMERS)
__device__ __forceinline__ void turn_wait(int cw) {
    if (FWD_PINGPONG) named_barrier_sync(TURN_BARRIER + cw, 256);
}
__device__ __forceinline__ void turn_pass(int cw) {
    if (FWD_PINGPONG) named_barrier_arrive(TURN_BARRIER + (cw + 1) % FWD_CONSUMERS, 256);
}

// The producer (one thread): Q of each work item, then its K and V tiles, each into the next buffer once
// the consumers have handed it back. `n` counts K/V tiles over all items: buffer n % KV_STAGES, use n / KV_STAGES.
__device__ void produce(const ForwardSmem& sm, const TensorMap* q_map, const TensorMap* k_map,
                        const TensorMap* v_map, int T, int S, int Hq, int Hkv, int B, bool causal) {
    const int n_work = work_items(T, Hq, B);
    int n = 0, items = 0;
    for (int w = blockIdx.x; w < n_work; w += gridDim.x, items++) {
        const WorkItem it = work_item(w, T, S, Hq, B, causal);
        const int hk = it.h / (Hq / Hkv);
        const int qs = items % Q_STAGES;
        mbar_wait(sm.q_empty + 8 * qs, ((items / Q_STAGES) & 1) ^ 1);
        mbar_expect_tx(sm.q_full + 8 * qs, Q_BYTES);
#if FWD_GQA_PACK
        for (int c = 0; c < ITEM_HEADS; c++)  // consumer c's 64 rows: head h + c
            tma_rows(sm.q + qs * Q_BYTES + c * 64 * 128, 64, q_map, it.h + c, it.q0, it.b, sm.q_full + 8 * qs);
#else
        tma_rows(sm.q + qs * Q_BYTES, BM, q_map, it.h, it.q0, it.b, sm.q_full + 8 * qs);
#endif
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

// A consumer warpgroup (cw = 0 .. FWD_CONSUMERS - 1: query rows 64 cw .. of each item, or with FWD_GQA_PACK
// the item's 64 rows of head h + cw)
__device__ void consume(const ForwardSmem& sm, const TensorMap* out_map, float* lse, int cw, int T, int S, int Hq,
                        int B, float scale, bool causal) {
    const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // this consumer's rows of an item: its own head's 64 positions (packed), or positions 64 cw .. + 63
    const int slab0 = FWD_GQA_PACK ? 0 : cw * 64, head_of = FWD_GQA_PACK ? cw : 0;
    const int n_work = work_items(T, Hq, B), offset = S - T, row0 = slab0 + warp * 16;
    const float sl2 = scale * LOG2E;  // scores -> log2 units
    const unsigned o_tile = sm.o + cw * O_BYTES;   // this warpgroup's staging tile of O
    int n = 0, items = 0;  // K/V tiles and items consumed so far (the producer's count)
    if (cw == FWD_CONSUMERS - 1) turn_pass(cw);  // consumer 0 issues first
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
#if FWD_CONSUMERS == 2
        unsigned p2[BN / 16][4];
#endif

        const int qs = items % Q_STAGES;
        const unsigned q_rows = sm.q + qs * Q_BYTES + cw * 64 * 128;  // this warpgroup's 64 query rows
        const unsigned q_empty = sm.q_empty + 8 * qs;
        mbar_wait(sm.q_full + 8 * qs, (items / Q_STAGES) & 1);
        // Tile 0: S and its softmax into p. Then tile j >= 1: S of tile j is issued with P V of tile j - 1
        // (p_prev); the code waits for all but the newest group (S) before tile j's softmax fills p_next,
        // but ptxas moves the wait for P V up to it (see the file's head). The two P buffers alternate.
        full(sm.k_full, 0);
        turn_wait(cw);
        wgmma_fence();
        scores(s, q_rows, tile(sm.k, 0));
        wgmma_commit();
        turn_pass(cw);
        wgmma_wait<0>();
        fence_regs<BN / 2>(s);
        release(empty(sm.k_empty, 0));
        if (it.n_tiles == 1) release(q_empty);
        softmax_tile(s, p, m, l, alpha, needs_mask(0), 0, S, causal, pos0, pos1, sl2);
        // tile j >= 1, in this consumer's turn: S of tile j and P V of tile j - 1, two commit groups
        auto issue = [&](int j, unsigned (&p_prev)[BN / 16][4]) {
            full(sm.k_full, j);
            full(sm.v_full, j - 1);
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_prev);
            turn_wait(cw);
            wgmma_fence();
            scores(s, q_rows, tile(sm.k, j));
            wgmma_commit();
            add_pv(o, p_prev, tile(sm.v, j - 1));
            wgmma_commit();
            turn_pass(cw);
        };
#if FWD_CONSUMERS == 2
        auto step = [&](int j, unsigned (&p_prev)[BN / 16][4], unsigned (&p_next)[BN / 16][4]) {
            issue(j, p_prev);
            wgmma_wait<1>();  // S of tile j
            fence_regs<BN / 2>(s);
            release(empty(sm.k_empty, j));
            if (j == it.n_tiles - 1) release(q_empty);  // the item's last use of Q
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
#endif
        auto last_pv = [&](unsigned (&p_last)[BN / 16][4]) {  // P V of the last tile
            const int j = it.n_tiles - 1;
            full(sm.v_full, j);
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_last);
            turn_wait(cw);
            wgmma_fence();
            add_pv(o, p_last, tile(sm.v, j));
            wgmma_commit();
            turn_pass(cw);
            wgmma_wait<0>();
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p_last);
            release(empty(sm.v_empty, j));
        };
#if FWD_CONSUMERS == 2
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
#else
        // three consumers: the other two cover a softmax, so one P buffer (160 registers a thread), S and
        // P V waited for together, then the softmax writes the next P over the one P V has read
        for (int j = 1; j < it.n_tiles; j++) {
            issue(j, p);
            wgmma_wait<0>();
            fence_regs<BN / 2>(s);
            fence_regs<HEAD_DIM / 2>(o);
            fence_regs<BN / 16>(p);
            release(empty(sm.k_empty, j));
            release(empty(sm.v_empty, j - 1));
            if (j == it.n_tiles - 1) release(q_empty);  // the item's last use of Q
            softmax_tile(s, p, m, l, alpha, needs_mask(j * BN), j * BN, S, causal, pos0, pos1, sl2);
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 2; i++) o[i] *= alpha[(i >> 1) & 1];
        }
        last_pv(p);
#endif
        n += it.n_tiles;

        // O / l -> the staging tile (64 rows, HEAD_DIM / 64 swizzled panels), once the previous item's store
        // has read it; then thread 0 of the warpgroup stores it (rows past T are not written). Named
        // barrier 1 + cw: this consumer's 128 threads (TURN_BARRIER + cw are the turns, 0 is __syncthreads)
        const bool storer = threadIdx.x % 128 == 0;
        if (storer) bulk_wait_read<0>();
        named_barrier_sync(1 + cw, 128);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = warp * 16 + g + 8 * r, tq = it.q0 + row0 + g + 8 * r;
            const float sum = quad_sum(l[r]);  // all lanes take part in the shuffle
            const float inv = 1.0f / sum;
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 8; i++) {  // columns 8i + 2t, + 1: panel i / 8, 16-byte chunk i % 8
                const unsigned at = o_tile + (i / 8) * (64 * 128) + swizzled(row, (i % 8) * 16 + 4 * t);
                asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(at), "r"(pack_bf16(o[4 * i + 2 * r] * inv,
                                                                                   o[4 * i + 2 * r + 1] * inv)));
            }
            if (t == 0 && tq < T) lse[((size_t)it.b * Hq + it.h + head_of) * T + tq] = (m[r] + log2f(sum)) * LN2;
        }
        fence_proxy_async();  // the staging stores, for the copy engine
        named_barrier_sync(1 + cw, 128);
        if (storer) {
#pragma unroll
            for (int p = 0; p < PANELS; p++)
                tma_store_4d(out_map, p * 64, it.h + head_of, it.q0 + slab0, it.b, o_tile + p * (64 * 128));
            bulk_commit();
        }
    }
    if (cw == 0) turn_wait(cw);                    // the last consumer's final arrival
    if (threadIdx.x % 128 == 0) bulk_wait_all();  // the last store is done before the block's memory goes
}

extern "C" __global__ void __launch_bounds__(FWD_NT, 1)
flash_attention_forward_sm90(const __grid_constant__ TensorMap out_map, float* lse,
                             const __grid_constant__ TensorMap q_map, const __grid_constant__ TensorMap k_map,
                             const __grid_constant__ TensorMap v_map, int T, int S, int Hq, int Hkv, float scale,
                             int causal, int B) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const ForwardSmem sm = forward_smem((smem_u32(smem_raw) + 1023u) & ~1023u);  // the swizzle repeats every 1024 bytes
    if (threadIdx.x == 0) {
        for (int i = 0; i < Q_STAGES; i++) {
            mbar_init(sm.q_full + 8 * i, 1);
            mbar_init(sm.q_empty + 8 * i, CONSUMER_WARPS);
        }
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
        regs_claim<FWD_CONSUMER_REGS>();
        consume(sm, &out_map, lse, threadIdx.x / 128 - 1, T, S, Hq, B, scale, causal);
    }
}

// --- backward -------------------------------------------------------------------------------------------
// One block per (BK-key tile, kv head, batch), started heaviest first (see the kernel); warp-specialised
// like the forward, three warpgroups:
// - Warpgroup 0 copies and adds. Its warp 0 copies K and V once, and each query tile's Q and dO by TMA and
//   lse and delta by cp.async into BWD_STAGES buffers ("full" barriers), refilling a buffer (tile
//   it + BWD_STAGES) once both consumers have handed it back ("empty"). Its warp 1 adds each tile's dQ
//   into dq (below).
// - Consumer warpgroup w (1, 2) owns keys 64 (w - 1) .. + 63 of the tile and keeps their dK, dV
//   accumulators in registers over every (query head of the group, BQ-query tile) that sees them. The two
//   consumers meet once a tile, at a named barrier, when dS^T is in shared memory. Per query tile:
//   S^T = K Q^T, dP^T = V dO^T        (64 keys x BQ queries each; B K-major from shared memory, A too at
//                                       D 128; at D 64 (BWD_RS_KV) A is K's and V's rows in registers,
//                                       read once per block)
//   P^T = exp(S^T - lse), dS^T = P^T (dP^T - delta)                   (registers, fp32, then bf16)
//   dV += P^T dO, dK += dS^T Q         (A from registers, B = dO, Q read MN-major)
//   dQ = dS K                          (dS^T through shared memory (stmatrix), read M-major, over all BK keys; at
//                                       D 128 warpgroup w computes head-dimension half w, at D 64 warpgroup
//                                       it % 2 all of it: DQ_ONE_WG; issued before dV's and dK's products,
//                                       which run on while dQ is staged: BWD_DQ_FIRST)
// and dQ, scaled, goes through a 128-byte-swizzled float32 staging tile (two, alternating, as dS^T is) that
// warpgroup 0's warp 1 adds into dq with TMA reductions, whole tiles in the L2, while the consumers go on.
// delta = rowsum(dout * out) comes from flash_attention_delta_bf16 (flash_attention_bf16.cu). The scores'
// scale is applied once, to dK at the end and to dQ as it is staged.
#define BK 128                       // keys per backward block
#define BQ 64                        // queries per backward tile
#define BWD_NT 384                   // a copying warpgroup + 2 consumer warpgroups
#define BWD_STAGES 2                 // Q, dO, lse, delta buffers
#ifndef BWD_HEAVY_FIRST
#define BWD_HEAVY_FIRST 1            // 1: blocks ordered by work, heaviest first (see the kernel's start)
#endif
#ifndef BWD_OVERLAP
#define BWD_OVERLAP 0  // 1: P's exponentials under dP^T's product, dS under dV's (see the loop)
#endif
#ifndef BWD_DQ_FIRST
#define BWD_DQ_FIRST 1  // 1: dQ's products go before dK's and dV's, which run on while dQ is staged
#endif
#if BWD_DQ_FIRST && BWD_OVERLAP
#error "BWD_DQ_FIRST needs BWD_OVERLAP 0 (dV's products wait for dQ's)"
#endif
#ifndef DQ_ONE_WG
#define DQ_ONE_WG (HEAD_DIM == 64)  // 1: one warpgroup a tile, in turn, computes all of dQ (see the loop)
#endif
#ifndef BWD_RS_KV
#define BWD_RS_KV (HEAD_DIM == 64)  // 1: K and V as register A operands of S^T and dP^T (read from smem once)
#endif
#if BWD_RS_KV && HEAD_DIM != 64
#error "BWD_RS_KV needs HEAD_DIM 64 (at 128 the fragments do not fit beside dK and dV)"
#endif
#if DQ_ONE_WG && HEAD_DIM != 64
#error "DQ_ONE_WG needs HEAD_DIM 64 (at 128 the accumulators do not fit beside dK and dV)"
#endif
#ifndef BWD_ABLATE
#define BWD_ABLATE 0                 // timing only: 1 leaves out the dQ reductions (wrong dq)
#endif
#define K_BYTES (BK * HEAD_DIM * 2)
#define QT_BYTES (BQ * HEAD_DIM * 2)
#define DST_BYTES (BK * BQ * 2)
#define DQ_BYTES (BQ * HEAD_DIM * 4)  // a dQ staging tile: HEAD_DIM / 32 float32 panels of 32 columns

struct BackwardSmem {
    unsigned k, v, q, dout, dst, dq;  // tiles (q, dout: BWD_STAGES each; dst, dq: 2 each)
    unsigned lse, delta;              // BWD_STAGES x BQ float32 each
    unsigned kv_full, qdo_full, qdo_empty, dq_full, dq_empty;  // barriers: 1, BWD_STAGES, BWD_STAGES, 2, 2
};
__device__ __forceinline__ BackwardSmem backward_smem(unsigned base) {
    BackwardSmem m;
    m.k = base;
    m.v = m.k + K_BYTES;
    m.q = m.v + K_BYTES;
    m.dout = m.q + BWD_STAGES * QT_BYTES;
    m.dst = m.dout + BWD_STAGES * QT_BYTES;
    m.dq = m.dst + 2 * DST_BYTES;
    m.lse = m.dq + 2 * DQ_BYTES;
    m.delta = m.lse + BWD_STAGES * BQ * 4;
    m.kv_full = m.delta + BWD_STAGES * BQ * 4;
    m.qdo_full = m.kv_full + 8;
    m.qdo_empty = m.qdo_full + 8 * BWD_STAGES;
    m.dq_full = m.qdo_empty + 8 * BWD_STAGES;
    m.dq_empty = m.dq_full + 2 * 8;
    return m;
}

// The copies of query tile `it` into buffer it % BWD_STAGES (head h = first + it / n_q, rows
// i0 = q_first + (it % n_q) BQ): Q and dO by TMA from lane 0, lse and delta by cp.async from the warp
__device__ __forceinline__ void load_query_tile(const BackwardSmem& sm, int it, const TensorMap* q_map,
                                                const TensorMap* do_map, const float* lse, const float* delta,
                                                int b, int first, int n_q, int q_first, int T, int Hq) {
    const int stage = it % BWD_STAGES, h = first + it / n_q, i0 = q_first + (it % n_q) * BQ;
    const unsigned bar = sm.qdo_full + 8 * stage;
    if (threadIdx.x % 32 == 0) {
        mbar_expect_tx(bar, 2 * QT_BYTES);
        tma_rows(sm.q + stage * QT_BYTES, BQ, q_map, h, i0, b, bar);
        tma_rows(sm.dout + stage * QT_BYTES, BQ, do_map, h, i0, b, bar);
    }
    const int lane = threadIdx.x % 32;
    const size_t row = ((size_t)b * Hq + h) * T;
#pragma unroll
    for (int half = 0; half < BQ / 32; half++) {  // lane takes queries lane and lane + 32
        const int r = lane + 32 * half;
        const bool valid = i0 + r < T;
        const size_t at = row + (valid ? i0 + r : 0);
        cp_async4(sm.lse + (stage * BQ + r) * 4, lse + at, valid);
        cp_async4(sm.delta + (stage * BQ + r) * 4, delta + at, valid);
    }
    cp_async_arrive(bar);
}

// Warpgroup 0, warp 0: K and V once, then each query tile's copies into the next buffer once both
// consumers have handed it back (qdo_empty)
__device__ __forceinline__ void backward_load(const BackwardSmem& sm, const TensorMap* q_map, const TensorMap* k_map,
                                              const TensorMap* v_map, const TensorMap* do_map, const float* lse,
                                              const float* delta, int n0, int hk, int b, int first, int n_q,
                                              int q_first, int total, int T, int Hq) {
    if (threadIdx.x == 0) {
        mbar_expect_tx(sm.kv_full, 2 * K_BYTES);
        tma_rows(sm.k, BK, k_map, hk, n0, b, sm.kv_full);
        tma_rows(sm.v, BK, v_map, hk, n0, b, sm.kv_full);
    }
    for (int it = 0; it < total; it++) {
        if (it >= BWD_STAGES) mbar_wait(sm.qdo_empty + 8 * (it % BWD_STAGES), (it / BWD_STAGES - 1) & 1);
        load_query_tile(sm, it, q_map, do_map, lse, delta, b, first, n_q, q_first, T, Hq);
    }
}

// Warpgroup 0, thread 32: each tile's staged dQ, once both consumers have written it (dq_full), added into
// dq by TMA; the staging tile goes back (dq_empty) once the copy engine has read it
__device__ __forceinline__ void backward_add_dq(const BackwardSmem& sm, const TensorMap* dq_map, int b, int first,
                                                int n_q, int q_first, int total) {
    int h = first, i0 = q_first;  // tile it's head and first query (counted, not divided: few registers here)
    for (int it = 0; it < total; it++) {
        const unsigned stage_dq = sm.dq + (it % 2) * DQ_BYTES;
        mbar_wait(sm.dq_full + 8 * (it % 2), (it / 2) & 1);
        if (BWD_ABLATE == 0) {
#pragma unroll
            for (int p = 0; p < HEAD_DIM / 32; p++)
                tma_reduce_add_4d(dq_map, p * 32, h, i0, b, stage_dq + p * (BQ * 128));
        }
        bulk_commit();
        bulk_wait_read<0>();
        mbar_arrive(sm.dq_empty + 8 * (it % 2));
        i0 += BQ;
        if (i0 >= q_first + n_q * BQ) i0 = q_first, h++;
    }
    bulk_wait_all();  // dq's reductions are done before the block's memory goes
}

// A consumer's P^T = exp2(S^T sl2 - lse log2 e) in place in s (float32; key rows kr0, kr0 + 8 of this
// thread, queries 8j + 2t, + 1 of the tile) and as bf16 A fragments in pf (k-step j = queries 16j .. + 15);
// MASKED: a key later than its query's position (q_pos0 + the query's column) gives 0
template <bool MASKED>
__device__ __forceinline__ void backward_p(float* s, unsigned (*pf)[4], const float* lse_t, float sl2, int kr0,
                                           int q_pos0, int t) {
#pragma unroll
    for (int i = 0; i < BQ / 2; i += 2) {
        const int c = (i / 4) * 8 + 2 * t, kr = kr0 + ((i & 2) ? 8 : 0);
        const float2 l = *reinterpret_cast<const float2*>(lse_t + c);  // queries c, c + 1 (c even)
        float p0 = fast_exp2(fmaf(s[i], sl2, -l.x * LOG2E));
        float p1 = fast_exp2(fmaf(s[i + 1], sl2, -l.y * LOG2E));
        if (MASKED) {
            if (kr > q_pos0 + c) p0 = 0.0f;
            if (kr > q_pos0 + c + 1) p1 = 0.0f;
        }
        s[i] = p0;
        s[i + 1] = p1;
        pf[i / 8][(i / 2) % 4] = pack_bf16(p0, p1);
    }
}

extern "C" __global__ void __launch_bounds__(BWD_NT, 1)
flash_attention_backward_sm90(float* dk, float* dv, const __grid_constant__ TensorMap dq_map,
                              const __grid_constant__ TensorMap q_map, const __grid_constant__ TensorMap k_map,
                              const __grid_constant__ TensorMap v_map, const __grid_constant__ TensorMap do_map,
                              const float* lse, const float* delta, int T, int S, int Hq, int Hkv, float scale,
                              int causal) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const BackwardSmem sm = backward_smem((smem_u32(smem_raw) + 1023u) & ~1023u);
    // blockIdx.x -> (key block kb, head hk, batch b): with BWD_HEAVY_FIRST the key block varies slowest, so
    // the blocks that see the most query tiles (causal: the first keys) start first and the light ones
    // fill the last wave; with 0 the key block varies fastest (each head's blocks, heaviest to lightest)
    const int n_kb = (S + BK - 1) / BK, heads = gridDim.x / n_kb;  // heads = Hkv * B
#if BWD_HEAVY_FIRST
    const int kb = blockIdx.x / heads, hb = blockIdx.x % heads;
#else
    const int kb = blockIdx.x % n_kb, hb = blockIdx.x / n_kb;
#endif
    const int n0 = kb * BK, hk = hb % Hkv, b = hb / Hkv, G = Hq / Hkv, offset = S - T;
    const float sl2 = scale * LOG2E;
    // causal: query tiles before the first one whose last query sees key n0 see none of this block
    const int q_first = causal ? max(0, n0 - offset) / BQ * BQ : 0;
    const int n_q = q_first < T ? (T - q_first + BQ - 1) / BQ : 0, total = G * n_q;

    if (threadIdx.x == 0) {
        mbar_init(sm.kv_full, 1);
        for (int i = 0; i < BWD_STAGES; i++) {
            mbar_init(sm.qdo_full + 8 * i, 1 + 32);           // TMA + the loading warp's cp.async
            mbar_init(sm.qdo_empty + 8 * i, CONSUMER_WARPS);  // lane 0 of each consumer warp
        }
        for (int i = 0; i < 2; i++) {
            mbar_init(sm.dq_full + 8 * i, CONSUMER_WARPS);
            mbar_init(sm.dq_empty + 8 * i, 1);
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {  // copies and adds: 24 registers a thread are enough
        regs_release<24>();
        if (threadIdx.x < 32)
            backward_load(sm, &q_map, &k_map, &v_map, &do_map, lse, delta, n0, hk, b, hk * G, n_q, q_first, total, T,
                          Hq);
        else if (threadIdx.x == 32)
            backward_add_dq(sm, &dq_map, b, hk * G, n_q, q_first, total);
        return;
    }
    regs_claim<240>();
    const int wg = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;  // consumer wg
    const int g = lane / 4, t = lane % 4;
    const int kr0 = n0 + wg * 64 + warp * 16 + g;  // this thread's key rows kr0 and kr0 + 8

    float dk_acc[HEAD_DIM / 2], dv_acc[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; i++) dk_acc[i] = dv_acc[i] = 0.0f;
    mbar_wait(sm.kv_full, 0);
#if !BWD_RS_KV
    // this warpgroup's 64 rows of K and V, the A operands of S^T and dP^T
    const u64 k_desc = smem_desc(sm.k + wg * 64 * 128, 16, 1024), v_desc = smem_desc(sm.v + wg * 64 * 128, 16, 1024);
#endif
#if BWD_RS_KV
    // this warp's 16 keys of K and V as A fragments, k-step kk = head dimensions 16kk .. + 15: ldmatrix.x4,
    // lane l gives row l % 16, 16-byte chunk 2 (kk % 4) + l / 16 of panel kk / 4 (matrices (rows +0, k +0),
    // (rows +8, k +0), (rows +0, k +8), (rows +8, k +8) -> a[0 .. 3], the layout wgmma.cuh describes)
    unsigned kf[HEAD_DIM / 16][4], vf[HEAD_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
        const int row = wg * 64 + warp * 16 + (lane & 15);
        const unsigned at = (kk / 4) * (BK * 128) + swizzled(row, (kk % 4) * 32 + (lane >> 4) * 16);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(kf[kk][0]), "=r"(kf[kk][1]), "=r"(kf[kk][2]), "=r"(kf[kk][3])
                     : "r"(sm.k + at));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(vf[kk][0]), "=r"(vf[kk][1]), "=r"(vf[kk][2]), "=r"(vf[kk][3])
                     : "r"(sm.v + at));
    }
#endif

    for (int it = 0; it < total; it++) {
        const int st = it % BWD_STAGES, i0 = q_first + (it % n_q) * BQ;
        const unsigned dst = sm.dst + (it % 2) * DST_BYTES;  // this tile's dS^T (two, alternating: see below)
        mbar_wait(sm.qdo_full + 8 * st, (it / BWD_STAGES) & 1);
        const unsigned qt = sm.q + st * QT_BYTES, dot = sm.dout + st * QT_BYTES;
        const float* lse_t = reinterpret_cast<const float*>(smem_raw + (sm.lse - smem_u32(smem_raw))) + st * BQ;
        const float* delta_t = reinterpret_cast<const float*>(smem_raw + (sm.delta - smem_u32(smem_raw))) + st * BQ;

        // BWD_OVERLAP 1: S^T, then dP^T while P's exponentials run; dV while dS is formed; dK. 0: S^T and
        // dP^T; P and dS; dV, dK (the default, faster at D 64: docs/benchmarks/attention_gpu.md).
        float s[BQ / 2], dp[BQ / 2];  // S^T, dP^T: key rows g, g + 8 of this warp; queries 8j + 2t, + 1
        const u64 q_desc = smem_desc(qt, 16, 1024), do_desc = smem_desc(dot, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            const unsigned qstep = (kk / 4) * (BQ * 128) + (kk % 4) * 32;
#if BWD_RS_KV
            wgmma_rs_n64<0>(s, kf[kk], desc_advance(q_desc, qstep), kk > 0);
#else
            const unsigned step = (kk / 4) * (BK * 128) + (kk % 4) * 32;
            wgmma_ss_n64(s, desc_advance(k_desc, step), desc_advance(q_desc, qstep), kk > 0);
#endif
        }
        if (BWD_OVERLAP) wgmma_commit();  // S^T and dP^T in two groups: P's exponentials need only the first
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; kk++) {
            const unsigned qstep = (kk / 4) * (BQ * 128) + (kk % 4) * 32;
#if BWD_RS_KV
            wgmma_rs_n64<0>(dp, vf[kk], desc_advance(do_desc, qstep), kk > 0);
#else
            const unsigned step = (kk / 4) * (BK * 128) + (kk % 4) * 32;
            wgmma_ss_n64(dp, desc_advance(v_desc, step), desc_advance(do_desc, qstep), kk > 0);
#endif
        }
        wgmma_commit();
        if (BWD_OVERLAP)
            wgmma_wait<1>();  // S^T
        else
            wgmma_wait<0>();
        fence_regs<BQ / 2>(s);

        // a causal tile needs the mask where this warp's last key is later than the tile's first query (on or
        // near the diagonal); the others take the straight block without the comparisons
        const bool masked = causal && n0 + wg * 64 + warp * 16 + 15 > offset + i0;
        unsigned pf[BQ / 16][4], df[BQ / 16][4];  // P^T, dS^T as A operands (k = queries 16j .. 16j + 15)
        if (masked)
            backward_p<true>(s, pf, lse_t, sl2, kr0, offset + i0, t);
        else
            backward_p<false>(s, pf, lse_t, sl2, kr0, offset + i0, t);
        // dV += P^T dO, dK += dS^T Q over queries 16kk .. + 15 (dk: false for dV's products, true for dK's)
        const u64 qt_mn_desc = smem_desc(qt, BQ * 128, 1024), do_mn_desc = smem_desc(dot, BQ * 128, 1024);
        auto add_dkv = [&](bool dk) {
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                const u64 b = desc_advance(dk ? qt_mn_desc : do_mn_desc, kk * 16 * 128);
#if HEAD_DIM == 64
                wgmma_rs_n64(dk ? dk_acc : dv_acc, dk ? df[kk] : pf[kk], b, 1);
#else
                wgmma_rs_n128(dk ? dk_acc : dv_acc, dk ? df[kk] : pf[kk], b, 1);
#endif
            }
        };
        if (BWD_OVERLAP) {  // dV's products run while dS is formed below
            fence_regs<HEAD_DIM / 2>(dv_acc);
            fence_regs<BQ / 16>(pf);
            wgmma_fence();
            add_dkv(false);
            wgmma_commit();
            wgmma_wait<1>();  // dP^T
        }
        fence_regs<BQ / 2>(dp);
#pragma unroll
        for (int i = 0; i < BQ / 2; i += 2) {  // dS^T = P^T (dP^T - delta)
            const float2 d = *reinterpret_cast<const float2*>(delta_t + (i / 4) * 8 + 2 * t);  // queries c, c + 1
            df[i / 8][(i / 2) % 4] = pack_bf16(s[i] * (dp[i] - d.x), s[i + 1] * (dp[i + 1] - d.y));
        }
        {  // dS^T -> shared memory (one panel: BQ = 64), a stmatrix per k-step: lane l gives the address of row
           // l % 8 of matrix l / 8, i.e. key row lr (+ 8 for matrices 1 and 3), 16-byte chunk 2 kk (+ 1 for
           // matrices 2 and 3), swizzled (lr % 8 = l % 8)
            const int rr = lane & 7, m = lane >> 3;
            const unsigned row_at = dst + (wg * 64 + warp * 16 + rr + 8 * (m & 1)) * 128;
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) stmatrix_x4(row_at + ((((2 * kk) | (m >> 1)) ^ rr) << 4), df[kk]);
        }
        fence_regs<HEAD_DIM / 2>(dv_acc);
        fence_regs<HEAD_DIM / 2>(dk_acc);
        fence_regs<BQ / 16>(pf);
        fence_regs<BQ / 16>(df);
        if (!BWD_DQ_FIRST) {
            wgmma_fence();
            if (!BWD_OVERLAP) add_dkv(false);
            add_dkv(true);
            wgmma_commit();
        }

        // this thread's dS^T stores, for the tensor cores, and both consumers' (the one place they meet). A
        // dS^T buffer is written again two tiles on, after the next tile's meeting, which each consumer
        // reaches only once its products that read this one have finished
        fence_proxy_async();
        named_barrier_sync(1, 256);
        // dQ = dS K over all BK keys: with DQ_ONE_WG warpgroup it % 2 computes every column (m64 x D), else
        // each warpgroup its half of the head dimension (fewer registers, more shared-memory reads)
        constexpr int dq_cols = DQ_ONE_WG ? HEAD_DIM : HEAD_DIM / 2;
        const bool dq_here = !DQ_ONE_WG || wg == it % 2;
        float dq_acc[dq_cols / 2];  // dQ (BQ queries, dq_cols columns from col0): rows g, g + 8 of this warp
        const int col0 = DQ_ONE_WG ? 0 : wg * (HEAD_DIM / 2);
        if (dq_here) {
            const u64 dst_desc = smem_desc(dst, BQ * 128, 1024);
            const unsigned k_cols = sm.k + (col0 / 64) * (BK * 128) + 2 * (col0 % 64);  // K's columns col0 ..
            const u64 k_cols_desc = smem_desc(k_cols, BK * 128, 1024);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {  // keys 16kk .. + 15 of both warpgroups
                const u64 a = desc_advance(dst_desc, kk * 16 * 128);
                const u64 bk = desc_advance(k_cols_desc, kk * 16 * 128);
#if DQ_ONE_WG || HEAD_DIM == 128
                wgmma_ss_tt_n64(dq_acc, a, bk, kk > 0);
#else
                wgmma_ss_tt_n32(dq_acc, a, bk, kk > 0);
#endif
            }
            wgmma_commit();
        }
        if (BWD_DQ_FIRST) {  // dV, dK issued behind dQ; only dQ is waited for
            wgmma_fence();
            add_dkv(false);
            add_dkv(true);
            wgmma_commit();
            wgmma_wait<1>();
            fence_regs<dq_cols / 2>(dq_acc);
        } else {
            wgmma_wait<0>();
            fence_regs<dq_cols / 2>(dq_acc);
            fence_regs<HEAD_DIM / 2>(dv_acc);
            fence_regs<HEAD_DIM / 2>(dk_acc);
            fence_regs<BQ / 16>(pf);
            fence_regs<BQ / 16>(df);
            __syncwarp();  // the warp's reads of lse and delta come before lane 0's arrival
            release(sm.qdo_empty + 8 * st);  // every product that reads Q and dO has finished
        }

        // dQ (scaled) -> staging tile it % 2, once tile it - 2's adds have read it: columns col0 .. (float32
        // panels of 32 columns); 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its 128-byte row (the TMA
        // map's swizzle)
        const unsigned stage_dq = sm.dq + (it % 2) * DQ_BYTES;
        if (dq_here) {
            if (it >= 2) mbar_wait(sm.dq_empty + 8 * (it % 2), (it / 2 - 1) & 1);
#pragma unroll
            for (int j = 0; j < dq_cols / 8; j++) {
                const int col = col0 + 8 * j + 2 * t, panel = col / 32, c = col % 32;
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int row = warp * 16 + g + 8 * r;
                    const unsigned at = stage_dq + panel * (BQ * 128) + swizzled(row, 4 * c);
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(dq_acc[4 * j + 2 * r] * scale),
                                 "f"(dq_acc[4 * j + 2 * r + 1] * scale));
                }
            }
            fence_proxy_async();  // the staging stores, for the copy engine
        }
        __syncwarp();
        release(sm.dq_full + 8 * (it % 2));  // every consumer warp, staging or not
        if (BWD_DQ_FIRST) {  // dK, dV have finished (before the loop's end: ptxas serialises every wgmma else)
            wgmma_wait<0>();
            fence_regs<HEAD_DIM / 2>(dv_acc);
            fence_regs<HEAD_DIM / 2>(dk_acc);
            __syncwarp();  // the warp's reads of lse and delta come before lane 0's arrival
            release(sm.qdo_empty + 8 * st);  // every product that reads Q and dO has finished
        }
    }
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
