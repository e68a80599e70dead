"""`euler-train`: pretrain, sft, chat, generate, check, export-hf, plot, eval, report, quickstart.

Exit codes: 0 done; 2 bad config or arguments (message names the key); 3 non-finite loss or gradient;
128 + signal number after SIGINT/SIGTERM (a checkpoint was saved first).
"""

from __future__ import annotations

import sys

from euler_train.args import build_parser
from euler_train.commands import dispatch, guard
from euler_train.quickstart import quickstart


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "quickstart":
        return guard(args.command, lambda: quickstart(args))
    return guard(args.command, lambda: dispatch(args, argv))


if __name__ == "__main__":
    sys.exit(main())
