"""SFT sets: records -> template -> tokens and masks on disk; bad records are counted."""

from __future__ import annotations

import json

import numpy as np

from euler_data import build_sft, render_chat
from euler_data.chat import alpaca_messages
from euler_data.sft import read_sft


def test_sft_set_masks_cover_exactly_the_responses(tok, tmp_path, check_sft_split):
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
    seen = check_sft_split(tok, tmp_path / "out", "train") + check_sft_split(tok, tmp_path / "out", "val")
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


def test_message_records_with_a_system_turn(tok, tmp_path, check_sft_split):
    system = {"role": "system", "content": "Answer in one word."}
    records = [
        {
            "messages": [
                system,
                {"role": "user", "content": f"Colour {i}?"},
                {"role": "assistant", "content": "Blue"},
            ]
        }
        for i in range(6)
    ]
    records.append(
        {"messages": [{"role": "user", "content": "Hi"}, system, {"role": "assistant", "content": "x"}]}
    )
    src = tmp_path / "chat.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    meta = build_sft([src], tmp_path / "out", tok, context=64, val_fraction=0.0)
    assert meta["examples_kept"] == 6 and meta["dropped"] == {"not_a_chat_record": 1}  # system not first
    rendered = check_sft_split(tok, tmp_path / "out", "train")  # the mask: the replies only
    assert rendered == [render_chat(r["messages"]) for r in records[:6]]
    assert all(text.startswith("<|user|>\nAnswer in one word.\n\nColour ") for text in rendered)
