"""The ``euler-data`` command: ``prepare``, ``inspect`` and ``sft``.

euler-data prepare --source gutenberg:1342,84 --source web/c4.jsonl --out data/mix --vocab-size 4096
euler-data inspect data/mix
euler-data sft --source alpaca --out data/mix --mirror /path/to/mirror
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

from euler_bpe.cli_parser import OneLineParser
from euler_data.errors import DataError
from euler_data.meta import read_meta
from euler_data.network import resolve_mirror
from euler_data.pipeline import prepare
from euler_data.recipe import BYTE_TOKENIZER, SPLIT_MODES, Recipe, SourceSpec, check_vocab_size, load_recipe
from euler_data.report import inspect_folder
from euler_data.sft import build_sft
from euler_data.sources import resolve
from euler_data.tokenizer import load_tokenizer


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


def cmd_prepare(args: argparse.Namespace) -> None:
    recipe = recipe_from_args(args)
    meta = prepare(
        recipe, args.out, mirror=args.mirror, quiet=args.quiet, keep_intermediate=args.keep_intermediate
    )
    fixes = {
        "train": "add sources",
        "val": "raise --val-fraction or add documents, or pretrain with --no-eval",
    }
    for split, fix in fixes.items():
        if not meta["tokens"][split]:
            kept = meta["documents_kept"]
            print(f"euler-data prepare: warning: the {split} split is empty ({kept} documents kept); {fix}",
                  file=sys.stderr)  # fmt: skip
    print(
        f"wrote {args.out}: {meta['documents_kept']}/{meta['documents_in']} documents kept, "
        f"tokens train={meta['tokens']['train']} val={meta['tokens']['val']}, dropped {meta['dropped']}"
    )


def cmd_inspect(args: argparse.Namespace) -> None:
    print(inspect_folder(args.folder, samples=args.samples))


def sft_context(out: Path) -> int:
    """The context the folder's pretraining data was prepared for (meta.json), else the recipe default."""
    hint = read_meta(out).get("context_hint") if (out / "meta.json").is_file() else None
    return int(hint) if isinstance(hint, int) and hint > 0 else Recipe().context_hint


def cmd_sft(args: argparse.Namespace) -> None:
    out = Path(args.out)
    tok_path = args.tokenizer or out / "tokenizer.json"
    if tok_path != BYTE_TOKENIZER and not Path(tok_path).is_file():
        raise DataError(
            str(tok_path), "no tokenizer: pass --tokenizer FILE|bytes or run `prepare` into --out first"
        )
    tok = load_tokenizer(tok_path)
    mirror = resolve_mirror(args.mirror)
    paths = [Path(i.location) for s in args.source for i in resolve(SourceSpec(s), mirror, out / "downloads")]
    context = args.context or sft_context(out)
    meta = build_sft(paths, out, tok, context=context, val_fraction=args.val_fraction, seed=args.seed)
    too_long = meta["dropped"].get("too_long", 0)
    if too_long:
        share = 100 * too_long / max(meta["examples_in"], 1)
        print(
            f"euler-data sft: warning: dropped {too_long} of {meta['examples_in']} examples ({share:.0f}%) "
            f"longer than the context of {context} tokens; --context N keeps more (the longest has "
            f"{meta['longest_tokens']})",
            file=sys.stderr,
        )
    if not (out / "tokenizer.json").exists():
        tok.save(out / "tokenizer.json")
    print(
        f"wrote {out}: {meta['examples_kept']}/{meta['examples_in']} examples kept, dropped {meta['dropped']}"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="euler-data", description=__doc__.split("\n")[0])
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
    s.set_defaults(func=cmd_sft)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; bad input exits with status 2 and one line naming the file and the problem."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (DataError, ValueError, OSError) as err:
        print(f"euler-data: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
