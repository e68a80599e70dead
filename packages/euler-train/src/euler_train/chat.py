"""Sampling from a checkpoint: `generate` (one prompt) and `chat` (a REPL over the chat template).

Tokens stream as they are sampled; bytes are decoded incrementally so a multi-byte character split over
two tokens prints once it is whole. The chat keeps the history that fits the context window (oldest
turns drop first) and stops a reply at `<|end|>` (or `<|endoftext|>`).
"""

from __future__ import annotations

import argparse
import codecs
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

USER, ASSISTANT, END, EOT = "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"


@dataclass
class SamplingModel:
    mcfg: Any
    params: dict[str, Any]
    tokenizer: Any


def load_for_sampling(path: str, device: str = "cpu") -> SamplingModel:
    """Model and tokenizer from a checkpoint or run folder (the checkpoint carries tokenizer.json)."""
    from euler_bpe import Tokenizer
    from euler_train.config import ConfigError
    from euler_train.device import setup_device
    from euler_train.modelio import TOKENIZER, load_model

    xp = setup_device(device, "fp32").xp
    mcfg, params, _, folder = load_model(path, xp)
    if not (folder / TOKENIZER).is_file():
        raise ConfigError(f"checkpoint {folder} has no {TOKENIZER}; cannot encode prompts")
    return SamplingModel(mcfg, params, Tokenizer.load(folder / TOKENIZER))


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
    import euler_model

    room = model.mcfg.context - len(prompt_ids)
    yield from euler_model.generate(
        model.mcfg,
        model.params,
        prompt_ids,
        max_new_tokens=max(0, min(args.max_new_tokens, room)),
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        stop_tokens=stops,
        seed=None if args.seed is None else args.seed + turn,  # a fresh stream per chat turn
        speculative=speculative,
    )


def decode_stream(tok: Any, ids: Iterator[int], stops: tuple[int, ...]) -> Iterator[str]:
    """Text pieces of a token stream; stop tokens end it and are not printed."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for i in ids:
        if i in stops:
            break
        piece = decoder.decode(tok.token_bytes(i))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def encode_prompt(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """Ids of the chat template (euler-data's encode_chat) with an open assistant turn at the end."""
    from euler_data import encode_chat

    return encode_chat(tok, messages, add_generation_prompt=True)[0]


def generate_text(
    model: SamplingModel, args: argparse.Namespace, prompt: str, chat: bool = False, speculative: bool = False
) -> Iterator[str]:
    """Stream the continuation of `prompt` (wrapped in the chat template when `chat`)."""
    tok = model.tokenizer
    ids = encode_prompt(tok, [{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
    ids = ids[-(model.mcfg.context - 1) :]  # keep room for at least one new token
    stops = stop_ids(tok, (END, EOT))
    yield from decode_stream(tok, stream_ids(model, ids, args, stops, speculative), stops)


def fit_history(tok: Any, history: list[dict[str, str]], budget: int) -> list[int]:
    """Prompt ids of the newest turns that fit in `budget` tokens (oldest turns dropped first)."""
    for start in range(0, len(history), 2):
        ids = encode_prompt(tok, history[start:])
        if len(ids) <= budget:
            return ids
    return encode_prompt(tok, history[-1:])[-budget:]  # even the last message is too long: keep its end


def chat_repl(model: SamplingModel, args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    """Read user lines; answer each; `/reset` clears history, `/temp X` sets temperature, `/quit` ends."""
    history: list[dict[str, str]] = []
    stdout.write("euler chat: /reset clears the history, /temp X sets the temperature, /quit ends\n")
    while (line := _read_line(stdin, stdout)) is not None:
        if not line:
            continue
        if line.startswith("/"):
            if _command(line, history, stdout, args):
                break
            continue
        history.append({"role": "user", "content": line})
        reply = _answer(model, args, history, stdout)
        history.append({"role": "assistant", "content": reply})
    return 0


def _read_line(stdin: TextIO, stdout: TextIO) -> str | None:
    """The next stripped input line (with a `you> ` prompt on a terminal); None at end of input."""
    if stdin.isatty():
        stdout.write("you> ")
        stdout.flush()
    line = stdin.readline()
    return line.strip() if line else None


def _answer(
    model: SamplingModel, args: argparse.Namespace, history: list[dict[str, str]], stdout: TextIO
) -> str:
    """Stream the assistant's reply to the conversation (newest turns that fit the context)."""
    stops = stop_ids(model.tokenizer, (END, EOT))
    budget = max(1, model.mcfg.context - min(args.max_new_tokens, model.mcfg.context // 2))  # room to answer
    ids = fit_history(model.tokenizer, history, budget)
    stdout.write("assistant> ")
    reply = []
    for piece in decode_stream(
        model.tokenizer, stream_ids(model, ids, args, stops, turn=len(history) // 2), stops
    ):
        reply.append(piece)
        stdout.write(piece)
        stdout.flush()
    stdout.write("\n")
    return "".join(reply)


def _command(line: str, history: list, stdout: TextIO, args: argparse.Namespace) -> bool:
    """Handle a slash command; True when the REPL should end."""
    cmd, _, rest = line.partition(" ")
    if cmd in ("/quit", "/exit"):
        return True
    if cmd == "/reset":
        history.clear()
        stdout.write("(history cleared)\n")
    elif cmd == "/temp":
        try:
            args.temperature = max(0.0, float(rest))
            stdout.write(f"(temperature {args.temperature})\n")
        except ValueError:
            stdout.write("(usage: /temp 0.7)\n")
    else:
        stdout.write(f"(unknown command {cmd}; try /reset, /temp X, /quit)\n")
    return False
