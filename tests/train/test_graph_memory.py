"""The captured step's memory plan (graph_memory.plan_offsets): for any lifetimes, two blocks alive at the
same time never share a byte, every block is aligned, and the slab is at least the most bytes ever alive
at once (peak_in_use, checked here against a count at every tick) and close to it."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from euler_train.graph_memory import ALIGN, peak_in_use, plan_offsets, plan_record


@st.composite
def lifetimes(draw):
    """(sizes, starts, ends) as a step's record makes them: each alloc and free its own tick, a block
    freed after it is made, some never freed."""
    n = draw(st.integers(1, 40))
    sizes = draw(st.lists(st.integers(1, 1 << 20), min_size=n, max_size=n))
    frees = draw(st.lists(st.one_of(st.none(), st.integers(0, 8)), min_size=n, max_size=n))
    events = []  # (kind, block): replay allocs in order, each free `delay` allocs after its block's alloc
    pending: list[tuple[int, int]] = []
    for i in range(n):
        events.append(("alloc", i))
        if frees[i] is not None:
            pending.append((i + frees[i], i))
        for due, j in sorted(p for p in pending if p[0] <= i):
            events.append(("free", j))
            pending.remove((due, j))
    events += [("free", j) for _, j in sorted(pending)]
    starts, ends = [0] * n, [None] * n
    for tick, (kind, i) in enumerate(events):
        if kind == "alloc":
            starts[i] = tick
        else:
            ends[i] = tick
    return sizes, starts, ends


def alive_at(starts, ends, tick):
    return [i for i, (s, e) in enumerate(zip(starts, ends)) if s <= tick and (e is None or tick < e)]


@given(lifetimes())
@settings(max_examples=200, deadline=None)
def test_blocks_alive_together_never_share_a_byte(record):
    sizes, starts, ends = record
    offsets, total = plan_offsets(sizes, starts, ends)
    rounded = [(s + ALIGN - 1) // ALIGN * ALIGN for s in sizes]
    assert all(o % ALIGN == 0 and o >= 0 for o in offsets)
    assert total == max(int(o) + r for o, r in zip(offsets, rounded))
    last = max(starts + [e for e in ends if e is not None])
    for tick in range(last + 1):
        spans = sorted((int(offsets[i]), int(offsets[i]) + rounded[i]) for i in alive_at(starts, ends, tick))
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), (tick, spans)


@given(lifetimes())
@settings(max_examples=200, deadline=None)
def test_the_slab_is_at_least_and_near_the_peak_alive(record):
    sizes, starts, ends = record
    rounded = [(s + ALIGN - 1) // ALIGN * ALIGN for s in sizes]
    last = max(starts + [e for e in ends if e is not None])
    counted = max(sum(rounded[i] for i in alive_at(starts, ends, t)) for t in range(last + 1))
    assert peak_in_use(sizes, starts, ends) == counted
    _, total = plan_offsets(sizes, starts, ends)
    assert total >= counted


def step_like_record(layers=8, tokens=4096, dim=512, ffn=1408):
    """A training step's pattern: each layer's forward keeps its activations and frees its temporaries;
    the backward frees the layer's activations as it goes, makes its weight gradients (kept) and passes
    an activation gradient down."""
    sizes, starts, ends, tick = [], [], [], [0]

    def alloc(nbytes):
        sizes.append(nbytes), starts.append(tick[0]), ends.append(None)
        tick[0] += 1
        return len(sizes) - 1

    def free(i):
        ends[i] = tick[0]
        tick[0] += 1

    x, kept = alloc(2 * tokens * dim), []
    for _ in range(layers):
        norm, qkv = alloc(2 * tokens * dim), alloc(2 * tokens * 2 * dim)
        att, gate = alloc(2 * tokens * dim), alloc(2 * tokens * 2 * ffn)
        prod = alloc(2 * tokens * ffn)
        out = alloc(2 * tokens * dim)
        kept.append((norm, qkv, att, gate, prod, x))
        x = out
    dx = alloc(2 * tokens * dim)
    for layer in reversed(kept):
        for nbytes in (2 * ffn * dim, 2 * 2 * ffn * dim, 2 * 2 * dim * dim, 2 * dim * dim):  # weight grads
            alloc(nbytes)
        dprod = alloc(2 * tokens * ffn)
        for i in layer:
            free(i)
        down = alloc(2 * tokens * dim)
        free(dprod), free(dx)
        dx = down
    return sizes, starts, ends


def test_a_step_like_record_packs_to_its_peak():
    """On a forward-backward pattern the greedy layout is within 2% of the most bytes alive at once."""
    record = step_like_record()
    _, total = plan_offsets(*record)
    floor = peak_in_use(*record)
    assert floor <= total <= 1.02 * floor, (total, floor)


def test_a_chain_of_temporaries_reuses_one_range():
    """A forward's pattern: each temporary freed after the next is made, sizes alike: two ranges serve all."""
    n = 50
    starts = [2 * i for i in range(n)]
    ends = [2 * i + 3 for i in range(n)]  # freed just after block i + 1 is made
    ends[-1] = None
    offsets, total = plan_offsets([4096] * n, starts, ends)
    assert total == 2 * 4096 == peak_in_use([4096] * n, starts, ends)
    assert len(set(offsets.tolist())) == 2


def test_a_record_plans_its_freed_blocks_and_keeps_out_those_still_alive():
    """plan_record: blocks still alive when the plan is made (made once, kept: a workspace) get no offset
    (size -1) and take no part in the slab; the rest are laid out as plan_offsets lays them out."""
    sizes, starts, ends = step_like_record(layers=2)
    alive = [e is None for e in ends]
    alive[0] = True  # the embedding's output: kept by someone past the step
    record = SimpleNamespace(sizes=sizes, starts=starts, ends=ends, alive=alive)
    planned_sizes, offsets, total, floor = plan_record(record)
    kept = [i for i, a in enumerate(alive) if not a]
    want_offsets, want_total = plan_offsets(*[[seq[i] for i in kept] for seq in (sizes, starts, ends)])
    assert [planned_sizes[i] for i in kept] == [sizes[i] for i in kept]
    assert all(planned_sizes[i] == -1 for i, a in enumerate(alive) if a)
    assert offsets[kept].tolist() == want_offsets.tolist() and total == want_total
    assert (
        floor
        == peak_in_use(*[[seq[i] for i in kept] for seq in (sizes, starts, ends)])
        < peak_in_use(sizes, starts, ends)
    )
