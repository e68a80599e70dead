"""`euler-train make-pairs`: preference pairs from an SFT source and the model's own samples, through the
command line: every conversation written or counted, the same seed the same pairs, the output a set that
`euler-data prefs` builds, and bad input as one line."""

from __future__ import annotations

import json
import shutil

from euler_data.cli import main as euler_data


def source_file(tmp_path):
    """Five short conversations (one of two turns), one whose prompt is longer than the tiny context, one
    that ends with the user, one line that is not JSON."""
    chats = [
        [{"role": "user", "content": f"Say something about {word}."}, {"role": "assistant", "content": word}]
        for word in ("tokens", "kernels", "gradients", "caches")
    ]
    chats.append(
        [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "And the backward pass?"},
            {"role": "assistant", "content": "By hand."},
        ]
    )
    long = [{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "short"}]
    open_end = [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "?"},
    ]
    lines = [json.dumps({"messages": c}) for c in [*chats, long, open_end]] + ["{not json"]
    path = tmp_path / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, chats


def make_pairs(cli, run, source, out, *extra):
    return cli("make-pairs", "--checkpoint", str(run), "--source", str(source), "--out", str(out),
               "--max-new-tokens", "6", "--seed", "3", *extra)  # fmt: skip


def test_pairs_from_the_model_build_a_preference_set(cli, tmp_path, tiny_run, dataset):
    source, chats = source_file(tmp_path)
    out = tmp_path / "pairs.jsonl"
    done = make_pairs(cli, tiny_run, source, out)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["prompt"] for r in records] == [c[:-1] for c in chats]  # the source's order, its prompts
    assert [r["chosen"] for r in records] == [c[-1]["content"] for c in chats]  # the reference replies
    assert all(r["rejected"] != r["chosen"] for r in records)
    summary = done.stdout.strip().splitlines()[-1]
    assert "5 pairs written" in summary and "of the rejected replies ran to the token limit" in summary
    assert "malformed_json 1" in summary and "prompt_too_long 1" in summary
    assert "no_prompt_and_final_reply 1" in summary and "euler-data prefs --source" in summary
    again = make_pairs(cli, tiny_run, source, tmp_path / "again.jsonl")  # the same seed: the same samples
    assert again.returncode == 0 and (tmp_path / "again.jsonl").read_bytes() == out.read_bytes()
    folder = shutil.copytree(dataset, tmp_path / "docs")
    assert euler_data(["prefs", "--source", str(out), "--out", str(folder), "--context", "64"]) == 0
    meta = json.loads((folder / "prefs_meta.json").read_text())
    assert meta["pairs_in"] == 5 and meta["pairs_kept"] + sum(meta["dropped"].values()) == 5


def test_bad_make_pairs_input_is_one_line(cli, tmp_path, tiny_run):
    source, _ = source_file(tmp_path)
    out = tmp_path / "pairs.jsonl"
    out.write_text("keep me\n", encoding="utf-8")
    taken = make_pairs(cli, tiny_run, source, out)
    lines = taken.stderr.strip().splitlines()
    assert taken.returncode == 2 and len(lines) == 1 and "pass --overwrite" in lines[0], taken.stderr
    assert out.read_text(encoding="utf-8") == "keep me\n"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("{not json\n", encoding="utf-8")
    nothing = make_pairs(cli, tiny_run, empty, tmp_path / "none.jsonl")
    assert nothing.returncode == 2 and "no conversation to sample" in nothing.stderr
    assert "malformed_json" in nothing.stderr and not (tmp_path / "none.jsonl").exists()
    missing = make_pairs(cli, tiny_run, source, tmp_path / "no" / "such" / "pairs.jsonl")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
