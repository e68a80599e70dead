"""Progress output for every euler command: redrawn in place on a terminal; elsewhere (a log file, CI)
one plain line every LINE_EVERY_S seconds and at the end, instead of thousands of carriage returns.

>>> import io
>>> log = io.StringIO()
>>> out = PlainLines(log, every_s=3600)
>>> for i in range(1000):
...     _ = out.write(f"\\rstep {i}")
>>> _ = out.write("\\n")
>>> log.getvalue()
'step 0\\nstep 999\\n'
"""

from __future__ import annotations

import re
import sys
import time
from typing import TextIO

LINE_EVERY_S = 10.0
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class PlainLines:
    """A text stream for progress bars: keeps the newest redraw (the text after the last carriage
    return) and writes it as a line when `every_s` has passed since the last one, or at a newline."""

    def __init__(self, stream: TextIO, every_s: float = LINE_EVERY_S) -> None:
        self.stream, self.every_s = stream, every_s
        self.current, self.last_line, self.last_time = "", "", -float("inf")

    def write(self, text: str) -> int:
        *ended, rest = text.split("\n")
        for line in ended:  # a newline ends a line: write it now
            self._redraw(line)
            self._emit()
            self.current = ""
        self._redraw(rest)
        if time.monotonic() - self.last_time >= self.every_s:
            self._emit()
        return len(text)

    def _redraw(self, text: str) -> None:
        """What follows the last carriage return replaces the line; other text extends it."""
        self.current = text.rsplit("\r", 1)[1] if "\r" in text else self.current + text

    def _emit(self) -> None:
        line = ANSI_ESCAPE.sub("", self.current).strip()  # a nested bar moves the cursor: not in a log
        if line and line != self.last_line:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last_line = line
        self.last_time = time.monotonic()

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def progress_stream(stream: TextIO | None = None) -> TextIO | PlainLines:
    """`stream` (default stderr) itself on a terminal, else wrapped in PlainLines."""
    stream = stream or sys.stderr
    return stream if stream.isatty() else PlainLines(stream)
