"""Plain all_reduce training under torchrun; from a random step on, rank 2 gets slower and slower (a node throttling as it heats up): a few ms more every step, up to 80 ms.
EXPECT kind=straggler culprit=2 ranks=3 launch=torchrun class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist

SLOW, SLOW_STEPS = 2, 220


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
            fault("slows down a little more every step")
        time.sleep(min(0.08, 0.002 * (step - slow_from + 1)))
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
