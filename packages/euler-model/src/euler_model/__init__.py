"""A Llama-style decoder with multi-token prediction, generation, checkpoints and Hugging Face interop."""

from euler_model.__about__ import __version__

__all__ = ["__version__"]
