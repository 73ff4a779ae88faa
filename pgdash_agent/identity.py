"""Who this rank is: job name, rank, host, versions and the distributed environment."""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shlex
import socket
import sys
from typing import Any, Mapping, Sequence

from pgdash_agent.wire import MAX_COMMAND, MAX_NAME

# Variables that decide how a distributed job forms and behaves. PGDASH_TOKEN is never sent.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "CUDA_VISIBLE_DEVICES",
             "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
             "SLURM_NODEID", "SLURM_RESTART_COUNT")
UNNAMED = "unnamed"  # the job name when nothing in the environment names the launch


def distributed_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items())
            if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def job_name(environ: Mapping[str, str], argv: Sequence[str] | None = None,
             orig_argv: Sequence[str] | None = None, init_method: Any = None) -> str:
    """A name every rank of one launch derives alike, without talking to each other.

    PGDASH_JOB wins, unchanged. Otherwise the user's program (the script's file name or the
    ``-m`` module, never pgdash's own launcher) and the launch's id (see :func:`launch_of`):
    ``train.py · 6fd5bf1d`` under ``torchrun --standalone``, ``train.py · slurm-4242.0`` in
    a SLURM step, ``train.py · 10.0.0.1:29500`` from the rendezvous address. The server starts
    a new job when a name is reused by a new launch, and keeps the job when a later attempt
    of it connects (see :func:`attempt`).
    """
    if environ.get("PGDASH_JOB"):
        return environ["PGDASH_JOB"]
    return launch_of(environ, argv, orig_argv, init_method).job_name()


@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process was started, as the Hello reports it and the job's name says it.

    Attributes:
        program: the user's program as a person names it: a script's file name
            (``train.py``) or a module (``pkg.train``); None when there is none (``-c``, a
            REPL).
        command: the program's command line (``train.py --lr 3e-4``), bounded to
            MAX_COMMAND characters, with anything token-like masked; None without a program.
        launcher: ``torchrun``, ``slurm``, ``mp.spawn`` (a process torch.multiprocessing, or
            any multiprocessing, started) or ``python``.
        launcher_id: what tells this launch from another of the same program: torchrun's run
            id (a UUID shortened to 8 characters), ``slurm-<job id>.<step id>``, or the
            rendezvous address ``MASTER_ADDR:MASTER_PORT`` (or the ``init_method``'s); None
            when nothing names it.
    """

    program: str | None
    command: str | None
    launcher: str
    launcher_id: str | None

    def job_name(self) -> str:
        name = " \u00b7 ".join(p for p in (self.program, self.launcher_id) if p)
        return name or UNNAMED

    def hello_fields(self) -> dict[str, str | None]:
        return {"command": self.command, "launcher": self.launcher,
                "launcher_id": self.launcher_id}


def launch_of(environ: Mapping[str, str], argv: Sequence[str] | None = None,
              orig_argv: Sequence[str] | None = None, init_method: Any = None,
              spawned: bool | None = None) -> Launch:
    """This process's :class:`Launch`, from its environment and command line.

    Args:
        environ: the process environment.
        argv: ``sys.argv`` (default: this process's).
        orig_argv: the interpreter's own command line, ``sys.orig_argv`` (default: this
            process's): it still says ``-m pgdash_agent train.py`` after pgdash's launcher handed
            ``sys.argv`` to the program, and ``-m pkg.train`` where ``sys.argv[0]`` is a path.
        init_method: ``init_process_group``'s, when known: the rendezvous address of a launch
            the environment does not name (``tcp://10.0.0.1:23456``).
        spawned: whether multiprocessing started this process (default: asks it).
    """
    if argv is None:
        argv = list(sys.argv)
    if orig_argv is None:
        orig_argv = list(getattr(sys, "orig_argv", None) or [])
    if spawned is None:
        spawned = _spawned()
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id is not None:
        launcher = "torchrun"
    elif environ.get("SLURM_JOB_ID") and environ.get("SLURM_PROCID") is not None \
            and not spawned:
        launcher = "slurm"
    else:
        launcher = "mp.spawn" if spawned else "python"
    launcher_id = None
    if run_id and run_id != "none":  # torchrun's default id when none was given
        launcher_id = _short_run_id(run_id)
    elif environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID")
        launcher_id = f"slurm-{environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    elif environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        launcher_id = f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    else:
        launcher_id = job_from_init_method(init_method)
    target = program_of(argv, orig_argv)
    program = command = None
    if target is not None:
        kind, name, args = target
        program = _bounded(name if kind == "module" else _basename(name), MAX_PART)
        command = _command(["-m", name] if kind == "module" else [name], args, environ)
    return Launch(program, command, launcher,
                  None if launcher_id is None else _bounded(launcher_id, MAX_PART))


# A job's name is at most MAX_NAME characters on the wire: each of its parts keeps to this.
MAX_PART = (MAX_NAME - 16) // 2
# Module names (``python -m NAME``) of pgdash's own launcher: the program is what it runs.
LAUNCHER_MODULES = ("agent", "pgdash_agent")
_AGENT_DIR = os.path.dirname(os.path.abspath(__file__))
_LAUNCHER_DIRS = (_AGENT_DIR, os.path.join(os.path.dirname(_AGENT_DIR), "agent"))
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")
# Options whose value is a secret: --token X, --api-key=X, wandb.api_key=X, PASSWORD=X, ...
_SECRET = re.compile(r"(token|secret|passw(or)?d|api[-_]?key|access[-_]?key|auth|credential)",
                     re.IGNORECASE)
_URL_CREDENTIALS = re.compile(r"(://)[^/@\s]+@")
MASK = "REDACTED"


def program_of(argv: Sequence[str],
               orig_argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``("script", path, args)`` or ``("module", name, args)``: the program this process
    runs, past pgdash's launcher (``python -m pgdash_agent train.py`` runs train.py); None for
    ``-c`` code or a REPL.

    ``orig_argv`` (the interpreter's command line) is read first; a process started by
    multiprocessing's spawn has ``-c`` there, and its parent's ``sys.argv`` in ``argv``.
    """
    target = _python_target(orig_argv) if orig_argv else None
    if target is None:
        if not argv or argv[0] in ("", "-c", "-"):
            return None
        target = ("script", argv[0], list(argv[1:]))
    kind, name, rest = target
    if (name in LAUNCHER_MODULES) if kind == "module" else _is_launcher_path(name):
        if rest[:1] == ["-m"] and len(rest) > 1:
            return "module", rest[1], list(rest[2:])
        if rest and not rest[0].startswith("-"):
            return "script", rest[0], list(rest[1:])
        return None
    return target


def _python_target(orig_argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """What ``python [options] (SCRIPT | -m MODULE | -c CODE) ARGS`` runs, from its argv."""
    i = 1
    while i < len(orig_argv):
        arg = orig_argv[i]
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if arg == "-":  # the program comes from stdin
            return None
        if arg.startswith("--") and arg != "--":  # --help and the like: no program runs
            i += 1
            continue
        if arg == "--":
            return ("script", orig_argv[i + 1], list(orig_argv[i + 2:])) \
                if i + 1 < len(orig_argv) else None
        if not arg.startswith("-"):
            return "script", arg, list(orig_argv[i + 1:])
        for j, flag in enumerate(arg[1:], 2):  # -u, -uB, -Wignore, -W ignore, -mpkg, -m pkg
            if flag in "mc":
                value = arg[j:] or (orig_argv[i + 1] if i + 1 < len(orig_argv) else "")
                rest = orig_argv[i + 1:] if arg[j:] else orig_argv[i + 2:]
                return ("module", value, list(rest)) if flag == "m" and value else None
            if flag in "WX":
                i += 0 if arg[j:] else 1  # the value is the next argument
                break
        i += 1
    return None


def _is_launcher_path(path: str) -> bool:
    full = os.path.abspath(path)
    return full in _LAUNCHER_DIRS or os.path.dirname(full) in _LAUNCHER_DIRS and \
        os.path.basename(full) in ("__main__.py", "launch.py")


def _basename(path: str) -> str:
    return os.path.basename(path.rstrip("/\\")) or path


def _short_run_id(run_id: str) -> str:
    """torchrun's run id: a UUID (``--standalone`` makes one) as its first 8 characters,
    anything else (``--rdzv-id``) as given."""
    return run_id[:8] if _UUID.match(run_id) else run_id


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _command(program: list[str], args: Sequence[str], environ: Mapping[str, str]) -> str:
    """The program's command line as a shell would take it, secrets masked, bounded."""
    token = environ.get("PGDASH_TOKEN") or None
    shown: list[str] = []
    secret_next = False
    for arg in args:
        arg = str(arg)
        if secret_next and not arg.startswith("-"):
            shown.append(MASK)
            secret_next = False
            continue
        secret_next = False
        key, eq, _ = arg.partition("=")
        if eq and _SECRET.search(key):
            arg = key + "=" + MASK
        elif arg.startswith("-") and _SECRET.search(arg):
            secret_next = True
        if token and token in arg:
            arg = arg.replace(token, MASK)
        shown.append(_URL_CREDENTIALS.sub(r"\1" + MASK + "@", arg))
    return _bounded(shlex.join(program + shown), MAX_COMMAND)


def _spawned() -> bool:
    try:
        import multiprocessing

        return multiprocessing.parent_process() is not None
    except Exception:
        return False


def job_from_init_method(init_method: Any) -> str | None:
    """A job name from ``init_process_group(init_method=...)`` when the environment has none:
    ``tcp://10.0.0.1:23456`` names the launch as MASTER_ADDR:MASTER_PORT would."""
    if not isinstance(init_method, str) or "://" not in init_method:
        return None
    scheme, _, rest = init_method.partition("://")
    rest = rest.split("?", 1)[0]
    return rest if scheme == "tcp" else f"{scheme}://{rest}" if rest else None


def attempt(environ: Mapping[str, str]) -> int:
    """Which attempt of its job this process is: 0 for the first launch, 1 after the first
    restart. torchrun's elastic restarts (``--max-restarts``) count in
    TORCHELASTIC_RESTART_COUNT; a requeued SLURM job in SLURM_RESTART_COUNT."""
    for name in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        value = _int_env(environ, name)
        if value is not None and value >= 0:
            return value
    return 0


def launch_rank(environ: Mapping[str, str]) -> tuple[int | None, int | None, int | None]:
    """``(rank, world size, local rank)`` as the launcher set them, None where unknown.

    torchrun's RANK/WORLD_SIZE/LOCAL_RANK win. Without RANK, SLURM's task ids are used, but
    only in the task process itself (SLURM_TASK_PID): a process it starts (e.g. by
    torch.multiprocessing.spawn) inherits them and is not that rank.
    """
    rank = _int_env(environ, "RANK")
    if rank is not None:
        return rank, _int_env(environ, "WORLD_SIZE"), _int_env(environ, "LOCAL_RANK")
    task_pid = environ.get("SLURM_TASK_PID")
    if environ.get("SLURM_PROCID") and task_pid in (None, str(os.getpid())):
        return (_int_env(environ, "SLURM_PROCID"), _int_env(environ, "SLURM_NTASKS"),
                _int_env(environ, "SLURM_LOCALID"))
    return None, _int_env(environ, "WORLD_SIZE"), _int_env(environ, "LOCAL_RANK")


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    from pgdash_agent.frames import py_spy

    found["py-spy"] = py_spy()  # None: absent (hints then say how to get a stack without it)
    try:
        import torch

        found["torch"] = torch.__version__
        found["cuda"] = torch.version.cuda
        try:
            if torch.cuda.is_available():
                found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    except Exception:
        pass
    return found


def current_gpu_uuid() -> str | None | bool:
    """The UUID of the current CUDA device; None while CUDA is not initialised yet, False
    when this process has no CUDA at all.

    Only a CUDA the program already initialised is looked at: initialising it ourselves
    would create a context on the wrong device.
    """
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        if not torch.cuda.is_initialized():
            return None
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except Exception:
        return False


def hello(job: str, environ: Mapping[str, str], launch: Launch | None = None) -> dict[str, Any]:
    """The identity event body, from what is known now (before or after init), with how the
    process was started when ``launch`` is given."""
    rank, world_size, local_rank = launch_rank(environ)
    backend = device = gpu_uuid = None
    try:
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
        uuid = current_gpu_uuid()
        if isinstance(uuid, str):
            device, gpu_uuid = f"cuda:{torch.cuda.current_device()}", uuid
        else:
            device = "cpu"
    except Exception:
        pass
    return {
        "job": job, "rank": rank, "world_size": world_size,
        "local_rank": local_rank, "host": socket.gethostname(), "attempt": attempt(environ),
        "pid": os.getpid(), "backend": backend, "device": device, "gpu_uuid": gpu_uuid,
        "versions": versions(), "env": distributed_env(environ),
        **(launch.hello_fields() if launch is not None else {}),
    }
