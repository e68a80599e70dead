"""Training: merges worked out by hand on tiny corpora, determinism, bad input."""

from __future__ import annotations

import itertools
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_bpe import CHAT_SPECIAL_TOKENS, Tokenizer
from euler_bpe._train import learn_merges
from tests.bpe.conftest import CORPUS

# Word counts: hug 10, pug 5, pun 12, bun 4, hugs 5 (each text is one word: no leading space).
HUGS = ["hug"] * 10 + ["pug"] * 5 + ["pun"] * 12 + ["bun"] * 4 + ["hugs"] * 5


def merged_strings(tok: Tokenizer) -> list[str]:
    return [(tok.token_bytes(a) + tok.token_bytes(b)).decode() for a, b in tok.merges]


def test_merges_worked_by_hand() -> None:
    # Pair counts at the start: u g 20, p u 17, u n 16, h u 15, g s 5, b u 4 -> "ug".
    # Then: u n 16 (pun 12 + bun 4), h ug 15, p u 12 ... -> "un"; then h ug 15 -> "hug";
    # then p un 12 -> "pun"; then hug s 5 and p ug 5 tie: b"hug" < b"p" -> "hugs"; then "pug";
    # then b un 4 -> "bun". Nothing is left to merge after that.
    tok = Tokenizer.train(HUGS, vocab_size=256 + 7)
    assert merged_strings(tok) == ["ug", "un", "hug", "pun", "hugs", "pug", "bun"]
    assert tok.encode("hugs") == [256 + 4]
    assert tok.encode("bug") == [ord("b"), 256]


def test_corpus_running_out_of_pairs_gives_a_smaller_vocab() -> None:
    tok = Tokenizer.train(HUGS, vocab_size=1000, special_tokens=["<|end|>"])
    assert len(tok.merges) == 7
    assert tok.vocab_size == 256 + 7 + 1
    assert tok.special_tokens == {"<|end|>": 263}


def test_count_ties_break_by_bytes() -> None:
    # "ab" and "cd" both occur 3 times; b"a" < b"c" so (a, b) merges first.
    tok = Tokenizer.train(["cd", "ab"] * 3, vocab_size=257)
    assert merged_strings(tok) == ["ab"]
    tok = Tokenizer.train(["cd", "ab"] * 3 + ["cd"], vocab_size=257)
    assert merged_strings(tok) == ["cd"]
    # In " ab" the pair (" ", "a") ties with ("a", "b") and b" " < b"a".
    tok = Tokenizer.train([" ab"], vocab_size=257)
    assert merged_strings(tok) == [" a"]


def test_spaces_attach_to_the_following_word() -> None:
    # Words: "x"(1) and " x"(4): the pair (" ", "x") is the only one.
    tok = Tokenizer.train(["x x x x x"], vocab_size=257)
    assert merged_strings(tok) == [" x"]
    assert tok.encode("x x") == [ord("x"), 256]


def test_merges_never_cross_words() -> None:
    # Words: "ab" 1, "." 3, " ab" 2. Pairs: (a, b) 3, (" ", a) 2 -> "ab"; then (" ", ab) 2 -> " ab".
    # "b." would occur 3 times, but it spans two words.
    tok = Tokenizer.train(["ab. ab. ab."], vocab_size=300)
    assert merged_strings(tok) == ["ab", " ab"]


def test_special_tokens_take_the_last_ids_and_are_not_learned() -> None:
    text = "<|user|>hello<|assistant|>hi<|end|>" * 50
    tok = Tokenizer.train([text], vocab_size=300, special_tokens=CHAT_SPECIAL_TOKENS)
    assert sorted(tok.special_tokens.values()) == list(range(tok.vocab_size - 4, tok.vocab_size))
    assert not any("<|" in s or "|>" in s for s in merged_strings(tok))


def test_training_is_deterministic_and_workers_agree(tmp_path) -> None:
    from tests.bpe.conftest import CORPUS

    a = Tokenizer.train([CORPUS], vocab_size=350)
    b = Tokenizer.train([CORPUS], vocab_size=350)
    path = tmp_path / "c.txt"
    path.write_text(CORPUS * 30, encoding="utf-8")
    c = Tokenizer.train([path], vocab_size=350, workers=2)
    d = Tokenizer.train([CORPUS * 30], vocab_size=350)
    assert a.fingerprint == b.fingerprint
    assert c.fingerprint == d.fingerprint


def test_files_with_invalid_utf8_train_on_the_raw_bytes(tmp_path) -> None:
    path = tmp_path / "bad.bin"
    path.write_bytes(b"ab\xff\xfe ab\xff\xfe ab\xff\xfe \xc3")
    tok = Tokenizer.train([path], vocab_size=270)
    learned = {tok.token_bytes(i) for i in range(256, tok.vocab_size)}
    # Invalid bytes pretokenize like punctuation: " ab" and b"\xff\xfe" are separate words.
    assert {b" ab", b"\xff\xfe"} <= learned
    assert tok.decode_bytes(tok.encode_bytes(path.read_bytes())) == path.read_bytes()


def test_sample_bytes_trains_on_a_part(tmp_path) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("aaaa bbbb\n" * 200_000)
    second.write_text("cccc dddd\n" * 200_000)
    tok = Tokenizer.train([first, second], vocab_size=270, sample_bytes=1_500_000)
    learned = {tok.token_bytes(i) for i in range(256, tok.vocab_size)}
    # Pieces are taken from both files, not just the start of the corpus.
    assert b"aa" in learned and b"cc" in learned


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab_size": 255}, "vocab_size=255"),
        ({"vocab_size": 300.0}, "must be an int"),
        ({"vocab_size": 257, "special_tokens": ["<a>", "<b>"]}, "2 special tokens"),
        ({"vocab_size": 300, "special_tokens": ["<a>", "<a>"]}, "distinct"),
        ({"vocab_size": 300, "special_tokens": [""]}, "non-empty"),
    ],
)
def test_bad_vocab_sizes_and_specials_are_clear_errors(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        Tokenizer.train(["some text"], **kwargs)


def test_empty_corpus_is_an_error(tmp_path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for corpus in ([], [""], [empty], ["<|end|>"]):
        with pytest.raises(ValueError, match="empty"):
            Tokenizer.train(corpus, vocab_size=300, special_tokens=["<|end|>"])


def test_tiny_corpora_stop_when_no_pair_is_left() -> None:
    # Words "a", " b", " c": pairs (" ", "b") and (" ", "c") once each; b" b" < b" c".
    tok = Tokenizer.train(["a b c"], vocab_size=300)
    assert merged_strings(tok) == [" b", " c"] and tok.vocab_size == 258
    assert tok.decode(tok.encode("a b c")) == "a b c"
    # Single characters only: no pair at all, the byte alphabet alone.
    assert Tokenizer.train(["a", "b", "."], vocab_size=300).merges == []


def test_lone_surrogates_in_str_train_as_replacement_characters() -> None:
    # encode() turns a lone surrogate into U+FFFD, so training sees U+FFFD too.
    tok = Tokenizer.train(["\udcff\udcff " * 10], vocab_size=260)
    learned = {tok.token_bytes(i) for i in range(256, tok.vocab_size)}
    assert "\ufffd".encode() in learned
    assert b"\xff" not in learned


def naive_merges(words: dict[bytes, int], num_tokens: int) -> list[tuple[bytes, bytes]]:
    """Reference: recount every pair before each merge (slow, obviously right)."""
    seqs = {w: [bytes([b]) for b in w] for w in words}
    vocab, merges = {bytes([b]) for b in range(256)}, []
    while len(vocab) < num_tokens:
        counts: dict[tuple[bytes, bytes], int] = {}
        for w, seq in seqs.items():
            for pair in itertools.pairwise(seq):
                counts[pair] = counts.get(pair, 0) + words[w]
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        merges.append(best)
        vocab.add(best[0] + best[1])
        for w, seq in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and (seq[i], seq[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            seqs[w] = out
    return merges


@given(
    st.dictionaries(st.text("abc", min_size=1, max_size=12).map(str.encode), st.integers(1, 9), max_size=12),
    st.integers(256, 290),
)
def test_incremental_training_equals_a_full_recount(words: dict[bytes, int], num_tokens: int) -> None:
    merges, tokens = learn_merges(words, num_tokens)
    assert [(tokens[a], tokens[b]) for a, b, _ in merges] == naive_merges(words, num_tokens)


def test_train_streams_a_generator_and_reports_progress() -> None:
    seen: list[tuple[int, int]] = []
    docs = (f"document {i} says hello world\n" for i in range(2000))
    tok = Tokenizer.train(
        docs, vocab_size=300, special_tokens=["<|end|>"], progress=lambda d, t: seen.append((d, t))
    )
    assert tok.vocab_size == 300
    assert seen[-1] == (299, 299) and [d for d, _ in seen] == list(range(257, 300))
    with pytest.raises(ValueError, match="sample_bytes"):
        Tokenizer.train(["text"], vocab_size=300, sample_bytes=0)


def test_big_files_are_read_in_pieces_without_changing_the_word_counts(tmp_path) -> None:
    from euler_bpe._corpus import count_words, iter_pieces

    # Over 2 MiB: ASCII lines (safe cuts), then a long stretch of CJK lines (no safe cut).
    text = "The end.\n  indented line\n" * 60_000 + "日本語のテキスト。\n" * 80_000 + "tail"
    path = tmp_path / "big.txt"
    path.write_text(text, encoding="utf-8")
    assert path.stat().st_size > 2 * (1 << 20)
    assert count_words(iter_pieces([path])) == count_words(iter_pieces([text])) == count_words([text])


def test_training_leaves_each_word_cached_as_encoding_would_merge_it() -> None:
    from euler_bpe._encode import merge_word
    from euler_bpe._pretokenize import split_words

    text = CORPUS + " naïve café über 12345 " * 20
    tok = Tokenizer.train([text], vocab_size=400)
    enc = tok._encoder
    assert set(enc.cache) == set(split_words(text))  # training's words start the cache
    for word, ids in enc.cache.items():  # packed ids: the bytes of an array of enc.typecode
        assert array(enc.typecode, ids).tolist() == merge_word(list(word.encode("utf-8")), enc.merges), word
    cold = Tokenizer(tok.tokens, tok.merges, tok.special_tokens)  # the same tokenizer, empty cache
    assert not cold._encoder.cache
    assert tok.encode(text) == cold.encode(text)
