"""The captured step's memory laid out ahead of time: one slab, every allocation at a planned offset.

CuPy's pool serves a step's allocations as they come: a block freed in the forward is split for a smaller
one, a larger one then needs fresh memory, and the pool ends up holding about a gigabyte more than the
step ever has in use at once (856M model, kept activations). A captured step, though, makes the same
requests in the same order every time its body runs. So graph_step records them in the dry run that comes
before the capture (`AllocationRecord`: each request's size, when it was made and when its block was
freed), served by a pool that gives every freed block back at once (so the dry run holds no more than it
has in use), packs those lifetimes into one slab (`plan_offsets`), and captures the graph
with every request served from the slab (`PlannedAllocator`). A request the record did not foresee
(another size, more requests, or a slab range still in use because a block lives longer than it did in
the record) is served by the pool instead: two live arrays never share an address, whatever the step does.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import euler_kernels as ek

# bytes: every block starts on this boundary, as CuPy's pool's do (kernels choose paths by alignment)
ALIGN = 512


def block_bytes(sizes: list[int] | np.ndarray) -> np.ndarray:
    """Each request's bytes rounded up to ALIGN: what its block takes of the slab (int64).

    >>> block_bytes([1, 512, 513]).tolist()
    [512, 512, 1024]
    """
    return (np.asarray(sizes, dtype=np.int64) + ALIGN - 1) // ALIGN * ALIGN


def plan_offsets(sizes: list[int], starts: list[int], ends: list[int | None]) -> tuple[np.ndarray, int]:
    """(offsets, slab bytes): an offset in one slab for each block i, alive from event starts[i] to event
    ends[i] (None: to the end), such that no two blocks alive at once share a byte. Largest block first,
    each at the lowest offset free over its whole lifetime (greedy by size, which lands within a few percent
    of the most bytes ever alive at once on networks' lifetimes).

    >>> offsets, total = plan_offsets([1024, 1024, 2048], [0, 1, 3], [2, 5, None])
    >>> offsets.tolist(), total  # blocks 0 and 2 are never alive at once: they share an address
    ([0, 2048, 0], 3072)
    """
    n = len(sizes)
    size = block_bytes(sizes)
    start = np.asarray(starts, dtype=np.int64)
    end = np.array([np.iinfo(np.int64).max if e is None else e for e in ends], dtype=np.int64)
    offsets = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for i in np.lexsort((start, -size)):  # largest first; among equals, the earliest
        meets = placed & (start < end[i]) & (start[i] < end)  # placed blocks alive at some time i is
        lo, hi = offsets[meets], offsets[meets] + size[meets]
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
        # below the k-th block (by offset), the lowest free byte is the furthest end of the blocks before it
        reach = np.concatenate(([0], np.maximum.accumulate(hi)))
        fits = np.flatnonzero(lo - reach[:-1] >= size[i])
        offsets[i] = reach[fits[0]] if fits.size else reach[-1]
        placed[i] = True
    return offsets, int((offsets + size).max()) if n else 0


def peak_in_use(sizes: list[int], starts: list[int], ends: list[int | None]) -> int:
    """The most bytes (each block rounded to ALIGN) alive at once: no plan's slab can be smaller.

    >>> peak_in_use([1024, 1024, 2048], [0, 1, 3], [2, 5, None])
    3072
    """
    return _peak(sizes, starts, ends)[0]


def _peak(sizes: list[int], starts: list[int], ends: list[int | None]) -> tuple[int, int]:
    """(the most bytes alive at once, the first tick they are)."""
    size = block_bytes(sizes).tolist()
    made = [(t, s) for t, s in zip(starts, size)]
    events = sorted(made + [(e, -s) for e, s in zip(ends, size) if e is not None])
    alive = peak = peak_tick = 0
    for tick, change in events:  # event ticks are distinct: each alloc or free is its own
        alive += change
        if alive > peak:
            peak, peak_tick = alive, tick
    return peak, peak_tick


class _Release:
    """Owner of one block: when the last array on the block is gone, so is this, and the block is freed."""

    __slots__ = ("index", "memory", "on_free")

    def __init__(self, on_free: Callable[[int], None], index: int, memory: Any) -> None:
        self.on_free, self.index, self.memory = on_free, index, memory

    def __del__(self) -> None:
        self.memory = None  # the block goes back to its source before the owner hears of it
        self.on_free(self.index)


class AllocationRecord:
    """An allocator (`malloc`) that serves from `source` (another allocator) and records each request:
    sizes[i], and the ticks at which block i was made (starts[i]) and freed (ends[i]; None while it lives);
    with `sites`, also where each was asked for (call_site); `after_free`, called after each block goes back
    to the source (a pool's free_all_blocks: it then holds no more than is in use, each block its own
    cudaMalloc). After `close`, frees are neither ticked nor passed on (cudaFree may not run in a capture),
    but `alive` still follows them. Size-0 requests are neither recorded nor planned."""

    def __init__(
        self,
        cp: Any,
        source: Callable[[int], Any],
        sites: bool = False,
        after_free: Callable[[], Any] | None = None,
    ) -> None:
        self.cp, self.source, self.after_free = cp, source, after_free
        self.sites: list[str] | None = [] if sites else None
        self.sizes: list[int] = []
        self.starts: list[int] = []
        self.ends: list[int | None] = []
        self.alive: list[bool] = []
        self.tick, self.closed = 0, False

    def malloc(self, size: int) -> Any:
        held = self.source(size)
        if size == 0:
            return held
        index = len(self.sizes)
        self.sizes.append(size)
        self.starts.append(self.tick)
        self.ends.append(None)
        self.alive.append(True)
        if self.sites is not None:
            self.sites.append(call_site())
        self.tick += 1
        owner = _Release(self._freed, index, held)
        memory = self.cp.cuda.UnownedMemory(held.ptr, size, owner, held.device_id)
        return self.cp.cuda.MemoryPointer(memory, 0)

    def _freed(self, index: int) -> None:
        self.alive[index] = False
        if self.closed:  # blocks that outlive the record stay alive to its end
            return
        self.ends[index] = self.tick
        self.tick += 1
        if self.after_free is not None:
            self.after_free()

    def close(self) -> None:
        self.closed = True


# requests a captured body makes that the record's next ones are not: how far ahead a request's size is
# looked for (the dry run makes a few the capture does not: workspaces made once, kept out of the plan)
LOOKAHEAD = 16


class PlannedAllocator:
    """An allocator (`malloc`) that serves the record's requests in order from `slab`: a request takes
    the next recorded block of its size (within LOOKAHEAD; the ones passed over are never made) at
    offsets[i], unless a block sharing that range is still alive; otherwise `fallback` (the pool) serves
    it and `misses` counts it. sizes[i] < 0: a recorded block kept out of the plan."""

    def __init__(self, cp: Any, sizes: list[int], offsets: np.ndarray, slab: Any, fallback: Callable) -> None:
        self.cp, self.slab, self.fallback = cp, slab, fallback
        self.sizes, self.offsets = sizes, offsets
        n = len(sizes)
        lo = np.asarray(offsets, dtype=np.int64)
        hi = lo + block_bytes(np.maximum(sizes, 0))  # a block kept out of the plan takes no bytes
        # for each block: the blocks made before it that share a byte of the slab (the plan has them freed
        # by then; the capture must too)
        self.before = [np.flatnonzero((lo[:i] < hi[i]) & (lo[i] < hi[:i])) for i in range(n)]
        self.alive = np.zeros(n, dtype=bool)
        self.next, self.misses = 0, 0
        self.device = cp.cuda.Device().id

    def malloc(self, size: int) -> Any:
        if size == 0:
            return self.fallback(0)
        ahead = self.sizes[self.next : self.next + LOOKAHEAD]
        if size not in ahead:
            self.misses += 1
            return self.fallback(size)
        i = self.next + ahead.index(size)
        self.next = i + 1
        if self.alive[self.before[i]].any():
            self.misses += 1
            return self.fallback(size)
        self.alive[i] = True
        owner = _Release(self._freed, i, self.slab)
        memory = self.cp.cuda.UnownedMemory(self.slab.ptr + int(self.offsets[i]), size, owner, self.device)
        return self.cp.cuda.MemoryPointer(memory, 0)

    def _freed(self, index: int) -> None:
        self.alive[index] = False


def plan_record(record: AllocationRecord) -> tuple[list[int], np.ndarray, int, int]:
    """(sizes, offsets, slab bytes, the most bytes alive at once) for the record's blocks that are no
    longer alive: those still alive were made once and stay (a workspace, a buffer the body fills), so they
    are kept out of the plan (their sizes -1) and keep the memory they have."""
    planned = [i for i, alive in enumerate(record.alive) if not alive]
    lifetimes = [[seq[i] for i in planned] for seq in (record.sizes, record.starts, record.ends)]
    planned_offsets, total = plan_offsets(*lifetimes)
    sizes = [-1] * len(record.sizes)
    offsets = np.zeros(len(record.sizes), dtype=np.int64)
    for i, offset in zip(planned, planned_offsets.tolist()):
        sizes[i], offsets[i] = record.sizes[i], offset
    return sizes, offsets, total, peak_in_use(*lifetimes)


@contextlib.contextmanager
def no_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector off inside the scope, so that a block is freed exactly when its last
    reference goes, the same in the dry run that records the requests as in the capture planned for them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def alive_at_peak(sizes: list[int], starts: list[int], ends: list[int | None]) -> list[int]:
    """The blocks alive at the first tick where the most bytes are (what a smaller peak must shrink).

    >>> alive_at_peak([1024, 1024, 2048], [0, 1, 3], [2, 5, None])
    [1, 2]
    """
    tick = _peak(sizes, starts, ends)[1]
    return [i for i, (s, e) in enumerate(zip(starts, ends)) if s <= tick and (e is None or tick < e)]


# The files of euler_kernels' ops: where its public functions are defined, in its op folders (not its
# shared plumbing: the package root and cuda/).
OP_FILES = frozenset(
    path
    for path in (inspect.getfile(f) for f in map(ek.__dict__.get, ek.__all__) if inspect.isfunction(f))
    if os.path.basename(os.path.dirname(path)) not in ("euler_kernels", "cuda")
)


def call_site() -> str:
    """Where in euler's packages the current allocation was asked for: the two innermost frames of
    euler_model / euler_train / euler_kernels' ops (file:line function), innermost first."""
    frames = [
        f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
        for f in reversed(traceback.extract_stack(limit=24))
        if f.filename in OP_FILES or any(part in f.filename for part in ("euler_model", "euler_train/step"))
    ]
    return " < ".join(frames[:2]) or "?"
