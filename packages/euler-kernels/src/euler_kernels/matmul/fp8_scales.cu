// Delayed FP8 scales (fp8_scales.py): for each tensor tracked ("slot"), the absolute maxima of its last H
// steps (a ring, float patterns as common.cuh's abs_bits), the maximum the kernels that make it raise during
// the step (amax_now), and the scale they cast with: exponent k (the tensor is stored as fp8(x 2^k)) and
// scale_inv = 2^-k for the products (one every `stride` floats: cuBLASLt takes 16-byte aligned scale pointers).
#include "common.cuh"
#include "fp8.cuh"

// Once a step, after every kernel that raised amax_now: the step's maximum goes into the ring at *step % h,
// amax_now goes back to 0, and the next step's k is fp8_format.delayed_exponent of the ring with `margin`
// (its finite entries only: a step that overflowed does not reset the scale). One block; thread 0 advances *step last.
extern "C" __global__ void fp8_scales_update(unsigned* history, unsigned* amax_now, int* exponent, float* scale_inv,
                                             int stride, const int* max_exponent, int margin, int* step,
                                             int slots, int h) {
    const int at = *step % h;
    for (int s = threadIdx.x; s < slots; s += blockDim.x) {
        history[(long long)s * h + at] = amax_now[s];
        amax_now[s] = 0;
        unsigned largest = 0;
        for (int i = 0; i < h; i++) {
            const unsigned bits = history[(long long)s * h + i];
            if (bits < 0x7f800000u) largest = max(largest, bits);  // inf and NaN patterns are left out
        }
        const int k = largest ? fp8_scale_exponent(largest, max_exponent[s]) - margin : 0;  // margin: headroom
        exponent[s] = k;
        scale_inv[(long long)s * stride] = ldexpf(1.0f, -k);
    }
    __syncthreads();  // every thread has read *step
    if (threadIdx.x == 0) *step += 1;
}
