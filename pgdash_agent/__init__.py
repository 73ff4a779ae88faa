"""pgdash's in-process agent: ``from pgdash_agent import attach; attach()`` in training code.

Importing this package does not import torch; ``attach`` does.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["attach", "detach", "current"]

_lock = threading.Lock()
_agent = None
log = logging.getLogger("pgdash.agent")


def attach(pg: Any = None, *, server: str | None = None, token: str | None = None,
           job: str | None = None, **options: Any):
    """Start reporting this process to a pgdash server. Idempotent; never raises.

    Call it before ``init_process_group`` to see the rendezvous happen, or after it (optionally
    with a process group) to start from there. Settings come from the arguments, else from
    ``PGDASH_*`` environment variables (see README, "Configuration").

    Returns:
        The :class:`pgdash_agent.core.Agent`, or None if the agent could not start (the reason is
        logged as a warning; training goes on untouched).
    """
    global _agent
    try:
        with _lock:
            if _agent is not None:
                if pg is not None:
                    _agent.tracker.track_for(pg)
                return _agent
            from pgdash_agent.config import AgentConfig
            from pgdash_agent.core import Agent

            config = AgentConfig.from_env(server=server, token=token, job=job, **options)
            if config.server is None:
                from pgdash_agent.wire import DEFAULT_PORT

                config = AgentConfig.from_env(server=f"http://127.0.0.1:{DEFAULT_PORT}",
                                              token=token, job=job, **options)
            if not config.server.startswith(("http://", "https://")):
                raise ValueError(f"PGDASH_SERVER must look like http://host:port, "
                                 f"got {config.server!r}")
            _agent = Agent(config).start(pg)
            return _agent
    except Exception as exc:
        log.warning("pgdash: agent not started (training continues without it): %s", exc)
        return None


def detach(timeout: float | None = None) -> bool:
    """Flush and stop the agent of this process, if any. Never raises."""
    global _agent
    with _lock:
        agent, _agent = _agent, None
    return agent.detach(timeout) if agent is not None else True


def current():
    """The agent of this process, or None."""
    return _agent
