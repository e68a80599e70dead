"""decode_record: the array-operation path against a plain loop over the rows, and the GPU kernel against
that path, on random batches (rows going, done, stopping, reaching their limit)."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek


def random_rows(seed: int, b: int = 64, v: int = 50, width: int = 9):
    rng = np.random.default_rng(seed)
    limit = rng.integers(0, width, b)
    count = np.minimum(rng.integers(0, width, b), limit)
    state = {
        "out": rng.integers(0, v, (b, width + 1)),
        "last": rng.integers(0, v, b),
        "pos": rng.integers(0, 100, b),
        "count": count,
        "stopped_by": np.full(b, -1),
        "done": (count >= limit) | (rng.random(b) < 0.2),
        "seen": rng.random((b, v)) < 0.3,
    }
    stop = rng.random((b, v)) < 0.1
    return rng.integers(0, v, b), state, stop, limit


def looped(token, state, stop, limit) -> dict:
    """The rule of ops/decode_record.py, one row at a time."""
    s = {k: a.copy() for k, a in state.items()}
    for b, t in enumerate(token):
        if s["done"][b]:
            continue
        if stop[b, t]:
            s["stopped_by"][b], s["done"][b] = t, True
            continue
        s["out"][b, s["count"][b]] = t
        s["seen"][b, t], s["last"][b] = True, t
        s["pos"][b] += 1
        s["count"][b] += 1
        s["done"][b] = s["count"][b] >= limit[b]
    return s


def record(token, state, stop, limit, xp=np) -> dict:
    s = {k: xp.asarray(a).copy() for k, a in state.items()}
    order = ("out", "last", "pos", "count", "stopped_by", "done", "seen")
    ek.decode_record(xp.asarray(token), *(s[k] for k in order), xp.asarray(stop), xp.asarray(limit))
    return {k: ek.to_numpy(a) for k, a in s.items()}


@pytest.mark.parametrize("seed", range(5))
def test_the_array_path_equals_a_loop_over_the_rows(seed) -> None:
    token, state, stop, limit = random_rows(seed)
    want, got = looped(token, state, stop, limit), record(token, state, stop, limit)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    assert (want["done"] != state["done"]).any() and (want["count"] != state["count"]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(5))
def test_the_kernel_equals_a_loop_over_the_rows(seed) -> None:
    cp = pytest.importorskip("cupy")
    token, state, stop, limit = random_rows(seed, b=300)
    want, got = looped(token, state, stop, limit), record(token, state, stop, limit, xp=cp)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.gpu
def test_the_kernel_takes_a_column_of_tokens() -> None:
    """A speculative step records column i of its (B, T) tokens: a strided view, read with its strides."""
    cp = pytest.importorskip("cupy")
    token, state, stop, limit = random_rows(7, b=300)
    columns = np.stack([token, token[::-1]], axis=1)  # (B, 2): column 0 is `token`
    s = {k: cp.asarray(a).copy() for k, a in state.items()}
    order = ("out", "last", "pos", "count", "stopped_by", "done", "seen")
    ek.decode_record(cp.asarray(columns)[:, 0], *(s[k] for k in order), cp.asarray(stop), cp.asarray(limit))
    want = looped(token, state, stop, limit)
    for key in want:
        np.testing.assert_array_equal(cp.asnumpy(s[key]), want[key], err_msg=key)


def accepted_looped(g, drafts, state, stop, limit) -> tuple[dict, np.ndarray]:
    """The rule of ops/decode_accept.py, one row at a time: accept the agreeing drafts, then record
    g[b, 0..a] with decode_record's rule."""
    s = {k: a.copy() for k, a in state.items()}
    b, m = drafts.shape
    chosen = np.zeros(b, dtype=np.int64)
    for row in range(b):
        a = 0
        while a < m and g[row, a] == drafts[row, a]:
            a += 1
        chosen[row] = a
        if s["done"][row]:
            continue
        before = s["count"][row]
        for i in range(a + 1):
            one = {k: v[row : row + 1] for k, v in s.items()}  # views: looped writes its copies back below
            after = looped(g[row, i : i + 1], one, stop[row : row + 1], limit[row : row + 1])
            for k in s:
                s[k][row] = after[k][0]
        s["drafted"][row] += m
        s["accepted"][row] += max(s["count"][row] - before - 1, 0)
    return s, chosen


def random_speculative_rows(seed: int, b: int = 64, m: int = 3):
    """random_rows with each row's g (B, M + 1) and drafts (B, M) agreeing on a random prefix."""
    _, state, stop, limit = random_rows(seed, b)
    rng = np.random.default_rng(seed + 100)
    v = stop.shape[1]
    g = rng.integers(0, v, (b, m + 1))
    drafts = rng.integers(0, v, (b, m))
    agree = rng.integers(0, m + 1, b)  # the first disagreement at column agree[b] (m: none)
    for row, a in enumerate(agree):
        drafts[row, :a] = g[row, :a]
        if a < m and drafts[row, a] == g[row, a]:
            drafts[row, a] = (g[row, a] + 1) % v
    state = {**state, "drafted": rng.integers(0, 9, b), "accepted": rng.integers(0, 9, b)}
    return g, drafts, state, stop, limit


def accept(g, drafts, state, stop, limit, xp=np) -> tuple[dict, np.ndarray]:
    s = {k: xp.asarray(a).copy() for k, a in state.items()}
    order = ("out", "last", "pos", "count", "stopped_by", "done", "seen")
    chosen = ek.decode_accept(
        xp.asarray(g), xp.asarray(drafts), tuple(s[k] for k in order), xp.asarray(stop), xp.asarray(limit),
        s["drafted"], s["accepted"],
    )  # fmt: skip
    return {k: ek.to_numpy(a) for k, a in s.items()}, ek.to_numpy(chosen)


@pytest.mark.parametrize("seed", range(4))
def test_accept_equals_a_loop_over_the_rows(seed) -> None:
    args = random_speculative_rows(seed)
    (want, want_chosen), (got, chosen) = accepted_looped(*args), accept(*args)
    np.testing.assert_array_equal(chosen, want_chosen)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    state = args[2]
    assert (want["count"] - state["count"] > 1).any()  # some rows emitted several tokens in the step
    assert (want["accepted"] != state["accepted"]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(4))
def test_the_accept_kernel_equals_a_loop_over_the_rows(seed) -> None:
    cp = pytest.importorskip("cupy")
    args = random_speculative_rows(seed, b=300)
    (want, want_chosen), (got, chosen) = accepted_looped(*args), accept(*args, xp=cp)
    np.testing.assert_array_equal(chosen, want_chosen)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
