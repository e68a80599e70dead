"""RoPE: rope.py (tables, forward, backward; NumPy reference and GPU dispatch), its launcher rope_cuda.py and
kernels rope.cu."""
