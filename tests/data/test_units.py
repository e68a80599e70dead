"""Readers, cleaning and recipes on small inputs with known answers."""

from __future__ import annotations

import gzip
import json
import unicodedata

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_data import DataError, SourceSpec, load_recipe
from euler_data.clean import clean_text
from euler_data.cli import source_from_cli
from euler_data.readers import read_json_file, read_jsonl_lines, read_txt, split_bytes


@pytest.fixture(scope="module")
def con():
    con = duckdb.connect()
    yield con
    con.close()


def test_jsonl_reader_counts_each_bad_line():
    lines = [b'{"text": "ok", "score": 2}', b"", b"{bad", b'"just a string"', b'{"title": 1}']
    lines.append(b'{"text": "\xff"}')
    assert list(read_jsonl_lines(lines, "text")) == [
        ("ok", 2.0, None),
        (None, None, "malformed_json"),
        (None, None, "malformed_json"),
        (None, None, "no_text"),
        (None, None, "not_utf8"),
    ]


def test_alpaca_records_read_as_text_and_gzip_json_lines(tmp_path):
    path = tmp_path / "x.json.gz"
    recs = [{"instruction": "Add.", "input": "1 2", "output": "3"}, {"text": "plain", "url": "u"}]
    path.write_bytes(gzip.compress("\n".join(json.dumps(r) for r in recs).encode()))
    assert list(read_json_file(path, "text")) == [("Add.\n\n1 2\n\n3", None, None), ("plain", None, None)]


def test_text_files_split_into_documents(tmp_path):
    data = b"one\ntwo\n\n  \nthree<|endoftext|>four\n"
    assert split_bytes(data, "line") == [b"one", b"two", b"three<|endoftext|>four"]
    assert split_bytes(data, "paragraph") == [b"one\ntwo", b"three<|endoftext|>four\n"]
    assert split_bytes(data, "eot") == [b"one\ntwo\n\n  \nthree", b"four\n"]
    (tmp_path / "a.txt").write_bytes(b"caf\xe9 latin-1")
    assert list(read_txt(tmp_path / "a.txt", "document", 1000)) == [(None, None, "not_utf8")]
    assert list(read_txt(tmp_path / "a.txt", "document", 5)) == [(None, None, "too_long")]


def test_clean_normalises_and_strips_boilerplate(con):
    assert clean_text(con, "\ufeffLine one\r\nLine\x00 two\rend\x0c") == "Line one\nLine two\nend"
    assert clean_text(con, "Cafe\u0301") == "Café"
    book = "Header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nBody text.\n"
    book += "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicense."
    assert clean_text(con, book) == "Body text."
    assert clean_text(con, "Keep\ttabs\nand lines") == "Keep\ttabs\nand lines"


@given(st.text(max_size=60))
def test_clean_output_has_no_control_characters_and_is_nfc(con, text):
    out = clean_text(con, text)
    assert out == out.strip(" \t\n")
    assert not any(unicodedata.category(c) == "Cc" and c not in "\t\n" for c in out)
    assert unicodedata.is_normalized("NFC", out)
    assert clean_text(con, out) == out  # idempotent


def test_recipe_files_and_cli_specs(tmp_path):
    data = {"vocab_size": 1000, "source": ["alpaca", {"spec": "x.txt"}]}
    (tmp_path / "r.json").write_text(json.dumps(data))
    recipe = load_recipe(tmp_path / "r.json")
    assert recipe.vocab_size == 1000 and [s.label for s in recipe.sources] == ["alpaca", "x"]
    (tmp_path / "bad.toml").write_text("vocab_size = 1000\ncolour = 'red'\n")
    with pytest.raises(DataError, match=r"bad\.toml: unknown recipe keys \['colour'\]"):
        load_recipe(tmp_path / "bad.toml")
    assert source_from_cli("wiki.txt::line") == SourceSpec("wiki.txt", docs="line")
    assert SourceSpec("tinyshakespeare").split_mode == "position" and SourceSpec("a.txt").split_mode == "hash"


def test_named_sources_resolve_from_a_mirror_layout(tmp_path, tok_path, decode_docs):
    from euler_data import Recipe, prepare

    mirror = tmp_path / "mirror"
    (mirror / "fineweb-edu").mkdir(parents=True)
    (mirror / "gutenberg").mkdir()
    (mirror / "gutenberg" / "manifest.json").write_text(json.dumps([{"ebook_id": 7, "file": "pg7.txt"}]))
    (mirror / "gutenberg" / "pg7.txt").write_text(
        "*** START OF THE PROJECT GUTENBERG EBOOK 7 ***\n" + "Once. " * 60
    )
    rows = [(f"Document {i} " + "word " * 50, float(i % 5), i % 5) for i in range(10)]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (text VARCHAR, score DOUBLE, int_score INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.execute(f"COPY t TO '{mirror / 'fineweb-edu' / 'part0.parquet'}' (FORMAT parquet)")
    con.close()
    sources = (SourceSpec("fineweb-edu:8", min_score=3.0), SourceSpec("gutenberg:7"))
    meta = prepare(
        Recipe(sources=sources, tokenizer=str(tok_path)), tmp_path / "out", mirror=mirror, quiet=True
    )
    assert meta["sources"]["fineweb-edu"]["documents_in"] == 8  # ROWS caps the rows read
    assert meta["sources"]["fineweb-edu"]["dropped"] == {"low_score": 6}  # scores 0,1,2,3,4,0,1,2
    docs = decode_docs(tmp_path / "out", "train") + decode_docs(tmp_path / "out", "val")
    assert ("Once. " * 60).strip() in docs
    by_int = (SourceSpec("fineweb-edu", min_score=4, score_field="int_score"),)
    recipe = Recipe(sources=by_int, tokenizer=str(tok_path))
    meta = prepare(recipe, tmp_path / "o1", mirror=mirror, quiet=True)
    assert meta["documents_in"] == 10 and meta["dropped"] == {"low_score": 8}  # int_score 4 twice
    with pytest.raises(
        DataError, match=r"gutenberg:8: no mirror has it .* https://www\.gutenberg\.org/cache/epub/8/pg8\.txt"
    ):
        prepare(Recipe(sources=(SourceSpec("gutenberg:8"),)), tmp_path / "o2", mirror=mirror, quiet=True)


def test_doc_lengths_and_histogram_of_a_bin():
    from euler_data.report import doc_lengths, histogram

    eot = 9
    tokens = np.array([1, 2, 9, 9, 3, 4, 5, 6, 9], dtype=np.uint16)  # documents of 2, 0 and 4 tokens
    assert doc_lengths([tokens], eot).tolist() == [2, 0, 4]
    assert doc_lengths([tokens[:2], tokens[2:5], tokens[5:]], eot).tolist() == [2, 0, 4]  # across shards
    lines = histogram(np.array([1, 2, 3, 900]))
    counts = [int(line.split(")")[1].split()[0]) for line in lines]
    assert counts == [1, 2, 1]  # [0, 2): 1, [2, 4): 2, [512, 1024): 1
