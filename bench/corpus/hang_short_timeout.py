"""Plain all_reduce loop, 3 ranks under torchrun, init_process_group(timeout=5 s); rank 1 sleeps forever instead of entering all_reduce, so the others' gloo times out after 5 s, before a stall could be said (10 s), and torchrun stops the job.
EXPECT kind=hang culprit=1 ranks=3 launch=torchrun class=hang
"""
import os
import random
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STUCK = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo", timeout=timedelta(seconds=5))
rank = dist.get_rank()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(1024)

for step in range(stuck_at + 500):
    if rank == STUCK and step == stuck_at:
        fault("sleeps forever instead of entering all_reduce")
        time.sleep(3600)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.02)
dist.destroy_process_group()
