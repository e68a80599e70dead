// Hopper's bulk tensor copies (TMA, cp.async.bulk.tensor) and the shared-memory barriers (mbarrier) that
// count their bytes in. A kernel gets each tensor map (built on the host by tensor_map.py) as a
// `const __grid_constant__ TensorMap` parameter and passes its address to tma_load_4d.
//
// A barrier completes a phase when its expected arrivals have arrived and the bytes announced with
// mbar_expect_tx have landed; waiting names the parity of the phase waited for. The producer of a buffer
// waits on its "empty" barrier with parity (use & 1) ^ 1, which passes at once for the first use (the
// phase before phase 0 counts as complete); the consumer waits on its "full" barrier with parity use & 1.
#pragma once

struct TensorMap {  // CUtensorMap: 128 opaque bytes, 64-byte aligned (NVRTC has no cuda.h)
    alignas(64) unsigned long long opaque[16];
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// the initialised barriers become visible to the copy engine (then a block barrier, for the other threads)
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// one arrival that also announces `bytes` more to come from the copies completing on this barrier
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// spin until the phase of parity `parity` has completed
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred done;\nLAB_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra LAB_WAIT;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// the box of `map` at coordinates (c0, c1, c2, c3) (innermost first) -> shared address dst, completing on bar
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TensorMap* map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}
// warp-specialised kernels: a warpgroup that only issues copies gives registers to those that compute
template <int N>
__device__ __forceinline__ void regs_release() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_claim() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// dst's box at (c0, c1, c2, c3) += the shared tile at src (float32 adds in the L2; rows past the array are
// skipped), as one bulk group of this thread
__device__ __forceinline__ void tma_reduce_add_4d(const TensorMap* map, int c0, int c1, int c2, int c3, unsigned src) {
    asm volatile(
        "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(map),
        "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
        : "memory");
}
// the shared tile at src -> dst's box at (c0, c1, c2, c3) (rows past the array are not written), as part
// of this thread's next bulk group
__device__ __forceinline__ void tma_store_4d(const TensorMap* map, int c0, int c1, int c2, int c3, unsigned src) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(map), "r"(c0),
        "r"(c1), "r"(c2), "r"(c3), "r"(src)
        : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// until at most N of this thread's bulk groups still read their shared memory
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// until all of this thread's bulk groups have completed
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// 4 bytes global -> shared (zeros when !valid); cp_async_arrive makes the barrier count one arrival once
// all of this thread's earlier cp.async copies have landed
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
