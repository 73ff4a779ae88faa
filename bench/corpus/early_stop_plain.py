"""Early stopping decided on one rank: rank 2's own validation loss stops improving, so it destroys its process group and exits 0 while the others go on all-reducing.
EXPECT kind=rank_exited_early culprit=2 ranks=4 launch=torchrun class=early_exit
"""
import os
import random
import sys
import time

import torch
import torch.distributed as dist


def fault(what):
    print(f"FAULT {time.time():.6f} rank {dist.get_rank()}: {what}", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
plateau = rng.randint(60, 160)  # the step at which rank 2's local validation loss plateaus
w = torch.zeros(256)
best, patience = float("inf"), 3

for step in range(plateau + 600):
    grad = torch.randn(256) + 0.01 * w
    dist.all_reduce(grad)
    w -= 0.01 * grad / world
    time.sleep(0.015)
    if step % 10 == 9:  # validation on this rank's own shard (the bug: not agreed across ranks)
        val = 1.0 / (step + 1) if not (rank == 2 and step >= plateau) else best + 1.0
        if val < best:
            best, patience = val, 3
        else:
            patience -= 1
        if patience == 0:
            fault("early stopping on this rank alone: destroy_process_group, exit 0")
            dist.destroy_process_group()
            sys.exit(0)
dist.destroy_process_group()
