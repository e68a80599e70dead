"""SwiGLU: swiglu.py (forward, backward, their FP8 forms; NumPy reference and GPU dispatch), its launcher
swiglu_cuda.py and kernels swiglu.cu."""
