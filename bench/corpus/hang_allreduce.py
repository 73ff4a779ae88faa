"""Plain all_reduce loop, 4 ranks under torchrun; rank 2 sleeps forever instead of entering all_reduce.
EXPECT kind=hang culprit=2 ranks=4 launch=torchrun class=hang
"""
import os
import random
import time

import torch
import torch.distributed as dist

STUCK = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
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
