"""Fails on one rank in the first attempt only, as a job that torchrun restarts would.

Attempt 0 (TORCHELASTIC_RESTART_COUNT=0): rank 1 raises after a few all-reduces. The next
attempt trains to the end. No pgdash in it.
"""

import os

import torch
import torch.distributed as dist


def main():
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for step in range(4):
        if attempt == 0 and dist.get_rank() == 1 and step == 2:
            raise RuntimeError("boom on rank 1 in attempt 0")
        dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
