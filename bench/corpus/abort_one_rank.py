"""Plain all_reduce training under torchrun, 3 ranks; a C++ extension's check fails on rank 1 and calls abort() (SIGABRT: no Python exception, nothing for the agent to report), and torchrun then stops the others.
EXPECT kind=rank_lost|rank_failed culprit=1 ranks=3 launch=torchrun class=lost
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
bad_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
w = torch.zeros(1024)
for step in range(bad_step + 400):
    if rank == 1 and step == bad_step:
        fault("an extension's internal check fails: abort()")
        os.abort()
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
