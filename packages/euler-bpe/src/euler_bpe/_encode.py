"""Applying learned merges to one pretokenized word, and to whole texts through a word cache.

Merges apply by rank: the adjacent pair with the lowest rank merges first, at every place it occurs,
left to right without overlap; then the next lowest, until no adjacent pair has a merge. This is the
rule of GPT-2's original encoder (and therefore of tiktoken's `gpt2` encoding).

>>> merges = {(104, 105): (0, 256)}          # (left id, right id) -> (rank, merged id)
>>> merge_word([104, 105, 104, 105], merges)
[256, 256]
"""

from __future__ import annotations

import heapq
from array import array
from itertools import islice, pairwise, repeat

from euler_bpe._pretokenize import GPT2_PATTERN, chunk_text, finder, split_chunks

Merges = dict[tuple[int, int], tuple[int, int]]

# Words longer than this use the heap algorithm, which is O(n log n) instead of O(n^2).
LONG_WORD = 48


def replace_pair(
    ids: list[int], pair: tuple[int, int], new_id: int, start: int = 0
) -> tuple[list[int], list[int]]:
    """Every non-overlapping occurrence of `pair` in `ids` from `start`, left to right, becomes `new_id`;
    also returns the positions of the new ids (training updates its pair counts around them).

    >>> replace_pair([1, 2, 1, 2, 2], (1, 2), 9)
    ([9, 9, 2], [0, 1])
    """
    first, second = pair
    out, at, n = ids[:start], [], len(ids)
    while True:
        try:
            i = ids.index(first, start)
        except ValueError:
            break
        if i + 1 < n and ids[i + 1] == second:
            out += ids[start:i]
            at.append(len(out))
            out.append(new_id)
            start = i + 2
        else:
            out += ids[start : i + 1]
            start = i + 1
    out += ids[start:]
    return out, at


_NONE = (1 << 62, -1)  # the (rank, id) of a pair that has no merge: above every rank


def merge_word(ids: list[int], merges: Merges) -> list[int]:
    """Apply `merges` to the token ids of one word (short words: repeated min over adjacent pairs)."""
    if len(ids) > LONG_WORD:
        return merge_long_word(ids, merges)
    get, ids = merges.get, list(ids)
    found = list(map(get, pairwise(ids), repeat(_NONE)))  # (rank, merged id) of each adjacent pair
    while found:
        best = min(found)
        if best is _NONE:
            break
        i = found.index(best)  # the leftmost occurrence
        if found.count(best) == 1:
            # The common case, one occurrence: merge in place; only the two neighbouring pairs change.
            new = best[1]
            ids[i : i + 2] = [new]
            del found[i]
            if i > 0:
                found[i - 1] = get((ids[i - 1], new), _NONE)
            if i < len(found):
                found[i] = get((new, ids[i + 1]), _NONE)
        else:
            ids, _ = replace_pair(ids, (ids[i], ids[i + 1]), best[1], i)
            found = list(map(get, pairwise(ids), repeat(_NONE)))
    return ids


def merge_long_word(ids: list[int], merges: Merges) -> list[int]:
    """The same result as `merge_word`, with a heap of (rank, position) over a linked list of parts."""
    tok, n = list(ids), len(ids)
    nxt, prv, alive = list(range(1, n + 1)), list(range(-1, n - 1)), [True] * n
    heap = [(merges[p][0], i) for i, p in enumerate(pairwise(tok)) if p in merges]
    heapq.heapify(heap)
    while heap:
        rank, touched = heap[0][0], []
        # Merge every current occurrence of this rank's pair, left to right, before any new pair.
        while heap and heap[0][0] == rank:
            i = heapq.heappop(heap)[1]
            j = nxt[i] if alive[i] else n
            entry = merges.get((tok[i], tok[j])) if j < n else None
            if entry is None or entry[0] != rank:
                continue  # stale: this position changed since it was pushed
            tok[i], alive[j], nxt[i] = entry[1], False, nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            touched += [prv[i], i]
        for i in touched:
            if i >= 0 and alive[i] and nxt[i] < n and (tok[i], tok[nxt[i]]) in merges:
                heapq.heappush(heap, (merges[tok[i], tok[nxt[i]]][0], i))
    return [t for t, keep in zip(tok, alive) if keep]


def exact_bytes(text: str, raw: bool) -> bytes | None:
    """UTF-8 of `text`, with lone surrogates as the bytes they escape when `raw`; None if some cannot be."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        if raw:
            try:
                return text.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                pass
    return None


def word_bytes(word: str, raw: bool) -> bytes:
    """UTF-8 of a word; lone surrogates are raw bytes when `raw` (surrogateescape), else U+FFFD."""
    data = exact_bytes(word, raw)
    if data is not None:
        return data
    # What tiktoken does: every lone surrogate becomes U+FFFD.
    return word.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


class WordCache(dict):
    """word -> the bytes of its ids as an array of the encoder's typecode; a missing word is merged and
    stored by the encoder (``__missing__``), so a lookup of every word is one ``map`` in C."""

    __slots__ = ("encoder",)

    def __missing__(self, word: str) -> bytes:
        return self.encoder._miss(word)


class ChunkCache(dict):
    """chunk key (see `split_chunks`) -> the bytes of its words' ids, joined from the word cache (a
    missing chunk is pretokenized and stored in ``__missing__``)."""

    __slots__ = ("findall", "limit", "words")

    def __missing__(self, key: str) -> bytes:
        if len(self) >= self.limit:
            self.clear()  # a crude bound on memory: start over
        ids = self[key] = b"".join(map(self.words.__getitem__, self.findall(chunk_text(key))))
        return ids


class WordEncoder:
    """Encodes text without special tokens: pretokenize, then merge each word once (cached).

    The cache holds each word's ids as packed bytes (``typecode``: "H" when every id fits 16 bits, else
    "I"), so a text's ids are one ``b"".join`` of its words' entries: no Python int per token. With
    GPT-2's pattern, text is cut at its spaces into chunks (`split_chunks`: a word with its punctuation, a
    newline and the word after it, ...) whose ids are cached as well, so most of a text is one
    ``str.split`` and one lookup per chunk, without the regex.

    >>> enc = WordEncoder(list(range(256)), {(104, 105): (0, 256)})
    >>> enc.encode("hi hi"), enc.encode_array("hi hi")
    ([256, 32, 256], array('H', [256, 32, 256]))
    """

    def __init__(
        self, byte_ids: list[int], merges: Merges, pattern: str | None = None, cache_limit: int = 1 << 20
    ):
        self.byte_ids = byte_ids  # byte value -> token id
        self.merges = merges
        self.findall = finder(pattern or GPT2_PATTERN)
        top = max([*byte_ids, *(new for _, new in merges.values())], default=0)
        self.typecode = "H" if top < 1 << 16 else "I"
        self.cache = WordCache()
        self.cache.encoder = self
        self.cache_limit = cache_limit
        # GPT-2's pattern: text is looked up by chunks (a word with its punctuation, ...), not words
        self.chunks = ChunkCache() if self.findall is finder(GPT2_PATTERN) else None
        if self.chunks is not None:
            self.chunks.findall, self.chunks.limit, self.chunks.words = self.findall, cache_limit, self.cache

    def bytes_ids(self, data: bytes) -> tuple[int, ...]:
        """The ids of one pretokenized word given as bytes (not cached)."""
        return tuple(merge_word(list(map(self.byte_ids.__getitem__, data)), self.merges))

    def word_ids(self, word: str, raw: bool = False) -> tuple[int, ...]:
        """The ids of one pretokenized word (not cached; the cache is managed by `encode`)."""
        return self.bytes_ids(word_bytes(word, raw))

    def _miss(self, word: str) -> bytes:
        """Merge a word of valid text (no lone surrogates) and cache it."""
        if len(self.cache) >= self.cache_limit:
            self.cache.clear()  # a crude bound on memory: start over
        ids = self.cache[word] = array(self.typecode, self.bytes_ids(word.encode("utf-8"))).tobytes()
        return ids

    def _words_ids(self, text: str) -> bytes:
        """The packed ids of valid text, a lookup of each word."""
        return b"".join(map(self.cache.__getitem__, self.findall(text)))

    def _text_ids(self, text: str) -> bytes:
        """The packed ids of valid text: by chunks (GPT-2's pattern) or by words."""
        if self.chunks is None:
            return self._words_ids(text)
        out = []
        for keyed, items in split_chunks(text):
            if not keyed:  # words
                out.append(b"".join(map(self.cache.__getitem__, items)))
                continue
            if items[0]:  # the text before the first space
                out.append(self._words_ids(items[0]))
            out.append(b"".join(map(self.chunks.__getitem__, islice(items, 1, None))))
        return b"".join(out)

    def warm(self, words: dict[bytes, list[int]]) -> None:
        """Cache words whose ids are already known (UTF-8 bytes -> ids; other bytes are skipped).

        >>> enc = WordEncoder(list(range(256)), {(104, 105): (0, 256)})
        >>> enc.warm({b"hi": [256], b"\\xff": [255]}); list(enc.cache)
        ['hi']
        """
        for data, ids in words.items():
            if len(self.cache) >= self.cache_limit:
                break
            try:
                self.cache[data.decode("utf-8")] = array(self.typecode, ids).tobytes()
            except UnicodeDecodeError:
                continue  # not a str word (raw bytes of a file): the encoder never looks it up

    def encode_array(self, text: str, raw: bool = False) -> array:
        """Token ids of `text` as an array of `typecode`; `raw`: lone surrogates stand for raw bytes."""
        out = array(self.typecode)
        if text.isascii() or exact_bytes(text, False) is not None:  # valid text: every word is cached
            if not self.merges:  # the byte tokenizer: the ids are the bytes, no words
                out.extend(map(self.byte_ids.__getitem__, text.encode("utf-8")))
            else:
                out.frombytes(self._text_ids(text))
            return out
        # lone surrogates: a word's bytes depend on `raw`, so such text is merged word by word, uncached
        if not self.merges:
            data = exact_bytes(text, raw)
            if data is not None:
                out.extend(map(self.byte_ids.__getitem__, data))
                return out
        for word in self.findall(text):
            out.extend(self.word_ids(word, raw))
        return out

    def encode(self, text: str, raw: bool = False) -> list[int]:
        """Token ids of `text`; `raw` means lone surrogates stand for raw bytes (see `word_bytes`)."""
        return self.encode_array(text, raw).tolist()
