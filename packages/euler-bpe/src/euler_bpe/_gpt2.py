"""GPT-2's original files: `encoder.json` (token string -> id) and `vocab.bpe` (merges, rank order).

Token strings are spelled in the byte-level alphabet (`_bytes`). A token that is neither a single
byte nor made by a merge (GPT-2: `<|endoftext|>`) is a special token.
"""

from __future__ import annotations

import json
import os

from euler_bpe._bytes import chars_to_bytes
from euler_bpe._vocab import Vocab, make_vocab
from euler_bpe.errors import TokenizerFileError


def read_merge_lines(lines: list[str], where: str) -> list[tuple[str, str]]:
    """'Ġ t' lines -> ('Ġ', 't'); skips a '#version' header and blank lines.

    >>> read_merge_lines(["#version: 0.2", "Ġ t", "h e"], "example")
    [('Ġ', 't'), ('h', 'e')]
    """
    pairs = []
    for n, line in enumerate(lines):
        line = line.rstrip("\r\n")
        if not line or (n == 0 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerFileError(f"{where}: merge line {n + 1} is not two tokens: {line!r}")
        pairs.append((parts[0], parts[1]))
    return pairs


def build_from_strings(vocab: dict[str, int], merges: list[tuple[str, str]], where: str) -> Vocab:
    """The vocabulary of byte-level token strings and string merges; ids must be 0..n-1."""
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise TokenizerFileError(f"{where}: token ids must be exactly 0..{len(vocab) - 1}, without gaps")
    made = {a + b for a, b in merges}
    by_id = sorted(vocab, key=vocab.__getitem__)
    specials = {s: vocab[s] for s in by_id if len(s) > 1 and s not in made}
    try:
        tokens = [s.encode("utf-8") if s in specials else chars_to_bytes(s) for s in by_id]
        pairs = [(vocab[a], vocab[b]) for a, b in merges]
        return make_vocab(tokens, pairs, specials)
    except KeyError as err:
        raise TokenizerFileError(
            f"{where}: merge uses {err.args[0]!r}, which is not in the vocabulary"
        ) from None
    except ValueError as err:
        raise TokenizerFileError(f"{where}: {err}") from None


def from_gpt2(vocab_bpe: str | os.PathLike, encoder_json: str | os.PathLike) -> Vocab:
    """The vocabulary of GPT-2's `vocab.bpe` + `encoder.json`."""
    try:
        with open(encoder_json, encoding="utf-8") as f:
            vocab = json.load(f)
        with open(vocab_bpe, encoding="utf-8") as f:
            merges = read_merge_lines(f.readlines(), "from_gpt2")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokenizerFileError(f"from_gpt2: cannot read {encoder_json} / {vocab_bpe}: {err}") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise TokenizerFileError(f"from_gpt2: {encoder_json} must map token strings to integer ids")
    return build_from_strings(vocab, merges, "from_gpt2")
