"""A CPU data-parallel world over local sockets (EULER_COMM=socket): the same trainer code path as NCCL,
for tests and debugging on machines without GPUs.

Rank 0 listens on an ephemeral localhost port and writes it, with a random key, to a file in the run
folder; the other ranks connect. An all-reduce sends each rank's flat float buffer to rank 0, which adds
them in rank order (deterministic) and sends the sum back. Raw bytes only, no pickles.

A rank that dies closes its connection and one that hangs stops sending and reading: rank 0 names the
lost rank, tells the other ranks (an empty message, then the reason as text) and every survivor raises
CommError. A collective waits at most EULER_COMM_TIMEOUT seconds (default 600) for a rank's buffer on
rank 0, and twice that for rank 0's answer on the other ranks (rank 0 may itself be waiting out a silent
rank); a send waits as long for its reader (a buffer larger than the socket's blocks until it is read).

>>> # RANK=0 WORLD_SIZE=2 EULER_COMM=socket euler-train pretrain ...   (and RANK=1 beside it)
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from euler_train.comm import Comm, CommError

DIED = "its connection closed (the process died or was killed)"
NOTICE_S = 5.0  # how long rank 0 waits for the ranks it told of a lost rank to hang up


def collective_timeout() -> float:
    """Seconds a collective waits for a rank: EULER_COMM_TIMEOUT, default 600 (a checkpoint or an
    evaluation on rank 0 must fit in it)."""
    return float(os.environ.get("EULER_COMM_TIMEOUT", "600"))


def _address_file(run_dir: Path) -> Path:
    return run_dir / f".socket-{os.environ.get('MASTER_PORT', '0')}.json"


def send_within(conn: Connection, data: bytes, wait: float) -> str | None:
    """Send `data`, waiting at most `wait` seconds for the peer to take it: None when it did, else why not
    (its connection closed, or it read nothing). The send runs on a daemon thread, since a blocked socket
    write has no timeout of its own; one left blocked ends with the process, which is stopping."""
    failed: list[OSError] = []

    def send() -> None:
        try:
            conn.send_bytes(data)
        except OSError as err:
            failed.append(err)

    sender = threading.Thread(target=send, name="euler-socket-send", daemon=True)
    sender.start()
    sender.join(wait)
    if sender.is_alive():
        return f"it read nothing for {wait:g} s (EULER_COMM_TIMEOUT)"
    return DIED if failed else None


def _drain(conn: Connection, deadline: float) -> None:
    """Read and drop what `conn` sends until it closes, or until `deadline` (time.monotonic())."""
    try:
        while conn.poll(max(deadline - time.monotonic(), 0.0)):
            conn.recv_bytes()
    except (OSError, EOFError):
        pass


class SocketComm(Comm):
    """Star all-reduce through rank 0 over multiprocessing.connection (localhost)."""

    def __init__(
        self, rank: int, world_size: int, run_dir: Path, timeout: float = 120.0, wait: float | None = None
    ) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, rank
        self.wait = collective_timeout() if wait is None else wait  # seconds a collective waits for a rank
        self.peers: list[Connection] = []
        path = _address_file(run_dir)
        if rank == 0:
            self._serve(run_dir, path)
        else:
            self.peers = [self._connect(path, timeout)]

    def _serve(self, run_dir: Path, path: Path) -> None:
        key = secrets.token_bytes(16)
        listener = Listener(("127.0.0.1", 0), authkey=key)
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": listener.address[1], "key": key.hex()}))
        os.replace(tmp, path)
        by_rank = {}
        for _ in range(self.world_size - 1):
            conn = listener.accept()
            by_rank[int.from_bytes(conn.recv_bytes(), "little")] = conn
        self.peers = [by_rank[r] for r in sorted(by_rank)]
        listener.close()
        path.unlink(missing_ok=True)

    def _connect(self, path: Path, timeout: float) -> Connection:
        deadline = time.monotonic() + timeout
        while True:  # a stale file from an earlier run just fails to connect: read it again
            try:
                info = json.loads(path.read_text())
                conn = Client(("127.0.0.1", info["port"]), authkey=bytes.fromhex(info["key"]))
                conn.send_bytes(self.rank.to_bytes(4, "little"))
                return conn
            except (OSError, ValueError, KeyError, EOFError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: rank 0 did not answer through {path}") from None
                time.sleep(0.05)

    def _allreduce(self, flat: np.ndarray) -> np.ndarray:
        """Sum of `flat` (1-D, not empty) over ranks, added in rank order on rank 0; CommError when a rank
        is lost."""
        if self.rank != 0:
            return self._through_hub(flat)
        total = flat.copy()
        for r, conn in enumerate(self.peers, start=1):
            total += np.frombuffer(self._receive(r, conn, self.wait), dtype=flat.dtype)
        for r, conn in enumerate(self.peers, start=1):
            self._send(r, conn, total.tobytes())
        return total

    def _through_hub(self, flat: np.ndarray) -> np.ndarray:
        """A non-zero rank's side: send to rank 0, read the sum (or rank 0's notice of a lost rank)."""
        hub = self.peers[0]
        self._send(0, hub, flat.tobytes())
        reply = self._receive(0, hub, 2 * self.wait)
        if not reply:  # rank 0's notice: another rank is lost, the reason follows
            notice = self._receive(0, hub, self.wait).decode("utf-8", "replace")
            self._stop(f"{notice} (told by rank 0)")
        return np.frombuffer(reply, dtype=flat.dtype).copy()

    def _send(self, peer: int, conn: Connection, data: bytes) -> None:
        """Send to rank `peer`; a closed connection, or `wait` seconds without it reading, lose it."""
        why = send_within(conn, data, self.wait)
        if why is not None:
            self._lost(peer, why)

    def _receive(self, peer: int, conn: Connection, wait: float) -> bytes:
        """The next message from rank `peer`; a closed connection or `wait` seconds of silence lose it."""
        try:
            if conn.poll(wait):
                return conn.recv_bytes()
        except (OSError, EOFError):
            self._lost(peer, DIED)
        self._lost(peer, f"it sent nothing for {wait:.0f} s (EULER_COMM_TIMEOUT)")

    def _lost(self, peer: int, reason: str) -> NoReturn:
        """Rank `peer` is gone: rank 0 tells every other rank; then this rank stops."""
        what = f"rank {peer} was lost: {reason}"
        if self.rank == 0:
            told = [conn for r, conn in enumerate(self.peers, start=1) if r != peer]
            for conn in told:  # one that is gone too, or does not read, cannot be told
                if send_within(conn, b"", NOTICE_S) is None:
                    send_within(conn, what.encode("utf-8"), NOTICE_S)
            for conn in told:  # closing with unread bytes would reset the notice away: wait for their close
                _drain(conn, time.monotonic() + NOTICE_S)
        self._stop(what)

    def _stop(self, what: str) -> NoReturn:
        world = self.world_size
        raise CommError(f"{what}; rank {self.rank} of {world} stops (resume from the last checkpoint)")

    def allreduce_grads(self, grads: dict[str, Any]) -> None:
        names = list(grads)
        total = self._allreduce(np.concatenate([grads[n].reshape(-1) for n in names]))
        offset = 0
        for n in names:
            grads[n][...] = total[offset : offset + grads[n].size].reshape(grads[n].shape)
            offset += grads[n].size

    def allreduce_scalars(self, values: list[float]) -> list[float]:
        return [float(x) for x in self._allreduce(np.asarray(values, dtype=np.float64))]

    def barrier(self) -> None:
        self.allreduce_scalars([0.0])

    def close(self) -> None:
        for conn in self.peers:
            conn.close()
