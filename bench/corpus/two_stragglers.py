"""Plain all_reduce training, 4 ranks under torchrun; from a random step on, ranks 1 and 3 (two nodes of an older GPU generation) are each 60 ms late at every step.
EXPECT kind=straggler culprit=1,3 ranks=4 launch=torchrun class=straggler
"""
import os
import random
import time

import torch
import torch.distributed as dist

SLOW, SLOW_STEPS = (1, 3), 220


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
slow_from = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(80, 200)
w = torch.zeros(1024)

for step in range(slow_from + SLOW_STEPS):
    time.sleep(0.01)
    if rank in SLOW and step >= slow_from:
        if step == slow_from and rank == SLOW[0]:
            fault("ranks 1 and 3 are 60 ms late at every step from now on")
        time.sleep(0.06)
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    if rank == SLOW[0] and step >= slow_from:
        print(f"STEP {step - slow_from + 1} {time.time():.6f}", flush=True)
dist.destroy_process_group()
