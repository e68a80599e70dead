"""The `chat` command's REPL over the chat template (the sampling itself is sampling.py's).

The chat keeps the history that fits the context window (oldest turns drop first) and stops a reply at
`<|end|>` (or `<|endoftext|>`); replies stream as they are sampled, with `for_terminal` on a terminal.
Ctrl-C stops the reply being written and returns to the prompt; at the prompt it ends the chat
(KeyboardInterrupt: the CLI's exit 130), as Ctrl-D (end of input) and /quit do (exit 0).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from euler_train.sampling import (
    END,
    EOT,
    SamplingModel,
    decode_stream,
    encode_prompt,
    for_terminal,
    stop_ids,
    stream_ids,
)

BANNER = "euler chat: /reset clears the history, /temp X sets the temperature, /quit or Ctrl-D ends"


def fit_history(tok: Any, history: list[dict[str, str]], budget: int) -> list[int]:
    """Prompt ids of the newest turns that fit in `budget` tokens (oldest turns dropped first)."""
    for start in range(0, len(history), 2):
        ids = encode_prompt(tok, history[start:])
        if len(ids) <= budget:
            return ids
    return encode_prompt(tok, history[-1:])[-budget:]  # even the last message is too long: keep its end


def chat_repl(model: SamplingModel, args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    """Read user lines; answer each; `/reset` clears history, `/temp X` sets temperature, `/quit` or the
    end of input ends (0). Ctrl-C stops a reply; at the prompt it raises KeyboardInterrupt."""
    history: list[dict[str, str]] = []
    stdout.write(BANNER + "\n")
    stdout.flush()
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
    terminal = stdin.isatty()
    if terminal:
        stdout.write("you> ")
        stdout.flush()
    line = stdin.readline()
    if not line and terminal:
        stdout.write("\n")  # Ctrl-D: end the prompt's line, so the shell's prompt starts on its own
    return line.strip() if line else None


def _answer(
    model: SamplingModel, args: argparse.Namespace, history: list[dict[str, str]], stdout: TextIO
) -> str:
    """Stream the assistant's reply to the conversation (newest turns that fit the context); Ctrl-C stops
    it, and what was written of it stays in the history."""
    stops = stop_ids(model.tokenizer, (END, EOT))
    budget = max(1, model.mcfg.context - min(args.max_new_tokens, model.mcfg.context // 2))  # room to answer
    reply, terminal = [], stdout.isatty()
    try:
        ids = fit_history(model.tokenizer, history, budget)
        stdout.write("assistant> ")
        stdout.flush()
        for piece in decode_stream(
            model.tokenizer, stream_ids(model, ids, args, stops, turn=len(history) // 2), stops
        ):
            reply.append(piece)
            stdout.write(for_terminal(piece) if terminal else piece)
            stdout.flush()
    except KeyboardInterrupt:
        stdout.write("\n(reply stopped; Ctrl-C at the prompt, Ctrl-D or /quit ends the chat)")
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
