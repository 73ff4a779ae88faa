"""Tells a user when the name ``agent`` reaches a module of their own instead of pgdash's.

pgdash's agent was first published as the top-level package ``agent``, a name many projects
use for a module of their own. Python finds the working directory's (or the script's
directory's) ``agent.py`` first, so ``torchrun -m agent train.py`` would run the user's module
instead of training, and ``from agent import attach`` would fail with an error that does not
say why. ``pgdash_agent`` is the name that cannot clash; this guard keeps the old one honest.

The wheel installs ``pgdash_agent_guard.pth``, which calls :func:`install` when the
interpreter starts. It puts one finder in front of ``sys.meta_path`` that looks only at the
top-level name ``agent``; every other import passes it by at the cost of one comparison.
When ``agent`` resolves to a module that is not pgdash's:

- launched as pgdash's launcher would be (``-m agent SCRIPT.py ...`` or ``-m agent -m MOD``),
  it says so and exits with status 2 before anything runs;
- imported, the module loads as usual, and only a missing ``attach``, ``detach`` or
  ``current`` raises an ImportError that names the file and the right import.

``PGDASH_GUARD=0`` turns it off. Nothing here may raise at interpreter start.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

NAME = "agent"
API = ("attach", "detach", "current")
# pgdash's own ``agent`` package: the shim beside this package (installed or checkout alike).
OURS = Path(__file__).resolve().parent.parent / NAME


def _is_ours(origin: str | None) -> bool:
    if not origin:
        return False
    try:
        return Path(origin).resolve().parent == OURS
    except OSError:
        return False


def _launched_as_pgdash(argv: list[str]) -> bool:
    """``python [options] -m agent SCRIPT.py|-m ...``: the launcher's usage, not a user's."""
    try:
        at = argv.index("-m")
    except ValueError:
        return False
    rest = argv[at + 1:]
    return (len(rest) >= 2 and rest[0] == NAME
            and (rest[1] == "-m" or rest[1].endswith(".py")))


ADVICE = ("use the name that cannot clash: `-m pgdash_agent` to launch, "
          "`from pgdash_agent import attach` in code")


class _ForeignAgentLoader(importlib.abc.Loader):
    """Loads the user's ``agent`` unchanged; a missing pgdash name then explains itself."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def __getattr__(self, name: str):  # get_source, get_code, ... for inspect and pickle
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        if "__getattr__" in vars(module):
            return
        origin = getattr(module, "__file__", None) or "?"

        def __getattr__(name: str):
            if name in API:
                raise ImportError(f"cannot import name {name!r} from 'agent' ({origin}): that "
                                  f"is a module of your project, not pgdash's agent; {ADVICE}",
                                  name="agent", path=origin)
            raise AttributeError(f"module 'agent' has no attribute {name!r}")

        module.__getattr__ = __getattr__


class AgentNameFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != NAME:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or _is_ours(spec.origin):
            return None  # pgdash's, or nothing: the normal finders say what they say
        if sys.argv[:1] == ["-m"] and _launched_as_pgdash(list(getattr(sys, "orig_argv", []))):
            # runpy is resolving ``-m agent``: stop before the user's module runs.
            sys.stderr.write(f"pgdash: nothing was run: `-m agent` here is {spec.origin}, a "
                             f"module of your project, not pgdash's agent; {ADVICE}.\n")
            sys.stderr.flush()
            raise SystemExit(2)
        spec.loader = _ForeignAgentLoader(spec.loader)
        return spec


def install() -> None:
    try:
        if os.environ.get("PGDASH_GUARD", "1") == "0" or not OURS.is_dir():
            return
        if not any(isinstance(f, AgentNameFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, AgentNameFinder())
    except Exception:  # noqa: BLE001 - never break an interpreter's start
        pass
