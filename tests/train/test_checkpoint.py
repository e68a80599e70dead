"""Checkpoint manager: atomic folders with checksums, fallback past corrupt ones, pruning."""

from __future__ import annotations

import errno
import json
import os

import pytest

from euler_train.checkpoint import CHECKSUMS, STATE, CheckpointError, CheckpointManager, verify


def writer(payload: bytes):
    def write(folder):
        (folder / "model.safetensors").write_bytes(payload)
        (folder / "optimizer.safetensors").write_bytes(payload[::-1])

    return write


def test_save_writes_files_state_and_checksums(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path / "checkpoints")
    path = mgr.save(7, writer(b"weights" * 100), {"step": 7, "val_loss": None})
    assert path == tmp_path / "checkpoints" / "step_7"
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [CHECKSUMS, STATE, "model.safetensors", "optimizer.safetensors"]
    )
    assert json.loads((path / STATE).read_text())["step"] == 7
    listed = (path / CHECKSUMS).read_text().split()
    assert "model.safetensors" in listed and STATE in listed
    assert verify(path) is None
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "no_sums"])
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    mgr.save(10, writer(b"a" * 1000), {"step": 10})
    newest = mgr.save(20, writer(b"b" * 1000), {"step": 20})
    target = newest / "model.safetensors"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:500])
    elif damage == "flip":
        target.write_bytes(b"c" + target.read_bytes()[1:])
    elif damage == "delete":
        target.unlink()
    else:
        (newest / CHECKSUMS).unlink()
    messages: list[str] = []
    assert mgr.latest_valid(log=messages.append).name == "step_10"
    assert len(messages) == 1 and "step_20" in messages[0] and "previous" in messages[0]


def test_all_corrupt_is_a_clear_error_and_none_is_none(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    assert mgr.latest_valid() is None
    path = mgr.save(3, writer(b"x"), {"step": 3})
    (path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"no valid checkpoint.*all 1 are truncated or corrupt"):
        mgr.latest_valid(log=lambda m: None)


def test_keeps_the_last_n_and_the_best(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=2, keep_best=True)
    losses = {10: 3.0, 20: 1.0, 30: 2.0, 40: 2.5, 50: None}
    for step, loss in losses.items():
        mgr.save(step, writer(b"w"), {"step": step, "val_loss": loss})
    assert [p.name for p in mgr.folders()] == ["step_50", "step_40", "step_20"]
    assert mgr.best().name == "step_20"


def test_without_keep_best_only_the_last_n_stay(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep_last=1, keep_best=False)
    for step, loss in [(1, 0.5), (2, 9.0)]:
        mgr.save(step, writer(b"w"), {"step": step, "val_loss": loss})
    assert [p.name for p in mgr.folders()] == ["step_2"]


def test_resaving_a_step_replaces_it_whole(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(5, writer(b"old"), {"step": 5})
    path = mgr.save(5, writer(b"new"), {"step": 5})
    assert (path / "model.safetensors").read_bytes() == b"new"
    assert verify(path) is None and len(mgr.folders()) == 1


def test_half_written_temporaries_are_ignored_and_cleaned(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, writer(b"w"), {"step": 1})
    tmp = tmp_path / ".tmp-step_2-999"
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(b"half")
    assert mgr.latest_valid().name == "step_1"
    mgr.clean_temporaries()
    assert not tmp.exists()


def test_a_failing_writer_leaves_no_checkpoint(tmp_path) -> None:
    """An OSError while writing (the disk full) is one line naming the last good checkpoint; any other
    error passes through; neither leaves anything half-written."""
    mgr = CheckpointManager(tmp_path)

    def broken(folder):
        (folder / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(CheckpointError) as failed:
        mgr.save(4, broken, {"step": 4})
    assert str(failed.value).startswith(f"cannot write {tmp_path}/step_4: the disk is full; {tmp_path} holds")
    assert mgr.folders() == []
    assert list(tmp_path.iterdir()) == []
    mgr.save(2, lambda d: (d / "model.safetensors").write_bytes(b"w"), {"step": 2})
    with pytest.raises(CheckpointError, match="the last good checkpoint is step_2; fix that, then continue"):
        mgr.save(4, broken, {"step": 4})

    def wrong(folder):
        raise ValueError("not an OS error")

    with pytest.raises(ValueError, match="not an OS error"):
        mgr.save(4, wrong, {"step": 4})
    assert [p.name for p in tmp_path.iterdir()] == ["step_2"]
