"""``python -m agent ...``, the first name of ``python -m pgdash_agent ...``."""

import sys

from pgdash_agent.launch import main

if __name__ == "__main__":
    sys.exit(main())
