"""Plain all_reduce training under torchrun; a native extension segfaults on rank 2 (SIGSEGV, no Python traceback).
EXPECT kind=rank_lost|rank_failed culprit=2 ranks=3 launch=torchrun class=lost
"""
import ctypes
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)

for step in range(bad_step + 400):
    if rank == 2 and step == bad_step:
        fault("a native extension dereferences NULL")
        ctypes.string_at(0)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
