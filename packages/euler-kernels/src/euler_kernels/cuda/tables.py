"""The multi-tensor kernels' device tables (chunk_table, bf16_table), their bounded cache, and scopes that
keep tables alive.

The multi-tensor kernels (AdamW, sum of squares) read per-tensor pointers and chunk ranges from small
device arrays, built once per list of tensors and keyed by the tensors' addresses and sizes. An eager
step makes new gradient arrays every time, so old tables are evicted, least recently used first. A
captured CUDA graph, though, holds the raw addresses of the tables it was captured with: `keep()` gives
a dict that holds every table made or used inside the scope for as long as the caller keeps the dict, and
inside the scope serves them from there even if the cache has evicted them meanwhile.

Tables are uploaded with `upload`, which also works while a graph is being captured (the graph then
re-copies the table from pinned host memory on each replay): a step whose gradients are new arrays in the
capture can build their tables there. Their device memory comes from a pool of their own, not the current
allocator: whether a table is built or found (it depends on addresses) never changes the sequence of a
step's own allocations, which euler-train's captured step records once and then lays out ahead of time.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np


class TableCache:
    """`get(key, build)` returns the cached table or builds it; `keep()` pins what its scope touches.

    >>> cache = TableCache(capacity=1)
    >>> with cache.keep() as kept:
    ...     a = cache.get("a", lambda: [1])
    >>> b = cache.get("b", lambda: [2])  # evicts "a" from the cache; `kept` still holds it
    >>> kept["a"] is a, "a" in cache
    (True, False)
    """

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._lru: OrderedDict[Hashable, Any] = OrderedDict()
        self._scopes: list[dict[Hashable, Any]] = []

    def __contains__(self, key: Hashable) -> bool:
        return key in self._lru

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        for kept in self._scopes:  # a graph being captured must see the tables of its dry run
            if key in kept:
                table = kept[key]
                break
        else:
            if key in self._lru:
                self._lru.move_to_end(key)
                table = self._lru[key]
            else:
                table = build()
                self._lru[key] = table
                while len(self._lru) > self.capacity:
                    self._lru.popitem(last=False)
        for kept in self._scopes:
            kept[key] = table
        return table

    @contextlib.contextmanager
    def keep(self) -> Iterator[dict[Hashable, Any]]:
        kept: dict[Hashable, Any] = {}
        self._scopes.append(kept)
        try:
            yield kept
        finally:
            self._scopes[:] = [s for s in self._scopes if s is not kept]


class Uploaded(tuple):
    """Device copies of host arrays (a tuple of CuPy arrays); `pinned` holds the page-locked host copies a
    captured graph copies from on each replay, for as long as the table lives."""

    pinned: list[Any]


_pool: Any = None  # the tables' own cupy.cuda.MemoryPool, made at the first upload


def upload(*arrays: np.ndarray) -> Uploaded:
    """The host arrays as CuPy arrays on the current stream, in the tables' own pool. Outside a capture:
    cupy.asarray. While the current stream is being captured (where CuPy refuses host-to-device copies)
    each array goes through a page-locked host buffer and cudaMemcpyAsync, which the graph records as a
    copy node."""
    import cupy

    global _pool
    if _pool is None:
        _pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.get_current_stream()
    with cupy.cuda.using_allocator(_pool.malloc):
        if not stream.is_capturing():
            table = Uploaded(cupy.asarray(a) for a in arrays)
            table.pinned = []
            return table
        devices, pinned = [], []
        for a in arrays:
            a = np.ascontiguousarray(a)
            host = cupy.cuda.alloc_pinned_memory(max(a.nbytes, 1))
            np.frombuffer(host, dtype=a.dtype, count=a.size)[...] = a.reshape(-1)
            device = cupy.empty(a.shape, dtype=a.dtype)
            kind = cupy.cuda.runtime.memcpyHostToDevice
            cupy.cuda.runtime.memcpyAsync(device.data.ptr, host.ptr, a.nbytes, kind, stream.ptr)
            devices.append(device)
            pinned.append(host)
    table = Uploaded(devices)
    table.pinned = pinned
    return table


# --- the multi-tensor kernels' tables (AdamW, sums of squares, casts and sums over many tensors) ---
CHUNK = 8192  # elements per block; must match CHUNK in common.cuh
table_cache = TableCache(capacity=32)
keep_tables = table_cache.keep  # `with keep_tables() as kept:` pins the tables a CUDA graph is captured with


def chunk_table(tensors: list[Any]) -> tuple[Any, Any, Any, Any]:
    """Device tables (pointers, chunk->tensor, chunk->start, sizes) for tensors, cached by address."""

    def build() -> tuple[Any, Any, Any, Any]:
        sizes = np.array([t.size for t in tensors], dtype=np.int64)
        n_chunks = (sizes + CHUNK - 1) // CHUNK
        chunk_tensor = np.repeat(np.arange(len(tensors), dtype=np.int32), n_chunks)
        chunk_start = np.concatenate([np.arange(n, dtype=np.int64) * CHUNK for n in n_chunks])
        pointers = np.array([t.data.ptr for t in tensors], dtype=np.uint64)
        return upload(pointers, chunk_tensor, chunk_start, sizes)

    return table_cache.get(tuple((t.data.ptr, t.size) for t in tensors), build)


def bf16_table(tensors: list[Any]) -> Any:
    """Device flags, one int32 a tensor: 1 where it is bf16 (uint16 bit patterns), 0 where float32 (cached
    by the list of flags; the kernels that read gradients of either kind take it beside the pointers)."""
    flags = tuple(int(t.dtype == np.uint16) for t in tensors)
    (table,) = table_cache.get(("bf16 flags", *flags), lambda: upload(np.array(flags, dtype=np.int32)))
    return table
