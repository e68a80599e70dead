"""The examples in euler-bpe's docstrings run and give what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import euler_bpe

MODULES = sorted(
    m.name for m in pkgutil.iter_modules(euler_bpe.__path__, "euler_bpe.") if m.name != "euler_bpe.cli"
)


@pytest.mark.parametrize("name", ["euler_bpe", *MODULES])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
