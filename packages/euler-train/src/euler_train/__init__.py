"""The euler CLI: pretrain, SFT, chat, generate, check, export-hf, plot."""

from euler_train.__about__ import __version__

__all__ = ["__version__"]
