"""Fixtures for euler-train tests: small real-text datasets built with euler-data, and CLI runners.

The text is the standard library's own docstrings (real English prose, always present, no network), cut
into paragraphs; the SFT set pairs "What does NAME do?" with the first paragraph of NAME's docstring.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from euler_data.cli import main as euler_data

MODULES = [
    "argparse",
    "json",
    "pathlib",
    "collections",
    "functools",
    "itertools",
    "re",
    "string",
    "textwrap",
    "dataclasses",
    "logging",
    "subprocess",
    "threading",
    "unittest",
    "datetime",
    "decimal",
    "fractions",
    "statistics",
    "random",
    "heapq",
    "bisect",
    "shutil",
    "tempfile",
    "csv",
    "zipfile",
    "tarfile",
    "urllib.parse",
    "pydoc",
    "doctest",
    "calendar",
    "difflib",
    "enum",
    "contextlib",
]


def docstrings() -> list[tuple[str, str]]:
    """(qualified name, docstring) of the listed modules and their public classes and functions."""
    out, seen = [], set()
    for name in MODULES:
        module = importlib.import_module(name)
        members = [(name, module)] + [
            (f"{name}.{k}", v) for k, v in vars(module).items() if not k.startswith("_")
        ]
        for qual, obj in members:
            if obj is module or inspect.isfunction(obj) or inspect.isclass(obj):
                doc = inspect.getdoc(obj)
                if doc and len(doc) > 80 and doc not in seen:
                    seen.add(doc)
                    out.append((qual, doc))
    return out


def prepare(folder: Path, text_file: Path, vocab: int) -> Path:
    argv = [
        "prepare",
        "--source",
        f"{text_file}::paragraph",
        "--vocab-size",
        str(vocab),
        "--min-chars",
        "40",
        "--out",
        str(folder),
        "--quiet",
        "--workers",
        "1",
    ]
    assert euler_data(argv) == 0
    return folder


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "stdlib_docs.txt"
    path.write_text("\n\n".join(doc for _, doc in docstrings()), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def dataset(tmp_path_factory, corpus) -> Path:
    """A pretrain set (vocab 320) with an SFT set in the same folder."""
    folder = prepare(tmp_path_factory.mktemp("data") / "docs", corpus, 320)
    records = [
        {"instruction": f"What does {q} do?", "input": "", "output": d.split("\n\n")[0][:200]}
        for q, d in docstrings()
    ]
    src = folder.parent / "qa.json"
    src.write_text(json.dumps(records), encoding="utf-8")
    assert euler_data(["sft", "--source", str(src), "--out", str(folder), "--context", "96"]) == 0
    return folder


@pytest.fixture(scope="session")
def other_dataset(tmp_path_factory, corpus) -> Path:
    """The same text with a different tokenizer (vocab 300): a tokenizer mismatch for `dataset` runs."""
    return prepare(tmp_path_factory.mktemp("data") / "docs300", corpus, 300)


def _cli(*argv: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run `python -m euler_train.cli ARGV` in a subprocess; returns the completed process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "euler_train.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kw,
    )


@pytest.fixture(scope="session")
def cli():
    """`cli(*argv)`: run `python -m euler_train.cli ARGV` in a subprocess (CompletedProcess, text)."""
    return _cli


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, dataset) -> Path:
    """A finished 30-step tiny pretrain (context 64), shared by the sampling/export tests."""
    from euler_train.cli import main

    run = tmp_path_factory.mktemp("runs") / "tiny"
    argv = [
        "pretrain",
        "--data",
        str(dataset),
        "--out",
        str(run),
        "--steps",
        "30",
        "--eval-every",
        "10",
        "--ckpt-every",
        "10",
        "--no-progress",
        "--set",
        "model.context=64",
        "--set",
        "train.lr=1e-2",
    ]
    assert main(argv) == 0
    return run


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory, dataset, tiny_run) -> Path:
    """An SFT run from tiny_run on short answers, long enough that its greedy replies end with <|end|>
    (150 steps, about 10 s on 2 cores); its SFT set (train and held-out val split) is RUN/../docs."""
    root = tmp_path_factory.mktemp("chat")
    data = shutil.copytree(dataset, root / "docs")  # the same tokenizer as tiny_run, a new SFT set
    records = [
        {"instruction": f"What does {name} do?", "input": "", "output": " ".join(doc.split()[:4])}
        for name, doc in docstrings()
    ]
    (root / "qa.json").write_text(json.dumps(records), encoding="utf-8")
    sft_set = ["sft", "--source", str(root / "qa.json"), "--out", str(data), "--context", "64", "--overwrite"]
    assert euler_data(sft_set) == 0  # replaces the copied SFT set
    run = root / "sft"
    args = ["sft", "--data", str(data), "--init", str(tiny_run), "--out", str(run), "--steps", "150"]
    proc = _cli(*args, "--eval-every", "150", "--no-progress", "--set", "train.lr=1e-2")
    assert proc.returncode == 0, proc.stderr
    return run
