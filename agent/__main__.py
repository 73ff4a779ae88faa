"""``python -m agent SCRIPT [ARGS]`` / ``python -m agent -m MODULE [ARGS]`` (see agent.launch)."""

import sys

from agent.launch import main

if __name__ == "__main__":
    sys.exit(main())
