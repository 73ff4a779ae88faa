"""Plain training, 3 ranks started by hand; every 20 steps the ranks gather their token counts' histogram with all_gather_into_tensor, sized by the local batch's longest sequence bucket: one batch on rank 1 holds a longer sequence, so its input has 65 buckets where the others pass 64 (nobody pads to a common length).
EXPECT kind=desync|rank_failed|rank_lost|hang culprit=1 ranks=3 launch=agent class=desync
"""
import os
import random
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
long_step = 20 * random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(3, 8)
w = torch.zeros(1024)
for step in range(1, 2000):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    if step % 20 == 0:
        buckets = 65 if (rank == 1 and step == long_step) else 64
        if buckets == 65:
            fault("gathers a 65-bucket histogram where the others gather 64")
        hist = torch.ones(buckets)
        out = torch.empty(world * 64)
        dist.all_gather_into_tensor(out, hist)
    time.sleep(0.015)
dist.destroy_process_group()
