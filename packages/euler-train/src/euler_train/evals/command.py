"""`euler-train eval --checkpoint RUN TASK ... [--json]`: score a checkpoint, print the result, and append
it to RUN/evals.jsonl when the checkpoint belongs to a run folder (`report` lists them).

The task's inputs are read and checked before the model is loaded: a malformed file is one line on stderr
and exit code 2, and nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from euler_bpe.progress import progress_stream
from euler_train.checkpoint import read_state
from euler_train.config import ConfigError
from euler_train.evals import bpb, chat, multiple_choice
from euler_train.evals.args import common
from euler_train.modelio import resolve_checkpoint
from euler_train.sampling import SamplingModel, load_for_sampling

EVALS = "evals.jsonl"


def read_inputs(args: argparse.Namespace) -> Any:
    """What the task scores, checked (ConfigError for a bad file) before any model is loaded."""
    if args.task == "bpb":
        if bool(args.files) == bool(args.data):
            raise ConfigError("bpb takes text files or --data DIR (a dataset folder), one of the two")
        if args.files:
            return bpb.read_files(args.files)
        bpb.check_split(args.data)
        return args.data
    if args.task in multiple_choice.READERS:
        return multiple_choice.read_items(args.file, args.task)[: args.max_items]
    chat.val_examples(args.data)
    return args.data


def score(model: SamplingModel, args: argparse.Namespace, inputs: Any, batch: int, bar: Any) -> dict:
    """The task's result (without the task, checkpoint and step)."""
    if args.task == "bpb" and args.files:
        return bpb.files_bpb(model, inputs, batch, bar.update)
    if args.task == "bpb":
        return bpb.split_bpb(model, inputs, batch, bar.update)
    if args.task == "chat":
        return chat.evaluate_chat(model, inputs, batch, args.max_items, args.max_new_tokens, bar.update)
    return {**multiple_choice.evaluate_multiple_choice(model, inputs, batch, bar.update), "file": args.file}


def run_folder(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint folder RUN/checkpoints/step_N belongs to, None for a loose checkpoint."""
    run = checkpoint.parent.parent
    return run if checkpoint.parent.name == "checkpoints" and (run / "config.toml").is_file() else None


def record(checkpoint: Path, result: dict[str, Any]) -> Path | None:
    """Append the result (and the time) to RUN/evals.jsonl; the file, or None for a loose checkpoint."""
    run = run_folder(checkpoint)
    if run is None:
        return None
    row = {**result, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with open(run / EVALS, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    return run / EVALS


def metrics_text(result: dict[str, Any]) -> str:
    """The numbers of a result in a few words, e.g. 'acc 0.2500, acc_norm 0.3000, n 40'."""
    if result["task"] == "bpb":
        return f"{result['bpb']:.4f} bits per byte over {result['tokens']:,} tokens"
    if result["task"] == "chat":
        return (
            f"response bpb {result['response_bpb']:.4f}, stop rate {result['stop_rate']:.3f}, mean reply "
            f"{result['mean_reply_tokens']:.1f} tokens (limit {result['max_new_tokens']}), n {result['n']}"
        )
    return f"acc {result['acc']:.4f}, acc_norm {result['acc_norm']:.4f}, n {result['n']}"


def summary(result: dict[str, Any]) -> str:
    """What `eval` prints without --json: the result in one line, then the chat samples."""
    lines = [f"{result['task']} (checkpoint step {result['step']}): {metrics_text(result)}"]
    for s in result.get("samples", []):
        stop = "stopped" if s["stopped"] else "no stop"
        lines += [f"--- prompt: {s['prompt']!r}", f"    reply ({stop}): {s['reply']!r}"]
    return "\n".join(lines)


def load(folder: Path, device: str) -> SamplingModel:
    try:
        return load_for_sampling(str(folder), device)
    except (RuntimeError, ValueError) as err:  # no GPU for --device gpu
        raise ConfigError(str(err)) from None


class LazyBar:
    """A tqdm bar that appears at its first update: a task that stops on bad input prints only its error."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.desc, self.enabled, self.bar = desc, enabled, None

    def update(self, n: int) -> None:
        if self.bar is None:
            self.bar = tqdm(unit="seq", desc=self.desc, disable=not self.enabled, file=progress_stream())
        self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_eval(args: argparse.Namespace) -> int:
    as_json, device, batch, show = common(args)
    inputs = read_inputs(args)
    folder = resolve_checkpoint(args.checkpoint)
    model = load(folder, device)
    bar = LazyBar(f"eval {args.task}", show)
    try:
        result = score(model, args, inputs, batch, bar)
    finally:
        bar.close()
    result = {"task": args.task, **result, "checkpoint": str(folder), "step": read_state(folder).get("step")}
    path = record(folder, result)
    print(json.dumps(result) if as_json else summary(result) + (f"\n(appended to {path})" if path else ""))
    sys.stdout.flush()
    return 0
