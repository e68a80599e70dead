// FlashAttention forward and backward on the bf16 tensor cores: mma.sync m16n8k16, fp32 accumulation.
//
// Same contract as flash_attention_tf32.cu, except that q, k, v, out and dout are bfloat16: uint16 arrays of
// bf16 bit patterns (as cast.cu writes them). Layouts: q, out, dout (B, T, Hq, D); k, v (B, S, Hkv, D);
// lse, delta (B, Hq, T) float32; the backward returns float32 dq (B, T, Hq, D), dk and dv (B, S, Hkv, D).
// Query t sits at position S - T + t (causal: it sees keys 0..S - T + t); query head h reads kv head
// h / (Hq / Hkv); lse is the natural-log log-sum-exp of the scaled scores (scale = D^-0.5).
// Scores, softmax and every sum are fp32; only the mma operands are bf16 (P and dS are rounded to bf16,
// round to nearest even, just before they enter a product).
//
// Fragments of mma.m16n8k16 (g = lane / 4, t = lane % 4; a 32-bit register holds two bf16, the lower
// column / k index in the low half):
//   A (16 x 16, row-major): a0 (g, 2t..2t+1), a1 (g+8, 2t..2t+1), a2 (g, 2t+8..2t+9), a3 (g+8, 2t+8..2t+9)
//   B (16 x 8, k x n):      b0 (k 2t..2t+1, n g), b1 (k 2t+8..2t+9, n g)
//   C (16 x 8, f32):        c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
// Two C fragments of adjacent 8-column n-tiles, packed to bf16, are exactly one A fragment whose k runs
// over those 16 columns (a0 = c[2j][0..1], a1 = c[2j][2..3], a2 = c[2j+1][0..1], a3 = c[2j+1][2..3]):
// that is how P (forward) and P^T, dS^T (backward) go from one product into the next without shared memory.
//
// Operands come from shared memory through ldmatrix (four 8 x 8 matrices per x4 call; lane i gives the
// row address of matrix i / 8, row i % 8; lane (g, t) receives row g, columns 2t..2t+1 of each matrix,
// or with .trans rows 2t..2t+1 of column g). For a tile stored row-major with rows r and columns c:
//   A(i, k) = tile[i][k]          ldmatrix         (Q in the forward, K and V in the backward)
//   B(k, n) = tile[n][k]          ldmatrix         (K for S = Q K^T, Q and dO as B of K Q^T and V dO^T)
//   B(k, n) = tile[k][n]          ldmatrix.trans   (V for P V, dO for P^T dO, Q for dS^T Q, K for dS K)
//   A(i, k) = tile[k][i]          ldmatrix.trans   (dS read from the stored dS^T)
// Tiles are staged global -> shared with 16-byte cp.async (zero-filled past the end of the sequence) into
// rows padded by 8 bf16 (16 bytes), so the 8 row addresses of one ldmatrix fall in 8 distinct bank quads.
#include "common.cuh"
#include "flash_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define WARPS 4
#define NT (32 * WARPS)
#define BM 64                            // forward: query rows per block, 16 per warp
#define BN 64                            // key rows per tile (forward and backward)
#define BQ (HEAD_DIM == 64 ? 64 : 32)    // backward: query rows per tile (32 for D = 128: registers, smem)
#define LD (HEAD_DIM + 8)                // padded row stride (bf16) of the (rows, D) tiles
#define LDS (BQ + 8)                     // padded row stride (bf16) of the (BN, BQ) dS^T tile
#define KD (HEAD_DIM / 16)               // k-steps of 16 over the head dimension
#define DT (HEAD_DIM / 8)                // n-tiles of 8 over the head dimension
// Blocks per SM that __launch_bounds__ asks registers for (at most 65536 / (128 n) each; -D to tune): at
// D = 64 three (shared memory would allow four, but n = 4 spills; the backward's third block costs it a
// small spill), at D = 128 two. ptxas's register counts: docs/benchmarks/attention_gpu.md.
#ifndef FWD_MIN_BLOCKS
#define FWD_MIN_BLOCKS (HEAD_DIM == 64 ? 3 : 2)
#endif
#ifndef BWD_MIN_BLOCKS
#define BWD_MIN_BLOCKS (HEAD_DIM == 64 ? 3 : 2)
#endif


// --- small device helpers -------------------------------------------------------------------------------
__device__ __forceinline__ void ldsm_x4(unsigned* r, const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned* r, const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// Four C fragments (n-tiles 2j, 2j + 1 for j = 0, 1 ... ) -> the A fragment of k-step j (see the header)
__device__ __forceinline__ void c_to_a(unsigned* a, const float* c0, const float* c1) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// Row address that lane gives ldmatrix.x4 for an A fragment (or B fragments of 2 n-tiles at one k-step)
// of a row-major tile: matrices (rows +0, cols +0), (rows +8, cols +0), (rows +0, cols +8), (rows +8, cols +8).
__device__ __forceinline__ const bf16_t* a_addr(const bf16_t* tile, int ld, int r0, int c0, int lane) {
    return tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8;
}
// Same for B fragments of two n-tiles read as B(k, n) = tile[n][k]: matrices (n +0, k +0), (n +0, k +8),
// (n +8, k +0), (n +8, k +8) -> registers b0, b1 of n-tile n0 / 8, then b0, b1 of n-tile n0 / 8 + 1.
__device__ __forceinline__ const bf16_t* bt_addr(const bf16_t* tile, int ld, int n0, int k0, int lane) {
    return tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}
// B fragments of two n-tiles read as B(k, n) = tile[k][n] with ldmatrix.trans: matrices (k +0, n +0),
// (k +8, n +0), (k +0, n +8), (k +8, n +8) -> b0, b1 of n-tile n0 / 8, then b0, b1 of n-tile n0 / 8 + 1.
__device__ __forceinline__ const bf16_t* b_addr(const bf16_t* tile, int ld, int k0, int n0, int lane) {
    return tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}
// A fragment A(i, k) = tile[k0 + k][i0 + i] with ldmatrix.trans: matrices (k +0, i +0) -> a0,
// (k +0, i +8) -> a1, (k +8, i +0) -> a2, (k +8, i +8) -> a3.
__device__ __forceinline__ const bf16_t* at_addr(const bf16_t* tile, int ld, int k0, int i0, int lane) {
    return tile + (k0 + (lane & 7) + (lane >> 4) * 8) * ld + i0 + ((lane >> 3) & 1) * 8;
}

// Stage ROWS rows of D bf16 (global row stride `stride` elements) starting at row `row0` into a tile of
// row stride LD; rows at or past `limit` are zero-filled (their source address is clamped to row 0).
template <int ROWS>
__device__ __forceinline__ void load_tile(bf16_t* tile, const bf16_t* src, int row0, int limit,
                                          size_t stride) {
    constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte pieces per row
    static_assert(ROWS * CHUNKS % NT == 0, "every thread copies the same number of pieces");
#pragma unroll
    for (int j = 0; j < ROWS * CHUNKS / NT; j++) {
        const int i = threadIdx.x + j * NT, r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool valid = row0 + r < limit;
        cp_async16(tile + r * LD + c, src + (size_t)(valid ? row0 + r : 0) * stride + c, valid);
    }
}

// --- forward --------------------------------------------------------------------------------------------
// One block per (64-query tile, query head, batch); warp w owns queries 16w..16w+15 of the tile, keeps
// their Q fragments in registers and runs the online softmax over 64-key tiles of K and V, which are
// double-buffered in shared memory (the next tile is copied while this one is multiplied).
// Shared memory: Qs (BM, LD), Ks 2 x (BN, LD), Vs 2 x (BN, LD): 2 * 320 * LD bytes.
extern "C" __global__ void __launch_bounds__(NT, FWD_MIN_BLOCKS)
flash_attention_forward_bf16(bf16_t* out, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v, int T,
                             int S, int Hq, int Hkv, float scale, int causal) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16_t* Qs = reinterpret_cast<bf16_t*>(smem_raw);  // (BM, LD)
    bf16_t* Ks = Qs + BM * LD;                          // 2 x (BN, LD)
    bf16_t* Vs = Ks + 2 * BN * LD;                      // 2 x (BN, LD)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // the last query tiles see the most keys under a causal mask: start them first
    const int q0 = (gridDim.x - 1 - blockIdx.x) * BM, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const int offset = S - T, row0 = warp * 16;
    const size_t q_stride = (size_t)Hq * HEAD_DIM, kv_stride = (size_t)Hkv * HEAD_DIM;
    const bf16_t* kb = k + (size_t)b * S * kv_stride + hk * HEAD_DIM;
    const bf16_t* vb = v + (size_t)b * S * kv_stride + hk * HEAD_DIM;
    const float sl2 = scale * LOG2E;  // scores -> log2 units
    const int kv_end = causal ? min(S, offset + min(q0 + BM, T)) : S;  // causal: skip tiles past the block
    const int n_tiles = (kv_end + BN - 1) / BN;

    load_tile<BM>(Qs, q + (size_t)b * T * q_stride + h * HEAD_DIM, q0, T, q_stride);
    load_tile<BN>(Ks, kb, 0, S, kv_stride);
    load_tile<BN>(Vs, vb, 0, S, kv_stride);
    cp_async_commit();

    unsigned qf[KD][4];  // this warp's 16 query rows as A fragments (k = head dim)
    float o[DT][4];      // O accumulator: rows g, g + 8; dims nd * 8 + 2t, + 1
    float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (log2 units)
    float l[2] = {0.0f, 0.0f};            // this thread's share of the running sums (quad-summed at the end)
#pragma unroll
    for (int nd = 0; nd < DT; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    // positions of rows g and g + 8; padding rows (t >= T) borrow the last real one
    const int pos0 = offset + min(q0 + row0 + g, T - 1), pos1 = offset + min(q0 + row0 + g + 8, T - 1);

    for (int it = 0; it < n_tiles; it++) {
        const int k0 = it * BN, buf = it & 1;
        if (it + 1 < n_tiles) {  // prefetch the next K and V tiles into the other buffer
            load_tile<BN>(Ks + (buf ^ 1) * BN * LD, kb, k0 + BN, S, kv_stride);
            load_tile<BN>(Vs + (buf ^ 1) * BN * LD, vb, k0 + BN, S, kv_stride);
        }
        cp_async_commit();    // (maybe empty) group, so that "all but the newest" below is this tile
        cp_async_wait<1>();
        __syncthreads();      // this tile (and Q) is in shared memory for every warp
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KD; kk++) ldsm_x4(qf[kk], a_addr(Qs, LD, row0, kk * 16, lane));
        }
        const bf16_t* Kt = Ks + buf * BN * LD;
        const bf16_t* Vt = Vs + buf * BN * LD;

        float s[BN / 8][4];  // raw scores Q K^T: rows g, g + 8; keys n * 8 + 2t, + 1
#pragma unroll
        for (int n = 0; n < BN / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++)
#pragma unroll
            for (int np = 0; np < BN / 16; np++) {
                unsigned kf[4];  // B(d, key) = K[key][d] for keys np * 16 .. + 15, dims kk * 16 .. + 15
                ldsm_x4(kf, bt_addr(Kt, LD, np * 16, kk * 16, lane));
                mma_bf16(s[2 * np], qf[kk], kf[0], kf[1]);
                mma_bf16(s[2 * np + 1], qf[kk], kf[2], kf[3]);
            }
        // mask only tiles that reach past S or past this warp's first position (warp-uniform branch)
        if (k0 + BN > S || (causal && k0 + BN - 1 > offset + q0 + row0)) {
#pragma unroll
            for (int n = 0; n < BN / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + n * 8 + 2 * t + (e & 1);
                    if (key >= S || (causal && key > (e < 2 ? pos0 : pos1))) s[n][e] = -INFINITY;
                }
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < BN / 8; n++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
        }
        float alpha[2], m_new[2];
        update_running_max(m, l, mx, sl2, m_new, alpha);
#pragma unroll
        for (int n = 0; n < BN / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = fast_exp2(fmaf(s[n][e], sl2, -m_new[e >> 1]));  // p, unnormalised
                l[e >> 1] += s[n][e];
            }
#pragma unroll
        for (int nd = 0; nd < DT; nd++) {
            o[nd][0] *= alpha[0];
            o[nd][1] *= alpha[0];
            o[nd][2] *= alpha[1];
            o[nd][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {  // O += P V over keys kk * 16 .. + 15
            unsigned pf[4];
            c_to_a(pf, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < DT / 2; np++) {
                unsigned vf[4];  // B(key, d) = V[key][d] for dims np * 16 .. + 15
                ldsm_x4_t(vf, b_addr(Vt, LD, kk * 16, np * 16, lane));
                mma_bf16(o[2 * np], pf, vf[0], vf[1]);
                mma_bf16(o[2 * np + 1], pf, vf[2], vf[3]);
            }
        }
        __syncthreads();  // every warp is done with this buffer before the next prefetch overwrites it
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int tq = q0 + row0 + g + 8 * r;
        const float sum = quad_sum(l[r]);  // all lanes take part in the shuffle
        if (tq >= T) continue;
        const float inv = 1.0f / sum;
        bf16_t* orow = out + ((size_t)b * T + tq) * q_stride + h * HEAD_DIM;
#pragma unroll
        for (int nd = 0; nd < DT; nd++)
            *reinterpret_cast<unsigned*>(orow + nd * 8 + 2 * t) =
                pack_bf16(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
        if (t == 0) lse[((size_t)b * Hq + h) * T + tq] = (m[r] + log2f(sum)) * LN2;
    }
}

// --- backward -------------------------------------------------------------------------------------------
// The backward's preprocessing, one pass: delta[b, h, t] = sum_d dout * out over one row (fp32 sums of the
// bf16 values), and the row of dq zeroed (the backward kernels add into it). 8 lanes per (b, t, h) row, each
// reading 16 bytes (8 bf16) of dout and out and zeroing 32 bytes of dq per step; the 8 lanes' sums meet in 3
// shuffles.
extern "C" __global__ void flash_attention_delta_bf16(float* delta, float* dq, const bf16_t* dout, const bf16_t* out,
                                                      int T, int Hq, long long n_rows) {
    const long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 3;  // (b * T + t) * Hq + h
    const int part = threadIdx.x & 7;
    float acc = 0.0f;
    if (row < n_rows) {
        for (int d = 8 * part; d < HEAD_DIM; d += 64) {
            const uint4 x = *reinterpret_cast<const uint4*>(dout + row * HEAD_DIM + d);
            const uint4 y = *reinterpret_cast<const uint4*>(out + row * HEAD_DIM + d);
            acc += bf16_lo(x.x) * bf16_lo(y.x) + bf16_hi(x.x) * bf16_hi(y.x) + bf16_lo(x.y) * bf16_lo(y.y) +
                   bf16_hi(x.y) * bf16_hi(y.y) + bf16_lo(x.z) * bf16_lo(y.z) + bf16_hi(x.z) * bf16_hi(y.z) +
                   bf16_lo(x.w) * bf16_lo(y.w) + bf16_hi(x.w) * bf16_hi(y.w);
            float4* zero = reinterpret_cast<float4*>(dq + row * HEAD_DIM + d);
            zero[0] = zero[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    for (int offset = 4; offset > 0; offset >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, offset);
    if (row >= n_rows || part != 0) return;
    const long long b = row / ((long long)T * Hq), t = (row / Hq) % T, h = row % Hq;
    delta[(b * Hq + h) * T + t] = acc;
}

// One block per (64-key tile, kv head, batch). Warp w owns keys 16w..16w+15: it computes S^T = K Q^T and
// dP^T = V dO^T for its keys against each BQ-query tile (of each query head in the group), and keeps dK,
// dV of its keys in registers (no atomics). P^T and dS^T stay in registers as A fragments for
// dV += P^T dO and dK += dS^T Q; dS^T also goes to shared memory (bf16), where dQ = dS K reads it
// transposed: warp w then owns queries 16 (w % (BQ / 16)) .. + 15 and the head-dimension slice
// w / (BQ / 16) of dQ, and adds it to global memory with atomics (dq must be zeroed first).
// Q and dO tiles (and their lse, delta) are double-buffered across the (head, query tile) iterations.
// Shared memory: Ks, Vs (BN, LD); Qs, dOs 2 x (BQ, LD); dSt (BN, LDS) bf16; lse2_s, delta_s 2 x BQ floats.
#define DQ_GROUPS (BQ / 16)               // 16-query row groups of dQ
#define DQ_SLICES (WARPS / DQ_GROUPS)     // head-dimension slices of dQ
#define DQ_WIDTH (HEAD_DIM / DQ_SLICES)   // dims per slice

__device__ __forceinline__ void red_add2(float* p, float a, float b) {  // p[0] += a, p[1] += b (sm_90)
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}

extern "C" __global__ void __launch_bounds__(NT, BWD_MIN_BLOCKS)
flash_attention_backward_bf16(float* dq, float* dk, float* dv, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                              const bf16_t* dout, const float* lse, const float* delta, int T, int S, int Hq,
                              int Hkv, float scale, int causal) {
    static_assert(BQ % 16 == 0 && WARPS % DQ_GROUPS == 0 && DQ_WIDTH % 16 == 0 && 2 * BQ <= NT, "tiling");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16_t* Ks = reinterpret_cast<bf16_t*>(smem_raw);  // (BN, LD)
    bf16_t* Vs = Ks + BN * LD;                          // (BN, LD)
    bf16_t* Qs = Vs + BN * LD;                          // 2 x (BQ, LD)
    bf16_t* dOs = Qs + 2 * BQ * LD;                     // 2 x (BQ, LD)
    bf16_t* dSt = dOs + 2 * BQ * LD;                    // (BN, LDS): dS^T, keys x queries
    float* lse2_s = reinterpret_cast<float*>(dSt + BN * LDS);  // 2 x BQ: lse * log2(e)
    float* delta_s = lse2_s + 2 * BQ;                          // 2 x BQ
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int k0 = blockIdx.x * BN, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    const int offset = S - T, row0 = warp * 16;
    const size_t q_stride = (size_t)Hq * HEAD_DIM, kv_stride = (size_t)Hkv * HEAD_DIM;
    const float sl2 = scale * LOG2E;
    // causal: the first query that sees key k0 is at t = k0 - offset (< T since k0 < S)
    const int q_begin = causal ? (max(0, k0 - offset) / BQ) * BQ : 0;
    const int n_qt = (T - q_begin + BQ - 1) / BQ, n_it = group * n_qt;  // iterations: (head, query tile)

    // Issue the copies of iteration i's Q and dO tiles into buffer i & 1 and return its lse, delta entry
    // for thread threadIdx.x < 2 BQ (lse2 for the first BQ threads, delta for the next BQ).
    auto prefetch = [&](int i) -> float {
        const int h = hk * group + i / n_qt, q0 = q_begin + (i % n_qt) * BQ, buf = i & 1;
        const size_t base = (size_t)b * T * q_stride + h * HEAD_DIM;
        load_tile<BQ>(Qs + buf * BQ * LD, q + base, q0, T, q_stride);
        load_tile<BQ>(dOs + buf * BQ * LD, dout + base, q0, T, q_stride);
        const int r = threadIdx.x % BQ, tq = q0 + r;
        const size_t row = ((size_t)b * Hq + h) * T + tq;
        if (threadIdx.x < BQ) return tq < T ? lse[row] * LOG2E : 0.0f;  // padding queries are masked below
        if (threadIdx.x < 2 * BQ) return tq < T ? delta[row] : 0.0f;
        return 0.0f;
    };
    auto store_rows = [&](int i, float x) {  // the value from prefetch(i) into its buffer
        const int buf = i & 1;
        if (threadIdx.x < BQ) lse2_s[buf * BQ + threadIdx.x] = x;
        else if (threadIdx.x < 2 * BQ) delta_s[buf * BQ + threadIdx.x - BQ] = x;
    };

    load_tile<BN>(Ks, k + (size_t)b * S * kv_stride + hk * HEAD_DIM, k0, S, kv_stride);
    load_tile<BN>(Vs, v + (size_t)b * S * kv_stride + hk * HEAD_DIM, k0, S, kv_stride);
    store_rows(0, prefetch(0));  // read after the first __syncthreads below
    cp_async_commit();

    float dk_acc[DT][4], dv_acc[DT][4];  // keys row0 + g (+ 8), dims nd * 8 + 2t (+ 1)
#pragma unroll
    for (int nd = 0; nd < DT; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk_acc[nd][e] = dv_acc[nd][e] = 0.0f;

    for (int it = 0; it < n_it; it++) {
        const int h = hk * group + it / n_qt, q0 = q_begin + (it % n_qt) * BQ, buf = it & 1;
        float next_row = 0.0f;
        if (it + 1 < n_it) next_row = prefetch(it + 1);  // lands in registers while this tile is computed
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();  // this iteration's Q, dO (and K, V the first time) are in shared memory
        const bf16_t* Qt = Qs + buf * BQ * LD;
        const bf16_t* dOt = dOs + buf * BQ * LD;
        const float* lse2_t = lse2_s + buf * BQ;
        const float* delta_t = delta_s + buf * BQ;

        // S^T = K Q^T: rows keys row0 + g (+ 8), columns queries n * 8 + 2t (+ 1)
        float st[BQ / 8][4];
#pragma unroll
        for (int n = 0; n < BQ / 8; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            unsigned kf[4];
            ldsm_x4(kf, a_addr(Ks, LD, row0, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < BQ / 16; np++) {
                unsigned qf[4];  // B(d, query) = Q[query][d]
                ldsm_x4(qf, bt_addr(Qt, LD, np * 16, kk * 16, lane));
                mma_bf16(st[2 * np], kf, qf[0], qf[1]);
                mma_bf16(st[2 * np + 1], kf, qf[2], qf[3]);
            }
        }
        // P^T = exp(S^T scale - lse), zero where masked: keys past S, padding queries, causal
        const bool need_mask = k0 + BN > S || q0 + BQ > T || (causal && k0 + row0 + 15 > offset + q0);
#pragma unroll
        for (int n = 0; n < BQ / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = n * 8 + 2 * t + (e & 1);
                float p = fast_exp2(fmaf(st[n][e], sl2, -lse2_t[qc]));
                if (need_mask) {
                    const int key = k0 + row0 + g + 8 * (e >> 1), query = q0 + qc;
                    if (key >= S || query >= T || (causal && key > offset + query)) p = 0.0f;
                }
                st[n][e] = p;
            }
        unsigned pt[BQ / 16][4];  // P^T as A fragments (keys x queries), k-step = 16 queries
#pragma unroll
        for (int kq = 0; kq < BQ / 16; kq++) c_to_a(pt[kq], st[2 * kq], st[2 * kq + 1]);

        // dV += P^T dO
#pragma unroll
        for (int kq = 0; kq < BQ / 16; kq++)
#pragma unroll
            for (int np = 0; np < DT / 2; np++) {
                unsigned df[4];  // B(query, d) = dO[query][d]
                ldsm_x4_t(df, b_addr(dOt, LD, kq * 16, np * 16, lane));
                mma_bf16(dv_acc[2 * np], pt[kq], df[0], df[1]);
                mma_bf16(dv_acc[2 * np + 1], pt[kq], df[2], df[3]);
            }

        // dP^T = V dO^T, same layout as S^T
        float dpt[BQ / 8][4];
#pragma unroll
        for (int n = 0; n < BQ / 8; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            unsigned vf[4];
            ldsm_x4(vf, a_addr(Vs, LD, row0, kk * 16, lane));
#pragma unroll
            for (int np = 0; np < BQ / 16; np++) {
                unsigned df[4];  // B(d, query) = dO[query][d]
                ldsm_x4(df, bt_addr(dOt, LD, np * 16, kk * 16, lane));
                mma_bf16(dpt[2 * np], vf, df[0], df[1]);
                mma_bf16(dpt[2 * np + 1], vf, df[2], df[3]);
            }
        }
        // dS^T = P^T (dP^T - delta), from the bf16 P^T of the dV product; into registers and into dSt
        unsigned dst_f[BQ / 16][4];
#pragma unroll
        for (int kq = 0; kq < BQ / 16; kq++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {  // n-tile 2 kq + half
                const int n = 2 * kq + half, qc = n * 8 + 2 * t;
                const float d0 = delta_t[qc], d1 = delta_t[qc + 1];
                const unsigned top = pt[kq][2 * half], bottom = pt[kq][2 * half + 1];  // rows g, g + 8
                const unsigned r0 = pack_bf16(bf16_lo(top) * (dpt[n][0] - d0), bf16_hi(top) * (dpt[n][1] - d1));
                const unsigned r1 =
                    pack_bf16(bf16_lo(bottom) * (dpt[n][2] - d0), bf16_hi(bottom) * (dpt[n][3] - d1));
                dst_f[kq][2 * half] = r0;
                dst_f[kq][2 * half + 1] = r1;
                *reinterpret_cast<unsigned*>(dSt + (row0 + g) * LDS + qc) = r0;
                *reinterpret_cast<unsigned*>(dSt + (row0 + g + 8) * LDS + qc) = r1;
            }
        }
        // dK += dS^T Q
#pragma unroll
        for (int kq = 0; kq < BQ / 16; kq++)
#pragma unroll
            for (int np = 0; np < DT / 2; np++) {
                unsigned qf[4];  // B(query, d) = Q[query][d]
                ldsm_x4_t(qf, b_addr(Qt, LD, kq * 16, np * 16, lane));
                mma_bf16(dk_acc[2 * np], dst_f[kq], qf[0], qf[1]);
                mma_bf16(dk_acc[2 * np + 1], dst_f[kq], qf[2], qf[3]);
            }
        __syncthreads();  // dSt holds every warp's keys

        // dQ (this warp's 16 queries x DQ_WIDTH dims) = dS K over the tile's 64 keys, added with atomics
        {
            const int qr0 = 16 * (warp % DQ_GROUPS), d0 = DQ_WIDTH * (warp / DQ_GROUPS);
            unsigned dsf[BN / 16][4];  // A(query, key) = dSt[key][query]
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) ldsm_x4_t(dsf[kk], at_addr(dSt, LDS, kk * 16, qr0, lane));
            const int tq0 = q0 + qr0 + g, tq1 = tq0 + 8;
            float* dq0 = dq + ((size_t)b * T + tq0) * q_stride + h * HEAD_DIM + d0 + 2 * t;
            float* dq1 = dq0 + 8 * q_stride;
#pragma unroll
            for (int np = 0; np < DQ_WIDTH / 16; np++) {
                float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    unsigned kf[4];  // B(key, d) = K[key][d]
                    ldsm_x4_t(kf, b_addr(Ks, LD, kk * 16, d0 + np * 16, lane));
                    mma_bf16(acc[0], dsf[kk], kf[0], kf[1]);
                    mma_bf16(acc[1], dsf[kk], kf[2], kf[3]);
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {  // n-tile 2 np + j: dims np * 16 + j * 8 + 2t, + 1
                    if (tq0 < T) red_add2(dq0 + np * 16 + j * 8, acc[j][0] * scale, acc[j][1] * scale);
                    if (tq1 < T) red_add2(dq1 + np * 16 + j * 8, acc[j][2] * scale, acc[j][3] * scale);
                }
            }
        }
        if (it + 1 < n_it) store_rows(it + 1, next_row);  // that buffer was last read before the top sync
        __syncthreads();  // every warp is done with this buffer and dSt before they are overwritten
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = k0 + row0 + g + 8 * r;
        if (key >= S) continue;
        float* dk_row = dk + ((size_t)b * S + key) * kv_stride + hk * HEAD_DIM;
        float* dv_row = dv + ((size_t)b * S + key) * kv_stride + hk * HEAD_DIM;
#pragma unroll
        for (int nd = 0; nd < DT; nd++) {
            *reinterpret_cast<float2*>(dk_row + nd * 8 + 2 * t) =
                make_float2(dk_acc[nd][2 * r] * scale, dk_acc[nd][2 * r + 1] * scale);
            *reinterpret_cast<float2*>(dv_row + nd * 8 + 2 * t) = make_float2(dv_acc[nd][2 * r], dv_acc[nd][2 * r + 1]);
        }
    }
}
