"""What a dataset folder holds (euler-data's set or another tool's files), whether a writer may write
there, and how its files are replaced.

An euler-data folder is one whose ``meta.json`` says ``"format": "euler-data/..."`` (a finished
``prepare``), or that holds an SFT set's ``sft_meta.json`` or a preference set's ``prefs_meta.json``, or
an unfinished prepare's ``pipeline.duckdb``. A writer refuses anything else that is not empty, ``prepare``
refuses a finished set too, and ``sft`` / ``prefs`` a set of their own kind, unless ``--overwrite``.

New files are written into a staging folder beside the old ones and moved in by ``replace_files``: the
old record file (``meta.json`` / ``sft_meta.json``) goes first, the new one comes last, and a Ctrl-C
waits until the moves are done. So the folder holds the old set whole or the new set whole; only a
kill -9 in those few renames leaves no record file, which every reader refuses.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> folder_kind(folder)
'empty'
>>> _ = (folder / "config.json").write_text("{}")
>>> folder_kind(folder), listing(folder)
('foreign', 'config.json')
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from euler_data.errors import DataError
from euler_data.folder_lock import LOCK_FILE
from euler_data.meta import META_NAME

SFT_META = "sft_meta.json"
SFT_STAGING = "sft.new"  # a new SFT set until it replaces the folder's
PREFS_META = "prefs_meta.json"
PREFS_STAGING = "prefs.new"  # a new preference set until it replaces the folder's
DB_NAME = "pipeline.duckdb"  # an unfinished prepare's work (euler_data.db)
NOT_A_SET = (LOCK_FILE, "downloads", SFT_STAGING, PREFS_STAGING)  # what a writer leaves besides a set:
# its lock, the downloaded sources, an interrupted sft's or prefs' files
# the sets built beside a dataset: command -> (record file, what the set is called, its count's key and name)
SIDE_SETS = {
    "sft": (SFT_META, "SFT set", "examples_kept", "examples"),
    "prefs": (PREFS_META, "preference set", "pairs_kept", "pairs"),
}
SHOWN = 4  # names listed in an error, then "and N more"


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def folder_kind(folder: Path) -> str:
    """What a folder holds: "empty", "dataset" (a finished prepare), "sft" (SFT or preference sets alone),
    "unfinished" (a prepare that has not finished) or "foreign" (anything else)."""
    names = {p.name for p in folder.iterdir()} - set(NOT_A_SET) if folder.is_dir() else set()
    if not names:
        return "empty"
    if META_NAME in names:
        ours = str(_json(folder / META_NAME).get("format", "")).startswith("euler-data/")
        return "dataset" if ours else "foreign"
    records = [record for record, _, _, _ in SIDE_SETS.values() if record in names]
    if records:
        ours = all("tokenizer_fingerprint" in _json(folder / record) for record in records)
        return "sft" if ours else "foreign"
    return "unfinished" if DB_NAME in names else "foreign"


def side_set_files(folder: Path, command: str) -> list[Path]:
    """The files of the folder's SFT or preference set (command "sft" / "prefs") that exist."""
    record = SIDE_SETS[command][0]
    splits = [f"{command}_{s}_{kind}.bin" for s in ("train", "val") for kind in ("tokens", "mask", "offsets")]
    return [folder / name for name in (record, *splits) if (folder / name).exists()]


def listing(folder: Path) -> str:
    """The folder's entries for an error: the first SHOWN names, then how many more."""
    names = sorted(p.name for p in folder.iterdir() if p.name not in NOT_A_SET)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_out(folder: Path, command: str, overwrite: bool) -> None:
    """Refuse (DataError) to write into a folder that holds what is not euler-data's, or, for
    ``prepare``, a finished set, unless ``overwrite``."""
    kind = folder_kind(folder)
    side = command in SIDE_SETS
    if side and kind != "foreign" and (folder / SIDE_SETS[command][0]).is_file() and not overwrite:
        record, what, key, unit = SIDE_SETS[command]
        raise DataError(
            str(folder),
            f"already holds an euler-data {what} ({_json(folder / record).get(key)} {unit}); pass "
            "--overwrite to replace it, or choose another --out",
        )
    if overwrite or kind in ("empty", "unfinished") or (side and kind != "foreign"):
        return
    if kind == "foreign":
        named = (META_NAME, *(record for record, _, _, _ in SIDE_SETS.values()))
        record = next((name for name in named if (folder / name).exists()), None)
        why = f"its {record} was not written by euler-data" if record else f"it holds {listing(folder)}"
        raise DataError(
            str(folder),
            f"is not an euler-data dataset folder ({why}); pass --overwrite to write into it anyway, "
            "or choose another --out",
        )
    if kind == "dataset":
        meta = _json(folder / META_NAME)
        tokens = sum(meta.get("tokens", {}).values())
        held = f"an euler-data dataset ({meta.get('documents_kept')} documents, {tokens} tokens)"
        fix = "replace it"
    else:
        sets = [(r, w, k, u) for r, w, k, u in SIDE_SETS.values() if (folder / r).is_file()]
        held = " and ".join(f"an euler-data {w} ({_json(folder / r).get(k)} {u})" for r, w, k, u in sets)
        fix = "prepare into it (the sets stay only if the tokenizer stays the same)"
    raise DataError(str(folder), f"already holds {held}; pass --overwrite to {fix}, or choose another --out")


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Run the block to its end; a Ctrl-C meanwhile is raised (by the handler it would have met) after."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending and callable(previous):
        previous(signal.SIGINT, None)


def replace_files(folder: Path, staging: Path, record: str, remove: Iterable[Path] = ()) -> None:
    """Move every file of ``staging`` into ``folder`` (``record`` last) and delete ``remove``; the old
    ``record`` goes first, so no moment shows an old record over new files."""
    staged = sorted(staging.iterdir(), key=lambda p: p.name == record)  # the record last
    for path in staged:
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # on disk before a rename can make it visible
    with interrupts_held():
        (folder / record).unlink(missing_ok=True)
        for path in remove:
            path.unlink(missing_ok=True)
        for path in staged:
            os.replace(path, folder / path.name)
        staging.rmdir()
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames themselves
    finally:
        os.close(fd)
