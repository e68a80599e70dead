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
import itertools

from euler_bpe._pretokenize import compile_pattern

Merges = dict[tuple[int, int], tuple[int, int]]

# Words longer than this use the heap algorithm, which is O(n log n) instead of O(n^2).
LONG_WORD = 48


def _replace_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Every non-overlapping occurrence of `pair` in `ids`, left to right, becomes `new_id`."""
    first, second = pair
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == first and i + 1 < n and ids[i + 1] == second:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_word(ids: list[int], merges: Merges) -> list[int]:
    """Apply `merges` to the token ids of one word (short words: repeated min over adjacent pairs)."""
    if len(ids) > LONG_WORD:
        return merge_long_word(ids, merges)
    get = merges.get
    while len(ids) >= 2:
        found = [m for m in map(get, itertools.pairwise(ids)) if m is not None]
        if not found:
            break
        rank, new_id = min(found)
        pair = next(p for p in itertools.pairwise(ids) if get(p, (None,))[0] == rank)
        ids = _replace_pair(ids, pair, new_id)
    return ids


def merge_long_word(ids: list[int], merges: Merges) -> list[int]:
    """The same result as `merge_word`, with a heap of (rank, position) over a linked list of parts."""
    tok, n = list(ids), len(ids)
    nxt, prv, alive = list(range(1, n + 1)), list(range(-1, n - 1)), [True] * n
    heap = [(merges[p][0], i) for i, p in enumerate(itertools.pairwise(tok)) if p in merges]
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


def word_bytes(word: str, raw: bool) -> bytes:
    """UTF-8 of a word; lone surrogates are raw bytes when `raw` (surrogateescape), else U+FFFD."""
    try:
        return word.encode("utf-8")
    except UnicodeEncodeError:
        if raw:
            try:
                return word.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                pass
        # What tiktoken does: every lone surrogate becomes U+FFFD.
        return word.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


class WordEncoder:
    """Encodes text without special tokens: pretokenize, then merge each word once (cached).

    >>> enc = WordEncoder(list(range(256)), {(104, 105): (0, 256)})
    >>> enc.encode("hi hi")
    [256, 32, 256]
    """

    def __init__(
        self, byte_ids: list[int], merges: Merges, pattern: str | None = None, cache_limit: int = 1 << 20
    ):
        self.byte_ids = byte_ids  # byte value -> token id
        self.merges = merges
        self.regex = compile_pattern(pattern) if pattern else compile_pattern()
        self.cache: dict[str, tuple[int, ...]] = {}
        self.cache_limit = cache_limit

    def word_ids(self, word: str, raw: bool = False) -> tuple[int, ...]:
        """The ids of one pretokenized word (not cached; the cache is managed by `encode`)."""
        byte_ids = self.byte_ids
        return tuple(merge_word([byte_ids[b] for b in word_bytes(word, raw)], self.merges))

    def _miss(self, word: str, raw: bool) -> tuple[int, ...]:
        ids = self.word_ids(word, raw)
        if word.isascii() or not any("\ud800" <= c <= "\udfff" for c in word):
            if len(self.cache) >= self.cache_limit:
                self.cache.clear()  # a crude bound on memory: start over
            self.cache[word] = ids
        return ids

    def encode(self, text: str, raw: bool = False) -> list[int]:
        """Token ids of `text`; `raw` means lone surrogates stand for raw bytes (see `word_bytes`)."""
        get, miss, out = self.cache.get, self._miss, []
        for word in self.regex.findall(text):
            ids = get(word)
            out += ids if ids is not None else miss(word, raw)
        return out
