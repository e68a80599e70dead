"""Checking a vocabulary and building the lookup tables that encoding needs.

>>> tables = build_tables([bytes([b]) for b in range(256)] + [b"hi"], [(104, 105)], {})
>>> tables.merges[(104, 105)], tables.byte_ids[104]
((0, 256), 104)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from euler_bpe._encode import Merges


@dataclass(frozen=True)
class Tables:
    byte_ids: list[int]  # byte value -> id of its single-byte token
    merges: Merges  # (left id, right id) -> (rank, merged id)


def _check_specials(n: int, specials: Mapping[str, int]) -> None:
    if len(set(specials.values())) != len(specials):
        raise ValueError(f"Tokenizer: two special tokens share an id: {dict(specials)}")
    for name, i in specials.items():
        if not isinstance(name, str) or not name or not isinstance(i, int) or not 0 <= i < n:
            raise ValueError(
                f"Tokenizer: special token {name!r} -> {i!r} must be a non-empty str with id < {n}"
            )


def _normal_index(tokens: Sequence[bytes], special_ids: set[int]) -> dict[bytes, int]:
    """bytes -> id over the tokens that are not special; two ids with the same bytes are an error."""
    index: dict[bytes, int] = {}
    for i, t in enumerate(tokens):
        if i in special_ids:
            continue
        if not isinstance(t, bytes) or not t:
            raise ValueError(f"Tokenizer: token {i} must be non-empty bytes, got {t!r}")
        if t in index:
            raise ValueError(f"Tokenizer: tokens {index[t]} and {i} are both {t!r}")
        index[t] = i
    missing = [b for b in range(256) if bytes([b]) not in index]
    if missing:
        raise ValueError(f"Tokenizer: the byte alphabet is incomplete; missing bytes {missing[:8]}...")
    return index


def build_tables(
    tokens: Sequence[bytes], merges: Sequence[tuple[int, int]], specials: Mapping[str, int]
) -> Tables:
    """Validate tokens, merges (in rank order) and special ids; raises ValueError naming the problem."""
    _check_specials(len(tokens), specials)
    special_ids = set(specials.values())
    index = _normal_index(tokens, special_ids)
    table: Merges = {}
    for rank, pair in enumerate(merges):
        left, right = pair
        ok = all(isinstance(i, int) and 0 <= i < len(tokens) and i not in special_ids for i in pair)
        if not ok:
            raise ValueError(f"Tokenizer: merge {rank} {pair} needs two ids of ordinary tokens")
        merged = index.get(tokens[left] + tokens[right])
        if merged is None:
            raise ValueError(
                f"Tokenizer: merge {rank} {pair} makes {tokens[left] + tokens[right]!r}, not a token"
            )
        if (left, right) in table:
            raise ValueError(f"Tokenizer: merge {rank} {pair} repeats an earlier merge")
        table[left, right] = (rank, merged)
    return Tables([index[bytes([b])] for b in range(256)], table)
