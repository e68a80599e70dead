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
# pattern below gives exactly GPT2_PATTERN's pretokens, faster (docs/benchmarks/bpe.md). Such stretches
# are cut at a newline after a visible ASCII character, where both patterns always split. Letters come
# first (the most common word, so most matches end at the first alternative): no contraction can match
# where a letter word starts.
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
    if text.isascii():  # no stretch to hand to the slow pattern
        return _ASCII_GPT2.findall(text)
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


# --- chunks: the GPT-2 words of text split at its spaces -------------------------------------------
# GPT2_PATTERN never makes a word of a non-space character followed by a space, and a word's match
# starts over after one; so text cut before each space (a newline cut the same way, " \n") is a list of
# chunks that pretokenize alone as they do in the whole text, provided no run of whitespace needs the
# pattern's `\s+(?!\S)` (a run of 3+, a run of 2 at the end, or whitespace other than " " and "\n":
# those stretches keep the pattern). Chunks repeat like words, so their ids are cached too.
# GPT2_PATTERN's whitespace (`regex`'s \s, Unicode White_Space) other than " " and "\n"
OTHER_SPACE = (
    "\t\x0b\x0c\r\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
_SPACE = frozenset(OTHER_SPACE + " \n")
_OTHER_SPACE = re.compile(f"[{OTHER_SPACE}]")
# a newline in a run of 3+ spaces and newlines (the runs that do not hold one are "   ")
_RUN_AT_NEWLINE = re.compile(r"\n(?:[ \n]{2}|(?<=[ \n]\n)[ \n]|(?<=[ \n]{2}\n))")
_SPACES = regex.compile(r"\s*")
_NEXT_SPACE = regex.compile(r"\s|\Z")


def pattern_spots(text: str) -> list[int]:
    """Positions, in order, in every run of whitespace of `text` that must be split by the pattern."""
    spots = [m.start() for m in _RUN_AT_NEWLINE.finditer(text)]
    at = text.find("   ")
    while at >= 0:
        spots.append(at)
        at = text.find("   ", at + 3)
    if any(c in text for c in "\t\x0b\x0c\r") or not text.isascii():
        spots += [m.start() for m in _OTHER_SPACE.finditer(text)]
    if text[-2:-1] in _SPACE and text[-1:] in _SPACE:  # a run of 2 at the end
        spots.append(len(text) - 1)
    return sorted(spots)


def chunk_text(key: str) -> str:
    """The text a chunk key after the first stands for: a space and the key, or a newline-led key itself."""
    return key if key[:1] == "\n" else " " + key


def split_chunks(text: str) -> list[tuple[bool, list[str]]]:
    """`text` as segments, in order: (True, keys) where it can be cut at spaces (the first key is text
    of its own; each later one stands for `chunk_text(key)`), (False, words) for the stretches that keep
    GPT2_PATTERN. The words of all segments, in order, are `split_words(text)`.

    >>> split_chunks("It is, so\\n\\n   said")
    [(True, ['It', 'is,', 'so']), (False, ['\\n\\n  ', ' said'])]
    """
    out, pos = [], 0
    for spot in pattern_spots(text):
        if spot < pos:
            continue  # in the run of whitespace the last stretch took
        start = spot
        while start > pos and text[start - 1] in _SPACE:  # back to the start of the run
            start -= 1
        # up to the end of the non-space chunk after the run: the run's last space belongs to it
        end = _NEXT_SPACE.search(text, _SPACES.match(text, spot).end()).start()
        if start > pos:
            out.append((True, text[pos:start].replace("\n", " \n").split(" ")))
        out.append((False, gpt2_findall(text[start:end])))
        pos = end
    if pos < len(text) or not out:
        out.append((True, text[pos:].replace("\n", " \n").split(" ")))
    return out
