// SwiGLU gate: out = silu(gate) * up, with silu(g) = g * sigmoid(g).
// Each body is a template over the storage type (float32, or bf16 as unsigned short); math is float32.
// amax pointers (null: not wanted) are raised to the largest |value| each output holds as stored (bf16:
// rounded), as fp8.cu's amax kernels would measure it: the FP8 path's casts take them instead of a pass.
#include "common.cuh"

// The forward's product, one expression for every kernel that makes it (the backward re-makes it bit for bit).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

template <typename T>
__device__ __forceinline__ void swiglu_forward_body(T* out, const T* gate, const T* up, long long n, unsigned* amax) {
    unsigned bits = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = load_act(gate, i);
        const float o = silu_times(g, load_act(up, i));
        store_act(out, i, o);
        if (amax) bits = max(bits, abs_bits(as_stored(out, o)));
    }
    if (amax) block_amax(bits, amax);
}

// dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))); dup = dout * silu(g); product (null: not
// wanted) gets the forward's silu(g) * up again, for the down projection's weight gradient.
template <typename T>
__device__ __forceinline__ void swiglu_backward_body(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                                     long long n, unsigned* amax_dgate, unsigned* amax_dup,
                                                     T* product) {
    unsigned bits_g = 0, bits_u = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = load_act(gate, i), d = load_act(dout, i), u = load_act(up, i);
        const float sig = 1.0f / (1.0f + __expf(-g));
        const float dg = d * u * sig * (1.0f + g * (1.0f - sig)), du = d * g * sig;
        store_act(dgate, i, dg);
        store_act(dup, i, du);
        if (product) store_act(product, i, silu_times(g, u));
        bits_g = max(bits_g, abs_bits(as_stored(dgate, dg)));
        bits_u = max(bits_u, abs_bits(as_stored(dup, du)));
    }
    if (amax_dgate) {  // both or neither (the launcher's rule)
        block_amax(bits_g, amax_dgate);
        __syncthreads();  // block_amax's scratch is used again
        block_amax(bits_u, amax_dup);
    }
}

extern "C" __global__ void swiglu_forward(float* out, const float* gate, const float* up, long long n,
                                          unsigned* amax) {
    swiglu_forward_body(out, gate, up, n, amax);
}

extern "C" __global__ void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                           const float* up, long long n, unsigned* amax_dgate, unsigned* amax_dup,
                                           float* product) {
    swiglu_backward_body(dgate, dup, dout, gate, up, n, amax_dgate, amax_dup, product);
}

// bf16 storage: gate and up as the bf16 GEMMs wrote them, out and the gradients rounded to bf16 (they
// are the next bf16 GEMM's operands); 2 bytes per element each way instead of 4.
extern "C" __global__ void swiglu_forward_bf16(unsigned short* out, const unsigned short* gate,
                                               const unsigned short* up, long long n, unsigned* amax) {
    swiglu_forward_body(out, gate, up, n, amax);
}

extern "C" __global__ void swiglu_backward_bf16(unsigned short* dgate, unsigned short* dup,
                                                const unsigned short* dout, const unsigned short* gate,
                                                const unsigned short* up, long long n, unsigned* amax_dgate,
                                                unsigned* amax_dup, unsigned short* product) {
    swiglu_backward_body(dgate, dup, dout, gate, up, n, amax_dgate, amax_dup, product);
}

// bf16 with n % 8 == 0 and 16-byte aligned arrays: 8 elements per 16-byte load and store.
__device__ __forceinline__ void unpack8(uint4 v, float* f) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        f[2 * j] = __uint_as_float(w[j] << 16);
        f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}
// Eight floats rounded to bf16 and packed; with AMAX, *bits raised to the largest rounded |value|'s pattern.
template <bool AMAX>
__device__ __forceinline__ uint4 pack8(const float* f, unsigned* bits) {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w[j] = bf16x2(f[2 * j], f[2 * j + 1]);
        if (AMAX) *bits = max(*bits, max((w[j] & 0x7fffu) << 16, w[j] & 0x7fff0000u));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The 8-wide bodies, with the maxima (AMAX) or without (the plain bf16 path: no work for them).
template <bool AMAX>
__device__ __forceinline__ void swiglu_forward_x8(uint4* out, const uint4* gate, const uint4* up, long long n8,
                                                  unsigned* amax) {
    unsigned bits = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
         i += (long long)gridDim.x * blockDim.x) {
        float g[8], u[8], o[8];
        unpack8(gate[i], g);
        unpack8(up[i], u);
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = silu_times(g[j], u[j]);
        out[i] = pack8<AMAX>(o, &bits);
    }
    if (AMAX) block_amax(bits, amax);
}

template <bool AMAX>
__device__ __forceinline__ void swiglu_backward_x8(uint4* dgate, uint4* dup, const uint4* dout, const uint4* gate,
                                                   const uint4* up, long long n8, unsigned* amax_dgate,
                                                   unsigned* amax_dup, uint4* product) {
    unsigned bits_g = 0, bits_u = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
         i += (long long)gridDim.x * blockDim.x) {
        float g[8], u[8], d[8], dg[8], du[8];
        unpack8(gate[i], g);
        unpack8(up[i], u);
        unpack8(dout[i], d);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float sig = 1.0f / (1.0f + __expf(-g[j]));
            dg[j] = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig));
            du[j] = d[j] * g[j] * sig;
        }
        dgate[i] = pack8<AMAX>(dg, &bits_g);
        dup[i] = pack8<AMAX>(du, &bits_u);
        if (product) {
            float o[8];
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = silu_times(g[j], u[j]);
            product[i] = pack8<false>(o, nullptr);
        }
    }
    if (AMAX) {
        block_amax(bits_g, amax_dgate);
        __syncthreads();
        block_amax(bits_u, amax_dup);
    }
}

extern "C" __global__ void swiglu_forward_bf16x8(uint4* out, const uint4* gate, const uint4* up, long long n8,
                                                 unsigned* amax) {
    if (amax) {  // the same for every thread
        swiglu_forward_x8<true>(out, gate, up, n8, amax);
    } else {
        swiglu_forward_x8<false>(out, gate, up, n8, amax);
    }
}

extern "C" __global__ void swiglu_backward_bf16x8(uint4* dgate, uint4* dup, const uint4* dout, const uint4* gate,
                                                  const uint4* up, long long n8, unsigned* amax_dgate,
                                                  unsigned* amax_dup, uint4* product) {
    if (amax_dgate) {  // both or neither (the launcher's rule)
        swiglu_backward_x8<true>(dgate, dup, dout, gate, up, n8, amax_dgate, amax_dup, product);
    } else {
        swiglu_backward_x8<false>(dgate, dup, dout, gate, up, n8, amax_dgate, amax_dup, product);
    }
}

// --- FP8 outputs with a delayed scale (fp8_scales.py) -----------------------------------------------------
// gate, up (and dout) bf16 (rows, cols), row-major; the outputs are FP8 (rows_padded, cols) row-major and
// (cols, rows_padded) transposed, both from one pass (the FP8 products want the summed dimension contiguous
// in both operands; rows_padded rounds the tokens up to the products' multiple, its extra rows are zeros).
// Each output x is stored as fp8(x 2^k) with k = *exponent (its slot's, known before the kernel starts),
// saturating; *amax is raised to the largest |x| (float32, before rounding) and *saturated counts the values
// beyond the format's range. Grid (ceil(cols / 64), ceil(rows_padded / 64)), 256 threads (fp8.cuh's tile).
#include "fp8.cuh"

// This thread's 16 values of a bf16 (rows, cols) array (fp8.cuh's tile layout): 0 past rows or cols.
__device__ __forceinline__ void load_tile16(const unsigned short* x, long long rows, long long cols, int aligned,
                                            float* v) {
    const long long row = (long long)blockIdx.y * FP8_TILE + threadIdx.x / 4;
    const long long col = (long long)blockIdx.x * FP8_TILE + (threadIdx.x % 4) * 16;
    if (aligned && row < rows && col + 16 <= cols && cols % 16 == 0) {
        unpack_bf16x8(*reinterpret_cast<const uint4*>(x + row * cols + col), v);
        unpack_bf16x8(*reinterpret_cast<const uint4*>(x + row * cols + col + 8), v + 8);
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) v[j] = row < rows && col + j < cols ? bf16_to_float(x[row * cols + col + j]) : 0.0f;
    }
}

extern "C" __global__ void swiglu_forward_fp8(const unsigned short* gate, const unsigned short* up, long long rows,
                                              long long cols, long long rows_padded, int aligned, const int* exponent,
                                              unsigned* amax, unsigned long long* saturated, unsigned char* out,
                                              unsigned char* out_t) {
    __shared__ unsigned char tile[FP8_TILE * FP8_TILE_PITCH];
    float g[16], u[16];
    load_tile16(gate, rows, cols, aligned, g);
    load_tile16(up, rows, cols, aligned, u);
    const float scale = ldexpf(1.0f, *exponent);
    unsigned bits = 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const float o = silu_times(g[j], u[j]);  // 0 where gate and up are padding
        bits = max(bits, abs_bits(o));
        g[j] = o * scale;
    }
    const int n = store_fp8_tile<false>(g, rows_padded, cols, aligned, out, out_t, tile);
    block_amax(bits, amax);
    __syncthreads();
    block_count(n, saturated);
}

// dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))), dup = dout * silu(g), both e5m2 (gradients),
// each with its own slot (exponent, amax, saturated: [0] dgate, [1] dup of the pointers given)
extern "C" __global__ void swiglu_backward_fp8(const unsigned short* dout, const unsigned short* gate,
                                               const unsigned short* up, long long rows, long long cols,
                                               long long rows_padded, int aligned, const int* exponent_g,
                                               const int* exponent_u, unsigned* amax_g, unsigned* amax_u,
                                               unsigned long long* saturated_g, unsigned long long* saturated_u,
                                               unsigned char* dgate, unsigned char* dgate_t, unsigned char* dup,
                                               unsigned char* dup_t) {
    __shared__ unsigned char tile[FP8_TILE * FP8_TILE_PITCH];
    float g[16], u[16], d[16];
    load_tile16(gate, rows, cols, aligned, g);
    load_tile16(up, rows, cols, aligned, u);
    load_tile16(dout, rows, cols, aligned, d);
    const float scale_g = ldexpf(1.0f, *exponent_g), scale_u = ldexpf(1.0f, *exponent_u);
    unsigned bits_g = 0, bits_u = 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const float sig = 1.0f / (1.0f + __expf(-g[j]));
        const float dg = d[j] * u[j] * sig * (1.0f + g[j] * (1.0f - sig)), du = d[j] * g[j] * sig;
        bits_g = max(bits_g, abs_bits(dg));
        bits_u = max(bits_u, abs_bits(du));
        u[j] = du * scale_u;  // up and gate are not needed again: their registers take the scaled outputs
        g[j] = dg * scale_g;
    }
    const int n_g = store_fp8_tile<true>(g, rows_padded, cols, aligned, dgate, dgate_t, tile);
    __syncthreads();  // the shared tile is written again
    const int n_u = store_fp8_tile<true>(u, rows_padded, cols, aligned, dup, dup_t, tile);
    block_amax(bits_g, amax_g);
    __syncthreads();
    block_amax(bits_u, amax_u);
    __syncthreads();
    block_count(n_g, saturated_g);
    __syncthreads();
    block_count(n_u, saturated_u);
}
