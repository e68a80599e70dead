"""What every worker process of euler-bpe (encode_batch's pool, training's word counting) does first."""

from __future__ import annotations

import signal


def leave_interrupts_to_parent() -> None:
    """Ignore Ctrl-C, which the terminal sends to every process of the group: the parent stops its
    workers, so a worker prints no traceback and never dies holding its pool's queue lock."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
