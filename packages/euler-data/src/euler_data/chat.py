"""The chat template, and the tokens plus loss mask of a conversation.

Every turn is ``<|role|>`` newline content ``<|end|>``, turns are joined by a newline::

    <|user|>\\n{question}<|end|>\\n<|assistant|>\\n{answer}<|end|>

A generation prompt appends ``\\n<|assistant|>\\n``; the model then writes the answer and ``<|end|>``.
The loss mask is 1 exactly on the assistant's content tokens and its closing ``<|end|>``.
A leading ``{"role": "system", ...}`` message has no token of its own: it is folded into the first user
turn, whose content becomes ``system + "\\n\\n" + content`` (so it is never in the loss mask, and
tokenizers without a system token keep working). ``CHAT_TEMPLATE`` is the same format in Jinja, for
Hugging Face's ``apply_chat_template``.

>>> render_chat([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
'<|user|>\\nHi<|end|>\\n<|assistant|>\\n'
"""

from __future__ import annotations

from collections.abc import Sequence

ROLES = ("user", "assistant")
SYSTEM = "system"  # only first, and folded into the user turn after it
END = "<|end|>"
SYSTEM_RULE = "a system message must be the first message and be followed by a user message"


def _check(messages: Sequence[dict]) -> None:
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or m.get("role") not in (*ROLES, SYSTEM)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(
                f"render_chat: message {i} must be {{'role': 'system'|'user'|'assistant', 'content': str}}"
            )
    for i, m in enumerate(messages):
        if m["role"] == SYSTEM and (i > 0 or len(messages) == 1 or messages[1]["role"] != "user"):
            raise ValueError(f"render_chat: message {i}: {SYSTEM_RULE}")


def _turns(messages: Sequence[dict]) -> list[dict]:
    """The checked user/assistant turns, a leading system message folded into the first user turn."""
    _check(messages)
    if not messages or messages[0]["role"] != SYSTEM:
        return list(messages)
    system, user, *rest = messages
    return [{"role": "user", "content": system["content"] + "\n\n" + user["content"]}, *rest]


def render_chat(messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    """The conversation as text with its special tokens (see the module docstring)."""
    messages = _turns(messages)
    text = "\n".join(f"<|{m['role']}|>\n{m['content']}{END}" for m in messages)
    if add_generation_prompt:
        text += ("\n" if messages else "") + "<|assistant|>\n"
    return text


# render_chat in Jinja, for Hugging Face's `apply_chat_template` (it goes in tokenizer_config.json).
# Every newline is an expression ({{ '\\n' }}), so the text is the same with or without Jinja's
# trim_blocks / lstrip_blocks (transformers turns both on). `first` is the index of the first turn: 1
# after a system message, whose text opens that turn's content. Tests pin it to render_chat.
CHAT_TEMPLATE = (
    "{% set first = 1 if messages and messages[0]['role'] == '" + SYSTEM + "' else 0 %}"
    "{% for m in messages %}"
    "{% if m['role'] not in " + repr([*ROLES, SYSTEM]) + " or m['content'] is not string %}"
    "{{ raise_exception('each message must be {role: system|user|assistant, content: str}') }}"
    "{% elif m['role'] == '" + SYSTEM + "' %}"
    "{% if not loop.first or loop.last or messages[1]['role'] != 'user' %}"
    "{{ raise_exception('" + SYSTEM_RULE + "') }}"
    "{% endif %}"
    "{% else %}"
    "{% if loop.index0 > first %}{{ '\\n' }}{% endif %}"
    "{{ '<|' + m['role'] + '|>\\n' }}"
    "{% if first and loop.index0 == 1 %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ m['content'] + '" + END + "' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if messages %}{{ '\\n' }}{% endif %}{{ '<|assistant|>\\n' }}"
    "{% endif %}"
)


def _segments(messages: Sequence[dict], add_generation_prompt: bool) -> list[tuple[str, bool, bool]]:
    """(text, is_special, in_loss) pieces whose concatenation is ``render_chat(...)``."""
    out: list[tuple[str, bool, bool]] = []
    for i, m in enumerate(_turns(messages)):
        loss = m["role"] == "assistant"
        if i:
            out.append(("\n", False, False))
        out += [(f"<|{m['role']}|>", True, False), ("\n", False, False)]
        out += [(m["content"], False, loss), (END, True, loss)]
    if add_generation_prompt:
        out += [("\n", False, False)] if messages else []
        out += [("<|assistant|>", True, False), ("\n", False, False)]
    return out


def encode_chat(
    tok, messages: Sequence[dict], add_generation_prompt: bool = False
) -> tuple[list[int], list[int]]:
    """Token ids and 0/1 loss mask of a conversation; ``tok.decode(ids) == render_chat(messages, ...)``.

    Each piece is encoded on its own (special tokens by id, content as plain text, so a literal
    ``<|user|>`` in a message cannot forge a turn). euler-train's ``chat`` uses this with
    ``add_generation_prompt=True`` and stops at ``<|end|>``.

    >>> msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    >>> ids, mask = encode_chat(tok, msgs)  # doctest: +SKIP
    """
    ids: list[int] = []
    mask: list[int] = []
    for text, special, loss in _segments(messages, add_generation_prompt):
        piece = [tok.special_tokens[text]] if special else tok.encode(text)
        ids += piece
        mask += [int(loss)] * len(piece)
    return ids, mask


def alpaca_messages(record: dict) -> list[dict]:
    """An Alpaca record as a conversation: instruction (+ blank line + input) -> output."""
    prompt = record["instruction"] + (f"\n\n{record['input']}" if record.get("input") else "")
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": record["output"]}]
