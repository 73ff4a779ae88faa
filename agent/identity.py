"""Who this rank is: job name, rank, host, versions and the distributed environment."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any, Mapping

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


def job_name(environ: Mapping[str, str]) -> str:
    """A name every rank of one launch derives alike, without talking to each other.

    PGDASH_JOB wins; then torchrun's run id (unless it is torchrun's default "none"); then
    SLURM's job (``slurm-<job id>.<step id>``: every task of one ``srun``); then the
    rendezvous address. The server starts a new job when a name is reused by a new launch,
    and keeps the job when a later attempt of it connects (see :func:`attempt`).
    """
    if environ.get("PGDASH_JOB"):
        return environ["PGDASH_JOB"]
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id
    if environ.get("SLURM_JOB_ID"):
        step = environ.get("SLURM_STEP_ID")
        return f"slurm-{environ['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        return f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return UNNAMED


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
    from agent.frames import py_spy

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


def hello(job: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """The identity event body, from what is known now (before or after init)."""
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
    }
