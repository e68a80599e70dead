"""bf16 products with the algorithm that is fastest on this GPU: cublasGemmEx's own choice, or one of
cuBLASLt's first TUNE_CANDIDATES heuristic candidates, each timed once per kind of product (sizes,
transposes, output type, pointer alignment) the first time that kind runs outside a CUDA graph capture.

cublasGemmEx's default choice is poor for some of a model's shapes, narrow ones such as the k and v
projections of a model with few kv heads (docs/benchmarks/train_gpu.md has the timings). A cuBLASLt
algorithm replaces cublasGemmEx only when it is TUNE_MARGIN faster, so close timings do not flip a kind's
choice from one run to the next. Either way the sums are float32 and a bf16 output is rounded once
(cuBLASLt's split-K partial sums are kept out of bf16: cublaslt.REDUCTION_IN_FLOAT32). Another algorithm
sums in another order, so a run whose choices differ from an earlier one's differs in float32 rounding
only, as the GPU's atomic adds already make it.

A kind first seen while a stream is being captured is not timed there (timing needs the GPU to finish): it
runs cublasGemmEx, and is timed at its first call outside a capture. A Precision with gemm_tuning False turns
timing off (cublasGemmEx for every product).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from euler_kernels.matmul import cublaslt
from euler_kernels.matmul.blas import CUDA_R_16BF

TUNE_CANDIDATES = 8  # cuBLASLt's heuristic candidates timed against cublasGemmEx
TUNE_REPS = 5  # timed calls of each, after one untimed
TUNE_MARGIN = 0.05  # how much faster a cuBLASLt algorithm must be to replace cublasGemmEx
GEMM_EX = -1  # a kind's choice: cublasGemmEx, else the index of a cuBLASLt candidate

_choices: dict[tuple, int] = {}
_products: dict[tuple, cublaslt.Product] = {}


def choices() -> dict[tuple, int]:
    """Each kind timed so far -> its choice (GEMM_EX or a cuBLASLt candidate's index); a copy."""
    return dict(_choices)


def run_tuned(
    a: Any,
    b: Any,
    trans: tuple[bool, bool],
    out: Any,
    out_type: int,
    accumulate: bool,
    gemm_ex: Callable[[Any, bool], None],
) -> bool:
    """out = op(a) @ op(b) (or out += it) for bf16 a, b with this kind's chosen cuBLASLt algorithm: True; or
    False when cublasGemmEx is the choice, or the kind is new and the stream is capturing (the caller runs
    cublasGemmEx). gemm_ex(target, accumulate) runs cublasGemmEx's product into target, for the timing."""
    import cupy

    key = kind(a, b, trans, out, out_type)
    if key not in _choices:
        if cupy.cuda.get_current_stream().is_capturing():
            return False
        _choices[key] = _time_choice(key, a, b, out, gemm_ex, accumulate)
    choice = _choices[key]
    if choice == GEMM_EX:
        return False
    cublaslt.check(_products[key].run(choice, a, b, out, accumulate), "bf16 matmul")
    return True


def kind(a: Any, b: Any, trans: tuple[bool, bool], out: Any, out_type: int) -> tuple:
    """The kind of product out = op(a) @ op(b) a choice is kept for: (device, M, N, K, trans, out_type,
    the pointers' alignment)."""
    import cupy

    (m, k), n = (a.shape[::-1] if trans[0] else a.shape), (b.shape[0] if trans[1] else b.shape[1])
    return (cupy.cuda.Device().id, m, n, k, trans, out_type, cublaslt.alignment(a, b, out))


def candidates(key: tuple, count: int = TUNE_CANDIDATES) -> cublaslt.Product:
    """The kind's cuBLASLt description with the heuristic's first `count` candidates (split-K partial sums of
    a bf16 output kept in float32)."""
    _, m, n, k, trans, out_type, align = key
    mask = cublaslt.REDUCTION_IN_FLOAT32 if out_type == CUDA_R_16BF else None
    return cublaslt.Product(m, n, k, trans, (CUDA_R_16BF, CUDA_R_16BF, out_type), align, count, mask)


def _time_choice(
    key: tuple, a: Any, b: Any, out: Any, gemm_ex: Callable[[Any, bool], None], accumulate: bool
) -> int:
    """The kind's choice: the fastest cuBLASLt candidate if TUNE_MARGIN faster than cublasGemmEx, timed into
    out itself where the call overwrites it anyway (no second output-sized array at the step's peak), else
    into a scratch output (out keeps the values the call adds to)."""
    import cupy

    product = _products[key] = candidates(key)
    scratch = out
    # the scratch is its own cudaMalloc, not the current allocator's: a captured step's memory plan
    # records the requests its body makes every step, and this one is made once
    if accumulate:
        memory = cupy.cuda.MemoryPointer(cupy.cuda.Memory(out.nbytes), 0)
        scratch = cupy.ndarray(out.shape, out.dtype, memory)
    best, best_ms = GEMM_EX, time_ms(lambda: gemm_ex(scratch, False)) * (1.0 - TUNE_MARGIN)
    for i in range(product.count):
        if product.run(i, a, b, scratch, False) != 0:  # a candidate this call cannot take
            continue
        ms = time_ms(lambda i=i: product.run(i, a, b, scratch, False))
        if ms < best_ms:
            best, best_ms = i, ms
    return best


def time_ms(call: Callable[[], Any], reps: int = TUNE_REPS) -> float:
    """Milliseconds for `reps` calls on the current stream, after one untimed (the host's lead, so launch
    costs do not show as GPU time)."""
    import cupy

    call()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        call()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop)
