// Shared device helpers for euler's CUDA kernels (fp32 accumulation everywhere).
#pragma once

#define FULL_MASK 0xffffffffu
#ifndef INFINITY  // NVRTC has no math.h
#define INFINITY __int_as_float(0x7f800000)
#endif

// Sum over a warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// Named barriers: `threads` threads (whole warps) of the block meet at barrier `id` (0 is __syncthreads');
// with arrive, a thread counts itself and goes on without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The sum of every thread's `v` over the block (up to 1024 threads), in a fixed order, valid in thread 0;
// at most one call per kernel (its scratch is the block's).
__device__ __forceinline__ double block_sum_double(double v) {
    __shared__ double scratch[32];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += scratch[w];
    return s;
}

// The bit pattern of |v| for a running absolute maximum: non-negative floats order as unsigned integers,
// and a NaN's pattern (sign cleared) is above inf's, so a NaN makes the maximum NaN.
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Raise *amax (a float's pattern, see abs_bits) to the largest of every thread's `bits` in the block: a warp
// maximum, then one over the warps in shared memory, then one atomicMax a block. Every thread of the block
// must call it (it synchronises); a second call needs a __syncthreads() before it (the scratch is shared).
__device__ __forceinline__ void block_amax(unsigned bits, unsigned* amax) {
    __shared__ unsigned scratch[32];
    for (int offset = 16; offset > 0; offset >>= 1) bits = max(bits, __shfl_xor_sync(FULL_MASK, bits, offset));
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = bits;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) bits = max(bits, scratch[w]);
        if (bits) atomicMax(amax, bits);
    }
}

// bfloat16 activations are stored as their 16-bit patterns (unsigned short): the top half of a float32.
__device__ __forceinline__ float bf16_to_float(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

// float32 -> bfloat16, round to nearest even; a NaN stays a (quiet) NaN. From sm_80 on one instruction
// (cvt.rn), which gives the same bits for every number; before it, the rounding done by hand.
__device__ __forceinline__ unsigned short float_to_bf16(float x) {
#if __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);  // round half to even on the 16 bits dropped
    return (unsigned short)(u >> 16);
#endif
}

// Two floats rounded as float_to_bf16 rounds them, packed lo | hi << 16 (one instruction from sm_80 on).
__device__ __forceinline__ unsigned bf16x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
#else
    return float_to_bf16(lo) | ((unsigned)float_to_bf16(hi) << 16);
#endif
}

// The storage type of an activation or weight chosen by a compile-time switch: bf16 bit patterns
// (storage<1>::type, unsigned short) or float32 (storage<0>::type).
template <bool BF16>
struct storage {
    typedef float type;
};
template <>
struct storage<true> {
    typedef unsigned short type;
};

// Overloads so one template body reads and writes float32 or bf16 storage.
__device__ __forceinline__ float load_act(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_act(const unsigned short* p, size_t i) { return bf16_to_float(p[i]); }
__device__ __forceinline__ void store_act(float* p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_act(unsigned short* p, size_t i, float v) { p[i] = float_to_bf16(v); }

// Four values at float4 index i4: one 16-byte load, or 4 bf16 in one 8-byte load.
__device__ __forceinline__ float4 load4(const float* p, size_t i4) { return reinterpret_cast<const float4*>(p)[i4]; }
__device__ __forceinline__ float4 load4(const unsigned short* p, size_t i4) {
    const uint2 v = reinterpret_cast<const uint2*>(p)[i4];
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                       __uint_as_float(v.y & 0xffff0000u));
}

// Store four values at float4 index i4: one 16-byte store, or 4 bf16 in one 8-byte store.
__device__ __forceinline__ void store4(float* out, size_t i4, float4 v) { reinterpret_cast<float4*>(out)[i4] = v; }
__device__ __forceinline__ void store4(unsigned short* out, size_t i4, float4 v) {
    reinterpret_cast<uint2*>(out)[i4] = make_uint2(bf16x2(v.x, v.y), bf16x2(v.z, v.w));
}

// One tensor's gradient: float32, or bf16 bit patterns (unsigned short) where bf16 is set (train.bf16_grads).
struct GradRef {
    const void* p;
    bool bf16;
};

// The gradient tensor t of a list whose per-tensor flags bf16[t] say which storage it has.
__device__ __forceinline__ GradRef grad_ref(const void* const* grads, const int* bf16, int t) {
    return GradRef{grads[t], bf16[t] != 0};
}

__device__ __forceinline__ float grad_at(GradRef g, long long j) {
    return g.bf16 ? bf16_to_float(static_cast<const unsigned short*>(g.p)[j]) : static_cast<const float*>(g.p)[j];
}

// Four gradient values at float4 index i4 (a 16-byte load, or an 8-byte one of bf16).
__device__ __forceinline__ float4 grad4(GradRef g, size_t i4) {
    return g.bf16 ? load4(static_cast<const unsigned short*>(g.p), i4) : load4(static_cast<const float*>(g.p), i4);
}

// The value as an output of that type stores it: itself for float32, rounded to bf16 for bf16.
__device__ __forceinline__ float as_stored(const float*, float v) { return v; }
__device__ __forceinline__ float as_stored(const unsigned short*, float v) { return bf16_to_float(float_to_bf16(v)); }

// bits raised to the largest abs_bits of v's four values as store4 stores them into out.
template <typename Out>
__device__ __forceinline__ unsigned max_stored_bits4(unsigned bits, const Out* out, float4 v) {
    bits = max(bits, max(abs_bits(as_stored(out, v.x)), abs_bits(as_stored(out, v.y))));
    return max(bits, max(abs_bits(as_stored(out, v.z)), abs_bits(as_stored(out, v.w))));
}

// Eight bf16 in 16 bytes as floats.
__device__ __forceinline__ void unpack_bf16x8(const uint4 v, float* f) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

// Eight values at element i (a multiple of 8 elements from a 16-byte-aligned start) in 16-byte accesses:
// two for float32, one for bf16.
__device__ __forceinline__ void load_act8(const float* p, size_t i, float* v) {
    const float4 a = *reinterpret_cast<const float4*>(p + i), b = *reinterpret_cast<const float4*>(p + i + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load_act8(const unsigned short* p, size_t i, float* v) {
    unpack_bf16x8(*reinterpret_cast<const uint4*>(p + i), v);
}
__device__ __forceinline__ void store_act8(float* p, size_t i, const float* v) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store_act8(unsigned short* p, size_t i, const float* v) {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) w[j] = bf16x2(v[2 * j], v[2 * j + 1]);
    *reinterpret_cast<uint4*>(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
}

// c (16 x 8) += a (16 x 16) b (16 x 8) on the bf16 tensor cores, fp32 accumulation (mma.sync m16n8k16,
// sm_80 on; fragment layouts in flash_attention_bf16.cu's header)
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One rotate-half pair (x1, x2) rotated by the angle whose cosine and sine are c and s: (y1, y2). Every kernel
// that applies RoPE (prefill, training, decode) rounds through this one expression, so a key rotated by one
// equals, bit for bit, the same key rotated by another (speculative decoding relies on it in bf16).
__device__ __forceinline__ float2 rotate_pair(float x1, float x2, float c, float s) {
    return make_float2(fmaf(x1, c, -__fmul_rn(x2, s)), fmaf(x2, c, __fmul_rn(x1, s)));
}

// Multi-tensor kernels: tensors are passed as arrays of device pointers; the work is cut into chunks of
// CHUNK elements that never straddle two tensors, one block per chunk: chunk_tensor[c] names the tensor
// and chunk_start[c] the first element of chunk c (tables built by launch.py's _chunk_table).
#define CHUNK 8192

__device__ __forceinline__ void chunk_range(const int* chunk_tensor, const long long* chunk_start,
                                            const long long* sizes, int* t, long long* begin, long long* end) {
    *t = chunk_tensor[blockIdx.x];
    *begin = chunk_start[blockIdx.x];
    *end = min(*begin + CHUNK, sizes[*t]);
}
