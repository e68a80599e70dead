"""Read text-like files into records, counting what cannot be read instead of failing.

Each record is ``(text, score, reason)``: ``reason`` is None for a readable document, else why it was
dropped ("not_utf8", "malformed_json", "no_text", "too_long"); a dropped record still counts as a
document in. Parquet is read by DuckDB directly (see ``ingest``). A raw file (bytes mode) is one record
of its exact bytes in the stored form of ``raw_bytes``, whatever its type: no UTF-8 check.

>>> list(read_jsonl_lines([b'{"text": "hi"}', b"{oops"], "text"))
[('hi', None, None), (None, None, 'malformed_json')]
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from euler_data.errors import DataError
from euler_data.raw_bytes import as_text

Record = tuple[str | None, float | None, str | None]
EOT = b"<|endoftext|>"
_PARAGRAPH = re.compile(rb"\n(?:[ \t\r]*\n)+")  # one or more blank lines


def _decode(raw: bytes) -> Record:
    try:
        return raw.decode("utf-8"), None, None
    except UnicodeDecodeError:
        return None, None, "not_utf8"


def split_bytes(data: bytes, docs: str) -> list[bytes]:
    """Cut a text file into documents: whole, per line, per blank-line paragraph, or at ``<|endoftext|>``."""
    if docs == "document":
        return [data]
    if docs == "line":
        parts = data.split(b"\n")
    elif docs == "paragraph":
        parts = _PARAGRAPH.split(data)
    else:
        parts = data.split(EOT)
    return [p for p in parts if p.strip()]  # blank separators are not documents


def read_txt(path: Path, docs: str, max_bytes: int) -> Iterator[Record]:
    """Documents of a .txt file; a whole-file document over ``max_bytes`` is dropped unread."""
    if docs == "document" and path.stat().st_size > max_bytes:
        yield None, None, "too_long"
        return
    for part in split_bytes(path.read_bytes(), docs):
        yield _decode(part)


def read_raw(path: Path, max_bytes: int) -> Record:
    """A whole file as one raw document (``::raw``); over ``max_bytes`` it is dropped unread."""
    if path.stat().st_size > max_bytes:
        return None, None, "too_long"
    return as_text(path.read_bytes()), None, None


def record_text(obj: object, text_field: str, score_field: str = "score") -> Record:
    """The text and score of one parsed JSON record; Alpaca records become instruction/input/output text."""
    if not isinstance(obj, dict):
        return None, None, "malformed_json"
    score = obj.get(score_field)
    score = float(score) if isinstance(score, (int, float)) and not isinstance(score, bool) else None
    text = obj.get(text_field)
    if text is None and isinstance(obj.get("instruction"), str) and isinstance(obj.get("output"), str):
        text = "\n\n".join(x for x in (obj["instruction"], obj.get("input") or "", obj["output"]) if x)
    if not isinstance(text, str):
        return None, score, "no_text"
    return text, score, None


def read_jsonl_lines(lines: Iterable[bytes], text_field: str, score_field: str = "score") -> Iterator[Record]:
    """One record per non-blank line; undecodable or unparsable lines are counted, not raised."""
    for line in lines:
        if not line.strip():
            continue
        try:
            obj = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            yield None, None, "not_utf8"
            continue
        except ValueError:
            yield None, None, "malformed_json"
            continue
        yield record_text(obj, text_field, score_field)


def read_json_file(path: Path, text_field: str, score_field: str = "score") -> Iterator[Record]:
    """A .json / .json.gz file: a JSON array of records (read whole), or JSON lines (streamed)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        is_array = handle.read(1 << 16).lstrip()[:1] == b"["
    if path.suffix == ".jsonl" or not is_array:
        with opener(path, "rb") as handle:
            yield from read_jsonl_lines(handle, text_field, score_field)  # line by line
        return
    with opener(path, "rb") as handle:
        data = handle.read()
    try:
        records = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise DataError(str(path), f"not a valid JSON array: {err}") from err
    for obj in records:
        yield record_text(obj, text_field, score_field)
