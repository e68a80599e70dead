"""Errors raised by euler-bpe."""

from __future__ import annotations


class TokenizerFileError(ValueError):
    """A tokenizer file is missing pieces, truncated, of an unknown version or otherwise inconsistent."""
