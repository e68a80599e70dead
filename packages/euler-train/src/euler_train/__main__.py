"""`python -m euler_train ...` is `euler-train ...`."""

import sys

from euler_train.cli import main

sys.exit(main())
