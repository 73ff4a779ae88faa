"""DDP's gradient all-reduce, seen by the wrappers: a communication hook on every DDP model.

DDP's reducer issues its bucket all-reduces from C++: no Python wrapper sees them, and gloo's
Flight Recorder tells only that one is in flight, not how long a rank waited in it. So a rank
that is late at every step (its input pipeline) hid inside DDP: nobody could be seen waiting
for it. With ``PGDASH_DDP_HOOK`` on (the default), the agent registers a communication hook on
each ``DistributedDataParallel`` model as it is built. The hook runs what DDP would have run
(``default_hooks.allreduce_hook``: divide by the group's size, all-reduce, the same result),
but through ``dist.all_reduce``, so the wrappers number, time and report every bucket like a
collective of the user's own (pgdash_agent.collective_wrappers), and the server can name the
straggler and place a rank that left the loop (its barrier against the others' all-reduce).

DDP takes one hook per model. A hook of the user's own, registered later with
``register_comm_hook`` (PowerSGD, fp16 compression), replaces the default inside ours and
runs as they wrote it; a built-in one (``_register_builtin_comm_hook``) is run as its Python
equivalent. A model whose hook was registered before ours (DDP's own mixed precision does so
in its constructor) keeps it, and its collectives stay those the Flight Recorder sees.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger("pgdash.agent")


class _HookState:
    """What our hook runs: the user's hook and state, or DDP's default all-reduce."""

    __slots__ = ("hook", "state")

    def __init__(self, hook: Callable, state: Any):
        self.hook = hook
        self.state = state


def _pgdash_hook(state, bucket):  # unannotated: DDP checks the annotations it finds
    return state.hook(state.state, bucket)


class DDPHooks:
    """Patches ``DistributedDataParallel`` (the class) while installed; never raises."""

    def __init__(self) -> None:
        self._originals: list[tuple[Any, str, Any]] = []
        self.models = 0  # DDP models hooked
        self.skipped = 0  # DDP models with a hook of their own before ours
        self.errors = 0

    def install(self) -> None:
        try:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            from torch.nn.parallel import DistributedDataParallel as DDP
        except Exception:
            return  # no DDP in this torch
        if getattr(DDP.__init__, "__pgdash_wrapped__", False):
            return
        hooks = self
        init, register = DDP.__init__, DDP.register_comm_hook
        builtin = getattr(DDP, "_register_builtin_comm_hook", None)

        def __init__(model, *args, **kwargs):
            init(model, *args, **kwargs)
            hooks._attach(model, register, default_hooks.allreduce_hook)

        def register_comm_hook(model, state, hook):
            ours = getattr(model, "_pgdash_hook", None)
            if ours is None:
                model._pgdash_hook = False  # theirs came first: leave the model to them
                return register(model, state, hook)
            if ours is False:
                return register(model, state, hook)  # DDP says what it says of a second one
            model._check_comm_hook(hook)
            ours.hook, ours.state = hook, state
            return None

        def _register_builtin_comm_hook(model, comm_hook_type):
            ours = getattr(model, "_pgdash_hook", None)
            if not ours:
                if ours is None:
                    model._pgdash_hook = False
                return builtin(model, comm_hook_type)
            name = getattr(comm_hook_type, "name", str(comm_hook_type))
            hook = {"ALLREDUCE": default_hooks.allreduce_hook,
                    "FP16_COMPRESS": default_hooks.fp16_compress_hook}.get(name)
            if hook is None:
                raise RuntimeError(f"pgdash: unknown DDP built-in comm hook {name}; set "
                                   "PGDASH_DDP_HOOK=0 to leave DDP's hooks alone")
            ours.hook, ours.state = hook, model.process_group
            return None

        for name, fn in (("__init__", __init__), ("register_comm_hook", register_comm_hook),
                         ("_register_builtin_comm_hook", _register_builtin_comm_hook)):
            original = getattr(DDP, name, None)
            if original is None:
                continue
            fn.__pgdash_wrapped__ = True
            fn.__wrapped__ = original
            fn.__doc__ = original.__doc__
            fn.__name__ = original.__name__
            self._originals.append((DDP, name, original))
            setattr(DDP, name, fn)

    def uninstall(self) -> None:
        for owner, name, fn in reversed(self._originals):
            setattr(owner, name, fn)
        self._originals.clear()

    def _attach(self, model: Any, register: Callable, default: Callable) -> None:
        if getattr(model, "_pgdash_hook", None) is False:
            self.skipped += 1
            return
        try:
            state = _HookState(default, model.process_group)
            register(model, state, _pgdash_hook)
            model._pgdash_hook = state
            self.models += 1
        except Exception as exc:  # a model DDP would not hook (e.g. a hook already set)
            self.errors += 1
            model._pgdash_hook = False
            log.debug("pgdash: DDP comm hook not registered: %s", exc)
