"""``prepare``: run every stage in order over ``DIR/pipeline.duckdb`` and write the dataset folder.

>>> meta = prepare(Recipe(sources=(SourceSpec("tinyshakespeare"),)), "out", mirror="mirror")  # doctest: +SKIP
>>> sorted(p.name for p in Path("out").iterdir())  # doctest: +SKIP
['meta.json', 'pipeline.duckdb', 'tokenizer.json', 'train.bin', 'val.bin']

``pipeline.duckdb`` keeps the per-document accounting (``sources``, ``deduped``, ``pieces``, ``mixed``,
``tokenized``, without text) unless ``keep_intermediate`` keeps every stage's table whole.

The dataset's files (token files, ``tokenizer.json``, ``meta.json``) are written into ``pipeline.new/``
and replace the folder's only when all are written (``dataset_folder.replace_files``), so a run that
fails or is interrupted leaves the previous dataset as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
from tqdm.auto import tqdm

from euler_bpe.progress import progress_stream
from euler_data import clean, dedup, filters, ingest, mix, shards, split
from euler_data import tokenizer as tokenizer_stage
from euler_data.counts import build_meta, drop_counts
from euler_data.dataset_folder import SIDE_SETS, replace_files, side_set_files
from euler_data.db import DB_NAME, TEMP_NAME, connect, remove_temp, rewrite, scalar
from euler_data.errors import DataError
from euler_data.meta import META_NAME, write_meta
from euler_data.network import resolve_mirror
from euler_data.raw_bytes import bytes_sql
from euler_data.recipe import Recipe
from euler_data.sources import resolve

TRAINED = "pipeline.tokenizer.json"  # the trained tokenizer while a run is unfinished
NEW = "pipeline.new"  # the run's dataset files until they replace the folder's
PREVIOUS = f"{DB_NAME}.previous"  # the folder's dataset's database while a new run replaces that dataset
INTERRUPTS = (KeyboardInterrupt, duckdb.InterruptException)  # Ctrl-C, or DuckDB's error for it
STAGES = ("ingest", "clean", "filter", "dedup", "split", "mix", "tokenizer", "tokenize")


def check_sources(recipe: Recipe) -> None:
    if not recipe.sources:
        raise DataError("prepare", "no sources: pass --source SPEC or a recipe with [[source]] entries")
    twice = [label for label, n in Counter(s.label for s in recipe.sources).items() if n > 1]
    if twice:
        raise DataError("prepare", f"two sources are named {twice}; give them distinct `name`s")


def _dedup(con, recipe: Recipe) -> int:
    kept = dedup.dedup(con, recipe.filter.near_dedup)
    if recipe.filter.minhash_threshold is not None:
        kept = dedup.drop_similar(con, recipe.filter.minhash_threshold)
    if not kept:
        raise nothing_kept(con, recipe)
    return kept


def nothing_kept(con, recipe: Recipe) -> DataError:
    """The error of a run that keeps no document: the drops, and the fix when a flag has one."""
    n_in, dropped = scalar(con, "SELECT count(*) FROM deduped"), drop_counts(con)
    fixes = []
    top = max((r for r in dropped if r in filters.FIXES), key=lambda r: dropped[r], default=None)
    if top == "too_short":
        longest = scalar(con, "SELECT max(length(text)) FROM filtered WHERE reason = 'too_short'")
        fixes.append(f"the longest document dropped as too short has {longest} characters (--min-chars is "
                     f"{recipe.filter.min_chars}): pass --min-chars {longest} or less")  # fmt: skip
    elif top:
        field, flag = filters.FIXES[top]
        bar = f" ({field} is {getattr(recipe.filter, field)})" if field else ""
        fixes.append(f"the {top} filter dropped {dropped[top]}{bar}: {flag} changes it")
    if "not_utf8" in dropped:
        fixes.append("PATH::raw with --tokenizer bytes reads files that are not UTF-8 as their bytes")
    return DataError("prepare", "; ".join([f"kept 0 of {n_in} documents (dropped {dropped})", *fixes]))


def _text_bytes(con, table: str) -> int:
    nbytes = bytes_sql("t.text", "s.raw")  # a raw source's stored text has one character per byte
    query = f"SELECT coalesce(sum({nbytes}), 0) FROM {table} t JOIN sources s USING (source)"
    return int(con.execute(query).fetchone()[0])


def _stage_bytes(con, name: str, recipe: Recipe) -> int:
    """UTF-8 bytes of the text a stage read: its throughput denominator."""
    table = {"ingest": "raw", "clean": "raw", "filter": "clean", "dedup": "filtered"}.get(name, "pieces")
    nbytes = _text_bytes(con, table)
    if name == "tokenizer":  # trained on a sample, or only loaded
        return 0 if recipe.tokenizer else min(nbytes, recipe.tokenizer_sample_bytes)
    return nbytes


CONSUMED = {
    "clean": ("raw",),
    "filter": ("clean",),
    "dedup": ("filtered",),
}  # tables a stage's output replaces


def run_key(recipe: Recipe, inputs) -> str:
    """What a finished stage is valid for: the recipe and every input's location, size and mtime."""
    files = []
    for items in inputs.values():
        for item in items:
            path = Path(item.location)
            stat = path.stat() if "://" not in item.location and path.exists() else None
            files.append([item.location, stat and stat.st_size, stat and stat.st_mtime_ns, item.limit])
    blob = json.dumps([recipe.to_dict(), files], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def finished_stages(con, key: str, out: Path) -> dict[str, dict[str, float]]:
    """Stages an interrupted run with the same ``key`` finished (name -> timing); else a fresh start."""
    con.execute("CREATE TABLE IF NOT EXISTS progress (key VARCHAR, stage VARCHAR, timing VARCHAR)")
    con.execute("DELETE FROM progress WHERE key <> ?", [key])  # another recipe or changed inputs
    rows = con.execute("SELECT stage, timing FROM progress").fetchall()
    if not rows:  # a fresh start: no batch of an earlier run's tokenize may be resumed
        con.execute("DROP TABLE IF EXISTS tokenized")
        (out / shards.SCRATCH).unlink(missing_ok=True)
        shutil.rmtree(out / NEW, ignore_errors=True)
    return {stage: json.loads(timing) for stage, timing in rows}


def finish_stage(con, key: str, name: str, timing: dict, keep: bool) -> None:
    """Record a finished stage, then drop what it consumed (unless ``keep``) and let DuckDB reuse it."""
    con.execute("INSERT INTO progress VALUES (?, ?, ?)", [key, name, json.dumps(timing)])
    dropped = () if keep else CONSUMED.get(name, ())
    for table in dropped:
        con.execute(f"DROP TABLE IF EXISTS {table}")
    if dropped:
        con.execute("CHECKPOINT")  # freed blocks are reused by the next stage


def shed_text(state: dict[str, Any], out: Path) -> None:
    """After split: ``pieces`` holds the text, so ``deduped`` keeps its accounting only, and the file is
    rewritten without the freed blocks (tokenize's scratch token file grows next to it)."""
    tables = {t: "*" for (t,) in state["con"].execute("SHOW TABLES").fetchall()}
    state["con"].close()
    rewrite(out, {**tables, "deduped": COMPACT_TABLES["deduped"]})
    state["con"] = connect(out)


def run_stages(state: dict[str, Any], recipe: Recipe, inputs, out: Path, quiet: bool, keep: bool) -> dict:
    """Run the stages not yet finished in order over ``state["con"]``; returns per-stage timings."""
    key = run_key(recipe, inputs)
    timings = finished_stages(state["con"], key, out)
    if "tokenizer" in timings and state["tok"] is None:  # trained by the killed run
        state["tok"] = tokenizer_stage.load_tokenizer(out / TRAINED)
    bar = tqdm(total=len(STAGES), desc="prepare", unit="stage", disable=quiet, file=progress_stream())
    con = lambda: state["con"]  # noqa: E731  (tokenize reopens the connection)
    steps = {
        "ingest": lambda: ingest.ingest(con(), recipe, inputs, out),
        "clean": lambda: clean.clean(con()),
        "filter": lambda: filters.filter_docs(con(), recipe.filter),
        "dedup": lambda: _dedup(con(), recipe),
        "split": lambda: split.split(con(), recipe.val_fraction, recipe.seed),
        "mix": lambda: mix.mix(con(), recipe.seed),
        "tokenizer": lambda: _tokenizer(state, recipe, out),
        "tokenize": lambda: _tokenize(state, out, recipe, quiet),
    }
    with bar:  # closed before an error is printed
        for name in STAGES:
            bar.set_postfix_str(name)
            if name not in timings:
                start = time.perf_counter()
                steps[name]()
                seconds = time.perf_counter() - start
                mb = _stage_bytes(con(), name, recipe) / 1e6
                timings[name] = {
                    "seconds": round(seconds, 3),
                    "mb": round(mb, 3),
                    "mb_per_s": round(mb / seconds, 2),
                }
                finish_stage(con(), key, name, timings[name], keep)
                if name == "split" and not keep:  # after the record: a kill in between leaves more disk only
                    start = time.perf_counter()
                    shed_text(state, out)
                    seconds += time.perf_counter() - start  # counted in split's time (meta.json)
                    timings[name].update(seconds=round(seconds, 3), mb_per_s=round(mb / seconds, 2))
            bar.update(1)
    if "shards" not in state:  # tokenize finished in an earlier run: its shard list is in the table
        state["shards"] = shard_list(con())
    return {name: timings[name] for name in STAGES}


def _tokenizer(state: dict[str, Any], recipe: Recipe, out: Path) -> None:
    """Stage 7 when no tokenizer was given (a given one is loaded before any stage runs); the trained one
    is saved so that a resumed run tokenizes with it."""
    if state["tok"] is None:
        tok = tokenizer_stage.train_tokenizer(state["con"], recipe.vocab_size, recipe.tokenizer_sample_bytes)
        tok.save(out / TRAINED)
        state["tok"] = tok


def _tokenize(state: dict[str, Any], out: Path, recipe: Recipe, quiet: bool) -> None:
    """Encode with DuckDB closed (its threads must not be running when the workers fork), then write."""
    total = _text_bytes(state["con"], "pieces")
    state["con"].close()
    bar = tqdm(total=total, desc="tokenize", unit="B", unit_scale=True, disable=quiet, file=progress_stream())
    with bar:
        shards.encode_pieces(out, state["tok"], recipe.workers, bar)
    state["con"] = connect(out)
    (out / NEW).mkdir(exist_ok=True)
    state["shards"] = shards.tokenize(state["con"], state["tok"], out, recipe.shard_tokens, dest=out / NEW)
    state["con"].execute("CREATE OR REPLACE TABLE shard_files AS SELECT unnest(?::VARCHAR[]) AS list",
                         [[json.dumps(state["shards"])]])  # fmt: skip


def shard_list(con) -> dict[str, list[dict]]:
    return json.loads(con.execute("SELECT list FROM shard_files").fetchone()[0])


def compact(out: Path) -> None:
    """Keep only the accounting (no text) in ``pipeline.duckdb``; remove the scratch files."""
    for name in (shards.SCRATCH, TRAINED):
        (out / name).unlink(missing_ok=True)
    rewrite(out, COMPACT_TABLES)
    remove_temp(out)


COMPACT_TABLES = {
    "sources": "*",
    "deduped": "doc_id, source, hash, reason",
    "pieces": "doc_id, part, source, split",
    "mixed": "*",
    "tokenized": "*",
}


def prepare(
    recipe: Recipe,
    out: str | Path,
    mirror: str | Path | None = None,
    quiet: bool = False,
    keep_intermediate: bool = False,
) -> dict:
    """Run ingest -> clean -> filter -> dedup -> split -> mix -> tokenizer -> tokenize; returns meta.

    A run killed part-way and started again with the same recipe and inputs continues after its last
    finished stage (or, inside tokenize, its last encoded batch). Tables a stage has consumed are
    dropped, and the database is compacted to its accounting at the end, unless ``keep_intermediate``.
    The new dataset replaces the folder's only once it is whole (see the module docstring); a run that
    started afresh and stops on an error removes its work again, and the database of the folder's
    dataset (set aside meanwhile) comes back; an interrupted one (Ctrl-C) keeps its work, which the same
    call continues.
    """
    check_sources(recipe)
    out = Path(out)
    mirror_path = resolve_mirror(mirror)
    inputs = {s.label: resolve(s, mirror_path, out / "downloads") for s in recipe.sources}
    given = tokenizer_stage.load_tokenizer(recipe.tokenizer) if recipe.tokenizer else None  # fail early
    out.mkdir(parents=True, exist_ok=True)
    remove_temp(out)  # spill files of a killed run
    fresh = set_aside_finished(out)
    state: dict[str, Any] = {"tok": given}
    try:
        state["con"] = connect(out)
        meta = _run(state, recipe, inputs, out, quiet, keep_intermediate)
        stale = _stale_sft(out, meta["tokenizer_fingerprint"])
        remove = _replaced_splits(out, meta) + stale
    except BaseException as err:
        if fresh and not isinstance(err, INTERRUPTS):  # an interrupted run's work is continued next time
            discard_work(out)
            _move_db(out, PREVIOUS, DB_NAME)
        raise
    try:
        replace_files(out, out / NEW, META_NAME, remove)
    finally:
        if not (out / NEW).exists():  # moved in (a Ctrl-C held during the moves is raised after them)
            _move_db(out, PREVIOUS, None)
            clear_progress(out)  # only now: until here the same command continues this run
    if not keep_intermediate:
        compact(out)
    if stale:
        print(
            f"euler-data prepare: removed the SFT set in {out}: it was built with the previous tokenizer "
            "(run `euler-data sft` again)",
            file=sys.stderr,
        )
    return meta


def _run(state: dict[str, Any], recipe: Recipe, inputs, out: Path, quiet: bool, keep: bool) -> dict:
    """Every stage, then the new dataset's tokenizer.json and meta.json in the staging folder."""
    try:
        timings = run_stages(state, recipe, inputs, out, quiet, keep)
        tok, con = state["tok"], state["con"]
        (out / NEW).mkdir(exist_ok=True)  # gone where a kill came after the moves, before clear_progress
        tok.save(out / NEW / "tokenizer.json")
        extra = {
            "context_hint": recipe.context_hint,
            "seed": recipe.seed,
            "val_fraction": recipe.val_fraction,
        }
        meta = build_meta(con, tok, {**extra, "stages": timings, "recipe": recipe.to_dict()})
    finally:
        state["con"].close()
    written = {split: sum(f["tokens"] for f in files) for split, files in state["shards"].items()}
    if meta["tokens"] != written:  # the per-source counts must add up to the shards
        raise RuntimeError(f"prepare: meta.json tokens {meta['tokens']} != tokens written {written}")
    meta["shards"] = state["shards"]
    write_meta(out / NEW, meta)
    return meta


def _replaced_splits(folder: Path, meta: dict) -> list[Path]:
    """The folder's token files that the new dataset does not have (a train.bin replaced by shards, or
    the other way round)."""
    new = {f["file"] for files in meta["shards"].values() for f in files}
    return [p for split in ("train", "val") for p in shards.split_files(folder, split) if p.name not in new]


def _stale_sft(folder: Path, fingerprint: str) -> list[Path]:
    """The files of the SFT and preference sets built with another tokenizer than the new tokenizer.json
    (to remove)."""
    stale = []
    for command, (record, _, _, _) in SIDE_SETS.items():
        meta = folder / record
        if (
            meta.is_file()
            and json.loads(meta.read_text(encoding="utf-8")).get("tokenizer_fingerprint") != fingerprint
        ):
            stale += side_set_files(folder, command)
    return stale


def set_aside_finished(out: Path) -> bool:
    """Move a database that holds no unfinished run (a finished dataset's accounting) to PREVIOUS, out of
    the new run's way; whether the run starts afresh."""
    db = out / DB_NAME
    if db.exists():
        con = duckdb.connect(str(db), read_only=True)  # read only: the file stays byte for byte
        try:
            tables = {t for (t,) in con.execute("SHOW TABLES").fetchall()}
            if "progress" in tables and scalar(con, "SELECT count(*) FROM progress"):
                return False
        finally:
            con.close()
    if (out / PREVIOUS).exists():  # an interrupted fresh run that finished no stage: PREVIOUS is the set's
        discard_work(out)
    else:
        _move_db(out, DB_NAME, PREVIOUS)
    return True


def clear_progress(out: Path) -> None:
    """A run whose dataset is in place: the same command again starts over (and sets this one aside)."""
    con = connect(out)
    try:
        con.execute("DROP TABLE IF EXISTS progress")
    finally:
        con.close()


def _move_db(out: Path, name: str, to: str | None) -> None:
    """Rename (or, to None, delete) the database ``name`` and its write-ahead log, where they exist."""
    for suffix in ("", ".wal"):
        path = out / f"{name}{suffix}"
        if path.exists() and to:
            path.replace(out / f"{to}{suffix}")
        elif path.exists():
            path.unlink()


def discard_work(out: Path) -> None:
    """Remove what a run that started in a folder without one left there (nothing of a dataset)."""
    for name in (DB_NAME, f"{DB_NAME}.wal", TRAINED, shards.SCRATCH, ingest.STAGING):
        (out / name).unlink(missing_ok=True)
    for name in (NEW, TEMP_NAME):
        shutil.rmtree(out / name, ignore_errors=True)
