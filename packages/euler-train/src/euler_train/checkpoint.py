"""Checkpoints of a run: `RUN/checkpoints/step_N/`, written atomically, checked by sha256, pruned.

A checkpoint is written into a temporary folder, every file is fsynced, a `checksums.sha256` file lists
the sha256 of every other file, then the folder is renamed to `step_N` and the parent fsynced: a crash
leaves either the whole checkpoint or none. Loading verifies the checksums and falls back to the previous
checkpoint with a message when the newest is truncated or corrupt.

>>> import tempfile, pathlib
>>> mgr = CheckpointManager(pathlib.Path(tempfile.mkdtemp()) / "checkpoints", keep_last=2)
>>> path = mgr.save(3, lambda d: (d / "model.safetensors").write_bytes(b"w"), {"step": 3})
>>> mgr.latest_valid().name
'step_3'
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from euler_data import unwritable

CHECKSUMS = "checksums.sha256"
STATE = "trainer_state.json"
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how safetensors' (Rust) I/O errors name the errno


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (folders make a rename durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_error(err: BaseException) -> OSError | None:
    """The OSError behind a failed write: `err` itself, or the one a SafetensorError names only in its text;
    None for anything else.

    >>> os_error(SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"))
    OSError(28, 'No space left on device')
    """
    if isinstance(err, OSError):
        return err
    found = RUST_OS_ERROR.search(str(err)) if isinstance(err, SafetensorError) else None
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code))


@contextlib.contextmanager
def os_errors_as(
    error: Callable[[OSError], Exception], cleanup: Callable[[], Any] = lambda: None
) -> Iterator[None]:
    """Run the block; on any failure run `cleanup` (its own OSErrors ignored), and raise an OSError behind a
    failed write (`os_error`) as `error(that OSError)`, one line instead of a traceback."""
    try:
        yield
    except BaseException as err:
        with contextlib.suppress(OSError):
            cleanup()
        cause = os_error(err)
        if cause is None:
            raise
        raise error(cause) from None


def write_file(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """`write(tmp)` to a temporary file beside `path` (its parents made), then renamed to `path`: a failure
    leaves what was at `path` as it was; an OSError is FolderUnwritable, one line naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")  # the same suffix: writers read the format in it
    with os_errors_as(lambda err: unwritable(path, err), cleanup=lambda: tmp.unlink(missing_ok=True)):
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    return path


def step_of(path: Path) -> int:
    """The N of a `step_N` folder, -1 for anything else."""
    name = path.name
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else -1


def verify(folder: Path) -> str | None:
    """None when `folder` is a complete checkpoint, else the reason it is not."""
    sums = folder / CHECKSUMS
    if not sums.is_file():
        return f"{CHECKSUMS} is missing"
    listed = {}
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    if STATE not in listed:
        return f"{STATE} is not listed in {CHECKSUMS}"
    for name, digest in listed.items():
        file = folder / name
        if not file.is_file():
            return f"{name} is missing"
        if sha256_file(file) != digest:
            return f"{name} does not match its sha256 (truncated or corrupt)"
    return None


def read_state(folder: Path) -> dict[str, Any]:
    """The trainer state JSON of a checkpoint folder."""
    return json.loads((folder / STATE).read_text(encoding="utf-8"))


class CheckpointManager:
    """Writes, finds and prunes the checkpoints under one folder (rank 0 only writes)."""

    def __init__(self, root: str | Path, keep_last: int = 3, keep_best: bool = True) -> None:
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_best = keep_best

    def folders(self) -> list[Path]:
        """Every `step_N` folder, newest first."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and step_of(p) >= 0]
        return sorted(found, key=step_of, reverse=True)

    def clean_temporaries(self) -> None:
        """Remove half-written `.tmp-*` folders left by a crash."""
        if self.root.is_dir():
            for path in self.root.glob(".tmp-*"):
                shutil.rmtree(path, ignore_errors=True)

    def save(self, step: int, write_files: Callable[[Path], Any], state: dict[str, Any]) -> Path:
        """Write checkpoint `step`: `write_files(folder)` writes the tensors, then state, sums, rename. An
        OSError (the disk full, say) is a CheckpointError of one line naming the last good checkpoint."""
        tmp = self.root / f".tmp-step_{step}-{os.getpid()}"
        final = self.root / f"step_{step}"
        half_written = partial(shutil.rmtree, tmp, ignore_errors=True)  # removed on any failure
        with os_errors_as(partial(self._not_written, final), cleanup=half_written):
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            self._fill(tmp, write_files, state)
        self._replace(tmp, final)
        self.prune()
        return final

    def _not_written(self, final: Path, err: OSError) -> CheckpointError:
        """Why checkpoint `final` was not written, which one is the last good one, what to do."""
        older = self.folders()
        kept = f"the last good checkpoint is {older[0].name}" if older else f"{self.root} holds none yet"
        return CheckpointError(f"{unwritable(final, err)}; {kept}; fix that, then continue with --resume")

    @staticmethod
    def _fill(tmp: Path, write_files: Callable[[Path], Any], state: dict[str, Any]) -> None:
        """Tensors, trainer state and checksums into `tmp`, every file and the folder fsynced."""
        write_files(tmp)
        (tmp / STATE).write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        lines = [f"{sha256_file(p)}  {p.name}" for p in files]
        (tmp / CHECKSUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
        for path in [*files, tmp / CHECKSUMS, tmp]:
            fsync_path(path)

    def _replace(self, tmp: Path, final: Path) -> None:
        """Rename tmp to final; an existing final is moved aside first and removed after."""
        old = None
        if final.exists():
            old = final.with_name(f".tmp-old-{final.name}-{os.getpid()}")
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_path(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def best(self) -> Path | None:
        """The valid-looking checkpoint with the lowest recorded `val_loss`, if any has one."""
        scored = []
        for path in self.folders():
            try:
                loss = read_state(path).get("val_loss")
            except (OSError, ValueError):
                continue
            if loss is not None:
                scored.append((loss, -step_of(path), path))
        return min(scored)[2] if scored else None

    def prune(self) -> None:
        """Keep the newest `keep_last` checkpoints and the best one; delete the rest."""
        folders = self.folders()
        keep = set(folders[: self.keep_last])
        best = self.best() if self.keep_best else None
        if best is not None:
            keep.add(best)
        for path in folders:
            if path not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def latest_valid(self, log: Callable[[str], Any] | None = None) -> Path | None:
        """The newest checkpoint that verifies; skipped ones are reported through `log` (stderr)."""
        log = log or (lambda msg: print(msg, file=sys.stderr))
        folders, skipped = self.folders(), []
        for path in folders:
            reason = verify(path)
            if reason is None:
                for bad, why in skipped:  # reported only when an older one is used instead
                    msg = f"checkpoint {bad} is unusable ({why}); using the previous one ({path.name})"
                    log(f"euler-train: {msg}")
                return path
            skipped.append((path, reason))
        if folders:
            newest, why = skipped[0]
            raise CheckpointError(
                f"no valid checkpoint in {self.root}: all {len(folders)} are truncated or corrupt "
                f"(the newest, {newest.name}: {why})"
            )
        return None
