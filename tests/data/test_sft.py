"""SFT sets: records -> template -> tokens and masks on disk; bad records are counted."""

from __future__ import annotations

import itertools
import json
import re

import numpy as np

from euler_data import build_sft, render_chat
from euler_data.chat import alpaca_messages
from euler_data.sft import read_sft

ASSISTANT = re.compile(r"<\|assistant\|>\n(.*?)<\|end\|>", re.S)


def check_split(tok, folder, split):
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


def test_sft_set_masks_cover_exactly_the_responses(tok, tmp_path):
    say = lambda i: {"instruction": f"Say {i} twice.", "input": "" if i % 2 else "ok", "output": f"{i} {i}"}  # noqa: E731
    records = [say(i) for i in range(40)]
    lines = [json.dumps(r) for r in records] + ["{broken", json.dumps({"instruction": "x"})]
    lines.append(json.dumps(records[0]))
    lines.append(json.dumps({"instruction": "Empty answer", "output": "  "}))
    src = tmp_path / "sft.jsonl"
    src.write_text("\n".join(lines), encoding="utf-8")
    meta = build_sft([src], tmp_path / "out", tok, context=64, val_fraction=0.2, seed=1)
    assert meta["examples_in"] == 44
    expected = {"malformed_json": 1, "not_a_chat_record": 1, "duplicate": 1, "empty_response": 1}
    assert meta["dropped"] == expected
    assert meta["examples_kept"] == 40 == meta["train"]["examples"] + meta["val"]["examples"]
    assert meta["val"]["examples"] > 0
    seen = check_split(tok, tmp_path / "out", "train") + check_split(tok, tmp_path / "out", "val")
    assert sorted(seen) == sorted(render_chat(alpaca_messages(r)) for r in records)


def test_examples_longer_than_the_context_are_dropped(tok, tmp_path):
    src = tmp_path / "a.json"
    records = [{"instruction": "Short.", "output": "Yes."}, {"instruction": "Long " * 200, "output": "No."}]
    src.write_text(json.dumps(records), encoding="utf-8")
    meta = build_sft([src], tmp_path / "out", tok, context=48, val_fraction=0.0)
    assert meta["dropped"] == {"too_long": 1} and meta["train"]["examples"] == 1
    tokens, mask, offsets, _ = read_sft(tmp_path / "out", "train")
    assert offsets.tolist() == [0, len(tokens)] and len(tokens) <= 48
    assert mask.dtype == np.uint8 and tokens.dtype == np.uint16
