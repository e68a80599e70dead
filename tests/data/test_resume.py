"""prepare at scale: resumable after kill -9 (byte-identical), train shards, compaction, streaming limits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import euler_data
from euler_data import Recipe, SourceSpec, prepare, shards
from euler_data.db import connect
from euler_data.meta import split_paths

pytestmark = pytest.mark.data

BOOKS = ("pg46.txt", "pg844.txt", "pg5200.txt", "11-0.txt")  # ~1 MB of the mirror's books


@pytest.fixture
def books(mirror, tmp_path) -> Path:
    """A folder of real books plus the mirror's C4 jsonl, read ``::paragraph`` (~3000 documents)."""
    root = tmp_path / "books"
    root.mkdir()
    for name in BOOKS:
        (root / name).write_bytes((mirror / "gutenberg" / name).read_bytes())
    return root


def cli(out: Path, source: Path, *extra: str) -> list[str]:
    """The prepare command; --overwrite, as a kill that comes after the new dataset is in place leaves a
    finished folder, which the next run must replace."""
    return [sys.executable, "-m", "euler_data.cli", "prepare", "--source", f"{source}::paragraph",
            "--out", str(out), "--vocab-size", "600", "--quiet", "--overwrite", *extra]  # fmt: skip


def result_bytes(out: Path) -> dict[str, bytes]:
    """Every file of a finished folder that a trainer reads, and meta.json without its stage timings."""
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    files = {p.name: p.read_bytes() for split in ("train", "val") for p in split_paths(out, split, meta)}
    files["tokenizer.json"] = (out / "tokenizer.json").read_bytes()
    meta.pop("stages")
    files["meta.json"] = json.dumps(meta, sort_keys=True).encode()
    return files


def test_kill_9_at_random_points_then_the_same_command_gives_identical_bytes(books, tmp_path):
    ref = tmp_path / "ref"
    start = time.perf_counter()
    subprocess.run(cli(ref, books), check=True, capture_output=True)
    full = time.perf_counter() - start
    out = tmp_path / "killed"
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    kills = sorted(rng.uniform(0.3, 0.95, size=3) * full)  # three kills at random points of a run
    print(f"full run {full:.1f} s; kill -9 after {[round(k, 1) for k in kills]} s")  # shown with -s
    for after in kills:
        proc = subprocess.Popen(cli(out, books), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        time.sleep(after)
        os.killpg(proc.pid, signal.SIGKILL)  # the prepare and its encoding workers
        proc.wait()
    subprocess.run(cli(out, books), check=True, capture_output=True)
    assert result_bytes(out) == result_bytes(ref)
    assert not (out / shards.SCRATCH).exists() and not (out / "duckdb_tmp").exists()


def test_tokenize_resumes_after_its_last_recorded_batch(books, tmp_path, monkeypatch):
    recipe = Recipe(sources=(SourceSpec(str(books), docs="paragraph"),), vocab_size=600)
    ref = tmp_path / "ref"
    prepare(recipe, ref, quiet=True)
    monkeypatch.setattr(shards, "BATCH_CHARS", 100_000)  # ~6 batches
    out, calls = tmp_path / "out", []
    encode_rows = shards.encode_rows

    def dies_in_batch_3(tok, rows, workers):
        calls.append(len(rows))
        if len(calls) == 3:
            raise KeyboardInterrupt  # as if killed while encoding the third batch
        return encode_rows(tok, rows, workers)

    monkeypatch.setattr(shards, "encode_rows", dies_in_batch_3)
    with pytest.raises(KeyboardInterrupt):
        prepare(recipe, out, quiet=True)
    con = connect(out)
    recorded = con.execute("SELECT count(*) FROM tokenized").fetchone()[0]
    con.close()
    assert recorded == calls[0] + calls[1]  # the two finished batches, not the third
    with open(out / shards.SCRATCH, "ab") as scratch:
        scratch.write(b"\x01\x02" * 1000)  # a batch written but not recorded when the kill came
    monkeypatch.setattr(shards, "encode_rows", encode_rows)
    resumed = []
    monkeypatch.setattr(shards, "fetch_batch", lambda con, after: resumed.append(after) or fetch(con, after))
    prepare(recipe, out, quiet=True)
    assert resumed[0] != (-1, -1)  # it went on after the recorded batches
    assert result_bytes(out) == result_bytes(ref)


fetch = shards.fetch_batch


def test_large_train_split_is_sharded_and_the_loader_reads_across_shards(books, tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    recipe = Recipe(sources=(SourceSpec(str(books), docs="paragraph"),), vocab_size=600)
    meta = prepare(recipe, single, quiet=True)
    assert [f["file"] for f in meta["shards"]["train"]] == ["train.bin"]  # small: nanoGPT's one file
    size = meta["tokens"]["train"] // 3 + 1
    meta2 = prepare(Recipe(**{**recipe.__dict__, "shard_tokens": size}), sharded, quiet=True)
    files = meta2["shards"]["train"]
    assert [f["file"] for f in files] == ["train_00000.bin", "train_00001.bin", "train_00002.bin"]
    assert [f["tokens"] for f in files[:-1]] == [size, size] and not (sharded / "train.bin").exists()
    whole = b"".join((sharded / f["file"]).read_bytes() for f in files)
    assert whole == (single / "train.bin").read_bytes()  # shards end to end are the one file
    assert (sharded / "val.bin").read_bytes() == (single / "val.bin").read_bytes()  # val stays one file
    loader = euler_data.PretrainLoader(sharded, context=64, extra_targets=2, batch_size=64, seed=1)
    stream = np.frombuffer(whole, dtype=np.uint16)
    seen = set()
    for step in range(20):
        tokens, targets = loader.batch(step)
        for row_t, row_y, start in zip(tokens, targets, loader.starts(step)):
            shard = int(np.searchsorted(loader.first_start, start, side="right")) - 1
            seen.add(shard)
            begin = shard * size + int(start - loader.first_start[shard])  # in the end-to-end stream
            assert begin + 66 <= (shard + 1) * size  # inside its shard
            np.testing.assert_array_equal(row_t, stream[begin : begin + 64])
            np.testing.assert_array_equal(row_y, stream[begin + 1 : begin + 66])
    assert seen == {0, 1, 2}
    report = subprocess.run([sys.executable, "-m", "euler_data.cli", "inspect", str(sharded)],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    docs = meta2["documents"]["train"]
    assert f"train: tokens per document ({docs} documents)" in report


def test_intermediates_are_dropped_and_the_database_compacted_by_default(books, tmp_path):
    recipe = Recipe(sources=(SourceSpec(str(books), docs="paragraph"),), vocab_size=600)
    kept, default = tmp_path / "kept", tmp_path / "default"
    prepare(recipe, kept, quiet=True, keep_intermediate=True)
    prepare(recipe, default, quiet=True)
    assert result_bytes(kept) == result_bytes(default)
    tables = lambda folder: {t for (t,) in connect(folder).execute("SHOW TABLES").fetchall()}  # noqa: E731
    assert {"raw", "clean", "filtered"} <= tables(kept)
    assert tables(default) == {"sources", "deduped", "pieces", "mixed", "tokenized"}
    con = connect(default)
    assert "text" not in {c for (c, *_) in con.execute("DESCRIBE pieces").fetchall()}  # no text is kept
    con.close()
    assert (default / "pipeline.duckdb").stat().st_size < (kept / "pipeline.duckdb").stat().st_size / 2
    assert not (default / shards.SCRATCH).exists() and (kept / shards.SCRATCH).exists()
    # the same command again on a finished folder starts over and writes the same bytes
    prepare(recipe, default, quiet=True)
    assert result_bytes(default) == result_bytes(kept)


def test_a_changed_recipe_does_not_resume_a_killed_run(books, tmp_path, monkeypatch):
    recipe = Recipe(sources=(SourceSpec(str(books), docs="paragraph"),), vocab_size=600)
    monkeypatch.setattr(shards, "encode_rows", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        prepare(recipe, tmp_path / "out", quiet=True)  # dies in tokenize, tokenizer trained
    monkeypatch.undo()
    other = Recipe(**{**recipe.__dict__, "vocab_size": 700})
    meta = prepare(other, tmp_path / "out", quiet=True)
    assert meta["vocab_size"] == 700
    assert result_bytes(tmp_path / "out") == result_bytes(_fresh(other, tmp_path / "fresh"))


def _fresh(recipe: Recipe, out: Path) -> Path:
    prepare(recipe, out, quiet=True)
    return out


def test_memory_limit_from_the_environment_is_checked(monkeypatch, tmp_path):
    monkeypatch.setenv("EULER_DATA_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="EULER_DATA_MEMORY_LIMIT='lots'"):
        connect(tmp_path)
