"""The mirror folder and the network: which one a named source comes from, with short timeouts."""

from __future__ import annotations

import os
import socket
import urllib.request
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from euler_data.errors import DataError

MIRROR_ENV = "EULER_DATA_MIRROR"
TIMEOUT_S = 3.0  # offline detection must never hang


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


def download(url: str, dest: Path, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` once (kept as a cache); returns ``dest``."""
    if dest.is_file():
        return dest
    if not online(urlparse(url).hostname or ""):
        raise DataError(url, "no network and no mirror (pass --mirror DIR or set EULER_DATA_MIRROR)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except OSError as err:
        raise DataError(url, f"download failed: {err}") from err
    tmp.replace(dest)
    return dest
