"""Fixtures for the euler-bpe tests: a small trained tokenizer and GPT-2's from the data mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from euler_bpe import CHAT_SPECIAL_TOKENS, Tokenizer

CORPUS = (
    "The quick brown fox jumps over the lazy dog. It's 2024, and we're testing: 12345 tokens!\n"
    "Ünïcödé text, 日本語のテキスト, emoji 🎉🎉 and   several   spaces.\n"
) * 40


@pytest.fixture(scope="session")
def small_tok() -> Tokenizer:
    """A tokenizer trained on a small mixed-script corpus, with the chat special tokens."""
    return Tokenizer.train([CORPUS], vocab_size=400, special_tokens=CHAT_SPECIAL_TOKENS)


@pytest.fixture(scope="session")
def gpt2_files(mirror: Path) -> tuple[Path, Path]:
    folder = mirror / "gpt2_bpe"
    return folder / "vocab.bpe", folder / "encoder.json"


@pytest.fixture(scope="session")
def gpt2(gpt2_files: tuple[Path, Path]) -> Tokenizer:
    return Tokenizer.from_gpt2(*gpt2_files)
