"""The byte tokenizer (`Tokenizer.byte_level`): ids are the bytes, it knows it is one, files say so."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_bpe import CHAT_SPECIAL_TOKENS, Tokenizer, TokenizerFileError
from euler_bpe._encode import word_bytes
from euler_bpe._pretokenize import GPT2_PATTERN, finder

BYTES = Tokenizer.byte_level(CHAT_SPECIAL_TOKENS)
# any code point, lone surrogates included (encode turns them into U+FFFD, like tiktoken)
ANY_TEXT = st.text(alphabet=st.one_of(st.characters(), st.sampled_from(list("\udcff\ud800 \n\x00é🎉"))))


def word_by_word(text: str, raw: bool) -> list[int]:
    """The ids a merge-free BPE gives word by word: the reference for the byte tokenizer's shortcut."""
    return list(b"".join(word_bytes(w, raw) for w in finder(GPT2_PATTERN)(text)))


@given(ANY_TEXT)
def test_encode_is_the_utf8_bytes_word_by_word_or_not(text: str) -> None:
    assert BYTES.encode(text) == word_by_word(text, raw=False)
    # raw: surrogate escapes (U+DC80..U+DCFF) stand for bytes, other lone surrogates are U+FFFD
    assert BYTES._encode(text, frozenset(), raw=True) == word_by_word(text, raw=True)


@given(st.binary(max_size=400))
def test_any_bytes_are_their_own_ids(data: bytes) -> None:
    assert BYTES.encode_bytes(data) == list(data)
    assert BYTES.decode_bytes(list(data)) == data


def test_specials_follow_the_bytes_and_match_only_when_allowed() -> None:
    assert BYTES.special_tokens == {s: 256 + k for k, s in enumerate(CHAT_SPECIAL_TOKENS)}
    assert BYTES.vocab_size == 260 and BYTES.merges == []
    assert BYTES.encode("<|end|>") == list(b"<|end|>")
    assert BYTES.encode("a<|end|>", allowed_special="all") == [97, 259]
    assert BYTES.encode_bytes(b"\xff<|user|>", allowed_special="all") == [255, 257]


def test_is_byte_level_follows_from_the_content() -> None:
    corpus = ["the cat sat on the mat " * 50]
    assert BYTES.is_byte_level and BYTES.kind == "bytes"
    no_merges = Tokenizer.train(corpus, vocab_size=260, special_tokens=CHAT_SPECIAL_TOKENS)
    assert no_merges.is_byte_level and no_merges == BYTES  # the same tokenizer, the same fingerprint
    bpe = Tokenizer.train(corpus, vocab_size=300, special_tokens=CHAT_SPECIAL_TOKENS)
    assert not bpe.is_byte_level and bpe.kind == "bpe"
    swapped = [bytes([b]) for b in range(256)]
    swapped[0], swapped[1] = swapped[1], swapped[0]  # no merges, but id 0 is not the byte 0
    assert not Tokenizer(swapped, []).is_byte_level
    assert not Tokenizer([bytes([b]) for b in range(256)] + [b"xy"], [], {}).is_byte_level  # a 257th token


def test_files_record_the_kind_and_load_checks_it(tmp_path) -> None:
    path = tmp_path / "bytes.json"
    BYTES.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == "bytes" and Tokenizer.load(path) == BYTES
    data["kind"] = "bpe"
    path.write_text(json.dumps(data))
    with pytest.raises(TokenizerFileError, match="kind"):
        Tokenizer.load(path)
    del data["kind"]  # files written before the field existed
    path.write_text(json.dumps(data))
    assert Tokenizer.load(path).is_byte_level
    BYTES.to_hf(tmp_path / "hf.json")  # the Hugging Face export is the byte tokenizer again
    assert Tokenizer.load(tmp_path / "hf.json") == BYTES


def test_encode_batch_needs_no_workers_for_bytes() -> None:
    texts = ["Once upon a time \u00e9" * 2000, "\x00\x01 two"] * 4
    ids = BYTES.encode_batch(texts, workers=2, typecode="H")
    assert [list(a) for a in ids] == [list(t.encode()) for t in texts] and BYTES._pool is None
