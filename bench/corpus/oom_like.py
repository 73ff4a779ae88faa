"""4 ranks, plain all_reduce; rank 3 raises torch.OutOfMemoryError with CUDA's text (a batch with long sequences).
EXPECT kind=rank_failed culprit=3 ranks=4 launch=torchrun class=oom
"""
import os
import random
import time

import torch
import torch.distributed as dist

BAD = 3


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(2048)

for step in range(bad_step + 400):
    if rank == BAD and step == bad_step:
        fault("raises torch.OutOfMemoryError (CUDA out of memory text)")
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 3 has a total capacity of "
            "79.19 GiB of which 1.03 GiB is free. Including non-PyTorch memory, this process "
            "has 78.15 GiB memory in use. Of the allocated memory 74.61 GiB is allocated by "
            "PyTorch, and 2.01 GiB is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True to avoid fragmentation.")
    grad = torch.randn(2048)
    dist.all_reduce(grad)
    w -= 0.001 * grad
    time.sleep(0.015)
dist.destroy_process_group()
