"""The `euler-bpe` command: train, encode, decode, info.

euler-bpe train books/*.txt --vocab-size 4096 --chat-specials --out tok.json
cat a.txt | euler-bpe encode --tokenizer tok.json --format u16 > a.bin
euler-bpe decode --tokenizer tok.json --format u16 < a.bin
euler-bpe info tok.json
"""

from __future__ import annotations

import argparse
import sys
from array import array
from pathlib import Path

from euler_bpe.__about__ import __version__
from euler_bpe._corpus import split_safely
from euler_bpe._pretokenize import GPT2_PATTERN
from euler_bpe._train import vocab_note
from euler_bpe.cli_parser import OneLineParser
from euler_bpe.errors import TokenizerFileError
from euler_bpe.specials import CHAT_SPECIAL_TOKENS
from euler_bpe.tokenizer import Tokenizer


def _train(args: argparse.Namespace) -> None:
    specials = list(CHAT_SPECIAL_TOKENS) if args.chat_specials else []
    specials += [s for s in args.special if s not in specials]
    files = [f for f in args.files if f != "-"]
    sources = [Path(f) for f in files] if files else [sys.stdin.buffer.read()]
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise OSError(f"no such file: {missing[0]}")
    tok = Tokenizer.train(
        sources, args.vocab_size, specials, sample_bytes=args.sample_bytes, workers=args.workers,
        progress=not args.quiet,
    )  # fmt: skip
    tok.save(args.out)
    note = vocab_note(args.vocab_size, tok.vocab_size)
    if note:
        print(f"euler-bpe train: note: {note}", file=sys.stderr)
    print(f"wrote {args.out}: {tok!r}", file=sys.stderr)


def _encode(args: argparse.Namespace) -> None:
    tok = Tokenizer.load(args.tokenizer)
    data = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    allowed = "all" if args.allow_special else frozenset()
    # Pieces cut where pretokenization splits anyway, so the ids equal those of the whole input.
    cuts = split_safely(data) if tok.pattern == GPT2_PATTERN else [data]
    pieces = [p.decode("utf-8", "surrogateescape") for p in cuts]
    ids = [i for chunk in tok._encode_batch(pieces, allowed, args.workers, raw=True) for i in chunk]
    if args.format == "u16":
        if tok.vocab_size > 1 << 16:
            raise ValueError(f"encode: vocab_size {tok.vocab_size} does not fit uint16")
        out = array("H", ids)
        if sys.byteorder != "little":
            out.byteswap()
        sys.stdout.buffer.write(out.tobytes())
    else:
        sys.stdout.write(" ".join(map(str, ids)) + "\n")


def _read_ids(data: bytes, fmt: str) -> list[int]:
    if fmt == "u16":
        if len(data) % 2:
            raise ValueError(f"decode: {len(data)} bytes is not a whole number of uint16 ids")
        ids = array("H")
        ids.frombytes(data)
        if sys.byteorder != "little":
            ids.byteswap()
        return ids.tolist()
    try:
        return [int(x) for x in data.split()]
    except ValueError:
        raise ValueError("decode: text input must be integers separated by whitespace") from None


def _decode(args: argparse.Namespace) -> None:
    tok = Tokenizer.load(args.tokenizer)
    data = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
    sys.stdout.buffer.write(tok.decode_bytes(_read_ids(data, args.format)))


def _info(args: argparse.Namespace) -> None:
    tok = Tokenizer.load(args.tokenizer)
    print(f"vocab_size      {tok.vocab_size}")
    print(f"merges          {len(tok.merges)}")
    print(f"kind            {tok.kind}")
    print(f"special_tokens  {tok.special_tokens}")
    print(f"fingerprint     {tok.fingerprint}")
    print(f"pattern         {tok.pattern}")


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="euler-bpe", description="Byte-level BPE: train, encode, decode, info.")
    p.add_argument("--version", action="version", version=f"euler-bpe {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="learn merges from files (or stdin) and write a tokenizer file")
    t.add_argument("files", nargs="*", help="text files, read as bytes; none or '-' reads stdin")
    t.add_argument("--vocab-size", type=int, required=True, help="bytes + merges + special tokens")
    t.add_argument("--special", action="append", default=[], help="a special token (repeatable)")
    t.add_argument("--chat-specials", action="store_true", help=f"add {', '.join(CHAT_SPECIAL_TOKENS)}")
    t.add_argument("--sample-bytes", type=int, default=None, help="train on about this much, spread evenly")
    t.add_argument("--workers", type=int, default=1, help="processes for pretokenization")
    t.add_argument("--out", required=True, help="the tokenizer file to write")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, what in (("encode", "text bytes -> ids"), ("decode", "ids -> text bytes")):
        c = sub.add_parser(name, help=what)
        c.add_argument("--tokenizer", required=True, help="euler-bpe file or HF tokenizer.json")
        c.add_argument("--format", choices=["text", "u16"], default="text", help="ids as text or uint16 LE")
        c.add_argument("--input", default=None, help="read this file instead of stdin")
        if name == "encode":
            c.add_argument("--allow-special", action="store_true", help="match special tokens in the text")
            c.add_argument("--workers", type=int, default=1, help="processes to encode with")
    i = sub.add_parser("info", help="describe a tokenizer file")
    i.add_argument("tokenizer")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run = {"train": _train, "encode": _encode, "decode": _decode, "info": _info}[args.command]
    try:
        run(args)
    except (TokenizerFileError, ValueError, OSError) as err:
        print(f"euler-bpe {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
