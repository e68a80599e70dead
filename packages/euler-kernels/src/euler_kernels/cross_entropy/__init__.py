"""Cross-entropy: cross_entropy.py (forward, backward; NumPy reference and GPU dispatch), its launcher
cross_entropy_cuda.py and kernels cross_entropy.cu."""
