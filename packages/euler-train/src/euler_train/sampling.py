"""The sampling front end of a checkpoint, shared by `generate` (one prompt or a batch file), `chat`, `eval`,
`report` and `quickstart`: load a model with its tokenizer, turn a prompt into ids (plain, or in the chat
template; cut to the context), stream sampled tokens as bytes and text, and write `generate`'s output.

Tokens stream as they are sampled; bytes are decoded incrementally so a multi-byte character split over
two tokens prints once it is whole. A stream stops at `<|end|>` (or `<|endoftext|>`), which is not printed.

What is printed: text, with U+FFFD for bytes that are not UTF-8 and, on a terminal, for control
characters other than tab, newline and carriage return (so sampled bytes cannot drive the terminal).
One exception: `generate` with the byte tokenizer (a bytes-mode model) writing to a pipe or a file
writes the sampled bytes exactly, with nothing added, since such a model may model any bytes.
"""

from __future__ import annotations

import argparse
import codecs
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import euler_kernels as ek
import euler_model
from euler_bpe import Tokenizer
from euler_data import encode_chat
from euler_train.checkpoint import read_state
from euler_train.config import ConfigError, DeviceConfig, note
from euler_train.device import setup_device
from euler_train.modelio import TOKENIZER, load_model

USER, ASSISTANT, END, EOT = "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"
TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0/C1 but \t \n \r


@dataclass
class SamplingModel:
    mcfg: Any
    params: dict[str, Any]
    tokenizer: Any
    folder: Path | None = None  # the checkpoint folder it was loaded from
    precision: ek.Precision = ek.EXACT  # how its products are computed on the GPU


def load_for_sampling(path: str, device: str = "cpu", run: DeviceConfig | None = None) -> SamplingModel:
    """Model and tokenizer from a checkpoint or run folder (the checkpoint carries tokenizer.json), on
    `device`, computed as `run` says (a run's [run] section: its precision, attention kernel and GEMM
    tuning; by default exact fp32, the CPU's only precision)."""
    run = DeviceConfig() if run is None or device == "cpu" else run
    dev = setup_device(replace(run, device=device))
    mcfg, params, _, folder = load_model(path, dev.xp)
    if not (folder / TOKENIZER).is_file():
        raise ConfigError(f"checkpoint {folder} has no {TOKENIZER}; cannot encode prompts")
    return SamplingModel(mcfg, params, Tokenizer.load(folder / TOKENIZER), folder, dev.precision)


def note_if_not_tuned(model: SamplingModel) -> None:
    """Say on stderr, before a chat, that a checkpoint that was only pretrained never saw the chat format."""
    if model.folder is not None and read_state(model.folder).get("mode") == "pretrain":
        note(
            f"{model.folder} was pretrained, not tuned for chat (euler-train sft); its replies may not "
            "follow the chat format"
        )


def stop_ids(tok: Any, names: tuple[str, ...]) -> tuple[int, ...]:
    return tuple(tok.special_tokens[n] for n in names if n in tok.special_tokens)


def stream_ids(
    model: SamplingModel,
    prompt_ids: list[int],
    args: argparse.Namespace,
    stops: tuple[int, ...],
    speculative: bool = False,
    turn: int = 0,
) -> Iterator[int]:
    """Token ids from euler-model's generate, with the sampling flags of the command line."""
    room = model.mcfg.context - len(prompt_ids)
    yield from euler_model.generate(
        model.mcfg,
        model.params,
        prompt_ids,
        max_new_tokens=max(0, min(args.max_new_tokens, room)),
        stop_tokens=stops,
        seed=None if args.seed is None else args.seed + turn,  # a fresh stream per chat turn
        speculative=speculative,
        precision=model.precision,
        **sampling_kwargs(args),
    )


def complete_batch(
    model: SamplingModel,
    args: argparse.Namespace,
    ids: list[list[int]],
    seeds: list[int] | None,
    **extra: Any,
) -> list:
    """euler-model's generate_batch over prompts of ids, with the sampling flags and --max-new-tokens of the
    command line, <|end|> and <|endoftext|> as stops (extra: generate_batch's other arguments)."""
    stops = stop_ids(model.tokenizer, (END, EOT))
    return euler_model.generate_batch(
        model.mcfg, model.params, ids, args.max_new_tokens, stop_tokens=stops, seeds=seeds,
        precision=model.precision, **sampling_kwargs(args), **extra,
    )  # fmt: skip


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The sampling flags of the command line as euler-model's generate / generate_batch arguments."""
    return {
        "temperature": args.temperature,
        "top_k": args.top_k or None,  # 0: no top-k cut
        "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
    }


def stream_bytes(tok: Any, ids: Iterator[int], stops: tuple[int, ...]) -> Iterator[bytes]:
    """The bytes of each token of a stream; a stop token ends it and is not printed."""
    for i in ids:
        if i in stops:
            break
        yield tok.token_bytes(i)


def decode_pieces(chunks: Iterable[bytes]) -> Iterator[str]:
    """Text of a byte stream, decoded incrementally; what is not UTF-8 becomes U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        piece = decoder.decode(chunk)
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def decode_stream(tok: Any, ids: Iterator[int], stops: tuple[int, ...]) -> Iterator[str]:
    """Text pieces of a token stream; stop tokens end it and are not printed."""
    return decode_pieces(stream_bytes(tok, ids, stops))


def for_terminal(piece: str) -> str:
    """What a terminal is shown of some text: control characters but tab, newline and CR as U+FFFD.

    >>> for_terminal("a\\tb\\x1b[2Jc\\n")
    'a\\tb\\ufffd[2Jc\\n'
    """
    return TERMINAL_CONTROL.sub("\ufffd", piece)


def encode_prompt(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """Ids of the chat template (euler-data's encode_chat) with an open assistant turn at the end."""
    return encode_chat(tok, messages, add_generation_prompt=True)[0]


def prompt_ids(tok: Any, prompt: str) -> list[int]:
    """Ids of a plain prompt; command-line bytes that are not UTF-8 (surrogate escapes) stay those bytes."""
    try:
        return tok.encode_bytes(prompt.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # other lone surrogates: encode's rule (U+FFFD)
        return tok.encode(prompt)


def generate_text(
    model: SamplingModel, args: argparse.Namespace, prompt: str, chat: bool = False, speculative: bool = False
) -> Iterator[str]:
    """Stream the continuation of `prompt` (wrapped in the chat template when `chat`) as text."""
    return decode_pieces(generate_bytes(model, args, prompt, chat, speculative))


def write_generation(model: SamplingModel, args: argparse.Namespace, stdout: TextIO) -> None:
    """`generate`'s output: the byte tokenizer to a pipe or file writes the sampled bytes exactly and
    nothing else; otherwise text (U+FFFD for what is not UTF-8, `for_terminal` on a terminal), a newline."""
    chunks = generate_bytes(model, args, args.prompt, chat=args.chat, speculative=args.speculative)
    terminal = stdout.isatty()
    if model.tokenizer.is_byte_level and not terminal:
        stdout.flush()
        for chunk in chunks:
            stdout.buffer.write(chunk)
            stdout.buffer.flush()
        return
    for piece in decode_pieces(chunks):
        stdout.write(for_terminal(piece) if terminal else piece)
        stdout.flush()
    stdout.write("\n")


def generate_bytes(
    model: SamplingModel, args: argparse.Namespace, prompt: str, chat: bool = False, speculative: bool = False
) -> Iterator[bytes]:
    """Stream the bytes of each sampled token of the continuation of `prompt` (chat template if `chat`)."""
    ids = prompt_to_ids(model, args, prompt, chat)
    stops = stop_ids(model.tokenizer, (END, EOT))
    yield from stream_bytes(model.tokenizer, stream_ids(model, ids, args, stops, speculative), stops)


def prompt_to_ids(
    model: SamplingModel, args: argparse.Namespace, prompt: str, chat: bool, name: str = "the prompt"
) -> list[int]:
    """The ids `generate` continues for a prompt: wrapped in the chat template when `chat`, <|endoftext|>
    for an empty one, cut to the context (crop_prompt, which says so on stderr naming the prompt `name`)."""
    tok = model.tokenizer
    ids = encode_prompt(tok, [{"role": "user", "content": prompt}]) if chat else prompt_ids(tok, prompt)
    ids = ids or [tok.special_tokens[EOT]]  # an empty prompt samples a new document from its start
    return crop_prompt(ids, model.mcfg.context, args.max_new_tokens, name)


def crop_prompt(ids: list[int], context: int, max_new_tokens: int, name: str = "the prompt") -> list[int]:
    """The prompt's last context - 1 ids (room for one new token at least), saying on stderr what the
    context cuts: the prompt's start, or new tokens beyond it."""
    if len(ids) > context - 1:
        note(f"{name} has {len(ids)} tokens; only its last {context - 1} fit the context ({context})")
        ids = ids[-(context - 1) :]
    room = context - len(ids)
    if max_new_tokens > room:
        note(
            f"the context ({context} tokens) leaves room for {room} new tokens after "
            f"{name} ({len(ids)} tokens), not the {max_new_tokens} asked for"
        )
    return ids
