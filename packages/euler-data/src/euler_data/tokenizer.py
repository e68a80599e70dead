"""Stage 7, tokenizer: train euler-bpe on a sample of the train pieces, or load a given tokenizer.json,
or take the byte tokenizer (``--tokenizer bytes``: ids 0-255 are the bytes, the chat specials 256-259).

The sample takes a prefix of every train piece (cut at a newline), each ``budget / pieces`` characters
long, in the seeded mix order, until ``sample_bytes``; so every source and book is represented.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from euler_bpe import CHAT_SPECIAL_TOKENS, ENDOFTEXT, Tokenizer
from euler_data.counts import drop_counts
from euler_data.errors import DataError
from euler_data.recipe import BYTE_TOKENIZER

UINT16_LIMIT = 1 << 16


def check_tokenizer(tok: Tokenizer, where: str) -> Tokenizer:
    """The tokenizer must fit uint16 shards and know ``<|endoftext|>``."""
    if tok.vocab_size > UINT16_LIMIT:
        raise DataError(where, f"vocab_size {tok.vocab_size} exceeds {UINT16_LIMIT}: ids do not fit uint16")
    if ENDOFTEXT not in tok.special_tokens:
        raise DataError(where, f"tokenizer has no {ENDOFTEXT} special token to join documents")
    return tok


def byte_tokenizer() -> Tokenizer:
    """The byte tokenizer of bytes mode: ``Tokenizer.byte_level`` with the chat special tokens."""
    return Tokenizer.byte_level(CHAT_SPECIAL_TOKENS)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """``Tokenizer.load`` with the uint16 and ``<|endoftext|>`` checks, errors naming the file.

    The string ``"bytes"`` is the byte tokenizer (a file of that name is ``./bytes`` or a ``Path``).
    """
    if path == BYTE_TOKENIZER:
        return byte_tokenizer()
    try:
        tok = Tokenizer.load(path)
    except (OSError, ValueError) as err:
        raise DataError(str(path), f"cannot load tokenizer: {err}") from err
    return check_tokenizer(tok, str(path))


def sample_texts(con: duckdb.DuckDBPyConnection, sample_bytes: int) -> list[str]:
    """A prefix of each train piece, together about ``sample_bytes`` of UTF-8."""
    n = con.execute("SELECT count(*) FROM mixed WHERE split = 'train' AND copy = 0").fetchone()[0]
    per_piece = max(sample_bytes // max(n, 1), 4096)
    # the first pieces in mix order (a piece has at least ~min_chars characters, so sample_bytes // 64 of
    # them are plenty), their prefixes streamed: nothing holds every piece's prefix
    first = min(n, max(sample_bytes // 64, 1))
    cursor = con.execute(
        """WITH first AS (
            SELECT doc_id, part, ord FROM mixed WHERE split = 'train' AND copy = 0 ORDER BY ord LIMIT ?
        )
        SELECT substr(p.text, 1, ?) FROM first f JOIN pieces p USING (doc_id, part) ORDER BY f.ord""",
        [first, per_piece],
    )
    out, total = [], 0
    while total < sample_bytes and (chunk := cursor.fetchmany(256)):
        for (text,) in chunk:
            cut = text.rfind("\n") if len(text) == per_piece else -1
            text = text[: cut + 1] if cut > 0 else text  # end on a line boundary when truncated
            out.append(text)
            total += len(text.encode("utf-8"))
            if total >= sample_bytes:
                break
    return out


def train_tokenizer(con: duckdb.DuckDBPyConnection, vocab_size: int, sample_bytes: int) -> Tokenizer:
    """Stage 7: a byte-level BPE with the chat special tokens, trained on the sample."""
    texts = sample_texts(con, sample_bytes)
    if not texts:
        val = con.execute("SELECT count(DISTINCT doc_id) FROM mixed WHERE split = 'val'").fetchone()[0]
        raise DataError(
            "prepare",
            f"no train documents left to train a tokenizer on ({val} kept in the val split, dropped "
            f"{drop_counts(con)}); cut the text into more documents (PATH::paragraph or PATH::line), lower "
            "--val-fraction, or give the sources weights above 0",
        )
    tok = Tokenizer.train(texts, vocab_size=vocab_size, special_tokens=CHAT_SPECIAL_TOKENS)
    return check_tokenizer(tok, "trained tokenizer")
