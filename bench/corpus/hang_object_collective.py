"""Plain loop, 3 ranks, metrics gathered with all_gather_object every 10 steps; rank 1 gets stuck before one of them.
EXPECT kind=hang culprit=1 ranks=3 launch=agent class=object
"""
import os
import random
import time

import torch
import torch.distributed as dist

STUCK = 1


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
stuck_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(8, 16) * 10 + 9
t = torch.ones(256)

for step in range(stuck_at + 500):
    dist.all_reduce(t)
    t /= world
    time.sleep(0.015)
    if step % 10 == 9:
        metrics = {"rank": rank, "step": step, "loss": float(t[0]), "tokens": 4096}
        if rank == STUCK and step == stuck_at:
            fault("stuck (sleeps forever) before all_gather_object of its metrics")
            time.sleep(3600)
        everyone = [None] * world
        dist.all_gather_object(everyone, metrics)
dist.destroy_process_group()
