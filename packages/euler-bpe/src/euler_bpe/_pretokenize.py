"""Pretokenization: split text into words before BPE, exactly as GPT-2 and tiktoken's `gpt2` do.

A leading space stays attached to the word that follows it, runs of whitespace stay together except
for the last space before a word, and English contractions split off.

>>> split_words("Hello world's  end")
['Hello', ' world', "'s", ' ', ' end']
"""

from __future__ import annotations

import re
from collections.abc import Callable

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


# --- a faster path for GPT2_PATTERN ----------------------------------------------------------------
# On text whose non-ASCII characters are neither letters, digits nor whitespace, the stdlib `re`
# pattern below gives exactly GPT2_PATTERN's pretokens, about twice as fast. Such stretches are cut
# at a newline after a visible ASCII character, where both patterns always split. Letters come
# first (the most common word, ~15% faster): no contraction can match where a letter word starts.
_ASCII_GPT2 = re.compile(
    r""" ?[A-Za-z]+|'s|'t|'re|'ve|'m|'ll|'d| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""", re.ASCII
)
_NOT_ASCII_SAFE = regex.compile(r"[^\x00-\x7f](?<=[\p{L}\p{N}\s])")
_SAFE_NEWLINE = re.compile(r"(?<=[!-~])\n")


def _safe_before(text: str, lo: int, p: int) -> int:
    """The last cut in [lo, p] where both patterns split (a newline after a visible ASCII char)."""
    q = text.rfind("\n", lo, p)
    while q > lo and not "!" <= text[q - 1] <= "~":
        q = text.rfind("\n", lo, q)
    return max(q, lo)


def gpt2_findall(text: str) -> list[str]:
    """`split_words(text)` for GPT2_PATTERN, with `re` on the stretches where that is exact.

    >>> gpt2_findall("naïve café, “quoted” text\\n") == split_words("naïve café, “quoted” text\\n")
    True
    """
    slow, words, pos = compile_pattern(GPT2_PATTERN), [], 0
    while (m := _NOT_ASCII_SAFE.search(text, pos)) is not None:
        start = _safe_before(text, pos, m.start())
        end_match = _SAFE_NEWLINE.search(text, m.end())
        end = end_match.start() if end_match else len(text)
        words += _ASCII_GPT2.findall(text, pos, start)
        words += slow.findall(text, start, end)
        pos = end
    words += _ASCII_GPT2.findall(text, pos)
    return words


def finder(pattern: str) -> Callable[[str], list[str]]:
    """The fastest exact `findall` for `pattern`."""
    return gpt2_findall if pattern == GPT2_PATTERN else compile_pattern(pattern).findall
