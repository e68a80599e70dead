"""The command line of `euler-train eval --checkpoint RUN TASK ... [--json]` (no heavy imports here).

The options every task takes (--json, --device, --batch-size, --no-progress) are accepted before the
task's name and after it.
"""

from __future__ import annotations

import argparse
from typing import Any

TASKS = {
    "bpb": "bits per byte of text files, or of a dataset folder's val split (--data DIR)",
    "hellaswag": "HellaSwag multiple choice (official jsonl: ctx, endings, label): acc, acc_norm",
    "arc": "ARC multiple choice (jsonl: question, choices.text/label, answerKey): acc, acc_norm",
    "chat": "SFT held-out split: response bpb, stop rate at <|end|>, mean reply length",
}


def add_common(p: argparse.ArgumentParser, count: Any) -> None:
    """The shared options, without defaults (argparse.SUPPRESS), so either position sets them."""
    hide = argparse.SUPPRESS
    p.add_argument("--json", action="store_true", default=hide, help="print one JSON object")
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], default=hide, help="default: cpu")
    p.add_argument(
        "--batch-size", type=count, metavar="B", default=hide, help="sequences per forward pass (16)"
    )
    p.add_argument("--no-progress", action="store_true", default=hide, help="no progress bar")


def add_eval_args(p: argparse.ArgumentParser, epilog: str, count: Any) -> None:
    """`eval`'s options and one subcommand per task; `count` is the argparse type of a count (int >= 1)."""
    p.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint folder or run folder")
    add_common(p, count)
    tasks = p.add_subparsers(dest="task", required=True, metavar="TASK")
    parsers = {
        name: tasks.add_parser(name, help=text, description=text, epilog=epilog)
        for name, text in TASKS.items()
    }
    for task in parsers.values():
        add_common(task, count)
    parsers["bpb"].add_argument("files", nargs="*", metavar="FILE", help="text files (each one document)")
    parsers["bpb"].add_argument("--data", metavar="DIR", help="a dataset folder: its whole val split")
    for name in ("hellaswag", "arc"):
        parsers[name].add_argument("--file", required=True, metavar="JSONL", help="the task's items")
        parsers[name].add_argument("--max-items", type=count, metavar="N", help="the first N items only")
    chat = parsers["chat"]
    chat.add_argument(
        "--data", required=True, metavar="DIR", help="a folder with an SFT set (euler-data sft)"
    )
    chat.add_argument("--max-items", type=count, metavar="N", help="the first N held-out examples only")
    chat.add_argument(
        "--max-new-tokens",
        type=count,
        default=128,
        metavar="N",
        help="reply limit for the stop rate (128)",
    )


def common(args: argparse.Namespace) -> tuple[bool, str, int, bool]:
    """(json, device, batch_size, progress) with their defaults."""
    return (
        getattr(args, "json", False),
        getattr(args, "device", "cpu"),
        getattr(args, "batch_size", 16),
        not getattr(args, "no_progress", False),
    )
