"""Bytes mode (`prepare --tokenizer bytes`), through the euler-data command in a subprocess.

Ids 0-255 are the bytes and the chat special tokens follow; text sources give the UTF-8 of their cleaned
documents, `PATH::raw` sources (any file) their exact bytes.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from euler_bpe import CHAT_SPECIAL_TOKENS, Tokenizer

pytestmark = pytest.mark.data
EOT = 256  # <|endoftext|>, the first id after the bytes


def euler_data(*argv: str) -> subprocess.CompletedProcess:
    """`python -m euler_data.cli ARGV` (text output; EULER_DATA_OFFLINE comes from the conftest)."""
    cmd = [sys.executable, "-m", "euler_data.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def prepare(out: Path, *argv: str) -> dict:
    done = euler_data("prepare", "--tokenizer", "bytes", "--out", str(out), "--quiet", "--workers=1", *argv)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "meta.json").read_text(encoding="utf-8"))


def bin_docs(folder: Path, split: str) -> list[bytes]:
    """The documents of a bin as bytes: every id but the <|endoftext|> after each is a byte."""
    ids = np.fromfile(folder / f"{split}.bin", dtype=np.uint16)
    assert len(ids) == 0 or ids[-1] == EOT
    assert set(np.unique(ids[ids >= 256]).tolist()) <= {EOT}  # no other special token in a bin
    ends = np.flatnonzero(ids == EOT)
    starts = np.concatenate([[0], ends[:-1] + 1])
    return [ids[s:e].astype(np.uint8).tobytes() for s, e in zip(starts, ends)]


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("euler-data: error: ") and "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def stories(mirror, tmp_path) -> tuple[Path, list[bytes]]:
    """The first 300 TinyStories of the mirror's sample (its own bytes) and the stories, stripped."""
    raw = (mirror / "tinystories" / "TinyStories-train_first2MiB.txt").read_bytes()
    head = b"<|endoftext|>".join(raw.split(b"<|endoftext|>")[:300])
    path = tmp_path / "stories.txt"
    path.write_bytes(head)
    return path, [s.strip() for s in head.split(b"<|endoftext|>") if s.strip()]


def test_a_text_source_gives_the_utf8_bytes_of_its_documents(stories, tmp_path):
    path, expected = stories
    out = tmp_path / "ts"
    meta = prepare(out, "--source", f"{path}::eot")
    docs = bin_docs(out, "train") + bin_docs(out, "val")
    assert sorted(docs) == sorted(expected) and meta["documents_kept"] == len(expected) == 300
    for split in ("train", "val"):  # one token per byte, plus the <|endoftext|> after each document
        assert meta["tokens"][split] == meta["bytes"][split] + meta["documents"][split]
        assert (out / f"{split}.bin").stat().st_size == 2 * meta["tokens"][split]
    tok = Tokenizer.load(out / "tokenizer.json")
    assert tok.is_byte_level and tok.vocab_size == 260 == meta["vocab_size"] and meta["tokenizer"] == "bytes"
    assert tok.special_tokens == {s: 256 + k for k, s in enumerate(CHAT_SPECIAL_TOKENS)}
    assert json.loads((out / "tokenizer.json").read_text())["kind"] == "bytes"


def test_raw_files_of_any_type_keep_their_exact_bytes(mirror, tmp_path):
    folder = tmp_path / "blobs"
    folder.mkdir()
    book = gzip.compress((mirror / "gutenberg" / "pg46.txt").read_bytes(), mtime=0)
    noise = np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    special_text = bytes(range(256)) + b"<|endoftext|><|user|>" + b"\xff\xfe\x00"  # all bytes, no specials
    files = {"carol.txt.gz": book, "noise.bin": noise, "sub/every_byte": special_text}
    for name, data in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
    (folder / "empty.dat").write_bytes(b"")
    out = tmp_path / "raw"
    meta = prepare(out, "--source", f"{folder}::raw", "--val-fraction", "0.1")
    # split by position: the first 90% of each file's bytes to train, the rest to val
    cut = {name: int(len(data) * 0.9) for name, data in files.items()}
    assert sorted(bin_docs(out, "train")) == sorted(d[: cut[n]] for n, d in files.items())
    assert sorted(bin_docs(out, "val")) == sorted(d[cut[n] :] for n, d in files.items())
    assert meta["documents_in"] == 4 and meta["dropped"] == {"empty": 1}
    assert sum(meta["bytes"].values()) == sum(map(len, files.values()))
    for split in ("train", "val"):
        assert meta["tokens"][split] == meta["bytes"][split] + meta["documents"][split]


def test_a_raw_text_file_keeps_what_text_reading_drops_or_cleans(tmp_path):
    latin1 = "Caf\xe9 cr\xe8me, na\xefve \u2013 ".encode("cp1252") * 30 + b"\r\n\x07"  # not UTF-8, CRLF, BEL
    path = tmp_path / "old.txt"
    path.write_bytes(latin1)
    as_text = ["--tokenizer", "bytes", "--out", str(tmp_path / "as_text"), "--source", str(path), "--quiet"]
    done = euler_data("prepare", *as_text)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # nothing kept: refused
    assert "kept 0 of 1 documents (dropped {'not_utf8': 1})" in done.stderr and "::raw" in done.stderr
    assert not (tmp_path / "as_text").exists()  # and nothing left behind
    meta = prepare(tmp_path / "as_raw", "--source", f"{path}::raw", "--val-fraction", "0")
    assert bin_docs(tmp_path / "as_raw", "train") == [latin1] and meta["dropped"] == {}


def test_inspect_a_bytes_set(stories, tmp_path):
    path, _ = stories
    blob = tmp_path / "x.bin"
    blob.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(200, 256)) * 8)
    out = tmp_path / "mixed"
    prepare(out, "--source", f"{path}::eot", "--source", f"{blob}::raw", "--val-fraction", "0")
    done = euler_data("inspect", str(out), "--samples", "400")
    assert done.returncode == 0, done.stderr
    assert "tokenizer: bytes " in done.stdout and "vocab: 260" in done.stdout
    samples = done.stdout.split("samples (first 400 train documents):\n")[1].splitlines()
    assert len(samples) == 301 and sum(s.startswith('  "') for s in samples) == 300  # stories: text
    assert [s for s in samples if s.startswith("  b'")] == ["  " + repr(blob.read_bytes()[:160])]


def test_sft_with_the_byte_tokenizer(tmp_path):
    src = tmp_path / "qa.jsonl"
    words = ["un", "deux", "trois"] * 4
    rows = [
        {"instruction": f"Say {w} {i}?", "output": f"{w} \u00e9t\u00e9 {i}."} for i, w in enumerate(words)
    ]
    src.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    out = tmp_path / "sft"
    done = euler_data("sft", "--source", str(src), "--out", str(out), "--tokenizer", "bytes")
    assert done.returncode == 0, done.stderr
    tokens = np.fromfile(out / "sft_train_tokens.bin", dtype=np.uint16)
    assert set(np.unique(tokens[tokens >= 256]).tolist()) <= {256, 257, 258, 259}
    assert "\u00e9t\u00e9 ".encode() in tokens[tokens < 256].astype(np.uint8).tobytes()
    assert Tokenizer.load(out / "tokenizer.json").is_byte_level


def test_bad_combinations_exit_2_with_one_line_and_write_nothing(tmp_path):
    blob = tmp_path / "x.bin"
    blob.write_bytes(b"\x00\x01")
    text = tmp_path / "t.txt"
    text.write_text("some text\n", encoding="utf-8")
    (tmp_path / "void").mkdir()
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'tokenizer = "bytes"\nvocab_size = 512\n[[source]]\nspec = "{text}"\n')
    out = tmp_path / "never"
    cases = [
        (["--source", str(text), "--tokenizer", "bytes", "--vocab-size", "4096"], ["--vocab-size", "fixed"]),
        (["--recipe", str(recipe)], ["vocab_size=512", "fixed"]),
        (["--source", f"{blob}::raw"], ["::raw", "--tokenizer bytes"]),
        (["--source", f"{blob}::raw", "--tokenizer", str(tmp_path / "tok.json")], ["--tokenizer bytes"]),
        (["--source", str(blob), "--tokenizer", "bytes"], ["unknown file type '.bin'", "PATH::raw"]),
        (["--source", f"{tmp_path / 'void'}::raw", "--tokenizer", "bytes"], ["void", "no files"]),
    ]
    cases += [(["--source", str(text), "--vocab-size", n], [f"vocab_size={n}", "--tokenizer bytes"]) for n in
              ("256", "257", "260")]  # fmt: skip
    for argv, needles in cases:
        one_line_error(euler_data("prepare", "--out", str(out), *argv), *needles)
        assert not out.exists(), argv
