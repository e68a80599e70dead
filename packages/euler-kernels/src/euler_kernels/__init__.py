"""Forward/backward op pairs on NumPy (CPU) and CuPy (GPU) arrays, with a float64 gradient checker."""

from euler_kernels.__about__ import __version__

__all__ = ["__version__"]
