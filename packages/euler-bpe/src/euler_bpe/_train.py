"""Learning BPE merges from word counts, incrementally.

Each unique pretokenized word is a list of token ids with a count. Pair counts are kept in a dict and
updated only for the words that a merge touches; a heap with lazy invalidation yields the best pair.
Ties: the highest count wins, then the smallest pair compared by (left bytes, right bytes).

>>> merges, tokens = learn_merges({b"aaab": 2, b"ab": 3}, num_tokens=258)
>>> [(tokens[a], tokens[b]) for a, b, _ in merges]
[(b'a', b'b'), (b'a', b'a')]
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from itertools import pairwise

from euler_bpe._encode import replace_pair

Pair = tuple[int, int]


class _PairTable:
    """Pair counts, the words each pair occurs in, and a max-heap over (count, bytes) with lazy entries."""

    def __init__(self, words: list[list[int]], counts: list[int], tokens: list[bytes]):
        self.tokens = tokens
        self.count: dict[Pair, int] = defaultdict(int)
        self.where: dict[Pair, set[int]] = defaultdict(set)
        for wi, (word, c) in enumerate(zip(words, counts)):
            for pair in pairwise(word):
                self.count[pair] += c
                self.where[pair].add(wi)
        self.heap = [self._entry(p, c) for p, c in self.count.items()]
        heapq.heapify(self.heap)

    def _entry(self, pair: Pair, count: int) -> tuple:
        return (-count, self.tokens[pair[0]], self.tokens[pair[1]], pair)

    def best(self) -> tuple[Pair, int] | None:
        """The pair to merge next with its count, or None when no pair is left."""
        while self.heap:
            neg, _, _, pair = self.heap[0]
            if self.count.get(pair, 0) == -neg and neg < 0:
                return pair, -neg
            heapq.heappop(self.heap)  # stale: the count changed after this entry was pushed
        return None

    def apply(self, delta: dict[Pair, int]) -> None:
        """Add count changes and push fresh heap entries for the pairs that changed."""
        for pair, d in delta.items():
            if d == 0:
                continue
            new = self.count[pair] + d
            if new > 0:
                self.count[pair] = new
                heapq.heappush(self.heap, self._entry(pair, new))
            else:
                del self.count[pair]


def _merge_everywhere(table: _PairTable, words: list[list[int]], counts: list[int], pair: Pair, new_id: int):
    """Rewrite every word that contains `pair`; only the pairs around each merge change count."""
    delta: dict[Pair, int] = defaultdict(int)
    where, (a, b) = table.where, pair
    for wi in where.pop(pair, ()):
        new, at = replace_pair(words[wi], pair, new_id)
        if not at:
            continue  # the pair left this word in an earlier merge
        c, m = counts[wi], len(new)
        delta[pair] -= c * len(at)
        for j, k in enumerate(at):
            if k > 0:
                # Left neighbour; after an adjacent merge (a b a b) the old pair was (b, a).
                left = new[k - 1]
                old, fresh = (
                    ((b, a), (new_id, new_id)) if j and at[j - 1] == k - 1 else ((left, a), (left, new_id))
                )
                delta[old] -= c
                delta[fresh] += c
                where[fresh].add(wi)
            if k + 1 < m and not (j + 1 < len(at) and at[j + 1] == k + 1):
                right = new[k + 1]  # an adjacent merge on the right counts this pair as its left
                delta[b, right] -= c
                delta[new_id, right] += c
                where[new_id, right].add(wi)
        words[wi] = new
    table.apply(delta)


def learn_merges(
    word_counts: dict[bytes, int],
    num_tokens: int,
    progress: Callable[[int, int], None] | None = None,
    final_words: dict[bytes, list[int]] | None = None,
) -> tuple[list[tuple[int, int, int]], list[bytes]]:
    """Merge until there are `num_tokens` tokens; returns ([(left, right, merged id)], tokens by id).

    Ids 0..255 are the single bytes; each merge adds one token unless its bytes already exist (then
    the merge reuses that id). Stops early when no adjacent pair is left in any word. `final_words`,
    if given, receives each word's ids after the last merge.
    """
    if num_tokens < 256:
        raise ValueError(f"learn_merges: num_tokens must be >= 256 (the byte alphabet), got {num_tokens}")
    tokens = [bytes([b]) for b in range(256)]
    index = {t: i for i, t in enumerate(tokens)}
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    table = _PairTable(words, counts, tokens)
    merges: list[tuple[int, int, int]] = []
    while len(tokens) < num_tokens and (top := table.best()) is not None:
        (left, right), _ = top
        merged = tokens[left] + tokens[right]
        if merged not in index:
            index[merged] = len(tokens)
            tokens.append(merged)
        merges.append((left, right, index[merged]))
        _merge_everywhere(table, words, counts, (left, right), index[merged])
        if progress is not None:
            progress(len(tokens), num_tokens)
    if progress is not None and len(tokens) < num_tokens:
        progress(len(tokens), len(tokens))  # out of pairs: the end is nearer than asked
    if final_words is not None:
        final_words.update(zip(word_counts, words))
    return merges, tokens


def vocab_note(asked: int, got: int) -> str | None:
    """What to tell someone who asked for `asked` tokens when training ran out of pairs at `got`.

    >>> vocab_note(60000, 10875)
    'asked for 60000 tokens, the text supports 10875; the tokenizer has 10875'
    >>> vocab_note(512, 512) is None
    True
    """
    if got >= asked:
        return None
    return f"asked for {asked} tokens, the text supports {got}; the tokenizer has {got}"
