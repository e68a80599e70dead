"""Data parallelism over NCCL (CuPy's bindings): one process per GPU, gradients all-reduced in buckets.

`Comm` (comm.py) is the single-process world (every collective is the identity); `NcclComm` the real one
over NCCL, `SocketComm` (socket_comm.py, EULER_COMM=socket) one over local sockets for CPU tests. The
launcher `spawn(n, argv)` starts n copies of this CLI with RANK / WORLD_SIZE / LOCAL_RANK set and a shared
NCCL id in EULER_NCCL_ID; a process started by another launcher (torchrun-style variables already set)
rendezvous through a file in the run folder instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from euler_train.comm import Comm
from euler_train.socket_comm import SocketComm

BUCKET_BYTES = 25 * 2**20  # gradients are packed into flat buffers of about this size per all-reduce
CLEAN_EXITS = (0, 128 + signal.SIGINT, 128 + signal.SIGTERM)  # done, or stopped by a signal after saving


def env_world() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the launcher's environment; (0, 1, 0) when unset."""
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    if not 0 <= rank < world:
        raise ValueError(f"env_world: RANK={rank} must be in [0, WORLD_SIZE={world})")
    return rank, world, local


def buckets(names: list[str], sizes: dict[str, int], bucket_bytes: int) -> list[list[str]]:
    """Group parameter names, in order, into runs whose byte sizes add up to about `bucket_bytes`.

    >>> buckets(["a", "b", "c"], {"a": 6, "b": 6, "c": 6}, 10)
    [['a', 'b'], ['c']]
    """
    groups: list[list[str]] = [[]]
    filled = 0
    for name in names:
        if groups[-1] and filled >= bucket_bytes:
            groups.append([])
            filled = 0
        groups[-1].append(name)
        filled += sizes[name]
    return [g for g in groups if g]


class NcclComm(Comm):
    """NCCL communicator over CuPy arrays; all-reduces run on their own stream, bucket by bucket."""

    def __init__(self, rank: int, world_size: int, local_rank: int, nccl_id: tuple) -> None:
        import cupy
        from cupy.cuda import nccl

        self.cp, self.nccl = cupy, nccl
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        cupy.cuda.Device(local_rank).use()
        self.comm = nccl.NcclCommunicator(world_size, nccl_id, rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.flat: dict[int, Any] = {}  # bucket index -> persistent flat buffer

    def _dtype_code(self, dtype: Any) -> int:
        codes = {"float32": self.nccl.NCCL_FLOAT32, "float64": self.nccl.NCCL_FLOAT64}
        return codes[str(dtype)]

    def allreduce_grads(self, grads: dict[str, Any]) -> None:
        """Pack each bucket on the compute stream, all-reduce it on the comm stream while the next packs."""
        groups = buckets(list(grads), {n: grads[n].nbytes for n in grads}, BUCKET_BYTES)
        compute = self.cp.cuda.get_current_stream()
        for i, group in enumerate(groups):
            buf = self._pack(i, [grads[n] for n in group])
            self.stream.wait_event(compute.record())  # the comm stream waits for this bucket's packing only
            code, total = self._dtype_code(buf.dtype), self.nccl.NCCL_SUM
            self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, code, total, self.stream.ptr)
        compute.wait_event(self.stream.record())  # unpacking waits for every all-reduce
        for i, group in enumerate(groups):
            self._unpack(self.flat[i], [grads[n] for n in group])

    def _pack(self, index: int, arrays: list[Any]) -> Any:
        """Bucket `index`'s persistent flat buffer (re-made only when its size changes), filled."""
        total, dtype = sum(a.size for a in arrays), arrays[0].dtype
        buf = self.flat.get(index)
        if buf is None or buf.size != total or buf.dtype != dtype:
            buf = self.flat[index] = self.cp.empty(total, dtype=dtype)
        self.cp.concatenate([a.reshape(-1) for a in arrays], out=buf)
        return buf

    @staticmethod
    def _unpack(buf: Any, arrays: list[Any]) -> None:
        """Copy the reduced flat buffer back into the gradient arrays, in place."""
        offset = 0
        for a in arrays:
            a[...] = buf[offset : offset + a.size].reshape(a.shape)
            offset += a.size

    def allreduce_scalars(self, values: list[float]) -> list[float]:
        buf = self.cp.asarray(values, dtype=self.cp.float64)
        stream = self.cp.cuda.get_current_stream()
        self.comm.allReduce(
            buf.data.ptr, buf.data.ptr, buf.size, self.nccl.NCCL_FLOAT64, self.nccl.NCCL_SUM, stream.ptr
        )
        return [float(x) for x in buf.get()]

    def barrier(self) -> None:
        self.allreduce_scalars([0.0])

    def close(self) -> None:
        self.cp.cuda.get_current_stream().synchronize()
        self.comm.destroy()


def _rendezvous_file(run_dir: Path) -> Path:
    tag = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT") or "0"
    return run_dir / f".nccl_id-{tag}.json"


def shared_nccl_id(rank: int, run_dir: Path, timeout: float = 120.0) -> tuple:
    """The NCCL unique id: from EULER_NCCL_ID, else rank 0 writes it to the run folder and others read it."""
    if "EULER_NCCL_ID" in os.environ:
        return tuple(json.loads(os.environ["EULER_NCCL_ID"]))
    from cupy.cuda import nccl

    path = _rendezvous_file(run_dir)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(list(nccl.get_unique_id())))
        os.replace(tmp, path)
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: no NCCL id from rank 0 in {path} after {timeout:.0f} s")
        time.sleep(0.1)
    return tuple(json.loads(path.read_text()))


def init_comm(gpus: int, run_dir: Path) -> Comm:
    """The communicator: `Comm()` for one process, else NCCL (or local sockets with EULER_COMM=socket)."""
    rank, world, local = env_world()
    if world == 1:
        return Comm()
    if gpus not in (1, world):
        raise ValueError(f"init_comm: --gpus {gpus} disagrees with WORLD_SIZE={world} set by the launcher")
    if os.environ.get("EULER_COMM") == "socket":  # CPU world for tests (socket_comm.py)
        return SocketComm(rank, world, run_dir)
    comm = NcclComm(rank, world, local, shared_nccl_id(rank, run_dir))
    comm.barrier()
    if rank == 0:
        _rendezvous_file(run_dir).unlink(missing_ok=True)
    return comm


# Set by `spawn` in its workers: the launcher holds the run folder's lock for the whole world.
LAUNCHER_PID = "EULER_LAUNCHER_PID"


def spawned() -> bool:
    """Whether this process is a worker that `spawn` started (its launcher speaks for the command)."""
    return LAUNCHER_PID in os.environ


def holds_run_lock(rank: int) -> bool:
    """Whether this process takes the run folder's lock: one process a world, the launcher when there
    is one (`spawn`: this process's parent), else rank 0."""
    return rank == 0 and os.environ.get(LAUNCHER_PID) != str(os.getppid())


def spawn(n: int, argv: list[str]) -> int:
    """Run `python -m euler_train.cli argv` once per GPU; forward signals; return the worst exit code."""
    env = dict(os.environ, WORLD_SIZE=str(n), NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    env[LAUNCHER_PID] = str(os.getpid())
    if env.get("EULER_COMM") != "socket":  # NCCL: one id for the whole world, made here
        from cupy.cuda import nccl

        env["EULER_NCCL_ID"] = json.dumps(list(nccl.get_unique_id()))
    else:
        env.setdefault("MASTER_PORT", str(os.getpid()))  # names this world's rendezvous file
    procs = [
        subprocess.Popen(  # own session: a Ctrl-C reaches the workers once, forwarded by this process
            [sys.executable, "-m", "euler_train.cli", *argv],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            start_new_session=True,
        )
        for r in range(n)
    ]

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _wait_all(procs)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _wait_all(procs: list[subprocess.Popen]) -> int:
    """Wait for every process; when one crashes, terminate the rest (NCCL would hang without it)."""
    codes: dict[int, int] = {}
    while len(codes) < len(procs):
        for i, p in enumerate(procs):
            if i not in codes and p.poll() is not None:
                codes[i] = p.returncode
                if p.returncode not in CLEAN_EXITS:  # a crash: the others would wait in a collective
                    for q in procs:
                        if q.poll() is None:
                            q.terminate()
        time.sleep(0.2)
    return max(codes.values(), key=abs)
