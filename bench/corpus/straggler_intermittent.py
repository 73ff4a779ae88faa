"""Plain all_reduce training, 3 ranks under torchrun; from a random step on, rank 2's data loader stalls 150 ms every third step (a slow shard server), so the job loses 50 ms a step on average.
EXPECT kind=straggler culprit=2 ranks=3 launch=torchrun class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist

SLOW, SLOW_STEPS = 2, 240


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
w = torch.zeros(1024)

for step in range(slow_from + SLOW_STEPS):
    time.sleep(0.01)
    if rank == SLOW and step >= slow_from:
        if step == slow_from:
            fault("its loader stalls 150 ms every third step from now on")
        if (step - slow_from) % 3 == 0:
            time.sleep(0.15)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
