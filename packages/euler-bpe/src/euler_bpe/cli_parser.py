"""The argument parser of every euler command line (euler-bpe, euler-data, euler-train): a usage error
is one line on stderr and exit code 2, like every other bad input.

>>> import contextlib, io
>>> err = io.StringIO()
>>> with contextlib.redirect_stderr(err):
...     try:
...         OneLineParser(prog="demo").parse_args(["--nope"])
...     except SystemExit as stop:
...         print(stop.code)
2
>>> err.getvalue()
'demo: error: unrecognized arguments: --nope (see demo --help)\\n'
"""

from __future__ import annotations

import argparse
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """argparse without the usage block on errors: `PROG: error: MESSAGE (see PROG --help)`, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")
