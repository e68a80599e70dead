"""The user's environment, through the real CLI in a subprocess: folders that cannot be written, a disk
that fills up while a checkpoint is written, Ctrl-C and Ctrl-D in `chat`, `generate | head`, and what a
user reads at the end of a run or before chatting with a model that was never tuned for chat.

Each failure is one line on stderr, no traceback, the documented exit code, and the folder keeps its last
good state. Read-only folders and small disks are real: a bind mount made read-only, or a small tmpfs, in a
private mount namespace (`unshare -rm`; as root a folder's permissions would not stop a write).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from euler_data import hold_folder
from euler_train.checkpoint import verify
from euler_train.metrics import read_metrics

ENV = dict(os.environ, PYTHONUNBUFFERED="1")
CLI = [sys.executable, "-m", "euler_train.cli"]
TINY = ["--no-progress", "--set", "model.context=64"]  # tiny_run's model


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


needs_mounts = pytest.mark.skipif(
    not _unshare_works(), reason="needs a private mount namespace (unshare -rm): a read-only or small folder"
)


def in_namespace(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the shell `script` (arguments $1...) in a private mount namespace: its mounts vanish with it."""
    cmd = ["unshare", "-rm", "sh", "-c", script, "sh", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def cli_read_only(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    """`euler-train ARGV` with `folder` mounted read-only."""
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return in_namespace(script, str(folder), *CLI, *argv)


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The single stderr line of a command that failed as it should, holding every needle."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` (folders as "dir")."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def on_disk(path: Path) -> int:
    """Bytes a file or folder takes on a tmpfs: each file rounded up to 4 KiB pages."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in files)


# --- folders that cannot be written ----------------------------------------------------------------------
def test_export_hf_to_a_file_or_under_one_is_one_line(tiny_run, tmp_path, cli) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("mine\n", encoding="utf-8")
    proc = cli("export-hf", "--checkpoint", str(tiny_run), "--out", str(file))
    one_line_error(proc, 2, f"cannot write {file}: a file of that name is in the way")
    proc = cli("export-hf", "--checkpoint", str(tiny_run), "--out", str(file / "hf"))
    one_line_error(proc, 2, f"cannot write {file / 'hf'}: a part of its path is a file")
    assert file.read_text(encoding="utf-8") == "mine\n" and sorted(tmp_path.iterdir()) == [file]


@needs_mounts
def test_export_hf_and_plot_into_a_read_only_folder_are_one_line(tiny_run, tmp_path) -> None:
    shelf = tmp_path / "shelf"
    run = shutil.copytree(tiny_run, shelf / "run")
    before = snapshot(shelf)
    proc = cli_read_only(shelf, "export-hf", "--checkpoint", str(run), "--out", str(shelf / "hf"))
    one_line_error(proc, 2, f"cannot write {shelf / 'hf'}: it is not writable")
    proc = cli_read_only(shelf, "plot", str(run))  # RUN/loss.png
    one_line_error(proc, 2, f"cannot write {run / 'loss.png'}: it is not writable")
    proc = cli_read_only(shelf, "plot", str(run), "--out", str(shelf / "plots" / "a.png"))
    one_line_error(proc, 2, "it is not writable")
    proc = cli_read_only(shelf, "report", str(run))
    one_line_error(proc, 2, f"cannot write {run / 'report.md'}: it is not writable")
    assert snapshot(shelf) == before


@needs_mounts
def test_pretrain_into_a_read_only_folder_is_one_line(tiny_run, dataset, tmp_path) -> None:
    shelf = tmp_path / "shelf"
    run = shutil.copytree(tiny_run, shelf / "run")
    before = snapshot(shelf)
    common = ["--data", str(dataset), "--steps", "40", "--no-progress", "--set", "model.context=64"]
    proc = cli_read_only(shelf, "pretrain", *common, "--out", str(shelf / "new"))
    one_line_error(proc, 2, f"cannot write {shelf / 'new'}: it is not writable")
    proc = cli_read_only(shelf, "pretrain", *common, "--out", str(run), "--resume")
    one_line_error(proc, 2, f"cannot write {run}: it is not writable")
    assert snapshot(shelf) == before


def test_plot_out_under_a_file_is_one_line_and_a_new_folder_is_made(tiny_run, tmp_path, cli) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("mine\n", encoding="utf-8")
    proc = cli("plot", str(tiny_run), "--out", str(file / "loss.png"))
    one_line_error(proc, 2, "a part of its path is a file")
    out = tmp_path / "plots" / "loss.png"
    proc = cli("plot", str(tiny_run), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.listdir(out.parent) == ["loss.png"]


def test_export_hf_into_a_folder_another_process_writes_is_one_line(tiny_run, tmp_path, cli) -> None:
    out = tmp_path / "hf"
    with hold_folder(out, "a test"):
        proc = cli("export-hf", "--checkpoint", str(tiny_run), "--out", str(out))
    one_line_error(proc, 2, f"{out} is being written by process {os.getpid()} (a test)", "one writer")
    assert not out.exists()


# --- export-hf: a new folder, or an earlier export with --overwrite ---------------------------------------
def export(cli, checkpoint: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return cli("export-hf", "--checkpoint", str(checkpoint), "--out", str(out), *flags)


def test_export_hf_never_writes_into_a_dataset_run_or_checkpoint_folder(dataset, tiny_run, tmp_path, cli):
    data = shutil.copytree(dataset, tmp_path / "data")
    run = shutil.copytree(tiny_run, tmp_path / "run")
    before = snapshot(tmp_path)
    checkpoint = run / "checkpoints" / "step_30"
    for flags in ((), ("--overwrite",)):
        proc = export(cli, tiny_run, data, *flags)
        one_line_error(proc, 2, f"{data} is a dataset folder (euler-data: its tokenizer.json would be")
        proc = export(cli, tiny_run, run, *flags)
        one_line_error(proc, 2, f"{run} is a run folder (checkpoints of steps 10, 20, 30; metrics.jsonl")
        proc = export(cli, tiny_run, checkpoint, *flags)
        one_line_error(proc, 2, f"{checkpoint} is a checkpoint folder: an export must not mix with it")
        assert "choose another --out" in proc.stderr
    assert snapshot(tmp_path) == before


def test_exporting_again_needs_overwrite_which_replaces_the_export(tiny_run, tmp_path, cli) -> None:
    out = tmp_path / "hf"
    assert export(cli, tiny_run / "checkpoints" / "step_10", out).returncode == 0
    (out / "README.md").write_text("my model card\n", encoding="utf-8")
    first = snapshot(out)
    proc = export(cli, tiny_run, out)
    one_line_error(proc, 2, f"{out} already holds files that are not an export (README.md)", "--overwrite")
    (out / "README.md").unlink()
    proc = export(cli, tiny_run, out)
    one_line_error(proc, 2, f"{out} already holds an export (config.json,", "pass --overwrite to replace it")
    assert snapshot(out) == {k: v for k, v in first.items() if k != "README.md"}
    (out / "README.md").write_text("my model card\n", encoding="utf-8")
    proc = export(cli, tiny_run, out, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    now = snapshot(out)
    assert sorted(now) == sorted(first) and now["README.md"] == first["README.md"]
    assert now["model.safetensors"] != first["model.safetensors"]  # step 30's weights, not step 10's
    step30 = tmp_path / "fresh"
    assert export(cli, tiny_run, step30).returncode == 0
    assert {k: v for k, v in now.items() if k != "README.md"} == snapshot(step30)


def test_export_hf_into_an_empty_folder_writes_it(tiny_run, tmp_path, cli) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    assert export(cli, tiny_run, out).returncode == 0
    assert (out / "config.json").is_file() and not [p for p in out.iterdir() if p.name.startswith(".")]


@needs_mounts
def test_a_full_disk_while_re_exporting_keeps_the_earlier_export(tiny_run, tmp_path, cli) -> None:
    """The new export is written beside the old one and moved in only when whole."""
    disk, earlier, after = tmp_path / "disk", tmp_path / "earlier", tmp_path / "after"
    disk.mkdir()
    assert export(cli, tiny_run / "checkpoints" / "step_10", earlier).returncode == 0
    size = on_disk(earlier) * 3 // 2  # room for one export and half of another
    script = (
        'mount -t tmpfs -o size="$1" tmpfs "$2" && cp -a "$3" "$2/hf" || exit 99; '
        'disk="$2"; after="$4"; shift 4; "$@"; rc=$?; cp -a "$disk/hf" "$after"; exit $rc'
    )
    argv = [*CLI, "export-hf", "--checkpoint", str(tiny_run), "--out", str(disk / "hf"), "--overwrite"]
    proc = in_namespace(script, str(size), str(disk), str(earlier), str(after), *argv)
    one_line_error(proc, 2, f"cannot write {disk / 'hf'}: the disk is full")
    assert snapshot(after) == snapshot(earlier)  # the step-10 export, whole, and nothing beside it


# --- the disk fills up while a checkpoint is written -----------------------------------------------------
FULL_RUNNER = """
import errno, os, runpy, shutil

_copyfile = shutil.copyfile


def copyfile(src, dst, **kwargs):  # the disk fills up while checkpoint step FULL_AT is written
    if f".tmp-step_{os.environ['FULL_AT']}-" in str(dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
    return _copyfile(src, dst, **kwargs)


shutil.copyfile = copyfile
runpy.run_module("euler_train.cli", run_name="__main__", alter_sys=True)
"""


def check_stopped_at_full_disk(
    proc: subprocess.CompletedProcess, run: Path, last_good: int, full: int, kept: Path | None = None
) -> None:
    """rc 2, no traceback, the error as the last line; only the last good checkpoint, whole, in the run
    folder (or in `kept`, a copy of it)."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    expected = (
        f"euler-train pretrain: error: cannot write {run}/checkpoints/step_{full}: the disk is full; the "
        f"last good checkpoint is step_{last_good}; fix that, then continue with --resume"
    )
    assert last == expected
    kept = kept or run
    names = sorted(p.name for p in (kept / "checkpoints").iterdir())
    assert names == [f"step_{last_good}"] and verify(kept / "checkpoints" / names[0]) is None


def check_resumed(proc: subprocess.CompletedProcess, run: Path, resumed_at: int, steps: int) -> None:
    """The resumed run starts at the kept checkpoint and ends with one metrics row per step."""
    assert proc.returncode == 0, proc.stderr
    assert f"resuming at step {resumed_at}" in proc.stderr and f"done: {steps} steps" in proc.stdout
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, steps + 1))
    assert all(verify(p) is None for p in (run / "checkpoints").iterdir())


def test_a_full_disk_while_checkpointing_stops_with_one_line_and_resumes(dataset, tmp_path, cli) -> None:
    run, runner = tmp_path / "run", tmp_path / "full_disk.py"
    runner.write_text(FULL_RUNNER, encoding="utf-8")
    argv = ["pretrain", "--data", str(dataset), "--out", str(run), "--steps", "12", "--ckpt-every", "4"]
    argv += ["--eval-every", "4", *TINY]
    proc = subprocess.run(
        [sys.executable, str(runner), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(ENV, FULL_AT="8"),
    )
    check_stopped_at_full_disk(proc, run, 4, 8)
    check_resumed(cli(*argv, "--resume"), run, 4, 12)


@needs_mounts
def test_a_really_full_disk_while_checkpointing(dataset, tiny_run, tmp_path) -> None:
    """A tmpfs with room for the run and one and a half checkpoints: the second one does not fit (here
    safetensors' own error); then the disk grows and --resume continues from the first."""
    disk = tmp_path / "disk"
    disk.mkdir()
    checkpoint = on_disk(tiny_run / "checkpoints" / "step_30")
    size = 4 * 4096 + checkpoint * 3 // 2  # config, metrics and lock; one checkpoint and a half
    argv = ["pretrain", "--data", str(dataset), "--out", str(disk / "run"), "--steps", "30"]
    argv += ["--ckpt-every", "10", "--eval-every", "10", *TINY]
    script = (  # run, keep a copy of the run folder; grow the disk; --resume, keep a copy
        'out="$1"; disk="$2"; mount -t tmpfs -o size="$3" tmpfs "$disk" || exit 99; shift 3; '
        'go() { "$@" > "$out/$name.out" 2> "$out/$name.err"; echo $? > "$out/$name.rc"; '
        'cp -a "$disk/run" "$out/$name"; }; '
        'name=first; go "$@"; mount -o remount,size=256m "$disk" && name=second && go "$@" --resume'
    )
    done = in_namespace(script, str(tmp_path), str(disk), str(size), *CLI, *argv)
    assert done.returncode == 0, done.stderr

    def result(name: str) -> subprocess.CompletedProcess:
        rc = int((tmp_path / f"{name}.rc").read_text())
        out, err = ((tmp_path / f"{name}.{s}").read_text() for s in ("out", "err"))
        return subprocess.CompletedProcess([], rc, out, err)

    check_stopped_at_full_disk(result("first"), disk / "run", 10, 20, kept=tmp_path / "first")
    check_resumed(result("second"), tmp_path / "second", 10, 30)


# --- chat: Ctrl-C, Ctrl-D, and a model never tuned for chat ----------------------------------------------
SLOW_RUNNER = """
import os, runpy, time

import euler_model

_generate = euler_model.generate


def slow_generate(*args, **kwargs):  # a model that takes its time over every token
    for token in _generate(*args, **kwargs):
        time.sleep(float(os.environ["TOKEN_DELAY"]))
        yield token


euler_model.generate = slow_generate
runpy.run_module("euler_train.cli", run_name="__main__", alter_sys=True)
"""


def chunks(fd: int, poll: float) -> Iterator[bytes]:
    """What `fd` gives, a chunk at a time (b"" after `poll` quiet seconds), until its writer is gone."""
    while True:
        if not select.select([fd], [], [], poll)[0]:
            yield b""
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # a pty whose other side closed
            return
        if not chunk:
            return
        yield chunk


def read_until(fd: int, marker: bytes, seen: bytes = b"", count: int = 1, timeout: float = 90) -> bytes:
    """Bytes read from `fd` (after `seen`) until `marker` appeared `count` times in all."""
    deadline = time.monotonic() + timeout
    for chunk in chunks(fd, 0.2):
        seen += chunk
        if seen.count(marker) >= count or time.monotonic() > deadline:
            break
    assert seen.count(marker) >= count, seen
    return seen


def chat(checkpoint: Path, *flags: str, runner: Path | None = None, delay: float = 0, **kw) -> Any:
    """`euler-train chat` as a Popen (through `runner`, each token `delay` seconds late, when given)."""
    head = [sys.executable, str(runner)] if runner else CLI
    argv = [*head, "chat", "--checkpoint", str(checkpoint), "--max-new-tokens", "4", "--seed", "0", *flags]
    # SIGINT as a shell leaves it: a test runner's worker may ignore it, and a child inherits that
    default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    return subprocess.Popen(argv, env=dict(ENV, TOKEN_DELAY=str(delay)), preexec_fn=default_sigint, **kw)


def drain(fd: int, seen: bytes) -> bytes:
    """`seen` and whatever else can be read from `fd` until its writer is gone (or a second of quiet)."""
    for chunk in chunks(fd, 1):
        if not chunk:
            break
        seen += chunk
    return seen


def pipes() -> dict:
    return {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    """(exit code, stderr) once `proc` ends."""
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, proc.stderr.read().decode()


def test_ctrl_c_at_the_chat_prompt_exits_130_in_one_line(chat_run) -> None:
    proc = chat(chat_run, **pipes())
    read_until(proc.stdout.fileno(), b"euler chat: ")  # the banner: the prompt is next
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130 and err == "euler-train chat: interrupted\n"


def test_end_of_input_ends_the_chat_with_0(chat_run) -> None:
    proc = chat(chat_run, **pipes())
    proc.stdin.write(b"What does json do?\n")
    proc.stdin.close()
    rc, err = finish(proc)
    assert rc == 0 and err == ""
    assert proc.stdout.read().count(b"assistant> ") == 1


def test_on_a_terminal_ctrl_d_ends_the_prompt_line_and_ctrl_c_exits_130(chat_run) -> None:
    for key, code in ((b"\x04", 0), (None, 130)):  # Ctrl-D; Ctrl-C (the terminal's SIGINT)
        master, slave = pty.openpty()
        proc = chat(chat_run, stdin=slave, stdout=slave, stderr=subprocess.PIPE, close_fds=True)
        os.close(slave)
        try:
            seen = read_until(master, b"you> ")
            if key is None:
                proc.send_signal(signal.SIGINT)
            else:
                os.write(master, key)
            rc, err = finish(proc)
            seen = drain(master, seen)  # what the terminal shows after it
        finally:
            os.close(master)
        assert rc == code and "Traceback" not in err, err
        if key is None:
            assert err == "euler-train chat: interrupted\n"
        else:
            assert seen.endswith(b"you> \r\n") and err == ""  # the shell's prompt starts on its own line


def test_ctrl_c_while_the_model_answers_stops_that_answer_and_the_chat_goes_on(chat_run, tmp_path) -> None:
    runner = tmp_path / "slow.py"
    runner.write_text(SLOW_RUNNER, encoding="utf-8")
    proc = chat(chat_run, "--max-new-tokens", "2", runner=runner, delay=0.5, **pipes())
    proc.stdin.write(b"What does json do?\n")
    proc.stdin.flush()
    seen = read_until(proc.stdout.fileno(), b"assistant> ")
    proc.send_signal(signal.SIGINT)  # while the first token is on its way
    seen = read_until(proc.stdout.fileno(), b"(reply stopped", seen)
    proc.stdin.write(b"And re?\n")
    proc.stdin.close()
    seen = read_until(proc.stdout.fileno(), b"assistant> ", seen, count=2)
    rc, err = finish(proc)
    assert rc == 0 and err == "", err
    out = (seen + proc.stdout.read()).decode()
    assert "(reply stopped; Ctrl-C at the prompt, Ctrl-D or /quit ends the chat)" in out
    assert out.count("assistant> ") == 2


def test_chatting_with_a_pretrained_checkpoint_says_so_once(tiny_run, chat_run, cli) -> None:
    ckpt = tiny_run / "checkpoints" / "step_30"
    note = (
        f"euler-train: note: {ckpt} was pretrained, not tuned for chat (euler-train sft); its replies may "
        "not follow the chat format\n"
    )
    proc = cli("chat", "--checkpoint", str(tiny_run), "--max-new-tokens", "3", input="Hi\nAnd you?\n")
    assert proc.returncode == 0 and proc.stderr == note and proc.stdout.count("assistant> ") == 2
    gen = ["generate", "--checkpoint", str(tiny_run), "--prompt", "Hi", "--max-new-tokens", "3"]
    proc = cli(*gen, "--chat")
    assert proc.returncode == 0 and proc.stderr == note and proc.stdout.strip()
    assert cli(*gen).stderr == ""  # a plain continuation is what a pretrained model does
    assert cli("chat", "--checkpoint", str(chat_run), input="Hi\n").stderr == ""  # tuned: no note


# --- generate | head ------------------------------------------------------------------------------------
def test_generate_into_a_pipe_closed_early_exits_quietly(tiny_run, tmp_path) -> None:
    """What `euler-train generate ... | head -c 1` does: the reader leaves while tokens still come."""
    runner = tmp_path / "slow.py"
    runner.write_text(SLOW_RUNNER, encoding="utf-8")
    argv = [sys.executable, str(runner), "generate", "--checkpoint", str(tiny_run), "--prompt", "The module"]
    proc = subprocess.Popen(
        [*argv, "--max-new-tokens", "20", "--seed", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(ENV, TOKEN_DELAY="0.1"),
    )
    assert os.read(proc.stdout.fileno(), 1)  # the first byte: then the reader goes away
    proc.stdout.close()
    rc, err = finish(proc)
    assert rc == 128 + signal.SIGPIPE and err == "", err


# --- what a user reads at the end of a run --------------------------------------------------------------
def test_the_last_line_of_a_run_gives_next_token_val_loss_and_bits_per_byte(dataset, tiny_run, tmp_path, cli):
    run = tmp_path / "run"
    proc = cli(
        "pretrain", "--data", str(dataset), "--out", str(run), "--steps", "6", "--eval-every", "3", *TINY
    )
    assert proc.returncode == 0, proc.stderr
    row = [r for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r][-1]
    assert row["step"] == 6 and row["val_next_loss"] != row["val_loss"]  # 4 heads: the mean is another number
    tokens = json.loads((run / "checkpoints" / "step_6" / "trainer_state.json").read_text())["tokens"]
    assert proc.stdout.strip().splitlines()[-1] == (
        f"euler-train: done: 6 steps, {tokens:,} tokens, val loss {row['val_next_loss']:.4f} (next token), "
        f"{row['val_bpb']:.4f} bits per byte; run folder {run}"
    )
    sft = tmp_path / "sft"
    argv = ["sft", "--data", str(dataset), "--init", str(tiny_run), "--out", str(sft), "--steps", "2"]
    proc = cli(*argv, "--eval-every", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    row = read_metrics(sft / "metrics.jsonl")[-1]
    val = f"val loss {row['val_next_loss']:.4f} (next token); "
    assert re.search(rf"done: 2 steps, [\d,]+ tokens, {re.escape(val)}", proc.stdout)  # no bpb in an SFT run


def test_the_full_disk_check_reads_the_errno_safetensors_gives(tmp_path) -> None:
    """safetensors reports an OS error in its message only; os_error finds it (EDQUOT too)."""
    from safetensors import SafetensorError

    from euler_train.checkpoint import os_error

    err = SafetensorError(f"Error while serializing: I/O error: {os.strerror(errno.EDQUOT)} (os error 122)")
    assert os_error(err).errno == errno.EDQUOT
    assert os_error(SafetensorError("Error while deserializing header: HeaderTooLarge")) is None
