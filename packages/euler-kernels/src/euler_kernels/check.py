"""`python -m euler_kernels.check`: float64 gradient check of every op, printed as a table.

The cases are the one table of euler_kernels.op_checks (`gradcheck_cases`, exported from euler_kernels).

    $ python -m euler_kernels.check
    op                     input          shape                 checked  max rel err  ok
    embedding              weight         (11, 6)                    66    ...        OK
    ...
Exit status 0 when every input is within `--tol`, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys

from euler_kernels.gradcheck import judged
from euler_kernels.op_checks import gradcheck_ops


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m euler_kernels.check", description=__doc__.splitlines()[0])
    ap.add_argument("--tol", type=float, default=1e-6, help="largest accepted relative error")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    args = ap.parse_args(argv)
    reports = gradcheck_ops(args.seed)
    lines = reports[0].table(args.tol).splitlines()[:2]
    for rep in reports:
        lines += rep.table(args.tol).splitlines()[2:]
    print("\n".join(lines))
    bad = [rep.label for rep in reports if not rep.ok(args.tol)]
    print(f"\n{'FAILED: ' + ', '.join(bad) if bad else 'all ops OK'} ({judged(args.tol)})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
