"""Who this rank is: job name, rank, host, versions and the distributed environment."""

from __future__ import annotations

import os
import platform
import socket
from typing import Any, Mapping

# Variables that decide how a distributed job forms and behaves. PGDASH_TOKEN is never sent.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_", "TORCHELASTIC_")
ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "CUDA_VISIBLE_DEVICES")


def distributed_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items())
            if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}


def job_name(environ: Mapping[str, str]) -> str:
    """A name every rank of one launch derives alike, without talking to each other.

    PGDASH_JOB wins; then torchrun's run id (unless it is torchrun's default "none"); then the
    rendezvous address. The server starts a new job when a name is reused by a new launch.
    """
    if environ.get("PGDASH_JOB"):
        return environ["PGDASH_JOB"]
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return run_id
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        return f"{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return "unnamed"


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
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
    rank = _int_env(environ, "RANK")
    world_size = _int_env(environ, "WORLD_SIZE")
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
        "local_rank": _int_env(environ, "LOCAL_RANK"), "host": socket.gethostname(),
        "pid": os.getpid(), "backend": backend, "device": device, "gpu_uuid": gpu_uuid,
        "versions": versions(), "env": distributed_env(environ),
    }
