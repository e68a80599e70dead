"""One writer per folder: an OS file lock on ``FOLDER/.euler.lock``, held for a command's whole life.

The lock is ``flock`` on an open file, so the kernel drops it when the process ends however it ends
(kill -9 included): there is never a stale lock to clean up. The file holds the holder's pid and command,
which a second writer names in its error; a holder that ends normally removes it, so the folder is left
as the command left it. Readers never take it.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp()) / "run"
>>> with hold_folder(folder, "euler-train pretrain"):
...     try:
...         with hold_folder(folder, "euler-train sft"):
...             pass
...     except FolderBusy as err:
...         "is being written by process" in str(err)
True
>>> folder.exists()  # created for the command, removed again as it stayed empty
False
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".euler.lock"


class FolderBusy(RuntimeError):
    """Another process holds the folder's lock (the message names it)."""


class FolderUnwritable(RuntimeError):
    """The folder cannot be made or written (read-only, not a folder, no permission)."""


def unwritable(folder: Path, err: OSError) -> FolderUnwritable:
    """One line for an OSError met while making or writing `folder`."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        why = "the disk is full"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "it is not writable (read-only or no permission)"
    elif err.errno in (errno.ENOTDIR, errno.EEXIST) and not folder.is_dir():
        why = "a file of that name is in the way" if folder.exists() else "a part of its path is a file"
    else:
        why = err.strerror or str(err)
    return FolderUnwritable(f"cannot write {folder}: {why}")


@contextlib.contextmanager
def hold_folder(folder: str | Path, command: str) -> Iterator[Path]:
    """Make `folder` (parents too) and hold its lock while the block runs; FolderBusy when another
    process holds it, FolderUnwritable when it cannot be made or written. A folder this call made is
    removed again when the block leaves nothing but the lock in it (a refused command changes nothing)."""
    folder = Path(folder)
    made = _make(folder)
    try:
        fd = _acquire(folder, command)
    except BaseException:
        _remove_if_empty(made)
        raise
    try:
        yield folder
    finally:
        with contextlib.suppress(OSError):  # a waiter that opened this file sees it unlinked and retries
            (folder / LOCK_FILE).unlink()
        _remove_if_empty(made)
        os.close(fd)  # closing drops the lock


def _make(folder: Path) -> list[Path]:
    """Create `folder` and its missing parents; the ones created, outermost first."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()][::-1]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise unwritable(folder, err) from None
    return missing


def _acquire(folder: Path, command: str) -> int:
    """Open and flock the lock file, then record who holds it; the lock file's fd."""
    path = folder / LOCK_FILE
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise unwritable(folder, err) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise FolderBusy(
                f"{folder} is being written by process {holder}; wait for it to finish or stop it "
                "(one writer per folder)"
            ) from None
        if _same_file(fd, path):  # not a lock file that its holder's cleanup unlinked meanwhile
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} ({command})\n".encode(), 0)
    except OSError as err:
        os.close(fd)
        raise unwritable(folder, err) from None
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _remove_if_empty(made: list[Path]) -> None:
    """Remove the folders this command made, innermost first, while they are empty."""
    with contextlib.suppress(OSError):  # rmdir stops at the first folder that holds something
        for path in reversed(made):
            path.rmdir()
