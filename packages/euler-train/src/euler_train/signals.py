"""SIGINT/SIGTERM: ask the training loop to save a checkpoint and stop at the end of the current step;
a second one ends the process at once (the default action is restored after the first), keeping the last
checkpoint written (checkpoints are written atomically).

>>> stop = StopFlag()
>>> with stop.installed():
...     pass
>>> stop.signum is None
True
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator


class StopFlag:
    """Set by SIGINT/SIGTERM; the loop polls `signum` after every step."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal kills at once, even inside a long op
            signal.signal(sig, signal.SIG_DFL)
        name = signal.Signals(signum).name
        print(
            f"\neuler-train: {name} received; saving a checkpoint after this step "
            "(send it again to stop at once without saving)",
            file=sys.stderr,
        )

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Install the handlers for the block, restoring the previous ones after."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
