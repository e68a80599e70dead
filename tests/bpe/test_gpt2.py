"""GPT-2's own files: our ids equal tiktoken's `gpt2` encoding, every id, on real books and web text."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from euler_bpe import GPT2_PATTERN, Tokenizer

pytestmark = pytest.mark.data


@pytest.fixture(scope="module")
def tiktoken_gpt2(gpt2: Tokenizer):
    """tiktoken's gpt2 encoding built offline from the same files (ranks = ids of token bytes)."""
    tiktoken = pytest.importorskip("tiktoken")
    ranks = {gpt2.token_bytes(i): i for i in range(gpt2.vocab_size) if i != 50256}
    return tiktoken.Encoding(
        name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256}
    )


def web_texts(mirror: Path) -> list[str]:
    folder = mirror / "web_text"
    texts = [json.loads(line)["text"] for line in (folder / "c4_demo.jsonl").read_text().splitlines()]
    for gz in sorted(folder.glob("*.json.gz")):
        texts += [json.loads(line)["text"] for line in gzip.decompress(gz.read_bytes()).splitlines()]
    texts += [p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))]
    return texts


def test_gpt2_shape_and_known_ids(gpt2: Tokenizer) -> None:
    assert gpt2.vocab_size == 50257 and len(gpt2.merges) == 50000
    assert gpt2.special_tokens == {"<|endoftext|>": 50256}
    assert gpt2.encode("First Citizen:") == [5962, 22307, 25]
    assert gpt2.encode("<|endoftext|>", allowed_special="all") == [50256]


def test_hf_gpt2_file_is_the_same_tokenizer(gpt2: Tokenizer, mirror: Path) -> None:
    assert Tokenizer.from_hf(mirror / "gpt2_bpe" / "tokenizer.json").fingerprint == gpt2.fingerprint


@pytest.mark.slow
def test_every_gutenberg_book_matches_tiktoken(gpt2: Tokenizer, tiktoken_gpt2, mirror: Path) -> None:
    books = sorted((mirror / "gutenberg").glob("*.txt"))
    assert len(books) >= 30
    for book in books:
        text = book.read_text(encoding="utf-8")
        ours, theirs = gpt2.encode(text), tiktoken_gpt2.encode_ordinary(text)
        assert ours == theirs, f"{book.name}: first difference at {_first_diff(ours, theirs)}"


def test_web_text_matches_tiktoken(gpt2: Tokenizer, tiktoken_gpt2, mirror: Path) -> None:
    for n, text in enumerate(web_texts(mirror)):
        assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text), f"web text {n}"
        with_special = text[:500] + "<|endoftext|>" + text[500:1000]
        assert gpt2.encode(with_special, allowed_special="all") == tiktoken_gpt2.encode(
            with_special, allowed_special="all"
        )


def test_odd_strings_match_tiktoken(gpt2: Tokenizer, tiktoken_gpt2) -> None:
    odd = [
        "",
        " ",
        "\n\n\n",
        "a\ud800b",
        "x" * 5000,
        " " * 3000 + "y",
        "🎉" * 40,
        "don't 'S 'll",
        "\u00a0\u3000 z",
    ]
    for text in odd:
        assert gpt2.encode(text) == tiktoken_gpt2.encode_ordinary(text), repr(text[:40])


def test_encode_batch_two_workers_matches_on_books(gpt2: Tokenizer, mirror: Path) -> None:
    texts = [
        p.read_text(encoding="utf-8")[:200_000] for p in sorted((mirror / "gutenberg").glob("*.txt"))[:6]
    ]
    assert gpt2.encode_batch(texts, workers=2) == [gpt2.encode(t) for t in texts]


def _first_diff(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
