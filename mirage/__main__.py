"""``python -m mirage``: the command line (see mirage.cli)."""

import sys

from mirage.cli import main

if __name__ == "__main__":
    sys.exit(main())
