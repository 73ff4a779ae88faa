"""torch's process groups as the agent sees them: c10d's registry, their birth and their end.

:func:`describe_group` reads a group's name, backend and ranks from c10d's registry (the
collective tracker names its groups with it). :class:`ProcessGroupWatch` announces each group
this rank belongs to (``group``), replaces ``init_process_group`` (the rendezvous:
``init_start``, then ``init_done`` or ``init_failed``), ``destroy_process_group`` (a rank
that ``left``) and ``new_group`` (each call counted before it is made: the heartbeat's
``groups_made``), and puts the originals back at detach. Its own room because it is the one
place that patches torch.distributed's setup functions, apart from the collectives
(``pgdash_agent.collective_wrappers``) and DDP (``pgdash_agent.ddp``). Like every hook of the
agent, these never raise into the training code: what goes wrong inside them is counted in
the tracker's ``internal_errors``.
"""

from __future__ import annotations

import inspect
import sys
import time
from typing import Any, Callable, Mapping

from pgdash_agent.collectives import CollectiveTracker, GroupTrack
from pgdash_agent.failures import error_text
from pgdash_agent.outbox import Outbox


def c10d():
    """``torch.distributed.distributed_c10d``, imported only when the agent starts."""
    from torch.distributed import distributed_c10d

    return distributed_c10d


def describe_group(pg: Any) -> tuple[str, str | None, str | None, list[int]] | None:
    """``(name, desc, backend, global ranks)`` of a ProcessGroup from c10d's registry."""
    world = c10d()._world
    name = world.pg_names.get(pg) if not isinstance(pg, int) else None
    if name is None:
        return None
    backend = (world.pg_map.get(pg) or (None,))[0]
    ranks = sorted(world.pg_group_ranks.get(pg, {}))
    return str(name), getattr(pg, "group_desc", None), str(backend) if backend else None, ranks


class ProcessGroupWatch:
    """Reports the groups c10d registers, ``init_process_group`` and ``destroy_process_group``.

    Args:
        outbox: where the reports go.
        tracker: the collective tracker (its default group is set once the rendezvous is done;
            its ``internal_errors`` counts what failed in here).
        environ: the process environment (the launcher's RANK, WORLD_SIZE, MASTER_ADDR...).
        send_hello: sends the Hello again (rank and world size are certain after the
            rendezvous).
        final_heartbeat: sends this rank's progress now, connected or not (before a ``left``).
    """

    def __init__(self, outbox: Outbox, tracker: CollectiveTracker, environ: Mapping[str, str],
                 send_hello: Callable[[], None], final_heartbeat: Callable[[], None]):
        self.outbox = outbox
        self.tracker = tracker
        self.environ = environ
        self._send_hello = send_hello
        self._final_heartbeat = final_heartbeat
        self.init_method: Any = None  # init_process_group's, once called (see _init_start)
        self._patched: list[tuple[Any, str, Any]] = []

    def scan(self) -> None:
        """Announce the groups of this rank that c10d registered since the last scan."""
        try:
            for pg in list(c10d()._world.pg_names):
                self.tracker.track_for(pg)
        except Exception:
            pass  # the registry changed under us; next tick sees it
        while self.tracker.new_tracks:
            track: GroupTrack = self.tracker.new_tracks.popleft()
            self.outbox.put(time.time(), "group", {"name": track.name, "desc": track.desc,
                                                   "backend": track.backend,
                                                   "ranks": track.ranks})

    def install(self, *modules: Any) -> None:
        """Replace the three functions in ``modules`` (``torch.distributed`` and its c10d)."""
        self._patch_init(*modules)
        self._patch_destroy(*modules)
        self._patch_new_group(*modules)

    def uninstall(self) -> None:
        """Put the originals back, in every module that was given the replacement."""
        for module, name, fn in self._patched:
            setattr(module, name, fn)

    def _patch_init(self, *modules: Any) -> None:
        original = modules[0].init_process_group
        if getattr(original, "__pgdash_wrapped__", False):
            return
        signature = inspect.signature(original)
        agent = self

        def init_process_group(*args, **kwargs):
            started = time.time()
            agent._init_start(signature, args, kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                agent._init_end(started, exc)
                raise
            agent._init_end(started, None)
            return result

        self._replace(modules, init_process_group, original)

    def _replace(self, modules: tuple, fn: Any, original: Any) -> None:
        """Put ``fn`` in place of ``original`` (same name) in each module, and in every
        torch.distributed module loaded already that imported it by name (DeviceMesh's
        ``init_device_mesh`` calls its own ``init_process_group``); undone at detach."""
        name = original.__name__
        fn.__pgdash_wrapped__ = True
        fn.__wrapped__ = original
        fn.__doc__ = original.__doc__
        holders = list(modules) + [
            m for key, m in list(sys.modules.items())
            if key.startswith("torch.distributed") and m not in modules
            and getattr(m, name, None) is original]
        for module in holders:
            self._patched.append((module, name, getattr(module, name)))
            setattr(module, name, fn)

    def _patch_destroy(self, *modules: Any) -> None:
        """Report ``destroy_process_group``: a rank that leaves while its peers still issue
        collectives is the cause of what happens to them next (``rank_exited_early``). The
        final progress goes first, so the server knows how far the rank got."""
        original = modules[0].destroy_process_group
        if getattr(original, "__pgdash_wrapped__", False):
            return
        agent = self

        def destroy_process_group(group=None):
            agent._left(group)
            return original(group)

        self._replace(modules, destroy_process_group, original)

    def _patch_new_group(self, *modules: Any) -> None:
        """Count each ``new_group`` call before it is made (``CollectiveTracker.made_group``):
        every rank of the job must make the same calls in the same order, members or not, and
        a rank that skipped one, or passed other ranks, hangs in its next one, or makes groups
        that never meet, before any group of it is registered."""
        original = getattr(modules[0], "new_group", None)
        if original is None or getattr(original, "__pgdash_wrapped__", False):
            return
        signature = inspect.signature(original)
        agent = self

        def new_group(*args, **kwargs):
            agent._new_group(signature, args, kwargs)
            return original(*args, **kwargs)

        self._replace(modules, new_group, original)

    def _new_group(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
            if bound.get("use_local_synchronization"):
                return  # only the members call it
            ranks = bound.get("ranks")
            ranks = range(c10d().get_world_size()) if ranks is None else ranks
            ranks = tuple(int(r) for r in ranks)
            self.tracker.made_group(tuple(sorted(ranks)) if bound.get("sort_ranks", True)
                                    else ranks)
        except Exception:
            self.tracker.internal_errors += 1

    def _left(self, group: Any) -> None:
        try:
            track = None if group is None else self.tracker.track_for(group)
            if group is not None and track is None:
                return  # not a group of this rank
            self._final_heartbeat()
            self.outbox.put(time.time(), "left", {
                "group": None if track is None else track.name,
                "reason": "destroy_process_group"})
        except Exception:
            self.tracker.internal_errors += 1

    def _init_start(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
            timeout = bound.get("timeout")
            self.init_method = bound.get("init_method")  # names the launch in the Hello
            env = self.environ
            self.outbox.put(time.time(), "init_start", {
                "init_method": _str_or_none(bound.get("init_method")),
                "backend": _str_or_none(bound.get("backend")),
                "world_size": _int_or_none(bound.get("world_size", env.get("WORLD_SIZE"))),
                "rank": _int_or_none(bound.get("rank", env.get("RANK"))),
                "master_addr": env.get("MASTER_ADDR"), "master_port": env.get("MASTER_PORT"),
                "timeout_s": timeout.total_seconds() if timeout is not None else None})
        except Exception:
            self.tracker.internal_errors += 1

    def _init_end(self, started: float, exc: BaseException | None) -> None:
        try:
            now = time.time()
            if exc is not None:
                self.outbox.put(now, "init_failed", {"error_type": type(exc).__name__,
                                                     "error": error_text(exc),
                                                     "duration_s": now - started})
                return
            dist_c10d = c10d()
            self.tracker.set_default(dist_c10d._world.default_pg)
            self.tracker.new_world()
            self._send_hello()  # rank and world size are certain now
            self.outbox.put(now, "init_done", {"rank": dist_c10d.get_rank(),
                                               "world_size": dist_c10d.get_world_size(),
                                               "backend": str(dist_c10d.get_backend()),
                                               "duration_s": now - started})
            self.scan()
        except Exception:
            self.tracker.internal_errors += 1


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
