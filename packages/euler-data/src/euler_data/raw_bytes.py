"""Raw sources (``PATH::raw``, bytes mode): how their exact bytes live in the pipeline's text tables.

A raw file is stored as its Latin-1 decoding, one character per byte (byte ``b`` is ``chr(b)``), so a
DuckDB VARCHAR holds any byte string, ``length(text)`` counts its bytes and ``substr`` cuts between
bytes; ``as_bytes`` gives the file's bytes back. A text source's text is stored as text, and its bytes
are its UTF-8. The ``sources`` table's ``raw`` column says which is which.

>>> data = b"\\x00\\xff\\xe9 any bytes"
>>> as_bytes(as_text(data)) == data, stored_bytes(as_text(data), raw=True) == len(data)
(True, True)
"""

from __future__ import annotations


def as_text(data: bytes) -> str:
    """The stored form of raw bytes: one character per byte."""
    return data.decode("latin-1")


def as_bytes(text: str) -> bytes:
    """The bytes of a raw document (or piece) from its stored form."""
    return text.encode("latin-1")


def stored_bytes(text: str, raw: bool) -> int:
    """Bytes of a stored text: one per character when raw, else its UTF-8 length."""
    return len(text) if raw else len(text.encode("utf-8"))


def bytes_sql(text: str, raw: str) -> str:
    """``stored_bytes`` in SQL, for the text column ``text`` and the boolean column ``raw``."""
    return f"CASE WHEN {raw} THEN length({text}) ELSE strlen({text}) END"
