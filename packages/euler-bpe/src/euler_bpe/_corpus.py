"""Reading a training corpus (strings, bytes or files) in pieces and counting its pretokenized words.

Files are read as bytes; invalid UTF-8 never fails: such bytes travel as lone surrogates
(`surrogateescape`) and come back as the same raw bytes when words are turned into bytes.

>>> sorted(count_words(["a b a", "<|end|>a"], specials=["<|end|>"]).items())
[(b' a', 1), (b' b', 1), (b'a', 2)]
"""

from __future__ import annotations

import multiprocessing
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from euler_bpe._encode import word_bytes
from euler_bpe._pretokenize import GPT2_PATTERN, finder, special_splitter
from euler_bpe._workers import leave_interrupts_to_parent

Source = str | bytes | os.PathLike
PIECE = 1 << 20  # about 1 MiB of text per piece


_SAFE = {str: re.compile(r"(?<=[!-~])\n"), bytes: re.compile(rb"(?<=[!-~])\n")}


def safe_cut(data: str | bytes, end: int, lo: int = 0) -> int:
    """The last position in [lo, end) where GPT-2 pretokenization surely splits: a newline after a
    visible ASCII character (no pretoken holds both); `end` itself if there is none. (For another
    pattern, training pieces cut here are a close approximation; encoding then never cuts.)

    >>> safe_cut("ab  \\ncd\\nef", 10), safe_cut("ab  \\ncd\\nef", 6)
    (7, 6)
    """
    newline = "\n" if isinstance(data, str) else b"\n"
    pos = data.rfind(newline, max(lo, 1), end)
    while pos > 0:
        prev = data[pos - 1]
        if 0x21 <= (prev if isinstance(prev, int) else ord(prev)) <= 0x7E:
            return pos
        pos = data.rfind(newline, max(lo, 1), pos)
    return end


def split_safely(data: str | bytes, size: int = PIECE) -> Iterator[str | bytes]:
    """Pieces of about `size` (longer where no safe cut is near) whose pretokens, one piece after
    the other, are exactly those of the whole `data`."""
    start, n = 0, len(data)
    while n - start > size:
        cut = safe_cut(data, start + size, lo=start + 1)
        if cut == start + size:  # none before the target: take the first one after it
            after = _SAFE[type(data)].search(data, start + size)
            cut = after.start() if after else n
        yield data[start:cut]
        start = cut
    if start < n:
        yield data[start:]


def _read_file(path: Path) -> Iterator[str]:
    """A file's text in pieces, read as bytes; invalid UTF-8 becomes lone surrogates."""
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(PIECE):
            block = tail + block
            cut = safe_cut(block, len(block))
            if cut == len(block) and len(block) < 16 * PIECE:
                tail = block  # no safe place yet: read on
                continue
            while 0 < cut < len(block) and 0x80 <= block[cut] < 0xC0:
                cut -= 1  # never cut inside a UTF-8 sequence
            tail = block[cut:]
            yield block[:cut].decode("utf-8", "surrogateescape")
    if tail:
        yield tail.decode("utf-8", "surrogateescape")


def _without_surrogates(text: str) -> str:
    """Lone surrogates in a str become U+FFFD, as `encode` treats them."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def iter_pieces(sources: Iterable[Source]) -> Iterator[str]:
    """str: text; bytes: UTF-8 (invalid bytes allowed); os.PathLike: a file to read."""
    for source in sources:
        if isinstance(source, os.PathLike):
            yield from _read_file(Path(source))
        elif isinstance(source, bytes):
            yield from split_safely(source.decode("utf-8", "surrogateescape"))
        elif isinstance(source, str):
            yield from split_safely(_without_surrogates(source))
        else:
            raise TypeError(f"train: a source must be str, bytes or a path, got {type(source).__name__}")


def source_size(source: Source) -> int:
    """Bytes (files, bytes) or characters (str) in one source, for sampling."""
    return os.path.getsize(source) if isinstance(source, os.PathLike) else len(source)


def sample_pieces(sources: Iterable[Source], sample_bytes: int | None) -> Iterator[str]:
    """All pieces (streamed: an iterator of sources is read once), or about `sample_bytes` of them
    spread evenly over the whole corpus (then the sources are listed first, to know the total)."""
    if sample_bytes is None:
        yield from iter_pieces(sources)
        return
    if sample_bytes <= 0:
        raise ValueError(f"train: sample_bytes must be positive, got {sample_bytes}")
    sources = list(sources)
    total = sum(source_size(s) for s in sources)
    if total <= sample_bytes:
        yield from iter_pieces(sources)
        return
    ratio, seen, kept = sample_bytes / total, 0, 0
    grain = min(PIECE, max(4096, sample_bytes // 256))  # at least ~256 stretches in the sample
    for piece in iter_pieces(sources):
        for part in split_safely(piece, grain):
            seen += len(part)
            if kept < seen * ratio:  # keep a stretch whenever the kept share falls behind the target
                kept += len(part)
                yield part


def _batches(pieces: Iterable[str], size: int = PIECE) -> Iterator[list[str]]:
    batch, n = [], 0
    for piece in pieces:
        batch.append(piece)
        n += len(piece)
        if n >= size:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


def _count_batch(args: tuple[list[str], str, list[str]]) -> Counter:
    """Word counts (str keys) of one batch of pieces; special tokens are cut out and not counted."""
    pieces, pattern, specials = args
    findall, counts = finder(pattern), Counter()
    splitter = special_splitter(specials) if specials else None
    for piece in pieces:
        for i, part in enumerate(splitter.split(piece) if splitter else [piece]):
            if i % 2 == 0:  # odd parts are the special tokens themselves
                counts.update(findall(part))
    return counts


def count_words(
    pieces: Iterable[str], pattern: str = GPT2_PATTERN, specials: list[str] = (), workers: int = 1
) -> dict[bytes, int]:
    """Counts of unique pretokenized words, as bytes, over all pieces (`workers` processes)."""
    jobs = ((batch, pattern, list(specials)) for batch in _batches(pieces))
    total: Counter = Counter()
    if workers > 1:
        with multiprocessing.get_context(_context()).Pool(workers, leave_interrupts_to_parent) as pool:
            for counts in pool.imap_unordered(_count_batch, jobs):
                total.update(counts)
    else:
        for job in jobs:
            total.update(_count_batch(job))
    merged: dict[bytes, int] = Counter()
    for word, c in total.items():
        merged[word_bytes(word, raw=True)] += c  # two spellings may give the same bytes
    return dict(merged)


def _context() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
