"""Plain all_reduce training, 3 ranks under torchrun, with dist.monitored_barrier(timeout=5 s) at the end of every epoch; rank 2 gets stuck in its epoch-end bookkeeping, so rank 0's monitored barrier raises and names it.
EXPECT kind=hang|rank_failed culprit=2 ranks=3 launch=torchrun class=hang
"""
import os
import random
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STUCK = 2
STEPS_PER_EPOCH = 40


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
stuck_epoch = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4)
w = torch.randn(256)

for epoch in range(stuck_epoch + 10):
    for step in range(STEPS_PER_EPOCH):
        grad = torch.tanh(w) * 1e-3
        dist.all_reduce(grad)
        w -= grad
        time.sleep(0.015)
    if rank == STUCK and epoch == stuck_epoch:
        fault("stuck in its epoch-end bookkeeping (waits for a lock forever)")
        time.sleep(3600)
    dist.monitored_barrier(timeout=timedelta(seconds=5), wait_all_ranks=True)
dist.destroy_process_group()
