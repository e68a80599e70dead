"""Preference sets: HH-RLHF dialogues and {prompt, chosen, rejected} records -> paired chat sequences on disk;
every pair kept or counted under its reason; the split follows the prompt."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from euler_data.chat import render_chat
from euler_data.prefs import build_prefs, hh_dialogue, read_prefs, to_pair
from tests.data.test_cli_safety import euler_data, one_line_error


def hh(*turns: str) -> str:
    """An HH-RLHF dialogue of alternating Human / Assistant turns."""
    return "".join(("\n\nHuman: " if i % 2 == 0 else "\n\nAssistant: ") + t for i, t in enumerate(turns))


def sides(tok, folder, split):
    """[(prompt ids, chosen reply ids, rejected reply ids)] of a split, checked pair by pair."""
    tokens, mask, offsets, _ = read_prefs(folder, split)
    assert tokens.dtype == np.uint16 and mask.dtype == np.uint8 and len(offsets) % 2 == 1
    out = []
    for i in range((len(offsets) - 1) // 2):
        chosen, rejected = (slice(offsets[j], offsets[j + 1]) for j in (2 * i, 2 * i + 1))
        start_c, start_r = int(np.argmax(mask[chosen])), int(np.argmax(mask[rejected]))
        assert mask[chosen][start_c:].all() and mask[rejected][start_r:].all()  # the reply, then <|end|>
        prompt = tokens[chosen][:start_c].tolist()
        assert prompt == tokens[rejected][:start_r].tolist()  # one prompt, two replies
        assert tok.decode(prompt).endswith("<|assistant|>\n")
        out.append((prompt, tokens[chosen][start_c:].tolist(), tokens[rejected][start_r:].tolist()))
    return out


def test_hh_dialogues_become_a_prompt_and_two_replies():
    chosen = hh("Where is the pen?", "On the desk.", "And the ink?", "In the drawer.")
    rejected = hh("Where is the pen?", "On the desk.", "And the ink?", "Go away.")
    (prompt, a, b), reason = to_pair({"chosen": chosen, "rejected": rejected})
    assert reason is None and (a, b) == ("In the drawer.", "Go away.")
    assert prompt == hh_dialogue(chosen)[:-1] and [m["role"] for m in prompt] == ["user", "assistant", "user"]
    assert to_pair({"chosen": chosen, "rejected": hh("Other question?", "Go away.")}) == (
        None,
        "prompts_differ",
    )
    assert to_pair({"chosen": chosen, "rejected": chosen}) == (None, "identical_responses")
    assert to_pair({"chosen": hh("Hi?", " "), "rejected": hh("Hi?", "Hello")}) == (None, "empty_response")
    assert to_pair({"chosen": "no markers", "rejected": "here"}) == (None, "not_a_preference_record")
    assert to_pair({"chosen": hh("Hi?"), "rejected": hh("Hi?")}) == (
        None,
        "not_a_preference_record",
    )  # no reply


def test_prompt_chosen_rejected_records_take_strings_and_message_lists():
    user = [{"role": "user", "content": "Name a colour."}]
    reply = lambda text: [*user, {"role": "assistant", "content": text}]  # noqa: E731
    assert to_pair({"prompt": "Name a colour.", "chosen": "Red.", "rejected": "No."}) == (
        (user, "Red.", "No."),
        None,
    )
    assert to_pair({"prompt": user, "chosen": reply("Red."), "rejected": reply("No.")}) == (
        (user, "Red.", "No."),
        None,
    )
    pair, reason = to_pair({"chosen": reply("Red."), "rejected": reply("No.")})  # the prompt from the lists
    assert reason is None and pair == (user, "Red.", "No.")
    other = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "No."}]
    assert to_pair({"chosen": reply("Red."), "rejected": other}) == (None, "prompts_differ")
    assert to_pair({"prompt": 3, "chosen": "a", "rejected": "b"}) == (None, "not_a_preference_record")
    assert to_pair(["not", "a", "dict"]) == (None, "not_a_preference_record")


def test_a_set_accounts_for_every_pair_and_splits_by_prompt(tok, tmp_path):
    records = [
        {"chosen": hh(f"Question {i}?", f"Answer {i}."), "rejected": hh(f"Question {i}?", "I will not.")}
        for i in range(30)
    ]
    records += [  # a second pair on prompt 0 must land in prompt 0's split
        {"chosen": hh("Question 0?", "Zero."), "rejected": hh("Question 0?", "Nothing.")},
        # multi-turn: the earlier assistant turn is prompt, unmasked on both sides
        {"chosen": hh("Hi?", "Hello.", "Age?", "Old."), "rejected": hh("Hi?", "Hello.", "Age?", "Go away.")},
        {"prompt": "Long " * 300, "chosen": "a", "rejected": "b"},  # too long
        {"chosen": hh("Same?", "Yes."), "rejected": hh("Same?", "Yes.")},  # identical
        {"chosen": hh("A?", "B."), "rejected": hh("C?", "D.")},  # prompts differ
        records[3],  # duplicate
    ]
    lines = [json.dumps(r) for r in records] + ["{broken", json.dumps({"chosen": "x"}), "\xff"]
    src = tmp_path / "pairs.jsonl.gz"
    src.write_bytes(gzip.compress("\n".join(lines).encode("utf-8", "surrogateescape")))
    meta = build_prefs([src], tmp_path / "out", tok, context=64, val_fraction=0.3, seed=1)
    assert meta["pairs_in"] == len(records) + 3
    dropped = {"too_long": 1, "identical_responses": 1, "prompts_differ": 1, "duplicate": 1}
    dropped |= {"malformed_json": 2, "not_a_preference_record": 1}  # "\xff" alone is not JSON
    assert meta["dropped"] == dropped
    assert (
        meta["pairs_kept"] == 32 == meta["train"]["pairs"] + meta["val"]["pairs"] and meta["val"]["pairs"] > 0
    )
    found = {split: sides(tok, tmp_path / "out", split) for split in ("train", "val")}
    prompts = {split: [tok.decode(p) for p, _, _ in pairs] for split, pairs in found.items()}
    zero = render_chat([{"role": "user", "content": "Question 0?"}], add_generation_prompt=True)
    assert sum(p == zero for p in prompts["train"]) in (0, 2) and sum(p == zero for p in prompts["val"]) in (
        0,
        2,
    )
    assert not set(prompts["train"]) & set(prompts["val"])  # a prompt's pairs share its split
    replies = sorted(tok.decode(c) for pairs in found.values() for _, c, _ in pairs)
    assert replies == sorted([f"Answer {i}.<|end|>" for i in range(30)] + ["Zero.<|end|>", "Old.<|end|>"])


@pytest.mark.data
def test_the_real_hh_pairs_through_the_command_line(mirror, tmp_path):
    out = tmp_path / "d"
    done = euler_data("prepare", "--source", "tinyshakespeare", "--out", str(out), "--mirror", str(mirror),
                      "--vocab-size", "512", "--quiet")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = euler_data("prefs", "--source", "hh-rlhf", "--out", str(out), "--mirror", str(mirror))
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "prefs_meta.json").read_text())
    assert meta["pairs_in"] == 2312 and meta["pairs_kept"] + sum(meta["dropped"].values()) == 2312
    assert meta["dropped"]["prompts_differ"] == 5  # the 5 pairs whose dialogues part before the last reply
    assert f"{meta['pairs_kept']}/2312 pairs kept" in done.stdout
    again = euler_data("prefs", "--source", "hh-rlhf", "--out", str(out), "--mirror", str(mirror))
    line = one_line_error(again, "already holds an euler-data preference set", "--overwrite")
    assert str(meta["pairs_kept"]) in line
    small = euler_data("prefs", "--source", "hh-rlhf", "--out", str(out), "--mirror", str(mirror),
                       "--context", "64", "--overwrite")  # fmt: skip
    assert small.returncode == 0 and "euler-data prefs: warning: dropped" in small.stderr
    assert "most as too_long" in small.stderr and "--context N keeps more" in small.stderr


def test_bad_input_is_one_line_and_keeps_the_folder(tok, tmp_path):
    out, tok_file = tmp_path / "d", tmp_path / "tok.json"
    tok.save(tok_file)
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"prompt": "Long " * 300, "chosen": "a", "rejected": "b"}) + "\n")
    common = ("--source", str(src), "--out", str(out), "--tokenizer", str(tok_file))
    done = euler_data("prefs", *common, "--context", "32")
    line = one_line_error(done, "kept 0 of 1 pairs", "too_long", "--context")
    assert "pass --context" in line and not (out / "prefs_meta.json").exists()
    assert one_line_error(euler_data("prefs", *common, "--val-fraction", "1.5"), "--val-fraction")
    missing = euler_data("prefs", "--source", str(tmp_path / "nope.jsonl"), "--out", str(out))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_the_loader_gives_pairs_as_row_pairs_deterministically(tok, tmp_path):
    from euler_data import PrefsLoader

    records = [
        {"prompt": f"Question {i}?", "chosen": f"Answer {i} " * (1 + i % 5), "rejected": "I will not."}
        for i in range(12)
    ]
    src = tmp_path / "p.json"
    src.write_text(json.dumps(records), encoding="utf-8")
    build_prefs([src], tmp_path / "out", tok, context=128, val_fraction=0.0)
    loader = PrefsLoader(tmp_path / "out", context=24, batch_size=3, seed=5)
    tokens, targets, mask, ids = loader.batch(7)
    assert tokens.shape == targets.shape == mask.shape == (6, 24) and ids.shape == (3,)
    np.testing.assert_array_equal(targets[:, :-1], tokens[:, 1:])  # the next tokens
    again = loader.batch(7)
    assert all(np.array_equal(a, b) for a, b in zip((tokens, targets, mask, ids), again))
    halves = [
        PrefsLoader(tmp_path / "out", context=24, batch_size=3, seed=5, rank=r, world_size=2) for r in (0, 1)
    ]
    both = [h.batch(7)[3] for h in halves]
    whole = PrefsLoader(tmp_path / "out", context=24, batch_size=6, seed=5).batch(7)[3]
    np.testing.assert_array_equal(np.concatenate([both[0][:, None], both[1][:, None]], 1).reshape(-1), whole)
    every = loader.pairs(0, 100)  # in order, all of them, each row pair sharing its prompt
    assert every[3].tolist() == list(range(loader.n_pairs)) == list(range(12))
    full = PrefsLoader(tmp_path / "out", context=127)
    toks, tgts, m, _ = full.pairs(0, 12)
    lengths = full.lengths()
    for i in range(12):
        chosen, rejected = 2 * i, 2 * i + 1
        start = int(np.argmax(m[chosen]))
        assert (
            start == int(np.argmax(m[rejected]))
            and (toks[chosen, : start + 1] == toks[rejected, : start + 1]).all()
        )
        n = int(lengths[chosen]) - 1  # targets of a sequence of n + 1 tokens
        assert m[chosen, start:n].all() and not m[chosen, n:].any()  # the reply and <|end|>, then padding
        reply = tok.decode(tgts[chosen, start:n].tolist())
        assert reply == records[i]["chosen"] + "<|end|>"
