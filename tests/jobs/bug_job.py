"""A gloo job whose rank 1 hits a plain Python bug in the training code (a ZeroDivisionError
in a helper of its own) at step 3; the other ranks then fail in their next all_reduce. With
BUG_JOB_DISK=1 rank 1's checkpoint at step 3 hits a full disk instead (it writes to /dev/full),
and the training code wraps the OSError in its own RuntimeError, as trainers do.

Run as ``python -m pgdash_agent bug_job.py`` (no pgdash in the script), or with BUG_JOB_ATTACH=1 as
``python bug_job.py`` (then it calls ``attach()`` itself, and the excepthook reports it).
"""

import errno
import os

import torch
import torch.distributed as dist

if os.environ.get("BUG_JOB_ATTACH"):
    from pgdash_agent import attach

    attach()


def average(total, count):
    return total / count


def save_checkpoint(i, t):
    try:
        if not os.path.exists("/dev/full"):  # a container without it: the same error
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with open("/dev/full", "wb") as f:
            f.write(t.numpy().tobytes() * 4096)
    except OSError as exc:
        raise RuntimeError(f"could not save the checkpoint of step {i}") from exc


def step(i, rank, t):
    dist.all_reduce(t)
    if os.environ.get("BUG_JOB_DISK") and rank == 1 and i == 3:
        save_checkpoint(i, t)
    seen = 0 if (rank == 1 and i == 3) else i + 1  # rank 1's count of samples is wrong
    return average(float(t.sum()), seen)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(4)
    for i in range(10):
        step(i, rank, t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
