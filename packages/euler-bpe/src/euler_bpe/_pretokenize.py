"""Pretokenization: split text into words before BPE, exactly as GPT-2 and tiktoken's `gpt2` do.

A leading space stays attached to the word that follows it, runs of whitespace stay together except
for the last space before a word, and English contractions split off.

>>> split_words("Hello world's  end")
['Hello', ' world', "'s", ' ', ' end']
"""

from __future__ import annotations

import regex

# The GPT-2 pattern (also HF ByteLevel's and tiktoken's `gpt2` pat_str).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_COMPILED: dict[str, regex.Pattern] = {}


def compile_pattern(pattern: str = GPT2_PATTERN) -> regex.Pattern:
    """The compiled pattern, cached; raises ValueError when it does not compile."""
    if pattern not in _COMPILED:
        try:
            _COMPILED[pattern] = regex.compile(pattern)
        except regex.error as err:
            raise ValueError(f"compile_pattern: invalid pretokenization pattern {pattern!r}: {err}") from None
    return _COMPILED[pattern]


def split_words(text: str, pattern: str = GPT2_PATTERN) -> list[str]:
    """The pretokens of `text`, in order; their concatenation is `text`."""
    return compile_pattern(pattern).findall(text)


def special_splitter(specials: list[str]) -> regex.Pattern:
    """A pattern whose `split` keeps the special tokens as separate pieces (longest first)."""
    ordered = sorted(specials, key=lambda s: (-len(s), s))
    return regex.compile("(" + "|".join(regex.escape(s) for s in ordered) + ")")
