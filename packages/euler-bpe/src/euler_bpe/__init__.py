"""A hand-written byte-level BPE tokenizer (GPT-2 pretokenization), standalone."""

from euler_bpe.__about__ import __version__

__all__ = ["__version__"]
