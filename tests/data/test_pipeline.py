"""prepare on a synthetic corpus with planted problems: accounting, losslessness, split, mixing, errors."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from euler_bpe import Tokenizer
from euler_data import DataError, FilterConfig, Recipe, SourceSpec, prepare


def _recipe(corpus: dict, tok_path: Path | None = None, **kw) -> Recipe:
    root = corpus["root"]
    sources = kw.pop("sources", None) or (
        SourceSpec(str(root / "books"), name="books", weight=kw.pop("book_weight", 1.0)),
        SourceSpec(str(root / "web.jsonl"), name="web", min_score=2.0, weight=kw.pop("web_weight", 1.0)),
    )
    return Recipe(sources=sources, tokenizer=str(tok_path) if tok_path else None, vocab_size=300, **kw)


def test_accounting_balances_and_every_reason_is_counted(corpus, tok_path, tmp_path):
    meta = prepare(_recipe(corpus, tok_path), tmp_path / "out", quiet=True)
    assert meta["documents_in"] == corpus["documents_in"]
    assert meta["dropped"] == corpus["expected_drops"]
    assert meta["documents_in"] == meta["documents_kept"] + sum(meta["dropped"].values())
    per_source = meta["sources"]
    assert sum(s["documents_in"] for s in per_source.values()) == meta["documents_in"]


def test_shards_decode_to_the_cleaned_kept_documents(corpus, tmp_path, decode_docs):
    out = tmp_path / "out"
    meta = prepare(_recipe(corpus, None), out, quiet=True)  # trains its own tokenizer
    train, val = decode_docs(out, "train"), decode_docs(out, "val")
    expected = corpus["kept"]["books"] + corpus["kept"]["web"]
    assert sorted(train + val) == sorted(expected)
    assert val and not set(val) & set(train)
    sizes = {s: len(np.fromfile(out / f"{s}.bin", dtype=np.uint16)) for s in ("train", "val")}
    assert meta["tokens"] == sizes
    assert meta["bytes"]["train"] == sum(len(d.encode()) for d in train)
    assert meta["bytes"]["val"] == sum(len(d.encode()) for d in val)
    assert Tokenizer.load(out / "tokenizer.json").fingerprint == meta["tokenizer_fingerprint"]


def test_same_recipe_gives_identical_shards_and_the_seed_changes_them(corpus, tok_path, tmp_path):
    prepare(_recipe(corpus, tok_path), tmp_path / "a", quiet=True)
    prepare(_recipe(corpus, tok_path), tmp_path / "b", quiet=True)
    prepare(_recipe(corpus, tok_path, seed=7), tmp_path / "c", quiet=True)
    read = lambda d: (d / "train.bin").read_bytes() + b"|" + (d / "val.bin").read_bytes()  # noqa: E731
    assert read(tmp_path / "a") == read(tmp_path / "b")
    assert read(tmp_path / "a") != read(tmp_path / "c")


def test_weights_repeat_train_documents_but_not_val(corpus, tok_path, tmp_path, decode_docs):
    out = tmp_path / "out"
    prepare(_recipe(corpus, tok_path, web_weight=2.0, book_weight=0.0), out, quiet=True)
    train, val = Counter(decode_docs(out, "train")), decode_docs(out, "val")
    web = set(corpus["kept"]["web"])
    assert all(train[d] == 2 for d in web - set(val))
    assert not set(corpus["kept"]["books"]) & set(train)  # weight 0 drops them from train
    assert len(val) == len(set(val))


def test_parquet_source_read_by_duckdb(corpus, tok_path, tmp_path, decode_docs):
    web = corpus["root"] / "web.jsonl"
    pq = tmp_path / "web.parquet"
    good = [json.loads(line) for line in web.read_bytes().split(b"\n")[:8]]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (text VARCHAR, score DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [[g["text"], g["score"]] for g in good] + [[None, 1.0]])
    con.execute(f"COPY t TO '{pq}' (FORMAT parquet)")
    con.close()
    recipe = _recipe(corpus, tok_path, sources=(SourceSpec(str(pq), min_score=2.0),))
    meta = prepare(recipe, tmp_path / "out", quiet=True)
    assert meta["documents_in"] == 9 and meta["dropped"] == {"no_text": 1}
    docs = decode_docs(tmp_path / "out", "train") + decode_docs(tmp_path / "out", "val")
    assert sorted(docs) == sorted(corpus["kept"]["web"])


def test_parquet_without_a_text_column_is_a_clear_error(tok_path, tmp_path):
    pq = tmp_path / "no_text.parquet"
    duckdb.connect().execute(f"COPY (SELECT 'x' AS body, 1 AS id) TO '{pq}' (FORMAT parquet)")
    with pytest.raises(DataError, match=r"no_text\.parquet: no 'text' column \(columns: body, id\)"):
        prepare(Recipe(sources=(SourceSpec(str(pq)),), tokenizer=str(tok_path)), tmp_path / "out", quiet=True)


def test_enormous_documents_are_dropped_with_or_without_reading(corpus, tok_path, tmp_path):
    # 1000: the cleaned books (~3 kB) fail the SQL length filter; 500: files > 2000 bytes are not even read
    for max_chars in (1000, 500):
        recipe = _recipe(corpus, tok_path, filter=FilterConfig(max_chars=max_chars))
        meta = prepare(recipe, tmp_path / f"out{max_chars}", quiet=True)
        assert meta["sources"]["books"]["dropped"] == {"too_long": 2}
        assert meta["documents_in"] == meta["documents_kept"] + sum(meta["dropped"].values())


def test_position_split_cuts_one_document_nanogpt_style(tok_path, tmp_path, decode_docs):
    text = "\n".join(f"Line number {i} of a long single play, with words." for i in range(500))
    (tmp_path / "play.txt").write_text(text, encoding="utf-8")
    source = SourceSpec(str(tmp_path / "play.txt"), split="position")
    recipe = Recipe(sources=(source,), tokenizer=str(tok_path))
    prepare(recipe, tmp_path / "out", quiet=True)
    (train,), (val,) = decode_docs(tmp_path / "out", "train"), decode_docs(tmp_path / "out", "val")
    assert train + val == text
    assert len(train) == int(len(text) * 0.9)


def test_tokenizer_vocab_beyond_uint16_is_refused(corpus, tmp_path):
    big = Tokenizer.byte_level(["<|endoftext|>"] + [f"<|s{i}|>" for i in range(65_300)])
    big.save(tmp_path / "big.json")
    with pytest.raises(DataError, match=r"big\.json: vocab_size 65557 exceeds 65536"):
        prepare(_recipe(corpus, tmp_path / "big.json"), tmp_path / "out", quiet=True)


def test_stages_are_tables_that_can_be_inspected_and_rerun(corpus, tok_path, tmp_path):
    from euler_data import clean, dedup, filters

    out = tmp_path / "out"
    meta = prepare(_recipe(corpus, tok_path), out, quiet=True, keep_intermediate=True)
    con = duckdb.connect(str(out / "pipeline.duckdb"))
    tables = {t for (t,) in con.execute("SHOW TABLES").fetchall()}
    assert {"raw", "clean", "filtered", "deduped", "pieces", "mixed", "tokenized", "sources"} <= tables
    before = con.execute("SELECT doc_id, reason FROM deduped ORDER BY doc_id").fetchall()
    clean.clean(con)
    filters.filter_docs(con, FilterConfig())
    assert dedup.dedup(con) == meta["documents_kept"]
    assert con.execute("SELECT doc_id, reason FROM deduped ORDER BY doc_id").fetchall() == before


def test_minhash_drops_similar_documents_that_hashing_misses(corpus, tok_path, tmp_path, decode_docs):
    base = corpus["kept"]["web"]
    edited = base[0].replace(".", ";", 1)  # the same text but one punctuation mark: the normal form matches
    reworded = base[1][:-40] + " and then something else entirely happened here."  # only the tail differs
    lines = [json.dumps({"text": t}) for t in [base[0], base[1], base[2], edited, reworded]]
    (tmp_path / "w.jsonl").write_text("\n".join(lines), encoding="utf-8")
    sources = (SourceSpec(str(tmp_path / "w.jsonl")),)
    plain = prepare(Recipe(sources=sources, tokenizer=str(tok_path)), tmp_path / "a", quiet=True)
    assert plain["dropped"] == {"near_duplicate": 1}  # the reworded one slips through plain hashing
    recipe = Recipe(sources=sources, tokenizer=str(tok_path), filter=FilterConfig(minhash_threshold=0.5))
    meta = prepare(recipe, tmp_path / "b", quiet=True)
    assert meta["dropped"] == {"near_duplicate": 1, "similar": 1}
    docs = decode_docs(tmp_path / "b", "train") + decode_docs(tmp_path / "b", "val")
    assert sorted(docs) == sorted(base[:3])


record = st.one_of(
    st.lists(
        st.sampled_from(["the", "cat", "sat", "on", "a", "mat", "and", "ran"]), min_size=1, max_size=90
    ).map(lambda words: json.dumps({"text": " ".join(words).capitalize() + "."})),
    st.just("{not json"),
    st.just(json.dumps({"title": "no text"})),
    st.just(json.dumps({"text": "  \n "})),
    st.text(st.characters(blacklist_categories=["Cs"]), max_size=30).map(lambda t: json.dumps({"text": t})),
)


@settings(max_examples=12, deadline=None)
@given(lines=st.lists(record, max_size=25), bad_bytes=st.booleans())
def test_accounting_always_balances(tok_path, decode_docs, lines, bad_bytes):
    with tempfile.TemporaryDirectory() as tmp:
        data = "\n".join(lines).encode("utf-8") + (b'\n{"text": "\xff\xfe"}' if bad_bytes else b"")
        (Path(tmp) / "r.jsonl").write_bytes(data)
        recipe = Recipe(sources=(SourceSpec(str(Path(tmp) / "r.jsonl")),), tokenizer=str(tok_path))
        n_in = sum(1 for line in data.split(b"\n") if line.strip())
        try:
            meta = prepare(recipe, Path(tmp) / "out", quiet=True)
        except DataError as err:  # every record dropped: refused, and nothing left behind
            assert (
                f"kept 0 of {n_in} documents" in str(err) and not (Path(tmp) / "out" / "meta.json").exists()
            )
            return
        assert meta["documents_in"] == n_in == meta["documents_kept"] + sum(meta["dropped"].values())
        docs = decode_docs(Path(tmp) / "out", "train") + decode_docs(Path(tmp) / "out", "val")
        assert len(docs) == meta["documents_kept"] == len(set(docs))
        texts = {json.loads(line).get("text") for line in lines if line.startswith('{"text"')}
        assert all(any(d in t for t in texts if isinstance(t, str)) for d in docs)  # cleaned text of an input


def test_encoding_in_many_small_batches_gives_the_same_shards(corpus, tok_path, tmp_path, monkeypatch):
    from euler_data import shards

    prepare(_recipe(corpus, tok_path), tmp_path / "one", quiet=True)
    monkeypatch.setattr(shards, "BATCH_CHARS", 700)  # a few pieces per encode_batch call
    meta = prepare(_recipe(corpus, tok_path), tmp_path / "many", quiet=True)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes()
    assert not (tmp_path / "many" / shards.SCRATCH).exists() and meta["documents_kept"] == 10
