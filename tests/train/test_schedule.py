"""Warmup + cosine learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_train.schedule import lr_at


def test_warmup_is_linear_and_reaches_the_peak() -> None:
    lrs = [lr_at(s, 1.0, 0.0, 4, 20) for s in range(4)]
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0])


def test_cosine_midpoint_and_end() -> None:
    # 10 warmup steps, decay over steps 10..109 (99 intervals): halfway is the mean of lr and min_lr
    assert lr_at(10, 1.0, 0.2, 10, 110) == pytest.approx(1.0)
    assert lr_at(10 + 99 / 2, 1.0, 0.2, 10, 110) == pytest.approx(0.6)
    assert lr_at(109, 1.0, 0.2, 10, 110) == pytest.approx(0.2)


def test_no_warmup_starts_at_peak() -> None:
    assert lr_at(0, 3e-4, 3e-5, 0, 100) == pytest.approx(3e-4)


@given(
    lr=st.floats(1e-5, 1.0),
    frac=st.floats(0.0, 1.0),
    warmup=st.integers(0, 50),
    total=st.integers(1, 500),
)
def test_bounded_and_non_increasing_after_warmup(lr, frac, warmup, total) -> None:
    min_lr = lr * frac
    lrs = [lr_at(s, lr, min_lr, warmup, total) for s in range(total)]
    assert all(0 < x <= lr * (1 + 1e-12) for x in lrs[:warmup])
    after = lrs[warmup:]
    assert all(min_lr * (1 - 1e-12) <= x <= lr * (1 + 1e-12) for x in after)
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(after))
    if total > warmup + 1:
        assert math.isclose(lrs[-1], min_lr, rel_tol=1e-9, abs_tol=1e-15)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="lr_at"):
        lr_at(-1, 1.0, 0.1, 1, 10)
