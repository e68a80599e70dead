"""The multi-tensor kernels' table cache: least-recently-used eviction, and keep() scopes that hold the
tables a CUDA graph was captured with (pure Python: runs without a GPU)."""

from __future__ import annotations

from euler_kernels.cuda.tables import TableCache


def counting_builder(log: list, value):
    def build():
        log.append(value)
        return [value]

    return build


def test_builds_once_and_evicts_the_least_recently_used():
    cache, log = TableCache(capacity=2), []
    a = cache.get("a", counting_builder(log, "a"))
    cache.get("b", counting_builder(log, "b"))
    assert cache.get("a", counting_builder(log, "a")) is a  # a hit: no rebuild, "a" is now most recent
    cache.get("c", counting_builder(log, "c"))  # evicts "b", the least recently used
    assert log == ["a", "b", "c"] and "a" in cache and "b" not in cache and "c" in cache


def test_a_kept_table_survives_eviction_and_is_served_inside_its_scope():
    cache, log = TableCache(capacity=1), []
    with cache.keep() as kept:
        a = cache.get("a", counting_builder(log, "a"))  # the dry run
        cache.get("x", counting_builder(log, "x"))  # something else evicts "a" from the cache
        assert "a" not in cache
        assert cache.get("a", counting_builder(log, "a")) is a  # the capture: no rebuild (no host copy)
    assert log == ["a", "x"] and kept["a"] is a and kept["x"][0] == "x"
    assert cache.get("a", counting_builder(log, "a")) is not a  # outside the scope: built anew


def test_scopes_nest_and_close_independently():
    cache = TableCache()
    with cache.keep() as outer:
        with cache.keep() as inner:
            t = cache.get("t", lambda: [0])
        u = cache.get("u", lambda: [1])
    assert inner == {"t": t} and outer == {"t": t, "u": u}
    assert cache._scopes == []


def test_module_doctest():
    import doctest

    from euler_kernels.cuda import tables

    result = doctest.testmod(tables)
    assert result.attempted > 0 and result.failed == 0
