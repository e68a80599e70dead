"""`generate --batch-file`: one JSON line per prompt, equal to one `generate --prompt` each; bad files are
one line and exit code 2; the chat evaluation's batched replies equal the one-prompt ones."""

from __future__ import annotations

import json

import pytest

from euler_train.cli import main
from euler_train.evals.chat import greedy_reply, replies, reply_start, val_examples
from euler_train.sampling import load_for_sampling

PROMPTS = ["The module", "Return", "", "naïve café", "word " * 80]  # the last one is cut to the context


def one_prompt(tiny_run, capsys, prompt: str, *flags: str) -> str:
    """What `generate --prompt PROMPT FLAGS` prints, without its final newline."""
    assert main(["generate", "--checkpoint", str(tiny_run), "--prompt", prompt, *flags]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    return out[:-1]


def batch(cli, tiny_run, path, *flags: str) -> list[dict]:
    proc = cli("generate", "--checkpoint", str(tiny_run), "--batch-file", str(path), *flags)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_greedy_batch_file_equals_one_generate_per_prompt(tiny_run, cli, capsys, tmp_path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    flags = ("--temperature", "0", "--max-new-tokens", "20")
    rows = batch(cli, tiny_run, path, *flags, "--batch-size", "2")  # three batches
    assert [r["prompt"] for r in rows] == PROMPTS
    for prompt, row in zip(PROMPTS, rows, strict=True):
        assert row["completion"] == one_prompt(tiny_run, capsys, prompt, *flags)
        assert 0 <= row["tokens"] <= 20 and isinstance(row["stopped"], bool)
    assert sum(r["tokens"] for r in rows) > 0


def test_speculative_greedy_batch_file_equals_the_plain_one(tiny_run, cli, tmp_path) -> None:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    flags = ("--temperature", "0", "--max-new-tokens", "20", "--batch-size", "3")
    assert batch(cli, tiny_run, path, *flags, "--speculative") == batch(cli, tiny_run, path, *flags)


def test_a_draft_tree_from_the_cli_gives_the_plain_greedy_rows(tiny_run, cli, tmp_path) -> None:
    """--draft-tree 0,1 (both drafting heads of the tiny model in a chain) and 0,0,1 (head 1's two best
    guesses, head 2's after the first): the rows of plain greedy decoding."""
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    flags = ("--temperature", "0", "--max-new-tokens", "20", "--batch-size", "3")
    plain = batch(cli, tiny_run, path, *flags)
    for tree in ("0,1", "0,0,1"):
        assert batch(cli, tiny_run, path, *flags, "--speculative", "--draft-tree", tree) == plain


def test_seeded_jsonl_batch_equals_generate_with_seed_plus_index(tiny_run, cli, capsys, tmp_path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\r\n" for i, p in enumerate(PROMPTS[:4])))
    flags = ("--seed", "7", "--top-k", "30", "--top-p", "0.9", "--repetition-penalty", "1.2")
    flags += ("--max-new-tokens", "15")
    rows = batch(cli, tiny_run, path, *flags, "--batch-size", "3")
    for i, (prompt, row) in enumerate(zip(PROMPTS[:4], rows, strict=True)):
        seeded = [f if f != "7" else str(7 + i) for f in flags]
        assert row["completion"] == one_prompt(tiny_run, capsys, prompt, *seeded)
    chat = batch(cli, tiny_run, path, *flags, "--chat")
    for i, (prompt, row) in enumerate(zip(PROMPTS[:4], chat, strict=True)):
        seeded = [f if f != "7" else str(7 + i) for f in flags]
        assert row["completion"] == one_prompt(tiny_run, capsys, prompt, *seeded, "--chat")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.txt", None, "no such file"),
        ("empty.txt", b"", "holds no prompts"),
        ("latin1.txt", b"fine\ncaf\xe9\n", "line 2 is not UTF-8"),
        ("bad.jsonl", b'{"prompt": "a"}\n{"prompt": \n', "line 2: not JSON"),
        ("nokey.jsonl", b'{"text": "a"}\n', 'line 1: expected an object with a string "prompt"'),
        ("number.jsonl", b'{"prompt": 3}\n', 'line 1: expected an object with a string "prompt"'),
        ("blank.jsonl", b'{"prompt": "a"}\n\n{"prompt": "b"}\n', "line 2: not JSON"),
    ],
)
def test_a_bad_batch_file_is_one_line_and_exit_2(tiny_run, cli, tmp_path, name, content, message) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = cli("generate", "--checkpoint", str(tiny_run), "--batch-file", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch-file", "{file}", "--speculative"], "--speculative with --batch-file is greedy only"),
        (["--batch-file", "{file}", "--prompt", "x"], "not allowed with argument"),
        ([], "one of the arguments --prompt --batch-file is required"),
        (["--batch-file", "{file}", "--batch-size", "0"], "--batch-size"),
        (
            ["--batch-file", "{file}", "--draft-tree", "0,1"],
            "--draft-tree shapes the drafts of --speculative",
        ),
        (
            ["--batch-file", "{file}", "--temperature", "0", "--speculative", "--draft-tree", "0,x"],
            "comma-separated",
        ),
        (["--prompt", "a", "--draft-tree", "0"], "--draft-tree applies to --batch-file"),
        (
            ["--batch-file", "{file}", "--temperature", "0", "--speculative", "--draft-tree", "0,1,2"],
            "1 to 2 levels",
        ),
        (["--batch-file", "{file}", "--temperature", "0", "--speculative", "--draft-tree", "0,2"], "parents"),
    ],
)
def test_bad_batch_flags_are_one_line_and_exit_2(tiny_run, cli, tmp_path, flags, message) -> None:
    path = tmp_path / "ok.txt"
    path.write_text("hello\n", encoding="utf-8")
    proc = cli("generate", "--checkpoint", str(tiny_run), *[f.format(file=path) for f in flags])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_chat_eval_replies_in_batches_equal_one_reply_at_a_time(chat_run) -> None:
    model = load_for_sampling(str(chat_run))
    rows, _ = val_examples(chat_run.parent / "docs")
    rows = rows[:12]
    batched = replies(model, rows, 24, None, batch_size=5)
    context = model.mcfg.context
    for row, (prompt, reply, stopped) in zip(rows, batched, strict=True):
        assert prompt == row.ids[: reply_start(row.mask)].tolist()[-(context - 1) :]
        assert (reply, stopped) == greedy_reply(model, prompt, min(24, context - len(prompt)))
    assert any(stopped for _, _, stopped in batched)  # replies that end with <|end|> are among them
