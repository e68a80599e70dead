"""The euler-data command: the prepare contract, inspect, sft, and one-line errors with status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from euler_bpe import Tokenizer
from euler_data.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_prepare_writes_the_contracted_folder(corpus, capsys, tmp_path):
    out = tmp_path / "ds"
    root = corpus["root"]
    sources = ["--source", str(root / "books"), "--source", str(root / "web.jsonl")]
    flags = ["--vocab-size", "300", "--val-fraction", "0.2", "--seed", "3", "--quiet"]
    code, stdout, _ = run(capsys, "prepare", *sources, "--out", str(out), *flags)
    assert code == 0 and "documents kept" in stdout
    meta = json.loads((out / "meta.json").read_text())
    for key in ("documents_in", "documents_kept", "dropped", "tokens", "tokenizer_fingerprint", "bytes"):
        assert key in meta
    assert meta["documents_in"] == meta["documents_kept"] + sum(meta["dropped"].values())
    assert set(meta["tokens"]) == {"train", "val"} and meta["vocab_size"] == 300
    tok = Tokenizer.load(out / "tokenizer.json")
    assert tok.fingerprint == meta["tokenizer_fingerprint"]
    assert (out / "train.bin").stat().st_size == 2 * meta["tokens"]["train"]
    code, report, _ = run(capsys, "inspect", str(out), "--samples", "2")
    assert code == 0 and "tokens per document" in report and "#" in report and report.count('  "') == 2


def test_recipe_file_with_flags_on_top(corpus, capsys, tmp_path, tok_path):
    recipe = tmp_path / "r.toml"
    spec = corpus["root"] / "web.jsonl"
    recipe.write_text(f'val_fraction = 0.3\n[[source]]\nspec = "{spec}"\nname = "web"\nmin_score = 2.0\n')
    flags = ["--tokenizer", str(tok_path), "--weight", "web=2", "--minhash", "0.9", "--quiet"]
    code, _, err = run(capsys, "prepare", "--recipe", str(recipe), "--out", str(tmp_path / "o"), *flags)
    assert code == 0, err
    meta = json.loads((tmp_path / "o" / "meta.json").read_text())
    assert meta["val_fraction"] == 0.3 and meta["sources"]["web"]["weight"] == 2.0
    assert meta["recipe"]["filter"]["minhash_threshold"] == 0.9
    assert meta["dropped"]["low_score"] == 1


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("euler-data: error: ")
    for needle in needles:
        assert needle in lines[0]


def test_bad_inputs_exit_2_with_one_line_naming_the_file(capsys, tmp_path, monkeypatch):
    out = str(tmp_path / "o")
    code, _, err = run(capsys, "prepare", "--source", str(tmp_path / "missing.jsonl"), "--out", out)
    _one_line_error(code, err, "missing.jsonl", "no such file")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"text": "a"},\n oops')
    code, _, err = run(capsys, "prepare", "--source", str(bad), "--out", out, "--quiet")
    _one_line_error(code, err, "bad.json", "not a valid JSON array")
    weird = tmp_path / "data.csv"
    weird.write_text("a,b")
    code, _, err = run(capsys, "prepare", "--source", str(weird), "--out", out)
    _one_line_error(code, err, "data.csv", "unknown file type")
    monkeypatch.delenv("EULER_DATA_MIRROR", raising=False)
    code, _, err = run(capsys, "prepare", "--source", "gutenberg:1342", "--out", out)
    _one_line_error(code, err, "gutenberg:1342", "no mirror", "www.gutenberg.org")
    mirror = ["--mirror", str(tmp_path)]
    code, _, err = run(capsys, "prepare", "--source", "fineweb-edu:9", "--out", out, *mirror)
    _one_line_error(code, err, "fineweb-edu", "huggingface.co")


def test_sft_command_builds_a_set_next_to_the_shards(capsys, tmp_path, tok_path):
    src = tmp_path / "a.jsonl"
    src.write_text("\n".join(json.dumps({"instruction": f"Q{i}?", "output": f"A{i}."}) for i in range(30)))
    flags = ["--tokenizer", str(tok_path), "--val-fraction", "0.1"]
    code, _, err = run(capsys, "sft", "--source", str(src), "--out", str(tmp_path / "s"), *flags)
    assert code == 0, err
    meta = json.loads((tmp_path / "s" / "sft_meta.json").read_text())
    assert meta["examples_in"] == 30 == meta["examples_kept"]
    assert (tmp_path / "s" / "tokenizer.json").is_file()
    code, report, _ = run(capsys, "inspect", str(tmp_path / "s"))
    assert code == 0 and "sft train: {'examples': " in report and "#" in report
    code, _, err = run(capsys, "sft", "--source", str(src), "--out", str(tmp_path / "none"))
    _one_line_error(code, err, "tokenizer.json", "no tokenizer")


@pytest.mark.parametrize("argv", [["prepare"], ["nonsense"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def test_progress_in_a_log_is_plain_lines_and_reprepare_drops_a_stale_sft_set(corpus, tmp_path, tok_path):
    """stderr to a file: no carriage returns; re-preparing with another tokenizer removes the old SFT set,
    which would no longer match tokenizer.json."""
    out = tmp_path / "ds"
    src = ["--source", str(corpus["root"] / "books"), "--out", str(out)]
    assert main(["prepare", *src, "--tokenizer", str(tok_path), "--quiet"]) == 0
    records = tmp_path / "qa.json"
    records.write_text(json.dumps([{"instruction": "Say hi.", "input": "", "output": "hi there"}] * 3))
    assert main(["sft", "--source", str(records), "--out", str(out)]) == 0
    log = tmp_path / "prepare.log"
    with open(log, "w") as err:
        cmd = [sys.executable, "-m", "euler_data.cli", "prepare", *src, "--vocab-size", "300", "--overwrite"]
        assert subprocess.run(cmd, stderr=err).returncode == 0
    text = log.read_text()
    assert "\r" not in text and "\x1b" not in text and "prepare" in text and "removed the SFT set" in text
    assert not list(out.glob("sft_*")) and Tokenizer.load(out / "tokenizer.json").vocab_size == 300
