// What follows a decode product, one rule for decode_linear.cu and decode_linear_mma.cu (their -D switches
// SWIGLU and RESIDUAL). With SWIGLU, y is the gate's sum and up the up's, rounded to bf16 first when ROUND
// (bf16 weights: as the unfused bf16 path rounds them), and the result is silu(gate) * up; with RESIDUAL
// the stream's value res[at] is added.
#pragma once
#include "common.cuh"

template <bool ROUND>
__device__ __forceinline__ float decode_output(float y, float up, const float* res, size_t at) {
#if SWIGLU
    const float gate = ROUND ? bf16_to_float(float_to_bf16(y)) : y;
    up = ROUND ? bf16_to_float(float_to_bf16(up)) : up;
    y = gate / (1.0f + __expf(-gate)) * up;
#endif
#if RESIDUAL
    y += res[at];
#endif
    return y;
}
