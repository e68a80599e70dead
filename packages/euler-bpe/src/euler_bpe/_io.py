"""euler-bpe's own file format: versioned JSON with a content hash.

    {"format": "euler-bpe", "version": 1, "kind": "bpe", "pattern": "...", "tokens": ["68", "6869", ...],
     "merges": [[104, 105], ...], "special_tokens": {"<|endoftext|>": 4095}, "fingerprint": "..."}

`tokens[i]` is the hex of token i's bytes; `merges` are in rank order; `fingerprint` is the SHA-256 of
the canonical JSON of the content fields (pattern, tokens, merges, special_tokens), checked on load.
`kind` is "bytes" for the byte tokenizer (`Tokenizer.byte_level`) and "bpe" otherwise; it follows from
the content, so load checks it against the content too (files without it are read as well).
"""

from __future__ import annotations

import json
import os
from typing import Any

from euler_bpe._vocab import Vocab, content, fingerprint, make_vocab
from euler_bpe.errors import TokenizerFileError

FORMAT = "euler-bpe"
VERSION = 1


def to_dict(vocab: Vocab) -> dict[str, Any]:
    fields = content(vocab)
    head = {"format": FORMAT, "version": VERSION, "kind": vocab.kind}
    return {**head, **fields, "fingerprint": fingerprint(fields)}


def _field(data: dict, key: str, kind: type) -> Any:
    if not isinstance(data.get(key), kind):
        raise TokenizerFileError(f"load: field {key!r} is missing or not a {kind.__name__}")
    return data[key]


def from_dict(data: Any, check_fingerprint: bool = True) -> Vocab:
    """The vocabulary of `to_dict`'s output; raises TokenizerFileError on anything malformed."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TokenizerFileError(f'load: not an {FORMAT} file (no "format": "{FORMAT}")')
    if data.get("version") != VERSION:
        raise TokenizerFileError(
            f"load: unknown {FORMAT} version {data.get('version')!r}; this reads {VERSION}"
        )
    try:
        tokens = [bytes.fromhex(h) for h in _field(data, "tokens", list)]
        merges = [(int(a), int(b)) for a, b in _field(data, "merges", list)]
        vocab = make_vocab(tokens, merges, _field(data, "special_tokens", dict), _field(data, "pattern", str))
    except (TypeError, ValueError) as err:
        raise TokenizerFileError(f"load: inconsistent tokenizer: {err}") from None
    if check_fingerprint and data.get("fingerprint") != vocab.fingerprint:
        raise TokenizerFileError(
            "load: the fingerprint does not match the content (file corrupted or edited)"
        )
    kind = vocab.kind
    if data.get("kind", kind) != kind:
        raise TokenizerFileError(f'load: "kind": {data["kind"]!r} does not match the content ({kind!r})')
    return vocab


def save(vocab: Vocab, path: str | os.PathLike) -> None:
    """Write atomically: a temporary file beside `path`, then rename."""
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(to_dict(vocab), f, ensure_ascii=False)
    os.replace(tmp, path)


def read_json(path: str | os.PathLike, where: str) -> Any:
    """The parsed JSON of a tokenizer file; invalid JSON or text is a TokenizerFileError naming `where`."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokenizerFileError(f"{where}: {path} is not valid JSON (truncated?): {err}") from None
