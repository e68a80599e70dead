"""A CPU data-parallel world over local sockets (EULER_COMM=socket): the same trainer code path as NCCL,
for tests and debugging on machines without GPUs.

Rank 0 listens on an ephemeral localhost port and writes it, with a random key, to a file in the run
folder; the other ranks connect. An all-reduce sends each rank's flat float buffer to rank 0, which adds
them in rank order (deterministic) and sends the sum back. Raw bytes only, no pickles.

>>> # RANK=0 WORLD_SIZE=2 EULER_COMM=socket euler-train pretrain ...   (and RANK=1 beside it)
"""

from __future__ import annotations

import json
import os
import secrets
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

import numpy as np

from euler_train.comm import Comm


def _address_file(run_dir: Path) -> Path:
    return run_dir / f".socket-{os.environ.get('MASTER_PORT', '0')}.json"


class SocketComm(Comm):
    """Star all-reduce through rank 0 over multiprocessing.connection (localhost)."""

    def __init__(self, rank: int, world_size: int, run_dir: Path, timeout: float = 120.0) -> None:
        self.rank, self.world_size, self.local_rank = rank, world_size, rank
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
        """Sum of `flat` (1-D) over ranks, added in rank order on rank 0."""
        if self.rank != 0:
            self.peers[0].send_bytes(flat.tobytes())
            return np.frombuffer(self.peers[0].recv_bytes(), dtype=flat.dtype).copy()
        total = flat.copy()
        for conn in self.peers:
            total += np.frombuffer(conn.recv_bytes(), dtype=flat.dtype)
        for conn in self.peers:
            conn.send_bytes(total.tobytes())
        return total

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
