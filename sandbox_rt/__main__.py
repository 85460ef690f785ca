"""``python -m sandbox_rt``: the ``sandbox-rt`` command line (sandbox_rt/cli.py)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
