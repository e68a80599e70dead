"""The chunk path of GPT-2 encoding (text cut at its spaces, chunks cached) against the pattern itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from euler_bpe import Tokenizer
from euler_bpe._encode import WordEncoder
from euler_bpe._pretokenize import OTHER_SPACE, chunk_text, split_chunks, split_words

# Runs of spaces and newlines of every length, other whitespace, and what may sit next to them.
PIECES = st.sampled_from(
    [
        *"a9 \n.'\t\r\x0b\x0c\x1c\x85",
        "  ",
        "\n\n",
        " \n",
        "\n ",
        "'s",
        "é",
        "٣",
        "“",
        "\u00a0",
        "\u2009",
        "\u3000",
        "\u2028",
        "日本",
        "\u0301",
    ]
)


def chunk_words(text: str) -> list[str]:
    """The words the chunk path stands for: each segment's words, a key's by `chunk_text`."""
    words = []
    for keyed, items in split_chunks(text):
        if keyed:
            words += split_words(items[0]) + [w for key in items[1:] for w in split_words(chunk_text(key))]
        else:
            words += items
    return words


def test_other_space_is_the_patterns_whitespace() -> None:
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert sorted(OTHER_SPACE + " \n") == sorted(regex.findall(r"\s", every))


def test_chunks_by_hand() -> None:
    assert split_chunks("It's  a\ntest.\n\nOk") == [(True, ["It's", "", "a", "\ntest.", "\n", "\nOk"])]
    assert chunk_words("x\n\n\n  y z\t\n") == split_words("x\n\n\n  y z\t\n")
    assert split_chunks("") == [(True, [""])]


@given(st.lists(PIECES, max_size=60).map("".join))
def test_chunks_give_the_patterns_words(text: str) -> None:
    assert chunk_words(text) == split_words(text)


@given(st.text(max_size=120))
def test_chunks_on_any_text(text: str) -> None:
    assert chunk_words(text) == split_words(text)


def word_path(tok: Tokenizer) -> WordEncoder:
    """The same encoder without chunks: one lookup per word (the path before chunks)."""
    enc = WordEncoder(tok._encoder.byte_ids, tok._encoder.merges)
    enc.chunks = None
    return enc


@given(st.lists(PIECES, max_size=60).map("".join))
def test_chunk_ids_equal_word_ids(text: str) -> None:
    tok = Tokenizer.train(["a9 'sé日本 “x” " * 20], vocab_size=300)
    merged = [i for word in split_words(text) for i in tok._encoder.word_ids(word)]
    assert tok.encode(text) == merged == word_path(tok).encode(text)


def test_a_full_chunk_cache_starts_over(small_tok: Tokenizer) -> None:
    enc = WordEncoder(small_tok._encoder.byte_ids, small_tok._encoder.merges, cache_limit=5)
    text = "one two three four five six seven eight, nine.\n ten   eleven"
    assert enc.encode(text) == word_path(small_tok).encode(text) == enc.encode(text)
    assert len(enc.chunks) <= 5


def mirror_texts(mirror: Path) -> list[str]:
    """Real text: the head of every Gutenberg book, the web text files and the OLMo C4 samples."""
    texts = [p.read_text(encoding="utf-8")[:200_000] for p in sorted((mirror / "gutenberg").glob("*.txt"))]
    web = mirror / "web_text"
    texts += [p.read_text(encoding="utf-8") for p in sorted(web.glob("*.txt"))]
    texts += [json.loads(line)["text"] for line in (web / "c4_demo.jsonl").read_text().splitlines()]
    for path in sorted(web.glob("*.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f][:300]
    return texts


@pytest.mark.data
def test_chunk_path_on_the_mirrors_text(mirror: Path) -> None:
    texts = mirror_texts(mirror)
    assert sum(map(len, texts)) > 5_000_000
    tok = Tokenizer.train(texts[:3], vocab_size=1000)
    reference = word_path(tok)
    for text in texts:
        assert chunk_words(text) == split_words(text)
        assert tok._encoder.encode_array(text) == reference.encode_array(text)
