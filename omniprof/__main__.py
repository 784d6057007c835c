"""``python -m omniprof``."""

import sys

from omniprof.cli import main

if __name__ == "__main__":
    sys.exit(main())
