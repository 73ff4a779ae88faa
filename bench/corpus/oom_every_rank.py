"""Plain training under torchrun; a config change doubles the batch size, and every rank raises torch.OutOfMemoryError at the same step (the first long-sequence batch).
EXPECT kind=rank_failed culprit=0,1,2 ranks=3 launch=torchrun class=oom
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
long_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(long_step + 400):
    if step == long_step:
        if rank == 0:
            fault("every rank runs out of memory on the first long batch")
        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 4.{rank}0 GiB. GPU {rank} has a total "
            f"capacity of 79.10 GiB of which 1.{rank}2 GiB is free. Including non-PyTorch "
            "memory, this process has 77.9 GiB memory in use.")
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
