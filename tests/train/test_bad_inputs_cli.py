"""Every command line (euler-bpe, euler-data, euler-train) over a table of bad inputs: each exits 2 with
one line on stderr, no traceback, and leaves every file of the data, run and input folders as it was."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

MODULES = {"euler-bpe": "euler_bpe.cli", "euler-data": "euler_data.cli", "euler-train": "euler_train.cli"}


@pytest.fixture(scope="module")
def work(tmp_path_factory, dataset, tiny_run, corpus) -> dict[str, Path]:
    """Inputs to misuse: a good tokenizer, a broken one, odd files, a copy of a finished run."""
    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "broken.json").write_text("{ not json", encoding="utf-8")
    (root / "odd.bin").write_bytes(b"\x01\x02\x03")
    (root / "ids.txt").write_text("1 2 x 3\n", encoding="utf-8")
    (root / "huge_ids.txt").write_text("1 99999999\n", encoding="utf-8")
    (root / "not_records.json").write_text('[{"instruction": 3}', encoding="utf-8")
    (root / "bad.toml").write_text("[train\nsteps = 3\n", encoding="utf-8")
    (root / "text.txt").write_text(corpus.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    ckpt = sorted((tiny_run / "checkpoints").iterdir())[-1]
    broken = root / "broken_run" / "checkpoints" / ckpt.name
    broken.mkdir(parents=True)
    for f in ckpt.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    model = broken / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])  # a truncated checkpoint
    novalid = root / "noval"
    novalid.mkdir()
    for name in ("train.bin", "meta.json", "tokenizer.json"):
        (novalid / name).write_bytes((dataset / name).read_bytes())
    (novalid / "val.bin").write_bytes(b"")
    item = '{"ctx": "The json module", "endings": ["encodes", "decodes"], "label": %s}\n'
    (root / "hs_empty.jsonl").write_text("\n", encoding="utf-8")
    (root / "hs_bad_line.jsonl").write_text(item % 0 + "{oops\n", encoding="utf-8")
    (root / "hs_no_endings.jsonl").write_text('{"ctx": "The json module", "label": 0}\n', encoding="utf-8")
    (root / "hs_label.jsonl").write_text(item % 2, encoding="utf-8")
    arc = '{"question": "Why?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}\n'
    (root / "arc_key.jsonl").write_text(arc, encoding="utf-8")
    return {"root": root, "data": dataset, "run": tiny_run, "tok": dataset / "tokenizer.json"}


def cases(w: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(program, argv) pairs, each a mistake a user makes."""
    r, d, run, tok = str(w["root"]), str(w["data"]), str(w["run"]), str(w["tok"])
    new = f"{r}/new_run"
    pre = ["pretrain", "--data", d, "--no-progress"]
    return [
        ("euler-bpe", ["train", "--vocab-size", "300", "--out", f"{r}/t.json", f"{r}/missing.txt"]),
        ("euler-bpe", ["train", "--vocab-size", "10", "--out", f"{r}/t.json", f"{r}/text.txt"]),
        ("euler-bpe", ["train", "--vocab-size", "many", "--out", f"{r}/t.json"]),
        ("euler-bpe", ["encode", "--tokenizer", f"{r}/missing.json", "--input", f"{r}/text.txt"]),
        ("euler-bpe", ["encode", "--tokenizer", f"{r}/broken.json", "--input", f"{r}/text.txt"]),
        ("euler-bpe", ["decode", "--tokenizer", tok, "--format", "u16", "--input", f"{r}/odd.bin"]),
        ("euler-bpe", ["decode", "--tokenizer", tok, "--input", f"{r}/ids.txt"]),
        ("euler-bpe", ["decode", "--tokenizer", tok, "--input", f"{r}/huge_ids.txt"]),
        ("euler-bpe", ["info", f"{r}/missing.json"]),
        ("euler-data", ["prepare", "--out", f"{r}/ds"]),
        ("euler-data", ["prepare", "--source", f"{r}/missing.txt", "--out", f"{r}/ds"]),
        ("euler-data", ["prepare", "--source", "gutenberg:abc", "--out", f"{r}/ds"]),
        ("euler-data", ["prepare", "--source", f"{r}/text.txt", "--vocab-size", "10", "--out", f"{r}/ds"]),
        (
            "euler-data",
            ["prepare", "--source", f"{r}/text.txt", "--tokenizer", f"{r}/broken.json", "--out", f"{r}/ds"],
        ),
        ("euler-data", ["prepare", "--source", f"{r}/text.txt", "--val-fraction", "2", "--out", f"{r}/ds"]),
        ("euler-data", ["prepare", "--source", f"{r}/text.txt", "--weight", "nope", "--out", f"{r}/ds"]),
        ("euler-data", ["inspect", f"{r}/missing"]),
        ("euler-data", ["sft", "--source", f"{r}/not_records.json", "--out", d]),
        ("euler-data", ["sft", "--source", f"{r}/not_records.json", "--out", f"{r}/no_tokenizer"]),
        ("euler-train", ["pretrain", "--data", f"{r}/missing", "--out", new]),
        ("euler-train", [*pre, "--out", new, "--steps", "0"]),
        ("euler-train", [*pre, "--out", new, "--set", "train.lr=fast"]),
        ("euler-train", [*pre, "--out", new, "--set", "model.nope=1"]),
        ("euler-train", [*pre, "--out", new, "--config", f"{r}/bad.toml"]),
        ("euler-train", [*pre, "--out", new, "--batch-size", "1000000"]),  # does not fit in memory
        ("euler-train", [*pre, "--out", new, "--set", "model.context=100000"]),  # longer than the data
        ("euler-train", ["pretrain", "--data", f"{r}/noval", "--out", new, "--no-progress"]),  # empty val
        ("euler-train", [*pre, "--out", run]),  # a finished run, neither --resume nor --overwrite
        ("euler-train", [*pre, "--out", run, "--resume", "--overwrite"]),
        ("euler-train", [*pre, "--out", new, "--precision", "bf16"]),
        ("euler-train", ["sft", "--data", d, "--out", new]),
        ("euler-train", ["sft", "--data", d, "--init", f"{r}/broken_run", "--out", new]),
        ("euler-train", ["generate", "--checkpoint", f"{r}/missing", "--prompt", "hi"]),
        ("euler-train", ["generate", "--checkpoint", f"{r}/broken_run", "--prompt", "hi"]),
        ("euler-train", ["generate", "--checkpoint", run, "--prompt", "hi", "--temperature", "-1"]),
        ("euler-train", ["generate", "--checkpoint", run, "--prompt", "hi", "--top-p", "0"]),
        ("euler-train", ["generate", "--checkpoint", run, "--prompt", "hi", "--max-new-tokens", "0"]),
        ("euler-train", ["generate", "--checkpoint", run, "--prompt", "hi", "--top-k", "-3"]),
        ("euler-train", ["chat", "--checkpoint", f"{r}/missing"]),
        ("euler-train", ["export-hf", "--checkpoint", f"{r}/broken_run", "--out", f"{r}/hf"]),
        ("euler-train", ["plot", f"{r}/missing_run"]),
        ("euler-train", ["plot", f"{r}/broken_run"]),
        ("euler-train", ["eval", "--checkpoint", run, "hellaswag", "--file", f"{r}/missing.jsonl"]),
        ("euler-train", ["eval", "--checkpoint", run, "hellaswag", "--file", f"{r}/hs_empty.jsonl"]),
        ("euler-train", ["eval", "--checkpoint", run, "hellaswag", "--file", f"{r}/hs_bad_line.jsonl"]),
        ("euler-train", ["eval", "--checkpoint", run, "hellaswag", "--file", f"{r}/hs_no_endings.jsonl"]),
        ("euler-train", ["eval", "--checkpoint", run, "hellaswag", "--file", f"{r}/hs_label.jsonl"]),
        ("euler-train", ["eval", "--checkpoint", run, "arc", "--file", f"{r}/arc_key.jsonl"]),
        ("euler-train", ["eval", "--checkpoint", run, "arc", "--file", f"{r}/hs_label.jsonl"]),  # not ARC
        (
            "euler-train",
            ["eval", "--checkpoint", run, "arc", "--file", f"{r}/arc_key.jsonl", "--max-items", "0"],
        ),
        ("euler-train", ["eval", "--checkpoint", run, "bpb"]),  # neither files nor --data
        ("euler-train", ["eval", "--checkpoint", run, "bpb", f"{r}/text.txt", "--data", d]),
        ("euler-train", ["eval", "--checkpoint", run, "bpb", f"{r}/missing.txt"]),
        ("euler-train", ["eval", "--checkpoint", run, "bpb", "--data", f"{r}/noval"]),  # empty val split
        ("euler-train", ["eval", "--checkpoint", run, "bpb", "--data", r]),  # no meta.json
        ("euler-train", ["eval", "--checkpoint", run, "chat", "--data", f"{r}/noval"]),  # no SFT set
        ("euler-train", ["eval", "--checkpoint", f"{r}/broken_run", "bpb", f"{r}/text.txt"]),
        ("euler-train", ["eval", "--checkpoint", f"{r}/missing", "bpb", f"{r}/text.txt"]),
        ("euler-train", ["eval", "--checkpoint", run, "bpb", f"{r}/text.txt", "--batch-size", "0"]),
        ("euler-train", ["eval", "--checkpoint", run]),  # no task
        ("euler-train", ["report", f"{r}/missing_run"]),
        ("euler-train", ["report", r]),  # not a run folder
    ]


def snapshot(*folders: Path) -> dict[str, tuple[int, str]]:
    """Every file and folder under `folders`: (size, sha256) of files, (-1, "") of folders."""
    out = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            out[str(p)] = (
                (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) if p.is_file() else (-1, "")
            )
    return out


def run_case(prog: str, argv: list[str]) -> str | None:
    """What is wrong with how `prog argv` failed, or None when it failed as it should."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", EULER_DATA_OFFLINE="1")
    cmd = [sys.executable, "-m", MODULES[prog], *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    problem = [] if proc.returncode == 2 else [f"rc {proc.returncode}"]
    if "Traceback" in proc.stderr or len(lines) != 1:
        problem.append(f"stderr {lines[-3:]!r}")
    return f"{prog} {' '.join(argv)}: {'; '.join(problem)}" if problem else None


def test_every_bad_input_is_one_line_exit_2_and_changes_nothing(work) -> None:
    folders = (work["root"], work["data"], work["run"])
    before = snapshot(*folders)
    with ThreadPoolExecutor(4) as pool:  # the children wait on their imports more than on the CPU
        failures = [f for f in pool.map(lambda case: run_case(*case), cases(work)) if f]
    changed = sorted({path for path, _ in set(before.items()) ^ set(snapshot(*folders).items())})
    assert not failures, "\n".join(failures)
    assert not changed, f"bad inputs changed files: {changed}"


def test_the_messages_say_what_to_do(work, cli) -> None:
    """Spot checks of the wording: numbers where a limit is hit, the flag that fixes it."""
    d, run, new = str(work["data"]), str(work["run"]), str(work["root"] / "new_run")
    err = cli("pretrain", "--data", d, "--out", run, "--no-progress").stderr
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err and "step" in err
    err = cli("pretrain", "--data", d, "--out", new, "--batch-size", "1000000", "--no-progress").stderr
    assert "GiB" in err and "train.batch_size" in err and "available" in err
    err = cli("pretrain", "--data", str(work["root"] / "noval"), "--out", new, "--no-progress").stderr
    assert "val split holds 0 tokens" in err and "--no-eval" in err
