// FlashAttention forward and backward (FlashAttention-2 scheme), fp32, written for euler.
//
// Layouts: q (B, T, Hq, D), k and v (B, S, Hkv, D), out and dout like q, lse and delta (B, Hq, T).
// Query t sits at position S - T + t, so a KV-cache step (T = 1) works. Grouped-query attention:
// query head h reads kv head h / (Hq / Hkv); K/V are never copied per query head.
// No (T, S) matrix exists in memory: scores live in one (BR, BC) tile of shared memory per block.
// The forward keeps a running max and sum per row (online softmax) and saves only the log-sum-exp;
// the backward recomputes probabilities from it, tile by tile.
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#define BR 64                   // query rows per tile
#define BC 64                   // key rows per tile
#define NT 256                  // threads per block: a 16 x 16 grid, each thread owns 4 rows
#define PAD (HEAD_DIM + 1)      // padded row stride of (rows, D) tiles: no bank conflicts
#define SPAD (BC + 1)           // padded row stride of (BR, BC) score tiles
#define DJ (HEAD_DIM / 16)      // head-dim columns per thread: tx, tx + 16, ...
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Copy `rows` rows of D floats starting at `row0` (row stride `stride`) into a padded tile, scaled;
// rows at or past `limit` become zeros.
__device__ __forceinline__ void load_tile(float* tile, const float* src, int row0, int limit,
                                          size_t stride, float scale) {
    for (int idx = threadIdx.x; idx < BR * HEAD_DIM; idx += NT) {
        const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        tile[r * PAD + d] = row0 + r < limit ? src[(size_t)(row0 + r) * stride + d] * scale : 0.0f;
    }
}

// Sum / max over the 16 threads (tx = 0..15) that share one row.
__device__ __forceinline__ float row_sum16(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ float row_max16(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

extern "C" __global__ void __launch_bounds__(NT)
flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v, int T, int S,
                        int Hq, int Hkv, float scale, int causal) {
    extern __shared__ float smem[];
    float* Qs = smem;              // (BR, PAD), pre-scaled by scale * log2(e)
    float* Ks = Qs + BR * PAD;     // (BC, PAD)
    float* Vs = Ks + BC * PAD;     // (BC, PAD)
    float* Ps = Vs + BC * PAD;     // (BR, SPAD)
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int q0 = blockIdx.x * BR, h = blockIdx.y, b = blockIdx.z, hk = h / (Hq / Hkv);
    const int offset = S - T;
    const size_t q_stride = (size_t)Hq * HEAD_DIM, kv_stride = (size_t)Hkv * HEAD_DIM;
    const float* qb = q + (size_t)b * T * q_stride + h * HEAD_DIM;
    const float* kb = k + (size_t)b * S * kv_stride + hk * HEAD_DIM;
    const float* vb = v + (size_t)b * S * kv_stride + hk * HEAD_DIM;
    load_tile(Qs, qb, q0, T, q_stride, scale * LOG2E);

    float o[4][DJ], m[4], l[4];
    int pos[4];  // each owned row's position; padding rows borrow the last real one
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        pos[i] = offset + min(q0 + ty * 4 + i, T - 1);
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) o[i][jj] = 0.0f;
    }
    const int kv_end = causal ? min(S, offset + min(q0 + BR, T)) : S;  // causal: skip tiles past the block
    for (int k0 = 0; k0 < kv_end; k0 += BC) {
        __syncthreads();  // the previous tile's reads of Ks, Vs and Ps are done
        load_tile(Ks, kb, k0, S, kv_stride, 1.0f);
        load_tile(Vs, vb, k0, S, kv_stride, 1.0f);
        __syncthreads();
        float s[4][4];  // scores of rows ty*4+i, keys tx+16j, in log2 units
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HEAD_DIM; d++) {
            float qv[4], kv[4];
#pragma unroll
            for (int i = 0; i < 4; i++) qv[i] = Qs[(ty * 4 + i) * PAD + d];
#pragma unroll
            for (int j = 0; j < 4; j++) kv[j] = Ks[(tx + 16 * j) * PAD + d];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] += qv[i] * kv[j];
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float row_max = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int key = k0 + tx + 16 * j;
                if (key >= S || (causal && key > pos[i])) s[i][j] = -INFINITY;
                row_max = fmaxf(row_max, s[i][j]);
            }
            const float m_new = fmaxf(m[i], row_max16(row_max));  // finite: key 0 is always visible
            const float alpha = exp2f(m[i] - m_new);
            float row_sum = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                s[i][j] = exp2f(s[i][j] - m_new);
                row_sum += s[i][j];
                Ps[(ty * 4 + i) * SPAD + tx + 16 * j] = s[i][j];
            }
            l[i] = l[i] * alpha + row_sum16(row_sum);
            m[i] = m_new;
#pragma unroll
            for (int jj = 0; jj < DJ; jj++) o[i][jj] *= alpha;
        }
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < BC; c++) {  // O += P V
            float pv[4], vv[DJ];
#pragma unroll
            for (int i = 0; i < 4; i++) pv[i] = Ps[(ty * 4 + i) * SPAD + c];
#pragma unroll
            for (int jj = 0; jj < DJ; jj++) vv[jj] = Vs[c * PAD + tx + 16 * jj];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jj = 0; jj < DJ; jj++) o[i][jj] += pv[i] * vv[jj];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = q0 + ty * 4 + i;
        if (t >= T) continue;
        const float inv = 1.0f / l[i];
        float* orow = out + ((size_t)b * T + t) * q_stride + h * HEAD_DIM;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) orow[tx + 16 * jj] = o[i][jj] * inv;
        if (tx == 0) lse[((size_t)b * Hq + h) * T + t] = (m[i] + log2f(l[i])) * LN2;
    }
}

// delta[b, h, t] = sum_d dout * out over one row: one warp per (b, t, h) row.
extern "C" __global__ void flash_attention_delta(float* delta, const float* dout, const float* out, int T,
                                                 int Hq, long long n_rows) {
    const long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;  // (b * T + t) * Hq + h
    if (row >= n_rows) return;
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int d = lane; d < HEAD_DIM; d += 32) acc += dout[row * HEAD_DIM + d] * out[row * HEAD_DIM + d];
    acc = warp_sum(acc);
    const long long b = row / ((long long)T * Hq), t = (row / Hq) % T, h = row % Hq;
    if (lane == 0) delta[(b * Hq + h) * T + t] = acc;
}

// One block per (key tile, kv head, batch): it owns dK and dV of its keys (summed over the query heads
// of its group, no atomics) and adds its share of dQ with atomics (dq must be zeroed first).
extern "C" __global__ void __launch_bounds__(NT)
flash_attention_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                         const float* dout, const float* lse, const float* delta, int T, int S, int Hq,
                         int Hkv, float scale, int causal) {
    extern __shared__ float smem[];
    float* Ks = smem;              // (BC, PAD)
    float* Vs = Ks + BC * PAD;     // (BC, PAD)
    float* Qs = Vs + BC * PAD;     // (BR, PAD)
    float* dOs = Qs + BR * PAD;    // (BR, PAD)
    float* Ps = dOs + BR * PAD;    // (BR, SPAD) probabilities
    float* dSs = Ps + BR * SPAD;   // (BR, SPAD) score gradients
    float* lse_s = dSs + BR * SPAD;
    float* delta_s = lse_s + BR;
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int k0 = blockIdx.x * BC, hk = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
    const int offset = S - T;
    const size_t q_stride = (size_t)Hq * HEAD_DIM, kv_stride = (size_t)Hkv * HEAD_DIM;
    load_tile(Ks, k + (size_t)b * S * kv_stride + hk * HEAD_DIM, k0, S, kv_stride, 1.0f);
    load_tile(Vs, v + (size_t)b * S * kv_stride + hk * HEAD_DIM, k0, S, kv_stride, 1.0f);

    float dk_acc[4][DJ], dv_acc[4][DJ];  // keys ty*4+i, dims tx+16jj
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) dk_acc[i][jj] = dv_acc[i][jj] = 0.0f;
    // causal: the first query that sees key k0 is at t = k0 - offset
    const int q_begin = causal ? (max(0, k0 - offset) / BR) * BR : 0;
    for (int h = hk * group; h < (hk + 1) * group; h++) {
        const float* qb = q + (size_t)b * T * q_stride + h * HEAD_DIM;
        const float* dob = dout + (size_t)b * T * q_stride + h * HEAD_DIM;
        const float* lse_b = lse + ((size_t)b * Hq + h) * T;
        const float* delta_b = delta + ((size_t)b * Hq + h) * T;
        for (int q0 = q_begin; q0 < T; q0 += BR) {
            __syncthreads();  // the previous tile's reads are done
            load_tile(Qs, qb, q0, T, q_stride, 1.0f);
            load_tile(dOs, dob, q0, T, q_stride, 1.0f);
            for (int r = threadIdx.x; r < BR; r += NT) {
                lse_s[r] = q0 + r < T ? lse_b[q0 + r] : INFINITY;  // padding rows get p = 0
                delta_s[r] = q0 + r < T ? delta_b[q0 + r] : 0.0f;
            }
            __syncthreads();
            float s[4][4], dp[4][4];  // rows: queries ty*4+i; cols: keys tx+16j
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] = dp[i][j] = 0.0f;
#pragma unroll 4
            for (int d = 0; d < HEAD_DIM; d++) {
                float qv[4], ov[4], kv[4], vv[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    qv[i] = Qs[(ty * 4 + i) * PAD + d];
                    ov[i] = dOs[(ty * 4 + i) * PAD + d];
                }
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    kv[j] = Ks[(tx + 16 * j) * PAD + d];
                    vv[j] = Vs[(tx + 16 * j) * PAD + d];
                }
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        s[i][j] += qv[i] * kv[j];
                        dp[i][j] += ov[i] * vv[j];
                    }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = ty * 4 + i, query_pos = offset + q0 + r;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = tx + 16 * j, key = k0 + c;
                    const bool visible = key < S && (!causal || key <= query_pos);
                    const float p = visible ? __expf(s[i][j] * scale - lse_s[r]) : 0.0f;
                    Ps[r * SPAD + c] = p;
                    dSs[r * SPAD + c] = p * (dp[i][j] - delta_s[r]);
                }
            }
            __syncthreads();
            // dV += P^T dO and dK += dS^T Q, for keys ty*4+i and dims tx+16jj
#pragma unroll 4
            for (int r = 0; r < BR; r++) {
                float pv[4], dsv[4], ov[DJ], qv[DJ];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    pv[i] = Ps[r * SPAD + ty * 4 + i];
                    dsv[i] = dSs[r * SPAD + ty * 4 + i];
                }
#pragma unroll
                for (int jj = 0; jj < DJ; jj++) {
                    ov[jj] = dOs[r * PAD + tx + 16 * jj];
                    qv[jj] = Qs[r * PAD + tx + 16 * jj];
                }
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int jj = 0; jj < DJ; jj++) {
                        dv_acc[i][jj] += pv[i] * ov[jj];
                        dk_acc[i][jj] += dsv[i] * qv[jj];
                    }
            }
            // dQ += scale * dS K, for queries ty*4+i and dims tx+16jj
            float dq_acc[4][DJ];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jj = 0; jj < DJ; jj++) dq_acc[i][jj] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < BC; c++) {
                float dsv[4], kv[DJ];
#pragma unroll
                for (int i = 0; i < 4; i++) dsv[i] = dSs[(ty * 4 + i) * SPAD + c];
#pragma unroll
                for (int jj = 0; jj < DJ; jj++) kv[jj] = Ks[c * PAD + tx + 16 * jj];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int jj = 0; jj < DJ; jj++) dq_acc[i][jj] += dsv[i] * kv[jj];
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int t = q0 + ty * 4 + i;
                if (t >= T) continue;
                float* dq_row = dq + ((size_t)b * T + t) * q_stride + h * HEAD_DIM;
#pragma unroll
                for (int jj = 0; jj < DJ; jj++) atomicAdd(&dq_row[tx + 16 * jj], dq_acc[i][jj] * scale);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int key = k0 + ty * 4 + i;
        if (key >= S) continue;
        float* dk_row = dk + ((size_t)b * S + key) * kv_stride + hk * HEAD_DIM;
        float* dv_row = dv + ((size_t)b * S + key) * kv_stride + hk * HEAD_DIM;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) {
            dk_row[tx + 16 * jj] = dk_acc[i][jj] * scale;
            dv_row[tx + 16 * jj] = dv_acc[i][jj];
        }
    }
}
