// FlashAttention forward and backward on the tensor cores: TF32 mma.sync (m16n8k8), fp32 accumulation.
//
// Same contract as flash_attention.cu (layouts, positions, GQA, log-sum-exp); operands are rounded to
// TF32 (10-bit mantissa) when they are staged in shared memory, so results agree with fp32 to about 1e-3.
// A block is 4 warps; each warp owns 16 rows of a 64-row tile. Fragment layouts of m16n8k8 (g = lane / 4,
// t = lane % 4): A (16 x 8): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4);
// B (8 x 8): b0 (t, g), b1 (t + 4, g); C (16 x 8): c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t), c3 (g + 8, 2t + 1).
#include "common.cuh"
#include "flash_common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define TILE 64                 // query and key rows per tile
#define WARPS 4
#define NT (32 * WARPS)
#define KPAD (HEAD_DIM + 4)     // row stride for tiles read as (g, t) fragments: banks 4g + t
#define VPAD (HEAD_DIM + 8)     // row stride for tiles read as (t, g) fragments: banks 8t + g
#define PPAD (TILE + 4)
#define KSTEPS (HEAD_DIM / 8)   // k-steps over the head dimension
#define DT (HEAD_DIM / 8)       // n-tiles over the head dimension

__device__ __forceinline__ float tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return __uint_as_float(r);
}

// c += a b on the tensor cores (operands already TF32-rounded floats)
__device__ __forceinline__ void mma(float* c, const float* a, const float* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
}

// A fragment of rows r0.. r0+15, columns c0.. c0+7 of a row-major tile (stride ld)
__device__ __forceinline__ void load_a(float* a, const float* tile, int ld, int r0, int c0, int g, int t) {
    a[0] = tile[(r0 + g) * ld + c0 + t];
    a[1] = tile[(r0 + g + 8) * ld + c0 + t];
    a[2] = tile[(r0 + g) * ld + c0 + t + 4];
    a[3] = tile[(r0 + g + 8) * ld + c0 + t + 4];
}

// A fragment read from the transpose of a row-major tile: A(i, j) = tile[c0 + j][r0 + i]
__device__ __forceinline__ void load_a_t(float* a, const float* tile, int ld, int r0, int c0, int g, int t) {
    a[0] = tile[(c0 + t) * ld + r0 + g];
    a[1] = tile[(c0 + t) * ld + r0 + g + 8];
    a[2] = tile[(c0 + t + 4) * ld + r0 + g];
    a[3] = tile[(c0 + t + 4) * ld + r0 + g + 8];
}

// B fragment (k x n = 8 x 8) where B(k, n) = tile[n0 + n][k0 + k] (the tile holds B transposed)
__device__ __forceinline__ void load_b_t(float* b, const float* tile, int ld, int k0, int n0, int g, int t) {
    b[0] = tile[(n0 + g) * ld + k0 + t];
    b[1] = tile[(n0 + g) * ld + k0 + t + 4];
}

// B fragment where B(k, n) = tile[k0 + k][n0 + n] (the tile holds B as is)
__device__ __forceinline__ void load_b(float* b, const float* tile, int ld, int k0, int n0, int g, int t) {
    b[0] = tile[(k0 + t) * ld + n0 + g];
    b[1] = tile[(k0 + t + 4) * ld + n0 + g];
}

// Stage TILE rows of D floats (row stride `stride`) into shared memory, scaled and TF32-rounded;
// rows at or past `limit` become zeros.
__device__ __forceinline__ void stage(float* tile, int ld, const float* src, int row0, int limit, size_t stride,
                                      float scale) {
    for (int idx = threadIdx.x; idx < TILE * HEAD_DIM / 4; idx += NT) {
        const int r = idx / (HEAD_DIM / 4), d = (idx % (HEAD_DIM / 4)) * 4;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row0 + r < limit) x = *reinterpret_cast<const float4*>(src + (size_t)(row0 + r) * stride + d);
        float* dst = tile + r * ld + d;
        dst[0] = tf32(x.x * scale);
        dst[1] = tf32(x.y * scale);
        dst[2] = tf32(x.z * scale);
        dst[3] = tf32(x.w * scale);
    }
}

extern "C" __global__ void __launch_bounds__(NT)
flash_attention_forward_tf32(float* out, float* lse, const float* q, const float* k, const float* v, int T,
                             int S, int Hq, int Hkv, float scale, int causal) {
    extern __shared__ float smem[];
    float* Qs = smem;                   // (TILE, KPAD), pre-scaled by scale * log2(e)
    float* Ks = Qs + TILE * KPAD;       // (TILE, KPAD)
    float* Vs = Ks + TILE * KPAD;       // (TILE, VPAD)
    float* Ps = Vs + TILE * VPAD;       // (WARPS * 16, PPAD): each warp's probabilities
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int q0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const int offset = S - T, row0 = warp * 16;
    const size_t q_stride = (size_t)Hq * HEAD_DIM, kv_stride = (size_t)Hkv * HEAD_DIM;
    const float* kb = k + (size_t)b * S * kv_stride + hk * HEAD_DIM;
    const float* vb = v + (size_t)b * S * kv_stride + hk * HEAD_DIM;
    stage(Qs, KPAD, q + (size_t)b * T * q_stride + h * HEAD_DIM, q0, T, q_stride, scale * LOG2E);
    __syncthreads();
    float qf[KSTEPS][4];  // this warp's 16 query rows as A fragments, kept in registers
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ks++) load_a(qf[ks], Qs, KPAD, row0, ks * 8, g, t);

    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nd = 0; nd < DT; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    const int pos[2] = {offset + min(q0 + row0 + g, T - 1), offset + min(q0 + row0 + g + 8, T - 1)};
    float* Pw = Ps + row0 * PPAD;
    const int kv_end = causal ? min(S, offset + min(q0 + TILE, T)) : S;
    for (int k0 = 0; k0 < kv_end; k0 += TILE) {
        __syncthreads();  // every warp is done with the previous K and V
        stage(Ks, KPAD, kb, k0, S, kv_stride, 1.0f);
        stage(Vs, VPAD, vb, k0, S, kv_stride, 1.0f);
        __syncthreads();
        float s[8][4];  // scores (log2 units): rows g, g + 8; keys n * 8 + 2t, + 1
#pragma unroll
        for (int n = 0; n < 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                float bf[2];
                load_b_t(bf, Ks, KPAD, ks * 8, n * 8, g, t);
                mma(s[n], qf[ks], bf);
            }
        }
        float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = k0 + n * 8 + 2 * t + (e & 1);
                if (key >= S || (causal && key > pos[e >> 1])) s[n][e] = -INFINITY;
                row_max[e >> 1] = fmaxf(row_max[e >> 1], s[n][e]);
            }
        float alpha[2], row_sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float m_new = fmaxf(m[r], quad_max(row_max[r]));  // finite: key 0 is always visible
            alpha[r] = exp2f(m[r] - m_new);
            m[r] = m_new;
        }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(s[n][e] - m[e >> 1]);
                row_sum[e >> 1] += p;
                Pw[(g + 8 * (e >> 1)) * PPAD + n * 8 + 2 * t + (e & 1)] = tf32(p);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) l[r] = l[r] * alpha[r] + quad_sum(row_sum[r]);
#pragma unroll
        for (int nd = 0; nd < DT; nd++) {
            o[nd][0] *= alpha[0];
            o[nd][1] *= alpha[0];
            o[nd][2] *= alpha[1];
            o[nd][3] *= alpha[1];
        }
        __syncwarp();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {  // O += P V over this tile's 64 keys
            float af[4];
            load_a(af, Pw, PPAD, 0, kk * 8, g, t);
#pragma unroll
            for (int nd = 0; nd < DT; nd++) {
                float bf[2];
                load_b(bf, Vs, VPAD, kk * 8, nd * 8, g, t);
                mma(o[nd], af, bf);
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int tq = q0 + row0 + g + 8 * r;
        if (tq >= T) continue;
        const float inv = 1.0f / l[r];
        float* orow = out + ((size_t)b * T + tq) * q_stride + h * HEAD_DIM;
#pragma unroll
        for (int nd = 0; nd < DT; nd++) {
            orow[nd * 8 + 2 * t] = o[nd][2 * r] * inv;
            orow[nd * 8 + 2 * t + 1] = o[nd][2 * r + 1] * inv;
        }
        if (t == 0) lse[((size_t)b * Hq + h) * T + tq] = (m[r] + log2f(l[r])) * LN2;
    }
}

// One block per (key tile, kv head, batch). Warp w owns keys 16w..16w+15 of the tile for dK and dV
// (summed over the group's query heads in registers) and queries 16w..16w+15 of each query tile for dQ,
// which is added to global memory with atomics (dq must be zeroed first).
extern "C" __global__ void __launch_bounds__(NT)
flash_attention_backward_tf32(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                              const float* dout, const float* lse, const float* delta, int T, int S, int Hq,
                              int Hkv, float scale, int causal) {
    extern __shared__ float smem[];
    float* Ks = smem;                   // (TILE, KPAD)
    float* Vs = Ks + TILE * KPAD;       // (TILE, KPAD)
    float* Qs = Vs + TILE * KPAD;       // (TILE, KPAD)
    float* dOs = Qs + TILE * KPAD;      // (TILE, KPAD)
    float* PT = dOs + TILE * KPAD;      // (TILE keys, PPAD): probabilities, transposed
    float* dST = PT + TILE * PPAD;      // (TILE keys, PPAD): score gradients, transposed
    float* lse_s = dST + TILE * PPAD;   // (TILE,)
    float* delta_s = lse_s + TILE;      // (TILE,)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int k0 = blockIdx.x * TILE, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    const int offset = S - T, row0 = warp * 16;
    const size_t q_stride = (size_t)Hq * HEAD_DIM, kv_stride = (size_t)Hkv * HEAD_DIM;
    stage(Ks, KPAD, k + (size_t)b * S * kv_stride + hk * HEAD_DIM, k0, S, kv_stride, 1.0f);
    stage(Vs, KPAD, v + (size_t)b * S * kv_stride + hk * HEAD_DIM, k0, S, kv_stride, 1.0f);

    float dk_acc[DT][4], dv_acc[DT][4];  // keys row0 + g (+8), dims nd * 8 + 2t (+1)
#pragma unroll
    for (int nd = 0; nd < DT; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk_acc[nd][e] = dv_acc[nd][e] = 0.0f;
    const int q_begin = causal ? (max(0, k0 - offset) / TILE) * TILE : 0;
    for (int h = hk * group; h < (hk + 1) * group; h++) {
        const float* qb = q + (size_t)b * T * q_stride + h * HEAD_DIM;
        const float* dob = dout + (size_t)b * T * q_stride + h * HEAD_DIM;
        const float* lse_b = lse + ((size_t)b * Hq + h) * T;
        const float* delta_b = delta + ((size_t)b * Hq + h) * T;
        for (int q0 = q_begin; q0 < T; q0 += TILE) {
            __syncthreads();  // every warp is done with the previous tiles
            stage(Qs, KPAD, qb, q0, T, q_stride, 1.0f);
            stage(dOs, KPAD, dob, q0, T, q_stride, 1.0f);
            for (int r = threadIdx.x; r < TILE; r += NT) {
                lse_s[r] = q0 + r < T ? lse_b[q0 + r] : INFINITY;  // padding queries get p = 0
                delta_s[r] = q0 + r < T ? delta_b[q0 + r] : 0.0f;
            }
            __syncthreads();
            float st[8][4], dpt[8][4];  // S^T = K Q^T and dP^T = V dO^T: rows keys, cols queries n * 8 + ..
#pragma unroll
            for (int n = 0; n < 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ks++) {
                    float af[4], bf[2];
                    load_a(af, Ks, KPAD, row0, ks * 8, g, t);
                    load_b_t(bf, Qs, KPAD, ks * 8, n * 8, g, t);
                    mma(st[n], af, bf);
                    load_a(af, Vs, KPAD, row0, ks * 8, g, t);
                    load_b_t(bf, dOs, KPAD, ks * 8, n * 8, g, t);
                    mma(dpt[n], af, bf);
                }
            }
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int kr = row0 + g + 8 * (e >> 1), qc = n * 8 + 2 * t + (e & 1);
                    const int key = k0 + kr, query = q0 + qc;
                    const bool visible = key < S && (!causal || key <= offset + query);
                    const float p = visible ? __expf(st[n][e] * scale - lse_s[qc]) : 0.0f;
                    PT[kr * PPAD + qc] = tf32(p);
                    dST[kr * PPAD + qc] = tf32(p * (dpt[n][e] - delta_s[qc]));
                }
            __syncthreads();  // dQ below reads every warp's rows of dS^T
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {  // dV += P^T dO, dK += dS^T Q over 64 queries
                float ap[4], ads[4];
                load_a(ap, PT, PPAD, row0, kk * 8, g, t);
                load_a(ads, dST, PPAD, row0, kk * 8, g, t);
#pragma unroll
                for (int nd = 0; nd < DT; nd++) {
                    float bf[2];
                    load_b(bf, dOs, KPAD, kk * 8, nd * 8, g, t);
                    mma(dv_acc[nd], ap, bf);
                    load_b(bf, Qs, KPAD, kk * 8, nd * 8, g, t);
                    mma(dk_acc[nd], ads, bf);
                }
            }
            float dq_acc[DT][4];  // queries row0 + g (+8), dims nd * 8 + 2t (+1)
#pragma unroll
            for (int nd = 0; nd < DT; nd++) dq_acc[nd][0] = dq_acc[nd][1] = dq_acc[nd][2] = dq_acc[nd][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {  // dQ = dS K over 64 keys
                float af[4];
                load_a_t(af, dST, PPAD, row0, kk * 8, g, t);
#pragma unroll
                for (int nd = 0; nd < DT; nd++) {
                    float bf[2];
                    load_b(bf, Ks, KPAD, kk * 8, nd * 8, g, t);
                    mma(dq_acc[nd], af, bf);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int tq = q0 + row0 + g + 8 * r;
                if (tq >= T) continue;
                float* dq_row = dq + ((size_t)b * T + tq) * q_stride + h * HEAD_DIM;
#pragma unroll
                for (int nd = 0; nd < DT; nd++) {
                    atomicAdd(&dq_row[nd * 8 + 2 * t], dq_acc[nd][2 * r] * scale);
                    atomicAdd(&dq_row[nd * 8 + 2 * t + 1], dq_acc[nd][2 * r + 1] * scale);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = k0 + row0 + g + 8 * r;
        if (key >= S) continue;
        float* dk_row = dk + ((size_t)b * S + key) * kv_stride + hk * HEAD_DIM;
        float* dv_row = dv + ((size_t)b * S + key) * kv_stride + hk * HEAD_DIM;
#pragma unroll
        for (int nd = 0; nd < DT; nd++) {
            dk_row[nd * 8 + 2 * t] = dk_acc[nd][2 * r] * scale;
            dk_row[nd * 8 + 2 * t + 1] = dk_acc[nd][2 * r + 1] * scale;
            dv_row[nd * 8 + 2 * t] = dv_acc[nd][2 * r];
            dv_row[nd * 8 + 2 * t + 1] = dv_acc[nd][2 * r + 1];
        }
    }
}
