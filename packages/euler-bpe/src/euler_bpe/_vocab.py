"""A vocabulary as plain data: checking it, its fingerprint, and the lookup tables that encoding needs.

`Vocab` is what a Tokenizer is made of and what the file readers and writers (`_io`, `_hf`, `_gpt2`)
take and return; `tokenizer.py` turns one into a Tokenizer, so these modules never need the class.

>>> vocab = make_vocab([bytes([b]) for b in range(256)] + [b"hi"], [(104, 105)], {})
>>> vocab.tables.merges[(104, 105)], vocab.tables.byte_ids[104], vocab.kind
((0, 256), 104, 'bpe')
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from euler_bpe._encode import Merges
from euler_bpe._pretokenize import GPT2_PATTERN, compile_pattern


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


@dataclass(frozen=True)
class Vocab:
    """A checked vocabulary (made by `make_vocab`): `tokens[i]` is the bytes of id i (a special token's
    are the UTF-8 of its name), `merges` are (left id, right id) in rank order."""

    tokens: list[bytes]
    merges: list[tuple[int, int]]
    special_tokens: dict[str, int]
    pattern: str
    tables: Tables

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the content fields (`content`): equal fingerprints mean equal encodings."""
        return fingerprint(content(self))

    @cached_property
    def is_byte_level(self) -> bool:
        """No merges, id b is the byte b for every byte, the special tokens right after them."""
        specials = set(self.special_tokens.values())
        bytes_in_order = all(self.tokens[b] == bytes([b]) and b not in specials for b in range(256))
        return not self.merges and bytes_in_order and specials == set(range(256, len(self.tokens)))

    @property
    def kind(self) -> str:
        """The kind: "bytes" for the byte tokenizer (`is_byte_level`), else "bpe"."""
        return "bytes" if self.is_byte_level else "bpe"


def make_vocab(
    tokens: Sequence[bytes],
    merges: Sequence[tuple[int, int]],
    special_tokens: Mapping[str, int] | None = None,
    pattern: str = GPT2_PATTERN,
) -> Vocab:
    """The checked vocabulary of these tokens, merges, special ids and pretokenization pattern; raises
    ValueError naming the problem. A special token's bytes become the UTF-8 of its name."""
    specials: dict[str, int] = dict(special_tokens or {})
    tokens = [bytes(t) for t in tokens]
    for name, i in specials.items():
        if isinstance(i, int) and 0 <= i < len(tokens) and isinstance(name, str):
            tokens[i] = name.encode("utf-8")
    merges = [tuple(p) for p in merges]
    compile_pattern(pattern)
    return Vocab(tokens, merges, specials, pattern, build_tables(tokens, merges, specials))


def content(vocab: Vocab) -> dict[str, Any]:
    """The fields that define a vocabulary: what the fingerprint hashes, spelled as in euler-bpe files."""
    return {
        "pattern": vocab.pattern,
        "tokens": [t.hex() for t in vocab.tokens],
        "merges": [list(p) for p in vocab.merges],
        "special_tokens": dict(vocab.special_tokens),
    }


def fingerprint(fields: dict[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON of the content fields (key order does not matter).

    >>> fingerprint({"a": 1, "b": [2]}) == fingerprint({"b": [2], "a": 1})
    True
    """
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()
