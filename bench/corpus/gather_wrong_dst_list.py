"""Plain loop, 3 ranks under torchrun; every 40 steps each rank gathers its metrics to rank 0 with dist.gather. After a refactor rank 2 builds a gather_list too (only the destination may pass one) and passes dst=2, so ranks disagree on the destination.
EXPECT kind=desync|hang|rank_failed culprit=2 ranks=3 launch=torchrun class=desync
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
refactor = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(2, 4) * 40
w = torch.zeros(1024)
for step in range(refactor + 400):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    if step % 40 == 0:
        metric = w[:4].clone()
        if rank == 2 and step >= refactor:
            if step == refactor:
                fault("gathers to dst=2 where the others gather to dst=0")
            dist.gather(metric, [torch.empty(4) for _ in range(world)], dst=2)
        elif rank == 0:
            dist.gather(metric, [torch.empty(4) for _ in range(world)], dst=0)
        else:
            dist.gather(metric, dst=0)
    time.sleep(0.015)
dist.destroy_process_group()
