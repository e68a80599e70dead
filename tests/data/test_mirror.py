"""The whole pipeline on the real-data mirror: books, web text (jsonl, json.gz, parquet), Alpaca."""

from __future__ import annotations

import json
import shutil

import duckdb
import pytest

from euler_data import Recipe, SourceSpec, build_sft, prepare, render_chat
from euler_data.chat import alpaca_messages
from euler_data.db import connect
from euler_data.ingest import ingest
from euler_data.sources import resolve

pytestmark = pytest.mark.data
BOOKS = "gutenberg:46,11,844,5200,35"


@pytest.fixture(scope="module")
def prepared(mirror, tmp_path_factory):
    """prepare over books, C4 jsonl + parquet + json.gz, Alpaca, and a source of planted duplicates."""
    tmp = tmp_path_factory.mktemp("mirror")
    lines = (mirror / "web_text" / "c4_demo.jsonl").read_text(encoding="utf-8").splitlines()
    (tmp / "c4_head.jsonl").write_text("\n".join(lines[:150]) + "\n", encoding="utf-8")
    (tmp / "c4_tail.jsonl").write_text("\n".join(lines[150:]) + "\n", encoding="utf-8")
    con = duckdb.connect()
    jsonl, parquet = tmp / "c4_tail.jsonl", tmp / "c4_tail.parquet"
    con.execute(f"COPY (SELECT text FROM read_json('{jsonl}')) TO '{parquet}' (FORMAT parquet)")
    con.close()  # no DuckDB threads alive when prepare forks its encoding workers
    (tmp / "olmo").mkdir()
    for gz in sorted((mirror / "web_text").glob("*.json.gz")):
        shutil.copy(gz, tmp / "olmo" / gz.name)
    (tmp / "planted").mkdir()
    shutil.copy(mirror / "gutenberg" / "pg46.txt", tmp / "planted" / "carol_copy.txt")  # exact duplicate
    first = json.loads(lines[0])["text"]
    dupes = [lines[1], lines[2], json.dumps({"text": first.upper()})]  # 2 exact, 1 near (case)
    (tmp / "planted" / "c4_again.jsonl").write_text("\n".join(dupes) + "\n", encoding="utf-8")
    sources = (
        SourceSpec(BOOKS),
        SourceSpec(str(tmp / "c4_head.jsonl"), name="c4_jsonl"),
        SourceSpec(str(tmp / "c4_tail.parquet"), name="c4_parquet"),
        SourceSpec(str(tmp / "olmo"), name="olmo"),
        SourceSpec("alpaca"),
        SourceSpec(str(tmp / "planted"), name="planted"),
    )
    out = tmp / "out"
    recipe = Recipe(sources=sources, vocab_size=512, tokenizer_sample_bytes=1_000_000)
    meta = prepare(recipe, out, mirror=mirror, quiet=True, keep_intermediate=True)  # the tests read `clean`
    return out, meta


def test_accounting_and_planted_duplicates(prepared):
    _, meta = prepared
    assert meta["documents_in"] == meta["documents_kept"] + sum(meta["dropped"].values())
    counts = {name: s["documents_in"] for name, s in meta["sources"].items()}
    assert counts == {
        "gutenberg": 5,
        "c4_jsonl": 150,
        "c4_parquet": 150,
        "olmo": 30,
        "alpaca": 2000,
        "planted": 4,
    }
    planted = meta["sources"]["planted"]
    assert planted["documents_in"] == 4 and planted["documents_kept"] == 0
    assert planted["dropped"] == {"duplicate": 3, "near_duplicate": 1}


def test_shards_decode_to_the_cleaned_kept_documents(prepared, decode_docs):
    out, _ = prepared
    train, val = decode_docs(out, "train"), decode_docs(out, "val")
    con = duckdb.connect(str(out / "pipeline.duckdb"), read_only=True)
    kept = con.execute(
        "SELECT c.text FROM clean c JOIN deduped d USING (doc_id) WHERE d.reason IS NULL"
    ).fetchall()
    con.close()
    assert sorted(train + val) == sorted(t for (t,) in kept)
    assert val and not set(val) & set(train)


def test_gutenberg_boilerplate_is_gone_and_the_story_is_kept(prepared, decode_docs):
    out, _ = prepared
    docs = decode_docs(out, "train") + decode_docs(out, "val")
    carol = [d for d in docs if "MARLEY was dead: to begin with." in d]
    assert len(carol) == 1  # kept once, its planted copy dropped
    for doc in docs:
        assert "*** START OF" not in doc and "*** END OF" not in doc
        assert "Project Gutenberg-tm" not in doc and "\r" not in doc and "\ufeff" not in doc


def test_clean_strips_every_mirror_book(mirror, tmp_path):
    manifest = json.loads((mirror / "gutenberg" / "manifest.json").read_text(encoding="utf-8"))
    ids = ",".join(str(e["ebook_id"]) for e in manifest)
    recipe = Recipe(sources=(SourceSpec(f"gutenberg:{ids}"),))
    con = connect(tmp_path)
    ingest(con, recipe, {"gutenberg": resolve(recipe.sources[0], mirror, tmp_path)}, tmp_path)
    from euler_data.clean import clean

    assert clean(con) == len(manifest)
    rows = con.execute("SELECT text FROM clean").fetchall()
    con.close()
    for (text,) in rows:
        assert "PROJECT GUTENBERG EBOOK" not in text.upper()[:2000] + text.upper()[-2000:]
        assert len(text) > 100_000


def test_tinyshakespeare_splits_by_position(mirror, tok_path, tmp_path, decode_docs):
    recipe = Recipe(sources=(SourceSpec("tinyshakespeare"),), tokenizer=str(tok_path), val_fraction=0.1)
    meta = prepare(recipe, tmp_path / "out", mirror=mirror, quiet=True)
    (train,), (val,) = decode_docs(tmp_path / "out", "train"), decode_docs(tmp_path / "out", "val")
    text = (mirror / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8").strip()
    assert train + val == text and len(train) == int(len(text) * 0.9)
    assert train.startswith("First Citizen:") and meta["bytes"]["val"] == len(val.encode())


def test_sft_on_the_mirror_alpaca_masks_exactly_the_responses(mirror, tok, tmp_path, check_sft_split):
    path = mirror / "alpaca" / "alpaca_subset_2000_gumbelsoft.json"
    meta = build_sft([path], tmp_path, tok, context=4096, val_fraction=0.05)
    assert meta["examples_in"] == 2000 == meta["examples_kept"] + sum(meta["dropped"].values())
    seen = check_sft_split(tok, tmp_path, "train") + check_sft_split(tok, tmp_path, "val")
    records = json.loads(path.read_text(encoding="utf-8"))
    assert set(seen) <= {render_chat(alpaca_messages(r)) for r in records}
    assert len(seen) == meta["examples_kept"] and meta["val"]["examples"] > 50


def test_tinystories_cut_at_endoftext_markers(mirror, tok_path, tmp_path, decode_docs):
    path = mirror / "tinystories" / "TinyStories-train_first2MiB.txt"
    recipe = Recipe(sources=(SourceSpec(f"{path}", docs="eot"),), tokenizer=str(tok_path), val_fraction=0.05)
    meta = prepare(recipe, tmp_path / "out", mirror=mirror, quiet=True)
    raw = path.read_text(encoding="utf-8")
    stories = [s.strip() for s in raw.split("<|endoftext|>") if s.strip()]
    assert meta["documents_in"] == len(stories) == 2317
    docs = decode_docs(tmp_path / "out", "train") + decode_docs(tmp_path / "out", "val")
    assert len(docs) == meta["documents_kept"] and all("<|endoftext|>" not in d for d in docs)
    assert set(docs) <= set(stories)
    assert meta["documents_in"] == meta["documents_kept"] + sum(meta["dropped"].values())
