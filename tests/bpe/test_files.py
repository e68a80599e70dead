"""Files: the own JSON format, Hugging Face tokenizer.json, bad files."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from euler_bpe import Tokenizer, TokenizerFileError

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=120)
FIXTURE = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def saved(small_tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tok.json"
    small_tok.save(path)
    return path


@pytest.fixture(scope="module")
def hf_export(small_tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    small_tok.to_hf(path)
    return path


def test_save_load_keeps_everything(small_tok, saved) -> None:
    loaded = Tokenizer.load(saved)
    assert loaded.fingerprint == small_tok.fingerprint
    assert loaded.tokens == small_tok.tokens and loaded.merges == small_tok.merges
    assert loaded.special_tokens == small_tok.special_tokens
    data = json.loads(saved.read_text())
    assert (
        data["format"] == "euler-bpe"
        and data["version"] == 1
        and data["fingerprint"] == small_tok.fingerprint
    )


@given(TEXT)
def test_save_load_preserves_encodings(small_tok, saved, text) -> None:
    loaded = Tokenizer.load(saved)
    assert loaded.encode(text, allowed_special="all") == small_tok.encode(text, allowed_special="all")


def test_fingerprint_changes_with_content(small_tok) -> None:
    other = Tokenizer(small_tok.tokens, small_tok.merges, {}, small_tok.pattern)
    fewer = Tokenizer(small_tok.tokens, small_tok.merges[:-1], small_tok.special_tokens, small_tok.pattern)
    assert len({small_tok.fingerprint, other.fingerprint, fewer.fingerprint}) == 3
    assert len(small_tok.fingerprint) == 64


def _corrupt(saved, tmp_path, change) -> object:
    data = json.loads(saved.read_text())
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(version=99), "unknown euler-bpe version 99"),
        (lambda d: d.pop("format"), "not an euler-bpe file"),
        (lambda d: d.pop("merges"), "'merges' is missing"),
        (lambda d: d["merges"].append([1, 2]), "fingerprint|not a token"),
        (lambda d: d["merges"].__setitem__(0, [5, 99999]), "ordinary tokens"),
        (lambda d: d["tokens"].__setitem__(0, "zz"), "inconsistent|hex"),
        (lambda d: d["tokens"].pop(0), "inconsistent"),
        (lambda d: d.update(fingerprint="0" * 64), "fingerprint does not match"),
        (lambda d: d["special_tokens"].update({"<x>": 10**6}), "inconsistent"),
    ],
)
def test_malformed_files_are_clear_errors(saved, tmp_path, change, message) -> None:
    with pytest.raises(TokenizerFileError, match=message):
        Tokenizer.load(_corrupt(saved, tmp_path, change))


def test_truncated_and_non_json_files(saved, tmp_path) -> None:
    cut = tmp_path / "cut.json"
    cut.write_bytes(saved.read_bytes()[: len(saved.read_bytes()) // 2])
    with pytest.raises(TokenizerFileError, match="truncated"):
        Tokenizer.load(cut)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TokenizerFileError):
        Tokenizer.load(binary)
    array = tmp_path / "array.json"
    array.write_text("[1, 2, 3]")
    with pytest.raises(TokenizerFileError, match="not an euler-bpe file"):
        Tokenizer.load(array)
    with pytest.raises(FileNotFoundError):
        Tokenizer.load(tmp_path / "missing.json")


def test_hf_export_loads_in_tokenizers_and_encodes_identically(small_tok, hf_export) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(hf_export))
    from tests.bpe.conftest import CORPUS

    for text in [CORPUS, "  leading spaces\n\n\ttabs   ", "<|user|>hi<|end|>", "ÿ€\x00🎉 日本"]:
        assert hf.encode(text).ids == small_tok.encode(text, allowed_special="all")
        assert hf.decode(hf.encode(text).ids, skip_special_tokens=False) == text
    assert hf.get_vocab_size() == small_tok.vocab_size


@FIXTURE
@given(TEXT)
def test_hf_export_encodes_like_tokenizers_on_any_text(small_tok, hf_export, text) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(hf_export))
    assert hf.encode(text).ids == small_tok.encode(text, allowed_special="all")


@FIXTURE
@given(TEXT)
def test_hf_export_import_round_trip(small_tok, hf_export, text) -> None:
    back = Tokenizer.from_hf(hf_export)
    assert back.fingerprint == small_tok.fingerprint
    assert back.encode(text) == small_tok.encode(text)


def test_hf_export_with_another_pattern(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    pattern = r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"
    tok = Tokenizer.train(["abc 123 def 456 abc"] * 20, vocab_size=270, pattern=pattern)
    tok.to_hf(tmp_path / "t.json")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "t.json"))
    for text in ["abc 123 def", "x1y22z  "]:
        assert hf.encode(text).ids == tok.encode(text)
    assert Tokenizer.from_hf(tmp_path / "t.json").fingerprint == tok.fingerprint


def test_load_reads_hf_files_too(small_tok, hf_export) -> None:
    assert Tokenizer.load(hf_export).fingerprint == small_tok.fingerprint


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(normalizer={"type": "NFC"}), "normalizers"),
        (lambda d: d["model"].update(type="WordPiece"), "not BPE"),
        (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "unsupported pre_tokenizer"),
        (lambda d: d["model"]["merges"].append("Ġ zzz"), "not in the vocabulary"),
        (lambda d: d["model"]["vocab"].update({"Ġx": 10**6}), "without gaps"),
        (lambda d: d["model"].pop("vocab"), "model.vocab"),
    ],
)
def test_unsupported_or_broken_hf_files(hf_export, tmp_path, change, message) -> None:
    with pytest.raises(TokenizerFileError, match=message):
        Tokenizer.from_hf(_corrupt(hf_export, tmp_path, change))


def test_gpt2_files_with_bad_lines(tmp_path) -> None:
    encoder = tmp_path / "encoder.json"
    merges = tmp_path / "vocab.bpe"
    from euler_bpe._bytes import BYTE_TO_CHAR

    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    vocab["ab"] = 256
    encoder.write_text(json.dumps(vocab))
    merges.write_text("#version: 0.2\na b\n")
    tok = Tokenizer.from_gpt2(merges, encoder)
    assert tok.encode("ab ab") == [256, vocab["Ġ"], 256]
    merges.write_text("#version: 0.2\na b c\n")
    with pytest.raises(TokenizerFileError, match="not two tokens"):
        Tokenizer.from_gpt2(merges, encoder)
    encoder.write_text(json.dumps({**vocab, "ab": 300}))
    merges.write_text("a b\n")
    with pytest.raises(TokenizerFileError, match="without gaps"):
        Tokenizer.from_gpt2(merges, encoder)


def test_import_a_tokenizer_trained_by_the_tokenizers_library(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    from tests.bpe.conftest import CORPUS

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=420, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"], show_progress=False
    )
    hf.train_from_iterator([CORPUS], trainer)
    hf.save(str(tmp_path / "hf.json"))
    ours = Tokenizer.from_hf(tmp_path / "hf.json")
    assert ours.vocab_size == hf.get_vocab_size() and ours.special_tokens == {"<|endoftext|>": 0}
    for text in [CORPUS, "unseen wörds 🎉 and <|endoftext|> x", "   \n\t"]:
        assert ours.encode(text, allowed_special="all") == hf.encode(text).ids


def test_import_refuses_an_incomplete_byte_alphabet(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator(["abc abc abd"] * 10, trainers.BpeTrainer(vocab_size=30, show_progress=False))
    hf.save(str(tmp_path / "hf.json"))
    with pytest.raises(TokenizerFileError, match="byte alphabet is incomplete"):
        Tokenizer.from_hf(tmp_path / "hf.json")
