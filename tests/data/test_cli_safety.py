"""Nothing lost, nothing mixed: euler-data's writers (prepare, sft) hold their folder, refuse what is not
theirs, keep the previous dataset whole when they fail or are interrupted, and say what they dropped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from euler_bpe import __version__ as euler_bpe_version
from euler_data import FolderBusy, hold_folder
from euler_data import __version__ as euler_data_version
from tests.data.conftest import prose


def euler_data(*argv: str, module: str = "euler_data.cli") -> subprocess.CompletedProcess:
    """The command line in a subprocess (EULER_DATA_OFFLINE comes from the conftest)."""
    cmd = [sys.executable, "-m", module, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def one_line_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one line on stderr, no traceback, and the line holds every needle; the line."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` and its bytes (a folder maps to b"<dir>")."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>" for p in folder.rglob("*")
    }


def dataset_files(folder: Path) -> dict[str, bytes]:
    """The files a trainer reads from a dataset folder."""
    names = ("train.bin", "val.bin", "meta.json", "tokenizer.json")
    return {name: (folder / name).read_bytes() for name in names}


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("\n\n".join(prose(seed, 300) for seed in range(12)), encoding="utf-8")
    return path


@pytest.fixture
def dataset(tmp_path, text, tok_path) -> Path:
    """A small finished dataset folder (given tokenizer: no training)."""
    out = tmp_path / "ds"
    source = ["--source", f"{text}::paragraph", "--tokenizer", str(tok_path)]
    done = euler_data("prepare", *source, "--out", str(out), "--quiet", "--workers", "1")
    assert done.returncode == 0, done.stderr
    return out


def test_a_second_writer_is_refused_and_names_the_first(dataset, text, tok_path, tmp_path):
    before = snapshot(dataset)
    records = tmp_path / "qa.json"
    records.write_text(json.dumps([{"instruction": "Say hi.", "output": "hi"}]), encoding="utf-8")
    with hold_folder(dataset, "the test"):
        prep = euler_data("prepare", "--source", str(text), "--out", str(dataset), "--overwrite", "--quiet")
        sft = euler_data("sft", "--source", str(records), "--out", str(dataset))
        report = euler_data("inspect", str(dataset))  # readers never take the lock
        with pytest.raises(FolderBusy):  # and the lock is still the test's
            with hold_folder(dataset, "another"):
                pass
    for done in (prep, sft):
        one_line_error(done, f"{dataset} is being written by process {os.getpid()} (the test)")
    assert report.returncode == 0 and "tokens per document" in report.stdout
    assert snapshot(dataset) == before


def test_out_that_is_a_file_or_lies_under_one(text, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder", encoding="utf-8")
    records = tmp_path / "qa.json"
    records.write_text(json.dumps([{"instruction": "Say hi.", "output": "hi"}]), encoding="utf-8")
    for out, why in (
        (blocker, "a file of that name is in the way"),
        (blocker / "ds", "a part of its path is a file"),
    ):
        prep = euler_data(
            "prepare", "--source", str(text), "--out", str(out), "--tokenizer", "bytes", "--quiet"
        )
        one_line_error(prep, f"cannot write {out}: {why}")
        sft = euler_data("sft", "--source", str(records), "--out", str(out), "--tokenizer", "bytes")
        one_line_error(sft, f"cannot write {out}: {why}")
    assert blocker.read_text(encoding="utf-8") == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only (0o555) folder anyway")
def test_a_read_only_out_is_refused(dataset, text):
    before = snapshot(dataset)
    dataset.chmod(0o555)
    try:
        done = euler_data("prepare", "--source", str(text), "--out", str(dataset), "--overwrite", "--quiet")
    finally:
        dataset.chmod(0o755)
    one_line_error(done, f"cannot write {dataset}: it is not writable")
    assert snapshot(dataset) == before


def test_a_folder_of_another_tool_is_refused_unless_overwrite(text, tok_path, tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "vocab.json",
    ):
        (hf / name).write_text("{}", encoding="utf-8")
    nanogpt = tmp_path / "nanogpt"
    nanogpt.mkdir()
    (nanogpt / "meta.json").write_text(json.dumps({"vocab_size": 50257}), encoding="utf-8")
    (nanogpt / "train.bin").write_bytes(b"\x01\x00" * 8)
    records = tmp_path / "qa.json"
    records.write_text(json.dumps([{"instruction": "Say hi.", "output": "hi"}]), encoding="utf-8")
    source = ["--source", f"{text}::paragraph", "--tokenizer", str(tok_path), "--quiet", "--workers", "1"]
    for folder, why in (
        (hf, "it holds config.json, generation_config.json, model.safetensors, tokenizer.json and 1 more"),
        (nanogpt, "its meta.json was not written by euler-data"),
    ):
        before = snapshot(folder)
        refused = euler_data("prepare", *source, "--out", str(folder))
        one_line_error(refused, "not an euler-data dataset folder", why, "--overwrite")
        one_line_error(euler_data("sft", "--source", str(records), "--out", str(folder)), why, "--overwrite")
        assert snapshot(folder) == before
    done = euler_data("prepare", *source, "--out", str(nanogpt), "--overwrite")
    assert done.returncode == 0, done.stderr
    meta = json.loads((nanogpt / "meta.json").read_text(encoding="utf-8"))
    assert (
        meta["format"] == "euler-data/1"
        and (nanogpt / "train.bin").stat().st_size == 2 * meta["tokens"]["train"]
    )


def test_a_finished_dataset_is_replaced_only_with_overwrite(dataset, text, tmp_path):
    before = snapshot(dataset)
    meta = json.loads((dataset / "meta.json").read_text(encoding="utf-8"))
    again = ["prepare", "--source", f"{text}::line", "--tokenizer", "bytes", "--out", str(dataset), "--quiet"]
    tokens = sum(meta["tokens"].values())
    held = f"an euler-data dataset ({meta['documents_kept']} documents, {tokens} tokens)"
    one_line_error(euler_data(*again), f"already holds {held}; pass --overwrite to replace it")
    assert snapshot(dataset) == before
    records = tmp_path / "qa.json"
    records.write_text(json.dumps([{"instruction": f"Say {i}.", "output": f"{i}"} for i in range(9)]))
    done = euler_data("sft", "--source", str(records), "--out", str(dataset))  # sft adds to a dataset
    assert done.returncode == 0, done.stderr
    with_sft = snapshot(dataset)
    one_line_error(
        euler_data("sft", "--source", str(records), "--out", str(dataset)),
        "already holds an euler-data SFT set (9 examples); pass --overwrite to replace it",
    )
    assert snapshot(dataset) == with_sft
    done = euler_data(*again, "--overwrite")
    assert done.returncode == 0, done.stderr
    assert json.loads((dataset / "meta.json").read_text(encoding="utf-8"))["tokenizer"] == "bytes"
    assert "removed the SFT set" in done.stderr and not list(
        dataset.glob("sft_*")
    )  # it was another tokenizer's
    assert not (dataset / "pipeline.new").exists()


def test_nothing_kept_is_refused_and_the_previous_dataset_stays(dataset, tmp_path):
    before = snapshot(dataset)
    short = tmp_path / "short.txt"
    short.write_text("\n\n".join(f"Line {i} is short." for i in range(40)), encoding="utf-8")
    argv = ["prepare", "--source", f"{short}::paragraph", "--tokenizer", "bytes", "--quiet"]
    refused = euler_data(*argv, "--out", str(dataset), "--overwrite")
    line = one_line_error(refused, "kept 0 of 40 documents (dropped {'too_short': 40})", "--min-chars is 200")
    longest = max(len(f"Line {i} is short.") for i in range(40))
    assert line.endswith(f"pass --min-chars {longest} or less")
    assert snapshot(dataset) == before
    fresh = tmp_path / "fresh"
    one_line_error(euler_data(*argv, "--out", str(fresh)), "kept 0 of 40 documents")
    assert not fresh.exists()  # nothing left behind


def test_sft_that_keeps_nothing_says_the_context_that_would(dataset, tmp_path):
    records = [{"instruction": f"Repeat {i}: " + "word " * (5 + i), "output": "done"} for i in range(20)]
    src = tmp_path / "long.json"
    src.write_text(json.dumps(records), encoding="utf-8")
    before = snapshot(dataset)
    refused = euler_data("sft", "--source", str(src), "--out", str(dataset), "--context", "8")
    all_long = "kept 0 of 20 examples: all are longer than the context of 8 tokens (the shortest has "
    line = one_line_error(refused, all_long)
    shortest = int(line.split("(the shortest has ")[1].split(")")[0])
    assert line.endswith(f"; pass --context {shortest}") and shortest > 8
    assert snapshot(dataset) == before
    done = euler_data("sft", "--source", str(src), "--out", str(dataset), "--context", str(shortest))
    assert done.returncode == 0, done.stderr
    assert "1/20 examples kept" in done.stdout  # the shortest example fits the context the message named


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["prepare", "--context", "-5"], "context_hint must be >= 1, got -5 (--context)"),
        (["prepare", "--context", "0"], "context_hint must be >= 1, got 0 (--context)"),
        (["prepare", "--val-fraction", "1"], "val_fraction must be in [0, 1), got 1.0 (--val-fraction)"),
        (["prepare", "--val-fraction", "nan"], "val_fraction must be in [0, 1), got nan (--val-fraction)"),
        (["prepare", "--workers", "0"], "workers must be >= 1, got 0 (--workers)"),
        (["prepare", "--min-chars", "-1"], "min_chars must be >= 0, got -1 (--min-chars)"),
        (["prepare", "--shard-tokens", "0"], "shard_tokens must be >= 1, got 0 (--shard-tokens)"),
        (["prepare", "--minhash", "0"], "minhash_threshold must be in (0, 1], got 0.0 (--minhash)"),
        (["prepare", "--minhash", "1.5"], "minhash_threshold must be in (0, 1], got 1.5 (--minhash)"),
        (["prepare", "--weight", "text=-1"], "weight must be a finite number >= 0, got -1.0"),
        (["sft", "--context", "0"], "context must be an integer >= 1, got 0 (--context)"),
        (["sft", "--context", "-3"], "context must be an integer >= 1, got -3 (--context)"),
        (["sft", "--val-fraction", "1"], "val_fraction must be in [0, 1), got 1.0 (--val-fraction)"),
    ],
)
def test_invalid_numbers_are_refused_before_any_work(text, tmp_path, argv, needle):
    out = tmp_path / "never"
    source = [f"{text}"] if argv[0] == "prepare" else [str(tmp_path / "qa.json")]
    done = euler_data(argv[0], "--source", *source, "--out", str(out), "--tokenizer", "bytes", *argv[1:])
    one_line_error(done, needle)
    assert not out.exists()


def test_recipe_fields_of_the_wrong_type_name_the_field(text, tmp_path):
    cases = {
        "r1.json": (
            json.dumps({"vocab_size": "big", "source": [str(text)]}),
            "vocab_size must be an integer, got 'big'",
        ),
        "r2.toml": ('val_fraction = "a tenth"\n', "val_fraction must be a number, got 'a tenth'"),
        "r3.toml": ("[filter]\nnear_dedup = 1\n", "near_dedup must be true or false, got 1"),
        "r4.toml": ("[filter]\nmin_chars = 2.5\n", "min_chars must be an integer, got 2.5"),
        "r5.json": (
            json.dumps({"source": [3]}),
            'each source must be a string or a table with spec = "...", got 3',
        ),
        "r6.toml": (
            f'[[source]]\nspec = "{text}"\nweight = "heavy"\n',
            "weight must be a number, got 'heavy'",
        ),
        "r7.toml": ("context_hint = 0\n", "context_hint must be >= 1, got 0 (--context)"),
    }
    jobs = []
    for name, (body, needle) in cases.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
        argv = [
            "prepare",
            "--recipe",
            str(tmp_path / name),
            "--source",
            str(text),
            "--out",
            str(tmp_path / "o"),
        ]
        jobs.append((argv, f"{tmp_path / name}: {needle}"))
    with ThreadPoolExecutor(4) as pool:  # the children wait on their imports more than on the CPU
        results = list(pool.map(lambda job: euler_data(*job[0]), jobs))
    for done, (_, needle) in zip(results, jobs):
        one_line_error(done, needle)
    assert not (tmp_path / "o").exists()


def test_a_smaller_vocabulary_than_asked_is_said(text, tmp_path):
    out = tmp_path / "big_vocab"
    done = euler_data("prepare", "--source", str(text), "--vocab-size", "60000", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    got = json.loads((out / "meta.json").read_text(encoding="utf-8"))["vocab_size"]
    assert got < 60000
    note = (
        f"euler-data prepare: note: asked for 60000 tokens, the text supports {got}; the tokenizer has {got}"
    )
    assert note in done.stderr.splitlines()


def test_a_filter_that_drops_most_of_a_source_is_a_warning(tmp_path, tok_path):
    out = tmp_path / "plays"
    done = euler_data("prepare", "--source", "tinyshakespeare::paragraph", "--tokenizer", str(tok_path),
                      "--out", str(out), "--quiet")  # fmt: skip
    assert done.returncode == 0, done.stderr
    source = json.loads((out / "meta.json").read_text(encoding="utf-8"))["sources"]["tinyshakespeare"]
    n, n_in = source["dropped"]["too_short"], source["documents_in"]
    assert n > 0.25 * n_in
    warning = (
        f"euler-data prepare: warning: the too_short filter dropped {n} of {n_in} documents "
        f"({100 * n / n_in:.0f}%) of source 'tinyshakespeare' (min_chars is 200); --min-chars N changes it"
    )
    assert warning in done.stderr.splitlines()


def test_files_of_an_unknown_type_in_a_folder_are_counted_and_named(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "blob.bin").write_bytes(bytes(range(256)))
    (folder / "story.txt").write_text(prose(3, 200), encoding="utf-8")
    out = tmp_path / "ds"
    done = euler_data(
        "prepare", "--source", str(folder), "--tokenizer", "bytes", "--out", str(out), "--quiet"
    )
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["documents_in"] == 2 and meta["dropped"] == {"unknown_extension": 1}
    note = (
        f"euler-data prepare: note: skipped 1 file of {folder} of a type no reader takes (meta.json "
        f"counts it as dropped: unknown_extension); --source {folder}::raw --tokenizer bytes reads every "
        "file's bytes"
    )
    assert note in done.stderr.splitlines() and "1/2 documents kept" in done.stdout


def test_version():
    for module, name, version in (("euler_data.cli", "euler-data", euler_data_version),
                                  ("euler_bpe.cli", "euler-bpe", euler_bpe_version)):  # fmt: skip
        done = euler_data("--version", module=module)
        assert done.returncode == 0 and done.stdout == f"{name} {version}\n"


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 120) -> None:
    """Until ``path`` exists (or the process ended)."""
    start = time.monotonic()
    while not path.exists() and proc.poll() is None and time.monotonic() - start < limit_s:
        time.sleep(0.01)


def test_ctrl_c_exits_130_with_one_line_and_the_previous_dataset_whole(dataset, tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it, encoding workers included) early
    in a run and again inside tokenize: each run exits 130 with one line, and the dataset is byte for byte
    the previous one; then the same command finishes and replaces it."""
    rng = np.random.default_rng(0)
    letters = rng.choice(np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     eao", dtype=np.uint8), size=8_000_000)
    text = letters.tobytes().decode()
    big = tmp_path / "big.txt"
    big.write_text("\n\n".join(text[i : i + 400] for i in range(0, len(text), 400)), encoding="utf-8")
    recipe = tmp_path / "r.toml"
    recipe.write_text("tokenizer_sample_bytes = 300000\nvocab_size = 600\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "euler_data.cli", "prepare", "--recipe", str(recipe), "--source",
           f"{big}::paragraph", "--out", str(dataset), "--overwrite", "--workers=2", "--quiet"]  # fmt: skip
    before = dataset_files(dataset)
    for started, after_s in ((dataset / ".euler.lock", 0.5), (dataset / "pipeline.tokenizer.json", 0.3)):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        wait_for(started, proc)
        time.sleep(after_s)
        assert proc.poll() is None, "the run ended before the interrupt"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
        kept = f"{dataset} keeps its previous dataset (the same command continues where this one stopped)"
        assert err.splitlines() == [f"euler-data prepare: interrupted; {kept}"]
        assert dataset_files(dataset) == before
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    meta = json.loads((dataset / "meta.json").read_text(encoding="utf-8"))
    assert (
        meta["documents_in"] == 20_000
        and (dataset / "train.bin").stat().st_size == 2 * meta["tokens"]["train"]
    )


def test_ctrl_c_before_the_move_in_is_continued_and_keeps_the_previous_database(
    dataset, text, tok_path, monkeypatch, capsys
):
    """A Ctrl-C once everything is in pipeline.new/ but before it is moved in: the message says the folder
    keeps its dataset and the same command continues, and it does (no stage runs again)."""
    from euler_data import cli, ingest, pipeline

    before, old_db = dataset_files(dataset), (dataset / "pipeline.duckdb").read_bytes()
    real = pipeline.replace_files

    def interrupted(*args, **kwargs):
        monkeypatch.setattr(pipeline, "replace_files", real)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "replace_files", interrupted)
    argv = ["prepare", "--source", f"{text}::line", "--tokenizer", str(tok_path), "--out", str(dataset),
            "--quiet", "--workers", "1", "--overwrite", "--seed", "7"]  # fmt: skip
    assert cli.main(argv) == 130
    kept = f"{dataset} keeps its previous dataset (the same command continues where this one stopped)"
    assert capsys.readouterr().err.splitlines() == [f"euler-data prepare: interrupted; {kept}"]
    assert dataset_files(dataset) == before
    assert (dataset / "pipeline.duckdb.previous").read_bytes() == old_db  # set aside, not lost
    staged = json.loads((dataset / "pipeline.new" / "meta.json").read_text(encoding="utf-8"))

    def no_ingest(*args, **kwargs):
        raise AssertionError("ingest ran again")

    monkeypatch.setattr(ingest, "ingest", no_ingest)
    assert cli.main(argv) == 0, capsys.readouterr().err
    meta = json.loads((dataset / "meta.json").read_text(encoding="utf-8"))
    assert meta["stages"]["ingest"] == staged["stages"]["ingest"]  # the interrupted run's, not redone
    assert meta["seed"] == 7 != json.loads(before["meta.json"])["seed"]  # the new dataset
    names = {p.name for p in dataset.iterdir()}
    assert {"train.bin", "val.bin", "tokenizer.json", "meta.json", "pipeline.duckdb"} <= names
    assert not names & {"pipeline.new", "pipeline.duckdb.previous", "pipeline.tokenizer.json"}
    monkeypatch.undo()
    again = euler_data(*argv)  # a finished run: the same command starts over (and writes the same set)
    assert again.returncode == 0, again.stderr
    assert (
        json.loads((dataset / "meta.json").read_text(encoding="utf-8"))["stages"]["ingest"]
        != staged["stages"]["ingest"]
    )


def test_a_bad_memory_limit_leaves_the_folder_byte_for_byte(dataset, text, tok_path):
    before = snapshot(dataset)
    env = {**os.environ, "EULER_DATA_MEMORY_LIMIT": "lots"}
    cmd = [sys.executable, "-m", "euler_data.cli", "prepare", "--source", f"{text}::line", "--tokenizer",
           str(tok_path), "--out", str(dataset), "--quiet", "--overwrite"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    one_line_error(done, "EULER_DATA_MEMORY_LIMIT='lots'")
    assert snapshot(dataset) == before and (dataset / "pipeline.duckdb").is_file()


def test_hidden_files_of_a_folder_source_are_skipped(tmp_path):
    folder = tmp_path / "repo"
    (folder / ".git" / "objects").mkdir(parents=True)
    (folder / ".git" / "objects" / "x").write_bytes(b"\x78\x01 not text")
    (folder / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (folder / "story.txt").write_text(prose(3, 200), encoding="utf-8")
    out = tmp_path / "ds"
    argv = ["prepare", "--source", str(folder), "--tokenizer", "bytes", "--out", str(out), "--quiet"]
    done = euler_data(*argv)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["documents_in"] == 1 and "unknown_extension" not in meta["dropped"], meta["dropped"]
