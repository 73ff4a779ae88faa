"""``python -m pgdash_agent SCRIPT|-m MODULE [ARGS]`` (see pgdash_agent.launch)."""

import sys

from pgdash_agent.launch import main

if __name__ == "__main__":
    sys.exit(main())
