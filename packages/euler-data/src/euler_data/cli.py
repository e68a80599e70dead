"""The ``euler-data`` command: ``prepare``, ``inspect``, ``sft`` and ``prefs``.

euler-data prepare --source gutenberg:1342,84 --source web/c4.jsonl --out data/mix --vocab-size 4096
euler-data inspect data/mix
euler-data sft --source alpaca --out data/mix --mirror /path/to/mirror
euler-data prefs --source hh-rlhf --out data/mix --mirror /path/to/mirror

Exit codes: 0 done, 2 bad input (one line on stderr; the folder's dataset stays as it was), 130 Ctrl-C.
``prepare``, ``sft`` and ``prefs`` hold their --out folder's lock (one writer per folder); ``inspect``
reads only.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb

from euler_bpe import vocab_note
from euler_bpe.cli_parser import OneLineParser
from euler_data.__about__ import __version__
from euler_data.dataset_folder import PREFS_META, SFT_META, check_out
from euler_data.errors import DataError
from euler_data.filters import FIXES
from euler_data.folder_lock import FolderBusy, FolderUnwritable, hold_folder, unwritable
from euler_data.meta import META_NAME, read_meta
from euler_data.pipeline import prepare
from euler_data.prefs import LOUD_SHARE as PREFS_LOUD_SHARE
from euler_data.prefs import build_prefs
from euler_data.recipe import BYTE_TOKENIZER, SPLIT_MODES, Recipe, SourceSpec, check_vocab_size, load_recipe
from euler_data.report import inspect_folder
from euler_data.sft import build_sft, check_sft_options, source_paths
from euler_data.tokenizer import load_tokenizer

LOUD_SHARE = 0.25  # a filter dropping more of a source's documents than this is a warning
# a writing command -> (the file that says its set is whole, what the set is called, how to go on)
RECORDS = {
    "prepare": (META_NAME, "dataset", "the same command continues where this one stopped"),
    "sft": (SFT_META, "SFT set", "run the same command again"),
    "prefs": (PREFS_META, "preference set", "run the same command again"),
}
# the Ctrl-Cs this process got: a library may turn the KeyboardInterrupt into its own error (DuckDB
# raises "Query interrupted"), so the handler records them
INTERRUPTS: list[int] = []


class Interrupted(Exception):
    """Ctrl-C during a writing command; the message says what its folder holds now."""


def source_from_cli(spec: str) -> SourceSpec:
    """``[NAME=]SPEC[::MODE]``: an optional source name, and how a text file is cut into documents.

    >>> s = source_from_cli("wiki=data/wiki.txt::line")
    >>> (s.name, s.spec, s.docs)
    ('wiki', 'data/wiki.txt', 'line')
    """
    name, sep, rest = spec.partition("=")
    if not (sep and re.fullmatch(r"[\w.-]+", name) and not Path(name).exists()):
        name, rest = "", spec
    path, sep, mode = rest.rpartition("::")
    if sep and mode in SPLIT_MODES:
        return SourceSpec(path, name=name, docs=mode)
    return SourceSpec(rest, name=name)


def _weights(pairs: list[str]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise DataError("--weight", f"expected NAME=WEIGHT, got {pair!r}")
    return out


def recipe_from_args(args: argparse.Namespace) -> Recipe:
    """The recipe file (if any) with the flags given on top of it."""
    recipe = load_recipe(args.recipe) if args.recipe else Recipe()
    check_vocab_size(args.tokenizer or recipe.tokenizer, args.vocab_size, "--vocab-size")
    sources = list(recipe.sources) + [source_from_cli(s) for s in args.source]
    weights = _weights(args.weight)
    sources = [dataclasses.replace(s, weight=weights.pop(s.label, s.weight)) for s in sources]
    if weights:
        raise DataError(
            "--weight", f"no source named {sorted(weights)}; sources: {[s.label for s in sources]}"
        )
    flags = {
        "vocab_size": args.vocab_size,
        "tokenizer": args.tokenizer,
        "val_fraction": args.val_fraction,
        "seed": args.seed,
        "context_hint": args.context,
        "workers": args.workers,
        "shard_tokens": args.shard_tokens,
    }
    changes = {k: v for k, v in flags.items() if v is not None}
    filters = {"min_chars": args.min_chars, "minhash_threshold": args.minhash}
    filters = {k: v for k, v in filters.items() if v is not None}
    if filters:
        changes["filter"] = dataclasses.replace(recipe.filter, **filters)
    return dataclasses.replace(recipe, sources=tuple(sources), **changes)


def _while_writing(err: OSError, out: Path) -> bool:
    """Whether an OSError is one of writing ``out``: about a file there, or a full disk (whose message
    may name no file; every file a writer writes is in ``out``)."""
    if err.filename:
        return Path(err.filename).resolve().is_relative_to(out.resolve())
    return err.errno in (errno.ENOSPC, errno.EDQUOT)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


@contextlib.contextmanager
def writing(out: Path, command: str, overwrite: bool) -> Iterator[None]:
    """Hold ``out`` for ``command`` (one writer per folder), refuse a folder that is not euler-data's,
    and say what ``out`` holds when a Ctrl-C stops the command or a write fails."""
    record, what, go_on = RECORDS[command]
    with hold_folder(out, f"euler-data {command}"):
        check_out(out, command, overwrite)
        before = _read(out / record)
        try:
            yield
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt) or INTERRUPTS:
                now = _read(out / record)
                if now != before:
                    raise Interrupted(f"interrupted after the new {what} was written to {out}") from None
                held = f"keeps its previous {what}" if before is not None else f"holds no {what}"
                raise Interrupted(f"interrupted; {out} {held} ({go_on})") from None
            if isinstance(err, OSError) and _while_writing(err, out):
                raise unwritable(out, err) from None
            raise


def cmd_prepare(args: argparse.Namespace) -> None:
    recipe = recipe_from_args(args)
    with writing(Path(args.out), "prepare", args.overwrite):
        meta = prepare(
            recipe, args.out, mirror=args.mirror, quiet=args.quiet, keep_intermediate=args.keep_intermediate
        )
    for line in prepare_notes(recipe, meta):
        print(f"euler-data prepare: {line}", file=sys.stderr)
    print(
        f"wrote {args.out}: {meta['documents_kept']}/{meta['documents_in']} documents kept, "
        f"tokens train={meta['tokens']['train']} val={meta['tokens']['val']}, dropped {meta['dropped']}"
    )


def prepare_notes(recipe: Recipe, meta: dict) -> list[str]:
    """What a finished prepare should say besides its counts: empty splits, a smaller vocabulary than
    asked, files no reader took, and filters that dropped much of a source."""
    lines = []
    fixes = {
        "train": "add sources",
        "val": "raise --val-fraction or add documents, or pretrain with --no-eval",
    }
    for split, fix in fixes.items():
        if not meta["tokens"][split]:
            lines.append(
                f"warning: the {split} split is empty ({meta['documents_kept']} documents kept); {fix}"
            )
    note = vocab_note(recipe.vocab_size, meta["vocab_size"]) if recipe.tokenizer is None else None
    lines += [f"note: {note}"] if note else []
    for name, source in meta["sources"].items():
        n_in, dropped = source["documents_in"], source["dropped"]
        if dropped.get("unknown_extension"):
            n = dropped["unknown_extension"]
            lines.append(
                f"note: skipped {n} file{'s' if n > 1 else ''} of {source['spec']} of a type no reader takes "
                f"(meta.json counts {'them' if n > 1 else 'it'} as dropped: unknown_extension); "
                f"--source {source['spec']}::raw --tokenizer bytes reads every file's bytes"
            )
        for reason, (field, flag) in FIXES.items():
            n = dropped.get(reason, 0)
            if n > LOUD_SHARE * n_in:
                bar = f" ({field} is {meta['recipe']['filter'][field]})" if field else ""
                lines.append(
                    f"warning: the {reason} filter dropped {n} of {n_in} documents ({100 * n / n_in:.0f}%) "
                    f"of source {name!r}{bar}; {flag} changes it"
                )
    return lines


def cmd_inspect(args: argparse.Namespace) -> None:
    print(inspect_folder(args.folder, samples=args.samples))


def sft_context(out: Path) -> int:
    """The context the folder's pretraining data was prepared for (meta.json), else the recipe default."""
    hint = read_meta(out).get("context_hint") if (out / "meta.json").is_file() else None
    return int(hint) if isinstance(hint, int) and hint > 0 else Recipe().context_hint


def build_side_set(args: argparse.Namespace, command: str, build: Callable[..., dict]) -> tuple:
    """(out, meta, context) of an ``sft`` or ``prefs`` command: --out held for it, its tokenizer (or
    --tokenizer), the sources resolved (the mirror, else downloaded into OUT/downloads), the set built."""
    out = Path(args.out)
    check_sft_options(args.context, args.val_fraction)
    with writing(out, command, args.overwrite):
        tok_path = args.tokenizer or out / "tokenizer.json"
        if tok_path != BYTE_TOKENIZER and not Path(tok_path).is_file():
            raise DataError(
                str(tok_path), "no tokenizer: pass --tokenizer FILE|bytes or run `prepare` into --out first"
            )
        tok = load_tokenizer(tok_path)
        paths = source_paths(args.source, args.mirror, out / "downloads")
        context = args.context if args.context is not None else sft_context(out)
        meta = build(paths, out, tok, context=context, val_fraction=args.val_fraction, seed=args.seed)
    return out, meta, context


def cmd_sft(args: argparse.Namespace) -> None:
    out, meta, context = build_side_set(args, "sft", build_sft)
    too_long = meta["dropped"].get("too_long", 0)
    if too_long:
        share = 100 * too_long / max(meta["examples_in"], 1)
        print(
            f"euler-data sft: warning: dropped {too_long} of {meta['examples_in']} examples ({share:.0f}%) "
            f"longer than the context of {context} tokens; --context N keeps more (the longest has "
            f"{meta['longest_tokens']})",
            file=sys.stderr,
        )
    print(
        f"wrote {out}: {meta['examples_kept']}/{meta['examples_in']} examples kept, dropped {meta['dropped']}"
    )


def cmd_prefs(args: argparse.Namespace) -> None:
    out, meta, _ = build_side_set(args, "prefs", build_prefs)
    n_in, dropped = meta["pairs_in"], meta["dropped"]
    if sum(dropped.values()) > PREFS_LOUD_SHARE * n_in:
        biggest = max(dropped, key=dropped.get)
        fix = (
            f"; --context N keeps more (the longest has {meta['longest_tokens']})"
            if biggest == "too_long"
            else ""
        )
        print(
            f"euler-data prefs: warning: dropped {sum(dropped.values())} of {n_in} pairs "
            f"({100 * sum(dropped.values()) / n_in:.0f}%), most as {biggest} ({dropped[biggest]}){fix}",
            file=sys.stderr,
        )
    split = ", ".join(f"{s} {meta[s]['pairs']}" for s in ("train", "val"))
    print(f"wrote {out}: {meta['pairs_kept']}/{n_in} pairs kept ({split}), dropped {dropped}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="euler-data", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"euler-data {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="sources -> clean -> filter -> dedup -> split -> mix -> token shards")
    p.add_argument("--source", action="append", default=[], help="[NAME=]SPEC: file/folder "
                   "(PATH::line|paragraph|eot|raw) or gutenberg:ID,..., fineweb-edu[:ROWS], alpaca, "
                   "tinyshakespeare")  # fmt: skip
    p.add_argument("--recipe", help="a .toml or .json recipe (flags override it)")
    p.add_argument("--out", required=True, help="dataset folder to write")
    p.add_argument("--vocab-size", type=int, help="train a tokenizer of this many tokens (default 4096)")
    p.add_argument("--tokenizer", help="FILE: use this tokenizer.json instead of training one; bytes: "
                   "the byte tokenizer (ids 0-255 are the bytes, then the special tokens)")  # fmt: skip
    p.add_argument("--val-fraction", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--mirror", help="local mirror folder instead of the network (or EULER_DATA_MIRROR)")
    p.add_argument("--weight", action="append", default=[], help="NAME=W mixing weight of a source")
    p.add_argument("--context", type=int, help="context length hint written to meta.json")
    p.add_argument("--workers", type=int, help="tokenization processes (default 2)")
    p.add_argument("--min-chars", type=int, help="drop cleaned documents shorter than this")
    p.add_argument("--minhash", type=float, help="also drop MinHash-similar documents (Jaccard >= this)")
    p.add_argument("--shard-tokens", type=int, help="a train split of more tokens: shards "
                   "train_00000.bin, ... of this many (default 2**30; fewer: one train.bin)")  # fmt: skip
    p.add_argument("--keep-intermediate", action="store_true", help="keep every stage's table "
                   "and the scratch token file (default: dropped once used; the DB compacted)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--overwrite", action="store_true", help="replace the dataset --out holds, or write "
                   "into a folder that holds other files (refused without it)")  # fmt: skip
    p.set_defaults(func=cmd_prepare)
    i = sub.add_parser("inspect", help="counts, samples and a token-length histogram of a dataset folder")
    i.add_argument("folder")
    i.add_argument("--samples", type=int, default=3)
    i.set_defaults(func=cmd_inspect)
    s = sub.add_parser("sft", help="build an SFT set (chat template, loss mask) from Alpaca-style records")
    s.add_argument("--source", action="append", required=True, help="alpaca, or a .json/.jsonl file")
    s.add_argument("--out", required=True)
    s.add_argument("--tokenizer", help="tokenizer.json or bytes (default: OUT/tokenizer.json)")
    s.add_argument("--context", type=int, help="drop examples longer than this many tokens (default: the "
                   "context_hint of OUT/meta.json, i.e. prepare's --context, else 512)")  # fmt: skip
    s.add_argument("--val-fraction", type=float, default=0.05)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--mirror")
    s.add_argument("--overwrite", action="store_true", help="replace the SFT set --out holds, or write "
                   "into a folder that is not euler-data's (refused without it)")  # fmt: skip
    s.set_defaults(func=cmd_sft)
    r = sub.add_parser("prefs", help="build a preference set (prompt, chosen and rejected replies) for DPO")
    r.add_argument("--source", action="append", required=True, help="hh-rlhf, or a .jsonl[.gz]/.json "
                   "file: HH-RLHF {chosen, rejected} dialogues or {prompt, chosen, rejected}")  # fmt: skip
    r.add_argument("--out", required=True)
    r.add_argument("--tokenizer", help="tokenizer.json or bytes (default: OUT/tokenizer.json)")
    r.add_argument("--context", type=int, help="drop pairs whose prompt and longer reply exceed this many "
                   "tokens (default: the context_hint of OUT/meta.json, else 512)")  # fmt: skip
    r.add_argument("--val-fraction", type=float, default=0.05, help="held-out pairs, split by prompt")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--mirror")
    r.add_argument("--overwrite", action="store_true", help="replace the preference set --out holds, or "
                   "write into a folder that is not euler-data's (refused without it)")  # fmt: skip
    r.set_defaults(func=cmd_prefs)
    return parser


def _on_interrupt(signum: int, frame) -> None:
    INTERRUPTS.append(signum)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point; bad input exits with status 2 and one line naming the file and the problem, Ctrl-C
    with 130 and one line saying what the folder holds."""
    args = build_parser().parse_args(argv)
    catch = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
    previous = signal.signal(signal.SIGINT, _on_interrupt) if catch else None
    try:
        args.func(args)
    except Interrupted as err:
        print(f"euler-data {args.command}: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"euler-data {args.command}: interrupted", file=sys.stderr)
        return 130
    except (DataError, ValueError, OSError, duckdb.Error, FolderBusy, FolderUnwritable) as err:
        print(f"euler-data: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    finally:
        if catch:
            signal.signal(signal.SIGINT, previous)
            INTERRUPTS.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
