"""Plain all_reduce training loop, 3 ranks; from a random step on, rank 1 is 60 ms late at every step.
EXPECT kind=straggler culprit=1 ranks=3 launch=torchrun class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist

SLOW, SLOW_STEPS = 1, 200


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
            fault("60 ms late at every step from now on")
        time.sleep(0.06)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    if rank == SLOW and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
