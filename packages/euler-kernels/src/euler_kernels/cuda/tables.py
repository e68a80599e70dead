"""A bounded cache of the multi-tensor kernels' device tables, and scopes that keep tables alive.

The multi-tensor kernels (AdamW, sum of squares) read per-tensor pointers and chunk ranges from small
device arrays, built once per list of tensors and keyed by the tensors' addresses and sizes. An eager
step makes new gradient arrays every time, so old tables are evicted, least recently used first. A
captured CUDA graph, though, holds the raw addresses of the tables it was captured with: `keep()` gives
a dict that holds every table made or used inside the scope for as long as the caller keeps the dict, and
inside the scope serves them from there even if the cache has evicted them meanwhile.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any


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
