"""A rank that dies (kill -9) or hangs (SIGSTOP) makes the others stop within a bounded time, with one
line naming the lost rank and exit code 4, instead of waiting forever in a collective.

The worlds are CPU processes over the socket stand-in for NCCL (EULER_COMM=socket), started the way a
torchrun-style launcher starts them (no `--gpus` parent that could terminate the rest).
"""

from __future__ import annotations

import signal
import subprocess
import time
from multiprocessing import Pipe
from pathlib import Path
from threading import Thread

import pytest

from euler_train.comm import EXIT_LOST_RANK
from euler_train.socket_comm import DIED, send_within
from tests.train.test_distributed import launch

BOUND_S = 30  # a survivor must have stopped this long after the loss at the latest


def argv(dataset: Path, out: Path) -> list[str]:
    """A run far too long to end by itself during the test."""
    return [
        "pretrain",
        "--data",
        str(dataset),
        "--out",
        str(out),
        "--steps",
        "100000",
        "--ckpt-every",
        "0",
        "--eval-every",
        "0",
        "--no-progress",
        "--batch-size",
        "1",
        "--set",
        "model.context=32",
    ]


def start_world(world: int, dataset: Path, out: Path, port: str) -> list[subprocess.Popen]:
    """`world` ranks of one run, returned once rank 0 has logged a few steps (every rank is mid-run)."""
    procs = [launch(r, world, argv(dataset, out), port) for r in range(world)]
    metrics, deadline = out / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "the world did not start"
        time.sleep(0.05)
    return procs


def stopped_within_bound(proc: subprocess.Popen, since: float) -> str:
    """The survivor's stderr, once it has exited with EXIT_LOST_RANK no later than BOUND_S after `since`."""
    _, err = proc.communicate(timeout=BOUND_S + 30)
    assert time.monotonic() - since < BOUND_S, err
    assert proc.returncode == EXIT_LOST_RANK, err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_killed_rank_stops_rank_0_and_the_rank_it_told(tmp_path, dataset) -> None:
    procs = start_world(3, dataset, tmp_path / "run", "4721")
    procs[1].kill()  # kill -9: no handler runs, the socket just closes
    killed_at = time.monotonic()
    procs[1].wait()
    last0 = stopped_within_bound(procs[0], killed_at)
    last2 = stopped_within_bound(procs[2], killed_at)
    assert last0.startswith("euler-train pretrain: error: rank 1 was lost: its connection closed"), last0
    assert "rank 0 of 3 stops" in last0
    assert "rank 1 was lost" in last2 and "(told by rank 0)" in last2 and "rank 2 of 3 stops" in last2, last2


@pytest.mark.slow
def test_a_killed_rank_0_stops_the_others(tmp_path, dataset) -> None:
    procs = start_world(2, dataset, tmp_path / "run", "4722")
    procs[0].kill()
    killed_at = time.monotonic()
    procs[0].wait()
    last = stopped_within_bound(procs[1], killed_at)
    assert "error: rank 0 was lost: its connection closed" in last and "rank 1 of 2 stops" in last, last


@pytest.mark.slow
def test_a_silent_rank_is_lost_after_the_collective_timeout(tmp_path, dataset, monkeypatch) -> None:
    monkeypatch.setenv("EULER_COMM_TIMEOUT", "3")
    procs = start_world(2, dataset, tmp_path / "run", "4723")
    procs[1].send_signal(signal.SIGSTOP)  # alive but silent: only the timeout can tell
    stopped_at = time.monotonic()
    try:
        last = stopped_within_bound(procs[0], stopped_at)
        assert time.monotonic() - stopped_at >= 3  # not before the timeout
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert "error: rank 1 was lost: it sent nothing for 3 s (EULER_COMM_TIMEOUT)" in last, last


def test_a_send_to_a_peer_that_reads_nothing_gives_up_after_the_wait() -> None:
    """A buffer larger than the socket's blocks its writer until the peer reads: a hung peer (alive,
    reading nothing) must not hang the sender past the collective timeout."""
    data = bytes(64 << 20)  # far beyond any socket buffer
    ours, silent = Pipe()  # a socket pair whose other end never reads
    started = time.monotonic()
    assert send_within(ours, data, 0.5) == "it read nothing for 0.5 s (EULER_COMM_TIMEOUT)"
    assert 0.5 <= time.monotonic() - started < 5
    silent.close()  # the blocked send fails now, on its daemon thread

    ours, reading = Pipe()  # a peer that reads takes the whole buffer
    got: list[bytes] = []
    reader = Thread(target=lambda: got.append(reading.recv_bytes()))
    reader.start()
    assert send_within(ours, data, 60) is None
    reader.join()
    assert got == [data]
    reading.close()
    assert send_within(ours, bytes(1 << 20), 5) == DIED  # a closed peer is a dead one
