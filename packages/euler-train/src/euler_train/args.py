"""The `euler-train` command line: every subcommand's arguments and the exit codes (parsing only; the
work is commands.py's).

>>> build_parser().parse_args(["generate", "--checkpoint", "runs/x", "--prompt", "Hi"]).temperature
0.8
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from euler_bpe.cli_parser import OneLineParser
from euler_train.__about__ import __version__
from euler_train.config import PRESETS
from euler_train.evals.args import add_eval_args

DESCRIPTION = "pretrain, sft, dpo, chat, generate, check, export-hf, plot, eval, report, quickstart"
EXIT_CONFIG = 2
EXIT_CODES = (
    "exit codes: 0 done, 2 bad config/arguments/data/checkpoint, 3 non-finite loss, 4 another rank was lost, "
    "130/143 signal"
)

# plain flags -> config keys
TRAIN_FLAGS = {
    "data": "data.dir",
    "init": "data.init",
    "steps": "train.steps",
    "batch_size": "train.batch_size",
    "grad_accum": "train.grad_accum",
    "lr": "train.lr",
    "optimizer": "train.optimizer",
    "recompute": "train.recompute",
    "seed": "train.seed",
    "ckpt_every": "checkpoint.every",
    "eval_every": "eval.every",
    "device": "run.device",
    "precision": "run.precision",
    "gpus": "run.gpus",
    "beta": "train.dpo_beta",
    "sft_weight": "train.dpo_sft_weight",
}


def add_train_args(p: argparse.ArgumentParser, stage: str) -> None:
    """The arguments of a training stage: pretrain, sft (from --init) or dpo (from --init)."""
    held = {"sft": " (SFT set: euler-data sft)", "dpo": " (preference set: euler-data prefs)"}.get(stage, "")
    p.add_argument("--data", metavar="DIR", help="dataset folder made by euler-data" + held)
    if stage != "pretrain":
        p.add_argument(
            "--init", metavar="CHECKPOINT", help="pretrained checkpoint or run folder to start from"
        )
    p.add_argument("--out", metavar="RUN", required=True, help="run folder (config, metrics, checkpoints)")
    p.add_argument("--preset", choices=list(PRESETS), help="run preset (default: tiny)")
    p.add_argument("--config", metavar="TOML", help="a run config file applied over the preset")
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], help="auto: the GPU when CuPy sees one")
    p.add_argument(
        "--precision",
        choices=["fp32", "tf32", "bf16", "fp8"],
        help="GPU only: tf32 or bf16 matmuls (float32 storage); fp8: bf16 with the MLP and heads in FP8",
    )
    p.add_argument("--gpus", type=int, metavar="N", help="data-parallel processes, one per GPU (NCCL)")
    p.add_argument("--steps", type=int, metavar="N", help="optimizer steps")
    p.add_argument("--batch-size", type=int, metavar="B", help="sequences per micro-batch per GPU")
    p.add_argument("--grad-accum", type=int, metavar="K", help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, help="peak learning rate (warmup, then cosine to train.min_lr)")
    p.add_argument(
        "--optimizer", choices=["adamw", "muon"], help="muon: Muon for the block matrices (train.muon_lr)"
    )
    p.add_argument(
        "--recompute",
        action="store_true",
        default=None,
        help="re-run each layer's forward in the backward instead of keeping its activations (less memory)",
    )
    p.add_argument("--ckpt-every", type=int, metavar="K", help="checkpoint every K steps (and at the end)")
    p.add_argument("--eval-every", type=int, metavar="K", help="val loss / bits per byte every K steps")
    p.add_argument("--seed", type=int, metavar="S", help="weights and batches are functions of (seed, step)")
    p.add_argument("--resume", action="store_true", help="continue from the newest valid checkpoint in RUN")
    p.add_argument(
        "--overwrite", action="store_true", help="RUN already holds a run: delete it and start again"
    )
    p.add_argument("--no-eval", action="store_true", help="never evaluate (eval.enabled = false)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.lr=3e-4"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parents(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated ints (a draft tree's parents), else a one-line error."""
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None


def number(kind: type, low: float, high: float = math.inf, low_open: bool = False) -> Any:
    """An argparse type: `kind` in [low, high] ((low, high] when low_open), else a one-line error."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not (low < value if low_open else low <= value) or value > high or value != value:
            bounds = f"{'(' if low_open else '['}{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be in {bounds}, got {text}")
        return value

    return parse


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint folder or run folder")
    p.add_argument("--max-new-tokens", type=number(int, 1), default=200)
    p.add_argument("--temperature", type=number(float, 0.0), default=0.8, help="0: greedy")
    p.add_argument("--top-k", type=number(int, 0), default=50, help="0: no top-k cut")
    p.add_argument("--top-p", type=number(float, 0.0, 1.0, low_open=True), default=0.95)
    p.add_argument("--repetition-penalty", type=number(float, 0.0, low_open=True), default=1.0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="euler-train", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"euler-train {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, epilog=EXIT_CODES)

    add_train_args(add("pretrain", "pretrain a model on a dataset folder"), "pretrain")
    add_train_args(add("sft", "fine-tune a checkpoint on an SFT set (loss on responses)"), "sft")
    dpo = add("dpo", "preference-tune an SFT checkpoint on a preference set (DPO)")
    add_train_args(dpo, "dpo")
    dpo.add_argument("--beta", type=float, help="the DPO loss's beta (default 0.1: train.dpo_beta)")
    dpo.add_argument(
        "--sft-weight",
        type=float,
        help="add this times the chosen replies' NLL per token to the DPO loss, keeping them likely "
        "(default 0: DPO alone; train.dpo_sft_weight)",
    )
    chat = add(
        "chat",
        "chat REPL: /reset, /temp X, /quit; Ctrl-C stops a reply (at the prompt it ends the chat: exit 130), "
        "Ctrl-D ends it (exit 0)",
    )
    add_sampling_args(chat)
    gen = add("generate", "sample a continuation of one prompt, or of each prompt of a --batch-file")
    add_sampling_args(gen)
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help='"" samples a new document from its start')
    source.add_argument(
        "--batch-file",
        metavar="FILE",
        help='one prompt per line (FILE.jsonl: one {"prompt": ...} per line); one JSON line out per prompt',
    )
    gen.add_argument(
        "--batch-size", type=number(int, 1), default=32, metavar="B", help="--batch-file: prompts per batch"
    )
    gen.add_argument(
        "--speculative", action="store_true", help="draft with the MTP heads, verify with head 0"
    )
    gen.add_argument(
        "--draft-tree",
        type=parents,
        metavar="P,P,..",
        help="--speculative --batch-file: each draft's parent (0 the last token, i draft i): 0,1 a chain of "
        "two drafts; 0,1,0 head 1's two best guesses, head 2's after the first (default 0: one draft)",
    )
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    pairs = add(
        "make-pairs",
        "preference pairs for dpo from an SFT source: its reference reply chosen over the model's own sample",
    )
    add_sampling_args(pairs)
    pairs.add_argument(
        "--source", required=True, nargs="+", metavar="SPEC", help="as euler-data sft's: alpaca, or a file"
    )
    pairs.add_argument("--mirror", metavar="DIR", help="offline copies of named sources (EULER_DATA_MIRROR)")
    pairs.add_argument("--out", required=True, metavar="FILE", help="the JSON-lines file to write")
    pairs.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    pairs.add_argument("--limit", type=number(int, 1), metavar="N", help="the first N conversations only")
    pairs.add_argument(
        "--batch-size", type=number(int, 1), default=32, metavar="B", help="conversations sampled together"
    )
    serve = add("serve", "an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)")
    serve.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint folder or run folder")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: this machine only)"
    )
    serve.add_argument("--port", type=number(int, 1, 65535), default=8000)
    serve.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu")
    serve.add_argument(
        "--max-batch", type=number(int, 1, 128), default=16, metavar="N", help="requests decoded together"
    )
    serve.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every /v1 request")
    serve.add_argument(
        "--speculative", action="store_true", help="the MTP heads draft, each step verifies: the same tokens"
    )
    serve.add_argument(
        "--max-tokens", type=number(int, 1), metavar="N", help="a request's max_tokens at most"
    )
    serve.add_argument(
        "--max-body-bytes", type=number(int, 1), default=1 << 20, metavar="N", help="largest request body"
    )
    check = add("check", "gradient check of every op and of the whole model (float64)")
    check.add_argument("--quick", action="store_true", help="fewer cases")
    exp = add("export-hf", "write a Hugging Face LlamaForCausalLM folder")
    exp.add_argument("--checkpoint", required=True, metavar="PATH", help="checkpoint folder or run folder")
    exp.add_argument("--out", required=True, metavar="DIR", help="a new or empty folder (or --overwrite)")
    exp.add_argument(
        "--overwrite",
        action="store_true",
        help="DIR holds an earlier export: replace it (your other files stay; never a dataset or run folder)",
    )
    plot = add("plot", "metrics.jsonl -> PNG of train and val loss; several runs: overlaid and compared")
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run folder or metrics.jsonl (one or more)")
    plot.add_argument("--labels", metavar="A,B,...", help="names of the runs (default: folder names)")
    plot.add_argument("--title", help="plot title")
    plot.add_argument("--out", metavar="PNG", help="default: RUN/loss.png, or FIRST_RUN/compare.png")
    add_eval_args(
        add("eval", "score a checkpoint: bpb, hellaswag, arc, chat (--json: one object)"),
        EXIT_CODES,
        number(int, 1),
    )
    report = add("report", "write RUN/report.md: config, data, throughput, loss, evals, samples")
    report.add_argument("run", metavar="RUN", help="run folder")
    report.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu", help="for the samples")
    quick = add("quickstart", "data -> tokenizer -> small pretrain on CPU -> samples")
    quick.add_argument("--out", default="runs/quickstart", metavar="DIR")
    quick.add_argument(
        "--mirror", metavar="DIR", help="local data mirror (default: $EULER_DATA_MIRROR, else download)"
    )
    quick.add_argument("--steps", type=int, default=None, help="pretrain steps (default: the small preset's)")
    quick.add_argument("--preset", choices=["tiny", "small"], default="small")
    return parser
