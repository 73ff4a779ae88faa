"""``python -m pgdash_agent SCRIPT|-m MODULE [ARGS]``: attach, then run the program as ``__main__``.

The program runs as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would run it (through
``runpy``): its ``sys.argv``, ``sys.path[0]``, ``__file__``, ``__name__ == "__main__"``, its
exit code and its tracebacks. So any launcher that takes ``-m`` attaches the agent without a
change to the training script: ``torchrun --nproc-per-node 8 -m pgdash_agent train.py --lr 3e-4``.

When the launcher says which rank this process is (``RANK``, or SLURM's ``SLURM_PROCID`` for
the task itself), the agent attaches at once and sees the rendezvous. Otherwise the process
may be a parent that only starts the ranks (``torch.multiprocessing.spawn``), so the agent
attaches when this process calls ``init_process_group``, and each process that
``torch.multiprocessing.spawn``/``start_processes`` starts does the same.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from typing import Any, Callable

from pgdash_agent import identity

USAGE = ("usage: python -m pgdash_agent SCRIPT [ARGS ...]\n"
         "       python -m pgdash_agent -m MODULE [ARGS ...]\n"
         "Attaches the pgdash agent (settings: PGDASH_* variables), then runs the script or\n"
         "module as `python SCRIPT ARGS` / `python -m MODULE ARGS` would.")

_originals: list[tuple[Any, str, Any]] = []  # (module, name, original) patched by defer()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m pgdash_agent``; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv[0] == "-m":
        if len(argv) < 2:
            print("python -m pgdash_agent: -m needs a module name\n" + USAGE, file=sys.stderr)
            return 2
        return run_module(argv[1], argv[2:])
    if argv[0].startswith("-") and argv[0] != "-":
        print(f"python -m pgdash_agent: unknown option {argv[0]!r} (options for the program "
              f"go after its name)\n" + USAGE, file=sys.stderr)
        return 2
    return run_script(argv[0], argv[1:])


def run_script(path: str, args: list[str]) -> int:
    """Attach, then run the file at ``path`` as ``python path args`` would."""
    if not os.path.isfile(path):
        reason = "No such file or directory" if not os.path.exists(path) else "Is a directory"
        print(f"python -m pgdash_agent: can't open file {os.path.abspath(path)!r}: {reason}",
              file=sys.stderr)
        return 2
    start_agent()
    sys.argv[:] = [path, *args]
    # As python does: the script's own directory (symlinks resolved) comes first on the path.
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    # An absolute path, as python >= 3.9 gives __file__ and the traceback's file names.
    # runpy also puts it in sys.argv[0] while the script runs (python would keep it as given).
    return _guarded(lambda: runpy.run_path(os.path.abspath(path), run_name="__main__"))


def run_module(name: str, args: list[str]) -> int:
    """Attach, then run module ``name`` as ``python -m name args`` would."""
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        print(f"python -m pgdash_agent: No module named {name}", file=sys.stderr)
        return 1
    start_agent()
    sys.argv[:] = [name, *args]  # run_module puts the module's file in argv[0], as -m does
    sys.path[0] = os.getcwd()  # python -m puts the working directory first
    return _guarded(lambda: runpy.run_module(name, run_name="__main__", alter_sys=True))


def start_agent(environ: Any = None) -> None:
    """Attach now if this process is a rank by its environment, else on init_process_group."""
    environ = os.environ if environ is None else environ
    if identity.launch_rank(environ)[0] is not None:
        from pgdash_agent import attach

        attach()  # never raises
        return
    try:
        defer(spawn=True)
    except Exception as exc:  # the program must run whatever happens to the agent
        from pgdash_agent import log

        log.warning("pgdash: agent not started (the program runs without it): %s", exc)


def defer(spawn: bool) -> bool:
    """Attach when this process calls ``init_process_group``; with ``spawn``, make every
    process that torch.multiprocessing starts do the same. Returns False without torch."""
    try:
        import importlib

        import torch.distributed as dist
        import torch.multiprocessing as tmp
        from torch.distributed import distributed_c10d as c10d

        # (the package's ``spawn`` attribute is the function, not this module)
        tmp_spawn = importlib.import_module("torch.multiprocessing.spawn")
    except Exception:
        return False  # nothing distributed can happen here: the program runs alone
    if _originals:
        return True
    original_init = c10d.init_process_group

    def init_process_group(*args: Any, **kwargs: Any):
        _undo()
        _attach_for_init(args, kwargs)
        return dist.init_process_group(*args, **kwargs)  # the agent's wrapper, once attached

    init_process_group.__wrapped__ = original_init
    init_process_group.__doc__ = original_init.__doc__
    targets = [(dist, "init_process_group", init_process_group),
               (c10d, "init_process_group", init_process_group)]
    if spawn:
        original_start = tmp_spawn.start_processes

        def start_processes(fn: Callable, *args: Any, **kwargs: Any):
            return original_start(SpawnedRank(fn), *args, **kwargs)

        start_processes.__wrapped__ = original_start
        targets += [(tmp_spawn, "start_processes", start_processes),
                    (tmp, "start_processes", start_processes)]
    for module, name, replacement in targets:
        _originals.append((module, name, getattr(module, name)))
        setattr(module, name, replacement)
    return True


def _undo() -> None:
    """Put back what defer() replaced (before the agent wraps init_process_group itself)."""
    while _originals:
        module, name, original = _originals.pop()
        if name == "init_process_group":
            setattr(module, name, original)


def _attach_for_init(args: tuple, kwargs: dict) -> None:
    from pgdash_agent import attach

    # The environment may not name the launch (MASTER_ADDR set only for init, or a tcp://
    # init_method): the rendezvous address does, for every rank alike.
    init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    attach(job=identity.job_name(os.environ, init_method=init_method))


class SpawnedRank:
    """The function torch.multiprocessing.spawn runs in each child, with the agent on.

    Picklable whenever the wrapped function is (spawn pickles it to the child). torch's own
    wrapper in the child catches the function's exception and exits 1 without calling
    ``sys.excepthook``, so the failure is reported to the agent here.
    """

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        defer(spawn=False)
        try:
            return self.fn(*args)
        except SystemExit as exc:
            _note_exit(exc.code)
            raise
        except KeyboardInterrupt:
            raise
        except BaseException:
            _note_uncaught(*sys.exc_info())
            raise


def _guarded(run: Callable[[], Any]) -> int:
    """Run the program; its exit status as python would give it."""
    try:
        run()
    except SystemExit as exc:
        _note_exit(exc.code)
        raise  # python prints a non-integer code and exits with the right status
    except KeyboardInterrupt:
        raise  # python exits by SIGINT itself, as the shell expects
    except BaseException:
        typ, exc, tb = sys.exc_info()
        # The traceback starts where the program's own code does, as under plain python.
        while tb is not None and _is_launcher_frame(tb.tb_frame):
            tb = tb.tb_next
        # (python prints the exception's own traceback, so that is the one to shorten)
        sys.excepthook(typ, exc.with_traceback(tb), tb)  # the agent's hook reports it, then prints it
        return 1
    return 0


def _is_launcher_frame(frame: Any) -> bool:
    return frame.f_code.co_filename == __file__ or frame.f_globals.get("__name__") == "runpy"


def _note_exit(code: Any) -> None:
    from pgdash_agent import current

    agent = current()
    if agent is not None:
        agent.note_exit(code)


def _note_uncaught(typ: Any, exc: BaseException, tb: Any) -> None:
    from pgdash_agent import current

    agent = current()
    if agent is not None:
        agent.note_uncaught(typ, exc, tb)
