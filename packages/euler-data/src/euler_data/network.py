"""The mirror folder and the network: which one a named source comes from, with short timeouts, and
downloads that only ever cache whole files."""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.request
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from euler_data.errors import DataError

MIRROR_ENV = "EULER_DATA_MIRROR"
URL_BASE_ENV = "EULER_DATA_URL_BASE"  # e.g. http://127.0.0.1:8000: fetch named sources from there
TIMEOUT_S = 3.0  # offline detection must never hang
DOWNLOAD_TIMEOUT_S = 60.0  # a download fails when one read waits longer than this


def resolve_mirror(mirror: str | Path | None = None) -> Path | None:
    """The mirror folder: the argument, else ``$EULER_DATA_MIRROR``, else None.

    >>> resolve_mirror(None) is None or resolve_mirror(None).is_dir()
    True
    """
    value = mirror if mirror is not None else os.environ.get(MIRROR_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError(str(path), "mirror folder does not exist (--mirror / EULER_DATA_MIRROR)")
    return path


def online(host: str, port: int = 443, timeout: float = TIMEOUT_S) -> bool:
    """True when a TCP connection to ``host`` opens within ``timeout`` seconds (``EULER_DATA_OFFLINE=1``:
    never tried)."""
    return not os.environ.get("EULER_DATA_OFFLINE") and _reachable(host, port, timeout)


@lru_cache(maxsize=32)
def _reachable(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def site_url(url: str) -> str:
    """``url``, or its copy under ``$EULER_DATA_URL_BASE`` (``https://HOST/PATH`` -> ``BASE/HOST/PATH``):
    a local HTTP server laid out like the real sites stands in for them.

    >>> os.environ[URL_BASE_ENV] = "http://127.0.0.1:8000/"
    >>> site_url("https://www.gutenberg.org/cache/epub/11/pg11.txt")
    'http://127.0.0.1:8000/www.gutenberg.org/cache/epub/11/pg11.txt'
    >>> del os.environ[URL_BASE_ENV]
    """
    base = os.environ.get(URL_BASE_ENV, "").rstrip("/")
    if not base:
        return url
    parts = urlparse(url)
    return f"{base}/{parts.netloc}{parts.path}"


def url_online(url: str) -> bool:
    """``online`` for the host and port of ``url``."""
    parts = urlparse(url)
    port = parts.port or (80 if parts.scheme == "http" else 443)
    return online(parts.hostname or "", port)


def check_download(path: Path, fmt: str) -> str | None:
    """What is wrong with a downloaded file of format ``fmt``, or None when it looks whole."""
    data = path.read_bytes()
    if fmt == "parquet":
        whole = len(data) >= 12 and data[:4] == data[-4:] == b"PAR1"
        return None if whole else "not a whole parquet file (no PAR1 magic at both ends)"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8 text ({err.reason} at byte {err.start})"
    if text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        return "an HTML page, not the data file"
    if fmt == "json":
        try:
            json.loads(text)
        except json.JSONDecodeError as err:
            return f"not valid JSON ({err.msg} at line {err.lineno})"
    return None


def download(url: str, dest: Path, where: str, fmt: str) -> Path:
    """Download ``url`` to ``dest`` once (kept as a cache); returns ``dest``.

    Only a whole, well-formed file reaches ``dest``: a short body (fewer bytes than Content-Length),
    an HTTP error, a timeout (``DOWNLOAD_TIMEOUT_S`` per read) or a file that fails
    ``check_download`` raises a one-line DataError naming ``where`` (the source) and ``url``, and
    leaves nothing in the cache.
    """
    if dest.is_file():
        return dest
    if not url_online(url):
        raise DataError(where, f"no network and no mirror for {url} (pass --mirror DIR or set {MIRROR_ENV})")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        problem = _fetch(url, tmp)
        problem = problem or check_download(tmp, fmt)
    except (OSError, http.client.HTTPException) as err:
        problem = str(err) or type(err).__name__
    if problem:
        tmp.unlink(missing_ok=True)
        raise DataError(where, f"download of {url} failed: {problem}; nothing was cached")
    tmp.replace(dest)
    return dest


def _fetch(url: str, tmp: Path) -> str | None:
    """Stream ``url`` into ``tmp``; a problem with the transfer itself, or None."""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(tmp, "wb") as out:
        expected = response.headers.get("Content-Length")
        while chunk := response.read(1 << 20):
            out.write(chunk)
        got = out.tell()
    if expected is not None and expected.isdigit() and got != int(expected):
        return f"truncated: {got} of {expected} bytes arrived"
    return None
