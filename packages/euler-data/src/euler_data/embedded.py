"""Data shipped inside the package, so the quick start runs on a machine with no network and no mirror.

Tiny Shakespeare (public domain, 1,115,394 bytes) is stored gzip-compressed; it is unpacked once into
the dataset's download cache and checked against the sha256 of the canonical file.

>>> import tempfile
>>> path = embedded_file("tinyshakespeare", Path(tempfile.mkdtemp()))
>>> path.stat().st_size
1115394
"""

from __future__ import annotations

import gzip
import hashlib
from importlib import resources
from pathlib import Path

from euler_data.errors import DataError

# name -> (packaged file, file name once unpacked, sha256 of the unpacked bytes)
EMBEDDED = {
    "tinyshakespeare": (
        "tinyshakespeare.txt.gz",
        "input.txt",
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    ),
}


def embedded_file(name: str, cache: Path) -> Path:
    """The embedded copy of source ``name``, unpacked under ``cache`` (once) and verified."""
    packed, unpacked, sha256 = EMBEDDED[name]
    dest = cache / f"embedded-{name}-{unpacked}"
    if dest.is_file() and _sha256(dest.read_bytes()) == sha256:
        return dest
    data = gzip.decompress(resources.files("euler_data").joinpath("embedded", packed).read_bytes())
    if _sha256(data) != sha256:
        raise DataError(name, "the embedded copy is damaged (sha256 mismatch): reinstall euler-data")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
