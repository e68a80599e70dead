"""Pretokenization: the GPT-2 pattern's splits, and the fast path that must give the same words."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from euler_bpe._pretokenize import gpt2_findall, split_words

# Letters, digits, spaces and punctuation, ASCII and not, plus the newlines where the fast path cuts.
PIECES = st.sampled_from(
    [
        *"aZ9 \n\t\r.!'~-",
        "'s",
        "'ll",
        "\n\n",
        "x\n",
        " \n",
        "é",
        "ß",
        "٣",
        "\u00a0",
        "\u3000",
        "“",
        "—",
        "\u0301",
        "日本",
    ]
)


def test_gpt2_splits_by_hand() -> None:
    assert split_words("Hello world's  end") == ["Hello", " world", "'s", " ", " end"]
    assert split_words("I'll pay 1000 $!!\n\n  x") == ["I", "'ll", " pay", " 1000", " $!!", "\n\n ", " x"]
    assert split_words("café naïve") == ["café", " naïve"]


@given(st.lists(PIECES, max_size=60).map("".join))
def test_fast_path_equals_the_regex_pattern(text: str) -> None:
    assert gpt2_findall(text) == split_words(text)


@given(st.text(max_size=120))
def test_fast_path_on_any_text(text: str) -> None:
    assert gpt2_findall(text) == split_words(text)
    assert "".join(split_words(text)) == text


@given(st.lists(PIECES, max_size=80).map("".join), st.integers(1, 12))
def test_safe_pieces_pretokenize_like_the_whole(text: str, size: int) -> None:
    from euler_bpe._corpus import split_safely

    pieces = list(split_safely(text, size))
    assert "".join(pieces) == text
    assert [w for p in pieces for w in split_words(p)] == split_words(text)
    data = text.encode("utf-8")
    byte_pieces = list(split_safely(data, size))
    assert b"".join(byte_pieces) == data
    words = [w for p in byte_pieces for w in split_words(p.decode("utf-8"))]  # never cut inside a character
    assert words == split_words(text)


def test_text_without_safe_cuts_stays_whole() -> None:
    from euler_bpe._corpus import split_safely

    text = "日本語のテキスト。\n" * 100  # no newline after a visible ASCII character
    assert list(split_safely(text, 10)) == [text]
    assert list(split_safely("ab\ncd\nef", 1)) == ["ab", "\ncd", "\nef"]
