"""The docstring examples of euler-train run as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import euler_train

ALL = [m.name for m in pkgutil.walk_packages(euler_train.__path__, "euler_train.")]  # evals.* too
MODULES = sorted(name for name in ALL if name != "euler_train.__main__")  # importing __main__ runs the CLI


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
