"""Special tokens reserved for chat fine-tuning (SFT).

- `<|endoftext|>`: separates documents in pretraining data; ends a generation.
- `<|user|>`: starts a user turn in a chat transcript.
- `<|assistant|>`: starts an assistant turn; the loss is taken on what follows it.
- `<|end|>`: ends a turn.

They are matched in text only when `encode(..., allowed_special=...)` asks for them; otherwise they
are ordinary text, so that a web page that contains "<|user|>" cannot forge a turn.
"""

from __future__ import annotations

ENDOFTEXT = "<|endoftext|>"
CHAT_SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, "<|user|>", "<|assistant|>", "<|end|>")
