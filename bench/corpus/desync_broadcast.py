"""Plain loop, 3 ranks; rank 2 calls broadcast where the others call all_reduce (a branch only it takes).
EXPECT kind=desync culprit=2 ranks=3 launch=agent class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist

ODD = 2


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank = dist.get_rank()
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
t = torch.ones(256)

for step in range(odd_step + 400):
    if rank == ODD and step == odd_step:
        fault("calls broadcast where the others call all_reduce")
        dist.broadcast(t, src=0)  # "resync the weights": only this rank thinks it is time
    else:
        dist.all_reduce(t)
    t /= dist.get_world_size()
    time.sleep(0.015)
dist.destroy_process_group()
