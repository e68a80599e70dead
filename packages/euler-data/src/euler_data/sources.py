"""Resolve a source spec to the inputs to read: local files, mirror files, downloads or remote parquet.

>>> [i.fmt for i in resolve(SourceSpec("web/"), None, Path("cache"))]  # doctest: +SKIP
['jsonl', 'json.gz', 'parquet', 'txt']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from euler_data.embedded import embedded_file
from euler_data.errors import DataError
from euler_data.network import URL_BASE_ENV, download, online, site_url, url_online
from euler_data.recipe import SourceSpec

FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".gz": "json.gz"}
GUTENBERG_URL = "https://www.gutenberg.org/cache/epub/{id}/pg{id}.txt"
ALPACA_URL = "https://raw.githubusercontent.com/tatsu-lab/stanford_alpaca/main/alpaca_data.json"
# Anthropic's HH-RLHF preference pairs, the harmless-base test split (2,312 pairs; MIT)
HH_RLHF_URL = "https://huggingface.co/datasets/Anthropic/hh-rlhf/resolve/main/harmless-base/test.jsonl.gz"
SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
FINEWEB_URL = "hf://datasets/HuggingFaceFW/fineweb-edu/sample/10BT/000_00000.parquet"
# The same file over plain HTTPS: what is downloaded when EULER_DATA_URL_BASE names a stand-in server.
FINEWEB_HTTP_URL = (
    "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/main/sample/10BT/000_00000.parquet"
)
FINEWEB_ROWS = 100_000  # rows read from the remote file when the spec gives no ROWS
NO_SOURCE = "no mirror has it (--mirror DIR or EULER_DATA_MIRROR) and {url} cannot be reached"
UNKNOWN = "unknown"  # the format of a folder's file of another extension: counted as dropped, not read


@dataclass(frozen=True)
class Input:
    """One thing to read: ``location`` is a local path or a remote URL DuckDB reads; ``limit`` caps rows."""

    location: str
    fmt: str
    limit: int | None = None


def file_format(path: Path) -> str:
    """The reader for a file, from its extension: ``file_format(Path("a.json.gz")) == "json.gz"``."""
    suffixes = path.suffixes
    if suffixes[-1:] == [".gz"] and suffixes[-2:-1] not in ([".json"], [".jsonl"]):
        raise DataError(str(path), "only .json.gz / .jsonl.gz are supported among gzip files")
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(
            str(path),
            f"unknown file type {path.suffix!r}; use one of {sorted(FORMATS)}, "
            f"or PATH::raw with --tokenizer bytes to read any file's bytes as they are",
        )
    return fmt


def local_inputs(path: Path) -> list[Input]:
    """Every file under a folder (sorted; one of another extension as an UNKNOWN input, which ingest
    counts as dropped; hidden ones, any part of the path under the folder starting with ".", skipped:
    ``.git/``, ``.DS_Store``), or the file itself."""
    if path.is_file():
        return [Input(str(path), file_format(path))]
    if not path.is_dir():
        raise DataError(str(path), "no such file or folder")
    hidden = lambda p: any(part.startswith(".") for part in p.relative_to(path).parts)  # noqa: E731
    files = sorted(p for p in path.rglob("*") if p.is_file() and not hidden(p))
    inputs = [Input(str(p), file_format(p) if p.suffix.lower() in FORMATS else UNKNOWN) for p in files]
    if all(i.fmt == UNKNOWN for i in inputs):
        raise DataError(
            str(path),
            f"folder holds no {sorted(FORMATS)} files"
            + (
                f" ({len(files)} of other types: PATH::raw with --tokenizer bytes reads any file's bytes)"
                if files
                else ""
            ),
        )
    return inputs


def raw_inputs(path: Path) -> list[Input]:
    """``PATH::raw``: the file itself, or every file under a folder (sorted), of any type."""
    if path.is_file():
        return [Input(str(path), "raw")]
    if not path.is_dir():
        raise DataError(str(path), "no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise DataError(str(path), "folder holds no files")
    return [Input(str(p), "raw") for p in files]


def _need(where: str, url: str) -> None:
    if not url_online(url):
        raise DataError(where, NO_SOURCE.format(url=url))


def gutenberg_inputs(ids: list[int], mirror: Path | None, cache: Path) -> list[Input]:
    """Book files by ebook id: from the mirror's ``gutenberg/manifest.json``, else downloaded."""
    by_id: dict[int, str] = {}
    manifest = mirror / "gutenberg" / "manifest.json" if mirror else None
    if manifest and manifest.is_file():
        by_id = {int(e["ebook_id"]): e["file"] for e in json.loads(manifest.read_text(encoding="utf-8"))}
    out = []
    for book in ids:
        if book in by_id:
            out.append(Input(str(mirror / "gutenberg" / by_id[book]), "txt"))
            continue
        where, url = f"gutenberg:{book}", site_url(GUTENBERG_URL.format(id=book))
        _need(where, url)
        out.append(Input(str(download(url, cache / f"pg{book}.txt", where, "txt")), "txt"))
    return out


def _mirror_or_url(where: str, rel: str, url: str, mirror: Path | None, cache: Path, fmt: str) -> Input:
    if mirror and (mirror / rel).is_file():
        return Input(str(mirror / rel), fmt)
    name = Path(urlparse(url).path).name  # cached under the site's file name
    url = site_url(url)
    _need(where, url)
    return Input(str(download(url, cache / name, where, fmt)), fmt)


def fineweb_inputs(rows: int | None, mirror: Path | None, cache: Path) -> list[Input]:
    """FineWeb-Edu parquet: the mirror's ``fineweb-edu/`` folder, else the Hugging Face dataset path
    (read by DuckDB itself), or, under ``EULER_DATA_URL_BASE``, its file downloaded from there."""
    folder = mirror / "fineweb-edu" if mirror else None
    if folder and folder.is_dir():
        return [Input(i.location, i.fmt, rows) for i in local_inputs(folder)]
    if os.environ.get(URL_BASE_ENV):  # DuckDB's hf:// cannot be pointed elsewhere: fetch the file
        url = site_url(FINEWEB_HTTP_URL)
        _need("fineweb-edu", url)
        path = download(url, cache / "fineweb-edu-000_00000.parquet", "fineweb-edu", "parquet")
        return [Input(str(path), "parquet", rows or FINEWEB_ROWS)]
    if not online("huggingface.co"):
        hint = " (the mirror's web_text/ files work as local sources)" if mirror else ""
        raise DataError("fineweb-edu", NO_SOURCE.format(url=f"huggingface.co ({FINEWEB_URL})") + hint)
    return [Input(FINEWEB_URL, "parquet", rows or FINEWEB_ROWS)]


def resolve(source: SourceSpec, mirror: Path | None, cache: Path) -> list[Input]:
    """The inputs of one source, e.g. ``resolve(SourceSpec("gutenberg:11"), mirror, cache)``."""
    kind, _, arg = source.spec.partition(":")
    if source.kind == "local":
        path = Path(source.spec).expanduser()
        return raw_inputs(path) if source.docs == "raw" else local_inputs(path)
    if kind == "gutenberg":
        try:
            ids = [int(x) for x in arg.split(",") if x.strip()]
        except ValueError as err:
            raise DataError(source.spec, "expected gutenberg:ID,ID,... with integer ids") from err
        if not ids:
            raise DataError(source.spec, "expected gutenberg:ID,ID,... with at least one id")
        return gutenberg_inputs(ids, mirror, cache)
    if kind == "fineweb-edu":
        if arg and not arg.isdigit():
            raise DataError(source.spec, "expected fineweb-edu or fineweb-edu:ROWS")
        return fineweb_inputs(int(arg) if arg else None, mirror, cache)
    if kind == "alpaca":
        rel = "alpaca/alpaca_subset_2000_gumbelsoft.json"
        return [_mirror_or_url("alpaca", rel, ALPACA_URL, mirror, cache, "json")]
    if kind == "hh-rlhf":
        rel = "hh_rlhf/harmless-base-test.jsonl.gz"
        return [_mirror_or_url("hh-rlhf", rel, HH_RLHF_URL, mirror, cache, "jsonl")]
    return [shakespeare_input(mirror, cache)]


def shakespeare_input(mirror: Path | None, cache: Path) -> Input:
    """Tiny Shakespeare: the mirror's copy, else the download, else (no network) the copy shipped in
    euler-data, byte-identical to the canonical file."""
    rel = "tinyshakespeare/input.txt"
    if not (mirror and (mirror / rel).is_file()) and not url_online(site_url(SHAKESPEARE_URL)):
        return Input(str(embedded_file("tinyshakespeare", cache)), "txt")
    return _mirror_or_url("tinyshakespeare", rel, SHAKESPEARE_URL, mirror, cache, "txt")
