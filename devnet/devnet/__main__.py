"""``python -m devnet``: the same command as ``a2a-gate-devnet``."""

import sys

from devnet.cli import main

sys.exit(main())
