"""``prepare``: run every stage in order over ``DIR/pipeline.duckdb`` and write the dataset folder.

>>> meta = prepare(Recipe(sources=(SourceSpec("tinyshakespeare"),)), "out", mirror="mirror")  # doctest: +SKIP
>>> sorted(p.name for p in Path("out").iterdir())  # doctest: +SKIP
['meta.json', 'pipeline.duckdb', 'tokenizer.json', 'train.bin', 'val.bin']
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from euler_bpe.progress import progress_stream
from euler_data import clean, dedup, filters, ingest, mix, shards, split
from euler_data import tokenizer as tokenizer_stage
from euler_data.counts import build_meta
from euler_data.db import connect
from euler_data.errors import DataError
from euler_data.meta import write_meta
from euler_data.network import resolve_mirror
from euler_data.raw_bytes import bytes_sql
from euler_data.recipe import Recipe
from euler_data.sft import SFT_META, sft_files
from euler_data.sources import resolve

STAGES = ("ingest", "clean", "filter", "dedup", "split", "mix", "tokenizer", "tokenize")


def check_sources(recipe: Recipe) -> None:
    if not recipe.sources:
        raise DataError("prepare", "no sources: pass --source SPEC or a recipe with [[source]] entries")
    twice = [label for label, n in Counter(s.label for s in recipe.sources).items() if n > 1]
    if twice:
        raise DataError("prepare", f"two sources are named {twice}; give them distinct `name`s")


def _tokenizer(con, recipe: Recipe):
    """Stage 7 when no tokenizer was given (a given one is loaded before any stage runs)."""
    return tokenizer_stage.train_tokenizer(con, recipe.vocab_size, recipe.tokenizer_sample_bytes)


def _dedup(con, recipe: Recipe) -> int:
    kept = dedup.dedup(con, recipe.filter.near_dedup)
    if recipe.filter.minhash_threshold is not None:
        kept = dedup.drop_similar(con, recipe.filter.minhash_threshold)
    return kept


def _text_bytes(con, table: str) -> int:
    nbytes = bytes_sql("t.text", "s.raw")  # a raw source's stored text has one character per byte
    query = f"SELECT coalesce(sum({nbytes}), 0) FROM {table} t JOIN sources s USING (source)"
    return int(con.execute(query).fetchone()[0])


def _stage_bytes(con, name: str, recipe: Recipe) -> int:
    """UTF-8 bytes of the text a stage read: its throughput denominator."""
    table = {"ingest": "raw", "clean": "raw", "filter": "clean", "dedup": "filtered"}.get(name, "pieces")
    nbytes = _text_bytes(con, table)
    if name == "tokenizer":  # trained on a sample, or only loaded
        return 0 if recipe.tokenizer else min(nbytes, recipe.tokenizer_sample_bytes)
    return nbytes


def run_stages(state: dict[str, Any], recipe: Recipe, inputs, out: Path, quiet: bool) -> dict:
    """Run the stages in order over ``state["con"]``; fills ``state`` and returns per-stage timings."""
    timings: dict[str, dict[str, float]] = {}
    bar = tqdm(total=len(STAGES), desc="prepare", unit="stage", disable=quiet, file=progress_stream())
    con = lambda: state["con"]  # noqa: E731  (tokenize reopens the connection)
    steps = {
        "ingest": lambda: ingest.ingest(con(), recipe, inputs, out),
        "clean": lambda: clean.clean(con()),
        "filter": lambda: filters.filter_docs(con(), recipe.filter),
        "dedup": lambda: _dedup(con(), recipe),
        "split": lambda: split.split(con(), recipe.val_fraction, recipe.seed),
        "mix": lambda: mix.mix(con(), recipe.seed),
        "tokenizer": lambda: state["tok"] or state.update(tok=_tokenizer(con(), recipe)),  # given: loaded
        "tokenize": lambda: state.setdefault("tokens", _tokenize(state, out, recipe, quiet)),
    }
    for name in STAGES:
        bar.set_postfix_str(name)
        start = time.perf_counter()
        steps[name]()
        seconds = time.perf_counter() - start
        mb = _stage_bytes(con(), name, recipe) / 1e6
        timings[name] = {"seconds": round(seconds, 3), "mb": round(mb, 3), "mb_per_s": round(mb / seconds, 2)}
        bar.update(1)
    bar.close()
    return timings


def _tokenize(state: dict[str, Any], out: Path, recipe: Recipe, quiet: bool) -> dict[str, int]:
    """Encode with DuckDB closed (its threads must not be running when the workers fork), then write."""
    total = _text_bytes(state["con"], "pieces")
    state["con"].close()
    bar = tqdm(total=total, desc="tokenize", unit="B", unit_scale=True, disable=quiet, file=progress_stream())
    with bar:
        index = shards.encode_pieces(out, state["tok"], recipe.workers, bar)
    state["con"] = connect(out)
    return shards.tokenize(state["con"], index, state["tok"], out)


def prepare(recipe: Recipe, out: str | Path, mirror: str | Path | None = None, quiet: bool = False) -> dict:
    """Run ingest -> clean -> filter -> dedup -> split -> mix -> tokenizer -> tokenize; returns meta."""
    check_sources(recipe)
    out = Path(out)
    mirror_path = resolve_mirror(mirror)
    inputs = {s.label: resolve(s, mirror_path, out / "downloads") for s in recipe.sources}
    given = tokenizer_stage.load_tokenizer(recipe.tokenizer) if recipe.tokenizer else None  # fail early
    out.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"con": connect(out)}
    state["tok"] = given
    try:
        timings = run_stages(state, recipe, inputs, out, quiet)
        tok, tokens, con = state["tok"], state["tokens"], state["con"]
        tok.save(out / "tokenizer.json")
        extra = {
            "context_hint": recipe.context_hint,
            "seed": recipe.seed,
            "val_fraction": recipe.val_fraction,
        }
        meta = build_meta(con, tok, {**extra, "stages": timings, "recipe": recipe.to_dict()})
    finally:
        state["con"].close()
    if meta["tokens"] != tokens:  # the per-source counts must add up to the bins
        raise RuntimeError(f"prepare: meta.json tokens {meta['tokens']} != tokens written {tokens}")
    write_meta(out, meta)
    _drop_stale_sft(out, tok.fingerprint)
    return meta


def _drop_stale_sft(folder: Path, fingerprint: str) -> None:
    """An SFT set built with another tokenizer no longer fits the folder's new tokenizer.json: remove it."""
    meta = folder / SFT_META
    if (
        meta.is_file()
        and json.loads(meta.read_text(encoding="utf-8")).get("tokenizer_fingerprint") != fingerprint
    ):
        for path in sft_files(folder):
            path.unlink()
        print(
            f"euler-data prepare: removed the SFT set in {folder}: it was built with the previous tokenizer "
            "(run `euler-data sft` again)",
            file=sys.stderr,
        )
