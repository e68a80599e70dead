"""End to end on the CPU with the real-data mirror, through the installed console scripts:

Tiny Shakespeare -> euler-data prepare (BPE, vocab 512) -> euler-train pretrain (tiny, a few dozen
steps; loss falls) -> euler-data sft (Alpaca sample) -> euler-train sft -> chat fed by stdin -> generate
-> export-hf (loads in transformers' LlamaForCausalLM)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.data, pytest.mark.slow]


def tool(name: str) -> str:
    """The console script installed beside this interpreter (falls back to PATH)."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name) or name


def run(
    *argv: str, stdin: str | None = None, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    env = env or dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [tool(argv[0]), *argv[1:]], input=stdin, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0, f"{argv} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_data_to_chat_on_the_cpu(tmp_path, mirror) -> None:
    data, pre, sft, hf = tmp_path / "data", tmp_path / "pre", tmp_path / "sft", tmp_path / "hf"
    run(
        "euler-data",
        "prepare",
        "--source",
        "tinyshakespeare",
        "--mirror",
        str(mirror),
        "--vocab-size",
        "512",
        "--out",
        str(data),
        "--quiet",
    )
    run(
        "euler-train",
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(pre),
        "--preset",
        "tiny",
        "--steps",
        "60",
        "--eval-every",
        "20",
        "--ckpt-every",
        "20",
        "--no-progress",
        "--set",
        "model.context=128",
        "--set",
        "train.lr=1e-2",
    )
    pre_losses = losses(pre)
    assert np.mean(pre_losses[-10:]) < np.mean(pre_losses[:10]) - 0.5, pre_losses
    assert (pre / "loss.png").is_file() and (pre / "config.toml").is_file()

    run(
        "euler-data",
        "sft",
        "--source",
        "alpaca",
        "--mirror",
        str(mirror),
        "--out",
        str(data),
        "--context",
        "512",
    )
    run(
        "euler-train",
        "sft",
        "--data",
        str(data),
        "--init",
        str(pre),
        "--out",
        str(sft),
        "--steps",
        "30",
        "--eval-every",
        "30",
        "--no-progress",
        "--set",
        "train.lr=3e-3",
    )
    sft_losses = losses(sft)
    assert np.mean(sft_losses[-5:]) < np.mean(sft_losses[:5]), sft_losses

    chat = run(
        "euler-train",
        "chat",
        "--checkpoint",
        str(sft),
        "--max-new-tokens",
        "24",
        "--seed",
        "0",
        stdin="Give three tips for staying healthy.\n/temp 0.3\nWhat is the capital of France?\n",
    )
    assert chat.stdout.count("assistant> ") == 2 and "<|end|>" not in chat.stdout
    answers = [line.split("assistant> ", 1)[1] for line in chat.stdout.splitlines() if "assistant> " in line]
    assert any(a.strip() for a in answers), chat.stdout

    gen = run(
        "euler-train",
        "generate",
        "--checkpoint",
        str(pre),
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        "40",
        "--seed",
        "1",
    )
    assert len(gen.stdout.strip()) > 0

    run("euler-train", "export-hf", "--checkpoint", str(sft), "--out", str(hf))
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(str(hf))
    assert model.config.vocab_size == 512 and model.config.max_position_embeddings == 128


def test_quickstart_prepares_trains_and_prints_samples(tmp_path, mirror) -> None:
    args = ("euler-train", "quickstart", "--out", str(tmp_path / "qs"), "--mirror", str(mirror))
    args += ("--preset", "tiny", "--steps", "12")
    proc = run(*args)
    assert proc.stdout.count("--- sample") == 3 and "ROMEO:" in proc.stdout
    assert (tmp_path / "qs" / "run" / "checkpoints" / "step_12").is_dir()
    again = run(*args)  # the same command: the dataset is reused
    assert "reusing the dataset" in again.stdout and again.stdout.count("--- sample") == 3
