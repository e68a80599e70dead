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
