"""Plain loop, 4 ranks; rank 0 calls all_gather (a logging branch) where the others call all_reduce.
EXPECT kind=desync culprit=0 ranks=4 launch=torchrun class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist

ODD = 0


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
odd_step = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
loss = torch.ones(1)

for step in range(odd_step + 400):
    if rank == ODD and step == odd_step:
        fault("calls all_gather where the others call all_reduce")
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, loss)  # the logging code gathers per-rank losses
    else:
        dist.all_reduce(loss)
    loss = loss / world
    time.sleep(0.015)
dist.destroy_process_group()
