"""`euler-train`: pretrain, sft, chat, generate, check, export-hf, plot, eval, report, quickstart.

Exit codes: 0 done; 2 bad config or arguments (message names the key), or a folder that cannot be written
(read-only, another process's, the disk full); 3 non-finite loss or gradient; 128 + signal number after
SIGINT/SIGTERM (training saves a checkpoint first; elsewhere Ctrl-C is one line, no traceback); 141
(128 + SIGPIPE), silently, when the reader of stdout goes away (`euler-train generate ... | head`).
"""

from __future__ import annotations

import os
import signal
import sys

from euler_train.args import build_parser
from euler_train.commands import dispatch, guard
from euler_train.quickstart import quickstart


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.command == "quickstart":
            return guard(args.command, lambda: quickstart(args))
        return guard(args.command, lambda: dispatch(args, argv))
    except KeyboardInterrupt:
        start = "\n" if sys.stderr.isatty() else ""  # off the line the ^C was echoed on
        print(f"{start}euler-train {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # stdout's reader is gone: stop as a tool killed by SIGPIPE does, and let the interpreter's last
        # flush of stdout go nowhere instead of failing again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
