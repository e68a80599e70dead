"""A bytes-mode model end to end: pretrain, bits per byte, generate (pipe and terminal), chat, sft, export.

The data: 200 TinyStories of the mirror (text) and 3 kB of random bytes (`::raw`), so a briefly trained
model samples bytes that are not UTF-8.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from euler_data.cli import main as euler_data
from euler_train.metrics import read_metrics

pytestmark = pytest.mark.data
PROMPT = b"\xff\xfeOnce"  # not UTF-8: the command line's bytes must reach the model as they are
GENERATE = ["--max-new-tokens", "50", "--temperature", "1", "--top-k", "260", "--top-p", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def byte_data(mirror, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("bytes")
    raw = (mirror / "tinystories" / "TinyStories-train_first2MiB.txt").read_bytes()
    (tmp / "stories.txt").write_bytes(b"<|endoftext|>".join(raw.split(b"<|endoftext|>")[:200]))
    (tmp / "noise.bin").write_bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8).tobytes())
    out = tmp / "data"
    sources = ["--source", f"{tmp / 'stories.txt'}::eot", "--source", f"{tmp / 'noise.bin'}::raw"]
    argv = ["prepare", *sources, "--tokenizer", "bytes", "--out", str(out), "--quiet", "--workers", "1"]
    assert euler_data(argv) == 0
    qa = [{"instruction": f"Tell story {i}.", "output": f"Once upon a time, {i} cats."} for i in range(40)]
    (tmp / "qa.json").write_text(json.dumps(qa), encoding="utf-8")
    assert euler_data(["sft", "--source", str(tmp / "qa.json"), "--out", str(out), "--context", "96"]) == 0
    return out


@pytest.fixture(scope="module")
def byte_run(byte_data, tmp_path_factory, cli) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("runs") / "bytes"
    argv = ["pretrain", "--data", str(byte_data), "--out", str(run), "--steps", "20", "--eval-every", "10"]
    done = cli(*argv, "--no-progress", "--set", "model.context=64", "--set", "train.lr=1e-2")
    return run, done


def euler_train(*argv: str | bytes, **kw) -> subprocess.CompletedProcess:
    """`python -m euler_train.cli ARGV` with bytes output (argv may hold bytes)."""
    cmd = [sys.executable.encode(), b"-m", b"euler_train.cli", *(os.fsencode(a) for a in argv)]
    return subprocess.run(cmd, capture_output=True, timeout=120, **kw)


def sampled_bytes(run: Path, prompt: bytes) -> bytes:
    """What `generate GENERATE` samples, computed in this process with the same code and seed."""
    from euler_train.sampling import generate_bytes, load_for_sampling

    args = argparse.Namespace(max_new_tokens=50, temperature=1.0, top_k=260, top_p=1.0, seed=3)
    args.repetition_penalty = 1.0
    return b"".join(generate_bytes(load_for_sampling(str(run)), args, os.fsdecode(prompt)))


def test_pretrain_on_bytes_gives_bits_per_byte(byte_run, byte_data):
    run, done = byte_run
    assert done.returncode == 0, done.stderr
    assert "vocab 260" in done.stdout + done.stderr
    meta = json.loads((byte_data / "meta.json").read_text())
    assert meta["tokens"]["val"] == meta["bytes"]["val"] + meta["documents"]["val"]  # one token per byte
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "val_bpb" in r]
    assert rows and rows[-1]["step"] == 20
    ratio = meta["tokens"]["val"] / meta["bytes"]["val"]
    assert rows[-1]["val_bpb"] == pytest.approx(rows[-1]["val_next_loss"] / math.log(2) * ratio, rel=1e-12)
    assert rows[-1]["val_bpb"] < 8.0  # below a uniform guess over the 256 bytes


def test_generate_to_a_pipe_writes_the_sampled_bytes_exactly(byte_run):
    run, _ = byte_run
    done = euler_train("generate", "--checkpoint", str(run), "--prompt", PROMPT, *GENERATE)
    assert done.returncode == 0, done.stderr
    expected = sampled_bytes(run, PROMPT)
    assert done.stdout == expected and len(expected) > 20  # nothing added, not even a newline
    with pytest.raises(UnicodeDecodeError):
        expected.decode("utf-8")  # so the exact bytes are what matters here


def test_generate_on_a_terminal_shows_replacement_characters(byte_run):
    import pty

    from euler_train.sampling import for_terminal

    run, _ = byte_run
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable.encode(), b"-m", b"euler_train.cli", b"generate", b"--checkpoint", os.fsencode(run),
         b"--prompt", PROMPT, *map(str.encode, GENERATE)],
        stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0
    os.close(master)
    text = for_terminal(sampled_bytes(run, PROMPT).decode("utf-8", "replace")) + "\n"
    assert "\ufffd" in text and seen.decode("utf-8") == text.replace("\n", "\r\n")  # the tty's \n -> \r\n


def test_chat_and_sft_on_a_byte_model(byte_run, byte_data, tmp_path):
    run, _ = byte_run
    done = euler_train("chat", "--checkpoint", str(run), "--max-new-tokens", "12", "--seed", "0",
                       input=b"Hello \xc3\xa9\n/reset\nBye\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode("utf-8").count("assistant> ") == 2
    sft = tmp_path / "sft"
    argv = ["sft", "--data", str(byte_data), "--init", str(run), "--out", str(sft), "--steps", "4"]
    done = euler_train(*argv, "--eval-every", "4", "--no-progress")
    assert done.returncode == 0, done.stderr.decode()
    assert [r["step"] for r in read_metrics(sft / "metrics.jsonl") if "val_loss" in r] == [4]


def test_export_hf_of_a_byte_model_encodes_bytes_in_tokenizers(byte_run, tmp_path):
    from tokenizers import Tokenizer as HFTokenizer

    from euler_bpe import Tokenizer

    run, _ = byte_run
    done = euler_train("export-hf", "--checkpoint", str(run), "--out", str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    hf = HFTokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    text = "Once upon a time, caf\u00e9 \u2603<|endoftext|>"
    assert hf.encode(text).ids == [*text[:-13].encode("utf-8"), 256]
    assert Tokenizer.load(tmp_path / "hf" / "tokenizer.json").is_byte_level
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 260
