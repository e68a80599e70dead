"""How a model's products and attention are computed on the GPU, as one value made once and passed down.

A run decides its precision when it is planned (euler-train's `--precision`), and hands the same
`Precision` to every op that multiplies: the linear ops, attention, the decode step. Nothing reads an
environment variable at call time. On NumPy arrays every precision computes the same exact products;
the choice matters only for float32 CuPy arrays.

matmul, the math of a float32 product:
    fp32      exact float32 products (the default)
    tf32      operands rounded to TF32 (10-bit mantissa) by the tensor cores; float32 attention too
    bf16      operands rounded to bfloat16 by us, bf16 tensor cores, float32 sums; a model keeps its
              activations between the norms and the output projections as bf16 (`Precision.bf16`)
    bf16fast  float32 operands handed to cuBLAS, which down-converts them itself (a comparison mode)
    fp8       as bf16, with the MLP's and the heads' products on the FP8 tensor cores
attention_kernel, which bf16 FlashAttention kernels run: auto (the Hopper wgmma kernels on compute
    capability 9.x, the mma.sync ones elsewhere), sm90 (insist on the Hopper ones), mma (the mma.sync
    ones everywhere, to compare).
gemm_tuning: time cuBLASLt's candidate algorithms against cublasGemmEx for each kind of bf16 product the
    first time it runs, and keep the fastest (matmul/gemm_tuned.py); False: cublasGemmEx for every product.
"""

from __future__ import annotations

from dataclasses import dataclass

MATMUL_MODES = ("fp32", "tf32", "bf16", "bf16fast", "fp8")
ATTENTION_KERNELS = ("auto", "sm90", "mma")


@dataclass(frozen=True)
class Precision:
    """The precision of one run's products (this module's docstring says what each field chooses).

    >>> Precision("bf16").bf16, Precision().matmul
    (True, 'fp32')
    """

    matmul: str = "fp32"
    attention_kernel: str = "auto"
    gemm_tuning: bool = True

    def __post_init__(self) -> None:
        if self.matmul not in MATMUL_MODES:
            modes = ", ".join(MATMUL_MODES)
            raise ValueError(f"precision: matmul must be one of {modes}, got {self.matmul!r}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(
                f"precision: attention_kernel must be one of {', '.join(ATTENTION_KERNELS)}, "
                f"got {self.attention_kernel!r}"
            )
        if not isinstance(self.gemm_tuning, bool):
            raise ValueError(f"precision: gemm_tuning must be true or false, got {self.gemm_tuning!r}")

    @property
    def bf16(self) -> bool:
        """The bf16 and fp8 modes: float32 operands are rounded to bf16 by us for the bf16 tensor cores, and
        a model on the GPU keeps its activations between the norms and the output projections as bf16 (the
        residual stream, weights, softmax statistics and the loss stay float32)."""
        return self.matmul in ("bf16", "fp8")

    @property
    def fp8(self) -> bool:
        """Whether the MLP's and the heads' products whose sizes fit run on the FP8 tensor cores."""
        return self.matmul == "fp8"

    @property
    def tf32_attention(self) -> bool:
        """Whether float32 attention runs on the TF32 tensor cores (every mode but fp32)."""
        return self.matmul != "fp32"


EXACT = Precision()  # exact float32 products: the default of every op

__all__ = ["ATTENTION_KERNELS", "EXACT", "MATMUL_MODES", "Precision"]
