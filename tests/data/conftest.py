"""Fixtures for euler-data tests: a small chat tokenizer and a synthetic corpus with planted problems."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from euler_bpe import CHAT_SPECIAL_TOKENS, Tokenizer
from euler_data.meta import split_paths
from euler_data.sft import read_sft

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there one all we their been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do first any "
    "my now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take three"
).split()


def prose(seed: int, words: int = 400) -> str:
    """Deterministic English-like text: sentences of common words, paragraphs split by blank lines."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(max(1, words // 10)):
        chosen = rng.choice(WORDS, size=int(rng.integers(6, 15)))
        sentences.append(" ".join(chosen).capitalize() + ".")
    paras = [" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5)]
    return "\n\n".join(paras)


def gutenberg_wrap(title: str, body: str) -> str:
    """A body inside a Project Gutenberg header and footer."""
    header = (
        f"The Project Gutenberg EBook of {title}\n\nThis eBook is for the use of anyone anywhere.\n\n"
        f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\n\n\n"
    )
    footer = f"\n\n\nEnd of the Project Gutenberg EBook of {title}\n\n"
    footer += "*** END OF THIS PROJECT GUTENBERG EBOOK ***\nlicense terms"
    return header + body + footer


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never touch the network."""
    monkeypatch.setenv("EULER_DATA_OFFLINE", "1")


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    """A small byte-level BPE with the chat special tokens."""
    text = "\n\n".join(prose(s, 300) for s in range(20))
    return Tokenizer.train([text], vocab_size=400, special_tokens=CHAT_SPECIAL_TOKENS)


@pytest.fixture(scope="session")
def tok_path(tmp_path_factory: pytest.TempPathFactory, tok: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(path)
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> dict:
    """Files with known contents and known problems; returns paths and the expected drops."""
    root = tmp_path / "corpus"
    (root / "books").mkdir(parents=True)
    book_a, book_b = prose(1, 600), prose(2, 600)
    (root / "books" / "a.txt").write_text(gutenberg_wrap("Book A", book_a), encoding="utf-8")
    raw_b = "\ufeff" + book_b.replace("\n", "\r\n").replace("Of", "O\x07f")  # BOM, CRLF, a control char
    (root / "books" / "b.txt").write_bytes(raw_b.encode("utf-8"))
    good = [prose(100 + i, 60) for i in range(8)]
    good[3] += " A page may quote <|endoftext|> or <|user|> as plain text."  # must stay text
    lines = [json.dumps({"text": t, "score": 3.5}) for t in good]
    lines += [
        "{this is not json",  # malformed_json
        json.dumps({"title": "no text here"}),  # no_text
        json.dumps({"text": "tiny", "score": 4.0}),  # too_short
        json.dumps({"text": good[0], "score": 3.5}),  # duplicate
        json.dumps({"text": good[1].upper().replace(".", " !"), "score": 3.5}),  # near_duplicate
        json.dumps({"text": prose(200, 60), "score": 1.0}),  # low_score
        json.dumps({"text": " ".join(["1234 5678 %%%% ####"] * 40), "score": 3.0}),  # not_prose
        json.dumps({"text": "   \n  ", "score": 3.0}),  # empty after cleaning
    ]
    data = ("\n".join(lines) + "\n").encode("utf-8") + b'{"text": "bad \xff\xfe bytes"}\n'  # not_utf8
    (root / "web.jsonl").write_bytes(data)
    expected_drops = {
        "malformed_json": 1,
        "no_text": 1,
        "too_short": 1,
        "duplicate": 1,
        "near_duplicate": 1,
        "low_score": 1,
        "not_prose": 1,
        "empty": 1,
        "not_utf8": 1,
    }
    kept = {"books": [book_a, book_b.replace("Of", "Of")], "web": good}
    return {"root": root, "expected_drops": expected_drops, "kept": kept, "documents_in": 2 + len(lines) + 1}


def _decode_docs(folder: Path, split: str) -> list[str]:
    """The documents of a split (its bin, or its shards end to end), decoded: split at ``<|endoftext|>``."""
    tok = Tokenizer.load(folder / "tokenizer.json")
    eot = tok.special_tokens["<|endoftext|>"]
    data = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in split_paths(folder, split)])
    assert len(data) == 0 or data[-1] == eot, "a bin must end with <|endoftext|>"
    ends = np.flatnonzero(data == eot)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    return [tok.decode(data[s:e].tolist(), errors="strict") for s, e in zip(starts, ends)]


@pytest.fixture(scope="session")
def decode_docs():
    """``decode_docs(folder, split) -> list[str]``."""
    return _decode_docs


ASSISTANT = re.compile(r"<\|assistant\|>\n(.*?)<\|end\|>", re.S)


def _check_sft_split(tok, folder, split):
    """Every example: decodes to a rendered chat, and its masked tokens are the replies + <|end|>."""
    tokens, mask, offsets, _ = read_sft(folder, split)
    rendered = []
    for lo, hi in itertools.pairwise(offsets):
        ids, m = tokens[lo:hi].tolist(), mask[lo:hi]
        text = tok.decode(ids, errors="strict")
        replies = "".join(r + "<|end|>" for r in ASSISTANT.findall(text))
        assert tok.decode([i for i, k in zip(ids, m) if k], errors="strict") == replies
        assert m[-1] == 1 and ids[-1] == tok.special_tokens["<|end|>"]
        rendered.append(text)
    return rendered


@pytest.fixture(scope="session")
def check_sft_split():
    """``check_sft_split(tok, folder, split) -> rendered texts``, asserting the mask of every example."""
    return _check_sft_split
