"""The embedding: embedding.py (forward, backward; NumPy reference and GPU dispatch), its launcher
embedding_cuda.py and kernels embedding.cu (the backward's scatter-add)."""
