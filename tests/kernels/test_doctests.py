"""The small examples in euler-kernels' docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import euler_kernels

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(euler_kernels.__path__, prefix="euler_kernels.")
    if not m.name.startswith("euler_kernels.cuda")  # the GPU kernels' own package, tested on a GPU
)


def test_every_op_module_is_found() -> None:
    ops = {m.rsplit(".", 1)[1] for m in MODULES if m.count(".") == 2}  # euler_kernels.<op folder>.<module>
    assert ops >= {"embedding", "rmsnorm", "linear", "rope", "attention", "swiglu", "residual",
                   "cross_entropy", "adamw", "grad_norm"}  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
