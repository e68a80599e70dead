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
    """The rule of decode/decode_record.py, one row at a time."""
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
    """The rule of decode/decode_accept.py, one row at a time: accept the agreeing drafts, then record
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


TREES = [(0, 1, 0), (0, 1, 0, 3), (0, 0, 1, 2), (0, 1, 2, 0, 4, 5)]


def random_tree_rows(seed: int, parents: tuple, b: int = 64):
    """random_rows with g (B, T) and drafts (B, T - 1) of a draft tree, each row accepting along a random
    path (siblings' drafts distinct), and random caches (L, B, Hkv, S, D) whose slots the accept moves."""
    _, state, stop, limit = random_rows(seed, b)
    rng = np.random.default_rng(seed + 200)
    v, t = stop.shape[1], len(parents) + 1
    g = rng.integers(0, v, (b, t))
    drafts = np.zeros((b, t - 1), dtype=np.int64)
    for row in range(b):
        node = 0
        for c, parent in enumerate(parents, start=1):
            siblings = [s for s, p in enumerate(parents[: c - 1], start=1) if p == parent]
            taken = {int(drafts[row, s - 1]) for s in siblings}
            on_path = parent == node and g[row, parent] not in taken and rng.random() < 0.7
            draft = (
                g[row, parent]
                if on_path
                else rng.choice([x for x in range(v) if x not in taken | {g[row, parent]}])
            )
            drafts[row, c - 1] = draft
            node = c if on_path else node
    state = {**state, "drafted": rng.integers(0, 9, b), "accepted": rng.integers(0, 9, b)}
    caches = [rng.standard_normal((2, b, 2, int(state["pos"].max()) + t + 1, 3)) for _ in range(2)]
    return g, drafts, state, stop, limit, caches


def tree_accepted_looped(g, drafts, state, stop, limit, caches, parents):
    """The tree rule one row at a time: follow the child whose draft is head 0's token, record g along the
    path, move the path's i-th token's slots from pos + c to pos + i."""
    s = {k: a.copy() for k, a in state.items()}
    k, v = (c.copy() for c in caches)
    chosen = np.zeros(len(g), dtype=np.int64)
    for row in range(len(g)):
        path = [0]
        while True:
            children = [c for c, p in enumerate(parents, start=1) if p == path[-1]]
            match = [c for c in children if drafts[row, c - 1] == g[row, path[-1]]]
            if not match:
                break
            path.append(match[0])
        chosen[row] = path[-1]
        if s["done"][row]:
            continue
        p, before = s["pos"][row], s["count"][row]
        for c in path:
            one = {key: a[row : row + 1] for key, a in s.items()}
            after = looped(g[row, c : c + 1], one, stop[row : row + 1], limit[row : row + 1])
            for key in s:
                s[key][row] = after[key][0]
        s["drafted"][row] += len(parents)
        s["accepted"][row] += max(s["count"][row] - before - 1, 0)
        for i, c in enumerate(path):
            k[:, row, :, p + i], v[:, row, :, p + i] = k[:, row, :, p + c], v[:, row, :, p + c]
    return s, chosen, (k, v)


def tree_accept(g, drafts, state, stop, limit, caches, parents, xp=np):
    s = {k: xp.asarray(a).copy() for k, a in state.items()}
    kv = tuple(xp.asarray(c).copy() for c in caches)
    order = ("out", "last", "pos", "count", "stopped_by", "done", "seen")
    chosen = ek.decode_accept(
        xp.asarray(g), xp.asarray(drafts), tuple(s[k] for k in order), xp.asarray(stop), xp.asarray(limit),
        s["drafted"], s["accepted"], tree=parents, caches=kv,
    )  # fmt: skip
    return {k: ek.to_numpy(a) for k, a in s.items()}, ek.to_numpy(chosen), tuple(ek.to_numpy(c) for c in kv)


def check_tree_accept(parents, seed, xp, b) -> None:
    args = random_tree_rows(seed, parents, b)
    want, want_chosen, want_kv = tree_accepted_looped(*args, parents)
    got, chosen, kv = tree_accept(*args, parents, xp=xp)
    np.testing.assert_array_equal(chosen, want_chosen)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    for c, w in zip(kv, want_kv):
        np.testing.assert_array_equal(c, w)
    assert (want_chosen > 1).any()  # some rows went past the first draft
    assert any(not np.array_equal(w, c) for w, c in zip(want_kv, args[5]))  # some slots moved


@pytest.mark.parametrize("parents", TREES)
def test_a_draft_tree_is_accepted_along_the_agreeing_path(parents) -> None:
    check_tree_accept(parents, len(parents), np, 64)


def test_a_second_branch_is_accepted_and_its_slots_moved() -> None:
    """Tree (0, 1, 0, 3): tokens 1 and 3 are two guesses after the root, 2 and 4 their children. Head 0
    picks 7 after the root (token 3's draft) and 8 after token 3 (token 4's): emitted 7, 8 and head 0's
    token after token 4; tokens 3 and 4 move from slots p + 3, p + 4 to p + 1, p + 2."""
    out, last, pos = np.zeros((1, 5), np.int64), np.zeros(1, np.int64), np.array([10])
    count, stopped, done = np.zeros(1, np.int64), np.full(1, -1), np.zeros(1, bool)
    seen, stop, limit = np.zeros((1, 20), bool), np.zeros((1, 20), bool), np.array([4])
    drafted, accepted = np.zeros(1, np.int64), np.zeros(1, np.int64)
    k = np.arange(16.0)[None, None, None, :, None].repeat(2, axis=0)  # (L 2, B 1, Hkv 1, S 16, D 1): slot ids
    v = -k
    g = np.array([[7, 1, 2, 8, 9]])  # head 0 after fed tokens 0..4
    drafts = np.array([[5, 1, 7, 8]])  # fed tokens 1..4
    buffers = (out, last, pos, count, stopped, done, seen)
    chosen = ek.decode_accept(
        g, drafts, buffers, stop, limit, drafted, accepted, tree=(0, 1, 0, 3), caches=(k, v)
    )
    assert chosen.tolist() == [4] and out[0, :3].tolist() == [7, 8, 9] and pos.tolist() == [13]
    assert k[:, 0, 0, 10:15, 0].tolist() == [[10, 13, 14, 13, 14]] * 2 and (v == -k).all()
    assert drafted.tolist() == [4] and accepted.tolist() == [2]


@pytest.mark.gpu
@pytest.mark.parametrize("parents", TREES)
def test_the_accept_kernel_follows_a_draft_tree(parents) -> None:
    cp = pytest.importorskip("cupy")
    check_tree_accept(parents, len(parents) + 9, cp, 300)


def test_buffers_written_in_place_must_be_c_contiguous() -> None:
    """The launchers' one check (cuda/_module.check_in_place): a strided view is refused by name, since
    a contiguous copy would not be the caller's buffer."""
    from euler_kernels.cuda._module import check_in_place

    a = np.zeros((3, 4), dtype=np.int64)
    check_in_place("decode_record: the buffers it updates in place", a, a[1])
    refused = r"^decode_draft: the drafts it writes in place must be C-contiguous$"
    with pytest.raises(ValueError, match=refused):
        check_in_place("decode_draft: the drafts it writes in place", a, a[:, 1:])
