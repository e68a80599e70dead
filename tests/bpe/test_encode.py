"""Encoding and decoding: round trips on arbitrary input, special tokens, the merge algorithms."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_bpe import Tokenizer
from euler_bpe._encode import merge_long_word, merge_word

# Every code point except lone surrogates (tested separately), weighted towards the hard cases.
TEXT = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=("Cs",)),
        st.sampled_from(list(" \t\n\r\x00\x0b\x0c\u00a0\u2028\u3000'sd́̃🎉👍🏽日本語한국어")),
    ),
    max_size=200,
)


@given(TEXT)
def test_decode_encode_round_trip(small_tok: Tokenizer, text: str) -> None:
    ids = small_tok.encode(text)
    assert small_tok.decode(ids, errors="strict") == text
    assert small_tok.decode_bytes(ids) == text.encode("utf-8")


@given(st.binary(max_size=300))
def test_arbitrary_bytes_round_trip(small_tok: Tokenizer, data: bytes) -> None:
    assert small_tok.decode_bytes(small_tok.encode_bytes(data)) == data


@given(
    st.lists(
        st.sampled_from(["<|user|>", "<|end|>", "<|endoftext|>", "Hi", " there", "\n", "<|"]), max_size=20
    )
)
def test_special_tokens_only_when_allowed(small_tok: Tokenizer, parts: list[str]) -> None:
    text = "".join(parts)
    special_ids = set(small_tok.special_tokens.values())
    plain = small_tok.encode(text)
    assert not special_ids & set(plain)
    assert small_tok.decode(plain) == text
    allowed = small_tok.encode(text, allowed_special="all")
    assert small_tok.decode(allowed) == text
    expected = sum(text.count(s) for s in small_tok.special_tokens)
    assert sum(i in special_ids for i in allowed) == expected


def test_allowed_special_subset_and_unknown(small_tok: Tokenizer) -> None:
    ids = small_tok.encode("<|user|>x<|end|>", allowed_special={"<|user|>"})
    assert ids[0] == small_tok.special_tokens["<|user|>"]
    assert small_tok.special_tokens["<|end|>"] not in ids
    with pytest.raises(ValueError, match="unknown special"):
        small_tok.encode("x", allowed_special={"<|nope|>"})
    with pytest.raises(ValueError, match="allowed_special"):
        small_tok.encode("x", allowed_special="<|user|>")


def test_lone_surrogates_become_replacement_characters(small_tok: Tokenizer) -> None:
    # Documented: like tiktoken, a lone surrogate in a str encodes as U+FFFD.
    text = "a\ud800b\udfffc \udc80"
    assert small_tok.decode(small_tok.encode(text)) == "a\ufffdb\ufffdc \ufffd"


@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=50))
def test_any_str_encodes_and_decodes_to_its_surrogate_free_form(small_tok: Tokenizer, text: str) -> None:
    fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    assert small_tok.decode(small_tok.encode(text)) == fixed


def test_partial_utf8_decodes_with_replacement_or_raises(small_tok: Tokenizer) -> None:
    ids = small_tok.encode_bytes("é🎉".encode()[:-1])  # cut inside the emoji
    assert small_tok.decode(ids) == "é\ufffd"
    with pytest.raises(UnicodeDecodeError):
        small_tok.decode(ids, errors="strict")


def test_decode_rejects_ids_outside_the_vocabulary(small_tok: Tokenizer) -> None:
    for bad in ([-1], [small_tok.vocab_size], [0, 10**9]):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            small_tok.decode(bad)
    with pytest.raises(ValueError, match="outside"):
        small_tok.token_bytes(small_tok.vocab_size)


def test_token_bytes_of_specials_and_bytes(small_tok: Tokenizer) -> None:
    assert small_tok.token_bytes(small_tok.special_tokens["<|end|>"]) == b"<|end|>"
    assert [small_tok.token_bytes(i) for i in small_tok.encode_bytes(b"\x00\xff")] == [b"\x00", b"\xff"]


def test_long_runs_encode_fast_and_exactly(small_tok: Tokenizer) -> None:
    # 200k spaces is one pretoken: the heap algorithm must handle it in well under a second.
    text = " " * 200_000 + "x" + "ab" * 50_000
    assert small_tok.decode(small_tok.encode(text)) == text


@pytest.mark.parametrize("seed", range(5))
def test_heap_and_simple_merge_agree(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        merges, vocab = {}, [0, 1, 2]
        for rank in range(rng.randint(1, 15)):
            pair = (rng.choice(vocab), rng.choice(vocab))
            if pair not in merges:
                merges[pair] = (rank, 256 + rank)
                vocab.append(256 + rank)
        ids = [rng.choice([0, 1, 2]) for _ in range(rng.randint(0, 48))]
        assert merge_word(ids, merges) == merge_long_word(ids, merges)


def test_merge_by_rank_hand_example() -> None:
    # Ranks: (a, a) first, then (b, a). "a a a b a": (a, a) merges once, leftmost -> aa a b a,
    # then (b, a) -> aa a ba. "b a a": rank order gives b aa, not ba a.
    merges = {(97, 97): (0, 300), (98, 97): (1, 301)}
    assert merge_word([97, 97, 97, 98, 97], merges) == [300, 97, 301]
    assert merge_word([98, 97, 97], merges) == [98, 300]


def test_encode_batch_matches_encode_with_two_workers(small_tok: Tokenizer) -> None:
    texts = [f"document {i}: " + "text with words " * (i % 50) + "<|end|>" for i in range(400)]
    texts += ["", "🎉" * 1000]
    expected = [small_tok.encode(t, allowed_special="all") for t in texts]
    assert small_tok.encode_batch(texts, allowed_special="all", workers=2) == expected
    assert small_tok.encode_batch(texts, workers=1) == [small_tok.encode(t) for t in texts]


def test_encode_rejects_non_str(small_tok: Tokenizer) -> None:
    with pytest.raises(TypeError):
        small_tok.encode(b"bytes")
    with pytest.raises(TypeError):
        small_tok.encode_batch(["ok", b"bytes"])


def test_encode_batch_cuts_long_texts_exactly_and_reuses_its_workers() -> None:
    from tests.bpe.conftest import CORPUS

    tok = Tokenizer.train([CORPUS], vocab_size=330)
    # Over 2**18 characters: cut into pieces at newlines after visible ASCII, ids unchanged.
    long_text = (CORPUS + "  \n\n\u00a0\n" + "x" * 300) * 200
    texts = [long_text, "short", long_text[:70_000]]
    expected = [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, workers=2) == expected
    pool = tok._pool
    assert tok.encode_batch(texts, workers=2) == expected and tok._pool is pool
    tok.close()
    assert tok._pool is None


def test_encode_batch_never_cuts_texts_of_another_pattern() -> None:
    # With this pattern "!\n" is one word, so a cut before the newline would change the ids.
    tok = Tokenizer.train(["a!\nb!\n" * 50], vocab_size=262, pattern=r"\p{L}+|\p{N}|[^\p{L}\p{N}]+")
    text = "a!\nb!\n" * 100_000
    assert tok.encode_batch([text, text], workers=2) == [tok.encode(text)] * 2
    tok.close()


def test_a_spawned_worker_rebuilds_the_tokenizer_from_its_state(small_tok: Tokenizer) -> None:
    from euler_bpe import _io, _parallel, tokenizer

    # what a spawned (not forked) worker does
    _parallel._init(_io.to_dict(small_tok._vocab), tokenizer._rebuilt)
    try:
        assert _parallel._WORKER is not small_tok
        assert _parallel._WORKER.fingerprint == small_tok.fingerprint
        [ids] = _parallel._encode_chunk((["hi <|end|> there"], "all", False, "I"))
        assert ids.tolist() == small_tok.encode("hi <|end|> there", allowed_special="all")
    finally:
        _parallel._WORKER = None


def test_encode_batch_typecode_gives_arrays(small_tok: Tokenizer) -> None:
    from array import array

    texts = [f"line {i} of text\n" * 200 for i in range(60)]  # over 64 K characters: two workers
    for workers in (1, 2):
        got = small_tok.encode_batch(texts, workers=workers, typecode="H")
        assert all(isinstance(a, array) and a.typecode == "H" for a in got)
        assert [a.tolist() for a in got] == [small_tok.encode(t) for t in texts]
    small_tok.close()
    with pytest.raises(OverflowError, match="typecode 'B'"):
        small_tok.encode_batch(texts, typecode="B")


def test_decode_and_token_bytes_take_any_integer_sequence(small_tok: Tokenizer) -> None:
    from array import array

    ids = small_tok.encode("hello world")
    assert small_tok.decode(array("H", ids)) == "hello world"
    np = pytest.importorskip("numpy")
    assert small_tok.decode(np.array(ids, dtype=np.uint16)) == "hello world"
    assert small_tok.token_bytes(np.int64(104)) == small_tok.token_bytes(104)
    with pytest.raises(ValueError):
        small_tok.token_bytes(True)


def test_encode_array_packs_the_same_ids_as_encode(small_tok: Tokenizer) -> None:
    from array import array

    from euler_bpe._encode import WordEncoder
    from euler_bpe._pretokenize import split_words

    texts = ["Hello world's end, again\n\n  and again", "naïve café “quoted” 12345", "", "x\ud800y"]
    enc = small_tok._encoder
    for text in texts * 2:  # the second time from the cache
        for raw in (False, True):
            merged = [i for word in split_words(text) for i in enc.word_ids(word, raw)]  # uncached
            got = enc.encode_array(text, raw)
            assert got.typecode == "H" and got.tolist() == merged == enc.encode(text, raw)
    assert "x\ud800y" not in enc.cache and "\ud800" not in "".join(enc.cache)  # never cached
    # raw lone surrogates are the bytes they escape; otherwise U+FFFD, as encode_bytes / encode give
    data = b"a\xff b"
    assert small_tok.decode_bytes(small_tok.encode_bytes(data)) == data
    assert small_tok.encode("x\ud800y") == small_tok.encode("x\ufffdy")
    # ids past 16 bits: the cache packs 32-bit ids
    wide = WordEncoder(list(range(256)), {(104, 105): (0, 70_000)})
    assert wide.typecode == "I" and wide.encode_array("hi hi") == array("I", [70_000, 32, 70_000])
    assert wide.encode("hi hi") == [70_000, 32, 70_000]
    byte_level = WordEncoder(list(range(256)), {})
    assert byte_level.encode_array("é") == array("H", [195, 169]) and not byte_level.cache


def test_encode_batch_typecode_i_converts_the_packed_ids(small_tok: Tokenizer) -> None:
    texts = [f"line {i} of text\n" * 200 for i in range(60)]
    for workers in (1, 2):
        got = small_tok.encode_batch(texts, workers=workers, typecode="I")
        assert all(a.typecode == "I" for a in got)
        assert [a.tolist() for a in got] == [small_tok.encode(t) for t in texts]
    small_tok.close()
