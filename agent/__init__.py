"""pgdash's agent under its first name: ``from agent import attach`` and ``python -m agent``.

The code is in :mod:`pgdash_agent`, a name that a project's own ``agent`` module cannot
shadow; this package only re-exports it, so scripts written for the first name keep working.
When a project's own ``agent`` comes first on ``sys.path``, pgdash_agent/_guard.py makes that
say so instead of running the wrong module.
"""

from pgdash_agent import attach, current, detach

__all__ = ["attach", "detach", "current"]
