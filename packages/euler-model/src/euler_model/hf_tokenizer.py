"""The tokenizer side of a Hugging Face folder: tokenizer_config.json and generation_config.json.

transformers reads the vocabulary, merges and added tokens from tokenizer.json. What it needs beyond that
is named here: which added token ends a sequence (`eos_token`) and which pads, the chat template
(tokenizer_config.json), and which ids stop `generate` (generation_config.json, and config.json).

>>> meta = TokenizerMeta.resolve(
...     {"<|endoftext|>": 5, "<|end|>": 6}, eos_tokens=["<|end|>", "<|endoftext|>"], pad_token="<|endoftext|>"
... )
>>> meta.eos_ids, meta.pad_id, generation_config(meta)["eos_token_id"]
([6, 5], 5, [6, 5])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def added_tokens(tokenizer_json: str) -> dict[str, int]:
    """name -> id of the special added tokens of a tokenizer.json's text (none when it lists none)."""
    try:
        data = json.loads(tokenizer_json)
    except json.JSONDecodeError as err:
        raise ValueError(f"save_hf: the tokenizer is not valid tokenizer.json: {err}") from None
    added = data.get("added_tokens") if isinstance(data, dict) else None
    return {a["content"]: a["id"] for a in added or [] if a.get("special", True)}


@dataclass(frozen=True)
class TokenizerMeta:
    """The special tokens of an export by name and id, and its chat template (None: no template)."""

    specials: dict[str, int]  # every special added token of tokenizer.json
    eos_tokens: tuple[str, ...]  # tokens that end a generation; the first is the tokenizer's eos_token
    pad_token: str | None
    chat_template: str | None

    @classmethod
    def resolve(
        cls,
        specials: dict[str, int],
        eos_tokens: Sequence[str] = (),
        pad_token: str | None = None,
        chat_template: str | None = None,
        vocab_size: int | None = None,
    ) -> TokenizerMeta:
        """Check that every named token is a special token of the tokenizer (and a model id)."""
        if isinstance(eos_tokens, str):
            raise ValueError(
                f"save_hf: eos_tokens must be a sequence of names, got the string {eos_tokens!r}"
            )
        named = [*eos_tokens, *([pad_token] if pad_token is not None else [])]
        unknown = [n for n in named if n not in specials]
        if unknown:
            raise ValueError(
                f"save_hf: {unknown} are not special tokens of the tokenizer ({sorted(specials)})"
            )
        if vocab_size is not None:
            outside = {n: i for n, i in specials.items() if n in named and not 0 <= i < vocab_size}
            if outside:
                raise ValueError(f"save_hf: token ids {outside} are outside the model's vocab ({vocab_size})")
        if chat_template is not None and not isinstance(chat_template, str):
            raise ValueError(
                f"save_hf: chat_template must be a Jinja string, got {type(chat_template).__name__}"
            )
        return cls(dict(specials), tuple(eos_tokens), pad_token, chat_template)

    @property
    def eos_ids(self) -> list[int]:
        return [self.specials[n] for n in self.eos_tokens]

    @property
    def pad_id(self) -> int | None:
        return None if self.pad_token is None else self.specials[self.pad_token]

    def eos_token_id(self) -> int | list[int] | None:
        """One id as an int, several as a list (transformers stops `generate` at any of them)."""
        ids = self.eos_ids
        return None if not ids else ids[0] if len(ids) == 1 else ids


def tokenizer_config(meta: TokenizerMeta, context: int) -> dict[str, Any]:
    """tokenizer_config.json: a fast tokenizer over tokenizer.json, its named specials, the template."""
    named = {*meta.eos_tokens[:1], meta.pad_token}
    extra = [n for n, _ in sorted(meta.specials.items(), key=lambda kv: kv[1]) if n not in named]
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context,
        "bos_token": None,
        "eos_token": meta.eos_tokens[0] if meta.eos_tokens else None,
        "pad_token": meta.pad_token,
        "unk_token": None,
        "additional_special_tokens": extra,
        "clean_up_tokenization_spaces": False,
    }
    return cfg | ({"chat_template": meta.chat_template} if meta.chat_template is not None else {})


def generation_config(meta: TokenizerMeta) -> dict[str, Any]:
    """generation_config.json: no BOS, the ids that stop `generate`, the pad id (greedy by default)."""
    return {"bos_token_id": None, "eos_token_id": meta.eos_token_id(), "pad_token_id": meta.pad_id}
