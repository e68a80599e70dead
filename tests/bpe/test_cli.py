"""The euler-bpe command line: train, encode, decode, info, and its errors."""

from __future__ import annotations

import subprocess
import sys
from array import array

import pytest

import euler_bpe
from euler_bpe import Tokenizer
from euler_bpe.cli import main

TEXT = "The cat sat on the mat. The dog sat on the log.\n" * 200


@pytest.fixture()
def trained(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "tok.json"
    assert (
        main(["train", str(corpus), "--vocab-size", "270", "--chat-specials", "--out", str(out), "--quiet"])
        == 0
    )
    return out


def run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "euler_bpe.cli", *args]
    return subprocess.run(command, input=stdin, capture_output=True, check=False)


def test_train_writes_a_loadable_tokenizer(trained) -> None:
    tok = Tokenizer.load(trained)
    assert tok.vocab_size == 270
    assert "<|assistant|>" in tok.special_tokens
    ids = tok.encode(TEXT)
    assert len(ids) < 0.7 * len(TEXT.encode()) and tok.decode(ids) == TEXT  # the merges compress


def test_train_from_stdin_with_progress(tmp_path) -> None:
    out = tmp_path / "t.json"
    done = run_cli(
        "train", "--vocab-size", "270", "--special", "<|x|>", "--out", str(out), stdin=TEXT.encode()
    )
    assert done.returncode == 0, done.stderr
    assert b"tokens [" in done.stderr  # the progress bar
    assert Tokenizer.load(out).special_tokens == {"<|x|>": 269}


@pytest.mark.parametrize("fmt", ["text", "u16"])
def test_encode_decode_round_trip_on_bytes(trained, fmt) -> None:
    data = TEXT.encode() + b"\xff\xfe invalid \xc3 utf-8 <|end|>\n"
    enc = run_cli("encode", "--tokenizer", str(trained), "--format", fmt, stdin=data)
    assert enc.returncode == 0, enc.stderr
    tok = Tokenizer.load(trained)
    if fmt == "u16":
        ids = array("H", enc.stdout).tolist()
    else:
        ids = [int(x) for x in enc.stdout.split()]
    assert ids == tok.encode_bytes(data)
    dec = run_cli("decode", "--tokenizer", str(trained), "--format", fmt, stdin=enc.stdout)
    assert dec.returncode == 0 and dec.stdout == data


def test_encode_with_workers_equals_one_process(trained, tmp_path, capsysbinary) -> None:
    big = tmp_path / "big.txt"
    big.write_bytes((TEXT + "  \n\n  spaces\u00a0\n" * 10).encode() * 40)
    assert main(["encode", "--tokenizer", str(trained), "--input", str(big), "--workers", "2"]) == 0
    ids = [int(x) for x in capsysbinary.readouterr().out.split()]
    assert ids == Tokenizer.load(trained).encode_bytes(big.read_bytes())


def test_encode_allow_special(trained) -> None:
    tok = Tokenizer.load(trained)
    enc = run_cli("encode", "--tokenizer", str(trained), "--allow-special", stdin=b"hi<|end|>")
    assert [int(x) for x in enc.stdout.split()][-1] == tok.special_tokens["<|end|>"]


def test_info(trained) -> None:
    done = run_cli("info", str(trained))
    assert done.returncode == 0
    assert b"vocab_size      270" in done.stdout
    assert Tokenizer.load(trained).fingerprint.encode() in done.stdout


def test_errors_are_messages_not_tracebacks(tmp_path, trained) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "euler-bpe", "version": 7}')
    done = run_cli("info", str(bad))
    assert done.returncode == 2 and b"unknown euler-bpe version 7" in done.stderr
    assert b"Traceback" not in done.stderr
    done = run_cli("train", "--vocab-size", "100", "--out", str(tmp_path / "x.json"), stdin=b"text")
    assert done.returncode == 2 and b"vocab_size=100" in done.stderr
    done = run_cli("decode", "--tokenizer", str(trained), "--format", "u16", stdin=b"\x01\x02\x03")
    assert done.returncode == 2 and b"uint16" in done.stderr
    done = run_cli("decode", "--tokenizer", str(trained), stdin=b"1 2 99999")
    assert done.returncode == 2 and b"outside the vocabulary" in done.stderr


def test_train_with_sample_bytes_and_workers(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("alpha beta\n" * 150_000 + "gamma delta\n" * 150_000)
    out = tmp_path / "t.json"
    args = ["train", str(corpus), "--vocab-size", "280", "--sample-bytes", "1000000", "--workers", "2"]
    assert main([*args, "--out", str(out), "--quiet"]) == 0
    tok = Tokenizer.load(out)
    learned = {tok.token_bytes(i) for i in range(256, tok.vocab_size)}
    assert b" beta" in learned or b"beta" in learned
    assert b" delta" in learned or b"delta" in learned  # the sample reaches the second half


def test_train_says_when_the_text_supports_fewer_tokens_than_asked(tmp_path) -> None:
    out = tmp_path / "t.json"
    done = run_cli(
        "train", "--vocab-size", "60000", "--chat-specials", "--out", str(out), stdin=TEXT.encode()
    )
    assert done.returncode == 0, done.stderr
    got = Tokenizer.load(out).vocab_size
    assert got < 60000
    note = f"euler-bpe train: note: asked for 60000 tokens, the text supports {got}; the tokenizer has {got}"
    assert note in done.stderr.decode().splitlines()  # on a line of its own, after the progress bar
    quiet = run_cli("train", "--vocab-size", "270", "--out", str(out), "--quiet", stdin=TEXT.encode())
    assert quiet.returncode == 0 and b"note:" not in quiet.stderr  # asked for what it got: nothing to say


def test_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.decode() == f"euler-bpe {euler_bpe.__version__}\n"
