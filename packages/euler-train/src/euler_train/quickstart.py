"""`euler-train quickstart`: Tiny Shakespeare -> BPE tokenizer -> `small` pretrain on CPU -> samples.

Uses the data mirror when one is given (--mirror or $EULER_DATA_MIRROR), else euler-data downloads the
source, else (offline) the copy of Tiny Shakespeare shipped in euler-data. Re-running reuses the prepared
data and resumes (or re-samples) the run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from euler_data.cli import main as euler_data
from euler_train.args import build_parser
from euler_train.commands import dispatch
from euler_train.sampling import generate_text, load_for_sampling

PROMPTS = ("ROMEO:", "First Citizen:\nWhat", "KING HENRY:\nMy lord,")
QUICK_STEPS = {"tiny": 60, "small": 400}  # 1-5 minutes on two CPU cores, depending on load


def prepare_data(folder: Path, mirror: str | None) -> None:
    """euler-data prepare (skipped when the folder already holds train.bin)."""
    if (folder / "train.bin").is_file():
        print(f"quickstart: reusing the dataset in {folder}")
        return
    argv = ["prepare", "--source", "tinyshakespeare", "--vocab-size", "512", "--out", str(folder)]
    argv += ["--mirror", mirror] if mirror else []
    print("quickstart: preparing Tiny Shakespeare and training a 512-token BPE tokenizer ...")
    if euler_data(argv) != 0:
        raise SystemExit("quickstart: euler-data prepare failed (see above)")


def print_samples(run: Path, seed: int = 0) -> None:
    """A few sampled continuations from the newest checkpoint of `run`."""
    model = load_for_sampling(str(run))
    args = argparse.Namespace(
        max_new_tokens=96, temperature=0.8, top_k=40, top_p=0.95, repetition_penalty=1.1, seed=seed
    )
    for i, prompt in enumerate(PROMPTS):
        args.seed = seed + i
        text = "".join(generate_text(model, args, prompt))
        print(f"\n--- sample {i + 1} ---\n{prompt}{text}")


def quickstart(args: argparse.Namespace) -> int:
    """Data, tokenizer, pretrain, samples; returns the pretrain's exit code on failure."""
    out = Path(args.out)
    data, run = out / "data", out / "run"
    prepare_data(data, args.mirror)
    steps = args.steps or QUICK_STEPS[args.preset]
    every = str(max(1, steps // 3))
    argv = [
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(run),
        "--preset",
        args.preset,
        "--steps",
        str(steps),
        "--eval-every",
        every,
        "--ckpt-every",
        every,
        "--resume",
    ]
    print(f"quickstart: pretraining the {args.preset} model for {steps} steps on the CPU ...")
    code = dispatch(build_parser().parse_args(argv), argv)  # cli.main's guard covers the quick start
    if code != 0:
        return code
    print_samples(run)
    print(
        f"\nquickstart: done. Loss curve: {run / 'loss.png'}; chat: euler-train chat --checkpoint {run}",
        file=sys.stderr,
    )
    return 0
