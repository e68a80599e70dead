// Device helpers shared by the bf16 FlashAttention kernels (flash_attention_bf16.cu: mma.sync for any
// GPU from sm_80; flash_attention_sm90.cu: wgmma for Hopper).
#pragma once

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef unsigned short bf16_t;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without passing through registers; valid == false writes 16 zero bytes.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// wait until at most N of this thread's committed groups are still in flight
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x on the special-function unit (one MUFU.EX2; exp2f adds denormal handling): 2^-inf = 0, and results
// below 2^-126 flush to 0, which no probability here needs
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// two floats -> two bf16 (round to nearest even) in one register, lo in the low half
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16_lo(unsigned x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float bf16_hi(unsigned x) { return __uint_as_float(x & 0xffff0000u); }

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 1));
    return fmaxf(v, __shfl_xor_sync(FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v + __shfl_xor_sync(FULL_MASK, v, 2);
}

// The online softmax's running state of this thread's two rows (g, g + 8) after one more tile whose
// per-thread raw-score maxima are mx: m becomes the new running max (log2 units, also returned in m_new),
// alpha the factor that rescales the old sum l (done here) and the old output (the caller's).
__device__ __forceinline__ void update_running_max(float* m, float* l, const float* mx, float sl2, float* m_new,
                                                   float* alpha) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // finite after the first tile: key 0 is visible to every row
        m_new[r] = fmaxf(m[r], quad_max(mx[r]) * sl2);
        alpha[r] = fast_exp2(m[r] - m_new[r]);
        m[r] = m_new[r];
        l[r] *= alpha[r];
    }
}
