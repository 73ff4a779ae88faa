"""A gloo job whose rank 1 hits a plain Python bug in the training code (a ZeroDivisionError
in a helper of its own) at step 3; the other ranks then fail in their next all_reduce.

Run as ``python -m pgdash_agent bug_job.py`` (no pgdash in the script), or with BUG_JOB_ATTACH=1 as
``python bug_job.py`` (then it calls ``attach()`` itself, and the excepthook reports it).
"""

import os

import torch
import torch.distributed as dist

if os.environ.get("BUG_JOB_ATTACH"):
    from pgdash_agent import attach

    attach()


def average(total, count):
    return total / count


def step(i, rank, t):
    dist.all_reduce(t)
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
