"""Matrix products, every precision, training and decode.

linear.py (the linear op: forward, backward, weight gradient; NumPy reference and GPU dispatch) with
linear_fp8.py (its FP8 path: weight copies, e4m3/e5m2 operands) and decode_linear.py (a few rows through a
layer per decode step, the norm and SwiGLU fused in). On the GPU: gemm.py (cublasGemmEx through ctypes),
gemm_tuned.py (bf16 products: cublasGemmEx or a faster cuBLASLt candidate), cublaslt.py and blas.py (the
cuBLASLt bindings, the shared cuBLAS numbers), gemm_fp8.py (FP8 products through cuBLASLt), fp8.py + fp8.cu
(FP8 copies; fp8_format.py is their NumPy reference), fp8_scales.py + .cu (delayed FP8 scales), and
decode_linear_cuda.py over decode_linear.cu and decode_linear_mma.cu.
"""
