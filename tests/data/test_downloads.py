"""The real download path of the named sources, against a local HTTP server laid out like the sites.

``EULER_DATA_URL_BASE=http://127.0.0.1:PORT`` makes ``https://HOST/PATH`` come from
``http://127.0.0.1:PORT/HOST/PATH``; the server serves copies of the mirror's files there, and can
answer a path with an HTML page, a cut-off body or nothing at all (a stall).
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import duckdb
import pytest

from euler_data import Recipe, SourceSpec, network, prepare
from euler_data.errors import DataError
from euler_data.sources import ALPACA_URL, FINEWEB_HTTP_URL, GUTENBERG_URL, SHAKESPEARE_URL

pytestmark = pytest.mark.data
BOOKS = (844, 5200)  # the two smallest books of the mirror
FINEWEB_ROWS = 200  # rows of the stand-in FineWeb-Edu parquet file


def site_path(url: str) -> str:
    """Where the server keeps the file of a real-site URL: /HOST/PATH."""
    parts = urlparse(url)
    return f"/{parts.netloc}{parts.path}"


class Site(http.server.SimpleHTTPRequestHandler):
    """Serves the site folder; ``server.tricks[path]`` makes a path misbehave."""

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        trick = self.server.tricks.get(self.path)
        if trick == "stall":
            time.sleep(1.5)  # longer than the client's read timeout, then hang up
            return
        if trick == "html":
            self._send(b"<!DOCTYPE html><html><body>Please verify you are human</body></html>")
            return
        if trick == "truncate":
            body = Path(self.translate_path(self.path)).read_bytes()
            self._send(body[: len(body) // 2], length=len(body))  # then the connection closes
            return
        super().do_GET()

    def _send(self, body: bytes, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def fineweb_parquet(mirror: Path, dest: Path) -> None:
    """A FineWeb-Edu-like file: C4 texts (500+ characters, so never too short) with `score` (0.5, 1.5,
    ... cycling to 4.5) and `int_score`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(
        f"""COPY (SELECT text, (row_number() OVER () - 1) % 5 + 0.5 AS score,
                 CAST(round((row_number() OVER () - 1) % 5 + 0.5) AS INTEGER) AS int_score
            FROM read_json('{mirror / "web_text" / "c4_demo.jsonl"}') WHERE length(text) >= 500
            LIMIT {FINEWEB_ROWS})
        TO '{dest}' (FORMAT parquet)"""
    )
    con.close()


@pytest.fixture
def site(mirror: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A local stand-in for gutenberg.org, GitHub raw and Hugging Face; no mirror for prepare."""
    root = tmp_path / "site"
    manifest = json.loads((mirror / "gutenberg" / "manifest.json").read_text(encoding="utf-8"))
    files = {e["ebook_id"]: e["file"] for e in manifest}
    copies = {GUTENBERG_URL.format(id=b): mirror / "gutenberg" / files[b] for b in BOOKS}
    copies[ALPACA_URL] = mirror / "alpaca" / "alpaca_subset_2000_gumbelsoft.json"
    copies[SHAKESPEARE_URL] = mirror / "tinyshakespeare" / "input.txt"
    for url, src in copies.items():
        dest = root / site_path(url).lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    fineweb_parquet(mirror, root / site_path(FINEWEB_HTTP_URL).lstrip("/"))

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Site, directory=str(root)))
    server.daemon_threads = True
    server.requests, server.tricks, server.root = [], {}, root
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.delenv("EULER_DATA_OFFLINE", raising=False)
    monkeypatch.delenv("EULER_DATA_MIRROR", raising=False)
    monkeypatch.setenv(network.URL_BASE_ENV, f"http://127.0.0.1:{server.server_address[1]}")
    yield server
    server.shutdown()
    server.server_close()


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_named_sources_download_once_and_the_pipeline_runs(site, tmp_path, tok_path, decode_docs):
    books = "gutenberg:" + ",".join(map(str, BOOKS))
    sources = (
        SourceSpec(books),
        SourceSpec("alpaca"),
        SourceSpec("tinyshakespeare"),
        SourceSpec("fineweb-edu:100", min_score=2.0),
    )
    recipe = Recipe(sources=sources, tokenizer=str(tok_path))
    out = tmp_path / "ds"
    meta = prepare(recipe, out, quiet=True)

    cache = out / "downloads"
    expected = ["alpaca_data.json", "fineweb-edu-000_00000.parquet", "input.txt"]
    assert files_in(cache) == sorted(expected + [f"pg{b}.txt" for b in BOOKS])  # no .part left
    for url in (GUTENBERG_URL.format(id=BOOKS[0]), ALPACA_URL, SHAKESPEARE_URL, FINEWEB_HTTP_URL):
        served = (site.root / site_path(url).lstrip("/")).read_bytes()
        cached = cache / ("fineweb-edu-000_00000.parquet" if url == FINEWEB_HTTP_URL else Path(url).name)
        assert cached.read_bytes() == served
    urls = [GUTENBERG_URL.format(id=b) for b in BOOKS] + [ALPACA_URL, SHAKESPEARE_URL, FINEWEB_HTTP_URL]
    assert sorted(site.requests) == sorted(map(site_path, urls))  # each file fetched once

    per_source = meta["sources"]
    assert per_source["gutenberg"]["documents_in"] == 2
    assert per_source["alpaca"]["documents_in"] == 2000
    assert per_source["fineweb-edu"]["documents_in"] == 100  # ROWS caps the rows read
    assert per_source["fineweb-edu"]["dropped"]["low_score"] == 40  # scores 0.5 and 1.5 of 0.5..4.5
    assert meta["documents_in"] == meta["documents_kept"] + sum(meta["dropped"].values())
    docs = decode_docs(out, "train") + decode_docs(out, "val")
    assert any("ROMEO" in d for d in docs) and sum(meta["tokens"].values()) > 100_000

    # A second run reads the cache: the server sees no new request.
    before = len(site.requests)
    prepare(recipe, tmp_path / "ds", quiet=True)
    assert len(site.requests) == before


def one_line(err: pytest.ExceptionInfo, *parts: str) -> str:
    text = str(err.value)
    assert "\n" not in text
    for part in parts:
        assert part in text, (part, text)
    return text


def test_a_missing_book_names_the_source_and_the_url(site, tmp_path, tok_path):
    out = tmp_path / "ds"
    recipe = Recipe(sources=(SourceSpec("gutenberg:999999"),), tokenizer=str(tok_path))
    with pytest.raises(DataError) as err:
        prepare(recipe, out, quiet=True)
    url = network.site_url(GUTENBERG_URL.format(id=999999))
    one_line(err, "gutenberg:999999", url, "404")
    assert files_in(out / "downloads") == []


def test_the_cli_prints_the_download_error_on_one_line(site, tmp_path, capsys):
    from euler_data.cli import main

    site.tricks[site_path(SHAKESPEARE_URL)] = "html"
    code = main(["prepare", "--source", "tinyshakespeare", "--out", str(tmp_path / "ds"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert err.count("tinyshakespeare") >= 1 and network.site_url(SHAKESPEARE_URL) in err
    assert "an HTML page" in err


def test_a_stalled_server_times_out(site, tmp_path, tok_path, monkeypatch):
    monkeypatch.setattr(network, "DOWNLOAD_TIMEOUT_S", 0.3)
    site.tricks[site_path(ALPACA_URL)] = "stall"
    out = tmp_path / "ds"
    start = time.perf_counter()
    with pytest.raises(DataError) as err:
        prepare(Recipe(sources=(SourceSpec("alpaca"),), tokenizer=str(tok_path)), out, quiet=True)
    assert time.perf_counter() - start < 1.4  # gave up before the server did
    one_line(err, "alpaca", network.site_url(ALPACA_URL), "timed out")
    assert files_in(out / "downloads") == []


def test_a_truncated_download_is_not_cached_and_a_retry_succeeds(site, tmp_path, tok_path):
    site.tricks[site_path(SHAKESPEARE_URL)] = "truncate"
    out = tmp_path / "ds"
    recipe = Recipe(sources=(SourceSpec("tinyshakespeare"),), tokenizer=str(tok_path))
    with pytest.raises(DataError) as err:
        prepare(recipe, out, quiet=True)
    size = (site.root / site_path(SHAKESPEARE_URL).lstrip("/")).stat().st_size
    one_line(err, "tinyshakespeare", network.site_url(SHAKESPEARE_URL), f"{size // 2} of {size} bytes")
    assert files_in(out / "downloads") == []
    del site.tricks[site_path(SHAKESPEARE_URL)]
    meta = prepare(recipe, out, quiet=True)
    assert files_in(out / "downloads") == ["input.txt"] and meta["documents_kept"] == 1


@pytest.mark.parametrize(
    ("spec", "url", "damage", "problem"),
    [
        ("alpaca", ALPACA_URL, lambda b: b[: len(b) // 3], "not valid JSON"),
        ("fineweb-edu", FINEWEB_HTTP_URL, lambda b: b[:-100], "not a whole parquet file"),
        (f"gutenberg:{BOOKS[0]}", GUTENBERG_URL.format(id=BOOKS[0]), lambda b: b"\xff\xfe" + b, "not UTF-8"),
    ],
    ids=["alpaca-json", "fineweb-parquet", "gutenberg-bytes"],
)
def test_a_corrupt_file_is_detected_and_not_cached(site, tmp_path, tok_path, spec, url, damage, problem):
    served = site.root / site_path(url).lstrip("/")
    served.write_bytes(damage(served.read_bytes()))  # whole transfer, bad content
    out = tmp_path / "ds"
    with pytest.raises(DataError) as err:
        prepare(Recipe(sources=(SourceSpec(spec),), tokenizer=str(tok_path)), out, quiet=True)
    one_line(err, spec, network.site_url(url), problem, "nothing was cached")
    assert files_in(out / "downloads") == []


def test_an_unreachable_server_is_reported_without_waiting(site, tmp_path, monkeypatch):
    monkeypatch.setenv(network.URL_BASE_ENV, "http://127.0.0.1:9")  # the discard port: refused
    network._reachable.cache_clear()
    with pytest.raises(DataError) as err:
        prepare(Recipe(sources=(SourceSpec("gutenberg:11"),)), tmp_path / "ds", quiet=True)
    url = "http://127.0.0.1:9/www.gutenberg.org/cache/epub/11/pg11.txt"
    one_line(err, "gutenberg:11", url, "cannot be reached")


def test_without_the_setting_urls_point_at_the_real_sites(monkeypatch):
    monkeypatch.delenv(network.URL_BASE_ENV, raising=False)
    assert network.site_url(GUTENBERG_URL.format(id=11)) == "https://www.gutenberg.org/cache/epub/11/pg11.txt"
    assert network.site_url(ALPACA_URL).startswith("https://raw.githubusercontent.com/tatsu-lab/")
    assert network.site_url(FINEWEB_HTTP_URL).startswith("https://huggingface.co/datasets/HuggingFaceFW/")
