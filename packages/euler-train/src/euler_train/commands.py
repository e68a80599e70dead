"""The subcommands behind cli.py: `dispatch` runs one parsed command, `guard` turns the errors a user's
input causes into one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import euler_model
from euler_bpe import Tokenizer
from euler_data import CHAT_TEMPLATE, DataError, FolderBusy, FolderUnwritable, hold_folder
from euler_train.args import EXIT_CONFIG
from euler_train.batch_generate import check_batch_args, write_batch_generation
from euler_train.chat import chat_repl
from euler_train.check import run_check as check
from euler_train.checkpoint import CheckpointError, read_state
from euler_train.comm import EXIT_LOST_RANK, CommError
from euler_train.config import (
    ConfigError,
    cpu_world,
)
from euler_train.device import note_old_switches, setup_device
from euler_train.distributed import env_world, holds_run_lock, init_comm, spawn, spawned
from euler_train.evals.command import run_eval as evaluate
from euler_train.make_pairs import run_make_pairs
from euler_train.memory_check import check_memory
from euler_train.modelio import TOKENIZER, check_export_folder, load_model, write_export
from euler_train.plot import compare_text, metrics_path, plot_metrics, plot_runs, read_runs
from euler_train.report import write_report
from euler_train.runspec import plan_from_args
from euler_train.sampling import (
    ASSISTANT,
    END,
    EOT,
    USER,
    load_for_sampling,
    note_if_not_tuned,
    write_generation,
)
from euler_train.signals import StopFlag
from euler_train.trainer import EXIT_NONFINITE, NonFiniteError, Trainer


def run_training(args: argparse.Namespace, argv: list[str]) -> int:
    """pretrain / sft: hold the run folder (one writer at a time), validate everything, then train
    (spawning one process per GPU when asked)."""
    rank, world, local = env_world()
    lock = hold_folder(args.out, f"euler-train {args.command}") if holds_run_lock(rank) else nullcontext()
    with lock:
        # planned before spawning too: a bad plan is one line and exit 2 from the launcher, not N workers'
        spec = plan_from_args(args, world)
        if spec.cfg.run.gpus > 1 and world == 1:
            return spawn(spec.cfg.run.gpus, argv)
        if args.resume and rank == 0:
            say_resumed(spec)
        return _train(spec, local)


def say_resumed(spec: Any) -> None:
    """A --resume's line when there is nothing to resume, and one for its changes to the recorded config."""
    if spec.resume_from is None:
        print(
            f"euler-train: --resume: no checkpoint in {spec.run_dir} yet; starting from step 0",
            file=sys.stderr,
        )
    if spec.changes:
        listed = ", ".join(f"{c['key']} {c['was']!r} -> {c['now']!r}" for c in spec.changes)
        print(
            f"euler-train: --resume changes the run's config at step {spec.changes[0]['step']}: {listed} "
            "(recorded in config.toml's [[history]] and the report)",
            file=sys.stderr,
        )


def _train(spec: Any, local_rank: int) -> int:
    try:
        device = setup_device(spec.cfg.run, local_rank)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    if spec.cfg.run.gpus > 1 and device.kind != "gpu" and not cpu_world():
        raise ConfigError("run.gpus > 1 needs GPUs (NCCL); this process resolved to the CPU")
    check_memory(spec.cfg, spec.mcfg, device, processes=spec.cfg.run.gpus)
    comm = init_comm(spec.cfg.run.gpus, spec.run_dir)
    stop = StopFlag()
    try:
        trainer = Trainer(spec, device, comm)
        trainer.setup()
        with stop.installed():
            return trainer.run(stop)
    except NonFiniteError as err:
        print(f"euler-train {spec.mode}: error: {err}", file=sys.stderr)
        return EXIT_NONFINITE
    except CommError as err:  # another rank died or fell silent: stop, not hang
        print(f"euler-train {spec.mode}: error: {err}", file=sys.stderr)
        return EXIT_LOST_RANK
    finally:
        comm.close()


def run_chat(args: argparse.Namespace) -> int:
    model = load_for_sampling(args.checkpoint, args.device)
    note_if_not_tuned(model)
    return chat_repl(model, args, sys.stdin, sys.stdout)


def run_generate(args: argparse.Namespace) -> int:
    if args.batch_file is None and args.draft_tree is not None:
        raise ConfigError("--draft-tree applies to --batch-file (one --prompt drafts a chain, on the host)")
    prompts = None if args.batch_file is None else check_batch_args(args)  # a bad file: before the load
    model = load_for_sampling(args.checkpoint, args.device)
    if args.chat:
        note_if_not_tuned(model)
    if prompts is None:
        write_generation(model, args, sys.stdout)
    else:
        write_batch_generation(model, args, prompts, sys.stdout)
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from euler_train.serve import run_serve as serve  # the HTTP stack only for this command

    return serve(args)


def run_check(args: argparse.Namespace) -> int:
    return check(quick=args.quick)


def run_export_hf(args: argparse.Namespace) -> int:
    """A LlamaForCausalLM folder with the tokenizer, euler-data's chat template and the stop tokens, written
    under the folder's lock into a new or empty folder, or over an earlier export with --overwrite.

    An SFT checkpoint stops `generate` at <|end|> or <|endoftext|> (eos_token <|end|>, as `chat` does); a
    pretrained one at <|endoftext|>. The pad token is <|endoftext|>.
    """
    with hold_folder(args.out, "euler-train export-hf") as out:
        check_export_folder(out, args.overwrite)  # before the model is loaded: a refusal costs nothing
        mcfg, params, _, folder = load_model(args.checkpoint)
        tok, meta = None, {}
        if (folder / TOKENIZER).is_file():
            tok = Tokenizer.load(folder / TOKENIZER)
            names = tok.special_tokens
            stops = (END, EOT) if read_state(folder).get("mode") == "sft" else (EOT,)
            meta = {
                "eos_tokens": [n for n in stops if n in names],
                "pad_token": EOT if EOT in names else None,
                "chat_template": CHAT_TEMPLATE if {USER, ASSISTANT, END} <= names.keys() else None,
            }
        write_export(out, lambda tmp: euler_model.save_hf(mcfg, params, tmp, tokenizer=tok, **meta))
    print(f"euler-train export-hf: {folder} -> {args.out}")
    return 0


def run_plot(args: argparse.Namespace) -> int:
    """One run: its loss.png. Several: train loss and val bpb overlaid, and their final values compared."""
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    try:
        first = metrics_path(args.runs[0])
        if len(args.runs) == 1 and labels is None:
            print(plot_metrics(first, Path(args.out) if args.out else first.parent / "loss.png", args.title))
            return 0
        out = Path(args.out) if args.out else first.parent / "compare.png"
        print(compare_text(read_runs(args.runs, labels)))
        print(plot_runs(args.runs, out, labels, args.title))
    except ValueError as err:
        print(f"euler-train plot: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def run_eval(args: argparse.Namespace) -> int:
    return evaluate(args)


def run_report(args: argparse.Namespace) -> int:
    print(f"euler-train report: wrote {write_report(Path(args.run), args.device)}")
    return 0


COMMANDS = {
    "chat": run_chat,
    "generate": run_generate,
    "check": run_check,
    "export-hf": run_export_hf,
    "plot": run_plot,
    "eval": run_eval,
    "report": run_report,
    "serve": run_serve,
    "make-pairs": run_make_pairs,
}


def dispatch(args: argparse.Namespace, argv: list[str]) -> int:
    """Run one parsed command (argv: the command line, which --gpus N hands to its processes)."""
    if not spawned():  # a --gpus worker's launcher said it already
        note_old_switches()
    if args.command in ("pretrain", "sft", "dpo"):
        return run_training(args, argv)
    return COMMANDS[args.command](args)


def guard(command: str, run: Callable[[], int]) -> int:
    """run(), with an error caused by the user's input (config, arguments, data, checkpoint) or environment
    (a folder another process writes, one that cannot be written, the disk full) printed as one line and
    exit code 2 instead of a traceback."""
    try:
        return run()
    except (
        ConfigError,
        CheckpointError,
        DataError,
        NotImplementedError,
        FolderBusy,
        FolderUnwritable,
    ) as err:
        print(f"euler-train {command}: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
